"""``benchmarks/promise_table.py --merge``: one table from the results of several runs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import _promise_sim as ps  # noqa: E402


def _tool():
    spec = importlib.util.spec_from_file_location("promise_table", ROOT / "benchmarks" / "promise_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cell(name: str, violations: int, refused: int = 0) -> ps.CellResult:
    fam, path = name.split("/")
    return ps.CellResult(name=name, family=fam, path=path, form="default", n=300, budget=0.01, confidence=0.95,
                         reps=100, fresh=1000, refused=refused, violations=violations,
                         fps=[0.005] * (100 - refused), inflation=0.01, expect="either")


def test_merge_keeps_every_cell_and_counts_those_over_their_limit(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(ps.results_json([_cell("x/plain", 3), _cell("y/plain", 0, refused=100)], seconds=5.0))
    b.write_text(ps.results_json([_cell("z/operator", 20)], seconds=7.0))
    out = tmp_path / "merged.json"
    rc = _tool().merge([a, b], out)
    d = json.loads(out.read_text())
    assert [c["name"] for c in d["cells"]] == ["x/plain", "y/plain", "z/operator"]
    assert d["seconds"] == 12.0 and d["over_limit"] == 1  # 20 % > 9.4 % + 1 %: the z cell
    assert 0.0 < d["over_limit_expected"] < 2.0  # two accepted cells, each over its limit by chance rarely
    assert d["holm_min_p"] < 1e-3 and rc == 1  # z breaks the promise: the merged table is not ok
    md = out.with_suffix(".md").read_text()
    assert "3 cells, 2 with thresholds, 1 not ok" in md and md.count("\n| ") == 4  # header and 3 rows
