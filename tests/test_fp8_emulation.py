"""FP8 GEMMs of emulated GPUs: the collection script, the shipped dataset, the transfer analysis.

The shipped dataset's tests and the op model's need neither torch nor mmaemu; the
collection script's CPU path needs torch; its GPU profiles need mmaemu (the ``emulate``
extra) and are skipped without it.
"""

from __future__ import annotations

import importlib.util
import json
import tomllib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tolstat
from tolstat.assess import gpu_transfer as gt
from tolstat.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "fp8_emulated_collect.py"


def _script():
    spec = importlib.util.spec_from_file_location("fp8_emulated_collect", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------ the op model

def test_scaled_mm_model_scales_the_product_of_absolute_inputs():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 64)).astype(ml_dtypes.float8_e4m3fn)
    b = rng.standard_normal((64, 32)).astype(ml_dtypes.float8_e4m3fn)
    st = tolstat.ops.op_statistics("torch._scaled_mm", (a, b, np.float32(0.5), np.float32(-3.0)),
                                   dtype="bfloat16")
    want = 1.5 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    np.testing.assert_array_equal(st.magnitude, want)
    assert st.K == 64 and st.rowwise is False
    assert tolstat.ops.canonical_name("aten._scaled_mm") == "_scaled_mm"


def test_scaled_mm_model_refuses_rowwise_scales_and_scale_result():
    a = np.ones((16, 32), ml_dtypes.float8_e4m3fn)
    b = np.ones((32, 16), ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match="'scale_a'.*per-tensor"):
        tolstat.ops.op_statistics("_scaled_mm", (a, b, np.ones((16, 1), np.float32), np.float32(1)),
                                  dtype="bfloat16")
    with pytest.raises(ValueError, match="'scale_result'"):
        tolstat.ops.op_statistics("_scaled_mm", (a, b, np.float32(1), np.float32(1)),
                                  {"scale_result": np.float32(2)}, dtype="bfloat16")


# ------------------------------------------------------------------ the shipped dataset

@pytest.fixture(scope="module")
def shipped():
    return gt.open_dataset()


def test_shipped_dataset_loads_names_its_hardware_and_is_small(shipped):
    path = gt.dataset_path()
    assert path.stat().st_size < 5e6
    ds = tolstat.open_errors(path)
    tolstat.dataset.validate(ds)
    hws = set(ds["hardware"].values.astype(str))
    assert {gt.H100, gt.RTX4060} <= hws
    assert set(ds["op"].values.astype(str)) == {"_scaled_mm"} and set(ds["dtype"].values.astype(str)) == {"bfloat16"}
    prov = json.loads(ds.attrs["provenance"])[-1]
    assert prov["created_by"] == "benchmarks/fp8_emulated_collect.py"
    assert prov["versions"]["mmaemu"] == "0.1.0"
    assert prov["hardware"]["hopper"] == gt.H100 and prov["hardware"]["ada"] == gt.RTX4060
    assert prov["emulated_gpus"]["hopper"]["gpu_name"] == "NVIDIA H100 PCIe"
    assert set(shipped["variant"].values.astype(str)) == {"correct", *gt.BUGS}
    assert set(shipped["split"].values.astype(str)) == {"cal", "test"}


def test_shipped_dataset_is_package_data():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    pkg = cfg["tool"]["setuptools"]["package-data"]["tolstat"]
    assert any(Path("data", gt.DATA_FILE).match(p) for p in pkg)
    assert cfg["project"]["optional-dependencies"]["emulate"] == ["mmaemu==0.1.0"]
    assert "mmaemu" not in " ".join(cfg["project"]["dependencies"])


def test_the_two_gpus_differ_and_the_cpu_kernel_is_more_accurate(shipped):
    a, b = gt.shift_pair(shipped)
    # the same cases (paired run for run) with other bits: the emulated GPUs round differently
    assert list(a["case"].values) == list(b["case"].values)
    assert (a["max_abs"].values != b["max_abs"].values).any()
    cpu = [h for h in set(shipped["hardware"].values.astype(str)) if h.startswith("torch-cpu:")]
    assert len(cpu) == 1
    c = gt.runs_of(shipped, cpu[0])
    assert list(c["case"].values) == list(a["case"].values)
    # in units of the float32-accumulation noise model, the FP8 tensor-core GEMMs err more
    assert np.median(c["op_max"].values) < 0.5 * min(np.median(a["op_max"].values), np.median(b["op_max"].values))


def test_shift_between_the_emulated_gpus(shipped):
    a, b = gt.shift_pair(shipped)
    res = tolstat.shift(a, b, fp_budget=0.01)
    text = res.to_text()
    assert gt.H100 in text and gt.RTX4060 in text
    d = res.data
    assert d.sizes["group"] == 1 and int(d["n_b"].values[0]) == b.sizes["run"]
    k, n = int(d["n_exceed_b"].values[0]), int(d["n_b"].values[0])
    lo, hi = float(d["fp_ci_low"].values[0]), float(d["fp_ci_high"].values[0])
    assert lo <= k / n <= hi and 0 <= lo < hi <= 1


