"""Collect FP8 GEMM error datasets of emulated GPUs (and torch's CPU kernel) with ``tolstat.collect``.

The kernel is ``torch._scaled_mm`` with ``float8_e4m3fn`` inputs, per-tensor scales and a
bfloat16 output, computed

* as an NVIDIA H100 PCIe or an RTX 4060 computes it, bit for bit, by the emulator
  ``mmaemu`` (the ``emulate`` extra, ``pip install "tolstat[emulate]"``): profiles
  ``hopper`` / ``hopper-te`` (hardware labels ``H100-PCIe/hopper``, ``H100-PCIe/hopper-te``)
  and ``ada`` / ``ada-te`` (``RTX4060/ada``, ``RTX4060/ada-te``); the ``-te`` profiles are
  the calls Transformer Engine makes (another workspace, so other split-K decisions);
* by torch's own CPU ``_scaled_mm`` (profile ``cpu``, hardware label ``torch-cpu:<CPU
  model>``), where this torch has one. The CPU path needs torch only.

Cases
-----
``input`` ``[M, K]`` (activations) and ``mat2 = w.t()`` with ``w`` ``[N, K]`` (a row-major
weight, so ``mat2`` is column-major as ``_scaled_mm`` wants it). Each operand is quantised
with its per-tensor scale ``amax / 448`` (float32), the scales are passed to the call.
Input distributions (label ``dist``): ``normal`` (standard normal entries) and ``outlier``
(normal, with ``K / 256`` activation channels, columns of ``input``, scaled by 20-100: the
outlier features of LLM activations). The float64 reference is the exact product of the
quantised operands times the scales, so the error is the GEMM's alone (not the
quantisation's). The cases of one block are the same on every profile and variant (the same
seed), so the datasets pair run for run.

Kernel variants (label ``variant``)
-----------------------------------
``correct``
    The call as above.
``wrong_scale``
    The weight's scale replaced by the activation's (``scale_b = scale_a``).
``rowwise_scale``
    The output dequantised with per-row scales (row ``i`` times ``amax(input_i) / 448``
    instead of the per-tensor ``scale_a``; the product taken in float32, then bfloat16).
``dropped_k_tile``
    The last K tile (128 wide) is not accumulated (the input's last 128 columns zeroed).
``bf16_accumulation``
    The product computed in K tiles of 128 (each one call on the same GPU, ``splitk=1``, a
    bfloat16 output) and the partial results added in bfloat16.

Buggy variants run on the held-out blocks only (label ``split``: ``test`` for the blocks
``b`` with ``b % --held-out-every == 1``, ``cal`` for the others), on the first
``--bug-runs`` cases of the block; the label ``same_as_correct`` says whether a buggy output
is bit for bit the correct one on that case (then no check can see it).

Output
------
One error dataset (``docs/schema.md``, op ``_scaled_mm``, dtype ``bfloat16``, with the
operator statistics of :mod:`tolstat.ops`), written with :func:`tolstat.save`
(compressed netCDF). The last entry of ``attrs["provenance"]`` records the emulator and
torch versions, the profiles and their GPUs, the shapes, distributions, runs, seed, the
split-K decision of each (profile, K), per-cell timings and whether the collection
finished within ``--max-seconds`` (``complete``).

Run
---
``python benchmarks/fp8_emulated_collect.py --out fp8.nc`` (defaults: profiles
``hopper,ada,cpu``, ``M=16``, ``N=64``, ``K`` 1024, 2048, 4096, 8192, 40 runs per (dist,
K) in blocks of 10, every second block held out, ``--max-seconds 2400``). ``--profiles cpu`` needs no emulator.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

#: profile name -> hardware label of its runs (the emulated GPU, then the profile)
GPU_LABELS = {"hopper": "H100-PCIe/hopper", "hopper-te": "H100-PCIe/hopper-te",
              "ada": "RTX4060/ada", "ada-te": "RTX4060/ada-te"}
PROFILES = (*GPU_LABELS, "cpu")
DISTS = ("normal", "outlier")
BUGS = ("wrong_scale", "rowwise_scale", "dropped_k_tile", "bf16_accumulation")
#: width of the K tile the buggy variants drop / accumulate over
TILE = 128
E4M3_MAX = 448.0
OP, DTYPE = "_scaled_mm", "bfloat16"


class _OutOfTime(Exception):
    """Raised inside a collection when ``--max-seconds`` has passed."""


def cpu_label() -> str:
    """Hardware label of torch's CPU kernel: ``torch-cpu:<CPU model>``."""
    from tolstat.dataset.runs import hardware_fingerprint

    lab = hardware_fingerprint().label
    return "torch-cpu:" + (lab.split(":", 1)[1] if lab.startswith("cpu:") else lab)


