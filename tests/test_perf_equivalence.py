"""The fast paths of the dataset layer equal their plain numpy definitions."""

import numpy as np
import pytest

from tolstat._base import validate as _validate
from tolstat.dataset.records import pareto_frontier


def _front_definition(abs_err, ref_abs):
    # walk (|expected|, -|d|, position) and keep each element beating every earlier |d|
    r = np.where(np.isnan(ref_abs), np.inf, ref_abs)
    order = np.lexsort((np.arange(r.size), -abs_err, r))
    d = abs_err[order]
    prev = np.maximum.accumulate(np.concatenate([[-np.inf], d[:-1]]))
    return np.sort(order[d > prev])


def _draw(rng, kind, n):
    if kind == "continuous":
        return rng.random(n), rng.random(n)
    if kind == "ties":
        return rng.integers(0, 4, n).astype(float), rng.integers(0, 4, n).astype(float)
    if kind == "nonfinite":
        d = rng.integers(0, 3, n).astype(float)
        r = rng.integers(0, 3, n).astype(float)
        d[rng.random(n) < 0.1] = np.nan
        r[rng.random(n) < 0.1] = np.nan
        d[rng.random(n) < 0.1] = np.inf
        r[rng.random(n) < 0.1] = np.inf
        return d, r
    if kind == "long_front":  # error growing with |ref| (as for a relative error): most elements on the front
        r = rng.random(n)
        return r + 1e-9 * rng.random(n), r
    if kind == "long_front_ties":  # the same on a lattice of |ref| values: runs of equal r on the front
        r = rng.integers(0, max(n // 4, 1), n) / max(n // 4, 1)
        return r + 1e-9 * rng.random(n), r
    d, r = np.abs(rng.standard_normal(n)), np.abs(rng.standard_normal(n))
    r[rng.random(n) < 0.3] = 0.0
    r[rng.random(n) < 0.2] = -0.0  # ties with +0.0
    return d, r


@pytest.mark.parametrize("kind", ["continuous", "ties", "nonfinite", "long_front", "long_front_ties", "zeros"])
def test_pareto_frontier_equals_lexsort_definition(kind):
    rng = np.random.default_rng(7)
    for n in list(range(1, 40)) + [500, 5000, 70000]:  # 70,000: buckets of more than 16 candidates
        d, r = _draw(rng, kind, n)
        got = pareto_frontier(d, r)
        np.testing.assert_array_equal(got, _front_definition(d, r))
        assert got.dtype == np.int64
        if kind.startswith("long_front") and n >= 500:
            assert got.size > n // 8  # the long-front paths of the kernel are the ones compared


def _dup_definition(columns, rows):
    parts = []
    for name in sorted(columns):
        v = np.asarray(columns[name])
        if v.dtype.kind == "O":
            v = v.astype(str)
        parts.append(np.ascontiguousarray(v).reshape(rows, -1).view(np.uint8).reshape(rows, -1))
    mat = np.ascontiguousarray(np.concatenate(parts, axis=1))
    _, first = np.unique(mat.view(np.dtype((np.void, mat.shape[1]))).ravel(), return_index=True)
    dup = np.ones(rows, dtype=bool)
    dup[first] = False
    return np.flatnonzero(dup)


def _columns(rng, n):
    cols = {"a": rng.integers(0, 3, n).astype(float),
            "s": np.array(["x", "yy", "x" * 9])[rng.integers(0, 3, n)],
            "o": np.array(["p", "q"], dtype=object)[rng.integers(0, 2, n)],
            "b": rng.random(n) < 0.5,
            "q": rng.integers(0, 2, (n, 3)).astype(float)}
    cols["a"][rng.random(n) < 0.3] = np.nan  # NaN compares equal bit for bit
    return cols


@pytest.mark.parametrize("collide", [False, True])
def test_duplicate_rows_equals_unique_definition(collide, monkeypatch):
    if collide:  # every hash equal: the byte comparison alone decides
        monkeypatch.setattr(_validate, "_mix_hash", lambda h, part: None)
    rng = np.random.default_rng(3)
    for n in (2, 3, 10, 60, 400):
        cols = _columns(rng, n)
        np.testing.assert_array_equal(_validate.duplicate_rows(cols, n), _dup_definition(cols, n))
    assert _validate.duplicate_rows(_columns(rng, 1), 1).size == 0


def test_duplicate_rows_equals_definition_when_rows_differ_in_one_late_column():
    # 40 columns of few values: most rows agree with another on the first columns and
    # differ (or not) only in a later one, so the candidate filter must keep them
    rng = np.random.default_rng(5)
    n = 300
    cols = {f"c{j:02d}": rng.integers(0, 2, n).astype(float) if j % 3 else
            np.array(["u", "v"], dtype=object)[rng.integers(0, 2, n)] for j in range(40)}
    base = {k: np.concatenate([v, v[:100]]) for k, v in cols.items()}
    for late in ("c07", "c21", "c39"):
        got = dict(base)
        col = got[late].copy()
        col[n + 50:] = col[n + 50:][::-1]  # half of the copies changed in one late column
        got[late] = col
        np.testing.assert_array_equal(_validate.duplicate_rows(got, n + 100), _dup_definition(got, n + 100))


def test_shared_hashes_marks_exactly_the_values_that_occur_twice():
    from tolstat._base.label_kernels import shared_hashes

    rng = np.random.default_rng(6)
    cases = [np.zeros(0, np.uint64), np.zeros(1, np.uint64), np.array([1, 2, 1], np.uint64),
             rng.integers(0, 2**63, 5000).astype(np.uint64),
             rng.integers(0, 40, 5000).astype(np.uint64),
             # equal high bits (the prefilter's bitmap index), distinct values
             (np.uint64(7) << np.uint64(50)) + np.arange(3000, dtype=np.uint64),
             rng.integers(0, 300, 3000).astype(np.uint64) << np.uint64(39)]
    for h in cases:
        got = shared_hashes(h)
        _, inv, cnt = np.unique(h, return_inverse=True, return_counts=True)
        np.testing.assert_array_equal(got, cnt[inv.ravel()] > 1)


def test_duplicate_rows_finds_copies():
    rng = np.random.default_rng(4)
    cols = {"x": rng.random(50), "y": rng.random((50, 2))}
    both = {k: np.concatenate([v, v[10:20]]) for k, v in cols.items()}
    np.testing.assert_array_equal(_validate.duplicate_rows(both, 60), np.arange(50, 60))


def test_run_quantiles_equal_numpy_bit_for_bit():
    from tolstat.dataset.records import _QUANTILES, _quantile_linear

    rng = np.random.default_rng(11)
    for t in range(700):
        n = int(rng.integers(1, 12 if t % 3 == 0 else (3000 if t % 3 == 1 else 40000)))
        kind = t % 7
        if kind == 0:
            a = np.abs(rng.standard_normal(n))
        elif kind == 1:  # ties on a lattice
            a = rng.integers(0, 3, n) * 2.0**-20
        elif kind == 2:  # infinities: numpy's NaN from inf - inf kept
            a = np.abs(rng.standard_normal(n))
            a[rng.random(n) < 0.05] = np.inf
        elif kind == 3:  # signed zeros
            a = np.where(rng.random(n) < 0.5, 0.0, -0.0) + rng.integers(0, 2, n)
        elif kind == 4:  # NaN: numpy's own path
            a = rng.exponential(1.0, n)
            a[rng.random(n) < 0.05] = np.nan
        elif kind == 5:  # hundreds of decades, and most values zero
            a = np.abs(rng.standard_normal(n)) * 10.0 ** rng.integers(-300, 300, n)
            a[rng.random(n) < 0.6] = 0.0
        else:  # one value almost everywhere: a bucket of equal values
            a = np.full(n, 0.75)
            a[rng.integers(0, n, 3)] = rng.random(3)
        for qs in (_QUANTILES, np.array([0.0, 1.0, 0.25, 0.5 + 1e-12])):
            with np.errstate(invalid="ignore"):
                got, ref = _quantile_linear(a, qs), np.quantile(a, qs)
            np.testing.assert_array_equal(got.view(np.int64), np.asarray(ref).view(np.int64))


def test_order_statistics_equal_sorted_values_at_every_rank_set():
    from tolstat.dataset.records import _order_statistics

    rng = np.random.default_rng(12)
    for t in range(300):
        n = int(rng.integers(1, 6000))
        a = np.abs(rng.standard_cauchy(n)) if t % 2 else rng.integers(0, 5, n) * 0.5
        ranks = np.unique(rng.integers(0, n, int(rng.integers(1, 9))))
        out = np.empty(ranks.size)
        assert _order_statistics(a, ranks, out)
        np.testing.assert_array_equal(out, np.sort(a)[ranks])
    out = np.empty(1)
    for bad in (np.array([1.0, -0.0, 2.0]), np.array([1.0, np.nan]), np.array([-1.0, 2.0])):
        assert not _order_statistics(bad, np.array([0]), out)  # the caller falls back to numpy


def test_sample_assembly_equals_its_numpy_definition():
    from tolstat.dataset.records import _assemble_sample, _not_in_sorted

    rng = np.random.default_rng(13)
    for _ in range(300):
        n = int(rng.integers(2, 3000))
        fit = np.sort(rng.choice(n, size=int(rng.integers(1, min(n, 300) + 1)), replace=False))
        front = np.sort(rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False))
        keep = _not_in_sorted(front, fit)
        np.testing.assert_array_equal(keep, np.setdiff1d(front, fit, assume_unique=True))
        keep = rng.permutation(keep)[: int(rng.integers(0, keep.size + 1))]  # any order, as the hull's
        free = n - fit.size - keep.size
        extra = rng.choice(free, size=int(rng.integers(0, free + 1)), replace=False)
        taken = np.sort(np.concatenate([fit, keep]))
        mapped = extra + np.searchsorted(taken - np.arange(taken.size), extra, side="right")
        want = np.concatenate([fit, np.sort(np.concatenate([keep, mapped]))])
        got = _assemble_sample(fit, keep, extra)
        np.testing.assert_array_equal(got, want)
        assert np.unique(got).size == got.size and not np.isin(mapped, taken).any()


def test_corpus_casts_once_and_hands_out_fresh_arrays():
    from tolstat import corpus

    case = corpus.cases("matmul", "bfloat16", n=1, seed=0)[0]
    first = case.cast_inputs("bfloat16")
    for k, v in first.items():
        np.testing.assert_array_equal(v, corpus.cast(case.inputs[k], "bfloat16"))
        v[...] = 0  # a kernel writing to its inputs changes no later run
    again = case.cast_inputs("bfloat16")
    for k, v in again.items():
        np.testing.assert_array_equal(v, corpus.cast(case.inputs[k], "bfloat16"))
        assert v is not first[k]


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_fused_ulp_distance_equals_general_path(name):
    from tolstat.measure import metrics
    from tolstat._base.dtypes import target_dtype

    td = target_dtype(name)
    dt = td.np_dtype
    mx, tiny = float(td.max), float(td.tiny)
    half_step = 2.0 ** -(11 if name == "float16" else 8)  # half an ULP at 1: a tie
    rng = np.random.default_rng(5)
    n = 3000
    special = np.array([mx, -mx, mx * (1 + half_step / 2), mx * (1 + half_step), -mx * (1 + half_step),
                        mx * (1 + half_step / 8), 1e300, -1e300, 5e-324, -5e-324, tiny, tiny / 2, tiny / 3,
                        0.0, -0.0, np.nan, np.inf, -np.inf])
    base = rng.standard_normal(n).astype(np.float32).astype(dt).astype(np.float64)
    draws = [rng.standard_normal(n) * 10.0 ** rng.integers(-8, 5, n),  # every scale
             rng.standard_normal(n) * tiny * rng.integers(1, 50, n),  # subnormals of the format
             mx * (1 + rng.standard_normal(n) * half_step),  # around the overflow edge
             np.where(rng.random(n) < 0.5, base, base * (1 + half_step)),  # exact ties
             np.resize(special, n)]
    for e in draws:
        with np.errstate(all="ignore"):
            a = (e * (1 + rng.standard_normal(n) * 1e-2)).astype(np.float32).astype(dt)
            a[rng.random(n) < 0.05] = np.array(np.nan, dtype=dt)
            a[rng.random(n) < 0.05] = np.array(np.inf, dtype=dt)
            a[rng.random(n) < 0.05] = np.array(-np.inf, dtype=dt)
            a[rng.random(n) < 0.05] = np.array(-0.0, dtype=dt)
            got = metrics.ulp_distance(a, e, name)
            ref = metrics._ulp_general(a, e, td)
        np.testing.assert_array_equal(got, ref)
    assert metrics.ulp_distance(np.zeros((2, 3), dt), np.zeros((2, 3)), name).shape == (2, 3)


def _metrics_definition(a, e, rel_floor):
    from tolstat.measure import metrics

    a64, e64 = a.astype(np.float64).ravel(), e.astype(np.float64).ravel()
    with np.errstate(invalid="ignore", over="ignore"):
        signed = a64 - e64
        abs_err = np.abs(signed)
    nonfinite = metrics._apply_nonfinite(abs_err, a64, e64)
    ref_abs = np.abs(e64)
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(abs_err == 0.0, 0.0, abs_err / np.maximum(ref_abs, rel_floor))
    rel[nonfinite] = np.inf
    return signed, abs_err, rel, ref_abs, nonfinite


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32"])
def test_fused_error_metrics_equal_numpy_definition(name):
    from tolstat.measure import metrics
    from tolstat._base.dtypes import target_dtype

    dt = target_dtype(name).np_dtype
    rng = np.random.default_rng(8)
    for t in range(40):
        n = int(rng.integers(1, 2000))
        e = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 4)
        if t % 2:
            for v, share in ((np.inf, 0.1), (-np.inf, 0.1), (np.nan, 0.1), (0.0, 0.1), (-0.0, 0.1)):
                e[rng.random(n) < share] = v
        with np.errstate(all="ignore"):
            a = (e * (1 + 1e-3 * rng.standard_normal(n))).astype(np.float32).astype(dt)
        if t % 3 == 0:
            for v in (np.nan, np.inf, -np.inf):
                a[rng.random(n) < 0.1] = np.array(v, dtype=dt)
        for rel_floor in (None, 0.0, 1e-3):
            m = metrics.error_metrics(a, e, rel_floor=rel_floor, allow_nan=True)
            floor = float(target_dtype(name).tiny) if rel_floor is None else rel_floor
            ref = _metrics_definition(a, e, floor)
            for got, want in zip((m.signed, m.abs, m.rel, m.ref_abs, m.nonfinite), ref):
                assert got.dtype == want.dtype
                np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def _labels(rng, kind, n):
    if kind == "short":
        return np.array(["matmul", "softmax", "a", "", "é", "ĉ"])[rng.integers(0, 6, n)]
    if kind == "long":
        return np.array(["cpu:" + "x" * 26, "cpu:" + "y" * 26, "gpu:" + "x" * 26])[rng.integers(0, 3, n)]
    if kind == "distinct":
        return np.array([f"run{i}" for i in rng.permutation(n)])
    if kind == "bytes":
        return np.array([b"x" * 9, b"ab", b"", b"a"])[rng.integers(0, 4, n)]
    if kind == "int":
        return rng.integers(-5, 5, n)
    if kind == "int_ids":  # unit ids: many distinct values, in no order
        return rng.integers(-2**40, 2**40, n) // 7
    if kind == "uint64":  # row hashes, the top bit set too
        return rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True) >> rng.integers(0, 3, n).astype(np.uint64)
    if kind == "int8":
        return rng.integers(-128, 127, n, dtype=np.int8)
    if kind == "dense":  # a group's run indices: a spread-out subset of a larger range (counted)
        return np.sort(rng.choice(3 * n + 1, n, replace=False)) if n else np.zeros(0, dtype=np.int64)
    if kind == "int64_edge":  # a small range at the bottom of int64 (counted; offsets must not wrap)
        return np.iinfo(np.int64).min + rng.integers(0, 50, n)
    if kind == "uint64_edge":  # a small range at the top of uint64
        return np.iinfo(np.uint64).max - rng.integers(0, 50, n).astype(np.uint64)
    return rng.random(n) < 0.3  # booleans


