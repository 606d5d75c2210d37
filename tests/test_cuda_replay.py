"""Capture and replay on a real GPU: results, randomness, outputs, streams, no host sync."""

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from graphmodule import CudaGraphModule, InputMismatchError, RequiresGradError

pytestmark = pytest.mark.cuda


def test_function_replays_match_eager(cuda):
    fn = lambda x, y: (x * y + 1).sin()  # noqa: E731
    g = CudaGraphModule(fn)
    for _ in range(6):
        x, y = torch.randn(64, device=cuda), torch.randn(64, device=cuda)
        torch.testing.assert_close(g(x, y), fn(x, y))
    stats = g.stats
    assert (stats.warmup_calls, stats.captures, stats.replays) == (2, 1, 4)
    assert g.state == "captured" and g.graph is not None


def test_module_with_kwargs_and_nested_pytree(cuda):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 4)

        def forward(self, batch, *, scale):
            return {"out": self.lin(batch["obs"][0]) * scale, "aux": [batch["obs"][1].sum()]}

    net = Net().to(cuda)
    g = CudaGraphModule(net, warmup=1)
    with torch.no_grad():
        for _ in range(5):
            batch = {"obs": (torch.randn(3, 8, device=cuda), torch.randn(5, device=cuda))}
            got, want = g(batch, scale=2.0), net(batch, scale=2.0)
            torch.testing.assert_close(got["out"], want["out"])
            torch.testing.assert_close(got["aux"][0], want["aux"][0])


def test_kwargs_are_matched_by_name_not_position(cuda):
    g = CudaGraphModule(lambda x, y: x - y, warmup=1)
    a, b = torch.ones(4, device=cuda), torch.full((4,), 3.0, device=cuda)
    for _ in range(3):
        g(x=a, y=b)
    torch.testing.assert_close(g(y=b, x=a), a - b)


def test_randomness_is_redrawn_at_each_replay(cuda):
    p, n = 0.5, 4096
    drop = nn.Dropout(p).train()
    # the dropout mask and the noise as two outputs, so that each is checked alone
    g = CudaGraphModule(lambda x: (drop(x), torch.randn_like(x)), warmup=1)
    x = torch.ones(n, device=cuda)
    outs = [g(x) for _ in range(5)]  # a warmup call, the capture, three replays
    assert g.stats.replays == 4 and g.state == "captured"
    for dropped, noise in outs:
        # dropout zeroes about half and scales what it keeps by 1 / (1 - p)
        kept = dropped != 0
        torch.testing.assert_close(dropped[kept], torch.full_like(dropped[kept], 1 / (1 - p)), rtol=0, atol=0)
        assert 0.45 < kept.float().mean().item() < 0.55  # 6 standard deviations of n draws
        # the noise is standard normal, not zeros, a constant or the dropout's output
        assert abs(noise.mean().item()) < 0.1 and 0.9 < noise.std().item() < 1.1
        assert noise.unique().numel() > n // 2
    # each call draws afresh, for both: no two masks and no two noises are the same
    for i in range(len(outs)):
        for j in range(i):
            assert not torch.equal(outs[i][0], outs[j][0]), (i, j)
            assert not torch.equal(outs[i][1], outs[j][1]), (i, j)


def test_default_outputs_are_never_overwritten(cuda):
    g = CudaGraphModule(lambda x: x * 2, warmup=1)
    outs = [g(torch.full((3,), float(i), device=cuda)) for i in range(5)]
    for i, out in enumerate(outs):
        torch.testing.assert_close(out, torch.full((3,), 2.0 * i, device=cuda))


def test_static_outputs_are_the_graph_buffers(cuda):
    g = CudaGraphModule(lambda x: x * 2, warmup=1, outputs="static")
    g(torch.ones(3, device=cuda))
    first = g(torch.ones(3, device=cuda))
    second = g(torch.full((3,), 5.0, device=cuda))
    assert first is second
    torch.testing.assert_close(first, torch.full((3,), 10.0, device=cuda))


