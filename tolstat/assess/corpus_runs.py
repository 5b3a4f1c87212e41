"""Corpus runs: the error datasets of the kernel corpus that ``tolstat evaluate`` measures on.

:func:`calibration_dataset` runs ``n_cal`` cases (seed ``seed``) per (op, dtype) through
every correct variant of the op; :func:`heldout_datasets` runs ``n_test`` fresh cases
(seed ``seed + 1``) through every correct variant (*controls*) and every bug of the op
(*buggy*), paired on the same inputs, and marks each bug output *detectable* or not.
Both collect the runs with :func:`tolstat.dataset.collection.from_pairs`, one (op,
dtype) at a time, and gather the element samples of the parts into one copy as they are
made (equal to concatenating the parts). Every run also carries the run variables of the
peers' eager-relative rules (:data:`tolstat.assess.rules.PEER_VARIABLES`): its RMSE and
errors beside those of the op's plain correct variant (:func:`eager_variant`, the eager
kernel) on the same inputs, computed as the run is made. The settings are those of an
:class:`tolstat.assess.evaluation.EvalConfig`.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Iterator, Mapping, Protocol, Sequence

import numpy as np
import xarray as xr
from tqdm.auto import tqdm

from tolstat.assess.rules import PEER_VARIABLES, EagerBaseline
from tolstat.dataset.collection import from_pairs
from tolstat.dataset.options import CollectOptions
from tolstat.dataset.schema import concat, validate
from tolstat.measure.metrics import ulp_distance

__all__ = ["calibration_dataset", "heldout_datasets", "eager_variant"]


class _Settings(Protocol):
    """The settings the corpus runs read (those of :class:`tolstat.assess.evaluation.EvalConfig`)."""

    ops: list[str] | None
    dtypes: tuple[str, ...]
    n_cal: int
    n_test: int
    seed: int
    quick: bool


def eager_variant(op: str) -> str:
    """The corpus's plain correct variant of ``op`` (the first it registers): the eager kernel
    of the peers' eager-relative rules (:class:`tolstat.assess.rules.EagerBaseline`)."""
    from tolstat import corpus

    return next(iter(corpus.OPS[op].variants))


def _pairs_for(op: str, dtype: str, n: int, seed: int, quick: bool,
               peers: list[dict[str, float]] | None = None) -> Iterable[tuple]:
    """The calibration pairs of ``op``; with ``peers``, each pair's peer variables (its
    output against the plain variant's on the same inputs) are appended to it as it is made."""
    from tolstat import corpus

    spec = corpus.OPS[op]
    eager = eager_variant(op)
    for ci, case in enumerate(corpus.iter_cases(op, dtype, n=n, seed=seed, quick=quick)):  # one case at a time
        ref = corpus.run_reference(case, dtype)
        mag = corpus.run_magnitude(case, dtype)  # operator-noise statistics (tolstat.measure.noise)
        outs = {vname: corpus.run_kernel(kern, case, dtype) for vname, kern in spec.variants.items()}
        base = EagerBaseline(outs[eager], ref, dtype) if peers is not None else None
        for vname, out in outs.items():
            # "case": the same inputs through every correct variant, one cluster (select(cluster="case"))
            labels = {"variant": vname, "dist": case.labels.get("dist", ""),
                      "dims": case.labels.get("dims", ""), "case": str(ci)}
            if base is not None:
                peers.append(base.variables(out))
            yield out, ref, mag, labels, dict(case.covariates)