def test_shift_cli_arguments(capsys, tmp_path):
    assert main(["shift"]) == 2
    assert "two error datasets" in capsys.readouterr().err
    assert main(["shift", "x.nc", "--fp8-emulated"]) == 2
    assert "--fp8-emulated takes no error datasets" in capsys.readouterr().err
    assert main(["shift", "--fp8-emulated", "--hardware-b", "GPU/none"]) == 2
    assert "hardware='GPU/none'" in capsys.readouterr().err


@pytest.mark.slow
def test_shift_cli_on_the_shipped_dataset(capsys):
    assert main(["shift", "--fp8-emulated", "--fp-budget", "0.05"]) == 0
    out = capsys.readouterr().out
    assert f"A={gt.H100} -> B={gt.RTX4060}" in out and "FP on B" in out and "95% CI" in out
    assert "recall per bug" in out and "refused" in out


# ------------------------------------------------------------------ transfer analysis

def _relabelled(ds, hardware):
    out = ds.copy()
    out["hardware"] = ("run", np.full(ds.sizes["run"], hardware))
    return out


def _toy(rng, n, scale, hardware, variant="correct", split="cal"):
    """Error records of a fake matmul (errors ~ scale), labelled as the shipped dataset's."""
    pairs = []
    for i in range(n):
        ref = rng.standard_normal((8, 8))
        act = (ref + scale * rng.standard_normal((8, 8))).astype(np.float32)
        pairs.append((act, ref, {"variant": variant, "split": split, "same_as_correct": "no",
                                 "case": f"{split}/{i}"}))
    return tolstat.from_pairs(pairs, op="toy", dtype="float32", hardware=hardware,
                              options=tolstat.CollectOptions(sample_size=8, progress=False))


@pytest.fixture(scope="module")
def toy():
    rng = np.random.default_rng(5)
    return tolstat.concat([
        _toy(rng, 60, 1e-6, "gpu/a"), _toy(rng, 40, 1e-6, "gpu/a", split="test"),
        _toy(rng, 60, 4e-6, "gpu/b"), _toy(rng, 40, 4e-6, "gpu/b", split="test"),
        _toy(rng, 20, 1e-3, "gpu/a", variant="wrong_scale", split="test"),
        _toy(rng, 20, 1.5e-6, "gpu/b", variant="bf16_accumulation", split="test"),
    ])


def test_transfer_policies_fp_and_recall(toy):
    res = gt.transfer(toy, fp_budget=0.1, tables={"gpu/a": (["gpu/a"], False)})
    fp = res.fp
    row = {(str(fp["checked_on"].values[i]), str(fp["policy"].values[i])): i for i in range(fp.sizes["row"])}
    for pol in ("exact", "error", "pooled", "nearest"):  # on its own hardware every policy takes its group
        assert str(fp["group"].values[row[("gpu/a", pol)]]) == "gpu/a"
    for pol in ("exact", "error"):  # the other GPU: refused
        assert str(fp["status"].values[row[("gpu/b", pol)]]) == "refused"
    i = row[("gpu/b", "nearest")]
    assert str(fp["group"].values[i]) == "gpu/a"
    # errors 4x larger on gpu/b: a's table fails most of its correct runs
    assert int(fp["k"].values[i]) > 20 and str(fp["status"].values[i]) == "broken"
    j = row[("gpu/a", "nearest")]
    assert int(fp["k"].values[j]) <= 10 and fp["ci_low"].values[j] <= fp["rate"].values[j] <= fp["ci_high"].values[j]
    rec = {(str(c), str(b)): k for k, (c, b) in enumerate(zip(res.recall["checked_on"].values,
                                                            res.recall["bug"].values))}
    k = rec[("gpu/a", "wrong_scale")]
    assert int(res.recall["caught"].values[k]) == 20 == int(res.recall["n"].values[k])
    assert ("gpu/b", "bf16_accumulation") in rec
    text = res.to_text()
    assert "exact, error -> refused" in text and "pooled, nearest -> gpu/a" in text
    assert json.loads(res.to_json())["settings"]["fp_budget"] == 0.1


