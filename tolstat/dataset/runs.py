"""Shared pieces of collection (:mod:`tolstat.dataset.collection`, :mod:`tolstat.dataset.stream`).

Run inputs, the hardware fingerprint, provenance, one run's record, and the operator
statistics of a run derived from the op's own arguments (:func:`derive_op_statistics`,
through :mod:`tolstat.ops`). Dataset layer: imports only :mod:`tolstat.measure`,
:mod:`tolstat.ops`, :mod:`tolstat.dataset.schema` and :mod:`tolstat.dataset.records`.
"""

from __future__ import annotations

import os
import platform as _platform
import socket
import sys
from dataclasses import dataclass, field
from importlib import metadata as _metadata
from typing import Any, Mapping, Sequence

import numpy as np

from tolstat._base.threads import settled_on_error, submit_side
from tolstat._base.validate import short_repr
from tolstat.dataset.records import RunRecord, summarize_run
from tolstat.dataset.schema import reference_fingerprint
from tolstat.measure.metrics import as_array, error_metrics, metrics_with_ulp, ulp_distance

__all__ = ["Inputs", "Hardware", "hardware_fingerprint", "derive_op_statistics", "known_op",
           "validate_op_args"]


@dataclass
class Inputs:
    """What ``make_inputs`` may return for one run.

    Attributes
    ----------
    args : tuple
        Positional arguments passed to both kernel and reference.
    kwargs : dict
        Keyword arguments passed to both.
    labels : dict
        Per-run labels (``dist="normal"``, ``variant="tiled"``...).
    covariates : dict
        Per-run covariates (``K=512``, ``scale=10.0``...).
    """

    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, Any] = field(default_factory=dict)
    covariates: dict[str, float] = field(default_factory=dict)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or _platform.machine() or "unknown"


@dataclass(frozen=True)
class Hardware:
    """What :func:`hardware_fingerprint` found.

    Attributes
    ----------
    label : str
        ``"cuda:<GPU name>"`` or ``"cpu:<CPU model>"`` (the dataset's ``hardware``).
    platform : str
        Versions of Python, numpy, torch (and CUDA).
    """

    label: str
    platform: str


def hardware_fingerprint() -> Hardware:
    """Describe this machine: hardware label and platform string (:class:`Hardware`).

    The hardware label is ``"cuda:<GPU name>"`` when torch is already imported and sees a
    CUDA device, else ``"cpu:<CPU model>"``. The platform string lists the versions of
    Python, numpy and torch (if installed). torch is never imported here.
    """
    parts = [f"python {_platform.python_version()}", f"numpy {np.__version__}"]
    label = f"cpu:{_cpu_model()}"
    try:  # the installed torch, whether or not it is imported (no import here)
        parts.append(f"torch {_metadata.version('torch')}")
    except _metadata.PackageNotFoundError:
        pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                label = f"cuda:{torch.cuda.get_device_name(0)}"
                parts.append(f"cuda {torch.version.cuda}")
        except Exception:  # pragma: no cover - broken CUDA setups
            pass
    return Hardware(label, "; ".join(parts))


def _hardware_of_runs(hardware: str | None) -> tuple[str, str]:
    """The hardware label runs are recorded under (the given one, else this machine's) and
    this machine's platform string."""
    found = hardware_fingerprint()
    return (found.label if hardware is None else str(hardware)), found.platform


def _provenance(kind: str, **extra: Any) -> dict[str, Any]:
    prov = {"created_by": kind, "host": socket.gethostname(), "pid": os.getpid()}
    prov.update({k: v for k, v in extra.items() if v is not None})
    return prov


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)


def _as_inputs(x: Any) -> Inputs:
    if isinstance(x, Inputs):
        return x
    if isinstance(x, Mapping):
        return Inputs(kwargs=dict(x))
    if isinstance(x, tuple):
        return Inputs(args=x)
    return Inputs(args=(x,))


