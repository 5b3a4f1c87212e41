"""``tolstat collect`` for the user's own kernels, low-precision ``.npy`` inputs to
``tolstat check``, bf16 through ``__dlpack__`` alone, portable store locking."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tolstat
from tolstat.cli.main import main

ROOT = Path(__file__).resolve().parents[1]

USER_MODULE = textwrap.dedent("""
    import numpy as np
    import ml_dtypes

    def kern(a, b):
        return (a.astype(np.float16) @ b.astype(np.float16)).astype(np.float16)

    def ref(a, b):
        return a.astype(np.float16).astype(np.float64) @ b.astype(np.float16).astype(np.float64)

    def make_inputs(rng):
        return rng.standard_normal((8, 16)), rng.standard_normal((16, 4))

    class Suite:
        @staticmethod
        def kern(a, b):
            return kern(a, b)

    NOT_CALLABLE = 3
""")


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "mykernels_t13.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    yield "mykernels_t13"
    sys.modules.pop("mykernels_t13", None)


def test_collect_user_kernel_by_module_spec(tmp_path, user_module, capsys):
    out = tmp_path / "mine.nc"
    assert main(["collect", "-o", str(out), "--kernel", f"{user_module}:kern",
                 "--reference", f"{user_module}:ref", "--inputs", f"{user_module}:make_inputs",
                 "--op", "mymatmul", "--dtype", "fp16", "--runs", "12", "--no-progress"]) == 0
    assert "12 runs" in capsys.readouterr().out
    ds = tolstat.open_errors(out)
    assert ds.sizes["run"] == 12
    assert set(ds.op.values) == {"mymatmul"} and set(ds.dtype.values) == {"float16"}
    assert float(ds.max_abs.max()) > 0
    # the same runs as the API with the same seed
    import mykernels_t13 as m

    api = tolstat.collect(m.kern, m.ref, m.make_inputs, op="mymatmul", dtype="fp16", runs=12)
    np.testing.assert_array_equal(ds.max_abs.values, api.max_abs.values)


def test_collect_user_kernel_by_file_and_dotted_spec(tmp_path, user_module):
    out = tmp_path / "mine.nc"
    path = tmp_path / f"{user_module}.py"
    assert main(["collect", "-o", str(out), "--kernel", f"{path}:Suite.kern",
                 "--reference", f"{path}:ref", "--inputs", f"{path}:make_inputs",
                 "--op", "m", "--dtype", "float16", "--runs", "3", "--no-progress"]) == 0
    assert tolstat.open_errors(out).sizes["run"] == 3


@pytest.mark.parametrize("extra, message", [
    (["--kernel", "nocolon"], "must be MODULE:FUNCTION"),
    (["--kernel", "no_such_module_t13:f"], "cannot import module 'no_such_module_t13'"),
    (["--kernel", "mykernels_t13:missing"], "has no attribute 'missing'"),
    (["--kernel", "mykernels_t13:NOT_CALLABLE"], "is a int, not a callable"),
])
def test_collect_user_kernel_bad_specs(tmp_path, user_module, capsys, extra, message):
    args = ["collect", "-o", str(tmp_path / "x.nc"), "--reference", f"{user_module}:ref",
            "--inputs", f"{user_module}:make_inputs", "--op", "m", "--dtype", "fp16",
            "--runs", "2", *extra]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_collect_user_kernel_needs_all_specs_and_no_corpus_options(tmp_path, user_module, capsys):
    assert main(["collect", "-o", str(tmp_path / "x.nc"), "--kernel", f"{user_module}:kern"]) == 2
    err = capsys.readouterr().err
    assert "--reference" in err and "--inputs" in err and "--op" in err and "--dtype" in err
    assert main(["collect", "-o", str(tmp_path / "x.nc"), "--kernel", f"{user_module}:kern",
                 "--reference", f"{user_module}:ref", "--inputs", f"{user_module}:make_inputs",
                 "--op", "m", "--dtype", "fp16", "--quick"]) == 2
    assert "--quick only apply to the corpus" in capsys.readouterr().err


def test_collect_progress_bar_says_collect(tmp_path, capsys):
    assert main(["collect", "-o", str(tmp_path / "e.nc"), "--ops", "gelu", "--dtypes", "float16",
                 "--cases", "3", "--quick", "--progress"]) == 0
    err = capsys.readouterr().err
    assert "collect" in err and "calibrate" not in err


@pytest.mark.parametrize("dtype, npdt", [("bf16", ml_dtypes.bfloat16),
                                         ("fp8_e4m3", ml_dtypes.float8_e4m3fn),
                                         ("fp8_e5m2", ml_dtypes.float8_e5m2)])
def test_check_reads_low_precision_npy(tmp_path, capsys, dtype, npdt):
    rng = np.random.default_rng(0)

    def make(r):
        return (r.standard_normal(64),)

    def ref(x):
        return x.astype(npdt).astype(np.float64) * 2.0

    def kern(x):
        return (x.astype(npdt).astype(np.float32) * np.float32(2.0)).astype(npdt)

    ds = tolstat.collect(kern, ref, make, op="double", dtype=dtype, runs=60, hardware="hw")
    table = tmp_path / "t.json"
    tolstat.select(ds, form=None, fp_budget=0.1, confidence=0.5, by=("op", "dtype")).to_json(table)
    x = rng.standard_normal(64)
    np.save(tmp_path / "a.npy", kern(x))
    np.save(tmp_path / "e.npy", ref(x))
    from tolstat.cli.npy import load_array

    loaded = load_array(tmp_path / "a.npy", dtype)  # numpy itself reads raw bytes or fails
    assert loaded.dtype == np.dtype(npdt)
    np.testing.assert_array_equal(loaded.view(np.uint8), kern(x).view(np.uint8))
    with pytest.raises(ValueError, match="pass the target dtype|descr is not a valid"):
        load_array(tmp_path / "a.npy")
    capsys.readouterr()
    assert main(["check", str(tmp_path / "a.npy"), str(tmp_path / "e.npy"), "--op", "double",
                 "--dtype", dtype, "--table", str(table)]) == 0, capsys.readouterr()
    assert "PASS double/" in capsys.readouterr().out
    # raw bytes of the wrong width for --dtype: a clear error
    np.save(tmp_path / "w.npy", np.zeros(4, ml_dtypes.bfloat16 if "fp8" in dtype else np.uint8
                                         ).view("V2" if "fp8" in dtype else "V1"))
    assert main(["check", str(tmp_path / "w.npy"), str(tmp_path / "e.npy"), "--op", "double",
                 "--dtype", dtype, "--table", str(table)]) == 2
    assert "cannot be dtype" in capsys.readouterr().err


class _OnlyDLPack:
    """Exposes a tensor through ``__dlpack__``/``__dlpack_device__`` only."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, **kwargs):
        return self._t.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_low_precision_through_dlpack_alone(name):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    dt = getattr(torch, name)
    ref = torch.randn(6, 5, dtype=torch.float64)
    out = ref.to(dt)
    for t in (out, out.T, out[:, ::2]):  # contiguous, transposed, strided
        a = tolstat.measure.metrics.as_array(_OnlyDLPack(t))
        assert a.dtype == np.dtype(getattr(ml_dtypes, name))
        np.testing.assert_array_equal(a.astype(np.float64), t.to(torch.float64).numpy())
    refs = [torch.randn(32, dtype=torch.float64) for _ in range(40)]
    ds = tolstat.from_pairs([(_OnlyDLPack(r.to(dt)), r) for r in refs], op="id", dtype=name,
                            hardware="hw")
    assert ds.sizes["run"] == 40 and float(ds.max_abs.max()) > 0
    table = tolstat.select(ds, form=None, fp_budget=0.1, confidence=0.5, by=("op", "dtype"))
    res = tolstat.check(_OnlyDLPack(out), ref, op="id", dtype=name, table=table)
    assert res.dtype == name
    bad = tolstat.check(_OnlyDLPack((ref * 1.5).to(dt)), ref, op="id", dtype=name, table=table)
    assert not bad.passed


