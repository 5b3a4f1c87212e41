"""Held-out recall and false positives of tolstat's default tolerance on torch CPU kernels.

The kernels are torch functions outside tolstat's embedded corpus (``tolstat.corpus`` is not
imported). Per (op, dtype), with dtype float16 and bfloat16:

* correct variants: the torch function on the low-precision tensors, and a hand-written
  float32 computation cast to the dtype;
* calibration: ``--n-cal`` runs in total, the variants taking turns, each on fresh inputs,
  collected with ``tolstat.from_pairs(..., inputs=..., params=...)`` (the op's own torch
  arguments); one ``tolstat.select(ds, fp_budget=0.01, on_error="skip")`` over all groups;
* held-out: ``--n-test`` fresh runs per correct variant, and ``--n-bug`` fresh runs per
  bug kind and dtype (a bug is a change to a correct kernel's computation).

The reference is the torch function in float64 on the same rounded inputs. Each held-out run
is decided by tolstat (default form, and ``form="allclose"``), by the torch.testing
``assert_close`` default tolerances and by ``atol = rtol = 1e-2``.

Usage
-----
::

    .venv/bin/python benchmarks/torch_heldout.py --quick    # smoke run (~10 s)
    .venv/bin/python benchmarks/torch_heldout.py            # n_cal 300, n_test 30, n_bug 30 (~15 s)
    .venv/bin/python benchmarks/torch_heldout.py --rows-factor 8   # held-out outputs of 8x the rows

Writes ``benchmarks/results/torch_heldout.json`` and ``.md`` next to it (``--out``; with
``--rows-factor F > 1``, ``torch_heldout_rows<F>.json``): the held-out runs then have ``F``
times the calibration runs' leading dimension, and the default table is also checked
without its calibrated size (``rows_max``, ``n_elements_max``: ``tolstat_as_calibrated``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import tolstat
from tolstat._base.util import atomic_write_text

HERE = Path(__file__).resolve().parent
DTYPES: dict[str, torch.dtype] = {"float16": torch.float16, "bfloat16": torch.bfloat16}
#: torch.testing.assert_close defaults (rtol, atol)
TORCH_DEFAULT: dict[str, tuple[float, float]] = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5)}
METHODS = ("tolstat", "tolstat_allclose", "torch_default", "atol_rtol_1e-2")
#: with --rows-factor > 1: the default table without its calibrated size (nothing carried beyond it)
AS_CALIBRATED = "tolstat_as_calibrated"
HARD_BUGS = ("rms_norm_eps_outside_sqrt", "softmax_lowp_denominator", "layer_norm_eps_1e-6",
             "softmax_no_max_sub", "sdpa_scale_sqrt_d_plus_1")


@dataclass(frozen=True)
class Case:
    """One run's arguments: ``inputs`` positional (low-precision tensors), ``params`` keywords."""

    inputs: tuple[Any, ...]
    params: dict[str, Any] = field(default_factory=dict)


Kernel = Callable[[Case, torch.dtype], torch.Tensor]


@dataclass(frozen=True)
class OpSpec:
    """A torch op: its function, input generator and correct variants."""

    name: str
    fn: Callable[..., torch.Tensor]
    make: Callable[[np.random.Generator, torch.dtype, bool], Case]
    variants: dict[str, Kernel]


@dataclass(frozen=True)
class Bug:
    """A buggy kernel of ``op``; ``adjust`` restricts its inputs (e.g. causal attention)."""

    name: str
    op: str
    kernel: Kernel
    adjust: Callable[[Case], Case] | None = None


