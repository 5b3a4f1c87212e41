"""Cross-validation folds over independent units, and the rules calibrated fold by fold.

The unit of the split is a set of runs that must not straddle a training and a held-out
fold (:func:`tolstat.dataset.schema.run_units`: a declared ``cluster`` label and a shared
reference join runs); buggy runs follow the unit of the correct runs on the same inputs.
:func:`assign_folds` deals the units to folds, deterministically from a seed. The private
helpers here cut the datasets into folds, calibrate every rule at every budget on every
training fold (:func:`tolstat.assess.rules.calibrate_and_score`), record the held-out
measures per (method, group, budget, fold) and pool them over folds, for
:func:`tolstat.assess.comparison.compare`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import xarray as xr

from tolstat.assess.rules import FoldOutcome, Rule, _keys, _split_key, calibrate_and_score
from tolstat.dataset.schema import FINGERPRINT, run_units
from tolstat._base.inference import budget_verdict, clopper_pearson

__all__ = ["assign_folds"]


def assign_folds(units: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Fold (0 .. folds-1) of each run from its unit label, deterministic in ``seed``.

    The distinct unit values are shuffled with ``numpy.random.default_rng(seed)`` and
    dealt round-robin, so every run of one unit gets the same fold and fold sizes (in
    units) differ by at most one.
    """
    u, inv = np.unique(np.asarray(units).astype(str), return_inverse=True)
    perm = np.random.default_rng(seed).permutation(u.size)
    fold_of = np.empty(u.size, dtype=np.int64)
    fold_of[perm] = np.arange(u.size) % folds
    return fold_of[inv.ravel()]


def _label(ds: xr.Dataset, name: str, what: str) -> np.ndarray:
    if name not in ds.variables or ds[name].dims != ("run",):
        raise ValueError(f"{what}={name!r} is not a label along 'run' of the dataset "
                         f"(labels: {[n for n, v in ds.variables.items() if v.dims == ('run',)][:20]})")
    return np.asarray(ds[name].values).astype(str)


@dataclass
class _Folds:
    """The split of the correct runs (and of the buggy runs) into folds."""

    fold: np.ndarray  # fold of each correct run
    bfold: np.ndarray  # fold of each buggy run
    n_units: int
    train_sets: list[xr.Dataset]
    test_idx: list[np.ndarray]
    test_sets: list[xr.Dataset]
    bug_idx: list[np.ndarray]
    bug_sets: list[xr.Dataset | None]

    @property
    def n(self) -> int:
        """Number of folds."""
        return len(self.test_idx)


