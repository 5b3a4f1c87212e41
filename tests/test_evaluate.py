"""End-to-end evaluation on a tiny configuration, and the CLI around it."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tolstat
from tolstat.cli.main import main
from tolstat.assess.evaluation import EvalConfig, evaluate, write_outputs
from tolstat.assess.rules import StaticRule, StudyRule


@pytest.fixture(scope="module")
def tiny_result():
    cfg = EvalConfig.preset("tiny", ops=["softmax", "matmul", "gelu"])
    return evaluate(cfg, progress=False)


@pytest.mark.slow
def test_evaluate_end_to_end(tiny_result, tmp_path):
    r = tiny_result
    kinds = set(r.checks.kind.values.tolist())
    assert kinds == {"control", "bug"}
    assert set(r.checks.op.values.tolist()) == {"softmax", "matmul", "gelu"}
    names = [m.name for m in r.methods]
    assert {"torch defaults", "atol=rtol=1e-2", "study p95x1.5"} <= set(names)
    assert {"tolstat max_abs", "tolstat allclose", "tolstat size-aware"} <= set(names)
    for m, row in zip(r.methods, r.summary):
        assert row["method"] == m.name
        assert row["budget"] == (0.1 if m.family == "tolstat" else None)
    tolstat.dataset.validate(r.calibration)
    for row in r.summary:
        assert row["n_control"] == int((r.checks.kind == "control").sum())
        assert 0 <= row["recall"] <= 1 and 0 <= row["fp_rate"] <= 1
        assert row["fp_rate_ub"] >= row["fp_rate"]
    # gross bugs are caught by a static rule somewhere
    gross = [b for b in r.per_bug if b["category"] == "gross"]
    assert any(b["torch defaults"] > 0 for b in gross)
    from tolstat.cli.plots import plot_evaluation

    paths = write_outputs(r, tmp_path) + plot_evaluation(r, tmp_path)
    names_written = {p.name for p in paths}
    assert {"results.json", "checks.nc", "calibration.nc", "recall_fp.png"} <= names_written
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["counts"]["buggy"] == int((r.checks.kind == "bug").sum())
    assert "table" not in doc and len(doc["summary"]) == len(r.methods)
    assert "method" in r.table() and "recall" in r.table()


def test_scores_match_rules(tiny_result):
    """Recompute the static and study flags by hand from the stored calibration data."""
    r = tiny_result
    study = next(m for m in r.methods if isinstance(m, StudyRule))
    cal = r.calibration
    sel = (cal.op == "gelu") & (cal.dtype == "float16")
    want = 1.5 * np.percentile(cal.max_abs.values[sel.values], 95)
    assert r.threshold_for(study.name, "gelu", "float16") == pytest.approx(want)
    assert r.threshold_for("torch defaults", "gelu", "float16") is None  # allclose ratios, not max_abs
    torch_m = next(m for m in r.methods if isinstance(m, StaticRule) and m.name == "torch defaults")
    one = tolstat.from_pairs([(np.float16([1.0, 2.0]), np.array([1.0005, 2.0]))], op="x", dtype="float16",
                             options=tolstat.CollectOptions(progress=False))
    fitted = torch_m.fit(None, budget=0.1, confidence=0.95, by=("op", "dtype"))
    # |d| = 5e-4 vs atol + rtol*|ref| = 1e-5 + 1e-3*1.0005
    assert fitted.score(one)[0] == pytest.approx(5e-4 / (1e-5 + 1e-3 * 1.0005))


def test_detectable_flag_is_consistent(tiny_result):
    """softmax_pad_zero is bitwise exact when the row length is a power of two."""
    c = tiny_result.checks
    sel = (c.bug == "softmax_pad_zero").values
    assert sel.any()
    pow2 = 0
    for shape, det in zip(c.shape.values[sel], c.detectable.values[sel]):
        n = int(str(shape).split("x")[-1])
        if n & (n - 1) == 0:
            assert not det, shape
            pow2 += 1
    assert pow2 > 0  # the tiny grid has a power-of-two row length
    # controls carry detectable=True by convention; gross bugs are detectable somewhere
    assert c.detectable.values[(c.kind == "control").values].all()
    assert c.detectable.values[(c.category == "gross").values].any()


def test_unknown_op_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown op"):
        evaluate(EvalConfig.preset("tiny", ops=["nope"]), progress=False)
    with pytest.raises(ValueError, match="unknown preset"):
        EvalConfig.preset("huge")


def test_cli_evaluate_and_report(tmp_path, capsys):
    out = tmp_path / "res"
    rc = main(["evaluate", "--quick", "--n-cal", "30", "--n-test", "1", "--ops", "silu,mean",
               "--fp-budget", "0.1", "-o", str(out), "--no-plots", "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "control checks" in text and "torch defaults" in text
    assert all(peer in text for peer in ("dynamo same", "flash-attn 2x eager", "gpucheck"))
    assert main(["report", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "| method |" in md and "silu" in md
    assert main(["report", str(tmp_path)]) == 2


def test_cli_evaluate_too_few_calibration_runs(tmp_path, capsys):
    """tolstat methods that cannot keep the budget with the runs given are skipped, loudly."""
    rc = main(["evaluate", "--quick", "--n-cal", "5", "--n-test", "1", "--ops", "gelu",
               "-o", str(tmp_path), "--no-plots", "--no-progress"])
    assert rc == 0
    captured = capsys.readouterr()
    # the variants of one case share its inputs: 5 cases are 5 independent units
    assert "skipping 'tolstat max_abs'" in captured.err and "5 calibration units < 299 needed" in captured.err
    assert "skipping 'tolstat default'" in captured.err and "299 needed" in captured.err
    table = captured.out.split("not compared")[0]
    assert "torch defaults" in table and "tolstat max_abs" not in table
    assert "not compared" in captured.out
    doc = json.loads((tmp_path / "results.json").read_text())
    assert "tolstat max_abs" in doc["skipped_methods"]


@pytest.mark.slow
def test_cli_evaluate_shift_against_an_error_dataset(tmp_path, capsys):
    args = ["evaluate", "--quick", "--n-cal", "5", "--n-test", "1", "--ops", "gelu", "--no-plots", "--no-progress"]
    assert main(args + ["-o", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    assert main(args + ["-o", str(tmp_path / "b"), "--shift-against", str(tmp_path / "a" / "calibration.nc")]) == 0
    out = capsys.readouterr().out
    assert "error dataset calibration.nc" in out and "gelu" in out.split("error dataset calibration.nc")[1]


def test_methods_are_the_comparison_rules(capsys):
    """evaluate scores through tolstat.assess.comparison: one TORCH_DEFAULTS, rules by name or dict, and a
    rule without a threshold for some checks is skipped loudly, not counted as passing them."""
    from tolstat.assess import rules
    from tolstat.assess.evaluation import TORCH_DEFAULTS, default_methods

    assert TORCH_DEFAULTS is rules.TORCH_DEFAULTS
    assert all(isinstance(m, rules.Rule) for m in default_methods())
    only_f32 = StaticRule("only float32", {"float32": (1e-3, 1e-5)})
    r = evaluate(EvalConfig.preset("tiny", ops=["gelu"]), progress=False,
                 methods=["study", {"name": "loose", "atol": 1.0, "rtol": 0.0}, only_f32])
    assert [m.name for m in r.methods] == ["study", "loose"]
    assert "no threshold for" in r.skipped["only float32"]
    assert "skipping 'only float32'" in capsys.readouterr().err
    loose = r.checks.score.sel(method="loose").values
    assert np.isfinite(loose).all() and (loose > 0).any()
    with pytest.raises(ValueError, match="distinct names"):
        evaluate(EvalConfig.preset("tiny", ops=["gelu"]), progress=False, methods=["study", "study"])


def test_kernel_protocol_calibrates_each_variant_on_its_own_runs():
    """protocol="kernel": the study rule's threshold of a check is 1.5 x p95 of the calibration
    runs of the check's own variant (a bug: of the variant it modifies), not of the whole op."""
    cfg = dict(ops=["matmul"], dtypes=("float16",))
    r_op = evaluate(EvalConfig.preset("tiny", **cfg), progress=False, methods=["study"])
    r_k = evaluate(EvalConfig.preset("tiny", protocol="kernel", **cfg), progress=False, methods=["study"])
    cal = r_k.calibration
    thr_op = r_op.threshold_for("study", "matmul", "float16")
    assert thr_op == pytest.approx(1.5 * np.percentile(cal.max_abs.values, 95))
    c_op, c_k = r_op.checks, r_k.checks
    assert (c_op.variant.values == c_k.variant.values).all()
    variants = np.unique(c_k.variant.values)
    assert variants.size > 1
    for v in variants:
        thr_v = 1.5 * np.percentile(cal.max_abs.values[cal.variant.values == v], 95)
        sel = c_k.variant.values == v
        want = c_op.score.sel(method="study").values[sel] * thr_op / thr_v
        np.testing.assert_allclose(c_k.score.sel(method="study").values[sel], want, rtol=1e-12)
    with pytest.raises(ValueError, match="protocol must be one of"):
        EvalConfig(protocol="variant")


