"""The test layout that docs/architecture.md names: every module of the package, and its tests.

Tests mirror modules (docs/development.md): a module has a test file of its own
(``tests/test_<module>.py``), or the table names the behaviour files that cover it. A module
added without a row, a row naming a module or a file that is gone, or a module's own test file
left out of its row, fails here.
"""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "graphmodule")
ARCHITECTURE = os.path.join(ROOT, "docs", "architecture.md")
HEADING = "## Test layout"
ROW = re.compile(r"^\| `(\w+)` \| (.+) \|$", re.M)
NAME = re.compile(r"`((?:tests/)?[\w/]+(?:\.py|/))`")


def rows() -> dict[str, list[str]]:
    """``module -> the test files and folders its row names``, in the row's order."""
    with open(ARCHITECTURE) as f:
        text = f.read()
    assert HEADING in text, f"expected a section {HEADING!r} in docs/architecture.md, got none; add it"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    return {m.group(1): NAME.findall(m.group(2)) for m in ROW.finditer(section)}


def modules() -> list[str]:
    """The package's modules: ``__init__`` and every ``_*.py``."""
    return sorted(f[:-3] for f in os.listdir(PACKAGE) if f.startswith("_") and f.endswith(".py"))


def test_every_module_has_a_row():
    table = rows()
    missing = [m for m in modules() if m not in table]
    assert not missing, (
        f"expected every module of graphmodule/ in the test layout of docs/architecture.md, got no row for "
        f"{', '.join(missing)}; add one: its test file (tests/test{missing[0]}.py), or the behaviour files that "
        "cover it"
    )


def test_every_row_names_a_module_of_the_package():
    gone = sorted(set(rows()) - set(modules()))
    assert not gone, f"expected rows for modules of graphmodule/ only, got {', '.join(gone)}; remove their rows"


def test_every_row_names_test_files_that_exist():
    table = rows()
    for module, names in table.items():
        assert names, f"expected at least one test file in the row of {module}, got none"
        for name in names:
            path = os.path.join(ROOT, name) if name.startswith("tests/") else os.path.join(ROOT, "tests", name)
            assert os.path.exists(path), f"expected {name} (named for {module}) under tests/, got no such file"


def test_a_modules_own_test_file_comes_first_in_its_row():
    table = rows()
    for module in modules():
        own = f"test{module}.py"
        if os.path.exists(os.path.join(ROOT, "tests", own)):
            assert table.get(module, [None])[0] == own, (
                f"expected {own} first in the row of {module} in docs/architecture.md, got {table.get(module)}"
            )