KINDS = ["short", "long", "distinct", "bytes", "int", "int_ids", "uint64", "int8", "dense", "int64_edge",
         "uint64_edge", "bool"]


@pytest.mark.parametrize("kind", KINDS)
def test_unsorted_factorize_groups_as_numpy_unique(kind):
    from tolstat._base.util import factorize

    rng = np.random.default_rng(6)
    for n in (0, 7, 5000, 20000):
        a = _labels(rng, kind, n)
        u, inv = np.unique(a, return_inverse=True)
        fu, finv = factorize(a, sort=False)
        assert fu.size == u.size and finv.dtype == np.int64
        np.testing.assert_array_equal(fu[finv], a)  # each code names its value
        # the same partition of the rows: codes map one to one onto numpy.unique's
        pairs = np.unique(np.stack([finv, inv.ravel()]), axis=1) if n else np.zeros((2, 0))
        assert pairs.shape[1] == u.size


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("collide", [False, True])
def test_factorize_equals_numpy_unique(kind, collide, monkeypatch):
    from tolstat._base import label_kernels
    from tolstat._base.util import factorize

    if collide:  # every hash equal: the exact comparison finds it and numpy.unique decides
        monkeypatch.setattr(label_kernels, "row_hashes", lambda u: np.zeros(u.shape[0], dtype=np.uint64))
    rng = np.random.default_rng(5)
    for n in (0, 7, 5000, 20000):
        a = _labels(rng, kind, n)
        u, inv = np.unique(a, return_inverse=True)
        fu, finv = factorize(a)
        assert fu.dtype == u.dtype
        np.testing.assert_array_equal(fu, u)
        np.testing.assert_array_equal(finv, inv.ravel())
        assert finv.dtype == np.int64


