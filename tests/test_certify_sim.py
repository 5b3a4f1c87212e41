"""Coverage simulation of the certified thresholds (``tolstat.calibration.engine``), truth known.

For each cell (family, runs, groups, budget, statistics) the rate of calibrations whose TRUE
false-positive rate exceeds the budget must be at most ``1 - confidence`` plus two
Monte-Carlo standard errors; refusals are counted apart, and cells where the units suffice
must get thresholds (the simulation cannot pass by refusing). The default run checks a
subset; the full grid (``benchmarks/coverage_table.py`` writes its table) is marked slow.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _certify_sim import check_cell, grid, run_cell, table  # noqa: E402


@pytest.mark.parametrize("cell", grid(full=False), ids=lambda c: f"{c[0]}-n{c[1]}-g{c[2]}-a{c[3]:g}-j{c[4]}")
@pytest.mark.slow
def test_coverage_default_subset(cell):
    f, n, g, b, j, r = cell
    c = run_cell(f, n, b, n_stats=j, groups=g, repeats=r)
    assert c.accepted > 0, c  # every cell of the subset should get thresholds
    assert not check_cell(c), check_cell(c)


@pytest.mark.parametrize("n_stats", [1, 2])
@pytest.mark.slow
def test_ten_groups_of_thirty_exchangeable_all_get_thresholds(n_stats):
    """10 groups x 30 runs, exchangeable scores: no group refused (up to the test's level)."""
    c = run_cell("scale mixture (0.5/1/2)", 30, 1e-2, groups=10, repeats=100, n_stats=n_stats)
    assert c.refused <= 3, c
    assert c.methods == ("pooled_order_statistic",)
    assert not check_cell(c), check_cell(c)


def test_too_few_units_are_refused_not_guessed():
    c = run_cell("clustered 3 variants", 300, 1e-2, repeats=20)  # 100 clusters < 299
    assert c.refused == c.repeats and not c.expected


@pytest.mark.slow
def test_coverage_full_grid():
    # a fifth of the table's repeats for single groups, half for pools (keeps it near 1.5 min)
    cells = [run_cell(f, n, b, n_stats=j, groups=g, repeats=max(10, r // (5 if g == 1 else 2)))
             for f, n, g, b, j, r in grid()]
    print("\n" + table(cells))
    problems = [p for c in cells for p in check_cell(c)]
    assert not problems, problems
