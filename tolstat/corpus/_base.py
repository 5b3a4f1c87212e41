"""Core types of the kernel corpus: cases, op and bug specs, dtype helpers, input draws.

Numerics model
--------------
Every kernel receives its inputs already stored in the target dtype (``float16`` or
``bfloat16``) and returns its output in that dtype. Inside, kernels emulate what a GPU
kernel does: values are loaded and widened to ``float32`` (exact), arithmetic happens in
``float32`` (with float32 accumulation where GPU kernels use it), and a value is rounded
to the storage dtype (round to nearest even) exactly where a GPU kernel stores it to
memory or converts it for a tensor-core operand.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import ml_dtypes
import numpy as np

from tolstat._base.dtypes import round_to_format, store_float16, widen_float16

__all__ = [
    "DTYPES",
    "CATEGORIES",
    "Case",
    "OpSpec",
    "BugSpec",
    "OPS",
    "BUGS",
    "np_dtype",
    "cast",
    "store",
    "store_trunc",
    "ulp_distance",
    "cases",
    "make_case",
    "run_kernel",
    "run_reference",
    "grid",
]

F32 = np.float32
F64 = np.float64

#: Supported storage dtypes (canonical name -> numpy dtype).
DTYPES: dict[str, np.dtype] = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}

#: Bug categories. ``subtle``: error near rounding noise on typical inputs;
#: ``shape-dependent``: bitwise exact at some shapes (see ``BugSpec.exact_when``);
#: ``gross``: large error wherever it triggers.
CATEGORIES = ("subtle", "shape-dependent", "gross")

#: The value distributions every op draws from (some ops add more).
DISTS = ("normal", "scaled_normal", "uniform_pos", "outliers")
#: Input scales (multiplier of the distribution's unit magnitude).
SCALES = (1.0, 10.0, 100.0)

# (mantissa bits incl. implicit, min normal exponent of frexp, max finite, subnormal step)
_FORMAT = {
    "float16": (11, -13, 65504.0, 2.0**-24),
    "bfloat16": (8, -125, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), 2.0**-133),
}


def np_dtype(dtype: str | np.dtype | type) -> np.dtype:
    """Map a dtype spelling to the numpy dtype of a supported storage format.

    Parameters
    ----------
    dtype : str or dtype-like
        ``"float16"``/``"fp16"``/``"half"``, ``"bfloat16"``/``"bf16"``, or the numpy /
        ml_dtypes dtype itself.

    Returns
    -------
    numpy.dtype

    Raises
    ------
    ValueError
        For any other dtype.
    """
    aliases = {"fp16": "float16", "half": "float16", "f16": "float16",
               "bf16": "bfloat16"}
    if isinstance(dtype, str):
        name = aliases.get(dtype.lower(), dtype.lower())
        if name in DTYPES:
            return DTYPES[name]
        raise ValueError(f"unsupported dtype {dtype!r}; use one of {sorted(DTYPES)}")
    dt = np.dtype(dtype)
    for v in DTYPES.values():
        if dt == v:
            return v
    raise ValueError(f"unsupported dtype {dtype!r}; use one of {sorted(DTYPES)}")


def _name(dtype: str | np.dtype | type) -> str:
    dt = np_dtype(dtype)
    return next(k for k, v in DTYPES.items() if v == dt)


def smallest_subnormal(dtype: str | np.dtype) -> float:
    """Spacing of the dtype's numbers near zero (its smallest subnormal)."""
    return _FORMAT[_name(dtype)][3]


def cast(x: np.ndarray, dtype: str | np.dtype) -> np.ndarray:
    """Round a float64 (or float32) array to a storage dtype, correctly (nearest even).

    :func:`tolstat._base.dtypes.round_to_format` with IEEE overflow to infinity: both
    formats are rounded once (ml_dtypes' own float64 -> bfloat16 cast rounds twice).

    Parameters
    ----------
    x : numpy.ndarray
        Values to round.
    dtype : str or dtype
        Target storage dtype.

    Returns
    -------
    numpy.ndarray
        Array of the storage dtype.
    """
    name = _name(dtype)
    x = np.asarray(x)
    if x.dtype == DTYPES[name]:
        return x.copy()
    return round_to_format(x, name, overflow="inf")


