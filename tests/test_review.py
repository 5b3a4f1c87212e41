"""Reviewable tables (JSON layout, show, diff) and the explicit hardware policy."""

from __future__ import annotations

import difflib
import json

import numpy as np
import pytest

import tolstat
from tolstat.cli.main import main
from tolstat.calibration.hwpolicy import hardware_mismatch
from tolstat.calibration.review import diff_tables, show_table


def _group(op, dt, hw, thr, n=400):
    return {"op": op, "dtype": dt, "hardware": hw, "n": n, "statistics": {"max_abs": {
        "threshold": thr, "estimate": thr / 2, "budget": 0.01, "confidence": 0.95, "method": "order_statistic",
        "reason": "test", "tail": {}, "top_scores": [thr * 1.1, thr, thr / 2]}}}


def _table(groups):
    return tolstat.ToleranceTable.from_groups(
        groups, {"fp_budget": 0.01, "confidence": 0.95, "statistics": ["max_abs"],
                 "provenance": {"created": "2020-01-01T00:00:00+00:00", "host": "h", "pid": 1, "function": "x"}})


MIXED = _table([
    _group("mm", "float16", "cpu:intel xeon", 1.0),
    _group("mm", "float16", "*", 2.0),
    _group("mm", "float16", "cuda:NVIDIA H100", 3.0),
    _group("add", "float16", "cpu:intel xeon", 0.5),
    _group("add", "float16", "cuda:NVIDIA H100", 0.25),
    _group("*", "bfloat16", "cpu:intel xeon", 4.0),
])


@pytest.mark.parametrize("policy", ["exact", "pooled", "nearest", "error"])
def test_exact_hardware_comes_before_star(policy):
    e = MIXED.entry("mm", "fp16", "cpu:intel xeon", hardware_policy=policy)
    assert (e.hardware, e.fallback, e.statistics["max_abs"].threshold) == ("cpu:intel xeon", "exact", 1.0)
    e = MIXED.entry("mm", "fp16", "cuda:NVIDIA H100", hardware_policy=policy)
    assert e.statistics["max_abs"].threshold == 3.0


def test_policies_on_an_uncalibrated_machine():
    new = "cuda:NVIDIA H200"
    # a '*' group: every policy but exact uses it
    for policy in ("pooled", "nearest", "error"):
        e = MIXED.entry("mm", "float16", new, hardware_policy=policy)
        assert (e.hardware, e.fallback) == ("*", "any hardware")
    with pytest.raises(KeyError, match=r"cuda:NVIDIA H200.*hardware_policy='exact'.*cpu:intel xeon"):
        MIXED.entry("mm", "float16", new, hardware_policy="exact")
    # no '*' group for 'add'
    with pytest.raises(KeyError, match=r"this machine's hardware 'cuda:NVIDIA H200'.*'cpu:intel xeon', "
                                       r"'cuda:NVIDIA H100'"):
        MIXED.entry("add", "float16", new, hardware_policy="error")
    e = MIXED.entry("add", "float16", new, hardware_policy="nearest")
    assert e.hardware == "cuda:NVIDIA H100" and "nearest hardware" in e.fallback
    e = MIXED.entry("add", "float16", "cpu:amd epyc", hardware_policy="nearest")
    assert e.hardware == "cpu:intel xeon"  # same device kind first
    e = MIXED.entry("add", "float16", new, hardware_policy="pooled")
    assert e.hardware == "cpu:intel xeon" and e.fallback.startswith("pooled: loosest")  # largest threshold
    # op '*' default for a dtype, after the op's own groups
    e = MIXED.entry("mm", "bfloat16", "cpu:intel xeon", hardware_policy="exact")
    assert (e.op, e.fallback) == ("*", "default op, exact")
    kw = MIXED.to_assert_close_kwargs("cuda:NVIDIA H200", hardware_policy="nearest")
    assert kw[("add", "float16")] == {"atol": 0.25, "rtol": 0.0} and kw[("mm", "float16")]["atol"] == 2.0
    assert ("add", "float16") not in MIXED.to_assert_close_kwargs("cuda:NVIDIA H200", hardware_policy="error")
    with pytest.raises(ValueError, match="hardware_policy must be one of"):
        MIXED.entry("mm", "float16", new, hardware_policy="closest")


def test_policy_defaults_to_this_machine():
    hw = tolstat.dataset.hardware_fingerprint().label
    t = _table([_group("mm", "float16", hw, 1.0), _group("mm", "float16", "cuda:other", 9.0)])
    assert t.entry("mm", "float16", hardware_policy="exact").hardware == hw
    one = _table([_group("mm", "float16", "cuda:other", 9.0)])
    with pytest.raises(KeyError, match="on this machine's hardware"):
        one.entry("mm", "float16", hardware_policy="error")
    # without a policy the older rule stays: a one-hardware table applies anywhere
    assert one.entry("mm", "float16").fallback == "only hardware"


