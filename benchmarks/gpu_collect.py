"""Collect error datasets of torch kernels (CUDA, or CPU for CI) on the embedded corpus's cases.

The cases and float64 references are those of :mod:`tolstat.corpus` (``corpus.cases`` and
``corpus.run_reference``, same op, dtype, count, seed and shape set), so a dataset written
here pairs run for run with ``tolstat collect --cases N --seed S`` (the CPU emulation).
Only the kernels differ: each op runs through torch's own kernel on the chosen device
(cuBLAS / cuDNN / torch's CUDA kernels on a GPU), in float16 and bfloat16.

Kernel variants (label ``variant``)
-----------------------------------
``torch``
    The op's torch kernel on inputs stored in the dtype (``a @ b``, ``F.softmax``, ...).
    GEMMs run with torch's default reduced-precision-reduction settings (recorded).
``torch_f32_tf32`` / ``torch_f32_ieee`` (matmul, bmm, linear)
    Inputs widened to float32 (exact), GEMM in float32 with
    ``torch.backends.cuda.matmul.allow_tf32`` on / off, output rounded to the dtype. float16
    and bfloat16 values are exact in TF32, so the two differ only in the accumulation.
``triton_softmax`` (softmax, CUDA and triton only)
    The Triton tutorial softmax (one BLOCK = next_pow2(N) program per row, float32 math).
    Skipped with a recorded reason when triton is missing or there is no CUDA device.

Output
------
One error dataset (``docs/schema.md``) built with :func:`tolstat.from_pairs` and written
with :func:`tolstat.save` (netCDF compressed with zlib, or zarr), hardware label
``cuda:<GPU name>`` or ``torch-cpu:<CPU model>``; the provenance (a JSON list in
``attrs["provenance"]``) gets one entry from this script: GPU name and capability, driver,
CUDA, cuDNN, torch and triton versions, the backend settings, the ops, cases, seed,
timings and skipped parts. The element sample is small (``--sample-size``, default 16:
the run's Pareto-front hull plus a few uniform draws) so a full run stays a few MB.

Run
---
``PYTHONPATH=. python benchmarks/gpu_collect.py --out gpu.nc`` (defaults: ``--device
cuda``, all ops, ``--cases 400``, ``--max-seconds 420``). ``--device cpu`` runs the same
code with torch's CPU kernels (what the tests do). ``--max-seconds`` stops collecting
cleanly at the budget and still writes every (op, dtype) collected so far.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

#: ops whose torch kernel is a GEMM: they also run the float32 TF32 on/off variants
GEMM_OPS = ("matmul", "bmm", "linear")
DTYPES = ("float16", "bfloat16")


def torch_kernels(torch: Any) -> dict[str, Callable[..., Any]]:
    """One torch kernel per corpus op: ``kernel(**inputs, **case.params) -> Tensor``.

    Inputs are tensors of the storage dtype on the device; the kernel returns the output in
    that dtype, computed by torch's own implementation.
    """
    F = torch.nn.functional

    def conv1d_same(x, w, bias):
        with warnings.catch_warnings():  # "padding='same' with even kernel lengths may copy"
            warnings.simplefilter("ignore", UserWarning)
            return F.conv1d(x, w, bias, padding="same")

    def rms_norm(x, weight, eps):
        if hasattr(F, "rms_norm"):  # torch >= 2.4
            return F.rms_norm(x, (x.shape[-1],), weight, eps)
        x32 = x.float()  # older torch: the usual float32 formulation
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)

    return {
        "matmul": lambda a, b: a @ b,
        "bmm": lambda a, b: torch.bmm(a, b),
        "linear": lambda x, w, bias: F.linear(x, w, bias),
        "conv1d": conv1d_same,
        "softmax": lambda x: torch.softmax(x, dim=-1),
        "log_softmax": lambda x: torch.log_softmax(x, dim=-1),
        "layer_norm": lambda x, weight, bias, eps: F.layer_norm(x, (x.shape[-1],), weight, bias, eps),
        "rms_norm": rms_norm,
        "attention": lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)),
        "gelu": lambda x: F.gelu(x),
        "silu": lambda x: F.silu(x),
        "mean": lambda x: x.mean(dim=-1, keepdim=True),
        "cumsum": lambda x: torch.cumsum(x, dim=-1),
    }


def triton_softmax(torch: Any) -> Callable[..., Any]:
    """The Triton tutorial softmax kernel (imports triton; raises ImportError without it)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < n_cols
        x = tl.load(in_ptr + row * in_stride + offs, mask=mask, other=-float("inf")).to(tl.float32)
        x = x - tl.max(x, axis=0)
        num = tl.exp(x)
        y = num / tl.sum(num, axis=0)
        tl.store(out_ptr + row * out_stride + offs, y.to(out_ptr.dtype.element_ty), mask=mask)

    def softmax(x):
        x = x.contiguous()
        rows, n = x.shape
        y = torch.empty_like(x)
        _kernel[(rows,)](y, x, x.stride(0), y.stride(0), n, BLOCK=triton.next_power_of_2(n))
        return y

    return softmax


