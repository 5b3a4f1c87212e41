"""The held-out torch benchmark (``benchmarks/torch_heldout.py``) runs end to end through
the public API with ``inputs=`` and decides every held-out run by every method."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_torch_heldout_quick_run_decides_every_run(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("torch_heldout", ROOT / "benchmarks" / "torch_heldout.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "torch_heldout", mod)  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    out = tmp_path / "h.json"
    res = mod.main(["--quick", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["summary"] == json.loads(json.dumps(mod._json_safe(res["summary"])))
    n_ctrl = len(res["ops"]) * 2 * 2 * 4  # ops x dtypes x correct variants x n_test
    n_bug = len(res["bugs"]) * 2 * 4
    assert not res["refused"]
    for m in mod.METHODS:
        s = res["summary"][m]
        assert s["fp"]["n"] == n_ctrl and s["recall_all"]["n"] == n_bug
    # every group the default calibrated took the operator form (inputs= reached the op model)
    assert all(v == "operator" for k, v in res["forms"].items() if k.startswith("tolstat:"))
    assert (tmp_path / "h.md").read_text().startswith("# tolstat on held-out torch CPU kernels")


@pytest.mark.slow
def test_torch_heldout_with_more_rows_checks_against_the_table_with_and_without_rows_max(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("torch_heldout", ROOT / "benchmarks" / "torch_heldout.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "torch_heldout", mod)
    spec.loader.exec_module(mod)
    res = mod.main(["--quick", "--rows-factor", "4", "--out", str(tmp_path / "r.json")])
    assert res["config"]["rows_factor"] == 4 and mod.AS_CALIBRATED in res["methods"]
    ours, plain = res["summary"]["tolstat"], res["summary"][mod.AS_CALIBRATED]
    assert ours["fp"]["n"] == plain["fp"]["n"] > 0
    # carrying the row maxima only lowers scores: no check fails that fails without it
    assert ours["fp"]["k"] <= plain["fp"]["k"] and ours["recall_all"]["k"] <= plain["recall_all"]["k"]
    for v in res["per_variant"]:
        assert v["tolstat"]["k"] <= v[mod.AS_CALIBRATED]["k"]
    assert "times the leading dimension" in (tmp_path / "r.md").read_text()
