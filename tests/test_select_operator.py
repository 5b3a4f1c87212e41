"""The default form of select ("auto"), the operator form, and checks against them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import tolstat
from tolstat.cli.main import main
from tolstat.calibration.review import show_table


def _rowsum(rng, bug: float = 0.0):
    x = rng.standard_normal((8, 32))
    e = x.sum(axis=1)
    a = (x.astype(np.float16).sum(axis=1, dtype=np.float16) * np.float16(1 + bug)).astype(np.float16)
    return a, e, np.abs(x).sum(axis=1)


@pytest.fixture(scope="module")
def ds():
    rng = np.random.default_rng(0)
    pairs = [(*_rowsum(rng), {"case": str(i // 2)}) for i in range(700)]
    return tolstat.from_pairs(pairs, op="rowsum", dtype="float16", options=tolstat.CollectOptions(progress=False))


@pytest.fixture(scope="module")
def table(ds):
    return tolstat.select(ds, fp_budget=0.01)


def test_default_is_operator_with_certificate(table):
    e = table.entry("rowsum", "float16")
    assert table.statistics == ["op_score"] and table.meta["form"] == "auto"
    c = e.certificate
    assert c["form"] == "operator" and "operator-noise statistics" in c["form_reason"]
    assert c["method"] == "order_statistic" and c["guarantee"].startswith("PAC")
    assert set(c["normalisers"]) <= set(tolstat.measure.noise.score_statistic_names("rowsum"))
    assert "op_row_rms_max" not in c["normalisers"]  # NaN for a pointwise op: left out
    assert c["n_fit"] + c["n_cal"] == 700


def test_cluster_counts_cases(ds):
    t = tolstat.select(ds, fp_budget=0.01, cluster="case", on_error="skip")
    c = t.entry("rowsum", "float16").certificate if math.isfinite(float(t.data["threshold"].values[0, 0])) \
        else json.loads(str(t.data["certificate_json"].values[0]))
    # 350 cases of 2 runs: 350 units, fewer than 700
    assert c.get("n_units", 350) == 350 or c["method"] == "refused"
    with pytest.raises(ValueError, match="not a run label"):
        tolstat.select(ds, fp_budget=0.01, cluster="nope")


def test_json_and_netcdf_round_trip(table, tmp_path):
    table.to_json(tmp_path / "t.json")
    table.to_netcdf(tmp_path / "t.nc")
    for p in ("t.json", "t.nc"):
        back = tolstat.load_table(tmp_path / p)
        assert back.entry("rowsum", "float16").certificate == table.entry("rowsum", "float16").certificate
        assert back.entry("rowsum", "float16").statistics["op_score"].threshold == \
            table.entry("rowsum", "float16").statistics["op_score"].threshold
    text = show_table(table)
    assert "form operator" in text and "per element" in text


def test_check_passes_correct_fails_bug_and_names_statistic(table):
    rng = np.random.default_rng(5)
    fails = 0
    for _ in range(50):
        a, e, m = _rowsum(rng)
        fails += not tolstat.check(a, e, op="rowsum", dtype="float16", table=table, options=tolstat.CheckOptions(magnitude=m)).passed
    assert fails <= 3
    a, e, m = _rowsum(rng, bug=0.05)
    r = tolstat.check(a, e, op="rowsum", dtype="float16", table=table, options=tolstat.CheckOptions(magnitude=m))
    assert not r.passed and "op_score" in r.failed
    assert len(r.failed) >= 2  # the score and at least one statistic over its share
    msg = r.message()
    top = max((k for k in r.failed if k != "op_score"), key=lambda k: r.ratios[k])
    lines = msg.splitlines()
    assert len(lines) <= 10
    assert lines[1].startswith("  what is wrong: ") and f"({top})" in lines[1]
    assert f"{r.ratios[top]:.3g}x what correct runs reach" in lines[1]
    assert lines[-1].startswith("  promise: a correct kernel fails this check with probability <= 0.01")
    with pytest.raises(AssertionError, match="FAILED"):
        tolstat.assert_close(a, e, op="rowsum", dtype="float16", table=table, options=tolstat.CheckOptions(magnitude=m))


def test_correctly_rounded_always_passes(table):
    rng = np.random.default_rng(7)
    _, e, m = _rowsum(rng)
    e = e * 100  # far outside the calibration range
    r = tolstat.check(e.astype(np.float16), e, op="rowsum", dtype="float16", table=table, options=tolstat.CheckOptions(magnitude=m * 100))
    assert r.passed and r.statistics["op_score"] == 0.0


def test_magnitude_required_and_clear(table):
    a, e, m = _rowsum(np.random.default_rng(1))
    with pytest.raises(ValueError, match="pass inputs="):
        tolstat.check(a, e, op="rowsum", dtype="float16", table=table)


def test_auto_rejects_old_form_arguments(ds):
    with pytest.raises(ValueError, match="form=None"):
        tolstat.select(ds, fp_budget=0.01, statistic=("max_abs", "bias"))
    with pytest.raises(ValueError, match="form=None"):
        tolstat.select(ds, fp_budget=0.01, options=tolstat.SelectOptions(method="evt"))


def test_auto_without_op_statistics_picks_a_scale_form(ds):
    plain = ds.drop_vars([v for v in ds.data_vars if ds[v].attrs.get("role") == "op_statistic"])
    t = tolstat.select(plain, fp_budget=0.01)
    c = t.entry("rowsum", "float16").certificate
    assert t.statistics == ["max_score"] and c["form"] in ("allclose", "size_aware")
    assert "held-out" in c["form_reason"] and c["method"] == "order_statistic"
    assert c["n_fit"] > 0 and t.entry("rowsum", "float16").scale is not None


def test_allclose_threshold_below_resolution_passes_correct_rounding():
    """A fitted atol below fp16's subnormal step cannot fail a correctly rounded output."""
    rng = np.random.default_rng(3)
    pairs = []
    for _ in range(400):
        e = rng.standard_normal(16) * 1e-3
        pairs.append((e.astype(np.float16), e))
    ds = tolstat.from_pairs(pairs, op="tiny", dtype="float16", options=tolstat.CollectOptions(progress=False))
    t = tolstat.select(ds, fp_budget=0.01, form=None)
    e = np.full(4, 3e-8)  # rounds to the subnormal 5.96e-8 or 0: error up to ~3e-8
    e[1] = 2.9e-8
    a = e.astype(np.float16)
    r = tolstat.check(a, e, op="tiny", dtype="float16", table=t)
    assert r.passed


