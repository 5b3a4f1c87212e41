"""String labels survive every open -> combine -> save path exactly (docs/schema.md, "Label encoding").

Datasets are opened from ``.nc`` and ``.zarr`` files (whose readers record the stored
string width as an encoding), combined with :func:`tolstat.concat`,
:func:`tolstat.dataset.merge_records` or ``tolstat merge``, saved and opened again: every
label value, long (>= 40 characters), non-ASCII or of a length the other input never
had, must come back unchanged.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import tolstat
from tolstat.cli.main import main as cli_main
from tolstat.dataset.merge import LABEL_FILL, merge_records

pytest.importorskip("h5netcdf")

LONG_TEST = "tests/test_ops.py::test_layer_norm[float16-shape=(64, 128)-eps=1e-05-seed=3]"
UNICODE = "softmax-ünïcode-✓"
EXTS = ("nc", "zarr")


def _kernel(x):
    return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)


def _ref(x):
    return x.astype(np.float16).astype(np.float64) * 3.0


def _pairs(tests: list[str], seed: int, extra: dict[str, str] | None = None) -> list:
    out = []
    for i, test in enumerate(tests):
        x = np.random.default_rng([seed, i]).standard_normal(24 + 8 * i)
        out.append((_kernel(x), _ref(x), {"test": test, **(extra or {})}, {}))
    return out


def _short() -> xr.Dataset:
    """Short labels: every stored string is 2-3 characters wide."""
    return tolstat.from_pairs(_pairs(["t0", "t1"], seed=0), op="la", dtype="float16", hardware="cpu")


def _long(extra: dict[str, str] | None = None) -> xr.Dataset:
    """Long and non-ASCII labels, of lengths the short dataset never has."""
    tests = [LONG_TEST, f"{LONG_TEST}[{UNICODE}]", UNICODE]
    assert max(len(t) for t in tests) >= 40
    return tolstat.from_pairs(_pairs(tests, seed=1, extra=extra), op="layer_norm", dtype="float16",
                              hardware=f"cuda:NVIDIA H200 {UNICODE}")


def _reopened(ds: xr.Dataset, path: Path) -> xr.Dataset:
    tolstat.save(ds, path)
    return tolstat.open_errors(path)


def _labels(ds: xr.Dataset, names: tuple[str, ...]) -> dict[str, list[str]]:
    return {n: [str(v) for v in np.asarray(ds[n].values).tolist()] for n in names}


NAMES = ("op", "hardware", "shape", "platform", "test")


@pytest.mark.slow
@pytest.mark.parametrize("src", EXTS)
@pytest.mark.parametrize("dst", EXTS)
@pytest.mark.parametrize("combine", ["concat", "merge_records"])
def test_labels_round_trip_exactly_after_combining_opened_files(tmp_path, src, dst, combine):
    short, long = _short(), _long()
    # the short file first: its stored widths are the ones a reader records
    a = _reopened(short, tmp_path / f"a.{src}")
    b = _reopened(long, tmp_path / f"b.{src}")
    both = tolstat.concat([a, b]) if combine == "concat" else merge_records([a, b])
    want = {n: _labels(short, NAMES)[n] + _labels(long, NAMES)[n] for n in NAMES}
    assert _labels(both, NAMES) == want
    back = _reopened(both, tmp_path / f"out.{dst}")
    assert _labels(back, NAMES) == want
    assert "layer_norm" in want["op"] and UNICODE in want["test"]


@pytest.mark.slow
@pytest.mark.parametrize("src", EXTS)
@pytest.mark.parametrize("dst", EXTS)
def test_labels_round_trip_exactly_through_the_merge_command(tmp_path, src, dst, capsys):
    # different label names too: the short records lack "variant", which merge fills in
    short, long = _short(), _long(extra={"variant": f"split-k-{UNICODE}-" + "x" * 40})
    a = _reopened(short, tmp_path / f"a.{src}")
    b = _reopened(long, tmp_path / f"b.{src}")
    out = tmp_path / f"merged.{dst}"
    assert cli_main(["merge", str(tmp_path / f"a.{src}"), str(tmp_path / f"b.{src}"), "-o", str(out)]) == 0
    assert "5 runs" in capsys.readouterr().out
    back = tolstat.open_errors(out)
    names = (*NAMES, "variant")
    want = _labels(a, NAMES) | {"variant": [LABEL_FILL] * 2}
    want = {n: want[n] + _labels(b, names)[n] for n in names}
    assert _labels(back, names) == want
    assert want["variant"][-1] == f"split-k-{UNICODE}-" + "x" * 40


@pytest.mark.slow
@pytest.mark.parametrize("src", EXTS)
def test_long_labels_first_then_short_round_trip(tmp_path, src):
    a = _reopened(_long(), tmp_path / f"a.{src}")
    b = _reopened(_short(), tmp_path / f"b.{src}")
    both = merge_records([a, b])
    for dst in EXTS:
        back = _reopened(both, tmp_path / f"out.{dst}")
        assert _labels(back, NAMES) == {n: _labels(a, NAMES)[n] + _labels(b, NAMES)[n] for n in NAMES}


@pytest.mark.parametrize("src", EXTS)
def test_combined_labels_carry_no_stored_string_width(tmp_path, src):
    a = _reopened(_short(), tmp_path / f"a.{src}")
    b = _reopened(_long(), tmp_path / f"b.{src}")
    for both in (tolstat.concat([a, b]), merge_records([a, b])):
        for name in NAMES:
            assert both[name].dtype.kind == "U"
            assert not {"dtype", "char_dim_name"} & set(both[name].encoding), (name, both[name].encoding)


def test_normalize_labels_widens_text_and_leaves_the_input_alone():
    from tolstat.dataset.schema import normalize_labels

    ds = _short()
    stale = ds.copy()
    stale["op"].encoding = {"dtype": np.dtype("<U2"), "chunks": (2,)}
    stale = stale.assign_coords(test=("run", np.array([b"t0", "t1-ü".encode()], dtype=object)))
    out = normalize_labels(stale)
    assert out["op"].encoding == {"chunks": (2,)}
    assert stale["op"].encoding["dtype"] == np.dtype("<U2")  # the input keeps its encoding
    assert out["test"].dtype.kind == "U" and out["test"].values.tolist() == ["t0", "t1-ü"]
    assert out["max_abs"].dtype == np.float64  # numbers untouched
