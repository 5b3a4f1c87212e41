"""Sphinx configuration of the tolstat docs site.

Build (no network needed): ``pip install -e ".[docs]"`` then
``sphinx-build -W -b html docs docs/_build/html``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

from tolstat import __version__  # noqa: E402

project = "tolstat"
author = "tolstat developers"
copyright = "tolstat developers"
version = release = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "api/generated/*.md"]
templates_path = ["_templates"]

# Markdown pages: heading anchors so that links like selection.md#budget resolve
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# API reference from the numpydoc docstrings
autosummary_generate = True
autosummary_imported_members = True
autosummary_ignore_module_all = False  # a module documents the names of its __all__
autodoc_typehints = "none"  # the numpydoc "Parameters" sections carry the types
autodoc_default_options = {"members": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

html_theme = "alabaster"
html_title = f"tolstat {release}"
html_static_path: list[str] = []
