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
