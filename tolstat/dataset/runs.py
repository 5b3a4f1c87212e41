"""Shared pieces of collection (:mod:`tolstat.dataset.collection`, :mod:`tolstat.dataset.stream`).

Run inputs, the hardware fingerprint, provenance, and one run's record. Dataset layer:
imports only :mod:`tolstat.measure.metrics`, :mod:`tolstat.dataset.schema` and
:mod:`tolstat.dataset.records`.
"""

from __future__ import annotations

import os
import platform as _platform
import socket
import sys
from dataclasses import dataclass, field
from importlib import metadata as _metadata
from typing import Any, Mapping

import numpy as np

from tolstat.dataset.records import RunRecord, summarize_run
from tolstat.dataset.schema import reference_fingerprint
from tolstat.measure.metrics import as_array, error_metrics

__all__ = ["Inputs", "Hardware", "hardware_fingerprint"]


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


def _record(actual: Any, expected: Any, i: int, *, op: str, dtype: str, hardware: str,
            platform: str, seed: int, labels: Mapping[str, Any],
            covariates: Mapping[str, float], sample_size: int, rel_floor: float | None,
            allow_nan: bool, rng: np.random.Generator, magnitude: Any = None,
            rowwise: bool = False) -> RunRecord:
    try:
        m = error_metrics(actual, expected, dtype=dtype, rel_floor=rel_floor, allow_nan=allow_nan)
        op_stats = _op_stats(actual, expected, magnitude, dtype=dtype, op=op,
                             covariates=covariates, rowwise=rowwise)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"run {i}: {exc}") from exc
    rec = summarize_run(m, op=op, hardware=hardware, platform=platform, seed=seed,
                        run_index=i, labels=labels, covariates=covariates,
                        sample_size=sample_size, rng=rng)
    rec.op_stats = op_stats
    rec.ref_fingerprint = reference_fingerprint(as_array(expected, name="expected"))
    return rec


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