def store(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Store a float32 value to memory in ``dtype``: round to nearest even."""
    x = np.asarray(x, dtype=F32)
    return store_float16(x) if np.dtype(dtype) == np.float16 else x.astype(dtype)


def store_trunc(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Store a float32 value in ``dtype`` rounding toward zero (a *bug*, not a variant).

    Overflow saturates to the largest finite value, as truncation does.
    """
    x = np.asarray(x, dtype=F32)
    r = x.astype(dtype)
    with np.errstate(invalid="ignore"):
        away = np.abs(r.astype(F32)) > np.abs(x)
    bits = r.view(np.uint16).copy()
    bits[away] -= 1  # one step toward zero on the sign-magnitude line
    return bits.view(dtype)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise ULP distance between two arrays of the same 16-bit storage dtype.

    ``-0`` and ``+0`` are the same point; NaN against NaN is 0, NaN against anything
    else is ``inf`` (:func:`tolstat.measure.metrics.ulp_distance` in the arrays' own dtype).

    Parameters
    ----------
    a, b : numpy.ndarray
        Arrays of the same 16-bit float dtype and shape.

    Returns
    -------
    numpy.ndarray
        float64 distances.
    """
    if a.dtype != b.dtype or a.dtype.itemsize != 2:
        raise TypeError("ulp_distance needs two arrays of the same 16-bit dtype")
    from tolstat.measure.metrics import ulp_distance as _ulp

    return _ulp(a, b, a.dtype)


@dataclass(eq=False)
class Case:
    """One generated input of an op.

    Attributes
    ----------
    op : str
        Operator name (a key of ``OPS``).
    inputs : dict of str to numpy.ndarray
        The "true" inputs in float64. Kernels see them rounded to the storage dtype
        (:func:`run_kernel` does that cast); the reference uses the rounded values too.
    labels : dict of str to str
        ``shape`` (output shape, ``"16x64"``), ``dist``, ``scale``, ``dims`` (all
        problem dimensions, ``"M=16,K=127,N=64"``) and op-specific labels (``causal``).
        The kernel variant is not a property of the case; the caller adds ``variant``.
    covariates : dict of str to float
        What drives rounding error: ``K`` (reduction length), ``scale`` (input scale)
        and op-specific ones (``D``, ``N``...).
    seed : int
        Seed of the input draw: ``make_case(op, dims, dist, scale, seed)`` regenerates
        the same inputs.
    dims : dict of str to int
        Problem dimensions.
    params : dict
        Non-array kernel arguments (``eps``, ``causal``) passed to every kernel and to
        the reference.
    """

    op: str
    inputs: dict[str, np.ndarray]
    labels: dict[str, str]
    covariates: dict[str, float]
    seed: int
    dims: dict[str, int] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    #: rounded inputs per dtype, made once per case (the inputs are not changed after the draw)
    _casts: dict[str, dict[str, np.ndarray]] = field(default_factory=dict, init=False, repr=False)

    def cast_inputs(self, dtype: str | np.dtype) -> dict[str, np.ndarray]:
        """The inputs as the kernel sees them: rounded to ``dtype`` (fresh arrays)."""
        return {k: v.copy() for k, v in self._cast(dtype).items()}

    def _cast(self, dtype: str | np.dtype) -> dict[str, np.ndarray]:
        """The rounded inputs, shared: callers must not write to them."""
        name = _name(dtype)
        got = self._casts.get(name)
        if got is None or got.keys() != self.inputs.keys():
            got = self._casts[name] = {k: cast(v, name) for k, v in self.inputs.items()}
        return got


Kernel = Callable[..., np.ndarray]


@dataclass(eq=False)
class OpSpec:
    """An operator of the corpus.

    Attributes
    ----------
    name : str
        Operator name.
    reference : callable
        ``reference(case, dtype) -> float64 ndarray``: the exact (float64) result for
        the inputs *as rounded to dtype*, so that it measures kernel error, not input
        quantisation.
    variants : dict of str to callable
        Correct kernels, ``kernel(**inputs_in_dtype, **case.params) -> ndarray`` in the
        inputs' dtype. They differ where real libraries differ (tiles, accumulation
        order, online vs multi-pass, split-K).
    make_case : callable
        ``make_case(dims, dist, scale, seed) -> Case``.
    configs : list of dict
        The shape grid (problem dimensions) that :func:`cases` cycles over.
    quick_configs : list of dict
        A small subset of ``configs`` for fast tests.
    dists : tuple of str
        Value distributions that :func:`cases` cycles over.
    scales : tuple of float
        Input scales.
    description : str
        One line: what the op computes and how the kernels are organised.
    """

    name: str
    reference: Callable[[Case, str], np.ndarray]
    variants: dict[str, Kernel]
    make_case: Callable[..., Case]
    configs: list[dict[str, int]] = field(default_factory=list)
    quick_configs: list[dict[str, int]] = field(default_factory=list)
    dists: tuple[str, ...] = DISTS
    scales: tuple[float, ...] = SCALES
    description: str = ""


@dataclass(eq=False)
class BugSpec:
    """An LLM-style bug: a mutation of one correct kernel.

    Attributes
    ----------
    name : str
        Bug name (unique across ops).
    op : str
        The operator it belongs to.
    kernel : callable
        The buggy kernel, same signature as the correct variants.
    description : str
        One line: what was mutated.
    category : str
        One of ``CATEGORIES``: ``subtle``, ``shape-dependent`` or ``gross``.
    base : str
        Name of the correct variant it mutates (its paired correct kernel).
    exact_when : callable or None
        ``exact_when(case) -> bool``: True where the bug is claimed to be bitwise equal to
        ``base`` (tested); None if no such claim.
    trigger : str
        When the bug shows, in words.
    """

    name: str
    op: str
    kernel: Kernel
    description: str
    category: str
    base: str = ""
    exact_when: Callable[[Case], bool] | None = None
    trigger: str = ""


#: op name -> OpSpec
OPS: dict[str, OpSpec] = {}
#: bug name -> BugSpec
BUGS: dict[str, BugSpec] = {}


def register_op(spec: OpSpec) -> OpSpec:
    if spec.name in OPS:
        raise ValueError(f"op {spec.name!r} registered twice")
    if len(spec.variants) < 2:
        raise ValueError(f"op {spec.name!r} needs at least 2 correct variants")
    OPS[spec.name] = spec
    return spec


def register_bug(spec: BugSpec) -> BugSpec:
    if spec.name in BUGS:
        raise ValueError(f"bug {spec.name!r} registered twice")
    if spec.category not in CATEGORIES:
        raise ValueError(f"bug {spec.name!r}: category {spec.category!r}")
    op = OPS[spec.op]
    if spec.base not in op.variants:
        raise ValueError(f"bug {spec.name!r}: unknown base variant {spec.base!r}")
    BUGS[spec.name] = spec
    return spec


# ----------------------------------------------------------------------------- inputs

def draw(rng: np.random.Generator, shape: tuple[int, ...], dist: str, scale: float,
         unit: float = 1.0) -> np.ndarray:
    """Draw a float64 array of one value distribution.

    Parameters
    ----------
    rng : numpy.random.Generator
    shape : tuple of int
    dist : str
        ``normal``: N(0, 1). ``scaled_normal``: N(0, 1) times a per-row factor
        10**U(-3, 0) (rows of very different magnitude, like real activations; rows are
        all but the last axis). ``uniform_pos``: U(0, 1). ``outliers``: N(0, 1) with 1% of
        entries replaced by +-U(8, 16). ``offset``: 3 + 0.02 N(0, 1) (a large common mean
        over a small spread, the hard case for variance).
    scale : float
        Multiplier.
    unit : float
        Extra multiplier (e.g. 1/sqrt(K) weight init), applied with ``scale``.
    """
    if dist == "normal":
        x = rng.standard_normal(shape)
    elif dist == "scaled_normal":
        x = rng.standard_normal(shape)
        fshape = shape[:-1] + (1,) if len(shape) > 1 else shape
        x = x * 10.0 ** rng.uniform(-3.0, 0.0, fshape)
    elif dist == "uniform_pos":
        x = rng.uniform(0.0, 1.0, shape)
    elif dist == "outliers":
        x = rng.standard_normal(shape)
        hit = rng.random(shape) < 0.01
        x = np.where(hit, rng.choice([-1.0, 1.0], shape) * rng.uniform(8.0, 16.0, shape), x)
    elif dist == "offset":
        x = 3.0 + 0.02 * rng.standard_normal(shape)
    else:
        raise ValueError(f"unknown dist {dist!r}")
    return x * (scale * unit)


def _shape_str(shape: tuple[int, ...]) -> str:
    return "x".join(str(int(s)) for s in shape)


def new_case(op: str, dims: Mapping[str, int], dist: str, scale: float, seed: int,
             inputs: dict[str, np.ndarray], out_shape: tuple[int, ...], K: float,
             extra_labels: Mapping[str, str] | None = None,
             extra_cov: Mapping[str, float] | None = None,
             params: Mapping[str, Any] | None = None) -> Case:
    """Assemble a :class:`Case` with the standard labels and covariates."""
    labels = {"shape": _shape_str(out_shape), "dist": dist, "scale": f"{scale:g}",
              "dims": ",".join(f"{k}={v}" for k, v in dims.items())}
    labels.update(extra_labels or {})
    cov = {"K": float(K), "scale": float(scale)}
    cov.update({k: float(v) for k, v in (extra_cov or {}).items()})
    return Case(op=op, inputs=inputs, labels=labels, covariates=cov, seed=int(seed),
                dims=dict(dims), params=dict(params or {}))


def grid(op: str, quick: bool = False) -> list[tuple[dict[str, int], str, float]]:
    """The (dims, dist, scale) combinations of an op in the order :func:`cases` uses.

    The order is balanced: the first ``len(configs)`` entries visit every shape once and
    cycle through scales and dists, and the full grid is a bijection onto the product.
    """
    spec = OPS[op]
    configs = spec.quick_configs if quick else spec.configs
    ns, nsc, nd = len(configs), len(spec.scales), len(spec.dists)
    out = []
    for i in range(ns * nsc * nd):
        a = i % ns
        b = (i // ns) % nsc
        c = i // (ns * nsc)
        out.append((configs[a], spec.dists[(c + a + b) % nd], spec.scales[(b + a) % nsc]))
    return out


def _case_seed(op: str, seed: int, i: int) -> int:
    ss = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, i, zlib.crc32(op.encode())])
    return int(ss.generate_state(1, np.uint64)[0] >> np.uint64(1))


def make_case(op: str, dims: Mapping[str, int], dist: str, scale: float, seed: int) -> Case:
    """Generate one case of ``op`` (see :attr:`OpSpec.make_case`)."""
    return OPS[op].make_case(dict(dims), dist, float(scale), int(seed))


def cases(op: str, dtype: str, *, n: int, seed: int, quick: bool = False) -> list[Case]:
    """Generate ``n`` deterministic cases of an op.

    Cycles over the op's shape grid, value distributions and input scales (see
    :func:`grid`); once the grid is exhausted it starts again with fresh values.

    Parameters
    ----------
    op : str
        Operator name.
    dtype : str
        Storage dtype the cases are meant for (validated). The float64 inputs do not
        depend on it, so float16 and bfloat16 runs of the same seed are paired.
    n : int
        Number of cases.
    seed : int
        Seed; the same (op, n, seed, quick) always gives the same cases.
    quick : bool
        Use the op's small shape subset.

    Returns
    -------
    list of Case
    """
    return list(iter_cases(op, dtype, n=n, seed=seed, quick=quick))


def iter_cases(op: str, dtype: str, *, n: int, seed: int, quick: bool = False) -> Iterator[Case]:
    """:func:`cases` one at a time (each case's inputs are made when it is reached), for
    loops that need not hold every case's inputs at once."""
    np_dtype(dtype)
    if op not in OPS:
        raise KeyError(f"unknown op {op!r}; known: {sorted(OPS)}")
    g = grid(op, quick)

    def gen() -> Iterator[Case]:
        for i in range(int(n)):
            dims, dist, scale = g[i % len(g)]
            yield make_case(op, dims, dist, scale, _case_seed(op, seed, i))

    return gen()


def run_kernel(kernel: Kernel, case: Case, dtype: str) -> np.ndarray:
    """Run a kernel on a case in a storage dtype.

    The float64 inputs are rounded to ``dtype`` (that cast belongs to the kernel's world),
    the kernel is called as ``kernel(**inputs, **case.params)``, and its output is
    returned in ``dtype``.

    Parameters
    ----------
    kernel : callable
        A correct variant (``OPS[op].variants[name]``) or a bug (``BUGS[name].kernel``).
    case : Case
    dtype : str
        ``"float16"`` or ``"bfloat16"``.

    Returns
    -------
    numpy.ndarray
        Output of dtype ``dtype``.
    """
    dt = np_dtype(dtype)
    with np.errstate(all="ignore"):
        out = kernel(**case.cast_inputs(dt), **case.params)
    out = np.asarray(out)
    if out.dtype != dt:
        raise TypeError(f"kernel returned {out.dtype}, expected {dt}")
    return out


def run_reference(case: Case, dtype: str) -> np.ndarray:
    """Shorthand for ``OPS[case.op].reference(case, dtype)``."""
    return OPS[case.op].reference(case, dtype)


def reference_from(fn64: Callable[..., np.ndarray]) -> Callable[[Case, str], np.ndarray]:
    """Wrap a float64 function of the inputs into ``reference(case, dtype)``."""

    def reference(case: Case, dtype: str) -> np.ndarray:
        dt = np_dtype(dtype)
        xs = {k: v.astype(F64) for k, v in case._cast(dt).items()}
        with np.errstate(all="ignore"):
            return np.asarray(fn64(**xs, **case.params), dtype=F64)

    reference.__doc__ = (fn64.__doc__ or "") + "\n(float64, on the inputs rounded to dtype)"
    return reference


# ----------------------------------------------------------------------- kernel helpers

def next_pow2(n: int) -> int:
    """Smallest power of two >= n (the BLOCK a Triton kernel picks for a whole row)."""
    return 1 << max(0, int(n - 1).bit_length())


def pad_cols(x32: np.ndarray, block: int, fill: float) -> np.ndarray:
    """Pad the last axis to a multiple of ``block`` with ``fill`` (masked-load ``other``)."""
    n = x32.shape[-1]
    total = -(-n // block) * block
    if total == n:
        return x32
    out = np.full(x32.shape[:-1] + (total,), fill, dtype=F32)
    out[..., :n] = x32
    return out


def f32(x: np.ndarray) -> np.ndarray:
    """Load: widen a stored array to float32 (exact)."""
    x = np.asarray(x)
    return widen_float16(x, F32) if x.dtype == np.float16 else x.astype(F32)