def _merged(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> dict[str, Any]:
    for m in (a, b):
        if m is not None and not isinstance(m, Mapping):
            raise TypeError(f"labels and covariates must be mappings {{name: value}}, got {type(m).__name__}")
    out = dict(a or {})
    out.update(b or {})
    return out


def known_op(op: str) -> bool:
    """Whether :mod:`tolstat.ops` has a model of ``op`` (a registered name or alias)."""
    from tolstat import ops

    try:
        ops.get(op)
    except KeyError:
        return False
    return True


def uses_op_model(op: str, op_model: bool | None, magnitude: Any) -> bool:
    """Whether :func:`tolstat.collect` derives each run's operator statistics from its inputs.

    ``op_model`` is ``CollectOptions.op_model``: None (automatic) derives them when no
    ``magnitude`` is given and :mod:`tolstat.ops` knows ``op`` (an unknown op keeps
    collecting without them); True requires it (an unknown op raises the ops library's
    ``KeyError``, a ``magnitude`` too a ``ValueError``); False never derives them.
    """
    if op_model is False:
        return False
    if op_model is True:
        if magnitude is not None:
            raise ValueError(f"CollectOptions(op_model=True) derives the magnitude from the inputs; "
                             f"CollectOptions.magnitude={magnitude!r} gives it too: pass one or the other")
        from tolstat import ops

        ops.get(op)  # an unknown op: the ops library's error, naming how to register it
        return True
    return magnitude is None and known_op(op)


def validate_op_args(inputs: Any, params: Any) -> None:
    """``inputs`` a tuple or list (not a string or a mapping), ``params`` a mapping or None:
    a ``TypeError`` naming the argument and its value otherwise."""
    if type(inputs) not in (tuple, list) and (isinstance(inputs, (str, bytes, Mapping))
                                              or not isinstance(inputs, (tuple, list))):
        raise TypeError(f"inputs must be a tuple or list of the op's positional arguments, got "
                        f"{short_repr(inputs)} ({type(inputs).__name__})")
    if params is not None and type(params) is not dict and not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping of the op's keyword arguments or None, got "
                        f"{short_repr(params)} ({type(params).__name__})")


def derive_op_statistics(op: str, inputs: Sequence[Any], params: Mapping[str, Any] | None, *, dtype: str,
                         covariates: Mapping[str, float], rowwise: bool = False,
                         reference: Any = None) -> tuple[np.ndarray, dict[str, float], bool]:
    """The magnitude, covariates (with ``K``) and row-wise flag of one run, from the op's arguments.

    Parameters
    ----------
    op : str
        The torch function's name (:func:`tolstat.ops.get`).
    inputs : sequence
        Its positional arguments, exactly as the kernel took them.
    params : mapping, optional
        Its keyword arguments.
    dtype : str
        The target dtype (canonical name).
    covariates : mapping
        The run's covariates; a ``K`` among them must equal the op's.
    rowwise : bool, default False
        ``CollectOptions.rowwise``: True asks for the per-row statistics, which an op
        that is not row-wise cannot give.
    reference : array, optional
        The run's reference: where the op has an identity for it, the magnitude is computed
        from it (:func:`tolstat.ops.op_statistics`).

    Returns
    -------
    magnitude : numpy.ndarray
        The op on the absolute inputs (:attr:`tolstat.ops.OpStatistics.magnitude`).
    covariates : dict
        ``covariates`` with ``K`` (the reduction length) set.
    rowwise : bool
        The op's row-wise flag.

    Raises
    ------
    KeyError
        An op :mod:`tolstat.ops` does not know (its message names :func:`tolstat.ops.register`).
    ValueError
        A covariate ``K`` that differs from the op's, or ``rowwise=True`` for an op that is
        not row-wise.
    TypeError
        ``inputs`` not a tuple or list, ``params`` not a mapping.
    """
    from tolstat import ops

    validate_op_args(inputs, params)
    st = ops.op_statistics(op, tuple(inputs), dict(params) if params else None, dtype=dtype, reference=reference)
    k = float(st.K)
    cov = dict(covariates)
    if "K" in cov and float(cov["K"]) != k:
        raise ValueError(f"covariate K={float(cov['K']):g} but the inputs of {op!r} give K={k:g}: leave K out "
                         "(it is derived from the inputs) or fix it")
    if rowwise and not st.rowwise:
        raise ValueError(f"CollectOptions.rowwise=True but tolstat.ops models {op!r} as not row-wise: leave "
                         "rowwise unset (the op's own flag is used)")
    cov["K"] = k
    return np.asarray(st.magnitude, dtype=np.float64), cov, bool(st.rowwise)


#: what a failed derivation of the operator statistics adds to its error
_DERIVE_HINT = ("the operator statistics of {op!r} are derived by tolstat.ops from the run's inputs, which must be "
                "exactly the arguments of the torch function {op!r}; tolstat.collect: "
                "CollectOptions(op_model=False) collects without them")


