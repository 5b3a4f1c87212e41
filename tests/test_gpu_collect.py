"""The GPU collection script (benchmarks/gpu_collect.py) on its CPU path."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tolstat  # noqa: E402
from tolstat import corpus  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_collect.py"


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_collect", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def collected(gc, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "cpu_torch.nc"
    summary = gc.run(["--device", "cpu", "--ops", "matmul,softmax,layer_norm,conv1d", "--cases", "4",
                      "--quick", "--seed", "3", "--out", str(out)])
    return summary, tolstat.open_errors(out).load()


def test_dataset_is_valid_and_complete(collected):
    summary, ds = collected
    tolstat.dataset.validate(ds)
    assert summary["complete"] is True
    groups = {(str(o), str(d)) for o, d in zip(ds.op.values, ds.dtype.values)}
    assert groups == {(op, dt) for op in ("matmul", "softmax", "layer_norm", "conv1d")
                      for dt in ("float16", "bfloat16")}
    # matmul: native + float32 TF32 on/off variants; the others one torch kernel
    mm = ds.where(ds.op == "matmul", drop=True)
    assert sorted(set(mm.variant.values.tolist())) == ["torch", "torch_f32_ieee", "torch_f32_tf32"]
    assert mm.sizes["run"] == 2 * 4 * 3
    sm = ds.where(ds.op == "softmax", drop=True)
    assert set(sm.variant.values.tolist()) == {"torch"}
    assert all(str(h).startswith("torch-cpu:") for h in ds.hardware.values)
    assert ds.sizes["sample"] == 16


def test_same_cases_as_the_corpus(collected):
    _, ds = collected
    for op in ("matmul", "softmax", "layer_norm", "conv1d"):
        want = [c.labels["dims"] for c in corpus.cases(op, "float16", n=4, seed=3, quick=True)]
        sub = ds.where((ds.op == op) & (ds.dtype == "float16") & (ds.variant == "torch"), drop=True)
        assert sub["dims"].values.tolist() == want
        ks = [c.covariates["K"] for c in corpus.cases(op, "float16", n=4, seed=3, quick=True)]
        np.testing.assert_array_equal(sub["K"].values, ks)


def test_errors_are_rounding_sized(collected):
    # a kernel that computed something else than the float64 reference (wrong padding,
    # wrong layout) would be far off; torch's correct kernels stay within a few ULP
    _, ds = collected
    assert int(ds.n_nonfinite.sum()) == 0
    assert float(ds.max_ulp.max()) <= 4.0
    assert float(ds.max_abs.min()) >= 0.0


def test_provenance_records_device_and_settings(collected):
    _, ds = collected
    prov = json.loads(ds.attrs["provenance"])
    mine = [p for p in prov if p.get("created_by") == "benchmarks/gpu_collect.py"]
    assert len(mine) == 1
    p = mine[0]
    assert p["info"]["device"] == "cpu" and p["info"]["torch"] == torch.__version__
    assert "cuda.matmul.allow_tf32" in p["settings"]
    assert p["cases"] == 4 and p["seed"] == 3 and p["complete"] is True
    assert any(s.startswith("triton_softmax:") for s in p["skipped"])
    assert set(p["timings"]) == {f"{o}/{d}" for o in ("matmul", "softmax", "layer_norm", "conv1d")
                                 for d in ("float16", "bfloat16")}


def test_max_seconds_stops_cleanly_and_writes(gc, tmp_path):
    out = tmp_path / "partial.nc"
    summary = gc.run(["--device", "cpu", "--ops", "matmul,softmax", "--cases", "50", "--quick",
                      "--max-seconds", "1e-6", "--out", str(out)])
    assert summary["complete"] is False
    ds = tolstat.open_errors(out)
    tolstat.dataset.validate(ds)
    # the started group keeps its first case (three matmul variants), then the budget stops it
    assert ds.sizes["run"] == 3
    assert set(ds.op.values.tolist()) == {"matmul"}
    prov = json.loads(ds.attrs["provenance"])[-1]
    assert prov["complete"] is False
    assert any("max-seconds" in s for s in prov["skipped"])


@pytest.mark.parametrize("argv, match", [
    (["--ops", "nope"], "unknown op"),
    (["--dtypes", "float32"], "--dtypes"),
    (["--cases", "0"], "--cases"),
    (["--device", "tpu"], "--device"),
])
def test_bad_arguments_exit_2(gc, tmp_path, capsys, argv, match):
    with pytest.raises(SystemExit, match="2"):
        gc.run(["--device", "cpu", "--out", str(tmp_path / "x.nc"), *argv])
    assert match in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_requested_without_cuda_exits_2(gc, tmp_path, capsys):
    with pytest.raises(SystemExit, match="2"):
        gc.run(["--device", "cuda", "--out", str(tmp_path / "x.nc")])
    assert "no CUDA device" in capsys.readouterr().err


def test_shift_against_the_corpus_emulation(collected):
    # the dataset pairs with the corpus's own collection of the same cases
    from tolstat.assess.corpus_runs import calibration_dataset
    from tolstat.assess.evaluation import EvalConfig

    _, ds = collected
    # 10 cases: the variants of one case share its inputs and count as one unit (9 needed at 0.3)
    emu = calibration_dataset(EvalConfig(ops=["matmul", "softmax"], n_cal=10, seed=3, quick=True), progress=False)
    res = tolstat.shift(emu, ds, fp_budget=0.3, options=tolstat.SelectOptions(method="order_statistic"))
    assert [(str(o), str(d)) for o, d in zip(res.data.op.values, res.data.dtype.values)] == [
        ("matmul", "bfloat16"), ("matmul", "float16"), ("softmax", "bfloat16"), ("softmax", "float16")]
    assert res.only_b == [("conv1d", "bfloat16"), ("conv1d", "float16"),
                          ("layer_norm", "bfloat16"), ("layer_norm", "float16")]
    assert (res.data.n_b.values == [12, 12, 4, 4]).all()
    assert set(res.data.fp_status.values.tolist()) <= {"within", "above", "broken"}
