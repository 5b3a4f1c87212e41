"""Mutants of ``tolstat.calibration.bounds`` that the other tests do not kill."""

from __future__ import annotations

import numpy as np

from tolstat.calibration.bounds import tail_fit


def _sample(n_distinct, seed):
    rng = np.random.default_rng(seed)
    base = rng.uniform(0, 1, 270)
    counts = np.full(n_distinct, 30 // n_distinct)
    counts[: 30 - counts.sum()] += 1  # 30 top runs (the exceedances), tied in n_distinct values
    top = np.repeat(1 + np.sort(rng.exponential(size=n_distinct)), counts)
    return np.concatenate([base, top])


def test_tail_fit_needs_ten_distinct_exceedances_and_accepts_ten():
    for n_distinct, seed in ((10, 1), (9, 1)):
        x = _sample(n_distinct, seed)
        f = tail_fit(x, 0.1, 30)
        xs = np.sort(x)
        nd = np.unique(xs[xs > f.tail["u"]] - f.tail["u"]).size
        assert nd == n_distinct  # the 30 top runs are the exceedances
        if nd < 10:
            assert f.why_not.startswith(f"only {nd} distinct values above the tail threshold")
        else:
            assert not f.why_not.startswith("only")
            assert np.isfinite(f.tail["gof_p"])  # it went on to the goodness-of-fit test
