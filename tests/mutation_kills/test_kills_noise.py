"""Mutants of ``tolstat.noise`` that survived the held-out sample (``--sample 40 --seed 32``).

Each test checks a documented behaviour of the operator noise model against an
independent reference: the definitions of ``docs/noise.md`` re-implemented in numpy (the
noise scale with the unit roundoffs ``2**-11``, ``2**-24``; the invariants' matched
filters), the round-to-nearest reference computed by a plain cast, or the stated
contract that the statistics of a correct (or empty) output are 0 and are computed
quietly (no floating-point warning for values that are handled on purpose).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from tolstat import noise


def _log_softmax(x: np.ndarray) -> np.ndarray:
    """float64 log-softmax along the last axis (``-inf`` logits give ``-inf``)."""
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _lse_reference(a: np.ndarray, e: np.ndarray, s: np.ndarray) -> float:
    """docs/noise.md, ``inv_row_lse``: worst |sum_j p_j d_j| / sqrt(sum_j p_j^2 s_j^2) with
    p = exp(ref), over the finite entries of each row (a masked entry, -inf in the
    reference and in the output, has p_j = 0 and is exact)."""
    worst = 0.0
    for ar, er, sr in zip(a, e, s):
        f = np.isfinite(er)
        p, d = np.exp(er[f]), ar[f] - er[f]
        num = abs(float(np.sum(p * d)))
        if num:
            worst = max(worst, num / math.sqrt(float(np.sum((p * sr[f]) ** 2))))
    return worst


def _scale(e: np.ndarray, u_out: float, tiny: float, u_acc: float = 2.0 ** -24, K: float = 1.0,
           m: np.ndarray | None = None) -> np.ndarray:
    """docs/noise.md: s_i = u_out |ref_i| + u_acc sqrt(K) m_i + u_out tiny (c_out = c_acc = 1)."""
    m = np.abs(e) if m is None else m
    return u_out * np.abs(e) + u_acc * math.sqrt(K) * m + u_out * tiny


# ------------------------------------------------------------------ matched non-finite pairs
@pytest.mark.parametrize("record", [False, True])
def test_masked_log_softmax_output_is_exact_for_its_invariant(record):
    """A masked log-softmax (``-inf`` logits) has ``-inf`` in the reference; a correct
    output has ``-inf`` there too. Such a matched pair is exact (docs/noise.md: only a
    non-finite output that differs from its reference fails), so ``inv_row_lse`` is the
    matched filter over the unmasked entries, and finite."""
    rng = np.random.default_rng(320)
    x = rng.standard_normal((6, 16))
    x[:, 11:] = -np.inf
    x[2, 3] = -np.inf
    e = _log_softmax(x)
    a = e.astype(np.float16).astype(np.float64)
    a[1, :11] = (a[1, :11] * (1 + 2.0 ** -9)).astype(np.float16)  # a scaled row: the invariant moves
    fn = noise.record_statistics if record else noise.run_statistics
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st = fn(a, e, dtype="float16", rowwise=True, op="log_softmax")
    s = _scale(np.where(np.isfinite(e), e, 0.0), 2.0 ** -11, 2.0 ** -14)
    want = _lse_reference(a, e, s)
    assert want > 1.0
    assert st["inv_row_lse"] == pytest.approx(want, rel=1e-9)
    assert math.isfinite(st["op_max"]) and st["op_max"] > 1.0
    # a masked entry that is not -inf in the output fails every statistic
    a[0, 12] = 0.0
    assert all(v == math.inf for v in fn(a, e, dtype="float16", rowwise=True, op="log_softmax").values())