def test_partly_calibrated_method_is_measured_on_its_covered_checks(tmp_path):
    """A method that refuses some groups is left out of the comparison, and measured on the
    checks of the groups it covers: the same flags as the full method on those checks."""
    from tolstat.assess.rules import Fitted, StudyRule
    from tolstat.assess.evaluation import partial_table
    from tolstat.cli.report import markdown_report

    class Float16Only(StudyRule):
        def fit(self, train, *, budget, confidence, by):
            f = super().fit(train, budget=budget, confidence=confidence, by=by)
            thr = {k: (v if k[1] == "float16" else float("nan")) for k, v in f.thresholds.items()}
            reasons = {k: "refused for the test" for k in thr if k[1] != "float16"}

            def score(ds):
                s = f.score(ds)
                return np.where(np.asarray(ds["dtype"].values).astype(str) == "float16", s, np.nan)

            return Fitted(thr, reasons, score)

    r = evaluate(EvalConfig.preset("tiny", ops=["gelu"]), progress=False,
                 methods=[StudyRule("study"), Float16Only("study f16")])
    assert [m.name for m in r.methods] == ["study"]
    assert "1 of 2 groups refused" in r.skipped["study f16"]
    (row,) = r.partial
    c = r.checks
    f16 = (c.dtype == "float16").values
    ctrl, det = (c.kind == "control").values, (c.kind == "bug").values & c.detectable.values
    flag = c.score.values[:, [str(m) for m in c["method"].values].index("study")] > 1
    assert (row["groups"], row["groups_refused"]) == (2, 1)
    assert row["n_control"] == int((ctrl & f16).sum()) and row["uncovered_controls"] == int((ctrl & ~f16).sum())
    assert row["fp"] == int((flag & ctrl & f16).sum())
    assert row["n_detectable"] == int((det & f16).sum()) and row["uncovered_detectable"] == int((det & ~f16).sum())
    assert row["caught_detectable"] == int((flag & det & f16).sum())
    assert row["n_detectable"] > 0 and row["uncovered_controls"] > 0
    assert "study f16" in partial_table(r) and "1/2" in partial_table(r)
    doc = json.loads(r.to_json(tmp_path / "results.json").read_text())
    assert doc["partial"][0]["method"] == "study f16"
    md = markdown_report(doc, [])
    assert "Partly calibrated" in md and "| study f16 | 1/2 |" in md and "## Not compared" in md
