"""The pool test refuses a heavier-tailed group that would otherwise break its budget.

Ten groups of 100 units, one statistic: nine ``|N(0, 1)|``, one ``|t_2|``. Pooled with the
light groups at budget 1 %, the heavy group's threshold breaks its budget in nearly every
calibration (its exact rate is known), so the pool test must refuse it in nearly every
calibration; the light groups must keep pooling. (scipy's k-sample Anderson-Darling p-value
is floored at 0.001, so under Holm over ten groups it can never refuse at 0.01 by itself:
the one-sided tail-count test gives the combined test its power.)
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tolstat.calibration.engine import certify

REPS, UNITS, GROUPS = 12, 100, 10


@pytest.mark.slow
def test_pool_test_refuses_a_heavier_tailed_group_among_light_ones():
    rng = np.random.default_rng(11)
    labels = np.repeat([f"g{g}" for g in range(GROUPS)], UNITS)
    heavy_refused = light_pooled = 0
    for rep in range(REPS):
        t = np.concatenate([np.abs(rng.standard_t(2, UNITS))]
                           + [np.abs(rng.standard_normal(UNITS)) for _ in range(GROUPS - 1)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = certify({"T": t}, labels, fp_budget=0.01, on_refusal="record")
        heavy_refused += "g0" in res.refused
        light_pooled += sum(f"g{g}" in res.groups for g in range(1, GROUPS))
    # measured: refused in 192 of 200 calibrations (before the tail test: 21 of 200)
    assert heavy_refused >= REPS - 2
    assert light_pooled >= 0.9 * REPS * (GROUPS - 1)