def _heldout_pairs(op: str, dtype: str, n: int, seed: int, quick: bool) -> tuple[list[tuple], list[tuple]]:
    """Control and buggy pairs of ``n`` test cases: every variant and every bug of ``op`` on the same inputs.

    A bug output is *detectable* when it differs from the output of its base variant on
    the same inputs by more than one ULP somewhere (controls are detectable by convention).
    Each pair carries, sixth, its peer variables against the plain variant's output
    (:func:`eager_variant`) on the same inputs.
    """
    from tolstat import corpus

    spec = corpus.OPS[op]
    bugs = [b for b in corpus.BUGS.values() if b.op == op]
    controls: list[tuple] = []
    buggy: list[tuple] = []
    for case in corpus.iter_cases(op, dtype, n=n, seed=seed, quick=quick):
        ref = corpus.run_reference(case, dtype)
        mag = corpus.run_magnitude(case, dtype)
        # the dataset has the output shape; "scale" is also a covariate, so its label is renamed
        labels = {"dist": case.labels.get("dist", ""), "dims": case.labels.get("dims", ""),
                  "input_scale": case.labels.get("scale", "")}
        cov = dict(case.covariates)
        outs = {v: corpus.run_kernel(k, case, dtype) for v, k in spec.variants.items()}
        base = EagerBaseline(outs[eager_variant(op)], ref, dtype)
        for v, out in outs.items():
            controls.append((out, ref, mag, {**labels, "variant": v, "kind": "control", "bug": "",
                                             "category": "", "detectable": True}, cov, base.variables(out)))
        for b in bugs:
            out = corpus.run_kernel(b.kernel, case, dtype)
            with np.errstate(all="ignore"):
                det = bool(np.any(ulp_distance(out, outs[b.base], dtype) > 1.0))
            buggy.append((out, ref, mag, {**labels, "variant": b.base, "kind": "bug", "bug": b.name,
                                          "category": b.category, "detectable": det}, cov, base.variables(out)))
    return controls, buggy


def _with_peers(ds: xr.Dataset, peers: Sequence[Mapping[str, float]]) -> xr.Dataset:
    """``ds`` with the peer variables of its runs (in run order) as run variables."""
    if len(peers) != ds.sizes["run"]:
        raise AssertionError(f"{len(peers)} peer records for {ds.sizes['run']} runs")
    return ds.assign({name: xr.Variable("run", np.array([p[name] for p in peers], dtype=np.float64),
                                        {"long_name": text})
                      for name, text in PEER_VARIABLES.items()})


def _from_corpus_pairs(pairs: list[tuple], op: str, dtype: str, seed: int) -> xr.Dataset:
    """Error dataset of one (op, dtype) from corpus pairs (each with its peer variables sixth),
    keeping the covariates every case has."""
    from tolstat import corpus

    # the covariates every case has, in the first case's order (deterministic, unlike a set's)
    cov_keys = [k for k in pairs[0][4] if all(k in p[4] for p in pairs)]
    five = [(a, e, m, lab, {k: c[k] for k in cov_keys}) for a, e, m, lab, c, _ in pairs]
    ds = from_pairs(five, op=op, dtype=dtype, hardware="cpu:tolstat-corpus", seed=seed,
                    options=CollectOptions(sample_size=512, progress=False, rowwise=op in corpus.ROWWISE))
    return _with_peers(ds, [p[5] for p in pairs])


def _same_covariates(pairs: Iterable[tuple], op: str) -> Iterator[tuple]:
    """The pairs, streamed (never all outputs of an op in memory), checking that every case
    has the covariate names of the first (then the intersection :func:`_from_corpus_pairs`
    keeps is all of them)."""
    keys = None
    for a, e, m, lab, cov in pairs:
        if keys is None:
            keys = set(cov)
        elif set(cov) != keys:
            raise ValueError(f"corpus op {op!r}: a case has covariates {sorted(cov)}, the first has "
                             f"{sorted(keys)}; every case of an op needs the same covariates")
        yield a, e, m, lab, cov