# ------------------------------------------------------------------------------- inputs
def _lp(a: np.ndarray, dt: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(dt)


def _rows(rng: np.random.Generator, shape: tuple[int, ...], large: bool = False) -> np.ndarray:
    """N(0,1); in some runs each row is scaled by 10**U(-3,0) (or, with ``large``, 10**U(0,2))."""
    x = rng.standard_normal(shape)
    mode = rng.choice(3, p=[0.5, 0.25, 0.25] if large else [0.65, 0.35, 0.0])
    if mode:
        lo, hi = (-3.0, 0.0) if mode == 1 else (0.0, 2.0)
        x *= 10.0 ** rng.uniform(lo, hi, size=shape[:-1] + (1,))
    return x


def _pick(rng: np.random.Generator, options: tuple[int, ...]) -> int:
    return int(rng.choice(options))


def _lengths(quick: bool) -> tuple[int, ...]:
    return (32, 128) if quick else (32, 128, 512, 1024)


def make_matmul(rng: np.random.Generator, dt: torch.dtype, quick: bool, rows: int = 1) -> Case:
    m, k, n = _pick(rng, (4, 16)) * rows, _pick(rng, _lengths(quick)), _pick(rng, (8, 32))
    return Case((_lp(_rows(rng, (m, k)), dt), _lp(rng.standard_normal((k, n)), dt)))


def make_bmm(rng: np.random.Generator, dt: torch.dtype, quick: bool, rows: int = 1) -> Case:
    b, m, k = _pick(rng, (2, 4)), _pick(rng, (4, 16)) * rows, _pick(rng, _lengths(quick))
    return Case((_lp(_rows(rng, (b, m, k)), dt), _lp(rng.standard_normal((b, k, 16)), dt)))


def make_linear(rng: np.random.Generator, dt: torch.dtype, quick: bool, rows: int = 1) -> Case:
    m, k = _pick(rng, (4, 16)) * rows, _pick(rng, (32, 128) if quick else (32, 128, 512))
    w = rng.standard_normal((k, k)) / math.sqrt(k)  # square: out_features = in_features
    return Case((_lp(_rows(rng, (m, k)), dt), _lp(w, dt), _lp(rng.standard_normal(k), dt)))


def make_rowwise(large: bool = False, scale: float = 1.0, dim: bool = False) -> Callable[..., Case]:
    """(rows, n) inputs for softmax-like, pointwise and scan ops."""
    def make(rng: np.random.Generator, dt: torch.dtype, quick: bool, rows: int = 1) -> Case:
        shape = (_pick(rng, (4, 16)) * rows, _pick(rng, _lengths(quick)))
        return Case((_lp(scale * _rows(rng, shape, large), dt),), {"dim": -1} if dim else {})
    return make


def make_layer_norm(rng: np.random.Generator, dt: torch.dtype, quick: bool, rows: int = 1) -> Case:
    m, n = _pick(rng, (4, 16)) * rows, _pick(rng, _lengths(quick))
    w, b = 1.0 + 0.1 * rng.standard_normal(n), 0.1 * rng.standard_normal(n)
    return Case((_lp(_rows(rng, (m, n)), dt), (n,), _lp(w, dt), _lp(b, dt)), {"eps": 1e-5})


def make_rms_norm(rng: np.random.Generator, dt: torch.dtype, quick: bool, rows: int = 1) -> Case:
    m, n = _pick(rng, (4, 16)) * rows, _pick(rng, _lengths(quick))
    w = 1.0 + 0.1 * rng.standard_normal(n)
    return Case((_lp(_rows(rng, (m, n)), dt), (n,), _lp(w, dt)), {"eps": 1e-6})


def make_sdpa(rng: np.random.Generator, dt: torch.dtype, quick: bool, rows: int = 1) -> Case:
    seq, d = _pick(rng, (16, 64) if quick else (16, 64, 128)), _pick(rng, (16, 32, 64))
    q, k, v = (_rows(rng, (rows, 2, seq, d)) for _ in range(3))
    return Case(tuple(_lp(a, dt) for a in (q, k, v)), {"is_causal": bool(rng.integers(2))})


def make_conv1d(rng: np.random.Generator, dt: torch.dtype, quick: bool, rows: int = 1) -> Case:
    c_in, ks = _pick(rng, (32, 64) if quick else (32, 64, 128)), _pick(rng, (3, 5))
    w = rng.standard_normal((16, c_in, ks)) / math.sqrt(c_in * ks)
    return Case((_lp(_rows(rng, (2 * rows, c_in, 64)), dt), _lp(w, dt), _lp(rng.standard_normal(16), dt)))


# ----------------------------------------------------------------------------- kernels
def _f(case: Case) -> list[Any]:
    """The inputs upcast to float32 (non-tensors unchanged)."""
    return [a.float() if isinstance(a, torch.Tensor) else a for a in case.inputs]


def reference(spec: OpSpec, case: Case) -> torch.Tensor:
    """The torch function in float64 on the same rounded inputs."""
    args = [a.double() if isinstance(a, torch.Tensor) else a for a in case.inputs]
    return spec.fn(*args, **case.params)


def torch_kernel(fn: Callable[..., torch.Tensor]) -> Kernel:
    return lambda case, dt: fn(*case.inputs, **case.params)


def _lowp_chunked(a: torch.Tensor, b: torch.Tensor, dt: torch.dtype, chunk: int) -> torch.Tensor:
    """a @ b with float32 partial products over ``chunk`` terms, accumulated in ``dt``."""
    acc = None
    for s in range(0, a.shape[-1], chunk):
        part = (a[..., s:s + chunk].float() @ b[..., s:s + chunk, :].float()).to(dt)
        acc = part if acc is None else acc + part  # each addition rounds to dt
    return acc


def _seq_lowp(e: torch.Tensor, cumulative: bool = False) -> torch.Tensor:
    """Sequential sum (or scan) along the last axis in ``e``'s (low-precision) dtype."""
    s, outs = e[..., 0].clone(), [e[..., 0]]
    for j in range(1, e.shape[-1]):
        s = s + e[..., j]
        outs.append(s)
    return torch.stack(outs, -1) if cumulative else s.unsqueeze(-1)


def softmax_f32(case: Case, dt: torch.dtype) -> torch.Tensor:
    x = case.inputs[0].float()
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return (e / e.sum(-1, keepdim=True)).to(dt)


def log_softmax_f32(case: Case, dt: torch.dtype) -> torch.Tensor:
    z = case.inputs[0].float()
    z = z - z.amax(-1, keepdim=True)
    return (z - torch.log(torch.exp(z).sum(-1, keepdim=True))).to(dt)


def layer_norm_f32(case: Case, dt: torch.dtype, eps: float | None = None, correction: int = 0) -> torch.Tensor:
    x, _, w, b = _f(case)
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).sum(-1, keepdim=True) / (x.shape[-1] - correction)
    eps = case.params["eps"] if eps is None else eps
    return ((x - mu) / torch.sqrt(var + eps) * w + b).to(dt)