def test_factorize_hash_groups_only_equal_labels(monkeypatch):
    # labels that share a hash but differ must not be merged: a constant hash puts every
    # label in one group, the check sees the difference
    from tolstat._base import label_kernels
    from tolstat._base.util import factorize

    monkeypatch.setattr(label_kernels, "row_hashes", lambda u: np.zeros(u.shape[0], dtype=np.uint64))
    a = np.array(["ab", "cb"] * 3000)
    u, inv = factorize(a)
    assert list(u) == ["ab", "cb"] and inv[:4].tolist() == [0, 1, 0, 1]


@pytest.mark.parametrize("n_groups", [1, 3, 300, 40000])
def test_rows_by_code_equals_stable_argsort_definition(n_groups):
    from tolstat._base.util import rows_by_code

    rng = np.random.default_rng(n_groups)
    for n in (0, 1, 10, 100000):
        codes = rng.integers(0, n_groups, n)
        got = rows_by_code(codes, n_groups)
        assert len(got) == n_groups
        for g in {*range(min(n_groups, 300)), n_groups - 1}:
            np.testing.assert_array_equal(got[g], np.flatnonzero(codes == g))
        if n:
            order = np.argsort(codes, kind="stable")
            np.testing.assert_array_equal(np.concatenate(got), order)