def _union_covariates(parts: Sequence[xr.Dataset], names: Sequence[str] = (),
                      sink: "_SampleSink | None" = None) -> xr.Dataset:
    """Concatenate per-op datasets, keeping the union of their covariates (NaN where an op has none).

    ``names`` puts these covariates first (to match another dataset's order). With a
    ``sink``, the parts' element samples were moved into it (:meth:`_SampleSink.take`).
    """
    names = list(names)
    for p in parts:
        names += [c for c in p.attrs["covariates"].split(",") if c and c not in names]
    trimmed = []
    for p in parts:
        have = p.attrs["covariates"].split(",")
        q = p.assign({c: ("run", np.full(p.sizes["run"], np.nan)) for c in names if c not in have})
        q.attrs["covariates"] = ",".join(names)
        trimmed.append(q)
    return concat(trimmed) if sink is None else sink.join(trimmed)


class _SampleSink:
    """The element-sample arrays of per-op datasets, gathered part by part into the arrays
    of the concatenated dataset (pages allocated as they are written), so that the samples
    exist once: ``join`` equals :func:`tolstat.concat` of the full parts."""

    def __init__(self, total: int, size: int):
        from tolstat.dataset.schema import SAMPLE_VARS

        self.names = list(SAMPLE_VARS)
        self.arrays = {n: np.empty((max(total, 1), size)) for n in self.names}
        self.attrs: dict[str, dict[str, Any]] = {}
        self.order: list[str] | None = None
        self.rows = 0
        self.k = 0

    def take(self, part: xr.Dataset) -> xr.Dataset:
        """Move ``part``'s sample arrays in; return the part without them."""
        part = validate(part)
        n, kp = part.sizes["run"], part.sizes["sample"]
        for name in self.names:
            arr = self.arrays[name]
            if self.rows + n > arr.shape[0] or kp > arr.shape[1]:  # more than planned: grow
                grown = np.empty((max(arr.shape[0], self.rows + n), max(arr.shape[1], kp)))
                grown[: self.rows, : arr.shape[1]] = arr[: self.rows]
                grown[: self.rows, arr.shape[1]:] = np.nan
                self.arrays[name] = arr = grown
            block = arr[self.rows: self.rows + n]
            block[:, :kp] = part[name].values
            block[:, kp:] = np.nan
            self.attrs.setdefault(name, dict(part[name].attrs))
        if self.order is None:
            self.order = list(part.data_vars)
        self.rows += n
        self.k = max(self.k, kp)
        return part.drop_vars(self.names)

    def join(self, parts: list[xr.Dataset]) -> xr.Dataset:
        """What :func:`tolstat.concat` gives for the parts with their samples."""
        prov: list[Any] = []
        for d in parts:
            prov.extend(json.loads(d.attrs.get("provenance", "[]")))
        out = xr.concat([_without_attrs(d) for d in parts],
                        dim="run", data_vars="all", coords="different", compat="equals", join="outer",
                        combine_attrs="drop")
        for name in out.data_vars:  # attrs from the first part that has the variable
            first = next((d for d in parts if name in d.data_vars), None)
            if first is not None:
                out[name].attrs = dict(first[name].attrs)
        out = out.assign({name: xr.Variable(("run", "sample"), self.arrays[name][: self.rows, : self.k],
                                            self.attrs[name]) for name in self.names})
        order = list(self.order or []) + [v for v in parts[0].data_vars if v not in (self.order or [])]
        order += [v for v in out.data_vars if v not in order]
        out = out[order]
        out.attrs = dict(parts[0].attrs)
        out.attrs["sample_size"] = int(self.k)
        out.attrs["provenance"] = json.dumps(prov)
        return out


def _without_attrs(ds: xr.Dataset) -> xr.Dataset:
    """``ds.drop_attrs()`` (no attrs on the dataset or any variable), as a shallow copy:
    one pass over the variables (``drop_attrs`` re-assigns them one by one)."""
    out = ds.copy(deep=False)
    for v in out.variables.values():
        v.attrs = {}
    out.attrs = {}
    return out


def _ops(cfg: _Settings) -> list[str]:
    from tolstat import corpus

    ops = cfg.ops or sorted(corpus.OPS)
    unknown = sorted(set(ops) - set(corpus.OPS))
    if unknown:
        raise ValueError(f"unknown op(s) {unknown}; known: {sorted(corpus.OPS)}")
    return ops