def _record(actual: Any, expected: Any, i: int, *, op: str, dtype: str, hardware: str,
            platform: str, seed: int, labels: Mapping[str, Any],
            covariates: Mapping[str, float], sample_size: int, rel_floor: float | None,
            allow_nan: bool, rng: np.random.Generator, magnitude: Any = None,
            rowwise: bool = False, op_args: tuple[Sequence[Any], Mapping[str, Any] | None] | None = None) -> RunRecord:
    """One run's record; ``op_args`` ``(inputs, params)``: the operator statistics come from
    :func:`derive_op_statistics` (``magnitude`` must then be None)."""
    source = "ops" if op_args is not None else ("ref" if isinstance(magnitude, str) else "given")
    try:
        if op_args is not None:
            try:
                magnitude, covariates, rowwise = derive_op_statistics(op, op_args[0], op_args[1], dtype=dtype,
                                                                      covariates=covariates, rowwise=rowwise,
                                                                      reference=expected)
            except (ValueError, TypeError) as exc:
                raise type(exc)(f"{exc} ({_DERIVE_HINT.format(op=op)})") from exc
        parts = submit_side((ulp_distance, (actual, expected, dtype), {}),
                            (_side_work, (actual, expected, magnitude),
                             dict(dtype=dtype, op=op, covariates=covariates, rowwise=rowwise))
                            ) if _side_work_size(expected) else None
        if parts is not None:
            # a mid-sized run: its ULP distances, operator statistics and reference
            # fingerprint on a second core while this one computes the other metrics and
            # the record (the same functions of the same arrays: the same values)
            del magnitude
            with settled_on_error(parts):
                m = metrics_with_ulp(actual, expected, dtype=dtype, rel_floor=rel_floor, allow_nan=allow_nan,
                                     ulp=parts[0].result)
        else:
            # the operator statistics first, and their magnitude dropped, so that their
            # temporaries and the metrics' arrays are never held at once: a run's peak memory
            # is what the allocator takes back from the system and faults in again on the
            # next run (a third of a large run's record time)
            try:
                op_stats = _op_stats(actual, expected, magnitude, dtype=dtype, op=op,
                                     covariates=covariates, rowwise=rowwise)
            except (ValueError, TypeError, KeyError):
                # a pair the metrics refuse (shapes, dtypes, a NaN reference) is reported as the metrics report it
                error_metrics(actual, expected, dtype=dtype, rel_floor=rel_floor, allow_nan=allow_nan)
                raise
            del magnitude
            m = error_metrics(actual, expected, dtype=dtype, rel_floor=rel_floor, allow_nan=allow_nan)
    except (ValueError, TypeError, KeyError) as exc:
        raise _with_run(exc, i) from exc
    with settled_on_error(parts):
        rec = summarize_run(m, op=op, hardware=hardware, platform=platform, seed=seed,
                            run_index=i, labels=labels, covariates=covariates,
                            sample_size=sample_size, rng=rng)
    del m  # the record holds copies of its samples: the metrics' arrays are freed before the fingerprint
    if parts is not None:
        try:
            op_stats, fingerprint = parts[1].result()  # an error of the operator statistics is raised here
        except (ValueError, TypeError, KeyError) as exc:
            raise _with_run(exc, i) from exc
    else:
        fingerprint = reference_fingerprint(as_array(expected, name="expected"))
    rec.op_stats = op_stats
    rec.op_rowwise = bool(rowwise) if op_stats else None
    rec.op_magnitude = source if op_stats else None
    rec.ref_fingerprint = fingerprint
    return rec


#: the run sizes (elements) whose ULP distances, operator statistics and fingerprint are
#: computed on a second core (:func:`tolstat._base.threads.submit_side`): below, handing
#: them over costs about what it saves; above, the metrics' arrays and the statistics'
#: temporaries held at once would raise a large run's peak memory (see :func:`_record`)
SIDE_WORK_SIZES = (1 << 14, 1 << 20)


def _side_work_size(expected: Any) -> bool:
    """True for a reference whose size is within :data:`SIDE_WORK_SIZES`."""
    size = getattr(expected, "size", None)
    if callable(size):  # a torch tensor's size() is its shape
        size = expected.numel() if hasattr(expected, "numel") else None
    return isinstance(size, (int, np.integer)) and SIDE_WORK_SIZES[0] <= size <= SIDE_WORK_SIZES[1]


def _side_work(actual: Any, expected: Any, magnitude: Any, **kw: Any) -> tuple[dict[str, float], int]:
    """:func:`_op_stats` and the reference's fingerprint, in that order."""
    op_stats = _op_stats(actual, expected, magnitude, **kw)
    return op_stats, reference_fingerprint(as_array(expected, name="expected"))


def _with_run(exc: Exception, i: int) -> Exception:
    """``exc`` with ``run i: `` before its message, of the same type where that type allows it."""
    msg = f"run {i}: {exc.args[0] if isinstance(exc, KeyError) and exc.args else exc}"
    try:
        return type(exc)(msg)
    except Exception:  # an exception class with its own constructor
        return (KeyError if isinstance(exc, KeyError) else ValueError)(msg)


def _op_stats(actual: Any, expected: Any, magnitude: Any, *, dtype: str, op: str,
              covariates: Mapping[str, float], rowwise: bool) -> dict[str, float]:
    """Operator-noise statistics of one run, or {} when no magnitude is given."""
    if magnitude is None:
        return {}
    from tolstat.measure.noise import record_statistics

    if isinstance(magnitude, str):
        if magnitude != "ref":
            raise ValueError(f"magnitude must be an array, a callable or 'ref', got {magnitude!r}")
        magnitude = None
    return record_statistics(actual, expected, dtype=dtype, magnitude=magnitude,
                             K=float(covariates.get("K", 1.0)), rowwise=rowwise, op=op)