def rms_norm_f32(case: Case, dt: torch.dtype, mode: str = "correct") -> torch.Tensor:
    x, _, w = _f(case)
    eps = case.params["eps"]
    if mode == "drop_last":
        ms = (x[..., :-1] ** 2).mean(-1, keepdim=True)
    else:
        ms = (x ** 2).mean(-1, keepdim=True)
    den = torch.sqrt(ms) + eps if mode == "eps_outside" else torch.sqrt(ms + eps)
    return (x / den * w).to(dt)


def gelu_f32(case: Case, dt: torch.dtype) -> torch.Tensor:
    x = case.inputs[0].float()
    return (0.5 * x * (1 + torch.erf(x / math.sqrt(2)))).to(dt)


def silu_f32(case: Case, dt: torch.dtype) -> torch.Tensor:
    x = case.inputs[0].float()
    return (x / (1 + torch.exp(-x))).to(dt)


def attention_f32(case: Case, dt: torch.dtype, diagonal: int = 0) -> torch.Tensor:
    q, k, v = _f(case)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if case.params.get("is_causal"):
        keep = torch.ones(s.shape[-2:], dtype=torch.bool).tril(diagonal=diagonal)
        s = s.masked_fill(~keep, float("-inf"))
    return (torch.softmax(s, -1) @ v).to(dt)


