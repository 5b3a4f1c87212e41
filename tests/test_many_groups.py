"""Cost linear in the number of groups: a table of pooled groups records each pool once,
and the pool tests do not rebuild the rest of the pool for each member."""

import numpy as np
import pytest

import tolstat


def _groups(n_groups: int, runs: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    n = n_groups * runs
    e = rng.standard_normal((n, 8))
    a = (e + rng.standard_normal((n, 8)) * 1e-3).astype(np.float16)
    ds = tolstat.from_pairs([(a[i], e[i]) for i in range(n)], op="x", dtype="fp16",
                            options=tolstat.CollectOptions(sample_size=8))
    return ds.assign_coords(op=("run", np.array([f"op{i // runs}" for i in range(n)])))


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    d = tmp_path_factory.mktemp("many")
    out = {}
    for g in (40, 80):
        t = tolstat.select(_groups(g), fp_budget=0.05)
        p = d / f"t{g}.json"
        t.to_json(p)
        out[g] = (t, p)
    return out


def test_a_table_of_pooled_groups_grows_linearly_with_its_groups(tables):
    (t40, p40), (_, p80) = tables[40], tables[80]
    assert all(t40.entry(f"op{i}", "fp16").statistics["max_score"].method == "pooled_order_statistic"
               for i in range(40))
    ratio = p80.stat().st_size / p40.stat().st_size
    assert ratio < 2.2, f"twice the groups made the table {ratio:.2f}x larger (each group lists its pool?)"


def test_a_pooled_group_names_its_pool_and_the_members_are_listed_once(tables):
    t, p = tables[40]
    back = tolstat.load_table(p)
    pool = back.entry("op3", "fp16").certificate["pool"]
    assert set(pool) == {"id", "size"} and pool["id"].startswith("pool:") and pool["size"] == 40
    members = back.pool_members(pool)
    assert len(members) == 40 and ("op3", "float16", back.groups[0][2]) in members
    assert members == t.pool_members(pool["id"])
    text = p.read_text()
    assert text.count(pool["id"]) == 80  # 40 pooled groups name it, 40 members list it
    with pytest.raises(ValueError, match="pool must be a pool id"):
        back.pool_members("op3")


def test_a_table_with_an_inline_pool_list_still_loads(tables, tmp_path):
    t, _ = tables[40]
    d = t.to_dict()
    labels = [f"({op}, {dt}, {hw})" for op, dt, hw in t.groups]
    for g in d["groups"]:
        g["certificate"]["pool"] = labels  # the layout of tables written before pools were referenced
        g["certificate"].pop("member_of", None)
    old = tolstat.ToleranceTable.from_groups(d["groups"], d)
    p = tmp_path / "old.json"
    old.to_json(p)
    back = tolstat.load_table(p)
    assert back.pool_members(back.entry("op0", "fp16").certificate["pool"]) == t.groups
    for bad in ({"id": "x", "size": 3}, {"id": "pool:ab", "size": 0}, [1, 2]):
        d["groups"][0]["certificate"]["pool"] = bad
        with pytest.raises(ValueError, match="certificate pool must be"):
            tolstat.ToleranceTable.from_groups(d["groups"], d)


def test_the_pool_tests_of_many_groups_do_not_rebuild_the_rest_for_each_member(monkeypatch):
    import tolstat.calibration.pooling as pooling

    calls = []
    ref = pooling._pool_p
    monkeypatch.setattr(pooling, "_pool_p", lambda x, rest: calls.append(rest.size) or ref(x, rest))
    t = tolstat.select(_groups(30, runs=12, seed=1), fp_budget=0.05)
    assert t.entry("op0", "fp16").statistics["max_score"].method == "pooled_order_statistic"
    assert calls == [], f"{len(calls)} members tested against a rebuilt rest of the pool"


def test_a_hardware_policy_lookup_reads_only_the_groups_of_its_op_and_dtype():
    from tolstat.calibration.hwpolicy import resolve_group

    groups = [(f"op{i}", "float16", f"gpu{j}") for i in range(50) for j in range(3)]

    class NoScan(list):
        def __iter__(self):
            raise AssertionError("the lookup scanned every group of the table")

    index = {k: i for i, k in enumerate(groups)}
    by = {}
    for k in groups:
        by.setdefault(k[:2], []).append(k)
    thr = [float(i % 7) for i in range(len(groups))]
    for policy, want in (("nearest", "gpu0"), ("pooled", None)):
        i, how = resolve_group(NoScan(groups), thr, "op7", "float16", "gpu9", policy, index=index, by_op_dtype=by)
        assert groups[i][0] == "op7" and (want is None or groups[i][2] == want), how
        assert (i, how) == resolve_group(groups, thr, "op7", "float16", "gpu9", policy)