def test_hardware_mismatch_at_table_level():
    assert hardware_mismatch(["cpu:a"], "cpu:a", "exact") is None
    assert "cpu:b" in hardware_mismatch(["cpu:a"], "cpu:b", "error")
    assert hardware_mismatch(["cpu:a", "*"], "cpu:b", "error") is None
    assert hardware_mismatch(["cpu:a", "*"], "cpu:b", "exact") is not None
    assert hardware_mismatch(["cpu:a"], "cpu:b", "nearest") is None


def test_check_and_cli_take_the_policy(tmp_path, capsys):
    t = _table([_group("mm", "float16", "cpu:elsewhere", 1.0)])
    p = tmp_path / "t.json"
    t.to_json(p)
    x = np.zeros(8, np.float16)
    with pytest.raises(KeyError, match="hardware_policy='error'"):
        tolstat.check(x, x.astype(np.float64), op="mm", dtype="float16", table=t, hardware="cpu:here",
                      options=tolstat.CheckOptions(hardware_policy="error"))
    r = tolstat.check(x, x.astype(np.float64), op="mm", dtype="float16", table=t, hardware="cpu:here",
                      options=tolstat.CheckOptions(hardware_policy="nearest"))
    assert r.passed and "nearest hardware" in r.fallback and "nearest hardware" in r.message()
    np.save(tmp_path / "a.npy", x)
    np.save(tmp_path / "e.npy", x.astype(np.float64))
    args = ["check", str(tmp_path / "a.npy"), str(tmp_path / "e.npy"), "--op", "mm", "--dtype", "fp16",
            "--table", str(p), "--hardware", "cpu:here"]
    assert main(args) == 2
    assert "hardware_policy='error'" in capsys.readouterr().err
    assert main(args + ["--hardware-policy", "nearest"]) == 0


def test_json_layout_is_reviewable_and_round_trips(tmp_path):
    p = tmp_path / "t.json"
    text = MIXED.to_json(p)
    d = json.loads(text)
    assert list(d)[-2:] == ["groups", "volatile"]
    assert d["volatile"] == {"provenance.created": "2020-01-01T00:00:00+00:00", "provenance.host": "h",
                             "provenance.pid": 1}
    assert "created" not in d["provenance"] and d["provenance"]["function"] == "x"
    # groups sorted; top_scores on one line; user units
    assert [(g["op"], g["hardware"]) for g in d["groups"]][:2] == [("*", "cpu:intel xeon"), ("add", "cpu:intel xeon")]
    assert sum('"top_scores": [' in line for line in text.splitlines()) == len(MIXED)
    assert d["groups"][1]["user_units"] == {"statistic": "max_abs", "atol": 0.5, "rtol": 0.0, "at": {}}
    back = tolstat.load_table(p)
    assert back.to_json() == text  # the volatile block survives a round trip
    e0, e1 = MIXED.entry("mm", "float16", "*"), back.entry("mm", "float16", "*")
    assert e0.statistics["max_abs"].threshold == e1.statistics["max_abs"].threshold


def test_old_layout_still_loads(tmp_path):
    p = tmp_path / "old.json"
    p.write_text(json.dumps(MIXED.to_dict(), indent=1, sort_keys=True))  # the earlier writer
    t = tolstat.load_table(p)
    assert t.groups == MIXED.groups and t.meta["provenance"]["pid"] == 1


@pytest.fixture(scope="module")
def two_tables(tmp_path_factory):
    def kern(x):
        return np.cumsum(x.astype(np.float16)).astype(np.float16)

    def ref(x):
        return np.cumsum(x.astype(np.float16).astype(np.float64))

    def mk(rng):
        return tolstat.Inputs(args=(rng.standard_normal(int(rng.choice([32, 128]))),))

    ds = tolstat.concat([tolstat.collect(kern, ref, mk, op=op, dtype="float16", runs=500, hardware=hw,
                                         options=tolstat.CollectOptions(progress=False, op_model=False), seed=s)
                         for s, (op, hw) in enumerate([("cumsum", "cpu:a"), ("cumsum", "cpu:b"),
                                                       ("csum2", "cpu:a")])])
    keep = np.flatnonzero(np.random.default_rng(1).random(ds.sizes["run"]) > 0.1)
    d = tmp_path_factory.mktemp("tabs")
    old, new = d / "old.json", d / "new.json"
    tolstat.select(ds, form=None, fp_budget=0.02, statistic=("max_abs", "bias")).to_json(old)
    tolstat.select(ds.isel(run=keep), form=None, fp_budget=0.02, statistic=("max_abs", "bias")).to_json(new)
    return old, new