def conv1d_lowp_channels(case: Case, dt: torch.dtype, chunk: int = 16) -> torch.Tensor:
    x, w, b = case.inputs
    acc = None
    for s in range(0, x.shape[1], chunk):
        part = F.conv1d(x[:, s:s + chunk].float(), w[:, s:s + chunk].float()).to(dt)
        acc = part if acc is None else acc + part
    return acc + b[:, None]


def _softmax_lowp_den(case: Case, dt: torch.dtype) -> torch.Tensor:
    x = case.inputs[0].float()
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return (e / _seq_lowp(e.to(dt)).float()).to(dt)


def _softmax_no_max(case: Case, dt: torch.dtype) -> torch.Tensor:
    e = torch.exp(case.inputs[0].float())
    return (e / e.sum(-1, keepdim=True)).to(dt)


def _causal(case: Case) -> Case:
    return replace(case, params={**case.params, "is_causal": True})


def _sdpa_scale_bug(case: Case, dt: torch.dtype) -> torch.Tensor:
    q, k, v = case.inputs
    return F.scaled_dot_product_attention(q, k, v, **case.params, scale=1.0 / math.sqrt(q.shape[-1] + 1))


def build_ops() -> list[OpSpec]:
    """The ops, each with the torch kernel and a hand-written float32 variant."""
    def f32(fn: Callable[..., torch.Tensor]) -> Kernel:
        return lambda case, dt: fn(*_f(case), **case.params).to(dt)

    sdpa = F.scaled_dot_product_attention
    specs = [
        ("matmul", torch.matmul, make_matmul, lambda c, dt: (c.inputs[0].float() @ c.inputs[1].float()).to(dt)),
        ("linear", F.linear, make_linear,
         lambda c, dt: (c.inputs[0].float() @ c.inputs[1].float().T + c.inputs[2].float()).to(dt)),
        ("bmm", torch.bmm, make_bmm, f32(torch.bmm)),
        ("softmax", F.softmax, make_rowwise(large=True, dim=True), softmax_f32),
        ("log_softmax", F.log_softmax, make_rowwise(large=True, dim=True), log_softmax_f32),
        ("layer_norm", F.layer_norm, make_layer_norm, layer_norm_f32),
        ("rms_norm", F.rms_norm, make_rms_norm, rms_norm_f32),
        ("gelu", F.gelu, make_rowwise(scale=2.0), gelu_f32),
        ("silu", F.silu, make_rowwise(scale=2.0), silu_f32),
        ("scaled_dot_product_attention", sdpa, make_sdpa, attention_f32),
        ("conv1d", F.conv1d, make_conv1d, f32(F.conv1d)),
        ("cumsum", torch.cumsum, make_rowwise(dim=True), f32(torch.cumsum)),
    ]
    return [OpSpec(n, fn, mk, {"torch": torch_kernel(fn), "f32_hand": hand}) for n, fn, mk, hand in specs]


