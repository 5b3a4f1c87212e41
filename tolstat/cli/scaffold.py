"""``tolstat init``: a calibrated pytest suite for torch kernels, written into a folder.

The scaffold is the five-minute path of the tutorial as files: ``kernels.py`` (a kernel,
its float64 reference and a seeded input generator per op, each op one of
:mod:`tolstat.ops`, so that ``inputs=`` carries the operator model), ``calibrate.py``
(``collect`` -> ``select`` -> ``tolerances.json``), ``tests/test_kernels.py`` (checks of
fresh inputs and one of a 1% error, under the pytest plugin's suite budget), the
``[tool.tolstat]`` configuration, a root ``conftest.py`` (so that the tests import
``kernels``) and a ``.gitignore`` line for the error dataset. The kernels written are
torch's own functions in the low-precision dtype: the suite is green as written, and the
user replaces each ``*_kernel`` body with a call to their kernel.

Nothing is overwritten unless ``force``; each file is written atomically.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

__all__ = ["TEMPLATES", "DTYPES", "Scaffold", "plan", "write"]

#: torch dtypes of the scaffold's ``--dtype`` names
DTYPES = {"fp16": "torch.float16", "bf16": "torch.bfloat16", "fp32": "torch.float32"}

_SIZES = "int(rng.choice([64, 256, 1024]))"

#: per op: the kernel, its reference and its input generator (``{sizes}`` = the row length K)
TEMPLATES: dict[str, str] = {
    "matmul": '''
def matmul_kernel(a, b):                 # replace with your kernel: low-precision in and out
    return torch.matmul(a, b)


def matmul_reference(a, b):              # float64 on the same (rounded) inputs
    return torch.matmul(a.double(), b.double())


def matmul_inputs(dtype):
    def make(rng):                       # one run's arguments, as torch.matmul takes them
        k = {sizes}
        a = torch.from_numpy(rng.standard_normal((32, k))).to(dtype)
        b = torch.from_numpy(rng.standard_normal((k, 32))).to(dtype)
        return tolstat.Inputs(args=(a, b))
    return make
''',
    "linear": '''
def linear_kernel(x, weight, bias):      # replace with your kernel: low-precision in and out
    return F.linear(x, weight, bias)


def linear_reference(x, weight, bias):   # float64 on the same (rounded) inputs
    return F.linear(x.double(), weight.double(), bias.double())


def linear_inputs(dtype):
    def make(rng):                       # one run's arguments, as F.linear takes them
        k = {sizes}
        x = torch.from_numpy(rng.standard_normal((32, k))).to(dtype)
        w = torch.from_numpy(rng.standard_normal((64, k)) / k ** 0.5).to(dtype)
        b = torch.from_numpy(rng.standard_normal(64)).to(dtype)
        return tolstat.Inputs(args=(x, w, b))
    return make
''',
    "softmax": '''
def softmax_kernel(x, dim):              # replace with your kernel: low-precision in and out
    return torch.softmax(x, dim=dim)


def softmax_reference(x, dim):           # float64 on the same (rounded) inputs
    return torch.softmax(x.double(), dim=dim)


def softmax_inputs(dtype):
    def make(rng):                       # one run's arguments, as torch.softmax takes them
        n = {sizes}
        x = torch.from_numpy(rng.standard_normal((16, n)) * 3.0).to(dtype)
        return tolstat.Inputs(args=(x, -1))
    return make
''',
    "layer_norm": '''
def layer_norm_kernel(x, normalized_shape, weight, bias, eps=1e-5):  # replace with your kernel
    return F.layer_norm(x, normalized_shape, weight, bias, eps=eps)


def layer_norm_reference(x, normalized_shape, weight, bias, eps=1e-5):
    return F.layer_norm(x.double(), normalized_shape, weight.double(), bias.double(), eps=eps)


def layer_norm_inputs(dtype):
    def make(rng):                       # one run's arguments, as F.layer_norm takes them
        n = {sizes}
        x = torch.from_numpy(rng.standard_normal((16, n)) + 1.0).to(dtype)
        w = torch.from_numpy(1.0 + 0.1 * rng.standard_normal(n)).to(dtype)
        b = torch.from_numpy(0.1 * rng.standard_normal(n)).to(dtype)
        return tolstat.Inputs(args=(x, (n,), w, b), kwargs={{"eps": 1e-5}})
    return make
''',
    "rms_norm": '''
def rms_norm_kernel(x, normalized_shape, weight, eps=1e-6):  # replace with your kernel
    return F.rms_norm(x, normalized_shape, weight, eps=eps)


def rms_norm_reference(x, normalized_shape, weight, eps=1e-6):
    return F.rms_norm(x.double(), normalized_shape, weight.double(), eps=eps)


def rms_norm_inputs(dtype):
    def make(rng):                       # one run's arguments, as F.rms_norm takes them
        n = {sizes}
        x = torch.from_numpy(rng.standard_normal((16, n))).to(dtype)
        w = torch.from_numpy(1.0 + 0.1 * rng.standard_normal(n)).to(dtype)
        return tolstat.Inputs(args=(x, (n,), w), kwargs={{"eps": 1e-6}})
    return make
''',
    "gelu": '''
def gelu_kernel(x):                      # replace with your kernel: low-precision in and out
    return F.gelu(x)


def gelu_reference(x):                   # float64 on the same (rounded) inputs
    return F.gelu(x.double())


def gelu_inputs(dtype):
    def make(rng):                       # one run's arguments, as F.gelu takes them
        n = {sizes}
        x = torch.from_numpy(rng.standard_normal((16, n)) * 3.0).to(dtype)
        return tolstat.Inputs(args=(x,))
    return make
''',
    "sum": '''
def sum_kernel(x, dim):                  # replace with your kernel: low-precision in and out
    return torch.sum(x, dim)


def sum_reference(x, dim):               # float64 on the same (rounded) inputs
    return torch.sum(x.double(), dim)


def sum_inputs(dtype):
    def make(rng):                       # one run's arguments, as torch.sum takes them
        n = {sizes}
        x = torch.from_numpy(rng.standard_normal((16, n))).to(dtype)
        return tolstat.Inputs(args=(x, -1))
    return make
''',
}

TEMPLATES["log_softmax"] = TEMPLATES["softmax"].replace("softmax", "log_softmax")
TEMPLATES = dict(sorted(TEMPLATES.items()))

DEFAULT_OPS = ("matmul", "softmax", "layer_norm")
DEFAULT_DTYPES = ("fp16", "bf16")

_KERNELS_HEAD = '''"""The kernels under test, their float64 references and one run's inputs (tolstat init).