def test_show_and_diff_are_short(two_tables, capsys):
    old, new = two_tables
    assert main(["show", str(old)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "hardware: cpu:a, cpu:b"
    assert len(out) == 3 + 3 * 2  # header, hardware, column names, 3 groups x 2 statistics
    assert out[2].split() == ["op", "dtype", "hardware", "statistic", "threshold", "atol", "rtol", "method", "n"]
    row = next(line for line in out if line.startswith("cumsum") and "cpu:a" in line and "max_abs" in line)
    thr = tolstat.load_table(old).entry("cumsum", "float16", "cpu:a").statistics["max_abs"].threshold
    assert row.split()[4] == f"{thr:.4g}" and row.split()[5] == f"{thr:.4g}"  # max_abs: atol = threshold
    assert main(["diff", str(old), str(new)]) == 0
    diff = capsys.readouterr().out.splitlines()
    assert len(diff) < 50
    assert any("max_abs" in line and " -> " in line and "n 500 -> " in line for line in diff)
    # the JSON files themselves differ by a few lines per group (no per-score lines)
    a, b = old.read_text().splitlines(), new.read_text().splitlines()
    changed = [x for x in difflib.unified_diff(a, b, n=0) if x[:1] in "+-" and x[:3] not in ("+++", "---")]
    assert len(changed) < 30 * len(tolstat.load_table(old))


def test_diff_reports_added_removed_and_settings():
    a = _table([_group("mm", "float16", "cpu:a", 1.0), _group("add", "float16", "cpu:a", 1.0)])
    g = _group("mm", "float16", "cpu:a", 2.0)
    g["statistics"]["max_abs"]["method"] = "evt"
    b = tolstat.ToleranceTable.from_groups([g, _group("mul", "float16", "cpu:a", 1.0)],
                                           {"fp_budget": 0.001, "confidence": 0.95, "statistics": ["max_abs"]})
    text = diff_tables(a, b)
    assert "table fp_budget: 0.01 -> 0.001" in text
    assert any(line.lstrip().startswith("-  add") and "removed" in line for line in text.splitlines())
    assert any(line.lstrip().startswith("+  mul") and "added" in line for line in text.splitlines())
    mm = next(line for line in text.splitlines() if line.lstrip().startswith("~  mm"))
    assert "x2" in mm and "method order_statistic -> evt" in mm
    assert diff_tables(a, a, changed_only=True).endswith("0 changed (0 thresholds), 2 unchanged (group, statistic) entries")
    assert "add" in show_table(a)


def _diff_data():
    rng = np.random.default_rng(11)
    items = []
    for op in ("mm", "other"):
        for _ in range(400):
            e = rng.standard_normal(64)
            a = (e * (1 + 2e-4 * rng.standard_normal(64))).astype(np.float16)
            items.append((op, {"actual": a, "expected": e}))
    parts = [tolstat.from_pairs([it for o, it in items if o == op], op=op, dtype="float16", hardware="hw",
                                options=tolstat.CollectOptions(progress=False)) for op in ("mm", "other")]
    return tolstat.concat(parts)


def test_diff_counts_the_decisions_check_runs_flips(tmp_path, capsys):
    from tolstat.calibration.review import decision_changes

    ds = _diff_data()
    old = tolstat.select(ds, fp_budget=0.01, form="allclose")
    new = tolstat.select(ds, fp_budget=0.05, form="allclose")
    mm_only = tolstat.select(ds.isel(run=np.flatnonzero(np.asarray(ds["op"].values) == "mm")), fp_budget=0.05,
                             form="allclose")
    po, pn = tolstat.check_runs(ds, old), tolstat.check_runs(ds, new)
    ops = np.asarray(ds["op"].values).astype(str)
    changes = {c["op"]: c for c in decision_changes(old, new, ds)}
    for op in ("mm", "other"):
        m = ops == op
        c = changes[op]
        assert c["runs"] == int(m.sum())
        assert (c["fail_old"], c["fail_new"]) == (int((~po[m]).sum()), int((~pn[m]).sum()))
        assert c["now_fail"] == int((po[m] & ~pn[m]).sum()) and c["now_pass"] == int((~po[m] & pn[m]).sum())
    assert sum(c["now_fail"] for c in changes.values()) > 0  # the looser budget's thresholds fail more runs
    # a group the new table lacks: named, not counted
    c = {c["op"]: c for c in decision_changes(old, mm_only, ds)}["other"]
    assert c["fail_new"] is None and "no tolerance for op='other'" in c["why_new"]
    told, tnew, e = tmp_path / "o.json", tmp_path / "n.json", tmp_path / "e.nc"
    old.to_json(told)
    new.to_json(tnew)
    tolstat.save(ds, e)
    assert main(["diff", str(told), str(tnew), "--errors", str(e)]) == 0
    out = capsys.readouterr().out
    assert f"mm/float16/hw: 400 runs; fail {changes['mm']['fail_old']} -> {changes['mm']['fail_new']}" in out