def build_bugs() -> list[Bug]:
    """Buggy kernels; the first five are the known-hard ones."""
    def linear_f32(c: Case, dt: torch.dtype, bias: float = 1.0, transpose: bool = True) -> torch.Tensor:
        x, w, b = (a.float() for a in c.inputs)
        return (x @ (w.T if transpose else w) + bias * b).to(dt)

    return [
        Bug("rms_norm_eps_outside_sqrt", "rms_norm", lambda c, dt: rms_norm_f32(c, dt, "eps_outside")),
        Bug("softmax_lowp_denominator", "softmax", _softmax_lowp_den),
        Bug("layer_norm_eps_1e-6", "layer_norm", lambda c, dt: layer_norm_f32(c, dt, eps=1e-6)),
        Bug("softmax_no_max_sub", "softmax", _softmax_no_max),
        Bug("sdpa_scale_sqrt_d_plus_1", "scaled_dot_product_attention", _sdpa_scale_bug),
        Bug("matmul_lowp_acc32", "matmul", lambda c, dt: _lowp_chunked(*c.inputs, dt, 32)),
        Bug("linear_no_bias", "linear", lambda c, dt: linear_f32(c, dt, bias=0.0)),
        Bug("linear_bias_twice", "linear", lambda c, dt: linear_f32(c, dt, bias=2.0)),
        Bug("linear_transposed_weight", "linear", lambda c, dt: linear_f32(c, dt, transpose=False)),
        Bug("bmm_drop_last_term", "bmm",
            lambda c, dt: torch.bmm(c.inputs[0][..., :-1].float(), c.inputs[1][:, :-1].float()).to(dt)),
        Bug("rms_norm_drop_last", "rms_norm", lambda c, dt: rms_norm_f32(c, dt, "drop_last")),
        Bug("layer_norm_unbiased_var", "layer_norm", lambda c, dt: layer_norm_f32(c, dt, correction=1)),
        Bug("gelu_tanh_approx", "gelu", lambda c, dt: F.gelu(c.inputs[0].float(), approximate="tanh").to(dt)),
        Bug("silu_lowp_sigmoid", "silu", lambda c, dt: c.inputs[0] * torch.sigmoid(c.inputs[0])),
        Bug("log_softmax_log_of_lowp_softmax", "log_softmax", lambda c, dt: torch.log(F.softmax(c.inputs[0], -1))),
        Bug("sdpa_causal_off_by_one", "scaled_dot_product_attention",
            lambda c, dt: attention_f32(c, dt, diagonal=1), adjust=_causal),
        Bug("conv1d_lowp_channel_acc16", "conv1d", conv1d_lowp_channels),
        Bug("cumsum_lowp_acc", "cumsum", lambda c, dt: _seq_lowp(c.inputs[0], cumulative=True)),
    ]


# ------------------------------------------------------------------------------ runs
@dataclass
class Run:
    """A held-out run: its output, reference and arguments, and the decisions on it."""

    op: str
    dtype: str
    kind: str  # "correct" or "bug"
    name: str  # variant or bug name
    out: torch.Tensor
    ref: torch.Tensor
    case: Case
    identical: bool = False  # bug output equal to a correct variant's on the same inputs
    detectable: bool = False
    max_err: float = 0.0
    failed: dict[str, bool | None] = field(default_factory=dict)


def _max_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    d = (out.double() - ref).abs()
    return math.inf if not torch.isfinite(d).all() else float(d.max())


