"""Shared fixtures of the test suite.

pytest puts this folder on ``sys.path`` (rootdir-relative "prepend" import mode), so the
helper modules here (``estimators_helpers``, ``_sim_families``) import directly; no test
edits ``sys.path`` for them.
"""

from __future__ import annotations

import numpy as np
import pytest

# numba and the tolstat modules that compile with it, imported before any test: an in-process
# pytester run drops the modules first imported during it, and numba's type registrations
# cannot run twice in one process ("duplicate registration for ..."), so numba's target is
# initialised here once (its first compilation imports every registry lazily)
import numba  # noqa: E402
import tolstat.checks.fast  # noqa: E402,F401
import tolstat.measure.noise  # noqa: E402,F401
import tolstat.models.estimators  # noqa: E402,F401

numba.njit(lambda x: x + 1)(1)


def fp16_mul3(x: np.ndarray) -> np.ndarray:
    """A float16 kernel: ``x * 3`` rounded to float16 (one rounding error per element)."""
    return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)


def fp16_mul3_ref(x: np.ndarray) -> np.ndarray:
    """The float64 reference of :func:`fp16_mul3` on the same float16 inputs."""
    return x.astype(np.float16).astype(np.float64) * 3.0


@pytest.fixture
def mul3():
    """``(kernel, reference)`` of the float16 ``x * 3`` example used across the tests."""
    return fp16_mul3, fp16_mul3_ref


@pytest.fixture(scope="module")
def torch_and_h5netcdf():
    """torch and h5netcdf imported before ``pytester`` snapshots ``sys.modules`` (request it
    before ``pytester``): an in-process pytester run drops the modules first imported during
    its test, and neither can be imported twice. Skips without torch."""
    pytest.importorskip("h5netcdf")
    return pytest.importorskip("torch")
