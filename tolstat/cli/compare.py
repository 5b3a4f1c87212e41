"""``tolstat compare``: the cross-validated comparison of tolerance methods on the command line."""

from __future__ import annotations

import argparse
from typing import Any

from tolstat.assess.comparison import compare
from tolstat.assess.rules import DEFAULT_METHODS, METHODS
from tolstat.cli.plots import plot_compare

__all__ = ["add_cli"]


def _parse_budgets(text: str) -> list[float]:
    out = []
    for item in text.split(","):
        try:
            out.append(float(item))
        except ValueError:
            raise ValueError(f"--budgets must be comma-separated numbers, got {text!r}") from None
    return out


def _cmd_compare(args: Any) -> int:
    from tolstat.dataset.io import open_errors

    budgets = _parse_budgets(args.budgets)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else list(DEFAULT_METHODS)
    chunks = {"run": args.chunks} if args.chunks else None
    ds = open_errors(args.errors, chunks=chunks)
    bugs = open_errors(args.buggy, chunks=chunks) if args.buggy else None
    by = ("op", "dtype") if args.pool_hardware else ("op", "dtype", "hardware")
    res = compare(ds, methods=methods, budgets=budgets, folds=args.folds, buggy=bugs, by=by,
                  cluster=args.cluster, confidence=args.confidence, seed=args.seed, progress=args.progress)
    s = res.settings
    print(f"tolstat compare: {s['n_runs']} correct runs ({s['n_units']} "
          f"{'clusters ' + repr(s['cluster']) if s['cluster'] else 'units'}), {s['n_buggy']} buggy runs, "
          f"{s['folds']} folds, confidence {s['confidence']:g}\n")
    print(res.summary())
    if args.per_group:
        print()
        print(res.summary(per_group=True))
    if args.output:
        paths = res.write(args.output)
        if not args.no_plots:
            try:
                paths += plot_compare(res, args.output)
            except ImportError as exc:  # matplotlib is the optional ``plot`` extra
                print(f"no plots: {exc}")
        print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0


def add_cli(sub: Any) -> None:
    """Register ``tolstat compare`` on an argparse sub-parser collection."""
    c = sub.add_parser("compare", help="cross-validated comparison of tolerance methods on an error dataset")
    c.add_argument("errors", help="error dataset of correct runs (.nc or .zarr); runs labelled kind=buggy "
                   "are taken as buggy")
    c.add_argument("--buggy", help="error dataset of known-bad runs (recall)")
    c.add_argument("--budgets", default="1e-2,1e-3", help="comma-separated false-positive budgets")
    c.add_argument("--folds", type=int, default=5)
    c.add_argument("--methods", default=None,
                   help=f"comma-separated names (default: {','.join(DEFAULT_METHODS)}; known: "
                        f"{','.join(METHODS)})")
    c.add_argument("--cluster", default=None, help="label whose runs stay in one fold (e.g. case)")
    c.add_argument("--confidence", type=float, default=0.95)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--pool-hardware", action="store_true", help="one threshold per (op, dtype)")
    c.add_argument("--chunks", type=int, default=None, help="open the tables dask-backed, N runs a chunk")
    c.add_argument("--per-group", action="store_true", help="also print one line per group")
    c.add_argument("-o", "--output", default=None, help="folder for compare.json, compare.nc, plots")
    c.add_argument("--no-plots", action="store_true")
    c.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    c.set_defaults(func=_cmd_compare)