def test_replay_does_not_synchronise_with_the_host(cuda):
    net = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).to(cuda)
    g = CudaGraphModule(net)
    x = torch.randn(2, 16, device=cuda)
    with torch.no_grad():
        for _ in range(3):
            g(x)
        torch.cuda.synchronize()
        try:
            with warnings.catch_warnings():  # "a prototype feature"
                warnings.simplefilter("ignore")
                torch.cuda.set_sync_debug_mode("error")
            for _ in range(10):
                out = g(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.testing.assert_close(out, net(x))


def test_calls_on_a_side_stream_are_ordered_on_it(cuda):
    g = CudaGraphModule(lambda x: (x @ x).relu().sum(0), warmup=1)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        results = []
        for i in range(6):
            x = torch.full((512, 512), float(i) / 512, device=cuda)  # produced on s
            results.append(g(x))
    s.synchronize()
    for i, out in enumerate(results):
        x = torch.full((512, 512), float(i) / 512, device=cuda)
        torch.testing.assert_close(out, (x @ x).relu().sum(0))


def test_in_place_writes_to_inputs_reach_the_caller(cuda):
    def step(x, counter):
        counter.add_(1)
        return x * counter

    g = CudaGraphModule(step, warmup=1)
    counter = torch.zeros((), device=cuda)
    for i in range(1, 6):
        out = g(torch.ones(2, device=cuda), counter)
        assert counter.item() == i
        torch.testing.assert_close(out, torch.full((2,), float(i), device=cuda))


def test_returned_input_keeps_its_identity(cuda):
    g = CudaGraphModule(lambda x: (x, x + 1), warmup=1)
    for _ in range(3):
        x = torch.randn(3, device=cuda)
        same, plus = g(x)
        assert same is x
        torch.testing.assert_close(plus, x + 1)


def test_mismatches_raise_and_leave_the_wrapper_usable(cuda):
    # (max_graphs=1: by default another value of n gets a graph of its own, see test_variants)
    g = CudaGraphModule(lambda x, n: x * n, warmup=1, max_graphs=1)
    x = torch.ones(4, device=cuda)
    g(x, 3)
    g(x, 3)
    bad_calls = [
        ((x.double(), 3), "dtype"),
        ((torch.ones(5, device=cuda), 3), "shape"),
        ((torch.ones(4), 3), "device"),
        ((x, 4), "value"),
    ]
    for args, kind in bad_calls:
        with pytest.raises(InputMismatchError) as info:
            g(*args)
        assert [m.kind for m in info.value.mismatches] == [kind]
    with pytest.raises(RequiresGradError):
        g(torch.ones(4, device=cuda, requires_grad=True), 3)
    torch.testing.assert_close(g(x * 2, 3), x * 6)
    assert g.stats.input_mismatches == 5


def test_cpu_input_at_capture_is_refused_with_the_device(cuda):
    g = CudaGraphModule(lambda x: x + 1, warmup=1)
    g(torch.ones(2))  # warmup is eager: CPU works there
    with pytest.raises(InputMismatchError, match=r"args\[0\]: expected device cuda:0, got cpu"):
        g(torch.ones(2))


def test_train_eval_switch_is_refused(cuda):
    net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).to(cuda)
    g = CudaGraphModule(net, warmup=1, max_graphs=1)  # (by default eval mode gets a graph of its own)
    x = torch.randn(2, 4, device=cuda)
    with torch.no_grad():
        g(x)
        g(x)
        net.eval()
        with pytest.raises(InputMismatchError, match="expected mode train mode, got eval mode"):
            g(x)
        net.train()
        g(x)


def test_compiled_function(cuda):
    @torch.compile
    def fn(x):
        return torch.nn.functional.gelu(x) * 3

    g = CudaGraphModule(fn, warmup=3)
    for _ in range(6):
        x = torch.randn(128, device=cuda)
        torch.testing.assert_close(g(x), torch.nn.functional.gelu(x) * 3)
    assert g.stats.captures == 1


def test_reset_recaptures(cuda):
    g = CudaGraphModule(lambda x: x + 1, warmup=1)
    for _ in range(3):
        g(torch.ones(2, device=cuda))
    g.reset()
    assert g.state == "warmup"
    for _ in range(3):
        out = g(torch.ones(5, device=cuda))
    torch.testing.assert_close(out, torch.full((5,), 2.0, device=cuda))
    assert g.stats.captures == 2


def test_capture_runs_no_full_garbage_collection(cuda, monkeypatch):
    """A full ``gc.collect()`` before each capture cost some 100 ms in a program with
    tensordict imported (the PPO program's gae capture: 181 ms against tensordict's 10 ms).
    Like ``torch.cuda.graph``, collect only when ``force_cudagraph_gc`` asks for it."""
    import gc

    collections = []
    real = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(a) or real(*a))
    g = CudaGraphModule(lambda x: x * 2, warmup=1)
    x = torch.ones(4, device=cuda)
    for _ in range(3):
        torch.testing.assert_close(g(x), x * 2)
    assert g.stats.captures == 1 and collections == []

    monkeypatch.setattr(torch.compiler.config, "force_cudagraph_gc", True)
    g = CudaGraphModule(lambda x: x * 3, warmup=1)
    for _ in range(3):
        torch.testing.assert_close(g(x), x * 3)
    assert len(collections) == 1


def test_debug_dump_and_memory_per_graph(cuda, tmp_path):
    net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(cuda)
    g = CudaGraphModule(net, warmup=1, max_graphs=2, debug=True)
    with torch.no_grad():
        for batch in (8, 8, 32, 32):
            x = torch.randn(batch, 16, device=cuda)
            torch.testing.assert_close(g(x), net(x))
    stats = g.stats
    assert stats.graphs == 2 and len(stats.graph_bytes) == 2
    assert all(b >= 0 for b in stats.graph_bytes) and sum(stats.graph_bytes) > 0
    paths = g.debug_dump(tmp_path / "policy.dot")
    assert paths == [str(tmp_path / "policy.0.dot"), str(tmp_path / "policy.1.dot")]
    for path in paths:
        text = Path(path).read_text()
        assert text.startswith("digraph") and "kernel" in text.lower()
    x = torch.randn(8, 16, device=cuda)
    with torch.no_grad():  # the grad mode the graphs were captured under
        torch.testing.assert_close(g(x), net(x))  # replays still right after the dump
    # the graphs keep their structure (keep_graph): a second dump writes the same graphs (in
    # another order: the replay above made the batch-8 graph the most recently used)
    again = g.debug_dump(tmp_path / "again.dot")
    lines = lambda ps: sorted(len(Path(p).read_text().splitlines()) for p in ps)  # noqa: E731
    assert lines(again) == lines(paths)