def _allclose_fails(out: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> bool:
    """Fails unless |out - ref| <= atol + rtol |ref| everywhere (NaN fails)."""
    return not bool(((out.double() - ref).abs() <= atol + rtol * ref.abs()).all())


def collect_group(spec: OpSpec, bugs: list[Bug], oi: int, dt_name: str, args: argparse.Namespace
                  ) -> tuple[Any, list[Run]]:
    """Calibration dataset and held-out runs of one (op, dtype)."""
    dt, di = DTYPES[dt_name], list(DTYPES).index(dt_name)
    kernels = list(spec.variants.items())

    def case(part: int, i: int) -> Case:
        # the held-out runs (parts >= 1) with --rows-factor times the leading dimension
        rows = 1 if part == 0 else args.rows_factor
        return spec.make(np.random.default_rng([args.seed, oi, di, part, i]), dt, args.quick, rows)

    items = []
    for i in range(args.n_cal):
        c = case(0, i)
        out = kernels[i % len(kernels)][1](c, dt)
        items.append({"actual": out, "expected": reference(spec, c), "inputs": c.inputs, "params": c.params})
    ds = tolstat.from_pairs(items, op=spec.name, dtype=dt_name, options=tolstat.CollectOptions(progress=False))
    runs: list[Run] = []
    for vi, (vname, kern) in enumerate(kernels):
        for i in range(args.n_test):
            c = case(1, vi * 100_000 + i)
            runs.append(Run(spec.name, dt_name, "correct", vname, kern(c, dt), reference(spec, c), c))
    for bi, bug in enumerate(bugs):
        for i in range(args.n_bug):
            c = case(2 + bi, i)
            c = bug.adjust(c) if bug.adjust else c
            out = bug.kernel(c, dt)
            same = any(torch.equal(out, k(c, dt)) for _, k in kernels)
            runs.append(Run(spec.name, dt_name, "bug", bug.name, out, reference(spec, c), c, identical=same))
    return ds, runs


def decide(runs: list[Run], tables: dict[str, Any]) -> None:
    """Fill each run's ``max_err`` and ``failed[method]`` (None: the group was refused)."""
    for r in runs:
        r.max_err = _max_err(r.out, r.ref)
        for m, t in tables.items():
            try:
                res = tolstat.check(r.out, r.ref, op=r.op, dtype=r.dtype, table=t,
                                    inputs=r.case.inputs, params=r.case.params)
                r.failed[m] = not res.passed
            except KeyError:  # a group select refused (NaN threshold)
                r.failed[m] = None
        rtol, atol = TORCH_DEFAULT[r.dtype]
        r.failed["torch_default"] = _allclose_fails(r.out, r.ref, rtol, atol)
        r.failed["atol_rtol_1e-2"] = _allclose_fails(r.out, r.ref, 1e-2, 1e-2)


def detectable(runs: list[Run]) -> dict[tuple[str, str], float]:
    """Mark buggy runs detectable; returns the per-group largest correct held-out error."""
    bar: dict[tuple[str, str], float] = {}
    for r in runs:
        if r.kind == "correct":
            bar[(r.op, r.dtype)] = max(bar.get((r.op, r.dtype), 0.0), r.max_err)
    for r in runs:
        r.detectable = r.kind == "bug" and not r.identical and r.max_err > bar[(r.op, r.dtype)]
    return bar


# --------------------------------------------------------------------------- summary
def _rate(flags: list[bool | None]) -> dict[str, Any]:
    f = [x for x in flags if x is not None]
    k, n = int(sum(f)), len(f)
    return {"k": k, "n": n, "pct": 100.0 * k / n if n else math.nan, "refused": len(flags) - n}


def _cell(d: dict[str, Any]) -> str:
    return f"{d['k']}/{d['n']} ({d['pct']:.1f}%)" if d["n"] else "-"


def summarise(runs: list[Run], methods: tuple[str, ...] = METHODS) -> dict[str, Any]:
    ctrl = [r for r in runs if r.kind == "correct"]
    bug = [r for r in runs if r.kind == "bug"]
    det = [r for r in bug if r.detectable]
    summary = {m: {"fp": _rate([r.failed[m] for r in ctrl]), "recall_all": _rate([r.failed[m] for r in bug]),
                   "recall_detectable": _rate([r.failed[m] for r in det])} for m in methods}
    per_bug = []
    for name, dt in sorted({(r.name, r.dtype) for r in bug}, key=lambda k: (k[0] not in HARD_BUGS, k)):
        rs = [r for r in bug if (r.name, r.dtype) == (name, dt)]
        ds = [r for r in rs if r.detectable]
        per_bug.append({"bug": name, "op": rs[0].op, "dtype": dt, "n": len(rs), "detectable": len(ds),
                        "identical": sum(r.identical for r in rs),
                        **{m: {"all": _rate([r.failed[m] for r in rs]), "detectable": _rate([r.failed[m] for r in ds])}
                           for m in methods}})
    per_variant = []
    for op, dt, v in sorted({(r.op, r.dtype, r.name) for r in ctrl}):
        rs = [r for r in ctrl if (r.op, r.dtype, r.name) == (op, dt, v)]
        per_variant.append({"op": op, "dtype": dt, "variant": v,
                            **{m: _rate([r.failed[m] for r in rs]) for m in methods}})
    return {"summary": summary, "per_bug": per_bug, "per_variant": per_variant}


def markdown(res: dict[str, Any]) -> str:
    c = res["config"]
    methods = tuple(res.get("methods", METHODS))
    lines = [
        "# tolstat on held-out torch CPU kernels (outside the embedded corpus)", "",
        f"Command: `{res['command']}`; commit {res['commit']}; run time {res['wall_s']:.0f} s wall, "
        f"{res['cpu_s']:.0f} s CPU (1 torch thread); load average {res['load_start'][0]:.2f} at start, "
        f"{res['load_end'][0]:.2f} at end; torch {res['torch']}.", "",
        f"Sizes: {len(res['ops'])} ops x {len(DTYPES)} dtypes ({', '.join(DTYPES)}); per (op, dtype) "
        f"{c['n_cal']} calibration runs (correct variants in turn), {c['n_test']} held-out runs per correct "
        f"variant (2 variants: the torch function on the low-precision tensors, a hand-written float32 "
        f"computation cast), {c['n_bug']} runs per bug kind and dtype; seed {c['seed']}, quick={c['quick']}. "
        "Every run has fresh inputs. Reference: the torch function in float64 on the same rounded inputs."
        + (f" Held-out runs have {c['rows_factor']} times the leading dimension (rows) of the calibration runs; "
           f"`{AS_CALIBRATED}` is the default table without its `rows_max` and `n_elements_max` (a larger "
           "output's row invariants, row bias and whole-output bias as calibrated, nothing carried)." if c.get("rows_factor", 1) > 1 else ""),
        "",
        "Methods: `tolstat` = `select(ds, fp_budget=0.01)` (default form; one call over all groups, "
        "`on_error='skip'`) then `check(..., inputs=, params=)`; `tolstat_allclose` = the same with "
        "`form='allclose'`; `torch_default` = torch.testing.assert_close default rtol/atol "
        "(float16 1e-3/1e-5, bfloat16 1.6e-2/1e-5); `atol_rtol_1e-2` = atol = rtol = 1e-2. The fixed rules "
        "pass iff |out - ref| <= atol + rtol |ref| everywhere (output upcast to float64; NaN fails).", "",
        "**Detectable**: a buggy run whose max |out - ref| exceeds the largest max |out - ref| of the "
        "held-out runs of the correct variants of the same (op, dtype), and whose output is not bitwise "
        "equal to the output of a correct variant on the same inputs.", "",
    ]
    if res["refused"]:
        lines += ["Groups `select` refused: " + "; ".join(f"{k}: {v}" for k, v in res["refused"].items()), ""]
    lines += ["## Summary", "", "| method | FP (held-out correct) | recall (all buggy) | recall (detectable) |",
              "|---|---|---|---|"]
    for m, s in res["summary"].items():
        lines.append(f"| {m} | {_cell(s['fp'])} | {_cell(s['recall_all'])} | {_cell(s['recall_detectable'])} |")
    lines += ["", "## Per bug (recall on all runs / on detectable runs)", "",
              "| bug | op | dtype | detectable | identical | " + " | ".join(methods) + " |",
              "|---|---|---|---|---|" + "---|" * len(methods)]
    for b in res["per_bug"]:
        cells = [f"{b[m]['all']['pct']:.0f}% / " + (f"{b[m]['detectable']['pct']:.0f}%" if b["detectable"] else "-")
                 if b[m]["all"]["n"] else "-" for m in methods]
        lines.append(f"| {b['bug']} | {b['op']} | {b['dtype']} | {b['detectable']}/{b['n']} | {b['identical']} | "
                     + " | ".join(cells) + " |")
    lines += ["", "## False positives per correct variant (variants with at least one failure; JSON has all)", "",
              "| op | dtype | variant | " + " | ".join(methods) + " |", "|---|---|---|" + "---|" * len(methods)]
    for v in (v for v in res["per_variant"] if any(v[m]["k"] for m in methods)):
        lines.append(f"| {v['op']} | {v['dtype']} | {v['variant']} | " + " | ".join(_cell(v[m]) for m in methods) + " |")
    return "\n".join(lines) + "\n"


def _json_safe(obj: Any) -> Any:
    """Non-finite floats as strings ("inf", "nan"), tuples as lists: strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def _commit() -> str:
    """Short HEAD, flagged when tolstat/ differs from it (read-only git calls)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "../tolstat"], cwd=HERE).returncode
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + (" (tolstat/ has uncommitted changes)" if dirty else "")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="short reductions, n_test 4, n_bug 4")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-cal", type=int, default=300)
    p.add_argument("--n-test", type=int, default=None, help="per correct variant (default 30; quick 4)")
    p.add_argument("--n-bug", type=int, default=None, help="per bug kind and dtype (default 30; quick 4)")
    p.add_argument("--rows-factor", type=int, default=1,
                   help="held-out runs with this many times the calibration runs' leading dimension (rows); "
                        "above 1 the default table is also checked without its calibrated size (default 1)")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON output (default results/torch_heldout.json, torch_heldout_rows<F>.json with "
                        "--rows-factor F > 1)")
    args = p.parse_args(argv)
    if args.rows_factor < 1:
        p.error(f"--rows-factor must be >= 1, got {args.rows_factor}")
    if args.out is None:
        name = "torch_heldout.json" if args.rows_factor == 1 else f"torch_heldout_rows{args.rows_factor}.json"
        args.out = HERE / "results" / name
    args.n_test = args.n_test if args.n_test is not None else (4 if args.quick else 30)
    args.n_bug = args.n_bug if args.n_bug is not None else (4 if args.quick else 30)
    torch.set_num_threads(1)
    load_start, t0, c0 = os.getloadavg(), time.perf_counter(), time.process_time()

    ops, bugs = build_ops(), build_bugs()
    datasets, runs = [], []
    for oi, spec in enumerate(ops):
        for dt_name in DTYPES:
            ds, rs = collect_group(spec, [b for b in bugs if b.op == spec.name], oi, dt_name, args)
            datasets.append(ds)
            runs += rs
        print(f"  {spec.name}: {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    ds = tolstat.concat(datasets)
    tables = {"tolstat": tolstat.select(ds, fp_budget=0.01, on_error="skip"),
              "tolstat_allclose": tolstat.select(ds, fp_budget=0.01, form="allclose", on_error="skip")}
    methods = METHODS
    if args.rows_factor > 1:  # the same default table, nothing carried beyond the calibrated size
        d = tables["tolstat"].to_dict()
        for g in d["groups"]:
            g["certificate"].pop("rows_max", None)
            g["certificate"].pop("n_elements_max", None)
        tables[AS_CALIBRATED] = tolstat.ToleranceTable.from_groups(d.pop("groups"), d)
        methods = METHODS[:1] + (AS_CALIBRATED,) + METHODS[1:]
    refused, forms = {}, {}
    for m, t in tables.items():
        if m == AS_CALIBRATED:
            continue
        for spec in ops:
            for dt_name in DTYPES:
                try:
                    e = t.entry(spec.name, dt_name)
                    forms[f"{m}:{spec.name}/{dt_name}"] = (e.certificate or {}).get("form", e.max_statistic)
                except KeyError as exc:
                    refused[f"{m}:{spec.name}/{dt_name}"] = str(exc).strip("'\"")
    decide(runs, tables)
    bar = detectable(runs)
    res: dict[str, Any] = {
        "command": " ".join(["python benchmarks/torch_heldout.py", *(argv if argv is not None else sys.argv[1:])]),
        "commit": _commit(), "torch": torch.__version__, "tolstat": tolstat.__version__,
        "config": {"seed": args.seed, "n_cal": args.n_cal, "n_test": args.n_test, "n_bug": args.n_bug,
                   "quick": args.quick, "fp_budget": 0.01, "dtypes": list(DTYPES), "rows_factor": args.rows_factor},
        "methods": list(methods),
        "ops": [s.name for s in ops], "bugs": [{"name": b.name, "op": b.op} for b in bugs],
        "refused": refused, "forms": forms,
        "correct_max_err": {f"{o}/{d}": v for (o, d), v in bar.items()},
        **summarise(runs, methods),
        "load_start": load_start, "load_end": os.getloadavg(),
        "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(_json_safe(res), indent=1, allow_nan=False) + "\n")
    atomic_write_text(out.with_suffix(".md"), markdown(res))
    print(markdown(res).split("## Per bug")[0])
    return res


if __name__ == "__main__":
    main()
