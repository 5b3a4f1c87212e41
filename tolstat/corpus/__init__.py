"""An embedded CPU kernel corpus: low-precision kernels, their float64 references and
LLM-style bugs.

The kernels are numpy emulations of GPU kernels in float16 and bfloat16: inputs and
outputs in the storage dtype, tiled like Triton/CUDA kernels, float32 accumulation where
GPU kernels use it, and a round-to-nearest-even store wherever a GPU kernel stores or
converts a value. Every operator has at least two correct variants that differ the way real
libraries differ (tile sizes, split-K, online vs multi-pass softmax, Welford vs two-pass
variance, ...), and a set of bugs, each a one-line mutation of one correct variant.

Examples
--------
>>> from tolstat.corpus import OPS, BUGS, cases, run_kernel
>>> case = cases("matmul", "float16", n=1, seed=0)[0]
>>> out = run_kernel(OPS["matmul"].variants["tiled_bk32"], case, "float16")
>>> ref = OPS["matmul"].reference(case, "float16")
>>> bug = BUGS["matmul_acc_assign"]
>>> buggy = run_kernel(bug.kernel, case, "float16")
>>> correct = run_kernel(OPS[bug.op].variants[bug.base], case, "float16")

Public API
----------
OPS : dict of str to OpSpec
    Operators (matmul, bmm, linear, conv1d, softmax, log_softmax, layer_norm, rms_norm,
    attention, gelu, silu, mean, cumsum).
BUGS : dict of str to BugSpec
    Bug kinds, each tied to an op and to the correct variant it mutates (``base``).
Case
    One generated input (float64 "true" inputs, labels, covariates, seed).
cases(op, dtype, n=..., seed=..., quick=False)
    Deterministic cases cycling over shapes, distributions and input scales (1, 10, 100).
run_kernel(kernel, case, dtype)
    Cast the inputs to dtype, run a kernel, return its output in dtype.
run_magnitude(case, dtype)
    The op on absolute inputs (float64), for the operator noise model
    (:mod:`tolstat.measure.noise`); ``MAGNITUDES`` maps op -> function, ``ROWWISE`` names the
    row-wise ops.
"""

from tolstat.corpus._base import (
    BUGS,
    CATEGORIES,
    DISTS,
    DTYPES,
    OPS,
    SCALES,
    BugSpec,
    Case,
    OpSpec,
    cases,
    iter_cases,
    cast,
    grid,
    make_case,
    np_dtype,
    run_kernel,
    run_reference,
    store_trunc,
    ulp_distance,
)

# registration order: the modules fill OPS and BUGS on import
from tolstat.corpus import _linalg, _rowwise, _attention, _pointwise  # noqa: E402,F401
from tolstat.corpus._magnitude import MAGNITUDES, ROWWISE, run_magnitude  # noqa: E402

__all__ = [
    "OPS",
    "BUGS",
    "Case",
    "OpSpec",
    "BugSpec",
    "cases",
    "iter_cases",
    "run_kernel",
    "run_reference",
    "make_case",
    "grid",
    "cast",
    "np_dtype",
    "store_trunc",
    "ulp_distance",
    "DTYPES",
    "DISTS",
    "SCALES",
    "CATEGORIES",
    "timings",
    "MAGNITUDES",
    "ROWWISE",
    "run_magnitude",
]


def timings(n: int = 24, seed: int = 0, dtypes=("float16", "bfloat16"), reference=True):
    """Mean wall time per call of every kernel of every op.

    Parameters
    ----------
    n : int
        Cases per (op, dtype) (cycled over the full shape grid).
    seed : int
    dtypes : sequence of str
    reference : bool
        Also time the float64 reference.

    Returns
    -------
    dict
        ``{op: {"variants": ms, "bugs": ms, "reference": ms}}``: mean milliseconds per
        call, over dtypes, cases and kernels.
    """
    import time

    out = {}
    for op, spec in OPS.items():
        tv = tb = tr = 0.0
        cv = cb = cr = 0
        bugs = [b for b in BUGS.values() if b.op == op]
        for dt in dtypes:
            for case in cases(op, dt, n=n, seed=seed):
                for k in spec.variants.values():
                    t0 = time.perf_counter()
                    run_kernel(k, case, dt)
                    tv += time.perf_counter() - t0
                    cv += 1
                for b in bugs:
                    t0 = time.perf_counter()
                    run_kernel(b.kernel, case, dt)
                    tb += time.perf_counter() - t0
                    cb += 1
                if reference:
                    t0 = time.perf_counter()
                    spec.reference(case, dt)
                    tr += time.perf_counter() - t0
                    cr += 1
        out[op] = {"variants": 1e3 * tv / max(cv, 1), "bugs": 1e3 * tb / max(cb, 1),
                   "reference": 1e3 * tr / max(cr, 1)}
    return out