def make_gemm(torch: Any, profile: str) -> Callable[..., Any]:
    """``gemm(a, b, sa, sb, out_dtype, splitk="auto")``: ``_scaled_mm`` on ``profile``.

    ``profile`` is an mmaemu profile (the emulated GPU) or ``"cpu"`` (torch's CPU kernel,
    which has no split-K and ignores ``splitk``).
    """
    if profile == "cpu":
        def gemm_cpu(a, b, sa, sb, out_dtype, splitk="auto"):
            return torch._scaled_mm(a, b, sa, sb, out_dtype=out_dtype)
        return gemm_cpu
    import mmaemu

    def gemm_emu(a, b, sa, sb, out_dtype, splitk="auto"):
        with warnings.catch_warnings():  # the profiles' maturity notes: recorded in the provenance
            warnings.simplefilter("ignore")
            return mmaemu.scaled_mm(a, b, sa, sb, out_dtype=out_dtype, profile=profile, splitk=splitk)
    return gemm_emu


def variants(torch: Any, gemm: Callable[..., Any]) -> dict[str, Callable[..., Any]]:
    """The kernel of each variant: ``kernel(input, mat2, scale_a, scale_b, out_dtype=...)``."""
    bf16, f32 = torch.bfloat16, torch.float32

    def correct(a, b, sa, sb, out_dtype=bf16):
        return gemm(a, b, sa, sb, out_dtype)

    def wrong_scale(a, b, sa, sb, out_dtype=bf16):
        return gemm(a, b, sa, sa, out_dtype)

    def rowwise_scale(a, b, sa, sb, out_dtype=bf16):
        rows = (a.float() * sa).abs().amax(dim=1, keepdim=True) / E4M3_MAX
        return (gemm(a, b, torch.ones((), dtype=f32), sb, f32) * rows).to(out_dtype)

    def dropped_k_tile(a, b, sa, sb, out_dtype=bf16):
        a2 = a.clone()
        a2.view(torch.uint8)[:, -TILE:] = 0
        return gemm(a2, b, sa, sb, out_dtype)

    def bf16_accumulation(a, b, sa, sb, out_dtype=bf16):
        w = b.t()  # [N, K] row-major
        acc = torch.zeros((a.shape[0], b.shape[1]), dtype=bf16)
        for k0 in range(0, a.shape[1], TILE):
            part = gemm(a[:, k0:k0 + TILE].contiguous(), w[:, k0:k0 + TILE].contiguous().t(), sa, sb, bf16,
                        splitk=1)
            acc = (acc.float() + part.float()).to(bf16)
        return acc.to(out_dtype)

    return {"correct": correct, "wrong_scale": wrong_scale, "rowwise_scale": rowwise_scale,
            "dropped_k_tile": dropped_k_tile, "bf16_accumulation": bf16_accumulation}


def reference(a, b, sa, sb, out_dtype=None) -> np.ndarray:
    """float64 ``scale_a scale_b (input @ mat2)`` on the quantised operands (exact products)."""
    a64, b64 = a.double().numpy(), b.double().numpy()
    return (float(sa) * float(sb)) * (a64 @ b64)


