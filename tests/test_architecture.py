"""The package's layout: a one-way import flow and short functions (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "tolstat"

#: the packages of the data flow, first to last; a module may import modules of its own
#: package or of earlier ones, never later ones (a new package must be given a place here).
#: The operator models (ops) come right after measurement, then the corpus: it may use only
#: the base, the metrics and the operator models.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("tolstat._version", "tolstat._base", "tolstat._base.*")),
    ("measure", ("tolstat.measure", "tolstat.measure.*")),
    ("ops", ("tolstat.ops", "tolstat.ops.*")),
    ("corpus", ("tolstat.corpus", "tolstat.corpus.*")),
    ("dataset", ("tolstat.dataset", "tolstat.dataset.*")),
    ("models", ("tolstat.models", "tolstat.models.*")),
    ("calibration", ("tolstat.calibration", "tolstat.calibration.*")),
    ("checks", ("tolstat.checks", "tolstat.checks.*")),
    ("assess", ("tolstat.assess", "tolstat.assess.*")),
    ("cli", ("tolstat.cli", "tolstat.cli.*", "tolstat")),
]

#: third-party modules only the command line may import (printing and plotting are its job)
CLI_ONLY = ("argparse", "matplotlib")

#: largest function (lines without its docstring); numba kernels are exempt
MAX_FUNCTION_LINES = 80


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _layer(mod: str) -> int:
    for i, (_, names) in enumerate(LAYERS):
        for n in names:
            if mod == n or (n.endswith(".*") and mod.startswith(n[:-1])):
                return i
    raise AssertionError(f"module {mod} has no layer: add it to LAYERS in {Path(__file__).name}")


def _imports(mod: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Package modules imported anywhere in ``path`` (module level and inside functions)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
        else:
            continue
        for n in names:
            while n and n not in modules:  # "tolstat.x.y" where y is a name -> "tolstat.x"
                n = n.rpartition(".")[0]
            if n and n != mod:
                out.add(n)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def test_every_module_has_a_layer_and_imports_only_earlier_layers():
    bad = []
    for mod, deps in _graph().items():
        for d in sorted(deps):
            if _layer(d) > _layer(mod):
                bad.append(f"{mod} ({LAYERS[_layer(mod)][0]}) imports {d} ({LAYERS[_layer(d)][0]})")
    assert not bad, "imports against the data flow:\n" + "\n".join(bad)


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_no_import_cycles():
    graph = _graph()
    # an edge from a module to its own parent package (e.g. cli: "from . import save")
    # is not a cycle risk beyond the package's own imports, which are counted
    sub = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    cycle = _find_cycle(sub)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cycle_finder_finds_cycles():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def _package(mod: str) -> str:
    """The package of the flow a module belongs to (``tolstat.dataset.io`` -> ``tolstat.dataset``)."""
    return LAYERS[_layer(mod)][0]


def test_no_private_imports_across_packages():
    """No module imports a private name (``_x``) of a module in another package of the flow;
    the private base (``tolstat._base``) exists to be imported by all of them."""
    modules = _modules()
    bad = []
    for mod, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tolstat"):
                src = node.module
                while src not in modules:
                    src = src.rpartition(".")[0]
                if _package(src) in ("base", _package(mod)):
                    continue
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        bad.append(f"{mod} imports {node.module}.{a.name}")
    assert not bad, "\n".join(bad)


def _third_party_imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_only_the_cli_parses_arguments_or_plots():
    bad = [f"{mod} imports {m}" for mod, path in _modules().items() if _package(mod) != "cli"
           for m in sorted(_third_party_imports(path) & set(CLI_ONLY))]
    assert not bad, "argument parsing and plotting belong to tolstat.cli:\n" + "\n".join(bad)


def test_layers_are_packages_in_flow_order():
    """Every package of the flow is a folder of tolstat/, and the folders are exactly the flow."""
    folders = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").exists())
    named = sorted(n.split(".")[1] for _, names in LAYERS for n in names if n.count(".") == 1 and not n.endswith("*")
                   and (PKG / n.split(".")[1]).is_dir())
    assert folders == named


def _is_numba(fn: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) or "vectorize" in ast.unparse(d) for d in fn.decorator_list)


def _length(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    n = fn.end_lineno - fn.lineno + 1
    first = fn.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        n -= first.end_lineno - first.lineno + 1
    return n


def test_functions_are_short():
    long = []
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_numba(node):
                if _length(node) > MAX_FUNCTION_LINES:
                    long.append(f"{mod}.{node.name}: {_length(node)} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (docstring excluded):\n" + "\n".join(long)


MAX_PARAMETERS = 10


def _n_parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> int:
    a = fn.args
    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return n - (1 if method and (a.posonlyargs or a.args) else 0)


def _public_functions(tree: ast.Module):
    """Module-level public functions and the public methods of public classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            yield node.name, node, False
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for f in node.body:
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and not f.name.startswith("_"):
                    yield f"{node.name}.{f.name}", f, True


def test_no_public_function_takes_more_than_ten_parameters():
    """Long parameter lists are option objects (e.g. SelectOptions, CollectOptions, CertifyOptions)."""
    long = []
    for mod, path in _modules().items():
        if any(part.startswith("_") for part in mod.split(".")[1:]):
            continue  # private modules
        for name, fn, method in _public_functions(ast.parse(path.read_text(encoding="utf-8"))):
            if _n_parameters(fn, method) > MAX_PARAMETERS:
                long.append(f"{mod}.{name}: {_n_parameters(fn, method)} parameters")
    assert not long, f"public functions over {MAX_PARAMETERS} parameters:\n" + "\n".join(long)


def test_parameter_count_counts_every_kind_and_drops_self():
    f = ast.parse("def f(a, /, b, *c, d, **e): pass").body[0]
    assert _n_parameters(f, False) == 5
    m = ast.parse("def m(self, x, *, y): pass").body[0]
    assert _n_parameters(m, True) == 2


def test_length_counts_code_not_docstring():
    fn = ast.parse('def f():\n    """doc\n\n    more"""\n    x = 1\n    return x\n').body[0]
    assert _length(fn) == 3


@pytest.mark.parametrize("mod", ["tolstat.calibration.selection", "tolstat.checks.checking", "tolstat.assess.evaluation"])
def test_known_edges_are_seen(mod):
    """The graph builder sees the imports it must judge (it cannot pass by seeing nothing)."""
    graph = _graph()
    assert graph[mod], mod
    assert "tolstat.calibration.table" in graph["tolstat.checks.checking"]
    assert "tolstat.assess.methods" in graph["tolstat.assess.evaluation"]
