"""Mutants of ``tolstat.measure.noise`` that survived the held-out sample (``--sample 40 --seed 32``).

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

from tolstat.measure import noise


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


def test_matched_non_finite_pairs_reach_an_invariant_as_exact_entries():
    """Only matched non-finite pairs reach an invariant (unmatched ones make every
    statistic +inf); an invariant that sums the differences at the non-finite entries of
    the reference sees none there (inf - inf is NaN, so the pairs must be exact)."""
    def nonfinite_diffs(a, e, s):
        f = ~np.isfinite(e)
        same = (a[f] == e[f]) | (np.isnan(a[f]) & np.isnan(e[f]))
        return float(np.count_nonzero(~same))

    noise.register_invariant("kills_noise_matched", "nonfinite", nonfinite_diffs, replace=True)
    e = np.linspace(-2.0, 2.0, 24).reshape(4, 6)
    e[1, 2], e[3, 5], e[0, 0] = np.inf, -np.inf, np.nan
    a = e.astype(np.float32).astype(np.float64)
    st = noise.run_statistics(a, e, dtype="float32", rowwise=True, row_axis=0, op="kills_noise_matched")
    assert st["inv_nonfinite"] == 0.0
    assert st["op_max"] <= 1.0 and st["op_bias"] == 0.0


# ------------------------------------------------------------------ empty rows, zero rows
@pytest.mark.parametrize("op,name", [("softmax", "row_sum"), ("log_softmax", "row_lse"),
                                     ("layer_norm", "row_mean"), ("layer_norm", "row_scale"),
                                     ("rms_norm", "row_scale")])
def test_invariants_of_an_output_without_rows_are_zero(op, name):
    """An output with no rows satisfies every invariant (0, like the statistics of an
    empty output); an invariant is a nonnegative statistic, 0 when it holds."""
    fn = noise.invariants(op)[name]
    z = np.zeros((0, 8))
    assert fn(z, z, np.ones((0, 8))) == 0.0


def test_rms_norm_of_a_zero_row_is_exact_and_quiet():
    """A zero input row of an RMS norm gives a zero reference row (the projection weight
    r = ref is 0): the row holds its scale exactly (0) and no 0/0 warning is raised."""
    rng = np.random.default_rng(321)
    e = rng.standard_normal((5, 32))
    e[2] = 0.0
    a = e.astype(np.float16).astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st = noise.run_statistics(a, e, dtype="float16", rowwise=True, op="rms_norm")
        v = noise.invariants("rms_norm")["row_scale"](a[2:3], e[2:3], np.ones((1, 32)))
    assert v == 0.0
    s = _scale(e, 2.0 ** -11, 2.0 ** -14)
    d = a - e
    per_row = [abs(float(np.sum(r * dr))) / math.sqrt(float(np.sum((r * sr) ** 2)))
               for r, dr, sr in zip(e, d, s) if np.any(r)]
    assert st["inv_row_scale"] == pytest.approx(max(per_row), rel=1e-9)


# ------------------------------------------------------------------ overflow, quietly
def test_rounded_reference_beyond_the_range_is_the_reference_quietly():
    """``rounded_reference``: RN(ref) as a float16 cast, and the reference itself where
    that is not finite, without an overflow warning (beyond the range is handled)."""
    e = np.array([1.0 + 2.0 ** -12, -3.0e5, 65504.0, 65520.0, 7.0e4, 2.0 ** -26])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = noise.rounded_reference(e, "float16")
        st = noise.run_statistics(e, e, dtype="float16")
    # float16: spacing 2^-10 at 1 (1 + 2^-12 -> 1); largest finite 65504, and 65520 (the
    # midpoint to 2^16) rounds to even, i.e. overflows: kept; 2^-26 is below half the
    # smallest subnormal 2^-24 -> 0
    want = np.array([1.0, -3.0e5, 65504.0, 65520.0, 7.0e4, 0.0])
    np.testing.assert_array_equal(r, want)
    # the output equal to the float64 reference: no error, but an excess over RN(ref)
    s = _scale(e, 2.0 ** -11, 2.0 ** -14, u_acc=2.0 ** -24)
    assert st["op_max"] == 0.0
    assert st["op_bias"] == pytest.approx(abs(np.mean((e - want) / s)) * math.sqrt(e.size), rel=1e-12)


def test_noise_scale_that_overflows_is_inf_quietly():
    """A scale beyond float64's range is +inf (the run's statistics are then decided by
    the non-finite rule), computed without an overflow warning."""
    e = np.array([1.0, 1.0e308])
    K = 2.0 ** 50  # u_acc sqrt(K) = 2^-24 2^25 = 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = noise.noise_scale(e, dtype="float32", K=K)
    assert s[1] == math.inf
    assert s[0] == _scale(e[:1], 2.0 ** -24, float(np.finfo(np.float32).tiny), K=K)[0]
