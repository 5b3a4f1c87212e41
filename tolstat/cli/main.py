"""The ``tolstat`` command line."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

import numpy as np
import xarray as xr

__all__ = ["main", "summary_table"]


def summary_table(ds: xr.Dataset) -> str:
    """One line per (op, dtype, hardware) group: runs and run-level error statistics."""
    rows = [("op", "dtype", "hardware", "runs", "median max_abs", "max max_abs", "max max_ulp",
             "max max_rel", "nonfinite")]
    for (op, dt, hw), g in ds.groupby(["op", "dtype", "hardware"]):
        rows.append((op, dt, hw[:28], str(g.sizes["run"]), f"{float(np.median(g.max_abs)):.3e}",
                     f"{float(g.max_abs.max()):.3e}", f"{float(g.max_ulp.max()):.0f}",
                     f"{float(g.max_rel.max()):.3e}", str(int(g.n_nonfinite.sum()))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) if j >= 3 else c.ljust(w)
                               for j, (c, w) in enumerate(zip(r, widths))) for r in rows)


def _demo_dataset(runs: int, seed: int) -> xr.Dataset:
    import ml_dtypes

    from tolstat import Inputs, collect, concat

    dts = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
    parts = []
    for name, dt in dts.items():
        def kernel(a, b, dt=dt):
            # fp32 accumulation over 32-wide K tiles, store in the low-precision dtype
            a = a.astype(dt).astype(np.float32)
            b = b.astype(dt).astype(np.float32)
            acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
            for k0 in range(0, a.shape[1], 32):
                acc += a[:, k0:k0 + 32] @ b[k0:k0 + 32]
            return acc.astype(dt)

        def reference(a, b, dt=dt):
            return a.astype(dt).astype(np.float64) @ b.astype(dt).astype(np.float64)

        def make(rng):
            k = int(rng.choice([16, 64, 256, 1024]))
            scale = float(rng.choice([1.0, 10.0]))
            return Inputs(args=(rng.standard_normal((64, k)) * scale, rng.standard_normal((k, 64))),
                          labels={"dist": "normal"}, covariates={"K": k, "scale": scale})

        parts.append(collect(kernel, reference, make, op="matmul", dtype=name, runs=runs, seed=seed))
    return concat(parts)


def _cmd_demo(args: argparse.Namespace) -> int:
    from tolstat import save

    ds = _demo_dataset(args.runs, args.seed)
    print(summary_table(ds))
    if args.output:
        save(ds, args.output)
        print(f"wrote {args.output}")
    return 0


def _cmd_init(args: argparse.Namespace) -> int:
    from tolstat.cli import scaffold

    plan = scaffold.plan(args.folder, args.op, args.dtype, runs=args.runs, checks=args.checks, force=args.force)
    scaffold.write(plan)
    for rel in plan.files:
        print(f"wrote {rel}")
    for rel in plan.appended:
        print(f"appended to {rel}")
    for why in plan.kept:
        print(f"left {why}")
    n_groups = len(args.op) * len(args.dtype)
    here = "" if os.path.abspath(args.folder) == os.getcwd() else f"cd {args.folder} && "
    print(f"next: {here}python calibrate.py && pytest   ({n_groups} groups x {args.runs} runs, then "
          f"{n_groups * (args.checks + 1)} checks under a suite budget of 1%)")
    print("commit kernels.py, calibrate.py, tests/, conftest.py, pyproject.toml and tolerances.json; "
          "not errors.nc (listed in .gitignore)")
    return 0


def _cmd_summary(args: argparse.Namespace) -> int:
    from tolstat import open_errors
    from tolstat.dataset.io import describe_storage, storage_info

    print(summary_table(open_errors(args.errors)))
    print(describe_storage(storage_info(args.errors)))  # the file's size and what it keeps
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from tolstat.assess.evaluation import EvalConfig, evaluate, partial_table, per_bug_table, per_category_table, write_outputs

    cfg = EvalConfig.preset("quick" if args.quick else "default", n_cal=args.n_cal,
                            n_test=args.n_test, fp_budget=args.fp_budget,
                            confidence=args.confidence, seed=args.seed,
                            ops=args.ops.split(",") if args.ops else None, protocol=args.protocol)
    print(f"tolstat evaluate: ops={cfg.ops or 'all'} dtypes={list(cfg.dtypes)} "
          f"n_cal={cfg.n_cal} n_test={cfg.n_test} fp_budget={cfg.fp_budget:g} "
          f"confidence={cfg.confidence:g}" + (" protocol=kernel" if cfg.protocol == "kernel" else ""), flush=True)
    res = evaluate(cfg, progress=args.progress)
    n_ctrl = int((res.checks.kind == "control").sum())
    n_bug = int((res.checks.kind == "bug").sum())
    print(f"\n{n_ctrl} control checks, {n_bug} buggy checks "
          f"({int(res.checks.detectable[res.checks.kind == 'bug'].sum())} detectable), "
          f"{res.calibration.sizes['run']} calibration runs, {res.seconds:.0f} s\n")
    print(res.table())
    if res.skipped:
        print("\nnot compared (could not keep the budget with these calibration runs; see above): "
              + ", ".join(res.skipped))
    if res.partial:
        print("\npartly calibrated: measured only on the checks of the groups that got a threshold "
              "(not comparable with the table above)")
        print(partial_table(res))
    if args.per_bug:
        print()
        print(per_bug_table(res))
        print("\ndetectable-bug recall per category")
        print(per_category_table(res))
    if args.shift_against:
        from tolstat.assess.hwshift import evaluation_shift_report

        print("\n" + evaluation_shift_report(res.calibration, args.shift_against, fp_budget=cfg.fp_budget,
                                              confidence=cfg.confidence))
    paths = write_outputs(res, args.output)
    if not args.no_plots:
        from tolstat.cli.plots import plot_evaluation

        paths += plot_evaluation(res, args.output)
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0


def _cmd_collect(args: argparse.Namespace) -> int:
    from tolstat.cli import user_kernel as _cli_collect
    from tolstat import save
    from tolstat.assess.corpus_runs import calibration_dataset
    from tolstat.assess.evaluation import EvalConfig

    if _cli_collect.wanted(args):
        ds = _cli_collect.run(args)
    else:
        ops = args.ops.split(",") if args.ops else None
        cfg = EvalConfig(ops=ops, dtypes=tuple(args.dtypes.split(",")), n_cal=args.cases,
                         seed=args.seed, quick=args.quick)
        ds = calibration_dataset(cfg, progress=args.progress)
    save(ds, args.output)
    print(summary_table(ds))
    print(f"wrote {args.output} ({ds.sizes['run']} runs)")
    return 0


def _parse_covariates(items: Sequence[str] | None) -> dict[str, float]:
    from tolstat._base.validate import covariates
    from tolstat.dataset.schema import BUILTIN_COVARIATES

    out: dict[str, Any] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--cov {item!r} must be NAME=VALUE")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--cov {item!r}: {value!r} is not a number") from None
    return covariates(out, computed=BUILTIN_COVARIATES, what="--cov")


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from tolstat import SelectOptions, open_errors, select

    ds = open_errors(args.errors)
    stat: str | tuple[str, ...] = (args.statistic, "bias") if args.bias else args.statistic
    by = ("op", "dtype") if args.pool_hardware else ("op", "dtype", "hardware")
    table = select(ds, fp_budget=args.fp_budget, confidence=args.confidence, statistic=stat,
                   form=None if args.form == "none" else args.form, by=by, cluster=args.cluster,
                   options=SelectOptions(method=args.method))
    if args.output.lower().endswith(".json"):
        table.to_json(args.output)
    else:
        table.to_netcdf(args.output)
    print(table)
    print(f"wrote {args.output}")
    return 0


def _load_array(path: str, dtype: str | None = None) -> np.ndarray:
    from tolstat.cli.npy import load_array

    return load_array(path, dtype)


def _magnitude_arg(path: str | None) -> Any:
    """``--magnitude``: a float64 .npy array, ``ref``, or None."""
    if path is None or path == "ref":
        return path
    return _load_array(path, None).astype(np.float64)


def _literal(flag: str, text: str) -> Any:
    """A Python literal of the command line (``-1``, ``(64,)``, ``1e-5``, ``True``, ``'mean'``)."""
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ValueError(f"{flag} {text!r} is neither a .npy/.npz file nor a Python literal (a number, a tuple "
                         "such as '(64,)', True/False/None or a quoted string)") from None


def _op_arguments(args: argparse.Namespace) -> tuple[tuple[Any, ...] | None, dict[str, Any] | None]:
    """``--inputs`` (the op's positional arguments: arrays from .npy/.npz files, other values
    as literals) and ``--param NAME=VALUE`` (its keyword arguments, literals)."""
    if args.param and not args.inputs:
        raise ValueError("--param needs --inputs (the op's positional arguments)")
    if not args.inputs:
        return None, None
    if args.magnitude is not None:
        raise ValueError("pass either --inputs (the operator statistics are derived from them) or --magnitude, "
                         "not both")
    pos = tuple(_load_array(x, args.dtype) if x.lower().endswith((".npy", ".npz")) else _literal("--inputs", x)
                for x in args.inputs)
    params: dict[str, Any] = {}
    for item in args.param or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip().isidentifier():
            raise ValueError(f"--param {item!r} must be NAME=VALUE (a keyword argument of the op)")
        params[name.strip()] = _literal("--param", value)
    return pos, params or None


def _cmd_check(args: argparse.Namespace) -> int:
    from tolstat import CheckOptions, check, load_table

    if args.table is None and args.uncalibrated != "model":
        raise ValueError("check needs --table TABLE.json, or --uncalibrated model (with --inputs) for the "
                         "model-based threshold from zero runs")
    table = None if args.table is None else load_table(args.table)
    actual, expected = _load_array(args.actual, args.dtype), _load_array(args.expected, args.dtype)
    inputs, params = _op_arguments(args)
    res = check(actual, expected, op=args.op,
                dtype=args.dtype, table=table, hardware=args.hardware, inputs=inputs, params=params,
                covariates=_parse_covariates(args.cov),
                options=CheckOptions(magnitude=_magnitude_arg(args.magnitude),
                                     hardware_policy=args.hardware_policy, uncalibrated=args.uncalibrated))
    print(res.message() if not res.passed else res.verdict_line())
    return 0 if res.passed else 1


def _cmd_merge(args: argparse.Namespace) -> int:
    from tolstat import open_errors, save
    from tolstat.dataset import merge_records

    ds = merge_records([open_errors(p) for p in args.inputs], dedupe=not args.keep_duplicates)
    save(ds, args.output)
    print(f"wrote {args.output} ({ds.sizes['run']} runs)")
    return 0


def _cmd_merge_parts(args: argparse.Namespace) -> int:
    from tolstat.checks.record_parts import merge_parts

    try:
        res = merge_parts(args.parts, args.record, remove=not args.keep)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in res.lines():
        print(line)
    return 1 if res.unreadable else 0


def _cmd_show(args: argparse.Namespace) -> int:
    from tolstat import load_table
    from tolstat.calibration.review import show_table

    table = load_table(args.table, verify=not args.no_verify)
    refs = _power_references(table, args) if args.power or args.corpus or args.references else None
    print(show_table(table, name=args.table))
    if refs is not None:
        _show_power(table, refs)
    return 0


def _power_references(table: Any, args: argparse.Namespace) -> Any:
    """The references of ``tolstat show --power``: the corpus's or an npz file's (checked before any output)."""
    from tolstat.assess.power import corpus_references, load_references

    if bool(args.corpus) == bool(args.references):
        raise ValueError("--power needs the references of the groups, from exactly one of --corpus (the embedded "
                         "corpus's calibration cases) or --references REFS.npz (tolstat.assess.power."
                         "save_references); an error dataset keeps sampled elements, not the references")
    if args.corpus:
        ops = sorted({op for op, _, _ in table.groups})
        from tolstat import corpus

        missing = [op for op in ops if op not in corpus.OPS]
        if missing:
            raise ValueError(f"--corpus: the table has groups of ops the corpus does not have: {missing}; "
                             "pass their references with --references REFS.npz")
        refs: Any = corpus_references(ops, sorted({dt for _, dt, _ in table.groups}), n=args.n_refs,
                                      seed=args.seed, quick=not args.full_shapes)
        return refs
    return load_references(args.references)


def _show_power(table: Any, refs: Any) -> None:
    """``tolstat show --power``: what each group's decision catches, and a warning per group
    whose threshold passes an all-zero or constant output on its references."""
    from tolstat.assess.power import TABLE_RULE, power_report

    rep = power_report(table, refs)
    print("\npower: " + rep.to_markdown())
    print("\n" + rep.summary())
    for op, dt, hw in rep.trivial(TABLE_RULE):
        print(f"tolstat show: warning: group ({op}, {dt}, {hw}): its threshold passes an all-zero or constant "
              "output on its own references; a kernel returning nothing would pass this check", file=sys.stderr)


def _cmd_diff(args: argparse.Namespace) -> int:
    from tolstat import load_table
    from tolstat.calibration.review import diff_tables

    verify = not args.no_verify
    errors = None
    if args.errors:
        from tolstat import open_errors

        errors = open_errors(args.errors)
    print(diff_tables(load_table(args.old, verify=verify), load_table(args.new, verify=verify),
                      names=(args.old, args.new),
                      changed_only=args.changed_only, errors=errors))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    src = Path(args.source)
    table_opts = [f"--{k.replace('_', '-')}" for k in ("errors", "output", "references") if getattr(args, k)]
    table_opts += ["--corpus"] * bool(args.corpus)
    if src.is_dir() or src.name == "results.json":  # an evaluation folder: the Markdown report
        if table_opts:
            raise ValueError(f"{args.source!r} is an evaluation folder (Markdown report); {', '.join(table_opts)} "
                             "belong to the HTML report of a table: tolstat report TABLE.json --errors ERRORS.nc")
        from tolstat.cli.report import write_report

        path = write_report(src)
        print(f"wrote {path}")
        return 0
    if not src.exists():
        raise FileNotFoundError(f"no such table or evaluation folder: {args.source!r}")
    if not args.errors:
        raise ValueError(f"{args.source!r} is a table: its HTML report needs --errors ERRORS.nc (the error dataset "
                         "whose runs it shows, usually the calibration dataset)")
    from tolstat import load_table, open_errors
    from tolstat.cli.html_report import write_table_report

    table = load_table(src, verify=not args.no_verify)
    refs = _power_references(table, args) if args.corpus or args.references else None
    ds = open_errors(args.errors)
    power = None
    if refs is not None:
        from tolstat.assess.power import power_report

        power = power_report(table, refs)
    out = Path(args.output) if args.output else src.with_suffix(".html")
    path = write_table_report(out, table, ds, power=power, nearest=args.nearest,
                              title=f"tolstat table report: {src.name} on {Path(args.errors).name}")
    print(f"wrote {path}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on ONE line (``tolstat CMD: error: ...``), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see '{self.prog} --help')\n")


def _one_line(msg: Any) -> str:
    return " ".join(str(msg).split())


def _arg(check: Callable[[str, Any], Any], name: str, conv: Callable[[str], Any] = float) -> Callable[[str], Any]:
    """An argparse ``type``: convert, then validate with a :mod:`tolstat._base.validate` checker."""
    def parse(text: str) -> Any:
        try:
            value = conv(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {conv.__name__} value: {text!r}") from None
        try:
            return check(name, value)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name
    return parse


def _suffix(name: str, allowed: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not text.lower().endswith(allowed):
            raise argparse.ArgumentTypeError(f"{text!r} must end in {' or '.join(allowed)}")
        return text

    parse.__name__ = name
    return parse


def _cmd_shift(args: argparse.Namespace) -> int:
    from tolstat import open_errors, shift
    from tolstat.assess import gpu_transfer

    if args.fp8_emulated:  # the shipped dataset: A and B are two of its hardware labels
        if args.a or args.b:
            raise ValueError("--fp8-emulated takes no error datasets A and B (it uses the shipped dataset); "
                             f"got {[x for x in (args.a, args.b) if x]}")
        ds = gpu_transfer.open_dataset()
        a, b = gpu_transfer.shift_pair(ds, args.hardware_a or gpu_transfer.H100,
                                       args.hardware_b or gpu_transfer.RTX4060)
    elif not (args.a and args.b):
        raise ValueError("shift needs two error datasets A and B (or --fp8-emulated for the shipped one)")
    else:
        a, b = open_errors(args.a), open_errors(args.b)
        if args.hardware_a:
            a = gpu_transfer.runs_of(a, args.hardware_a, variant=None)
        if args.hardware_b:
            b = gpu_transfer.runs_of(b, args.hardware_b, variant=None)
    res = shift(a, b, fp_budget=args.fp_budget, confidence=args.confidence,
                form=None if args.form == "none" else args.form)
    print(res.to_text())
    if args.fp8_emulated:
        print("\n" + gpu_transfer.transfer(ds, fp_budget=args.fp_budget, confidence=args.confidence).to_text())
    if args.output:
        res.to_json(args.output)
        print(f"wrote {args.output}")
    return 0


def _one_line_error(parser: argparse.ArgumentParser) -> None:
    def error(message: str) -> None:
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    parser.error = error  # type: ignore[method-assign]


def _count(flag: str) -> Callable[[str], Any]:
    from tolstat._base import validate as _validate

    return _arg(_validate.count, flag, int)


def _budget() -> Callable[[str], Any]:
    from tolstat._base import validate as _validate

    return _arg(_validate.budget, "fp_budget")


def _conf() -> Callable[[str], Any]:
    from tolstat._base import validate as _validate

    return _arg(_validate.unit_interval, "confidence")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``tolstat`` command."""
    p = _Parser(prog="tolstat", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    _add_data_commands(sub)
    _add_table_commands(sub)
    _add_report_commands(sub)
    return p


def _add_data_commands(sub: Any) -> None:
    """Subcommands that produce error data: ``demo``, ``evaluate``, ``collect``."""
    d = sub.add_parser("demo", help="collect errors of a bundled numpy matmul kernel and summarise")
    d.add_argument("--runs", type=_count("runs"), default=100)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("-o", "--output", type=_suffix("path", (".nc", ".zarr")),
                   help="save the error dataset (.nc or .zarr)")
    d.set_defaults(func=_cmd_demo)
    e = sub.add_parser("evaluate", help="the main job: recall and false positives of tolerance "
                       "methods on the embedded kernel corpus, side by side")
    e.add_argument("--quick", action="store_true", help="small shapes and fewer checks (about a minute)")
    e.add_argument("--fp-budget", type=_budget(), default=None,
                   help="false-positive budget per check, in [1e-9, 0.5] (default 0.01)")
    e.add_argument("--confidence", type=_conf(), default=None, help="confidence of thresholds (default 0.95)")
    e.add_argument("--n-cal", type=_count("n_cal"), default=None, help="calibration cases per (op, dtype)")
    e.add_argument("--n-test", type=_count("n_test"), default=None, help="test cases per (op, dtype)")
    e.add_argument("--ops", help="comma-separated ops (default: all)")
    e.add_argument("--seed", type=int, default=None)
    e.add_argument("-o", "--output", default="tolstat-results", help="output folder")
    e.add_argument("--per-bug", action="store_true", help="also print recall per bug kind")
    e.add_argument("--protocol", choices=("op", "kernel"), default=None,
                   help="thresholds per (op, dtype) over all correct variants (op, default), or per "
                   "kernel (op, dtype, variant), a buggy kernel checked against the variant it modifies")
    e.add_argument("--no-plots", action="store_true")
    e.add_argument("--shift-against", action="append", default=[], metavar="ERRORS",
                   help="also compare the calibration data with this error dataset, e.g. a GPU's "
                        "(tolstat shift, restricted to the groups and shapes evaluated; repeatable)")
    e.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    e.set_defaults(func=_cmd_evaluate)
    c = sub.add_parser("collect", help="collect an error dataset of your kernel (--kernel MODULE:FUNCTION "
                       "...) or of the corpus's correct kernels")
    c.add_argument("-o", "--output", required=True, type=_suffix("path", (".nc", ".zarr")), help=".nc or .zarr")
    c.add_argument("--ops", help="comma-separated ops (default: all)")
    c.add_argument("--dtypes", default="float16,bfloat16")
    c.add_argument("--cases", type=_count("cases"), default=100, help="cases per (op, dtype)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--quick", action="store_true")
    c.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    from tolstat.cli.user_kernel import add_arguments as _user_kernel_arguments

    _user_kernel_arguments(c)
    c.set_defaults(func=_cmd_collect)
    from tolstat.cli import scaffold as _sc

    i = sub.add_parser("init", help="write a calibrated pytest suite for torch kernels into a folder: kernels.py, "
                       "calibrate.py, tests/test_kernels.py, [tool.tolstat] (then: python calibrate.py; pytest)")
    i.add_argument("folder", nargs="?", default=".", help="the project folder (default: the current one)")
    i.add_argument("--op", nargs="+", default=list(_sc.DEFAULT_OPS), metavar="OP",
                   help=f"ops, torch function names (default: {' '.join(_sc.DEFAULT_OPS)}; templates: "
                        f"{', '.join(sorted(_sc.TEMPLATES))})")
    i.add_argument("--dtype", nargs="+", default=list(_sc.DEFAULT_DTYPES), metavar="DTYPE",
                   help=f"low-precision dtypes (default: {' '.join(_sc.DEFAULT_DTYPES)}; of {', '.join(_sc.DTYPES)})")
    i.add_argument("--runs", type=int, default=400, help="calibration runs per (op, dtype) (default 400, at least 300)")
    i.add_argument("--checks", type=int, default=4, help="checks of fresh inputs per (op, dtype) in the tests "
                                                         "(default 4)")
    i.add_argument("--force", action="store_true", help="overwrite kernels.py, calibrate.py, tests/test_kernels.py")
    i.set_defaults(func=_cmd_init)


_NO_VERIFY = ("read a table whose stored fields were edited after it was saved (checksum mismatch; its values "
              "are still validated), e.g. to review the edit")


def _add_table_commands(sub: Any) -> None:
    """Subcommands around tolerance tables: ``calibrate``, ``check``, ``merge``, ``show``, ``diff``."""
    k = sub.add_parser("calibrate", help="select thresholds under a false-positive budget -> TABLE.json")
    k.add_argument("errors", help="error dataset (.nc or .zarr)")
    k.add_argument("--fp-budget", type=_budget(), required=True,
                   help="largest probability that a check of a correct run fails, in [1e-9, 0.5]")
    k.add_argument("--confidence", type=_conf(), default=0.95)
    k.add_argument("--method", default="auto", choices=["auto", "order_statistic", "conformal", "evt"])
    k.add_argument("--statistic", default="max_abs", choices=["max_abs", "max_ulp", "max_rel"])
    k.add_argument("--form", default="auto",
                   choices=["auto", "operator", "none", "allclose", "size_aware", "normalised", "baseline"],
                   help="auto (default): certified per group, the operator combined score when the dataset has "
                        "operator statistics (docs/selection.md); none: one threshold on --statistic; the "
                        "others: a noise-scale model")
    k.add_argument("--cluster", default=None,
                   help="run label whose runs form one unit (e.g. case: the same inputs through several variants)")
    k.add_argument("--bias", action="store_true", help="add the bias statistic (budget split)")
    k.add_argument("--pool-hardware", action="store_true", help="one entry per (op, dtype) over all hardware")
    k.add_argument("-o", "--output", required=True, type=_suffix("path", (".json", ".nc")),
                   help="TABLE.json (or TABLE.nc)")
    k.set_defaults(func=_cmd_calibrate)
    h = sub.add_parser("check", help="check a kernel output (.npy) against its reference with a table")
    h.add_argument("actual", help=".npy (or single-array .npz) kernel output")
    h.add_argument("expected", help=".npy float64 reference")
    h.add_argument("--op", required=True)
    h.add_argument("--dtype", required=True)
    h.add_argument("--table", default=None, help="TABLE.json or .nc (optional with --uncalibrated model)")
    h.add_argument("--hardware", default=None)
    h.add_argument("--cov", action="append", metavar="NAME=VALUE", help="covariate, e.g. K=512")
    h.add_argument("--inputs", nargs="+", metavar="ARG",
                   help="the op's positional arguments, in the order of the torch function named by --op: "
                        ".npy/.npz files (arrays, in --dtype where raw bfloat16/float8) or Python literals "
                        "(e.g. -1, '(64,)'); the operator statistics (magnitude, K) are derived from them")
    h.add_argument("--param", action="append", metavar="NAME=VALUE",
                   help="a keyword argument of the op as a Python literal, e.g. eps=1e-5 (with --inputs)")
    h.add_argument("--magnitude", default=None, metavar="M.npy",
                   help="expert override: the op on absolute inputs (e.g. |A| @ |B|) instead of --inputs; 'ref' "
                        "for tables calibrated with magnitude='ref'")
    h.add_argument("--uncalibrated", default="raise", choices=["raise", "model"],
                   help="a group the table does not have (or no --table): 'raise' (default) or 'model': the "
                        "model-based threshold from zero runs (needs --inputs; docs/ops.md)")
    h.add_argument("--hardware-policy", default="error", choices=["exact", "pooled", "nearest", "error"],
                   help="when this machine (or --hardware) is not in the table (default: error; "
                        "see docs/plugin.md)")
    h.set_defaults(func=_cmd_check)
    m = sub.add_parser("merge", help="merge calibration data and CI records (labels/covariates reconciled, "
                       "repeated records dropped)")
    m.add_argument("inputs", nargs="+", help="error datasets (.nc or .zarr), preferred first")
    m.add_argument("-o", "--output", required=True, type=_suffix("path", (".nc", ".zarr")), help=".nc or .zarr")
    m.add_argument("--keep-duplicates", action="store_true", help="keep repeated identical records")
    m.set_defaults(func=_cmd_merge)
    mp = sub.add_parser("merge-parts", help="merge the record parts that a pytest session with --tolstat-record "
                        "left behind (interrupted or killed) into the record file")
    mp.add_argument("parts", help="the parts folder (.<record name>.parts-<id>, next to the record path)")
    mp.add_argument("record", type=_suffix("record", (".nc", ".zarr")), help="the record file to write (.nc or .zarr)")
    mp.add_argument("--keep", action="store_true", help="keep the parts after merging")
    mp.set_defaults(func=_cmd_merge_parts)
    w = sub.add_parser("show", help="list a tolerance table per group (thresholds also as atol/rtol)")
    w.add_argument("table", help="TABLE.json or .nc")
    w.add_argument("--no-verify", action="store_true", help=_NO_VERIFY)
    w.add_argument("--power", action="store_true",
                   help="also print what each group catches: standard wrong outputs, the smallest scale error and "
                        "offset caught on 90%% of the references, beside torch's defaults and atol=rtol=1e-2; warns "
                        "when a group passes all-zero or constant outputs (needs --corpus or --references)")
    _add_reference_options(w, "--power")
    w.set_defaults(func=_cmd_show)
    f = sub.add_parser("diff", help="per-group changes between two tolerance tables (for review): thresholds, "
                       "budgets, methods, scale models and certificates")
    f.add_argument("old")
    f.add_argument("new")
    f.add_argument("--changed-only", action="store_true", help="leave out unchanged groups")
    f.add_argument("--errors", metavar="ERRORS", help="also count, per group of this error dataset's runs (e.g. "
                                                      "the calibration runs), the decisions the change flips")
    f.add_argument("--no-verify", action="store_true", help=_NO_VERIFY)
    f.set_defaults(func=_cmd_diff)


def _add_reference_options(p: Any, what: str) -> None:
    """The references of a power report (``show --power``, ``report``): the corpus's or a file's."""
    p.add_argument("--corpus", action="store_true",
                   help=f"{what} on the embedded corpus's calibration cases (the table's ops must be corpus ops)")
    p.add_argument("--references", metavar="REFS.npz",
                   help=f"{what} on these references (tolstat.assess.power.save_references)")
    p.add_argument("--n-refs", type=_count("n_refs"), default=36, help="--corpus: references per group (default 36)")
    p.add_argument("--seed", type=int, default=0, help="--corpus: the calibration seed (default 0)")
    p.add_argument("--full-shapes", action="store_true", help="--corpus: the full shapes (default: the quick ones)")


def _add_report_commands(sub: Any) -> None:
    """Subcommands that report: ``report``, ``shift``, ``summary``, ``compare``."""
    r = sub.add_parser("report", help="an HTML page of a table on its error dataset (TABLE --errors ERRORS: per "
                       "group the decision values, the threshold, the runs nearest it, the recall table), or "
                       "a Markdown report of an evaluation folder")
    r.add_argument("source", help="TABLE.json or .nc (HTML report, with --errors), or a folder written by "
                                  "'tolstat evaluate' (Markdown report.md in it)")
    r.add_argument("--errors", metavar="ERRORS", help="the error dataset (.nc or .zarr) whose runs the HTML report "
                                                      "shows, usually the one the table was calibrated on")
    r.add_argument("-o", "--output", type=_suffix("output", (".html", ".htm")),
                   help="the HTML file (default: the table's path with .html)")
    r.add_argument("--nearest", type=_count("nearest"), default=5, help="runs listed per group (default 5)")
    _add_reference_options(r, "recall tables")
    r.add_argument("--no-verify", action="store_true", help=_NO_VERIFY)
    r.set_defaults(func=_cmd_report)
    t = sub.add_parser("shift", help="does a table calibrated on errors A hold on errors B (another "
                       "hardware)? score comparison and realised false-positive rate")
    t.add_argument("a", nargs="?", help="error dataset the table is calibrated on (.nc or .zarr)")
    t.add_argument("b", nargs="?", help="error dataset of the other hardware")
    t.add_argument("--fp8-emulated", action="store_true",
                   help="A and B from the shipped FP8 GEMM dataset of two emulated GPUs (correct runs; A: "
                        "--hardware-a, default H100-PCIe/hopper; B: --hardware-b, default RTX4060/ada), then "
                        "the transfer table: FP rates per hardware policy and recall per bug (docs/gpu_transfer.md)")
    t.add_argument("--hardware-a", default=None, metavar="LABEL", help="only A's runs of this hardware label")
    t.add_argument("--hardware-b", default=None, metavar="LABEL", help="only B's runs of this hardware label")
    t.add_argument("--fp-budget", type=_budget(), default=0.01,
                   help="false-positive budget per check, in [1e-9, 0.5] (default 0.01)")
    t.add_argument("--confidence", type=_conf(), default=0.95)
    t.add_argument("--form", default="allclose",
                   help="noise-scale model of the score: allclose (default), size_aware, normalised, baseline "
                        "or none (plain max_abs)")
    t.add_argument("-o", "--output", help="write the report as JSON")
    t.set_defaults(func=_cmd_shift)
    _one_line_error(t)
    s = sub.add_parser("summary", help="summarise an error dataset per (op, dtype, hardware), with its "
                                       "size on disk and what it keeps")
    s.add_argument("errors")
    s.set_defaults(func=_cmd_summary)
    from tolstat.cli.compare import add_cli as _add_compare  # tolstat compare

    _add_compare(sub)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tolstat`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyError as exc:  # str(KeyError) quotes its message
        msg = exc.args[0] if exc.args else exc
    except (ValueError, TypeError, OSError, RuntimeError) as exc:
        msg = exc if str(exc) else type(exc).__name__
    print(f"tolstat {args.command}: error: {_one_line(msg)}", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
