"""The power report (tolstat.assess.power): what a table's decision, and the peers', catch."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tolstat
from tolstat._base.dtypes import round_to_format
from tolstat.assess.power import (
    WRONG_OUTPUTS,
    Reference,
    corpus_references,
    load_references,
    power_report,
    save_references,
    wrong_outputs,
)

ONE_PCT = {"name": "atol=rtol=1e-2", "atol": 1e-2, "rtol": 1e-2}


def _softmax_like(rng: np.random.Generator, n_long: float = 1e6) -> np.ndarray:
    """A block of a softmax over a long row of mild logits: values near 1/n_long (1e-6), all below 1e-5."""
    x = 0.5 * rng.standard_normal((2, 128))
    p = np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True)
    return p * (128 / n_long)


def _table(make_ref, dtype: str, noise: float, runs: int, op: str, seed: int = 0,
           **select_kw) -> tuple[tolstat.ToleranceTable, list[np.ndarray]]:
    """select on correct runs of fresh references (``make_ref(rng)``): each reference rounded
    to ``dtype`` after a relative error ``noise``; the table and its calibration references."""
    rng = np.random.default_rng(seed)
    refs = [make_ref(rng) for _ in range(runs)]
    pairs = [(round_to_format(e * (1 + noise * rng.standard_normal(e.shape)), dtype), e) for e in refs]
    ds = tolstat.from_pairs(pairs, op=op, dtype=dtype, hardware="test")
    return tolstat.select(ds, fp_budget=0.05, by=("op", "dtype"), **select_kw), refs


@pytest.fixture(scope="module")
def softmax_case():
    table, refs = _table(_softmax_like, "bfloat16", 1e-3, 60, "softmax", seed=1)
    refs = refs[:6]
    rep = power_report(table, {("softmax", "bfloat16"): refs}, peers=(ONE_PCT, "torch-defaults"))
    return refs, table, rep


def test_one_percent_passes_zeros_of_small_outputs_and_the_default_table_catches_them(softmax_case):
    refs, table, rep = softmax_case
    assert max(float(e.max()) for e in refs) < 1e-5
    caught = rep.data["caught"].sel(wrong="zeros")
    assert float(caught.sel(rule="atol=rtol=1e-2")[0]) == 0.0  # |0 - e| < 1e-5 <= 1e-2: every zero output passes
    assert float(caught.sel(rule="torch-defaults")[0]) == 0.0  # and <= torch's atol=1e-5 too
    assert float(caught.sel(rule="tolstat")[0]) == 1.0
    assert rep.trivial("atol=rtol=1e-2") == [("softmax", "bfloat16", "*")]
    assert rep.trivial("tolstat") == []
    assert float(rep.data["caught"].sel(rule="tolstat", wrong="mean")[0]) == 1.0
    assert "YES" in rep.caught_table() and "atol=rtol=1e-2: 1 of 1 groups pass" in rep.summary()


def test_the_report_decides_as_check_does(softmax_case):
    """The caught share of every standard wrong output is that of tolstat.check, output by output."""
    refs, table, rep = softmax_case
    fails = {k: [] for k in WRONG_OUTPUTS}
    for e in refs:
        for kind, out in wrong_outputs(e, "bfloat16").items():
            if np.any(tolstat.corpus.ulp_distance(out, round_to_format(e, "bfloat16")) > 1):
                fails[kind].append(not tolstat.check(out, e, op="softmax", dtype="bfloat16", table=table).passed)
    got = rep.data["caught"].sel(rule="tolstat").values[0]
    for j, kind in enumerate(WRONG_OUTPUTS):
        assert int(rep.data["n_wrong"].values[0, j]) == len(fails[kind]), kind
        if fails[kind]:
            assert got[j] == pytest.approx(np.mean(fails[kind])), kind
        else:
            assert math.isnan(got[j]), kind


def test_bisection_finds_the_closed_form_answer():
    """``|a - e| <= rtol*|e|`` first fails at a relative scale error ``rtol``; ``|a - e| <= atol`` at an
    offset ``atol / rms(e)``; a rule passing every size to the upper bound reports inf, one
    failing at the lower bound reports it."""
    def unit_rms(rng):
        x = rng.standard_normal((8, 16))
        return x / np.sqrt(np.mean(x ** 2))  # rms(e) = 1: the offset in units of rms is the offset

    table, refs = _table(unit_rms, "float32", 1e-7, 60, "toy", seed=2)
    refs = refs[:6]
    r, a = 1e-3, 2e-3
    peers = ({"name": "rtol", "rtol": r, "atol": 0.0}, {"name": "atol", "rtol": 0.0, "atol": a},
             {"name": "loose", "rtol": 20.0, "atol": 0.0}, {"name": "tight", "rtol": 1e-9, "atol": 0.0})
    rep = power_report(table, {("toy", "float32"): refs}, peers=peers, resolution=1.02)
    scale = rep.data["min_scale"].sel(group=0)
    offset = rep.data["min_offset"].sel(group=0)
    assert r * (1 - 1e-4) <= float(scale.sel(rule="rtol")) <= r * 1.02 * (1 + 1e-4)
    assert a * (1 - 1e-4) <= float(offset.sel(rule="atol")) <= a * 1.02 * (1 + 1e-4)
    assert math.isinf(float(scale.sel(rule="loose")))
    assert float(scale.sel(rule="tight")) == 1e-6  # caught at the lower bound already
    md = rep.smallest_table()
    assert "> 10" in md and "<= 1e-06" in md


def test_each_standard_wrong_output():
    e = np.arange(1.0, 13.0).reshape(3, 4)
    w = wrong_outputs(e, "float32", size=0.5)
    assert list(w) == list(WRONG_OUTPUTS)
    assert all(v.dtype == np.float32 for v in w.values())
    np.testing.assert_array_equal(w["zeros"], 0)
    np.testing.assert_array_equal(w["mean"], 6.5)
    np.testing.assert_array_equal(w["sign_flip"], -e)
    np.testing.assert_array_equal(w["roll_element"][:, 1:], e[:, :-1])
    np.testing.assert_array_equal(w["roll_element"][:, 0], e[:, -1])
    np.testing.assert_array_equal(w["roll_row"], e[[2, 0, 1]])
    np.testing.assert_array_equal(w["transpose_block"][:, :3], e[:, :3].T)  # the square 3x3 block
    np.testing.assert_array_equal(w["transpose_block"][:, 3], e[:, 3])
    np.testing.assert_array_equal(w["scale"], e * 1.5)
    np.testing.assert_allclose(w["offset"], e + 0.5 * np.sqrt(np.mean(e ** 2)), rtol=1e-7)
    np.testing.assert_array_equal(w["coarser"], round_to_format(e, "bfloat16").astype(np.float32))
    one_d = wrong_outputs(np.array([1.0, 1.001, 3.0]), "float16")
    assert "roll_row" not in one_d and "transpose_block" not in one_d
    np.testing.assert_array_equal(one_d["coarser"], np.array([1.0, 1.0, 3.0], np.float16))  # 1.001 rounds in bf16
    bf = wrong_outputs(np.array([1.0, 1.1, 300.0]), "bfloat16")["coarser"]
    np.testing.assert_array_equal(bf.astype(np.float64), [1.0, 1.125, 288.0])  # through float8_e4m3fn
    with pytest.raises(ValueError, match="size"):
        wrong_outputs(e, "float32", size=0.0)


def test_a_group_without_references_is_named(softmax_case):
    refs, table, _ = softmax_case
    with pytest.raises(ValueError, match=r"table group \(softmax, bfloat16, \*\) has no references"):
        power_report(table, {("softmax", "float16"): refs})
    with pytest.raises(ValueError, match=r"\(softmax, bfloat16, \*\) has no references"):
        power_report(table, {("softmax", "bfloat16"): []})
    with pytest.raises(ValueError, match="non-empty finite"):
        power_report(table, {("softmax", "bfloat16"): [np.array([np.nan])]})
    with pytest.raises(ValueError, match="coverage"):
        power_report(table, {("softmax", "bfloat16"): refs}, coverage=1.5)
    with pytest.raises(ValueError, match="needs calibration data"):
        power_report(table, {("softmax", "bfloat16"): refs}, peers=("study",))


@pytest.fixture(scope="module")
def operator_case():
    """An operator-form table of a corpus op and its calibration references (magnitude and K)."""
    from tolstat.assess.corpus_runs import calibration_dataset
    from tolstat.assess.evaluation import EvalConfig

    cfg = EvalConfig(ops=["matmul"], dtypes=("float16",), n_cal=40, quick=True)
    cal = calibration_dataset(cfg, progress=False)
    table = tolstat.select(cal, fp_budget=0.1, by=("op", "dtype"), cluster="case")
    return table, corpus_references(["matmul"], ["float16"], n=4)


def test_operator_form_groups_get_magnitude_and_K_and_decide_as_check(operator_case):
    from tolstat.checks.options import CheckOptions

    table, refs = operator_case
    assert table.entry("matmul", "float16").operator
    rep = power_report(table, refs, peers=(), size=1e-3)
    got = rep.data["caught"].sel(rule="tolstat").values[0]
    for j, kind in enumerate(WRONG_OUTPUTS):
        fails = []
        for r in refs[("matmul", "float16")]:
            out = wrong_outputs(r.expected, "float16", size=1e-3).get(kind)
            if out is not None and np.any(tolstat.corpus.ulp_distance(out, round_to_format(r.expected, "float16")) > 1):
                res = tolstat.check(out, r.expected, op="matmul", dtype="float16", table=table,
                                    options=CheckOptions(magnitude=r.magnitude), covariates={"K": r.covariates["K"]})
                fails.append(not res.passed)
        assert (got[j] == pytest.approx(np.mean(fails))) if fails else math.isnan(got[j]), kind
    no_mag = {k: [Reference(r.expected, None, r.covariates) for r in v] for k, v in refs.items()}
    with pytest.raises(ValueError, match=r"\(matmul, float16, \*\).*magnitude"):
        power_report(table, no_mag)


def test_references_round_trip_through_npz(tmp_path, operator_case):
    _, refs = operator_case
    back = load_references(save_references(refs, tmp_path / "refs.npz"))
    assert list(back) == [("matmul", "float16")]
    for a, b in zip(refs[("matmul", "float16")], back[("matmul", "float16")]):
        np.testing.assert_array_equal(a.expected, b.expected)
        np.testing.assert_array_equal(a.magnitude, b.magnitude)
        assert dict(a.covariates) == dict(b.covariates)


def test_show_prints_the_power_and_warns_on_a_table_that_passes_zeros(tmp_path, capsys):
    from tolstat.cli.main import main

    table, refs = _table(_softmax_like, "bfloat16", 1e-3, 60, "softmax", seed=3)
    npz = save_references({("softmax", "bfloat16"): refs[:3]}, tmp_path / "refs.npz")
    good = tmp_path / "good.nc"
    table.to_netcdf(good)
    assert main(["show", str(good), "--power", "--references", str(npz)]) == 0
    out, err = capsys.readouterr()
    assert "scale: tolstat" in out and "torch-defaults" in out and "warning" not in err
    # "correct" runs as wrong as the values themselves: a threshold that zeros pass
    loose = tmp_path / "loose.nc"
    _table(_softmax_like, "bfloat16", 3.0, 60, "softmax", seed=3, form="allclose")[0].to_netcdf(loose)
    assert main(["show", str(loose), "--power", "--references", str(npz)]) == 0
    out, err = capsys.readouterr()
    assert "warning: group (softmax, bfloat16, *)" in err and "all-zero or constant" in err
    assert main(["show", str(good), "--power"]) == 2
    assert "--corpus" in capsys.readouterr().err


def test_show_power_on_the_corpus(tmp_path, capsys, operator_case):
    from tolstat.cli.main import main

    table, _ = operator_case
    path = tmp_path / "matmul.nc"
    table.to_netcdf(path)
    assert main(["show", str(path), "--corpus", "--n-refs", "1"]) == 0
    out = capsys.readouterr().out
    assert "| matmul | float16 | 1 |" in out and "offset: atol=rtol=1e-2" in out
    toy = tmp_path / "toy.nc"
    _table(lambda r: r.standard_normal(8), "float32", 1e-7, 60, "toy", seed=4)[0].to_netcdf(toy)
    assert main(["show", str(toy), "--corpus"]) == 2
    assert "ops the corpus does not have: ['toy']" in capsys.readouterr().err