@contextlib.contextmanager
def backend_settings(torch: Any, *, tf32: bool) -> Iterator[None]:
    """Set ``allow_tf32`` (cuBLAS matmul and cuDNN) for a block, restoring it afterwards."""
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def settings_snapshot(torch: Any) -> dict[str, Any]:
    """The numerics-relevant backend flags as they are now."""
    m = torch.backends.cuda.matmul
    return {
        "cuda.matmul.allow_tf32": bool(m.allow_tf32),
        "cudnn.allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "cuda.matmul.allow_fp16_reduced_precision_reduction": bool(m.allow_fp16_reduced_precision_reduction),
        "cuda.matmul.allow_bf16_reduced_precision_reduction": bool(m.allow_bf16_reduced_precision_reduction),
        "float32_matmul_precision": str(torch.get_float32_matmul_precision()),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
    }


def device_info(torch: Any, device: str) -> dict[str, Any]:
    """Hardware and software provenance: GPU name, capability, driver, CUDA/cuDNN/torch/triton."""
    from tolstat.dataset.runs import hardware_fingerprint

    info: dict[str, Any] = {"device": device, "torch": torch.__version__, "python": platform.python_version(),
                            "numpy": np.__version__}
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001 - any import failure means "no triton"
        info["triton"] = f"unavailable ({type(exc).__name__}: {exc})"
    if device.startswith("cuda"):
        idx = torch.device(device).index or 0
        info["gpu"] = torch.cuda.get_device_name(idx)
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(idx)))
        info["cuda_runtime"] = torch.version.cuda
        info["cudnn"] = torch.backends.cudnn.version()
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=True)
            info["driver"] = out.stdout.strip().splitlines()[idx]
        except Exception as exc:  # noqa: BLE001 - provenance only
            info["driver"] = f"unknown ({type(exc).__name__})"
        info["hardware"] = f"cuda:{info['gpu']}"
    else:
        label = hardware_fingerprint().label
        info["hardware"] = "torch-" + label if label.startswith("cpu:") else f"torch-cpu:{label}"
    return info


def variants_for(op: str, device: str, kernels: dict[str, Callable], triton_sm: Callable | None
                 ) -> list[tuple[str, Callable, bool | None, bool]]:
    """``(variant, kernel, tf32 or None (leave as is), upcast to float32)`` for one op."""
    out: list[tuple[str, Callable, bool | None, bool]] = [("torch", kernels[op], None, False)]
    if op in GEMM_OPS:
        out += [("torch_f32_tf32", kernels[op], True, True), ("torch_f32_ieee", kernels[op], False, True)]
    if op == "softmax" and triton_sm is not None:
        out.append(("triton_softmax", triton_sm, None, False))
    return out


def _to_torch(torch: Any, arr: np.ndarray, tdtype: Any, device: str) -> Any:
    # storage-dtype values are exact in float32: widen on the host, narrow on the device
    return torch.from_numpy(np.ascontiguousarray(arr.astype(np.float32))).to(device).to(tdtype)