def case_inputs(torch: Any, rng: np.random.Generator, M: int, K: int, N: int, dist: str) -> tuple[Any, ...]:
    """``(input, mat2, scale_a, scale_b)`` of one case: per-tensor quantised FP8 operands."""
    x = rng.standard_normal((M, K))
    w = rng.standard_normal((N, K))
    if dist == "outlier":
        ch = rng.choice(K, size=max(1, K // 256), replace=False)
        x[:, ch] *= rng.uniform(20.0, 100.0, size=ch.size)
    elif dist != "normal":
        raise ValueError(f"dist must be one of {DISTS}, got {dist!r}")
    e4 = torch.float8_e4m3fn

    def quant(v: np.ndarray) -> tuple[Any, Any]:
        s = torch.tensor(float(np.abs(v).max()) / E4M3_MAX, dtype=torch.float32)
        return (torch.from_numpy(v) / s.double()).to(e4), s

    a, sa = quant(x)
    wq, sb = quant(w)
    return a, wq.t(), sa, sb


def split_decisions(profiles: list[str], M: int, N: int, Ks: list[int]) -> dict[str, dict[str, str]]:
    """The emulator's split-K decision per (profile, K) for the correct call (provenance)."""
    out: dict[str, dict[str, str]] = {}
    emu = [p for p in profiles if p != "cpu"]
    if not emu:
        return out
    import torch
    import mmaemu

    for p in emu:
        out[p] = {}
        for K in Ks:
            a = torch.zeros((M, K), dtype=torch.float8_e4m3fn)
            b = torch.zeros((N, K), dtype=torch.float8_e4m3fn).t()
            one = torch.ones((), dtype=torch.float32)
            plan = mmaemu.explain(a, b, one, one, out_dtype=torch.bfloat16, profile=p)
            out[p][str(K)] = (str(plan.validation) if plan.validation != "ok" else
                              f"S={plan.split.S} {plan.split.scheme} ({plan.split.source})")
    return out


def compact_encoding(ds: Any) -> dict[str, dict[str, Any]]:
    """netCDF encoding that keeps the file small: zlib on numeric arrays, string labels as
    compressed characters (they read back as the same strings)."""
    enc: dict[str, dict[str, Any]] = {}
    for v in ds.variables:
        if ds[v].ndim and ds[v].dtype.kind in "fiu":
            enc[v] = {"zlib": True, "complevel": 6}
        elif ds[v].ndim and ds[v].dtype.kind in "UO":
            enc[v] = {"dtype": "S1", "zlib": True, "complevel": 6}
    return enc


def _ints(flag: str, text: str, low: int = 1) -> list[int]:
    try:
        vals = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not vals or any(v < low for v in vals):
        raise argparse.ArgumentTypeError(f"{flag} must be integers >= {low}, got {text!r}")
    return vals


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fp8_emulated_collect", description=__doc__.split("\n")[0])
    p.add_argument("--profiles", default="hopper,ada,cpu",
                   help=f"comma-separated, from {', '.join(PROFILES)} (default hopper,ada,cpu)")
    p.add_argument("--M", type=lambda t: _ints("--M", t, 16)[0], default=16, help="rows of input (default 16)")
    p.add_argument("--N", type=lambda t: _ints("--N", t, 16)[0], default=64, help="columns of mat2 (default 64)")
    p.add_argument("--K", type=lambda t: _ints("--K", t, 16), default=[1024, 2048, 4096, 8192],
                   help="comma-separated reduction lengths (default 1024,2048,4096,8192)")
    p.add_argument("--dists", default=",".join(DISTS), help="comma-separated, from normal,outlier")
    p.add_argument("--runs", type=lambda t: _ints("--runs", t)[0], default=40,
                   help="correct runs per (dist, K) and profile (default 40), in blocks of --block")
    p.add_argument("--block", type=lambda t: _ints("--block", t)[0], default=10,
                   help="runs per block (default 10)")
    p.add_argument("--held-out-every", type=lambda t: _ints("--held-out-every", t, 2)[0], default=2,
                   help="block b is held out (split 'test', with the bugs) when b %% this == 1 (default 2: "
                        "every second block); the others calibrate (split 'cal')")
    p.add_argument("--bug-runs", type=lambda t: _ints("--bug-runs", t, 0)[0], default=None,
                   help="runs per buggy variant and held-out block (default: the block; 0: no bugs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample-size", type=lambda t: _ints("--sample-size", t, 2)[0], default=16,
                   help="element samples kept per run (default 16)")
    p.add_argument("--max-seconds", type=float, default=2400.0,
                   help="stop collecting after this many seconds and write the blocks finished (default 2400)")
    p.add_argument("--out", required=True, help="output dataset (.nc or .zarr)")
    a = p.parse_args(argv)
    profiles = [s for s in a.profiles.split(",") if s]
    bad = [s for s in profiles if s not in PROFILES]
    if bad or not profiles:
        p.error(f"--profiles must be from {', '.join(PROFILES)}, got {a.profiles!r}")
    a.profiles = profiles
    dists = [s for s in a.dists.split(",") if s]
    if not dists or any(d not in DISTS for d in dists):
        p.error(f"--dists must be from {', '.join(DISTS)}, got {a.dists!r}")
    a.dists = dists
    if any(k % 16 for k in a.K) or a.M % 16 or a.N % 16:
        p.error(f"--M, --N and --K must be multiples of 16 (as _scaled_mm requires), got M={a.M} N={a.N} "
                f"K={a.K}")
    if any(k <= TILE for k in a.K):
        p.error(f"--K must be above the tile width {TILE} (the buggy variants drop / add K tiles), got {a.K}")
    if not a.max_seconds > 0:
        p.error(f"--max-seconds must be > 0, got {a.max_seconds}")
    a.bug_runs = a.block if a.bug_runs is None else min(a.bug_runs, a.block)
    out = Path(a.out)
    if out.suffix.lower() not in (".nc", ".zarr"):
        p.error(f"--out must end in .nc or .zarr, got {a.out!r}")
    if not out.parent.exists():
        p.error(f"--out: directory {str(out.parent)!r} does not exist")
    return a


def _available(torch: Any, profiles: list[str]) -> list[str]:
    """Why a profile cannot run here (empty: all can)."""
    why = []
    if any(p != "cpu" for p in profiles):
        try:
            import mmaemu  # noqa: F401
        except ImportError:
            why.append("the GPU profiles need mmaemu (pip install 'tolstat[emulate]'); --profiles cpu runs "
                       "without it")
    if "cpu" in profiles:
        a = torch.zeros((16, 32), dtype=torch.float8_e4m3fn)
        one = torch.ones((), dtype=torch.float32)
        try:
            torch._scaled_mm(a, a.t(), one, one, out_dtype=torch.bfloat16)
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            why.append(f"torch {torch.__version__} has no CPU _scaled_mm ({type(exc).__name__}: {exc})")
    return why


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse arguments, collect, write; return a summary (path, runs, bytes, seconds, complete)."""
    a = parse_args(argv)
    t_start = time.perf_counter()
    try:
        import torch
    except ImportError:
        sys.exit("fp8_emulated_collect: error: torch is not installed (pip install 'tolstat[torch]')")
    import tolstat

    why = _available(torch, a.profiles)
    if why:
        sys.exit("fp8_emulated_collect: error: " + "; ".join(why))
    torch.set_flush_denormal(False)
    labels = {p: (cpu_label() if p == "cpu" else GPU_LABELS[p]) for p in a.profiles}
    kernels = {p: variants(torch, make_gemm(torch, p)) for p in a.profiles}
    n_blocks = -(-a.runs // a.block)
    print(f"fp8_emulated_collect: profiles={a.profiles} M={a.M} N={a.N} K={a.K} dists={a.dists} "
          f"runs={a.runs} (blocks of {a.block}, bug runs {a.bug_runs} per held-out block) seed={a.seed} "
          f"max_seconds={a.max_seconds:g}", flush=True)
    deadline = t_start + a.max_seconds
    parts: list[Any] = []
    timings: dict[str, float] = {}
    complete = True
    done_blocks = 0
    for blk in range(n_blocks):
        runs_here = min(a.block, a.runs - blk * a.block)
        split = "test" if blk % a.held_out_every == 1 else "cal"
        block_parts: list[Any] = []
        t_blk = time.perf_counter()
        cells = [(K, dist) for K in a.K for dist in a.dists]
        seed = a.seed * 1_000_003 + blk
        try:
            for prof in a.profiles:
                outputs: dict[str, Any] = {}  # case -> correct output, for same_as_correct
                todo = [("correct", runs_here)] + ([(b, min(a.bug_runs, runs_here)) for b in BUGS]
                                                   if split == "test" and a.bug_runs else [])
                for var, n in todo:
                    t0 = time.perf_counter()
                    block_parts.append(_collect_block(
                        tolstat, torch, kernels[prof], var, n, cells, seed=seed, M=a.M, N=a.N, block=blk,
                        split=split, hardware=labels[prof], profile=prof, sample_size=a.sample_size,
                        deadline=deadline, outputs=outputs))
                    key = f"{prof}/{var}"
                    timings[key] = round(timings.get(key, 0.0) + time.perf_counter() - t0, 3)
        except _OutOfTime:
            complete = False
            print(f"  stopped at the --max-seconds budget ({a.max_seconds:g} s) in block {blk}: "
                  f"block left out", flush=True)
            break
        parts += block_parts
        done_blocks += 1
        print(f"  block {blk + 1}/{n_blocks} ({split}, {runs_here} runs per cell): "
              f"{sum(p.sizes['run'] for p in block_parts)} runs in {time.perf_counter() - t_blk:.1f} s; "
              f"total {time.perf_counter() - t_start:.1f} s", flush=True)
    if not parts:
        sys.exit("fp8_emulated_collect: error: nothing collected within --max-seconds")
    ds = tolstat.concat(parts)
    # one tolstat.collect entry per cell: keep the first (its fields are the same but the seed and kernel)
    cells = json.loads(ds.attrs.get("provenance", "[]"))
    prov = [dict(cells[0], cells=len(cells), note="the first of the cells' tolstat.collect entries")] if cells else []
    versions = {"torch": torch.__version__, "numpy": np.__version__, "tolstat": tolstat.__version__,
                "python": platform.python_version()}
    if any(p != "cpu" for p in a.profiles):
        import mmaemu

        versions["mmaemu"] = mmaemu.__version__
        gpus = {}
        for p in a.profiles:
            if p == "cpu":
                continue
            pr = mmaemu.get_profile(p)
            gpus[p] = {k: str(getattr(pr, k, "")) for k in ("gpu_name", "sm_count", "cublaslt_version",
                                                               "torch_version", "caller", "workspace_bytes")}
    else:
        gpus = {}
    prov.append({
        "created_by": "benchmarks/fp8_emulated_collect.py",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "what": "torch._scaled_mm, float8_e4m3fn inputs with per-tensor scales (amax / 448), bfloat16 output; "
                "emulated GPUs: mmaemu (bit-exact emulation of the GPU's FP8 GEMM), cpu: torch's CPU kernel",
        "hardware": labels, "emulated_gpus": gpus, "versions": versions,
        "split_k": split_decisions(a.profiles, a.M, a.N, a.K),
        "shape": {"M": a.M, "N": a.N, "K": a.K}, "dists": a.dists, "variants": ["correct", *BUGS],
        "tile": TILE, "runs": a.runs, "block": a.block, "held_out_every": a.held_out_every,
        "bug_runs": a.bug_runs, "blocks_done": done_blocks,
        "seed": a.seed, "sample_size": a.sample_size, "complete": complete, "max_seconds": a.max_seconds,
        "seconds": round(time.perf_counter() - t_start, 1), "timings_s": timings,
        "host_cpu": platform.processor() or platform.machine(),
        "argv": list(sys.argv[1:] if argv is None else argv),
    })
    ds.attrs["provenance"] = json.dumps(prov)
    out = Path(a.out)
    enc = compact_encoding(ds) if out.suffix.lower() == ".nc" else None
    tolstat.save(ds, out, encoding=enc)
    size = (sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) if out.is_dir() else out.stat().st_size)
    total = time.perf_counter() - t_start
    print(f"fp8_emulated_collect: wrote {out} ({ds.sizes['run']} runs, {size / 1e6:.2f} MB); total {total:.1f} s; "
          f"complete={complete}", flush=True)
    return {"path": str(out), "runs": int(ds.sizes["run"]), "bytes": int(size), "seconds": total,
            "complete": complete, "blocks": done_blocks}


def _collect_block(tolstat: Any, torch: Any, kern: dict[str, Callable[..., Any]], variant: str, n: int,
                   cells: list[tuple[int, str]], *, seed: int, M: int, N: int, block: int, split: str,
                   hardware: str, profile: str, sample_size: int, deadline: float,
                   outputs: dict[str, Any]) -> Any:
    """``tolstat.collect`` of ``n`` runs per (K, dist) cell of one variant on one block.

    Run ``i`` is case ``i // len(cells)`` of cell ``i % len(cells)``; its inputs come from
    ``collect``'s generator ``default_rng([seed, i])``, so every profile and variant sees the
    same cases. ``outputs`` maps a case to its correct output: filled by the ``correct``
    variant, read by the buggy ones for their ``same_as_correct`` label.
    """
    correct, kernel = kern["correct"], kern[variant]
    memo: dict[str, Any] = {}
    count = [0]

    def make_inputs(rng: np.random.Generator) -> Any:
        if time.perf_counter() > deadline:
            raise _OutOfTime()
        i = count[0]
        count[0] += 1
        K, dist = cells[i % len(cells)]
        args = case_inputs(torch, rng, M, K, N, dist)
        case = f"{dist}/{K}/{block}/{i // len(cells)}"
        lab = {"dist": dist, "variant": variant, "split": split, "block": str(block), "case": case,
               "profile": profile}
        # the output, computed once here (the kernel returns it): is it the correct one?
        out = kernel(*args, out_dtype=torch.bfloat16)
        memo["a"], memo["out"] = args[0], out
        if variant == "correct":
            outputs[case] = out
            lab["same_as_correct"] = "yes"
        else:
            ref = outputs.get(case)
            if ref is None:
                ref = correct(*args, out_dtype=torch.bfloat16)
            lab["same_as_correct"] = "yes" if torch.equal(out, ref) else "no"
        return tolstat.Inputs(args=args, kwargs={"out_dtype": torch.bfloat16}, labels=lab)

    def run_kernel(a, b, sa, sb, out_dtype=torch.bfloat16):
        if memo.get("a") is a:
            memo.pop("a")
            return memo.pop("out")
        return kernel(a, b, sa, sb, out_dtype=out_dtype)

    run_kernel.__qualname__ = f"{profile}:{variant}"
    return tolstat.collect(run_kernel, reference, make_inputs, op=OP, dtype=DTYPE, runs=n * len(cells),
                           hardware=hardware, seed=seed,
                           options=tolstat.CollectOptions(sample_size=sample_size, progress=False))


if __name__ == "__main__":
    run()