def _fold_units(ds: xr.Dataset, bug: xr.Dataset | None, cluster: str | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Unit of the split of each correct and each buggy run.

    Correct runs: the units of :func:`tolstat.dataset.schema.run_units` (a declared ``cluster``
    and a shared reference join runs), so that no unit straddles a training and a held-out
    fold. A buggy run follows the unit of the correct runs on the same inputs (the same
    reference fingerprint, else the same ``cluster`` label), or is its own unit.
    """
    if cluster is not None:
        _label(ds, cluster, "cluster")  # a clear error naming the argument
    ids = run_units(ds, cluster).ids
    units = np.array([f"u{i}" for i in ids.tolist()])
    if bug is None:
        return units, None
    bu = [f"bug:{i}" for i in range(bug.sizes["run"])]
    if cluster is not None and cluster in bug.variables:
        by_label = dict(zip(_label(ds, cluster, "cluster").tolist(), units.tolist()))
        bu = [by_label.get(lab, f"label:{lab}") for lab in _label(bug, cluster, "cluster").tolist()]
    if FINGERPRINT in ds and FINGERPRINT in bug:
        by_ref = dict(zip(np.asarray(ds[FINGERPRINT].values).tolist(), units.tolist()))
        bu = [by_ref.get(f, b) for f, b in zip(np.asarray(bug[FINGERPRINT].values).tolist(), bu)]
    return units, np.array(bu)


def _make_folds(ds: xr.Dataset, bug: xr.Dataset | None, cluster: str | None, folds: int, seed: int) -> _Folds:
    """Assign every correct and buggy run a fold (:func:`assign_folds`) and cut the datasets."""
    units, bunits = _fold_units(ds, bug, cluster)
    allu = units if bunits is None else np.concatenate([units, bunits])
    n_units = np.unique(units).size
    if n_units < folds:
        raise ValueError(f"folds={folds} but the correct runs have only {n_units} "
                         f"{'distinct ' + repr(cluster) + ' values' if cluster else 'runs'}")
    fold_all = assign_folds(allu, folds, seed)
    fold, bfold = fold_all[: units.size], fold_all[units.size:]
    test_idx = [np.flatnonzero(fold == f) for f in range(folds)]
    bug_idx = [np.flatnonzero(bfold == f) for f in range(folds)]
    return _Folds(
        fold, bfold, int(n_units),
        train_sets=[ds.isel(run=np.flatnonzero(fold != f)) for f in range(folds)],
        test_idx=test_idx,
        test_sets=[ds.isel(run=ix) for ix in test_idx],
        bug_idx=bug_idx,
        bug_sets=[None if bug is None or ix.size == 0 else bug.isel(run=ix) for ix in bug_idx],
    )


@dataclass
class _Groups:
    """The threshold groups and the group of each run."""

    names: list[str]  # "op/dtype/hardware" keys, sorted
    gi: np.ndarray  # group index of each correct run
    bgi: np.ndarray  # group index of each buggy run (-1: a group without correct runs)


def _group_index(ds: xr.Dataset, bug: xr.Dataset | None, by: Sequence[str]) -> _Groups:
    gkeys = _keys(ds, by)
    groups = sorted(set(gkeys.tolist()))
    gidx = {k: i for i, k in enumerate(groups)}
    gi = np.array([gidx[k] for k in gkeys], dtype=np.int64)
    bgi = (np.array([gidx.get(k, -1) for k in _keys(bug, by)], dtype=np.int64) if bug is not None
           else np.empty(0, dtype=np.int64))
    return _Groups(groups, gi, bgi)


@dataclass
class _Cells:
    """Per (method, group, budget, fold) measures, filled fold by fold."""

    thr: np.ndarray
    n_train: np.ndarray
    n_test: np.ndarray
    fp: np.ndarray
    tight: np.ndarray
    n_bug: np.ndarray
    caught: np.ndarray
    status: np.ndarray
    reason: np.ndarray
    ratios: dict[tuple[int, int, int], list[np.ndarray]] = field(default_factory=dict)  # held-out, per fold

    @classmethod
    def empty(cls, shape: tuple[int, int, int, int]) -> _Cells:
        def z() -> np.ndarray:
            return np.zeros(shape, dtype=np.int64)

        return cls(np.full(shape, np.nan), z(), z(), z(), np.full(shape, np.nan), z(), z(),
                   np.full(shape, "ok", dtype=object), np.full(shape, "", dtype=object))


def _score_folds(rules: list[Rule], ds: xr.Dataset, bug: xr.Dataset | None, split: _Folds, grp: _Groups,
                 bl: list[float], g: float, by: Sequence[str], progress: bool | None) -> _Cells:
    """Calibrate every rule at every budget on every training fold; score the held-out runs."""
    from tqdm.auto import tqdm

    F = split.n
    cells = _Cells.empty((len(rules), len(grp.names), len(bl), F))
    train_counts = [np.bincount(grp.gi[split.fold != f], minlength=len(grp.names)) for f in range(F)]
    total = sum(1 if r.data_free else len(bl) * F for r in rules)
    bar = tqdm(total=total, desc="compare", disable=None if progress is None else not progress)
    for mi, rule in enumerate(rules):
        if rule.data_free:
            whole = calibrate_and_score(rule, None, ds, bug, budget=bl[0], confidence=g, by=by)
            bar.update(1)
        for bi, b in enumerate(bl):
            for f in range(F):
                if rule.data_free:
                    out = FoldOutcome(whole.thresholds, whole.reasons, whole.ratios[split.test_idx[f]],
                                      whole.buggy_ratios[split.bug_idx[f]] if bug is not None else np.empty(0),
                                      whole.error)
                else:
                    out = calibrate_and_score(rule, split.train_sets[f], split.test_sets[f], split.bug_sets[f],
                                              budget=b, confidence=g, by=by)
                    bar.update(1)
                _record_fold(cells, (mi, bi, f), rule, out, grp, split, train_counts[f])
    bar.close()
    return cells


def _fold_threshold(rule: Rule, out: FoldOutcome, k3: tuple[str, str, str]) -> tuple[float, str]:
    """Threshold of a group in one fold, and why there is none (``""`` when there is one)."""
    t = rule.fixed_threshold(k3)
    if t is not None:  # a data-free rule (static, eager-relative): its statistic's threshold
        return t, (f"no tolerances for dtype {k3[1]}" if math.isnan(t) else "")
    t = out.thresholds.get(k3, math.nan)
    why = out.reasons.get(k3, "no calibration runs of this group in the training folds") if math.isnan(t) else ""
    return t, why


def _record_fold(cells: _Cells, at: tuple[int, int, int], rule: Rule, out: FoldOutcome, grp: _Groups,
                 split: _Folds, train_counts: np.ndarray) -> None:
    """Store one (method, budget, fold) outcome in every group's cell."""
    mi, bi, f = at
    tg = grp.gi[split.test_idx[f]]
    bgf = grp.bgi[split.bug_idx[f]]
    for gj, key in enumerate(grp.names):
        ix = (mi, gj, bi, f)
        cells.n_train[ix] = train_counts[gj]
        if out.error:
            cells.status[ix], cells.reason[ix] = "refused", out.error
            continue
        cells.thr[ix], why = _fold_threshold(rule, out, _split_key(key))
        if why:
            cells.status[ix], cells.reason[ix] = "refused", why
            continue
        r = out.ratios[tg == gj]
        cells.n_test[ix] = r.size
        cells.fp[ix] = int(np.sum(r > 1.0))
        if r.size:
            cells.tight[ix] = float(np.median(r))
            cells.ratios.setdefault((mi, gj, bi), []).append(r)
        rb = out.buggy_ratios[bgf == gj]
        cells.n_bug[ix] = rb.size
        cells.caught[ix] = int(np.sum(rb > 1.0))


def _pool_folds(cells: _Cells, bl: list[float], g: float) -> dict[str, np.ndarray]:
    """Per (method, group, budget): counts summed over folds, intervals, verdict, tightness, stability."""
    M, G, B, F = cells.thr.shape
    p: dict[str, np.ndarray] = {
        "fp": cells.fp.sum(-1), "n_test": cells.n_test.sum(-1), "n_buggy": cells.n_bug.sum(-1),
        "caught": cells.caught.sum(-1), "refused": (cells.status != "ok").sum(-1),
        "tightness": np.full((M, G, B), np.nan), "stability": np.full((M, G, B), np.nan),
        "verdict": np.full((M, G, B), "", dtype=object),
    }
    p["fp_lo"], p["fp_hi"] = clopper_pearson(p["fp"], p["n_test"], g)
    for ix in np.ndindex(M, G, B):
        p["verdict"][ix] = budget_verdict(p["fp_lo"][ix], p["fp_hi"][ix], bl[ix[2]])
        rs = cells.ratios.get(ix)
        if rs:
            p["tightness"][ix] = float(np.median(np.concatenate(rs)))
        t = cells.thr[ix]
        t = t[np.isfinite(t)]
        if t.size == F:
            p["stability"][ix] = (float(t.max() / t.min()) if t.min() > 0 else (1.0 if t.max() == 0 else math.inf))
    return p
