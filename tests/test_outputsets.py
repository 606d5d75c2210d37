"""Every graph of a signature is captured from the layout of its first.

outputs="safe" captures a call more than once: the first graph, a twin when a result is held,
a graph returning copies when every set is held, a lending capture for a second signature's
graph. Each later capture is triggered by a call, which may pass one tensor twice, a
transposed tensor or two keys over one tensor where the first capture had distinct,
contiguous tensors: it is made with that call's values in the first graph's layout. Whatever capture made a graph, a later call gets the plain function's
values and gradients, with the results laid out as the first capture's, or a clear error
before any replay.
"""

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from graphmodule import CudaGraphModule

def mix(x, y):
    return x * 100 + y


def _pair():
    return torch.ones(3), torch.full((3,), 4.0)


def _captured(fn, *args, **options):
    options.setdefault("warmup", 1)
    g = CudaGraphModule(fn, **options)
    g(*args)
    return g


def test_a_twin_captured_from_an_aliased_call_then_a_call_with_distinct_tensors(graph_backend):
    a, b = _pair()
    g = _captured(mix, a, b, backend=graph_backend)
    held = g(a, b)  # captured; the result is held
    x = torch.full((3,), 2.0)
    torch.testing.assert_close(g(x, x), mix(x, x))  # a twin, captured from g(x, x)
    torch.testing.assert_close(g(a, b), mix(a, b))  # the twin is free: it serves this call
    torch.testing.assert_close(held, mix(a, b))
    assert g.stats.twin_captures == 1


def test_a_twin_captured_from_distinct_tensors_then_an_aliased_call(graph_backend):
    # the reverse order: buffers apart serve a call passing one tensor twice
    a, b = _pair()
    g = _captured(mix, a, b, backend=graph_backend)
    held = g(a, b)
    torch.testing.assert_close(g(b, a), mix(b, a))  # a twin, captured from distinct tensors
    x = torch.full((3,), 2.0)
    torch.testing.assert_close(g(x, x), mix(x, x))
    torch.testing.assert_close(held, mix(a, b))


def _two_keys(td):
    return td["a"] * 100 + td["b"]


def _td(a, b):
    return TensorDict(a=a, b=b, batch_size=[3])


def test_a_twin_captured_from_a_tensordict_holding_one_tensor_under_two_keys(graph_backend):
    a, b = _pair()
    g = _captured(_two_keys, _td(a, b), in_keys=[], backend=graph_backend)
    held = g(_td(a, b))
    x = torch.full((3,), 2.0)
    torch.testing.assert_close(g(_td(x, x)), _two_keys(_td(x, x)))
    torch.testing.assert_close(g(_td(a, b)), _two_keys(_td(a, b)))
    torch.testing.assert_close(held, _two_keys(_td(a, b)))


# The eager backward at the end reuses the parameters' AccumulateGrad nodes that the layer's
# capture made on its side stream (kept alive by the held result): torch's notice of a stream
# mismatch, about synchronisation, not values (docs/limits.md).
@pytest.mark.filterwarnings("ignore:The AccumulateGrad node's stream does not match")
def test_a_layer_twin_captured_from_an_aliased_call_gives_eager_values_and_gradients(graph_backend):
    torch.manual_seed(0)
    lin = nn.Linear(3, 3)

    def block(x, y):
        return lin(x) + 3 * lin(y)

    a, b = torch.ones(2, 3), torch.full((2, 3), 4.0)
    g = _captured(block, a, b, backend=graph_backend)
    held = g(a, b)  # captured as a layer (the parameters require grad); held
    x = torch.full((2, 3), 2.0)
    g(x, x).sum().backward()  # a twin, captured from g(x, x)
    lin.zero_grad()
    out = g(a, b)
    out.sum().backward()
    got = lin.weight.grad.clone()
    lin.zero_grad()
    want = block(a, b)
    want.sum().backward()
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(got, lin.weight.grad)
    torch.testing.assert_close(held, want)


def test_a_lending_capture_made_from_an_aliased_call(graph_backend):
    # a second signature's graph returns copies until its next call captures it again to lend
    a, b = _pair()
    g = _captured(mix, a, b, backend=graph_backend, max_graphs=2)
    g(a, b)
    a2, b2 = torch.ones(2), torch.full((2,), 4.0)
    g(a2, b2)  # warmup of the second signature
    g(a2, b2)  # its capture
    x = torch.full((2,), 2.0)
    torch.testing.assert_close(g(x, x), mix(x, x))  # the lending capture, from g(x, x)
    assert g.stats.lending_captures == 1
    torch.testing.assert_close(g(a2, b2), mix(a2, b2))  # served before: served again


def test_a_copying_capture_made_from_an_aliased_call(graph_backend):
    a, b = _pair()
    g = _captured(mix, a, b, backend=graph_backend)
    held = [g(a, b) for _ in range(3)]  # every output set held
    x = torch.full((3,), 2.0)
    held.append(g(x, x))  # the graph returning copies, captured from g(x, x)
    assert g.stats.copy_recaptures == 1
    torch.testing.assert_close(g(a, b), mix(a, b))  # served before: served again


def double(x):
    return x * 2


def _square():
    return torch.arange(9.0).reshape(3, 3)


def _served_in_the_capture_layout(g, fn, x, captured):
    """``g(x)`` has ``fn(x)``'s values, laid out as the result of the capture from ``captured``
    (a graph computes in the layout of its capture, whatever set serves the call)."""
    out, want, like = g(x), fn(x), fn(captured)
    torch.testing.assert_close(out, want)
    assert out.stride() == like.stride()
    if like.is_contiguous():
        torch.testing.assert_close(out.view(-1), want.reshape(-1))
    return out


def test_a_further_set_made_while_a_transposed_call_is_served_then_contiguous_calls(graph_backend):
    m = _square()
    g = _captured(double, m, backend=graph_backend)
    held = g(m)
    # a result held: the transposed call is served by a twin or copies, captured from the
    # first graph's buffers (row-major), not from this call
    _served_in_the_capture_layout(g, double, m.t(), m)
    _served_in_the_capture_layout(g, double, m + 1, m)
    torch.testing.assert_close(held, double(m))


def test_the_first_capture_made_from_a_transposed_call_then_a_contiguous_call(graph_backend):
    m = _square()
    g = _captured(double, m.t(), backend=graph_backend)
    g(m.t())  # captured from the transposed call
    _served_in_the_capture_layout(g, double, m, m.t())


def test_a_contiguous_capture_then_a_transposed_call(graph_backend):
    m = _square()
    g = _captured(double, m, backend=graph_backend)
    g(m)
    _served_in_the_capture_layout(g, double, m.t(), m)


def test_with_room_for_two_graphs_one_graph_serves_both_layouts(graph_backend):
    m = _square()
    g = _captured(double, m, backend=graph_backend, max_graphs=2)
    held = []
    for i, x in enumerate((m, m.t(), m.t(), m.t(), m, m.t())):
        out = _served_in_the_capture_layout(g, double, x + i, m)
        if i % 2:
            held.append((out, double(x + i)))  # held results: twins and copies, from the first's layout
    for out, want in held:
        torch.testing.assert_close(out, want)
    assert g.stats.captures == 1 and g.stats.graphs == 1