def test_sample_checks_equal_their_numpy_definitions():
    from tolstat.dataset.sample_kernels import sample_checks

    rng = np.random.default_rng(12)
    for t in range(200):
        n, w = int(rng.integers(0, 30)), int(rng.integers(0, 9))
        s = np.abs(rng.standard_normal((n, w)))
        ns = rng.integers(0, w + 1, n)
        s[np.arange(w)[None, :] >= ns[:, None]] = np.nan  # NaN padding past the valid samples
        if t % 4 == 1 and s.size:
            s.flat[rng.integers(0, s.size)] = np.nan  # perhaps inside the valid samples
        if t % 4 == 2 and s.size:
            s.flat[rng.integers(0, s.size)] = -rng.random()
        if t % 4 == 3 and s.size:
            s.flat[rng.integers(0, s.size)] = -0.0  # not negative
        neg, nan_inside, mx = sample_checks(s, ns)
        assert neg == bool((s < 0).any())
        assert nan_inside == bool(np.isnan(s[np.arange(w)[None, :] < ns[:, None]]).any())
        want = np.max(np.where(np.isnan(s), -np.inf, s), axis=1) if w else np.full(n, -np.inf)
        np.testing.assert_array_equal(mx, want)


def test_split_units_is_the_seeded_permutation_cut_in_two_and_sorted():
    from tolstat.calibration.units import split_units

    for n, k, seed in ((1, 0, 0), (1, 1, 3), (10, 3, 0), (1000, 200, 7), (250_000, 200, 1)):
        perm = np.random.default_rng([seed, n]).permutation(n)
        a, b = split_units(n, k, seed)
        np.testing.assert_array_equal(a, np.sort(perm[:k]))
        np.testing.assert_array_equal(b, np.sort(perm[k:]))
        assert a.dtype == b.dtype == np.int64


