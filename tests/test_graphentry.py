"""What every entry among a wrapper's graphs offers (``_graphentry``): each kind answers every
member of :class:`~graphmodule._graphentry.GraphEntry`, and what serves its calls every member
of :class:`~graphmodule._graphentry.Outputs`; the dependencies run one way (an entry never
imports what serves it; the output sets' state machine imports no entry)."""

import ast
import inspect
import pathlib
import warnings

import pytest
import torch

import graphmodule
from graphmodule import CudaGraphModule
from graphmodule._eager import EagerEntry
from graphmodule._entry import Entry
from graphmodule._graphentry import GraphEntry, Outputs
from graphmodule._signature import Signature


def _members(protocol):
    methods = {name for name, _ in inspect.getmembers(protocol, inspect.isfunction) if not name.startswith("_")}
    return methods, set(protocol.__annotations__)


def _entry(backend, fn=lambda x: x * 2 + 1):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (backend="eager": no graphs)
        g = CudaGraphModule(fn, warmup=1, backend=backend)
    for _ in range(3):
        g(torch.ones(3))
    return g, g._graphs.entries[0]  # (the entry itself: what the protocol is about)


@pytest.mark.parametrize("backend, kind", [("simulate", Entry), ("eager", EagerEntry)])
def test_each_kind_of_entry_answers_every_member(backend, kind):
    g, entry = _entry(backend)
    assert type(entry) is kind and GraphEntry in kind.__mro__  # (declared, not inferred)
    methods, fields = _members(GraphEntry)
    for name in sorted(methods):
        # its own, not the protocol's empty body
        assert getattr(kind, name) is not getattr(GraphEntry, name), f"{kind.__name__}.{name}"
        ours = [p.name for p in inspect.signature(getattr(kind, name)).parameters.values()]
        assert ours == [p.name for p in inspect.signature(getattr(GraphEntry, name)).parameters.values()], name
    for name in sorted(fields):
        assert hasattr(entry, name), f"{kind.__name__}.{name}"
    assert entry.outputs is not None and entry.outputs.describe().startswith("outputs: ")


@pytest.mark.parametrize("backend", ["simulate", "eager"])
def test_what_serves_each_kind_answers_every_member(backend):
    g, entry = _entry(backend)
    outputs = entry.outputs
    assert Outputs in type(outputs).__mro__ and (type(outputs) is Signature) == (backend == "simulate")
    methods, _ = _members(Outputs)
    assert methods == {"serve", "describe", "release"}
    for name in methods:
        assert getattr(type(outputs), name) is not getattr(Outputs, name), name
    leaves, objs = g._graphs.entries[0].spec.match((torch.full((3,), 2.0),), {})
    torch.testing.assert_close(outputs.serve(entry, leaves, objs, ((torch.full((3,), 2.0),), {})),
                               torch.full((3,), 5.0))


def _imports(module: str) -> set[str]:
    """The package modules ``module`` imports, at run time or for type checking."""
    path = pathlib.Path(graphmodule.__file__).parent / f"{module}.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.add(node.module)
    return found


def test_the_dependencies_run_one_way():
    assert not _imports("_entry") & {"_signature", "_outputsets", "_eager", "_graphs"}
    assert _imports("_graphentry") <= {"_spec", "_stale", "_errors"}  # (types only, under TYPE_CHECKING)
    assert not _imports("_outputsets") & {"_entry", "_signature", "_eager", "_graphentry"}
    assert "_entry" in _imports("_signature")