Replace the body of each ``*_kernel`` with a call to your kernel; keep its arguments those
of the torch function the op is named after, so that ``inputs=`` gives tolstat the
operator model (the magnitude and reduction length of every output element). Then run
``python calibrate.py`` again and commit the new ``tolerances.json``. For a GPU kernel,
create the inputs on the device (``.to("cuda")`` in each ``make``) and calibrate on that
machine: tolerances belong to the hardware they were measured on (tolstat labels the runs
``cuda:<GPU name>``).
"""
import torch
import torch.nn.functional as F

import tolstat

DTYPES = {{{dtypes}}}
'''

_KERNELS_TAIL = '''

KERNELS = {{{kernels}}}

#: the (op, dtype) groups that calibrate.py calibrates and tests/test_kernels.py checks
CASES = [(op, dtype) for op in KERNELS for dtype in DTYPES]


def case(op, dtype):
    """(kernel, reference, make_inputs) of one group; make_inputs(rng) -> tolstat.Inputs."""
    kernel, reference, inputs = KERNELS[op]
    return kernel, reference, inputs(DTYPES[dtype])
'''

_CALIBRATE = '''"""Calibrate tolerances.json from correct runs of the kernels in kernels.py (tolstat init).

    python calibrate.py

collects {runs} correct runs per (op, dtype) on this machine, writes their errors to
errors.nc (for review: ``tolstat report tolerances.json --errors errors.nc``; not to be
committed) and the tolerance table, selected by tolstat's default under a false-positive
budget of 1% per check, to tolerances.json (commit it).
"""
import tolstat

from kernels import CASES, case

RUNS = {runs}            # per group; the default needs at least 300 for 1% at 95% confidence

parts = []
for seed, (op, dtype) in enumerate(CASES):
    kernel, reference, make_inputs = case(op, dtype)
    parts.append(tolstat.collect(kernel, reference, make_inputs, op=op, dtype=dtype,
                                 runs=RUNS, seed=seed))
errors = tolstat.concat(parts)
tolstat.save(errors, "errors.nc")
table = tolstat.select(errors, fp_budget=0.01)
table.to_json("tolerances.json")
print(table)
'''

_TESTS = '''"""Checks of the kernels in kernels.py against tolerances.json (tolstat init).