def test_cli_calibrate_default_and_check_magnitude(ds, tmp_path, capsys):
    errs = tmp_path / "e.nc"
    tolstat.save(ds, errs)
    out = tmp_path / "t.json"
    assert main(["calibrate", str(errs), "--fp-budget", "0.01", "-o", str(out)]) == 0
    t = tolstat.load_table(out)
    assert t.statistics == ["op_score"]
    a, e, m = _rowsum(np.random.default_rng(9))
    for name, arr in (("a.npy", a), ("e.npy", e), ("m.npy", m)):
        np.save(tmp_path / name, arr)
    rc = main(["check", str(tmp_path / "a.npy"), str(tmp_path / "e.npy"), "--op", "rowsum", "--dtype", "float16",
               "--table", str(out), "--hardware-policy", "pooled", "--magnitude", str(tmp_path / "m.npy")])
    assert rc in (0, 1) and "op_score" in capsys.readouterr().out


def _mostly_exact_rowsums(op: str, n: int, seed: int):
    """``n`` fp16 row sums, correctly rounded except about 15% of the runs, one element of
    which is one ULP off (the operator statistics are 0 for the exact runs)."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        x = rng.standard_normal((8, 32))
        e = x.sum(axis=1)
        a = e.astype(np.float16)
        if rng.random() < 0.15:
            j = int(rng.integers(8))
            a[j] = np.nextafter(a[j], np.float16(np.inf if e[j] > a[j] else -np.inf))
        pairs.append((a, e, np.abs(x).sum(axis=1)))
    return tolstat.from_pairs(pairs, op=op, dtype="float16", options=tolstat.CollectOptions(progress=False))


def test_operators_of_one_law_refused_by_the_own_normaliser_pool_pool_on_shared_normalisers_at_the_budget():
    """Ten names of one kernel, 30 runs each, few of them inexact: each group has too few
    positive scores for the own-normaliser pool of a table of several operators, so it is
    pooled with shared normalisers instead, at the requested budget and confidence, and its
    certificate says so (exchangeability tested twice)."""
    from tolstat.models.estimators.orderstat import order_statistic_rank

    ops = [f"k{i}" for i in range(10)]
    ds = _mostly_exact_rowsums("k", 300, 0).assign_coords(op=("run", np.repeat(ops, 30)))
    table = tolstat.select(ds, fp_budget=0.05)
    for op in ops:
        e = table.entry(op, "float16")
        c, cal = e.certificate, e.statistics["op_score"]
        assert c["method"] == cal.method == "pooled_order_statistic", (op, c["reason"])
        assert "; own-normaliser pool refused: " in c["reason"] and "twice pool_alpha" in c["guarantee"]
        assert "normalisers shared by the pool" in c["reason"]
        assert "the check of a new correct run fails is <= 0.05" in c["guarantee"] and cal.budget == 0.05
        assert c["rank"] == int(order_statistic_rank(c["n_scores"], 0.95, 0.95)[0])


def test_operator_table_records_its_magnitude_convention_and_check_holds_to_it(ds, table):
    """The runs' magnitudes were given as arrays: the certificate records ``given`` (the
    dataset's convention), so a check on the other scale, ``|expected|``, is refused."""
    assert ds["op_max"].attrs["magnitude"] == "given"
    assert table.entry("rowsum", "float16").certificate["magnitude"] == "given"
    a, e, m = _rowsum(np.random.default_rng(1))
    with pytest.raises(ValueError, match="another scale"):
        tolstat.check(a, e, op="rowsum", dtype="float16", table=table, options=tolstat.CheckOptions(magnitude="ref"))
    assert tolstat.check(a, e, op="rowsum", dtype="float16", table=table,
                         options=tolstat.CheckOptions(magnitude=m)).passed