def collect_group(torch: Any, op: str, dtype: str, *, n: int, seed: int, quick: bool, device: str,
                  kernels: dict[str, Callable], triton_sm: Callable | None, deadline: float,
                  skipped: list[str]) -> tuple[list[tuple], bool]:
    """Run every variant of ``op`` on ``n`` corpus cases; return the pairs and whether it finished."""
    from tolstat import corpus

    tdtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    pairs: list[tuple] = []
    variants = variants_for(op, device, kernels, triton_sm)
    for case in corpus.cases(op, dtype, n=n, seed=seed, quick=quick):
        if pairs and time.perf_counter() > deadline:  # a started group keeps at least one case
            return pairs, False
        ref = corpus.run_reference(case, dtype)
        stored = case.cast_inputs(dtype)  # the corpus's correctly rounded inputs
        for vname, kern, tf32, upcast in list(variants):
            tt = torch.float32 if upcast else tdtype
            args = {k: _to_torch(torch, v, tdtype, device).to(tt) for k, v in stored.items()}
            try:
                with backend_settings(torch, tf32=bool(tf32)) if tf32 is not None else contextlib.nullcontext():
                    with torch.no_grad():
                        out = kern(**args, **case.params)
                out = out.to(tdtype).float().cpu().numpy()
            except Exception as exc:  # noqa: BLE001 - a failing optional kernel is skipped, recorded
                if vname == "torch":
                    raise
                skipped.append(f"{op}/{dtype}/{vname}: {type(exc).__name__}: {exc}")
                variants.remove((vname, kern, tf32, upcast))
                continue
            labels = {"variant": vname, "dist": case.labels.get("dist", ""), "dims": case.labels.get("dims", "")}
            pairs.append((corpus.cast(out, dtype), ref, labels, dict(case.covariates)))
    return pairs, True


def _union_covariates(parts: list[Any]) -> list[Any]:
    """Give every part the union of covariate names (NaN where an op has none), as the corpus does."""
    names: list[str] = []
    for p in parts:
        names += [c for c in p.attrs["covariates"].split(",") if c and c not in names]
    out = []
    for p in parts:
        have = p.attrs["covariates"].split(",")
        q = p.assign({c: ("run", np.full(p.sizes["run"], np.nan)) for c in names if c not in have})
        q.attrs["covariates"] = ",".join(names)
        out.append(q)
    return out


