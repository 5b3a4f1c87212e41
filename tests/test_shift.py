"""Hardware-shift report (tolstat.shift): score comparison and a table's FP rate on B."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from scipy import stats

import tolstat
from tolstat.cli.main import main
from tolstat.calibration.decision import run_values
from tolstat.models.scale import run_scores
from tolstat.assess.hwshift import ShiftResult, evaluation_shift_report

BUDGET = 0.05
RUNS = 300
ERROR_VARS = ("max_abs", "max_rel", "max_ulp", "mean_abs", "mean_signed", "abs_quantile", "sample_abs",
              "sample_signed", "sample_ulp")


def _kernel(a, b):
    # float16 inputs, float32 accumulation over 8-wide K tiles, one rounding at the store
    a32, b32 = a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32)
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k0 in range(0, a.shape[1], 8):
        acc += a32[:, k0:k0 + 8] @ b32[k0:k0 + 8]
    return acc.astype(np.float16)


def _reference(a, b):
    return a.astype(np.float16).astype(np.float64) @ b.astype(np.float16).astype(np.float64)


def _make(rng):
    k = int(rng.choice([8, 32, 64]))
    scale = float(rng.choice([1.0, 10.0]))
    return tolstat.Inputs(args=(rng.standard_normal((8, k)) * scale, rng.standard_normal((k, 4))),
                          covariates={"K": k, "scale": scale})


def _dataset(seed: int, ops=("mm", "mm2"), hardware="hw-a") -> "tolstat.xr.Dataset":
    parts = [tolstat.collect(_kernel, _reference, _make, op=op, dtype="float16", runs=RUNS, seed=seed + 100 * i,
                             hardware=hardware, options=tolstat.CollectOptions(sample_size=64, op_model=False))
             for i, op in enumerate(ops)]  # op_model=False: "mm" and "mm2" measured alike
    return tolstat.concat(parts)


def _scaled(ds, factor):
    out = ds.copy()
    for v in ERROR_VARS:
        out[v] = ds[v] * factor
    if factor > 1:
        # larger errors are no longer the correctly rounded reference (0 ULP stays 0 when scaled)
        out["max_ulp"] = ds["max_ulp"].where(ds["max_abs"] == 0, np.maximum(ds["max_ulp"] * factor, 1.0))
    return out


@pytest.fixture(scope="module")
def a():
    return _dataset(0)


@pytest.fixture(scope="module")
def b_same():
    return _dataset(1, hardware="hw-b")


@pytest.fixture(scope="module")
def res_same(a, b_same):
    return tolstat.shift(a, b_same, fp_budget=BUDGET)


def test_same_distribution_no_shift_fp_within_budget(res_same):
    assert isinstance(res_same, ShiftResult)
    assert res_same.shifted == []
    assert res_same.broken == []
    d = res_same.data
    assert list(d["op"].values) == ["mm", "mm2"]
    assert (d["fp_rate_b"].values <= BUDGET).all()
    assert set(d["fp_status"].values.tolist()) == {"within"}
    assert (d["p_holm"].values >= 1 - res_same.confidence).all()
    # effect sizes near 1 for the same distribution
    np.testing.assert_allclose(d["ratio_median"].values, 1.0, atol=0.2)
    assert res_same.only_a == [] and res_same.only_b == []


def test_three_times_larger_errors_shift_and_break_the_budget(a):
    b3 = _scaled(_dataset(2, hardware="hw-b"), 3.0)
    res = tolstat.shift(a, b3, fp_budget=BUDGET)
    assert res.shifted == [("mm", "float16"), ("mm2", "float16")]
    assert res.broken == [("mm", "float16"), ("mm2", "float16")]
    d = res.data
    assert (d["fp_ci_low"].values > BUDGET).all()
    np.testing.assert_allclose(d["ratio_median"].values, 3.0, rtol=0.25)
    text = res.to_text()
    assert "BROKEN" in text and "SHIFT" in text
    assert "budget broken in 2: mm/float16, mm2/float16" in text


def test_groups_in_one_dataset_only_are_listed(a):
    b = _dataset(3, ops=("mm", "other"), hardware="hw-b")
    res = tolstat.shift(a, b, fp_budget=BUDGET)
    assert [(str(o), str(t)) for o, t in zip(res.data["op"].values, res.data["dtype"].values)] == [("mm", "float16")]
    assert res.only_a == [("mm2", "float16")]
    assert res.only_b == [("other", "float16")]
    text = res.to_text()
    assert "only in A (not compared): mm2/float16" in text
    assert "only in B (not compared): other/float16" in text
    d = res.to_dict()
    assert d["only_a"] == [["mm2", "float16"]] and d["only_b"] == [["other", "float16"]]


def test_statistics_match_scipy_on_the_tables_scores(a, b_same, res_same):
    ent = res_same.table.entry("mm", "float16")
    sa = a.isel(run=np.flatnonzero(a.op.values == "mm"))
    sb = b_same.isel(run=np.flatnonzero(b_same.op.values == "mm"))
    xa = run_scores(sa, ent.scale, "max_abs").scores
    xb = run_scores(sb, ent.scale, "max_abs").scores
    vb = run_values(sb, "max_score", ent.scale)  # what a check compares: 0 when correctly rounded
    row = res_same.data.isel(group=0)
    ks = stats.ks_2samp(xa, xb)
    assert float(row["ks_stat"]) == pytest.approx(ks.statistic)
    assert float(row["ks_p"]) == pytest.approx(ks.pvalue)
    thr = ent.statistics["max_score"].threshold
    assert float(row["threshold"]) == thr
    k = int((vb > thr).sum())
    assert int(row["n_exceed_b"]) == k
    ci = stats.binomtest(k, xb.size).proportion_ci(confidence_level=0.95, method="exact")
    assert float(row["fp_ci_low"]) == pytest.approx(ci.low)
    assert float(row["fp_ci_high"]) == pytest.approx(ci.high)
    assert float(row["ratio_q90"]) == pytest.approx(np.quantile(xb, 0.9) / np.quantile(xa, 0.9))


def test_no_form_scores_plain_max_abs(a, b_same):
    res = tolstat.shift(a, b_same, fp_budget=BUDGET, form=None)
    assert res.table.statistics == ["max_abs"]
    med = float(np.median(a.max_abs.values[a.op.values == "mm"]))
    assert float(res.data["median_a"].values[0]) == pytest.approx(med)


def test_group_too_small_for_the_budget_is_kept_without_fp(a, b_same):
    # 300 runs cannot hold 1e-4 with an order statistic
    res = tolstat.shift(a, b_same, fp_budget=1e-4, options=tolstat.SelectOptions(method="order_statistic"))
    assert set(res.data["method"].values.tolist()) == {"refused"}
    d = res.data
    assert set(d["fp_status"].values.tolist()) == {""}
    assert all("no threshold on A" in str(n) for n in d["note"].values)
    assert np.isfinite(d["ks_p"].values).all()
    assert "no threshold" in res.to_text()


def test_b_without_the_scale_models_covariate_is_not_scored(a, b_same):
    b = b_same.drop_vars("K")
    b.attrs["covariates"] = ",".join(c for c in b_same.attrs["covariates"].split(",") if c != "K")
    res = tolstat.shift(a, b, fp_budget=BUDGET, form="size_aware")
    d = res.data
    assert np.isnan(d["ks_p"].values).all() and not d["shift"].values.any()
    assert all("not scored: covariate 'K'" in str(n) for n in d["note"].values)
    assert res.to_text().count("not scored") == 4  # two status cells, two notes
    assert res.shifted == [] and res.broken == []


def test_json_report_round_trip(res_same, tmp_path):
    p = tmp_path / "r.json"
    text = res_same.to_json(p)
    d = json.loads(p.read_text())
    assert json.loads(text) == d
    assert d["fp_budget"] == BUDGET and d["form"] == "allclose"
    assert d["hardware_a"] == ["hw-a"] and d["hardware_b"] == ["hw-b"]
    assert [g["op"] for g in d["groups"]] == ["mm", "mm2"]
    assert "tolstat.models.scale.run_scores" in d["functions"] and "tolstat.calibration.decision.run_values" in d["functions"]
    assert not list(tmp_path.glob(".*tmp*"))


def test_bad_arguments(a, b_same):
    with pytest.raises(ValueError, match="fp_budget"):
        tolstat.shift(a, b_same, fp_budget=1.5)
    with pytest.raises(ValueError, match="form"):
        tolstat.shift(a, b_same, form="bogus")
    with pytest.raises(ValueError, match="no \\(op, dtype\\) in both"):
        tolstat.shift(a, _dataset(4, ops=("zz",)))
    with pytest.raises(TypeError, match="unexpected keyword argument 'by'"):
        tolstat.shift(a, b_same, by=("op", "dtype", "hardware"))  # shift calibrates by (op, dtype)
    with pytest.raises(TypeError, match="unexpected keyword argument 'method'"):
        tolstat.shift(a, b_same, method="evt")  # select's settings come as options=SelectOptions(...)
    with pytest.raises(TypeError, match="xarray.Dataset"):
        tolstat.shift(a, {"max_abs": 1})


@pytest.mark.slow
def test_cli_shift(a, b_same, tmp_path, capsys):
    pa, pb, out = tmp_path / "a.nc", tmp_path / "b.nc", tmp_path / "rep.json"
    tolstat.save(a, pa)
    tolstat.save(_scaled(b_same, 3.0), pb)
    assert main(["shift", str(pa), str(pb), "--fp-budget", str(BUDGET), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "BROKEN" in text and f"wrote {out}" in text
    assert json.loads(out.read_text())["broken"] == [["mm", "float16"], ["mm2", "float16"]]
    assert main(["shift", str(pa), str(pa), "--form", "none", "--fp-budget", str(BUDGET)]) == 0
    assert "form=none (max_abs)" in capsys.readouterr().out


@pytest.mark.parametrize("extra, match", [
    (["--fp-budget", "2"], "fp_budget"),
    (["--fp-budget", "x"], "invalid float value"),
    (["--form", "bogus"], "form"),
    (["--confidence", "1"], "confidence"),
])
def test_cli_shift_bad_arguments_exit_2_one_line(a, tmp_path, capsys, extra, match):
    pa = tmp_path / "a.nc"
    tolstat.save(a, pa)
    try:
        rc = main(["shift", str(pa), str(pa), *extra])
    except SystemExit as exc:
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0]


def test_cli_shift_missing_file_exit_2(tmp_path, capsys):
    assert main(["shift", str(tmp_path / "no.nc"), str(tmp_path / "no2.nc")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no.nc" in err[0]


def test_evaluation_shift_report_compares_only_the_groups_evaluate_calibrated(a, b_same, tmp_path):
    tolstat.save(b_same, tmp_path / "gpu_test.nc")
    text = evaluation_shift_report(a.isel(run=np.flatnonzero(a.op.values == "mm")), [tmp_path / "gpu_test.nc"],
                                   fp_budget=BUDGET, confidence=0.95)
    assert text.startswith("error dataset gpu_test.nc (300 of its runs left out:")
    assert "mm  " in text and "mm2" not in text  # only the groups evaluate calibrated


def test_evaluation_shift_report_compares_only_the_shapes_evaluate_calibrated(a, b_same, tmp_path):
    a2 = a.assign_coords(dims=("run", np.where(a.max_abs.values >= 0, "M=8", "")))
    b2 = b_same.assign_coords(dims=("run", np.where(np.arange(b_same.sizes["run"]) % 2 == 0, "M=8", "M=99")))
    a2.attrs["labels"] = a.attrs["labels"] + ",dims" if a.attrs["labels"] else "dims"
    b2.attrs["labels"] = a2.attrs["labels"]
    tolstat.save(b2, tmp_path / "gpu_dims.nc")
    text = evaluation_shift_report(a2, [tmp_path / "gpu_dims.nc"], fp_budget=BUDGET, confidence=0.95)
    assert "(300 of its runs left out" in text
    assert re.search(r"^mm\s+float16\s+300\s+150\s", text, re.M)  # n_a, n_b: half of B's shapes match


@pytest.mark.slow
def test_null_simulation_false_flags_stay_at_their_levels():
    """A and B drawn without overlap from one pool of runs (the truth: no shift, and the true
    FP rate of any threshold is the pool's): the familywise shift flag (Holm, level 0.05) and
    the 'broken' flag (one-sided level 0.025 given a table that keeps its budget, which it
    does with confidence 0.95) must be rare."""
    pool = tolstat.collect(_kernel, _reference, _make, op="mm", dtype="float16", runs=1200, seed=7,
                           hardware="pool", options=tolstat.CollectOptions(sample_size=16, op_model=False))
    rng = np.random.default_rng(11)
    reps, shifted, broken = 30, 0, 0
    for _ in range(reps):
        idx = rng.permutation(pool.sizes["run"])
        res = tolstat.shift(pool.isel(run=np.sort(idx[:300])), pool.isel(run=np.sort(idx[300:600])),
                            fp_budget=BUDGET, form=None)
        shifted += bool(res.shifted)
        broken += bool(res.broken)
    # binomial(30, 0.05) exceeds 5 with probability 0.016; the broken flag's level is lower
    assert shifted <= 5
    assert broken <= 5