def test_transfer_pooled_table_and_json(toy, tmp_path):
    res = gt.transfer(toy, fp_budget=0.1, tables={"both (*)": (["gpu/a", "gpu/b"], True)})
    fp = res.fp
    groups = {(str(c), str(p)): str(g) for c, p, g in zip(fp["checked_on"].values, fp["policy"].values,
                                                        fp["group"].values)}
    assert groups[("gpu/a", "error")] == "*" and groups[("gpu/b", "nearest")] == "*"
    assert groups[("gpu/a", "exact")] == ""  # exact never uses a pooled group
    out = tmp_path / "t.json"
    res.to_json(out)
    assert json.loads(out.read_text())["fp"][0]["table"] == "both (*)"
    with pytest.raises(FileNotFoundError, match="path: directory"):
        res.to_json(tmp_path / "missing" / "t.json")


def test_transfer_and_runs_of_name_bad_arguments(toy):
    with pytest.raises(ValueError, match="hardware=.*gpu/z"):
        gt.runs_of(toy, "gpu/z")
    with pytest.raises(ValueError, match="split='x'"):
        gt.runs_of(toy, "gpu/a", split="x")
    with pytest.raises(ValueError, match="label 'split'"):
        gt.transfer(toy.drop_vars("split"), fp_budget=0.1)
    with pytest.raises(TypeError, match="ds must be an error dataset"):
        gt.transfer([1, 2], fp_budget=0.1)
    with pytest.raises(FileNotFoundError, match="path: no error dataset"):
        gt.open_dataset("/nonexistent/fp8.nc")


# ------------------------------------------------------------------ the collection script

def test_collection_script_cpu_path_on_a_tiny_shape(tmp_path):
    torch = pytest.importorskip("torch")
    fc = _script()
    if fc._available(torch, ["cpu"]):
        pytest.skip("this torch has no CPU _scaled_mm")
    out = tmp_path / "cpu.nc"
    s = fc.run(["--profiles", "cpu", "--M", "16", "--N", "16", "--K", "256", "--dists", "outlier", "--runs", "4",
                "--block", "2", "--bug-runs", "1", "--out", str(out)])
    assert s["complete"] is True and s["runs"] == 4 + 4 * 1  # 4 correct + 4 bugs x 1 (held-out block)
    ds = tolstat.open_errors(out).load()
    tolstat.dataset.validate(ds)
    assert all(str(h).startswith("torch-cpu:") for h in ds["hardware"].values)
    assert set(ds["variant"].values.astype(str)) == {"correct", *fc.BUGS}
    assert "op_max" in ds and np.all(ds["K"].values == 256)
    bugs = ds.isel(run=np.flatnonzero(ds["variant"].values.astype(str) != "correct"))
    assert set(bugs["split"].values.astype(str)) == {"test"}
    assert set(bugs["same_as_correct"].values.astype(str)) == {"no"}
    ok = ds.isel(run=np.flatnonzero(ds["variant"].values.astype(str) == "correct"))
    dropped = ds.isel(run=np.flatnonzero(ds["variant"].values.astype(str) == "dropped_k_tile"))
    assert np.all(np.isfinite(ok["op_max"].values))
    assert float(ok["op_max"].max()) < float(dropped["op_max"].min())
    prov = json.loads(ds.attrs["provenance"])[-1]
    assert prov["created_by"] == "benchmarks/fp8_emulated_collect.py" and prov["complete"] is True
    assert prov["shape"] == {"M": 16, "N": 16, "K": [256]}


def test_collection_script_refuses_bad_arguments(tmp_path, capsys):
    fc = _script()
    for argv, what in ((["--profiles", "volta"], "--profiles"), (["--K", "100"], "multiples of 16"),
                       (["--K", "128"], "tile width"), (["--max-seconds", "0"], "--max-seconds"),
                       (["--dists", "uniform"], "--dists")):
        with pytest.raises(SystemExit):
            fc.parse_args([*argv, "--out", str(tmp_path / "x.nc")])
        assert what in capsys.readouterr().err


@pytest.mark.slow  # about 10 s: two emulated GPUs
def test_collection_script_emulated_gpus_on_a_tiny_shape(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("mmaemu")
    fc = _script()
    out = tmp_path / "emu.nc"
    s = fc.run(["--profiles", "hopper,ada", "--M", "16", "--N", "64", "--K", "1024", "--dists", "outlier",
                "--runs", "2", "--block", "2", "--out", str(out)])
    ds = tolstat.open_errors(out).load()
    assert s["runs"] == 4 and set(ds["hardware"].values.astype(str)) == {gt.H100, gt.RTX4060}
    prov = json.loads(ds.attrs["provenance"])[-1]
    assert prov["split_k"]["hopper"]["1024"].startswith("S=1")
    gemm = fc.make_gemm(torch, "ada")
    a, b, sa, sb = fc.case_inputs(torch, np.random.default_rng(0), 16, 1024, 64, "normal")
    y = gemm(a, b, sa, sb, torch.bfloat16)
    ref = fc.reference(a, b, sa, sb)
    assert y.dtype == torch.bfloat16 and np.max(np.abs(y.float().numpy() - ref)) < 0.05 * np.max(np.abs(ref))
