"""The fit sample: the part of a run's element sample that the scale fits read.

A run's element sample starts with its fit sample (``n_fit`` slots): a uniform draw without
replacement of ``FIT_SAMPLE_SIZE`` elements (every element of a shorter run), drawn first
from the run's generator, so it is the same whatever ``sample_size`` the dataset keeps.
The rest of the sample holds the run's Pareto front (or its hull) and uniform draws. Files
written before ``n_fit`` existed are fitted on their whole sample, as they were.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import xarray as xr
from scipy import stats

import tolstat
from tolstat.dataset.records import summarize_run
from tolstat.dataset.schema import FIT_SAMPLE, FIT_SAMPLE_SIZE, fit_counts
from tolstat.measure.metrics import error_metrics


def _metrics(n: int, seed: int = 0, *, proportional: bool = False):
    rng = np.random.default_rng(seed)
    e = rng.standard_normal(n) * 4.0
    noise = rng.standard_normal(n) * 1e-3 * (np.abs(e) if proportional else 1.0)
    return error_metrics((e + noise).astype(np.float16), e, dtype="float16")


def _record(m, sample_size: int, seed: int = 7):
    return summarize_run(m, op="x", hardware="cpu", sample_size=sample_size, rng=np.random.default_rng(seed))


def test_fit_sample_is_the_same_for_every_sample_size_of_at_least_the_default():
    m = _metrics(4096)
    recs = [_record(m, s) for s in (320, 1000, 4096, 10_000)]
    for r in recs:
        assert r.n_fit == FIT_SAMPLE_SIZE
        assert len(r.samples["sample_abs"]) == min(4096, max(320, len(r.samples["sample_abs"])))
    first = {k: v[:FIT_SAMPLE_SIZE] for k, v in recs[0].samples.items()}
    for r in recs[1:]:
        for k, v in first.items():
            assert np.array_equal(r.samples[k][:FIT_SAMPLE_SIZE], v, equal_nan=True), k


def test_fit_sample_is_a_uniform_draw_of_the_elements():
    # the rank of each fit element's |d| among the run's |d| is uniform: no over-representation
    # of the front (the largest errors), which the rest of a bounded sample holds
    n = 2048
    ranks = []
    for seed in range(40):
        m = _metrics(n, seed)
        rec = _record(m, 320, seed)
        order = np.sort(m.abs)
        fit = rec.samples["sample_abs"][:rec.n_fit]
        ranks.append((np.searchsorted(order, fit, side="left") + np.searchsorted(order, fit, side="right")) / (2 * n))
    u = np.concatenate(ranks)
    assert u.size == 40 * FIT_SAMPLE_SIZE
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    # while the whole bounded sample is not uniform: its front sits among the largest errors
    m = _metrics(n, 1)
    rest = _record(m, 320, 1).samples["sample_abs"][FIT_SAMPLE_SIZE:]
    assert np.max(rest) == np.max(m.abs)


def test_short_run_keeps_every_element_and_all_of_them_are_the_fit_sample():
    m = _metrics(200)
    rec = _record(m, 320)
    assert rec.n_fit == 200 and len(rec.samples["sample_abs"]) == 200
    assert np.array_equal(rec.samples["sample_abs"], m.abs)  # index order, as before


def test_sample_always_holds_the_run_maximum_and_the_front():
    for proportional in (False, True):
        m = _metrics(50_000, 3, proportional=proportional)
        rec = _record(m, 320)
        assert len(rec.samples["sample_abs"]) == 320
        assert rec.samples["sample_abs"].max() == m.abs.max()
        front = tolstat.dataset.records.pareto_frontier(m.abs, m.ref_abs)
        if rec.stats["n_frontier"] <= 320 - rec.n_fit:
            kept = set(zip(rec.samples["sample_abs"].tolist(), rec.samples["sample_ref"].tolist()))
            assert set(zip(m.abs[front].tolist(), m.ref_abs[front].tolist())) <= kept


@pytest.mark.parametrize("n, size", [(200, 16), (300, 5), (1000, 1), (5000, 64)])
def test_small_sample_keeps_its_size_the_maximum_and_a_uniform_prefix(n, size):
    m = _metrics(n, 4)
    rec = _record(m, size)
    assert len(rec.samples["sample_abs"]) == size
    assert rec.samples["sample_abs"].max() == m.abs.max()
    share = size - max(1, size // 5)  # 4/5 of the sample, at least one slot for the front
    assert min(size // 2, share) <= rec.n_fit <= share  # a long hull takes room, down to half
    if n > FIT_SAMPLE_SIZE:  # the first elements of the same draw as in a full sample
        full = _record(m, n)
        lead = set(full.samples["sample_abs"][:FIT_SAMPLE_SIZE].tolist())
        assert set(rec.samples["sample_abs"][:rec.n_fit].tolist()) <= lead


def test_long_hull_takes_room_from_the_fit_sample_down_to_half():
    # error proportional to |ref| with a slowly growing factor: every element on the front
    # and on its upper convex hull (a concave |d| over |ref|)
    n = 4096
    e = np.linspace(1.0, 2.0, n)
    m = error_metrics(e + np.sqrt(e) * 1e-2, e, dtype="float32")
    rec = _record(m, 320)
    hull = tolstat.dataset.records.upper_hull(np.arange(n), m.abs, m.ref_abs)
    assert hull.size > 320 // 2  # longer than the room the fit sample leaves
    assert rec.n_fit == 160  # the fit sample gave way, down to half of the sample
    assert rec.samples["sample_abs"].max() == m.abs.max()


def test_scale_fit_reads_only_the_fit_sample():
    pairs = []
    rng = np.random.default_rng(5)
    for _ in range(60):
        e = rng.standard_normal(1024)
        pairs.append(((e + rng.standard_normal(1024) * 1e-3 * (1 + np.abs(e))).astype(np.float16), e))
    small = tolstat.from_pairs(pairs, op="x", dtype="float16", hardware="cpu",
                               options=tolstat.CollectOptions(progress=False))
    full = tolstat.from_pairs(pairs, op="x", dtype="float16", hardware="cpu",
                              options=tolstat.CollectOptions(progress=False, sample_size=1024))
    assert np.array_equal(fit_counts(small), fit_counts(full))
    from tolstat.models.scale import fit_scale

    for form in ("allclose", "size_aware"):
        a, b = fit_scale(small, form), fit_scale(full, form)
        assert (a.atol, a.rtol, a.power) == (b.atol, b.rtol, b.power), form
    # changing an element outside the fit sample does not move the fit
    poked = full.copy(deep=True)
    poked["sample_abs"][:, FIT_SAMPLE_SIZE + 5] = poked["sample_abs"][:, FIT_SAMPLE_SIZE + 5] * 3.0
    assert fit_scale(poked, "allclose").rtol == fit_scale(full, "allclose").rtol


def test_files_without_fit_sample_are_fitted_on_their_whole_sample():
    rng = np.random.default_rng(2)
    pairs = [((x + rng.standard_normal(512) * 1e-3).astype(np.float16), x)
             for x in rng.standard_normal((8, 512))]
    ds = tolstat.from_pairs(pairs, op="x", dtype="float16", hardware="cpu",
                            options=tolstat.CollectOptions(progress=False))
    old = ds.drop_vars(FIT_SAMPLE)
    assert np.array_equal(fit_counts(old), old["n_sample"].values)
    both = tolstat.concat([ds, old])
    assert np.array_equal(both[FIT_SAMPLE].values,
                          np.concatenate([ds[FIT_SAMPLE].values, old["n_sample"].values]))
    bad = ds.assign({FIT_SAMPLE: ds[FIT_SAMPLE] + 10_000})
    with pytest.raises(ValueError, match="n_fit"):
        tolstat.dataset.validate(bad)


def test_saved_abs_is_stored_once_and_restored_bit_for_bit(tmp_path):
    rng = np.random.default_rng(3)
    pairs = []
    for i in range(6):
        e = rng.standard_normal(300)
        a = (e + rng.standard_normal(300) * 1e-3).astype(np.float16)
        if i == 2:
            a[[4, 9]] = [np.inf, np.nan]  # non-finite outputs: |d| = inf is not abs(d)
        pairs.append((a, e))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = tolstat.from_pairs(pairs[:3], op="x", dtype="float16", hardware="cpu",
                                options=tolstat.CollectOptions(progress=False))
        ds = tolstat.concat([ds, tolstat.from_pairs(pairs[3:], op="x", dtype="float16", hardware="cpu",
                                                    options=tolstat.CollectOptions(progress=False, sample_size=40))])
    assert np.isinf(ds["sample_abs"].values).any() and np.isnan(ds["sample_abs"].values).any()  # padding
    for ext in (".nc", ".zarr"):
        path = tolstat.save(ds, tmp_path / f"e{ext}")
        raw = xr.open_dataset(path, engine="h5netcdf" if ext == ".nc" else "zarr")
        stored = raw["sample_abs"].values
        assert (stored == -1).mean() > 0.9  # the redundant copy compresses away
        raw.close()
        for chunks in (None, {"run": 2}):
            back = tolstat.open_errors(path, chunks=chunks)
            x, y = np.asarray(back["sample_abs"].values), ds["sample_abs"].values
            assert x.dtype == np.float64 and np.array_equal(x.view(np.int64), y.view(np.int64)), (ext, chunks)
            assert "tolstat_abs_of_signed" not in back["sample_abs"].attrs
            back.close()


def test_default_sample_holds_the_whole_fit_sample():
    # what makes a default dataset's tables those of a dataset keeping every element
    from tolstat.dataset.records import _fit_share

    size = tolstat.CollectOptions().sample_size
    assert _fit_share(size) >= FIT_SAMPLE_SIZE
    assert size - FIT_SAMPLE_SIZE >= 64  # room for the front or hull next to it (docs/schema.md)
