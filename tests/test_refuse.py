"""_refuse: the input checks beyond the signature, one function before a capture for the graph
and the eager paths, with the same words on both."""

import warnings

import pytest
import torch
from torch import nn

from graphmodule import CudaGraphModule, InputMismatchError, MismatchKind, UnsupportedError
from graphmodule import _refuse


class Syncs(nn.Module):
    """A linear layer whose first capture fails (a host sync) where ``sync`` is set: with
    ``on_capture_failure="eager"``, its signatures are served eagerly from then on."""

    def __init__(self, sync: bool):
        super().__init__()
        self.lin, self.sync = nn.Linear(3, 3), sync

    def forward(self, x):
        if self.sync and self.lin.weight.sum().item() > 1e9:  # (a host sync a capture refuses)
            return x
        return self.lin(x)


def _inference(shape):
    with torch.inference_mode():
        return torch.ones(shape)


_INFERENCE_SAVED = (
    "Syncs) cannot replay this call as a CUDA graph: expected a normal tensor at args[0] (grad mode: "
    "autograd may save it for backward), got an inference tensor (made under torch.inference_mode()), which "
    "autograd refuses to save; the graph's buffer would be a normal tensor, and the replay would not refuse it.\n"
    "To fix: pass a normal tensor (x.clone() outside inference mode, or make it under torch.no_grad()), or call "
    "the wrapper under torch.no_grad() or torch.inference_mode()."
)


def _eager_after_a_failed_capture(backend):
    """A wrapper serving its signatures eagerly after its first capture failed."""
    g = CudaGraphModule(Syncs(sync=True), warmup=1, max_graphs=2, backend=backend, on_capture_failure="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            g(torch.ones(2, 3))
    assert g.stats.capture_failures == 1
    return g


@pytest.mark.parametrize("backend", ["simulate", "eager"])
@pytest.mark.parametrize("path", ["graph", "eager after a failed capture"])
def test_an_inference_input_autograd_may_save_is_refused_before_capture(backend, path):
    # eagerly, torch refuses to save an inference tensor for backward; a graph's buffer is a
    # normal tensor: refused before the capture, on the graph path and on the eager one alike
    if path == "graph":
        g = CudaGraphModule(Syncs(sync=False), warmup=1, backend=backend)
        shape = (2, 3)
    else:
        g = _eager_after_a_failed_capture(backend)
        shape = (4, 3)  # another signature: its warmup call, then its capture (served eagerly)
    g(torch.ones(shape))  # a warmup call
    with pytest.raises(UnsupportedError) as info:
        g(_inference(shape))
    assert str(info.value) == "CudaGraphModule(" + _INFERENCE_SAVED
    with torch.no_grad():  # the same call without grad: nothing is saved, served
        torch.testing.assert_close(g(_inference(shape)), g.module.lin(torch.ones(shape)))


@pytest.mark.parametrize("path", ["graph", "eager after a failed capture"])
def test_before_capture_is_the_one_function_of_both_paths(monkeypatch, path):
    # both paths ask _refuse.before_capture, the eager one without the rules of capturing a DDP step
    seen = []
    real = _refuse.before_capture

    def spy(owner, mode, reads, inputs, graph=True):
        seen.append(graph)
        return real(owner, mode, reads, inputs, graph)

    if path == "graph":
        g = CudaGraphModule(Syncs(sync=False), warmup=1, backend="simulate")
    else:
        g = _eager_after_a_failed_capture("simulate")
    import graphmodule._graphs
    import graphmodule._record

    monkeypatch.setattr(graphmodule._record, "before_capture", spy)
    monkeypatch.setattr(graphmodule._graphs, "before_capture", spy)
    for _ in range(2):
        g(torch.ones(5, 3))
    assert seen == [path == "graph"]


def test_ddp_rules_are_asked_for_a_graph_only(monkeypatch):
    asked = []
    monkeypatch.setattr(_refuse, "refuse_ddp", lambda owner, modules: asked.append([w for _, w in modules]))
    g = CudaGraphModule(Syncs(sync=False), warmup=1, backend="simulate")
    for _ in range(2):
        g(torch.ones(2, 3))
    assert asked == [["module", "module.lin"]]
    asked.clear()
    g = _eager_after_a_failed_capture("simulate")
    assert asked == [["module", "module.lin"]]  # (the capture that failed)
    for _ in range(2):
        g(torch.ones(5, 3))
    assert asked == [["module", "module.lin"]] and g.stats.eager_calls >= 1


@pytest.mark.parametrize("backend", ["simulate", "eager"])
def test_a_sparse_input_is_refused_when_read(backend):
    g = CudaGraphModule(lambda x: x * 2, warmup=1, backend=backend)
    sparse = torch.eye(3).to_sparse()
    g(sparse)  # a warmup call runs eagerly, as the function would
    with pytest.raises(UnsupportedError) as info:
        g(sparse)
    assert str(info.value) == (
        "CudaGraphModule(<lambda>) cannot replay this call as a CUDA graph: args[0] is a tensor of shape (3, 3), "
        "torch.float32 on cpu, torch.sparse_coo; a sparse tensor's memory changes with its number of non-zeros.\n"
        "To fix: pass a dense tensor (.to_dense()), or its indices and values as fixed-size tensors."
    )


def test_later_calls_are_checked_against_what_the_capture_found():
    # call_mismatches: the checks beyond the signature, by index where no places are given
    def add_(a, b):
        a.add_(b)
        return a

    g = CudaGraphModule(add_, warmup=1, backend="simulate")
    for _ in range(2):
        g(torch.ones(3), torch.ones(3))
    entry = g._graphs.entries[0]
    x = torch.ones(3)
    leaves = (x, x)
    found = _refuse.call_mismatches(entry, leaves, None, {})
    assert [(m.path, m.kind) for m in found] == [("input leaf 1", MismatchKind.ALIAS)]
    assert not entry.extra_ok(leaves, {}) and entry.extra_ok((torch.ones(3), torch.ones(3)), {})
    with pytest.raises(InputMismatchError, match=r"args\[1\]: expected its own memory"):
        g(x, x)
