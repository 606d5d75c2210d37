"""The code in README.md and docs/*.md runs, and prints what the page says it prints.

Each page's code blocks run in order in one namespace, as a reader would run them:

- a ```` ```python ```` block is executed (it must not raise);
- a ```` ```pycon ```` block (``>>>`` prompts) is a doctest: its output and exceptions must be
  the ones shown (``...`` matches any text; an exception may be shown without its module path,
  ``InputMismatchError: ...``);
- a ```` ```py ```` block is shown only, never run: code that needs a GPU or the network.

README.md runs as a CPU user runs it (no CUDA: graphmodule warns and runs eagerly, with its
checks). The pages of docs/ describe what happens on a GPU: without CUDA they run with
``backend="simulate"`` as the default backend, which runs the capture and replay machinery on
the CPU (a replay runs the recorded tensor operations), so their counts of captures and replays hold.
"""

from __future__ import annotations

import doctest
import os
import re
import warnings

import pytest
import torch

import graphmodule

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
PAGES = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(DOCS) if f.endswith(".md"))
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def blocks(page: str) -> list[tuple[str, str, int]]:
    """``(language, code, line)`` of each fenced block of ``page``."""
    with open(os.path.join(ROOT, page)) as f:
        text = f.read()
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 2) for m in FENCE.finditer(text)]


class Checker(doctest.OutputChecker):
    """doctest's checker, letting an exception be shown without its module path."""

    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        got = re.sub(r"^(?:[\w]+\.)+(\w+(?:Error|Exception|Warning)\b)", r"\1", got, flags=re.M)
        return super().check_output(want, got, optionflags)


class SimulatedWhereNoCuda(graphmodule.CudaGraphModule):
    """``CudaGraphModule`` with ``backend="simulate"`` as its default (docs pages, no CUDA)."""

    def __init__(self, module, *args, backend="simulate", **kwargs):
        super().__init__(module, *args, backend=backend, **kwargs)


SimulatedWhereNoCuda.__name__ = SimulatedWhereNoCuda.__qualname__ = "CudaGraphModule"


def run_page(page: str) -> None:
    namespace: dict = {"__name__": "__main__"}
    runner = doctest.DocTestRunner(checker=Checker(), optionflags=FLAGS)
    for language, code, line in blocks(page):
        where = f"{page}:{line}"
        if language == "python":
            try:
                exec(compile(code, where, "exec"), namespace)
            except Exception as err:
                raise AssertionError(f"the ```python block at {where} raised {type(err).__name__}: {err}") from err
        elif language == "pycon":
            test = doctest.DocTestParser().get_doctest(code, namespace, page, page, line - 1)
            failures: list[str] = []
            runner.run(test, out=failures.append, clear_globs=False)
            namespace.update(test.globs)  # (a DocTest runs in a copy of the namespace)
            assert not failures, f"the ```pycon block at {where}:\n" + "".join(failures)


@pytest.mark.parametrize("page", PAGES)
def test_page_code_runs(page, monkeypatch):
    if page.startswith("docs") and not torch.cuda.is_available():
        monkeypatch.setattr(graphmodule, "CudaGraphModule", SimulatedWhereNoCuda)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="CudaGraphModule: CUDA is not available")
        torch.manual_seed(0)
        run_page(page)



def test_troubleshooting_covers_every_error_and_capture_cause():
    """Each error class graphmodule exports has its section, and each cause a CaptureError can
    name (graphmodule/_diagnose.py) its row, with the fix."""
    from graphmodule import _diagnose

    with open(os.path.join(DOCS, "troubleshooting.md")) as f:
        page = f.read()
    errors = [n for n in graphmodule.__all__ if n.endswith("Error") and n != "GraphModuleError"]
    assert errors and all(f"\n## {name}\n" in page for name in errors), errors
    causes = [cause for _, cause, _ in _diagnose._CAUSES] + [_diagnose.USER_ERROR]
    assert all(f"\n| `{cause}` | " in page for cause in causes), causes
