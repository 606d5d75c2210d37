"""Programs in a fresh Python process: a crash, a hang or broken CUDA state stays there.

A capture that fails inside ``tensordict.nn.CudaGraphModule`` leaves its process broken:
the CUDA generator stays in capture mode (every later ``torch.randn`` on the GPU raises
"Offset increment outside graph capture") and destroying its half-built graph later aborts
the process. What runs after it in that process fails for that reason, not its own, so the
CUDA tests and ``benchmarks/programs.py`` run such wrappers in a child process.

This module imports only the standard library (the benchmark's parent process stays without
torch); ``python tests/programs/isolated.py JOB OUT`` is the tests' child.
"""

from __future__ import annotations

import builtins
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback
import warnings

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # holds the programs package
ROOT = os.path.dirname(TESTS)  # holds graphmodule and examples


def run_child(args: list[str], timeout: float) -> tuple[int | None, str]:
    """Run ``python -X faulthandler *args`` from the repository root, waiting at most ``timeout`` s.

    Returns its exit status (negative: killed by that signal; None: it timed out and was
    killed) and its output, stdout and stderr together (through a file: a pipe could keep
    us waiting on processes the child left behind).
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # a crash loses no buffered output...
    with tempfile.TemporaryFile("w+", errors="replace") as log:  # ...and faulthandler shows its Python stack
        proc = subprocess.Popen([sys.executable, "-X", "faulthandler", *args], stdout=log, stderr=subprocess.STDOUT,
                                cwd=ROOT, env=env)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if proc.poll() is None:  # timed out, or ^C here: the child goes too
                proc.kill()
                proc.wait()
        log.seek(0)
        return code, log.read()


def how_it_ended(code: int | None, timeout: float) -> str:
    if code is None:
        return f"timed out after {timeout:g} s"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name} (exit {code})"
        except ValueError:
            pass
    return f"exited with status {code}"


def last_lines(output: str, n: int = 3) -> str:
    """The gist of a child's output: its fatal-error line, if any, and its last lines."""
    lines = [line.strip() for line in output.splitlines()
             if line.strip() and not line.startswith("Extension modules")]  # the end of a fatal-error dump
    fatal = [line for line in lines if line.startswith(("Fatal Python error", "terminate called"))][:1]
    return " / ".join(dict.fromkeys(fatal + lines[-n:]))


def exit_after_failure() -> None:
    """End the child now, without collecting its garbage: a failed capture's leftovers may
    abort the process when destroyed. Call it once the failure has been written down."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def error_record(exc: BaseException) -> dict:
    """What a child reports about an exception, for :func:`raise_again`."""
    cls = type(exc)
    return {"type": f"{cls.__module__}.{cls.__qualname__}", "message": str(exc),
            "bases": [c.__name__ for c in cls.__mro__ if c.__module__ == "builtins"],
            "traceback": traceback.format_exc()}


def raise_again(error: dict) -> None:
    """Raise what the child raised, as its nearest builtin class (``pytest.raises`` and xfail's
    ``raises`` see a ``ValueError`` as a ``ValueError``), the child's traceback in the message."""
    message = f"in the child process: {error['type']}: {error['message']}\n\n{error['traceback']}"
    for name in error["bases"]:
        cls = getattr(builtins, name, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                exc = cls(message)
            except TypeError:  # a builtin that takes other arguments (UnicodeDecodeError)
                continue
            raise exc
    raise RuntimeError(message)


def run_programs(run, config: dict, wrappers: list[str], *, device, seed: int = 0, timeout: float = 600) -> list[dict]:
    """``run(make_wrap(w, backend="cuda"), device=device, seed=seed, **config)`` for each of
    ``wrappers`` in turn, in one child process, under this process's warning filters (in a
    test: pytest's, warnings as errors); the results come back through JSON.

    Each result also holds ``"built"``: for each wrapper the program built, its repr and
    whether it holds a CUDA graph (``.graph``). An exception in the child is raised here
    (:func:`raise_again`); a child that crashes or hangs raises ``ChildProcessError``.
    """
    job = {"module": run.__module__, "function": run.__name__, "config": config, "wrappers": list(wrappers),
           "device": str(device), "seed": seed,
           "warnings": [[action, getattr(message, "pattern", message) or "", category.__module__, category.__qualname__,
                         getattr(module, "pattern", module) or "", lineno]  # (a regex, a string or None)
                        for action, message, category, module, lineno in warnings.filters]}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        code, output = run_child([os.path.abspath(__file__), json.dumps(job), out], timeout)
        report = None
        if os.path.exists(out):
            with open(out) as f:
                report = json.load(f)
    if report is not None and "error" in report:
        raise_again(report["error"])
    if code != 0 or report is None:
        raise ChildProcessError(f"the child process {how_it_ended(code, timeout)}:\n{output[-6000:]}")
    return report["results"]


def _child(job: dict, out: str) -> None:
    import importlib

    package = job["module"].rpartition(".")[0]
    run = getattr(importlib.import_module(job["module"]), job["function"])
    make_wrap = importlib.import_module(f"{package}.common").make_wrap
    warnings.resetwarnings()
    for action, message, category_module, category, module, lineno in job["warnings"]:
        try:
            category = getattr(importlib.import_module(category_module), category)
        except (ImportError, AttributeError):
            continue
        warnings.filterwarnings(action, message, category, module, lineno, append=True)
    report: dict = {"results": []}
    try:
        for wrapper in job["wrappers"]:
            wrap = make_wrap(wrapper, backend="cuda")
            result = run(wrap, device=job["device"], seed=job["seed"], **job["config"])
            result["built"] = [{"repr": repr(g)[:500], "graph": getattr(g, "graph", None) is not None}
                               for g in wrap.built]
            report["results"].append(result)
            del wrap
    except Exception as exc:  # noqa: BLE001 - handed to the parent
        gc.disable()  # see exit_after_failure
        report["error"] = error_record(exc)
    with open(out + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(out + ".tmp", out)
    if "error" in report:
        exit_after_failure()


if __name__ == "__main__":
    sys.path[0:1] = [ROOT, TESTS]  # (not this file's folder: its modules are the package's)
    _child(json.loads(sys.argv[1]), sys.argv[2])
