"""Every ```python snippet of README.md and docs/*.md runs as written.

Each file's snippets run in order in one namespace, in a temporary folder (files they
write land there). A snippet that is deliberately not runnable is marked with a
``<!-- no-run -->`` line right above its fence; keep those rare. Python code must be
fenced as ``python`` (other spellings would silently escape this test).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NO_RUN = "<!-- no-run -->"
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([^\s`]*)")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md")
                                        if "_build" not in p.parts)]


FILE = re.compile(r"^<!-- file: (\S+) -->$")


def _blocks(path: Path) -> list[tuple[int, str, str, str]]:
    """(first line number, language, code, the line above the fence) of each fenced block."""
    out = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group(1), m.group(2).lower()
        prev = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
        j = i + 1
        while j < len(lines) and not lines[j].startswith(fence):
            j += 1
        if info in ("py", "python3", "pycon", "ipython"):
            raise AssertionError(f"{path.name}:{i + 1}: fence python code as ```python, not {info!r}")
        out.append((i + 2, info, "\n".join(lines[i + 1:j]), prev))
        i = j + 1
    return out


def snippets(path: Path) -> list[tuple[int, str, bool]]:
    """(first line number, code, runnable) of each ```python block of ``path``.

    A block under a ``<!-- file: NAME -->`` line is a file of a project, not a snippet (see
    :func:`file_blocks`); it is left out here.
    """
    return [(line, code, prev != NO_RUN) for line, info, code, prev in _blocks(path)
            if info == "python" and not FILE.match(prev)]


def file_blocks(path: Path) -> dict[str, str]:
    """The files a page spells out: ``{NAME: text}`` of each block under ``<!-- file: NAME -->``."""
    out: dict[str, str] = {}
    for line, _, code, prev in _blocks(path):
        m = FILE.match(prev)
        if m:
            if m.group(1) in out:
                raise AssertionError(f"{path.name}:{line}: file {m.group(1)!r} spelled out twice")
            out[m.group(1)] = code + "\n"
    return out


def test_there_are_snippets_and_few_are_exempt():
    found = {p.name: snippets(p) for p in doc_files()}
    total = sum(len(s) for s in found.values())
    exempt = [(name, line) for name, s in found.items() for line, _, run in s if not run]
    assert total >= 8, found.keys()
    assert len(exempt) <= 2, exempt


def test_snippet_parser(tmp_path):
    md = tmp_path / "x.md"
    md.write_text("text\n```python\nx = 1\n```\n\n<!-- no-run -->\n```python\nboom(\n```\n"
                  "```bash\nls\n```\n````python\ny = x\n````\n")
    assert snippets(md) == [(3, "x = 1", True), (8, "boom(", False), (14, "y = x", True)]
    md.write_text("<!-- file: a/b.py -->\n```python\nx = 1\n```\n<!-- file: c.toml -->\n```toml\n[t]\n```\n"
                  "```python\ny = 2\n```\n")
    assert snippets(md) == [(10, "y = 2", True)]
    assert file_blocks(md) == {"a/b.py": "x = 1\n", "c.toml": "[t]\n"}
    md.write_text("```py\nx = 1\n```\n")
    with pytest.raises(AssertionError, match="fence python code as"):
        snippets(md)


#: guides whose snippets take several seconds (whole collect/compare/shift runs): behind
#: the ``slow`` marker, which CI runs
SLOW_DOCS = {"README.md", "docs/compare.md", "docs/shift.md"}


def _doc_params() -> list:
    out = []
    for p in doc_files():
        if any(b[2] for b in snippets(p)):
            rel = str(p.relative_to(ROOT))
            out.append(pytest.param(p, id=rel, marks=[pytest.mark.slow] if rel in SLOW_DOCS else []))
    return out


@pytest.mark.parametrize("path", _doc_params())
def test_snippets_run(path, tmp_path, monkeypatch):
    blocks = [b for b in snippets(path) if b[2]]
    if any(re.search(r"^\s*(import|from) torch\b", code, re.M) for _, code, _ in blocks):
        pytest.importorskip("torch")
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"snippets_{path.stem}"}
    for line, code, _ in blocks:
        # pad so that tracebacks show the line number in the Markdown file
        exec(compile("\n" * (line - 1) + code, str(path), "exec"), namespace)