def compact_encoding(ds: Any) -> dict[str, dict[str, Any]]:
    """netCDF encoding that keeps a dataset small: zlib on every numeric array, and string
    labels stored as compressed fixed-width characters (they read back as the same strings)."""
    enc: dict[str, dict[str, Any]] = {}
    for v in ds.variables:
        if ds[v].ndim and ds[v].dtype.kind in "fiu":
            enc[v] = {"zlib": True, "complevel": 4}
        elif ds[v].ndim and ds[v].dtype.kind in "UO":
            enc[v] = {"dtype": "S1", "zlib": True, "complevel": 4}
    return enc


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse arguments, collect, write; return a summary (paths, runs, timings)."""
    p = argparse.ArgumentParser(prog="gpu_collect", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    p.add_argument("--ops", default=None, help="comma-separated corpus ops (default: all)")
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--cases", type=int, default=400,
                   help="cases per (op, dtype) (default 400, as 'tolstat evaluate' calibrates)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="the corpus's small shape subset")
    p.add_argument("--sample-size", type=int, default=16,
                   help="element samples kept per run (default 16; the front hull comes first)")
    p.add_argument("--max-seconds", type=float, default=420.0,
                   help="stop collecting after this many seconds and write what was collected")
    p.add_argument("--out", required=True, help="output dataset (.nc or .zarr)")
    p.add_argument("--hardware", default=None, help="override the hardware label")
    a = p.parse_args(argv)

    t_start = time.perf_counter()
    try:
        import torch
    except ImportError:
        p.exit(2, "gpu_collect: error: torch is not installed (pip install tolstat[torch])\n")
    import tolstat
    from tolstat import corpus

    if a.cases < 1:
        p.exit(2, f"gpu_collect: error: --cases must be >= 1, got {a.cases}\n")
    if a.sample_size < 2:
        p.exit(2, f"gpu_collect: error: --sample-size must be >= 2, got {a.sample_size}\n")
    if a.max_seconds <= 0:
        p.exit(2, f"gpu_collect: error: --max-seconds must be > 0, got {a.max_seconds}\n")
    device = a.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        p.exit(2, f"gpu_collect: error: --device {device} but torch sees no CUDA device (use --device cpu)\n")
    if not (device == "cpu" or device.startswith("cuda")):
        p.exit(2, f"gpu_collect: error: --device must be cpu, cuda or cuda:N, got {device!r}\n")
    kernels = torch_kernels(torch)
    ops = a.ops.split(",") if a.ops else sorted(kernels)
    bad = [o for o in ops if o not in kernels or o not in corpus.OPS]
    if bad:
        p.exit(2, f"gpu_collect: error: unknown op(s) {bad}; known: {sorted(kernels)}\n")
    dtypes = a.dtypes.split(",")
    if any(d not in DTYPES for d in dtypes):
        p.exit(2, f"gpu_collect: error: --dtypes must be from {DTYPES}, got {a.dtypes!r}\n")
    out_path = Path(a.out)
    if not out_path.parent.exists():
        p.exit(2, f"gpu_collect: error: directory {str(out_path.parent)!r} does not exist\n")

    skipped: list[str] = []
    triton_sm = None
    if "softmax" in ops:
        if not device.startswith("cuda"):
            skipped.append("triton_softmax: needs a CUDA device")
        else:
            try:
                triton_sm = triton_softmax(torch)
            except Exception as exc:  # noqa: BLE001
                skipped.append(f"triton_softmax: triton not importable ({type(exc).__name__}: {exc})")
    info = device_info(torch, device)
    hardware = a.hardware or info["hardware"]
    settings = settings_snapshot(torch)
    print(f"gpu_collect: device={device} hardware={hardware!r} torch={info['torch']} ops={ops} "
          f"dtypes={dtypes} cases={a.cases} seed={a.seed} max_seconds={a.max_seconds:g}", flush=True)
    if device.startswith("cuda"):  # warm-up: context creation and cuBLAS handles out of the timings
        x = torch.ones(8, 8, device=device, dtype=torch.float16)
        (x @ x).sum().item()

    deadline = t_start + a.max_seconds
    parts, timings, complete = [], {}, True
    for op in ops:
        for dt in dtypes:
            t0 = time.perf_counter()
            pairs, done = collect_group(torch, op, dt, n=a.cases, seed=a.seed, quick=a.quick, device=device,
                                        kernels=kernels, triton_sm=triton_sm, deadline=deadline,
                                        skipped=skipped)
            t1 = time.perf_counter()
            if pairs:
                parts.append(tolstat.from_pairs(pairs, op=op, dtype=dt, hardware=hardware, seed=a.seed,
                                                options=tolstat.CollectOptions(sample_size=a.sample_size, progress=False)))
            t2 = time.perf_counter()
            timings[f"{op}/{dt}"] = {"runs": len(pairs), "kernels_and_refs_s": round(t1 - t0, 3),
                                     "metrics_s": round(t2 - t1, 3)}
            print(f"  {op:12s} {dt:9s} runs={len(pairs):5d} kernels+refs {t1 - t0:7.2f} s  "
                  f"metrics {t2 - t1:6.2f} s  total {t2 - t_start:7.1f} s", flush=True)
            if not done:
                complete = False
                skipped.append(f"stopped at the --max-seconds budget ({a.max_seconds:g} s) during {op}/{dt}")
                break
        if not complete:
            break
    if not parts:
        p.exit(1, "gpu_collect: error: nothing collected within --max-seconds\n")
    ds = tolstat.concat(_union_covariates(parts))
    prov = json.loads(ds.attrs.get("provenance", "[]"))
    prov.append({
        "created_by": "benchmarks/gpu_collect.py",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "info": info, "settings": settings, "ops": ops, "dtypes": dtypes, "cases": a.cases, "seed": a.seed,
        "quick": a.quick, "sample_size": a.sample_size, "complete": complete, "skipped": skipped,
        "timings": timings, "corpus": "tolstat.corpus cases and float64 references (same seed, count, shapes)",
        "argv": list(sys.argv[1:] if argv is None else argv),
    })
    ds.attrs["provenance"] = json.dumps(prov)
    enc = compact_encoding(ds) if out_path.suffix.lower() in (".nc", ".nc4", ".h5") else None
    t3 = time.perf_counter()
    tolstat.save(ds, out_path, encoding=enc)
    size = sum(f.stat().st_size for f in out_path.rglob("*") if f.is_file()) if out_path.is_dir() \
        else out_path.stat().st_size
    total = time.perf_counter() - t_start
    print(f"gpu_collect: wrote {out_path} ({ds.sizes['run']} runs, {size / 1e6:.2f} MB) in "
          f"{time.perf_counter() - t3:.1f} s; total {total:.1f} s; complete={complete}", flush=True)
    for s in skipped:
        print(f"  skipped: {s}", flush=True)
    return {"path": str(out_path), "runs": int(ds.sizes["run"]), "bytes": int(size), "seconds": total,
            "complete": complete, "skipped": skipped, "timings": timings}


if __name__ == "__main__":
    run()