def test_dlpack_refuses_non_low_precision_codes():
    from tolstat.measure.dlpack import from_dlpack_lowp

    with pytest.raises(TypeError, match="is not bfloat16 or float8"):
        from_dlpack_lowp(np.zeros(3, np.int32), name="x")


@pytest.mark.slow
def test_import_does_not_need_fcntl():
    code = ("import sys; sys.modules['fcntl'] = None\n"
            "import tolstat, tolstat.dataset.stream\nprint('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**__import__('os').environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


def test_store_lock_refuses_a_second_writer(tmp_path):
    from tolstat.dataset.stream import _locked

    store = tmp_path / "s.zarr"
    with _locked(store):
        with pytest.raises(RuntimeError, match="being written by another process"):
            with _locked(store):
                pass
    with _locked(store):  # released
        pass


def _matmul_files(tmp_path, rng, scale=1.0, dt=np.float16):
    a = rng.standard_normal((16, 64)).astype(dt)
    b = rng.standard_normal((64, 16)).astype(dt)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    np.save(tmp_path / "out.npy", ((a.astype(np.float32) @ b.astype(np.float32)) * np.float32(scale)).astype(dt))
    np.save(tmp_path / "ref.npy", a.astype(np.float64) @ b.astype(np.float64))
    return a, b


def test_check_with_inputs_against_an_operator_table(tmp_path, capsys):
    # the table is calibrated through inputs= (operator form); the CLI check derives the
    # magnitude and K from --inputs exactly as tolstat.check(inputs=...) does
    rng = np.random.default_rng(1)
    items = []
    for _ in range(80):
        a = rng.standard_normal((16, 64)).astype(np.float16)
        b = rng.standard_normal((64, 16)).astype(np.float16)
        out = (a.astype(np.float32) @ b.astype(np.float32) * np.float32(1 + 1e-3 * rng.standard_normal())
               ).astype(np.float16)
        items.append({"actual": out, "expected": a.astype(np.float64) @ b.astype(np.float64), "inputs": (a, b)})
    ds = tolstat.from_pairs(items, op="matmul", dtype="float16", hardware="hw",
                            options=tolstat.CollectOptions(progress=False))
    table = tolstat.select(ds, fp_budget=0.1)
    assert table.entry("matmul", "float16", "hw").operator
    table.to_json(tmp_path / "t.json")
    for scale in (1.0, 1.05):
        a, b = _matmul_files(tmp_path, rng, scale)
        want = tolstat.check(np.load(tmp_path / "out.npy"), np.load(tmp_path / "ref.npy"), op="matmul",
                             dtype="float16", table=table, hardware="hw", inputs=(a, b))
        rc = main(["check", str(tmp_path / "out.npy"), str(tmp_path / "ref.npy"), "--op", "matmul", "--dtype",
                   "float16", "--table", str(tmp_path / "t.json"), "--hardware", "hw",
                   "--inputs", str(tmp_path / "a.npy"), str(tmp_path / "b.npy")])
        out = capsys.readouterr().out
        assert rc == (0 if want.passed else 1)
        assert ("PASS" if want.passed else "FAILED") in out
    assert not want.passed  # the 5 % scale error fails


def test_check_uncalibrated_model_with_literal_inputs_and_params(tmp_path, capsys):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 64)).astype(np.float16)
    y = x.astype(np.float64)
    ref = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-5)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "ln.npy", ref.astype(np.float16))
    np.save(tmp_path / "ln_bad.npy", (ref * 1.05).astype(np.float16))
    np.save(tmp_path / "ref.npy", ref)
    base = ["--op", "layer_norm", "--dtype", "float16", "--inputs", str(tmp_path / "x.npy"), "(64,)",
            "--param", "eps=1e-5", "--uncalibrated", "model"]
    assert main(["check", str(tmp_path / "ln.npy"), str(tmp_path / "ref.npy"), *base]) == 0
    assert "PASS layer_norm/float16: zero_run" in capsys.readouterr().out
    assert main(["check", str(tmp_path / "ln_bad.npy"), str(tmp_path / "ref.npy"), *base]) == 1
    assert "model-based threshold from zero runs" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    ([], "check needs --table TABLE.json, or --uncalibrated model"),
    (["--uncalibrated", "model", "--inputs", "A", "(1,"], "is neither a .npy/.npz file nor a Python literal"),
    (["--uncalibrated", "model", "--param", "eps=1"], "--param needs --inputs"),
    (["--uncalibrated", "model", "--inputs", "A", "B", "--param", "k"], "must be NAME=VALUE"),
    (["--uncalibrated", "model", "--inputs", "A", "B", "--magnitude", "ref"], "either --inputs"),
])
def test_check_argument_errors_name_the_flag(tmp_path, capsys, extra, message):
    _matmul_files(tmp_path, np.random.default_rng(3))
    extra = [str(tmp_path / "a.npy") if x == "A" else str(tmp_path / "b.npy") if x == "B" else x for x in extra]
    assert main(["check", str(tmp_path / "out.npy"), str(tmp_path / "ref.npy"), "--op", "matmul", "--dtype",
                 "float16", *extra]) == 2
    assert message in capsys.readouterr().err