def calibration_dataset(cfg: _Settings, *, progress: bool | None = None) -> xr.Dataset:
    """Collect the calibration error dataset of the correct corpus kernels."""
    from tolstat import corpus

    ops = _ops(cfg)
    # the samples are gathered into one copy as each part is made (equal to concatenating)
    sink = _SampleSink(sum(len(corpus.OPS[op].variants) for op in ops) * cfg.n_cal * len(cfg.dtypes), 512)
    parts = []
    bar = tqdm(total=len(ops) * len(cfg.dtypes), desc="collect", disable=None if progress is None else not progress)
    for op in ops:
        for dt in cfg.dtypes:
            peers: list[dict[str, float]] = []
            pairs = _same_covariates(_pairs_for(op, dt, cfg.n_cal, cfg.seed, cfg.quick, peers), op)
            opts = CollectOptions(sample_size=512, progress=False, rowwise=op in corpus.ROWWISE)
            ds = from_pairs(pairs, op=op, dtype=dt, hardware="cpu:tolstat-corpus", seed=cfg.seed, options=opts)
            parts.append(sink.take(_with_peers(ds, peers)))
            bar.update(1)
    bar.close()
    # ops have different covariates (D for attention, N for norms): keep the union,
    # NaN where an op does not define one
    return _union_covariates(parts, sink=sink)


def heldout_datasets(cfg: _Settings, *, covariates: Sequence[str] = (),
                     progress: bool | None = None) -> tuple[xr.Dataset, xr.Dataset | None]:
    """Error datasets of the held-out test checks: correct controls and buggy outputs.

    ``cfg.n_test`` fresh cases per (op, dtype) (seed ``cfg.seed + 1``) run through every
    correct variant and every bug of the op. Both datasets carry the labels ``kind``
    (``control``/``bug``), ``variant`` (for a bug: its base variant), ``bug``,
    ``category``, ``detectable`` (``"True"``/``"False"``), ``dist``, ``dims``,
    ``input_scale`` (the case's scale label; the output ``shape`` is in every dataset);
    the buggy dataset is None when the ops have no bugs.
    ``covariates`` orders the covariates like the calibration dataset's.
    """
    from tolstat import corpus

    ops = _ops(cfg)
    n_var = sum(len(corpus.OPS[op].variants) for op in ops) * cfg.n_test * len(cfg.dtypes)
    n_bug = sum(b.op in ops for b in corpus.BUGS.values()) * cfg.n_test * len(cfg.dtypes)
    ctrl_sink, bug_sink = _SampleSink(n_var, 512), _SampleSink(n_bug, 512)
    ctrl_parts, bug_parts = [], []
    for controls, buggy in _heldout_parts(cfg, progress):
        ctrl_parts.append(ctrl_sink.take(controls))
        if buggy is not None:
            bug_parts.append(bug_sink.take(buggy))
    names = list(covariates)
    controls_ds = _union_covariates(ctrl_parts, names, sink=ctrl_sink)
    return controls_ds, (_union_covariates(bug_parts, names, sink=bug_sink) if bug_parts else None)


def _heldout_parts(cfg: _Settings, progress: bool | None) -> Iterator[tuple[xr.Dataset, xr.Dataset | None]]:
    """The held-out error datasets of each (op, dtype) in turn: (controls, bugs or None)."""
    ops = _ops(cfg)
    bar = tqdm(total=len(ops) * len(cfg.dtypes), desc="test checks",
               disable=None if progress is None else not progress)
    for op in ops:
        for dt in cfg.dtypes:
            controls, buggy = _heldout_pairs(op, dt, cfg.n_test, cfg.seed + 1, cfg.quick)
            ctrl = _from_corpus_pairs(controls, op, dt, cfg.seed + 1)
            bug = _from_corpus_pairs(buggy, op, dt, cfg.seed + 1) if buggy else None
            del controls, buggy
            yield ctrl, bug
            bar.update(1)
    bar.close()
