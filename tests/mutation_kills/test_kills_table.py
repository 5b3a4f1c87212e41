"""Mutants of ``tolstat.table`` that the other tests do not kill."""

from __future__ import annotations

import json

import tolstat

from table_helpers import group as _group, table as _table  # noqa: E402


def test_n_inexact_survives_a_json_round_trip(tmp_path):
    g = _group("op", "float32", "*", 1.0)
    g["n_inexact"] = 3
    t = _table([g, _group("op2", "float32", "*", 2.0)])
    t.to_json(tmp_path / "t.json")
    d = json.loads((tmp_path / "t.json").read_text())
    assert [x["n_inexact"] for x in d["groups"]] == [3, 0]
    back = tolstat.load_table(tmp_path / "t.json")
    assert back.data["n_inexact"].values.tolist() == [3, 0]
