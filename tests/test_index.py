"""A wrapper holding several graphs finds a call's graph without trying every graph.

The index is a hint (``_index.CallIndex``): every graph it names is matched in full, and a
key it does not know falls back to trying every graph. So these tests check two things:
the answers (against the eager function, for every call of a generated sequence of
signatures), and that calls alternating between held graphs no longer take the wrapper's
slow path (which tried every graph's full match in turn).
"""

import gc
import weakref

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from graphmodule import CudaGraphModule, InputMismatchError, StaleGraphError
from graphmodule._index import CallIndex, call_key


class TestCallIndex:
    def test_the_key_is_the_modes_each_arguments_shape_and_a_scalars_value(self):
        x, other = torch.zeros(2, 3), torch.zeros(4)
        td_like = type("Batch", (), {"shape": torch.Size([4])})()
        assert call_key((x, 1.5, [1]), {"obs": other, "td": td_like, "flag": True}, ("m",)) == (
            ("m",), (torch.Size([2, 3]), 1.5, None), ("obs", "td", "flag"),
            (torch.Size([4]), torch.Size([4]), True))
        # no strides: a transposed call has the key of its shape (and its graph)
        assert call_key((x.t().contiguous().t(),), {}, ()) == call_key((x,), {}, ())

    def test_it_answers_only_with_graphs_still_held_and_holds_none_alive(self):
        class Entry:
            pass

        index, a, b = CallIndex(), Entry(), Entry()
        x = (torch.zeros(2),)
        index.remember(x, {}, "m", a, [a, b])
        assert index.find(x, {}, "m", [a, b]) is a
        assert index.find(x, {}, "m", [b]) is None  # evicted or replaced: not the wrapper's any more
        assert index.find(x, {}, "other mode", [a, b]) is None
        assert index.find((torch.zeros(3),), {}, "m", [a, b]) is None
        dead = weakref.ref(a)
        del a
        gc.collect()
        assert dead() is None and index.find(x, {}, "m", [b]) is None

    def test_a_shape_that_cannot_be_read_or_hashed_is_no_hint(self):
        class Unhashable:
            shape = ["not", "hashable"]

        class Raising:
            @property
            def shape(self):
                raise RuntimeError("no shape here")

        entry = object.__new__(type("Entry", (), {}))
        index = CallIndex()
        for arg in (Unhashable(), Raising()):
            index.remember((arg,), {}, "m", entry, [entry])
            assert index.find((arg,), {}, "m", [entry]) is None
        assert len(index) == 0

    def test_it_forgets_graphs_no_longer_held(self):
        class Entry:
            pass

        index, held = CallIndex(), [Entry()]
        for n in range(100):
            gone = Entry()
            index.remember((torch.zeros(n),), {}, "m", gone, held + [gone])
        index.remember((torch.zeros(1, 1),), {}, "m", held[0], held)
        assert len(index) <= 2 * len(held) + 8 + 1


def _policy():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    for p in net.parameters():
        p.requires_grad_(False)
    return net


def test_signatures_in_turn_replay_without_the_slow_path(make, slow_calls, graph_backend):
    net = _policy()
    g = make(net, warmup=1, max_graphs=4, backend=graph_backend)
    xs = [torch.randn(b, 3) for b in (1, 2, 4, 8)]
    for _ in range(4):  # warm up, capture, and the lending captures of later signatures
        for x in xs:
            g(x)
    captures = g.stats.captures
    slow = slow_calls(g)
    replays = g.stats.replays
    for _ in range(3):
        for x in xs:
            torch.testing.assert_close(g(x), net(x))
    assert g.stats.captures == captures and g.stats.replays == replays + 12
    assert len(slow) <= len(xs)  # at most the first call of a signature tries every graph


def test_layouts_of_one_signature_replay_on_the_hot_path(make, slow_calls, graph_backend):
    # strides are no part of the signature: no layout takes the slow path, even the first time
    g = make(lambda x: x * 2, warmup=1, backend=graph_backend)
    m = torch.arange(12.0).reshape(3, 4)
    g(m)
    g(m)
    slow = slow_calls(g)
    for x in (m.t().contiguous().t(), torch.arange(4.0).expand(3, 4), torch.arange(24.0).reshape(3, 8)[:, ::2], m):
        torch.testing.assert_close(g(x), x * 2)
    assert len(slow) == 0


def test_layouts_in_turn_replay_without_the_slow_path(make, slow_calls, graph_backend):
    # two shapes, each row-major and transposed: a graph per shape serves both layouts, and a
    # call of either layout finds its shape's graph by the call key (shapes only)
    g = make(lambda x: x * 2, warmup=1, max_graphs=2, backend=graph_backend)
    ms = [torch.arange(12.0).reshape(3, 4), torch.arange(20.0).reshape(5, 4)]
    xs = [x for m in ms for x in (m, m.t().contiguous().t())]
    for _ in range(4):  # warm up, capture, the lending capture of the second shape's graph
        for x in xs:
            g(x)
    slow = slow_calls(g)
    for _ in range(3):
        for x in xs:
            torch.testing.assert_close(g(x), x * 2)
    assert len(slow) == 0 and g.stats.graphs == 2


def test_train_and_eval_alternating_replay_without_the_slow_path(make, slow_calls, graph_backend):
    net = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    for p in net.parameters():
        p.requires_grad_(False)
    g = make(lambda x: net(x) * (2.0 if net.training else 3.0), warmup=1, max_graphs=2, backend=graph_backend)
    x = torch.ones(2, 3)
    for _ in range(3):
        for training in (True, False):
            net.train(training)
            g(x)
    slow = slow_calls(g)
    for _ in range(3):
        net.eval()
        torch.testing.assert_close(g(x), net(x) * 3.0)
        net.train()
        assert g(x).shape == (2, 3)
    assert g.stats.captures == 2 and len(slow) <= 2


