"""Sphinx configuration of graphmodule's documentation (``sphinx-build -W docs docs/_build``)."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))  # the package of this checkout, for autodoc

import graphmodule  # noqa: E402

project = "graphmodule"
author = "the graphmodule authors"
copyright = "the graphmodule authors"
release = version = graphmodule.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"

html_theme = "furo"
html_title = f"graphmodule {release}"
html_static_path = []


def _prepare(app, what, name, obj, options, lines):
    """Before napoleon reads a docstring: the package's map of its private modules (for
    contributors) is left out, and a "Keyword-only options:" section, whose name napoleon's
    section pattern cannot match (the hyphen), is read as "Keyword Args:"."""
    if what == "module" and name == "graphmodule":
        lines.clear()
    lines[:] = ["Keyword Args:" if line == "Keyword-only options:" else line for line in lines]


def setup(app):
    app.connect("autodoc-process-docstring", _prepare, priority=100)  # napoleon's runs at 500