@pytest.mark.parametrize("ties", [False, True])
def test_threshold_ranks_equal_the_stable_sort_definition(ties):
    from tolstat.calibration.engine import _ranked, _stable_rank_index, _top_scores
    from tolstat.calibration.certificate import TOP_SCORES

    rng = np.random.default_rng(9)
    for n in (1, 2, 3, 50, 300, 5000):
        s = rng.integers(0, 6, n).astype(float) if ties else rng.standard_exponential(n)
        order = np.argsort(s, kind="stable")
        full = s[order]
        for r in sorted({r for r in (1, 2, n // 2, n - 1, n) if 1 <= r <= n}):
            part = _ranked(s, r)
            for k in (r - 2, r - 1):
                if k >= 0:
                    assert part[k] == full[k]
            assert _stable_rank_index(s, float(full[r - 1]), r) == order[r - 1]
        assert _top_scores(s) == tuple(float(x) for x in np.sort(s)[::-1][:TOP_SCORES])


def test_unit_scores_and_statistic_layout_equal_their_numpy_definitions():
    import warnings

    from tolstat.calibration.units import statistic_layout, unit_scores

    rng = np.random.default_rng(10)
    for n, k in ((1, 1), (5, 3), (400, 13), (3000, 2)):
        v = rng.standard_exponential((n, k)) * 10.0 ** rng.integers(-3, 3, k)
        v[rng.random((n, k)) < 0.3] = np.nan
        v[rng.random((n, k)) < 0.01] = np.inf
        v[rng.random((n, k)) < 0.05] = 0.0
        if n > 1:
            v[-1] = np.nan  # a unit without any statistic
            v[:, -1] = np.nan if k > 1 else v[:, -1]  # a statistic no unit has
        q = rng.uniform(0.5, 2.0, k)
        rows = rng.permutation(n)[: max(1, n // 2)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # nanmax of the all-NaN unit
            np.testing.assert_array_equal(unit_scores(v, q), np.nanmax(v / q, axis=1))
            np.testing.assert_array_equal(unit_scores(v, q, rows), np.nanmax(v[rows] / q, axis=1))
        has, empty = statistic_layout(v)
        np.testing.assert_array_equal(has, ~np.isnan(v).all(axis=0))
        assert empty == int(np.isnan(v).all(axis=1).sum())