def test_signatures_sharing_shapes_still_get_their_own_graphs(make, graph_backend):
    # the same shapes in two dtypes share a key: the hint is checked, never trusted
    g = make(lambda x: x * 2 + 1, warmup=1, max_graphs=2, backend=graph_backend)
    a, b = torch.ones(3), torch.ones(3, dtype=torch.float64)
    for _ in range(5):
        for x in (a, b):
            out = g(x)
            assert out.dtype == x.dtype
            torch.testing.assert_close(out, x * 2 + 1)
    assert g.stats.captures == 2


def _graphs_alive():
    from graphmodule._entry import Entry

    gc.collect()
    return sum(1 for obj in gc.get_objects() if type(obj) is Entry)


def test_an_evicted_graph_is_never_found_and_not_kept_alive(make, graph_backend):
    before = _graphs_alive()
    g = make(lambda x: x + 1, warmup=1, max_graphs=2, on_graph_limit="evict", backend=graph_backend)
    xs = [torch.ones(n) for n in (2, 3, 4)]
    for _ in range(4):
        for x in xs:
            torch.testing.assert_close(g(x), x + 1)
    assert g.stats.evictions >= 2 and g.stats.graphs == 2
    assert _graphs_alive() == before + 2  # the evicted ones are gone (the index holds graphs weakly)


def test_a_stale_graph_found_through_the_index_is_reported(make, graph_backend):
    net = _policy()
    g = make(net, warmup=1, max_graphs=2, backend=graph_backend)
    xs = [torch.randn(1, 3), torch.randn(4, 3)]
    for _ in range(4):
        for x in xs:
            g(x)
    g(xs[0])  # the batch-4 graph is not the most recent one: it is found through the index
    net[0].weight = nn.Parameter(torch.randn(8, 3), requires_grad=False)
    with pytest.raises(StaleGraphError, match=r"weight"):
        g(xs[1])


def test_a_stale_graph_found_through_the_index_is_captured_again_on_request(make, graph_backend):
    net = _policy()
    g = make(net, warmup=1, max_graphs=2, on_stale="recapture", backend=graph_backend)
    xs = [torch.randn(1, 3), torch.randn(4, 3)]
    for _ in range(4):
        for x in xs:
            g(x)
    captures = g.stats.captures
    g(xs[0])
    net[0].weight = nn.Parameter(torch.randn(8, 3), requires_grad=False)
    for _ in range(3):  # warms up and captures again with the new weight, then replays it
        for x in xs:
            torch.testing.assert_close(g(x), net(x))
    assert g.stats.recaptures >= 1 and g.stats.captures > captures


def test_reset_forgets_the_index(make):
    g = make(lambda x: x * 2, warmup=1, max_graphs=2)
    for _ in range(3):
        for n in (2, 3):
            g(torch.ones(n))
    before = _graphs_alive()
    g.reset()
    assert g.stats.graphs == 0 and _graphs_alive() == before - 2  # nothing, the index included, holds them
    for _ in range(3):
        for n in (2, 3):
            torch.testing.assert_close(g(torch.ones(n)), torch.full((n,), 2.0))


_SIGNATURES = [
    (torch.float32, (2, 3), 1.0),
    (torch.float32, (5, 3), 1.0),
    (torch.float64, (2, 3), 1.0),
    (torch.float32, (2, 3), 2.0),  # the same key as the first: another constant
    (torch.float32, (1, 3), 1.0),
]


_SEQUENCES = dict(
    sequence=st.lists(st.integers(0, len(_SIGNATURES) - 1), min_size=1, max_size=30),
    max_graphs=st.integers(1, 5), evict=st.booleans(), modes=st.lists(st.booleans(), min_size=30, max_size=30))


def _sequence_gives_the_eager_answers(backend, device, sequence, max_graphs, evict, modes):
    lin = nn.Linear(3, 2).double().to(device)
    for p in lin.parameters():
        p.requires_grad_(False)

    def fn(x, scale):
        y = lin(x.double()).to(x.dtype)
        return y * scale + (1.0 if lin.training else -1.0)

    g = CudaGraphModule(fn, warmup=1, backend=backend, max_graphs=max_graphs,
                        on_graph_limit="evict" if evict else "raise")
    kept = []
    for i, (n, training) in enumerate(zip(sequence, modes)):
        dtype, shape, scale = _SIGNATURES[n]
        lin.train(training)
        x = torch.arange(float(shape[0] * shape[1]), dtype=dtype, device=device).reshape(shape) + i
        try:
            out = g(x, scale)
        except InputMismatchError:  # a new signature past a strict limit: no answer to compare
            assert not evict and g.stats.graphs >= max_graphs
            continue
        want = fn(x, scale)
        assert out.dtype == want.dtype and out.shape == want.shape and out.device == want.device
        torch.testing.assert_close(out, want)
        kept.append((out, want))
    for out, want in kept:  # results held across later calls keep their values
        torch.testing.assert_close(out, want)


@settings(max_examples=40, deadline=None)
@given(**_SEQUENCES)
def test_any_sequence_of_signatures_gives_the_eager_answers(sequence, max_graphs, evict, modes):
    _sequence_gives_the_eager_answers("simulate", "cpu", sequence, max_graphs, evict, modes)


@pytest.mark.cuda
@settings(max_examples=12, deadline=None)
@given(**_SEQUENCES)
def test_any_sequence_of_signatures_gives_the_eager_answers_on_cuda(sequence, max_graphs, evict, modes):
    _sequence_gives_the_eager_answers("cuda", "cuda", sequence, max_graphs, evict, modes)