Every check counts against the suite budget of pyproject.toml's [tool.tolstat]: each
parametrised test below is one check.
"""
import numpy as np
import pytest

from kernels import CASES, case

SEEDS = range({checks})       # fresh inputs, different from the calibration runs'


def outputs(op, dtype, seed):
    kernel, reference, make_inputs = case(op, dtype)
    inp = make_inputs(np.random.default_rng([2**31, seed]))
    return kernel(*inp.args, **inp.kwargs), reference(*inp.args, **inp.kwargs), inp


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("op, dtype", CASES)
def test_kernel(tolstat_check, op, dtype, seed):
    out, ref, inp = outputs(op, dtype, seed)
    tolstat_check(out, ref, op=op, dtype=dtype, inputs=inp.args, params=inp.kwargs)


@pytest.mark.parametrize("op, dtype", CASES)
def test_a_one_percent_error_fails(tolstat_check, op, dtype):
    out, ref, inp = outputs(op, dtype, len(SEEDS))
    with pytest.raises(AssertionError):
        tolstat_check(out * 1.01, ref, op=op, dtype=dtype, inputs=inp.args, params=inp.kwargs)
'''

_TOOL_SECTION = '''[tool.tolstat]
table = "tolerances.json"
# the whole suite fails a correct kernel with probability <= 1%: each check gets
# 0.01 / (number of checks). Beyond what the calibration runs support, the threshold is
# model-based (a normal-quantile tail; not distribution-free; docs: plugin.md). For a
# distribution-free suite, remove suite_tail and calibrate with
# RUNS >= log(0.05) / log(1 - 0.01 / checks) runs per group.
suite_budget = 0.01
suite_tail = "model"
'''

_CONFTEST = '''"""The project's root: pytest puts this folder on sys.path, so tests import kernels.py."""
'''

_GITIGNORE_LINE = "errors.nc"


@dataclass(frozen=True)
class Scaffold:
    """What :func:`write` writes: per path (relative to the folder) its text and how.

    Attributes
    ----------
    root : Path
        The folder.
    files : dict[str, str]
        New files, relative path -> text.
    appended : dict[str, str]
        Existing files that get text appended (``pyproject.toml``, ``.gitignore``).
    kept : tuple[str, ...]
        Existing files left as they are, with the reason.
    """

    root: Path
    files: dict[str, str]
    appended: dict[str, str]
    kept: tuple[str, ...]


def _check_names(ops: Sequence[str], dtypes: Sequence[str]) -> None:
    if not ops:
        raise ValueError("--op: at least one op is needed")
    for op in ops:
        if op not in TEMPLATES:
            raise ValueError(f"--op {op!r}: tolstat init has templates for {sorted(TEMPLATES)}; for another "
                             "op, start from one of them and register the op (docs: ops.md)")
    for dt in dtypes:
        if dt not in DTYPES:
            raise ValueError(f"--dtype {dt!r}: one of {sorted(DTYPES)}")
    if not dtypes:
        raise ValueError("--dtype: at least one dtype is needed")
    for name, vals in (("--op", ops), ("--dtype", dtypes)):
        dup = sorted({v for v in vals if list(vals).count(v) > 1})
        if dup:
            raise ValueError(f"{name} {dup[0]!r} is given twice")


def plan(root: str | os.PathLike[str], ops: Sequence[str] = DEFAULT_OPS,
         dtypes: Sequence[str] = DEFAULT_DTYPES, *, runs: int = 400, checks: int = 4,
         force: bool = False) -> Scaffold:
    """The files :func:`write` would write into ``root``, without writing.

    Parameters
    ----------
    root : path
        The project folder (created if missing).
    ops : sequence of str
        Ops of :data:`TEMPLATES` (torch function names).
    dtypes : sequence of str
        Keys of :data:`DTYPES`.
    runs : int
        Calibration runs per group in ``calibrate.py`` (at least 300, the fewest the default
        ``select`` needs for a 1% budget at 95% confidence: 299 for the order statistic, one
        for the noise model's normalisers).
    checks : int
        Checks of fresh inputs per group in the tests.
    force : bool
        Overwrite ``kernels.py``, ``calibrate.py`` and ``tests/test_kernels.py``.

    Raises
    ------
    ValueError
        An unknown op or dtype, ``runs`` below 300, ``checks`` below 1, ``root`` a file, or
        an existing scaffold file without ``force``.
    """
    _check_names(ops, dtypes)
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 300:
        raise ValueError(f"runs (--runs) must be an integer >= 300 (the fewest the default select needs for a 1% "
                         f"budget at 95% confidence), got {runs!r}")
    if isinstance(checks, bool) or not isinstance(checks, int) or checks < 1:
        raise ValueError(f"checks (--checks) must be an integer >= 1, got {checks!r}")
    rootp = Path(root)
    if rootp.exists() and not rootp.is_dir():
        raise ValueError(f"folder {os.fspath(rootp)!r} is a file")
    dtype_src = ", ".join(f'"{d}": {DTYPES[d]}' for d in dtypes)
    kernels_src = ", ".join(f'"{op}": ({op}_kernel, {op}_reference, {op}_inputs)' for op in ops)
    body = "\n".join(TEMPLATES[op].format(sizes=_SIZES) for op in ops)
    files = {
        "kernels.py": _KERNELS_HEAD.format(dtypes=dtype_src) + body + _KERNELS_TAIL.format(kernels=kernels_src),
        "calibrate.py": _CALIBRATE.format(runs=runs),
        "tests/test_kernels.py": _TESTS.format(checks=checks),
    }
    existing = [p for p in files if (rootp / p).exists()]
    if existing and not force:
        raise ValueError(f"{', '.join(existing)} already exist in {os.fspath(rootp)!r}; --force overwrites them")
    appended: dict[str, str] = {}
    kept: list[str] = []
    pp = rootp / "pyproject.toml"
    if not pp.exists():
        files["pyproject.toml"] = _TOOL_SECTION
    elif re.search(r"^\s*\[tool\.tolstat\]", pp.read_text(encoding="utf-8"), flags=re.M):
        kept.append("pyproject.toml (it has a [tool.tolstat] table already; tolstat init's: "
                    "table = 'tolerances.json', suite_budget = 0.01, suite_tail = 'model')")
    else:
        appended["pyproject.toml"] = "\n" + _TOOL_SECTION
    if (rootp / "conftest.py").exists():
        kept.append("conftest.py (exists: pytest puts its folder on sys.path already)")
    else:
        files["conftest.py"] = _CONFTEST
    gi = rootp / ".gitignore"
    if not gi.exists():
        files[".gitignore"] = _GITIGNORE_LINE + "\n"
    elif _GITIGNORE_LINE not in gi.read_text(encoding="utf-8").splitlines():
        appended[".gitignore"] = _GITIGNORE_LINE + "\n"
    return Scaffold(rootp, files, appended, tuple(kept))


def write(scaffold: Scaffold) -> list[Path]:
    """Write a :func:`plan`; each file atomically. Returns the paths written."""
    from tolstat._base.util import atomic_write_text

    out = []
    scaffold.root.mkdir(parents=True, exist_ok=True)
    for rel, text in scaffold.files.items():
        path = scaffold.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        out.append(atomic_write_text(path, text))
    for rel, text in scaffold.appended.items():
        path = scaffold.root / rel
        old = path.read_text(encoding="utf-8")
        sep = "" if not old or old.endswith("\n") else "\n"
        out.append(atomic_write_text(path, old + sep + text))
    return out
