"""outputs="safe": results lent at zero copy, never replayed over while a caller holds them.

Each test holds results the way programs do (a variable, a view, a list, a TensorDict, the
next call's input) across later calls and compares them with the eager function's results
on the same inputs: nothing a caller holds may ever change. Simulated replays overwrite
the graph's buffers as CUDA replays do; the ``cuda`` variants run real graphs.
"""

import pytest
import torch
from tensordict import TensorDict

from graphmodule import CudaGraphModule
import graphmodule._graphs as graphs
import graphmodule._lend as lend
from graphmodule._lend import available
from graphmodule._outputsets import OUTPUT_SETS



def test_lending_works_on_every_supported_torch():
    """torch 2.11 (the GPU machine's) lacks ``UntypedStorage._swap_data_ptr_``, which lending
    once needed: "safe" then silently cloned there, and these tests were all skipped."""
    assert available()
    g = _captured(f, torch.zeros(4))
    assert _outputs(g).startswith("outputs: LENDING")


def _outputs(g, n=0):
    """What ``explain()`` says of the outputs of graph ``n`` (most recently used first)."""
    return [line.strip() for line in g.explain().splitlines() if line.strip().startswith("outputs:")][n]


def _addresses(g, xs):
    """The data pointer of each call's result, each result dropped before the next call while
    memory of its size stays taken: results copied per call each get new memory."""
    taken, addresses = [], []
    for x in xs:
        out = g(x)
        addresses.append(out.data_ptr())
        torch.testing.assert_close(out, g.module(x))
        del out
        taken.append(torch.empty_like(x))
    return addresses


def _captured(fn, *args, backend="simulate", **options):
    options.setdefault("outputs", "safe")
    g = CudaGraphModule(fn, warmup=1, backend=backend, **options)
    g(*args)
    g(*args)
    assert g.state == "captured"
    return g


def f(x):
    return x * 2 + 1


def test_a_dropped_result_is_not_copied(graph_backend):
    g = _captured(f, torch.zeros(4), backend=graph_backend)
    device = "cuda" if graph_backend == "cuda" else "cpu"
    addresses = _addresses(g, [torch.full((4,), float(i), device=device) for i in range(5)])
    assert len(set(addresses)) == 1  # zero-copy: the graph's own memory, each time
    assert g.stats.twin_captures == 0 and g.stats.copy_recaptures == 0
    assert _outputs(g).startswith("outputs: LENDING")


def test_clone_outputs_are_copied_at_each_call(graph_backend):
    g = _captured(f, torch.zeros(4), backend=graph_backend, outputs="clone")
    device = "cuda" if graph_backend == "cuda" else "cpu"
    addresses = _addresses(g, [torch.full((4,), float(i), device=device) for i in range(5)])
    assert len(set(addresses)) == 5  # (the test above can tell copies)


def test_a_lone_result_without_elements_is_returned_as_eagerly(graph_backend):
    # one output with no memory: nothing to lend (it crashed at the first replay before)
    def empty(x):
        return x[:0] * 2

    g = _captured(empty, torch.ones(3), backend=graph_backend)
    kept = []
    for i in range(4):
        x = torch.full((3,), float(i))
        out = g(x)
        want = empty(x)
        assert out.shape == want.shape and out.dtype == want.dtype and out.device == want.device
        kept.append(out)
    assert len({id(t) for t in kept}) == len(kept)  # a new tensor at each call, as eagerly
    assert g.stats.replays >= 4 and g.stats.eager_calls == 0


def test_a_kept_result_keeps_its_value(graph_backend):
    g = _captured(f, torch.zeros(4), backend=graph_backend)
    xs = [torch.full((4,), float(i)) for i in range(40)]
    kept = [g(x) for x in xs]  # lent by each output set, then copies from a graph captured anew
    for x, out in zip(xs, kept):
        torch.testing.assert_close(out, f(x))
    assert g.stats.twin_captures == OUTPUT_SETS - 1 and g.stats.copy_recaptures == 1
    assert _outputs(g).startswith("outputs: COPYING")  # the graph returning copies replaced the lending ones
    assert len({t.data_ptr() for t in kept}) == len(kept)


def _with_temporaries(x):
    y = x * 2 + 1
    _ = x * 3 + 1  # temporaries: memory the graph writes at every replay, free between them
    _ = x * 4 + 1
    return y


def test_a_twin_result_survives_the_first_graph_replaying(graph_backend):
    """Found by the GPU fuzz: a twin captured in the first graph's memory pool put its output
    in a block the first graph uses for a temporary, so replaying the first graph overwrote
    a result the caller held."""
    g = _captured(_with_temporaries, torch.zeros(1), backend=graph_backend)
    a = g(torch.full((1,), 1.0))
    b = g(torch.full((1,), 2.0))  # `a` held: the twin runs
    del a
    c = g(torch.full((1,), 3.0))  # the first graph again, while `b` is held
    torch.testing.assert_close(b, _with_temporaries(torch.full((1,), 2.0)))
    torch.testing.assert_close(c, _with_temporaries(torch.full((1,), 3.0)))
    assert g.stats.twin_captures == 1


def test_a_second_signature_lends_from_buffers_outside_the_shared_pool(graph_backend):
    """A second signature's lending graph used to get a pool of its own (the wrapper's pool
    holding the first graph's temporaries), so k signatures cost k pools. Now its capture
    returns copies from the shared pool, and its next call captures it again, in the same
    pool, copying its results into buffers outside it, which it lends."""
    g = _captured(f, torch.zeros(4), backend=graph_backend, max_graphs=2)
    x = torch.ones(3, device="cuda" if graph_backend == "cuda" else "cpu")
    g(x)  # warmup of the second signature
    first = g(x)  # its capture: copies
    assert g.stats.captures == 2 and g.stats.lending_captures == 0
    assert _outputs(g).startswith("outputs: LEND_LATER")
    second = g(x * 2)  # captured again, lending
    assert g.stats.lending_captures == 1 and g.stats.graphs == 2 and g.stats.twin_captures == 0
    assert _outputs(g).startswith("outputs: LENDING")
    if graph_backend == "cuda":
        assert g.graph.pool() == getattr(g.pool, "id", g.pool)  # the shared pool
    lent = second.data_ptr()
    del second
    taken = torch.empty_like(x)  # (memory of a copy's size stays taken)
    third = g(x * 3)  # nothing held: the same buffers again, no copy, no capture
    assert third.data_ptr() == lent and g.stats.lending_captures == 1
    del taken
    fourth = g(x * 4)  # `third` held: a twin beside the lending graph
    assert g.stats.twin_captures == 1
    for value, out in ((1, first), (3, third), (4, fourth)):
        torch.testing.assert_close(out, f(x * value))
    torch.testing.assert_close(g(torch.zeros(4, device=x.device)), f(torch.zeros(4, device=x.device)))


def test_a_failed_lending_capture_leaves_the_copies(monkeypatch):
    g = _captured(f, torch.zeros(4), max_graphs=2)
    x = torch.ones(3)
    g(x)
    g(x)

    def refuse(**kwargs):
        raise ValueError("no lending capture")

    monkeypatch.setattr(graphs, "record", refuse)  # every capture from here on fails
    kept = [g(x * i) for i in range(4)]
    assert g.stats.lending_captures == 0 and g.stats.graphs == 2 and _outputs(g).startswith("outputs: COPYING")
    for i, out in enumerate(kept):
        torch.testing.assert_close(out, f(x * i))


def test_results_of_graphs_of_other_signatures_survive(graph_backend):
    """Graphs of one wrapper share a pool: a lending graph captured after another must not
    hand out memory the other writes."""
    g = CudaGraphModule(_with_temporaries, warmup=1, backend=graph_backend, outputs="safe", max_graphs=3)
    kept = []
    for i in range(12):
        x = torch.full((1 + i % 3,), float(i))
        kept.append((x, g(x)))
    for x, out in kept:
        torch.testing.assert_close(out, _with_temporaries(x))


def test_a_kept_view_of_a_dropped_result_keeps_its_value(graph_backend):
    g = _captured(f, torch.zeros(4), backend=graph_backend)
    view = g(torch.ones(4))[1:3]  # the result itself is gone; its view is not
    g(torch.full((4,), 7.0))
    torch.testing.assert_close(view, f(torch.ones(4))[1:3])
    view.fill_(-1)  # the caller's memory now: writing it does not reach the graph
    torch.testing.assert_close(g(torch.ones(4)), f(torch.ones(4)))


def test_results_kept_in_a_tensordict_keep_their_values(graph_backend):
    g = _captured(lambda x: (x + 1, x.sum()), torch.zeros(3), backend=graph_backend)
    rollout = []
    for i in range(10):
        a, s = g(torch.full((3,), float(i)))
        rollout.append(TensorDict(a=a, s=s))
    stacked = torch.stack(rollout)
    expected = torch.stack([TensorDict(a=torch.full((3,), i + 1.0), s=torch.tensor(3.0 * i)) for i in range(10)])
    assert (stacked == expected).all()


def test_a_result_fed_back_as_the_next_input(graph_backend):
    step = _captured(lambda h, x: torch.tanh(h * 0.9 + x), torch.zeros(3), torch.zeros(3), backend=graph_backend)
    h, h_eager = torch.zeros(3), torch.zeros(3)
    history = []
    for i in range(50):
        x = torch.full((3,), 0.1 * i)
        h, h_eager = step(h, x), torch.tanh(h_eager * 0.9 + x)
        history.append((h, h_eager))
    for ours, eager in history:
        torch.testing.assert_close(ours, eager)


def test_results_that_alias_each_other_still_do_while_held(graph_backend):
    def two_views(x):
        y = x * 3
        return y, y[1:]

    g = _captured(two_views, torch.zeros(4), backend=graph_backend)
    y, tail = g(torch.ones(4))
    g(torch.zeros(4))  # y is held: the twin runs
    g(torch.zeros(4))
    y[1] = 100.0
    assert tail[0].item() == 100.0  # still a view of y, as eagerly
    torch.testing.assert_close(g(torch.ones(4))[0], torch.full((4,), 3.0))


def test_writing_into_a_result_does_not_change_the_next_one(graph_backend):
    g = _captured(f, torch.zeros(4), backend=graph_backend)
    out = g(torch.ones(4))
    out.add_(100)
    again = g(torch.ones(4))
    torch.testing.assert_close(again, f(torch.ones(4)))
    torch.testing.assert_close(out, f(torch.ones(4)) + 100)


def test_each_result_has_a_version_counter_of_its_own_as_eagerly(graph_backend):
    """A fresh result's version counter starts where eager's does, whatever was written into
    the results before it (each a new tensor over the lent memory, not a view sharing one
    counter with every result of its set)."""
    g = _captured(f, torch.zeros(4), backend=graph_backend)
    x = torch.ones(4, device=g.device or "cpu")
    for _ in range(5):  # held: the two sets alternate, each written into once it is handed out
        out = g(x)
        assert out._version == f(x)._version == 0
        out.add_(1)


def _several(x):
    y = x * 2
    return y, y[:2], x + 1  # (two results over one memory, as eagerly)


@pytest.mark.parametrize("outputs", ["safe", "clone"])
def test_copied_results_have_a_fresh_results_version_counter(graph_backend, outputs):
    """Copies handed out (``"clone"``, or once every output set is held) start at version 0, as
    the plain call's results do: the copy made into them is not the caller's write."""
    g = CudaGraphModule(_several, warmup=1, backend=graph_backend, outputs=outputs)
    x = torch.ones(4)
    kept = [g(x) for _ in range(6)]  # every result kept: "safe" ends up returning copies
    assert [r._version for r in kept[-1]] == [r._version for r in _several(x)] == [0, 0, 0]
    assert kept[-1][1].data_ptr() == kept[-1][0].data_ptr()  # (still over one memory)


def test_metadata_changes_on_a_result_do_not_reach_the_graph(graph_backend):
    g = _captured(lambda x: x.reshape(2, 2) + 1, torch.zeros(4), backend=graph_backend)
    out = g(torch.zeros(4))
    out.t_()  # in place on the caller's tensor object
    out.unsqueeze_(0)
    del out
    assert g(torch.zeros(4)).shape == (2, 2)


def test_inference_mode_results_are_inference_tensors_as_eagerly(graph_backend):
    with torch.inference_mode():
        g = _captured(f, torch.zeros(4), backend=graph_backend)
        out = g(torch.ones(4))
        assert out.is_inference() == f(torch.ones(4)).is_inference()
        kept = [g(torch.full((4,), float(i))) for i in range(3)]
    for i, t in enumerate(kept):
        torch.testing.assert_close(t, f(torch.full((4,), float(i))))


def test_clone_outputs_copy_every_result(graph_backend):
    g = _captured(f, torch.zeros(4), backend=graph_backend, outputs="clone")
    assert _outputs(g).startswith("outputs: COPYING")
    kept = [g(torch.ones(4)) for _ in range(4)]  # no twins: copies
    assert len({t.data_ptr() for t in kept}) == 4 and g.stats.twin_captures == 0


def test_a_tensordict_module_keeps_every_step_of_a_rollout(graph_backend):
    from tensordict.nn import TensorDictModule

    net = torch.nn.Linear(3, 2)
    if graph_backend == "cuda":
        net = net.cuda()
    policy = TensorDictModule(net, in_keys=["obs"], out_keys=["action"])
    g = CudaGraphModule(policy, warmup=1, backend=graph_backend, outputs="safe")
    steps, expected = [], []
    with torch.no_grad():
        for i in range(40):
            td = TensorDict(obs=torch.full((5, 3), float(i)), batch_size=[5])
            steps.append(g(td))
            expected.append(net(td["obs"]))
    for td, action in zip(steps, expected):
        torch.testing.assert_close(td["action"], action)


def test_the_repr_of_a_default_wrapper_does_not_mention_outputs():
    assert "outputs" not in repr(CudaGraphModule(f, backend="eager"))
    assert "outputs" not in repr(CudaGraphModule(f, backend="eager", outputs="safe"))  # the default
    assert "outputs='clone'" in repr(CudaGraphModule(f, backend="eager", outputs="clone"))


def test_results_outlive_a_deleted_wrapper(graph_backend):
    import gc

    g = _captured(f, torch.zeros(4), backend=graph_backend)
    out = g(torch.ones(4))
    assert _outputs(g).startswith("outputs: LENDING")  # `out` is the graph's memory, lent
    del g
    gc.collect()
    junk = [torch.full((4,), -5.0) for _ in range(100)]  # memory the allocator may hand out again
    torch.testing.assert_close(out, f(torch.ones(4)))
    del junk


def test_the_graph_memory_goes_back_when_the_last_result_goes(graph_backend, monkeypatch):
    import gc
    import weakref

    keepers = []
    make = lend._lent_storage

    def spy(owner):
        storage = make(owner)
        keepers.append(weakref.ref(owner))  # the graph's own storage object, held by its keeper
        return storage

    monkeypatch.setattr(lend, "_lent_storage", spy)
    g = _captured(f, torch.zeros(4), backend=graph_backend)
    out = g(torch.ones(4))
    del g
    gc.collect()
    assert keepers and all(k() is not None for k in keepers)  # `out` keeps the graph's memory
    torch.testing.assert_close(out, f(torch.ones(4)))
    del out
    gc.collect()
    assert all(k() is None for k in keepers)


def test_results_outlive_a_reset_and_a_new_capture(graph_backend):
    g = _captured(f, torch.zeros(4), backend=graph_backend)
    out = g(torch.ones(4))
    g.reset()
    for i in range(4):  # warm up and capture again, maybe over the same memory
        g(torch.full((4,), 9.0))
    torch.testing.assert_close(out, f(torch.ones(4)))


def test_stats_count_the_twins_and_the_copying_capture(graph_backend):
    assert OUTPUT_SETS == 3
    g = _captured(f, torch.zeros(4), backend=graph_backend)
    g(torch.ones(4))  # dropped
    g(torch.ones(4))
    assert g.stats.copy_recaptures == 0 and g.stats.twin_captures == 0
    first = g(torch.ones(4))
    second = g(torch.ones(4))  # first still held: a twin is captured and replayed
    assert g.stats.copy_recaptures == 0 and g.stats.twin_captures == 1
    third = g(torch.ones(4))  # both held: a third set
    assert g.stats.copy_recaptures == 0 and g.stats.twin_captures == 2
    del second
    fourth = g(torch.ones(4))  # the second set is free again: no capture
    assert g.stats.copy_recaptures == 0 and g.stats.twin_captures == 2
    fifth = g(torch.ones(4))  # all three held: captured once more, returning copies
    assert g.stats.copy_recaptures == 1 and g.stats.twin_captures == 2 and g.stats.graphs == 1
    sixth = g(torch.ones(4))  # a copy: no capture
    assert g.stats.copy_recaptures == 1 and g.stats.captures == 1
    for out in (first, third, fourth, fifth, sixth):
        torch.testing.assert_close(out, f(torch.ones(4)))


def test_calls_run_eagerly_where_no_copying_graph_can_be_captured(graph_backend, monkeypatch):
    g = _captured(f, torch.zeros(4), backend=graph_backend)
    record = graphs.record

    def failing(**kwargs):
        if not kwargs["plan"].lend:
            raise RuntimeError("no memory for a copying graph")
        return record(**kwargs)

    monkeypatch.setattr(graphs, "record", failing)  # captures from here on: twins, the copying one
    xs = [torch.full((4,), float(i)) for i in range(6)]
    kept = [g(x) for x in xs]  # three sets lent, then eager calls (their own results)
    for x, out in zip(xs, kept):
        torch.testing.assert_close(out, f(x))
    assert g.stats.twin_captures == 2 and g.stats.copy_recaptures == 0 and g.stats.eager_calls == 3
    assert _outputs(g).startswith("outputs: EAGER_WHILE_HELD, 3 sets")
    del kept
    replays = g.stats.replays
    torch.testing.assert_close(g(torch.ones(4)), f(torch.ones(4)))  # nothing held: a replay again
    assert g.stats.replays == replays + 1 and g.stats.eager_calls == 3


def test_a_result_held_past_the_loop_and_the_loop_variable_need_no_copies(graph_backend):
    """pytest-benchmark's rounds: each round's last result is held while the next round's
    loop holds its own (two results held at once, once in a while)."""
    g = _captured(f, torch.zeros(4), backend=graph_backend)
    last_round = None
    for r in range(5):
        out = None
        for i in range(10):
            out = g(torch.full((4,), float(i)))
            torch.testing.assert_close(out, f(torch.full((4,), float(i))))
        torch.testing.assert_close(last_round, f(torch.full((4,), 9.0))) if last_round is not None else None
        last_round = out
    assert g.stats.copy_recaptures == 0 and g.stats.twin_captures == 2
    assert _outputs(g).startswith("outputs: FULL, 3 sets")


def test_a_loop_variable_alternates_between_the_twins_without_copies(graph_backend):
    g = _captured(f, torch.zeros(4), backend=graph_backend)
    memories = set()
    out = None
    for i in range(20):
        out = g(torch.full((4,), float(i)))  # the last result is held by `out` during the call
        memories.add(out.data_ptr())
        torch.testing.assert_close(out, f(torch.full((4,), float(i))))
    assert g.stats.twin_captures == 1 and g.stats.copy_recaptures == 0
    assert len(memories) == 2 and _outputs(g).startswith("outputs: TWINS, 2 sets")  # the two sets' memory


@pytest.mark.parametrize("held", ["one result", "results of every set and a copy", "a deleted wrapper's"])
def test_a_process_ending_with_results_held_exits_cleanly(held, tmp_path):
    """Lent storages alive at interpreter shutdown (each keeps its graph's memory through a
    Python object): the process ends cleanly (a storage made at shutdown once aborted it)."""
    import subprocess
    import sys

    body = {
        "one result": "a = g(torch.ones(4))",
        "results of every set and a copy": "a, b, c, d = [g(torch.ones(4)) for _ in range(4)]",
        "a deleted wrapper's": "a, b, c, d = [g(torch.ones(4)) for _ in range(4)]; del g",
    }[held]
    script = tmp_path / "held.py"
    script.write_text(
        "import torch\n"
        "from graphmodule import CudaGraphModule\n"
        "g = CudaGraphModule(lambda x: x * 2 + 1, warmup=1, backend='simulate', outputs='safe')\n"
        "g(torch.zeros(4)); g(torch.zeros(4))\n"
        f"{body}\n"
        "print('done')\n"
    )
    root = __import__("os").path.dirname(__import__("os").path.dirname(__import__("os").path.abspath(__file__)))
    os = __import__("os")
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)  # (the GPU's wheels)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": path})
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr[-2000:]
    assert "terminate called" not in proc.stderr


def test_a_function_that_rebinds_what_it_reads_keeps_one_graph(graph_backend):
    """PPO's closure update sets ``group["lr"] = lr0 * alpha`` at every call: the twin's
    capture leaves the optimizer holding the twin's tensor, which the first graph does not
    read; the twin replaces it (no stale error, every value as eagerly)."""
    state = {"scale": torch.tensor(1.0)}
    eager_state = {"scale": torch.tensor(1.0)}

    def step(x, state=state):
        state["scale"] = x.sum() * 0.5  # rebinds, as the PPO closure does
        return x * state["scale"]

    def eager(x):
        eager_state["scale"] = x.sum() * 0.5
        return x * eager_state["scale"]

    g = _captured(step, torch.ones(3), backend=graph_backend)
    out = None
    for i in range(6):
        x = torch.full((3,), float(i))
        out = g(x)  # held during the next call: a twin is tried
        torch.testing.assert_close(out, eager(x))
        torch.testing.assert_close(state["scale"], eager_state["scale"])
    assert g.stats.twin_captures == 1 and g.stats.copy_recaptures == 1 and g.stats.graphs == 1
    assert _outputs(g).startswith("outputs: COPYING")


# -- twins: captured beside the first graph, their results copied into buffers of their own --


def _outputs_of_every_kind(x, scale):
    big = x.unsqueeze(0) * torch.arange(1.0, 65.0, device=x.device).unsqueeze(1)  # a temporary
    y = big.sum(0)
    m = big[:4].t()  # a non-contiguous view of a temporary
    return {
        "y": y, "tail": y[1:], "every_other": y[::2], "m": m, "row": big[2],
        "expanded": y.sum().expand(3), "empty": y[:0], "nothing": x.new_empty(0),
        "input": x, "input_view": x[1:], "scale": scale,
        "list": [y * 2, (y * 3).reshape(2, -1).t()],
        "td": TensorDict(a=y + 1, b=m, batch_size=[]),
    }


def _same_layout(ours, eager):
    assert (ours.shape, ours.stride(), ours.dtype) == (eager.shape, eager.stride(), eager.dtype)


def _check_every_kind(r, x, scale):
    e = _outputs_of_every_kind(x, scale)
    for key in ("y", "tail", "every_other", "m", "row", "expanded", "empty", "nothing", "input_view"):
        torch.testing.assert_close(r[key], e[key])
        _same_layout(r[key], e[key])
    for ours, eager in zip(r["list"], e["list"]):
        torch.testing.assert_close(ours, eager)
        _same_layout(ours, eager)
    torch.testing.assert_close(r["td"]["a"], e["td"]["a"])
    torch.testing.assert_close(r["td"]["b"], e["td"]["b"])
    assert r["input"] is x and r["scale"] is scale
    assert r["input_view"].data_ptr() == x.data_ptr() + x.element_size()
    # views of one result stay views of it, where eagerly
    y = r["y"]
    assert r["tail"].data_ptr() == y.data_ptr() + y.element_size()
    assert r["every_other"].data_ptr() == y.data_ptr()
    assert r["td"]["b"].data_ptr() == r["m"].data_ptr()
    assert r["row"].data_ptr() == r["m"].data_ptr() + 2 * r["m"].stride(1) * r["m"].element_size()


def test_a_twin_is_captured_beside_the_first_graph_and_costs_its_outputs():
    """A twin used to be a whole capture in a pool of its own (each one the memory of the
    first capture); now it shares the first graph's pool and copies its results into
    buffers of its own: it costs those buffers, which ``stats.twin_bytes`` counts."""
    g = _captured(f, torch.zeros(4))
    a = g(torch.ones(4))
    b = g(torch.full((4,), 2.0))  # `a` held: a twin
    assert g.stats.twin_captures == 1
    assert g.stats.twin_bytes == 4 * 4  # its output buffer, nothing else (no pool on the CPU)
    assert b.data_ptr() != a.data_ptr() and _outputs(g).startswith("outputs: TWINS, 2 sets")
    torch.testing.assert_close(a, f(torch.ones(4)))
    torch.testing.assert_close(b, f(torch.full((4,), 2.0)))


def test_a_twin_lays_out_its_buffers_as_the_first_graphs_results(graph_backend):
    """Views of one result, strided and expanded results, results without elements: the
    twins' buffers keep the first graph's layout (one buffer per group of results sharing
    memory, with the same strides and offsets); inputs, their views and tensors read from
    outside are not copied (they are the caller's own)."""
    scale = torch.full((8,), 0.5)
    g = _captured(_outputs_of_every_kind, torch.zeros(8), scale, backend=graph_backend)
    x0 = torch.arange(8.0)
    first = g(x0, scale)
    x1 = torch.arange(8.0) * -1
    second = g(x1, scale)  # `first` held: the twin
    x2 = torch.arange(8.0) + 10
    third = g(x2, scale)  # both held: another twin
    assert g.stats.twin_captures == 2 and g.stats.copy_recaptures == 0
    for r, x in ((first, x0), (second, x1), (third, x2)):
        _check_every_kind(r, x, scale)
    # each twin's buffers: the result groups of the first graph, counted once each
    # y (and its views), big's rows 0-3 (m, row, td's b), expanded, the list's two, td's a
    per_twin = 4 * (8 + 8 * 4 + 1 + 8 + 8 + 8)
    if graph_backend == "simulate":
        assert g.stats.twin_bytes == 2 * per_twin


def test_results_held_across_many_calls_are_never_overwritten(graph_backend):
    """Results held every way programs hold them (the result, a view of it, a list or dict
    it is in, a TensorDict), dropped in an irregular pattern over many calls, next to a
    loop variable: each one keeps the eager function's value."""
    scale = torch.full((8,), 0.5)
    g = _captured(_outputs_of_every_kind, torch.zeros(8), scale, backend=graph_backend)
    kept = []
    r = None
    for i in range(60):
        x = torch.full((8,), float(i)) + torch.arange(8.0)
        r = g(x, scale)  # the loop variable holds the last result during the call
        kind = i % 7
        if kind == 1:
            kept.append(("whole", x, r))
        elif kind == 2:
            kept.append(("view", x, r["tail"]))
        elif kind == 3:
            kept.append(("list", x, r["list"]))
        elif kind == 4:
            kept.append(("td", x, TensorDict(y=r["y"], m=r["m"], batch_size=[])))
        if i % 11 == 10:  # drop some, keep the rest
            kept = kept[::2]
    for kind, x, held in kept:
        e = _outputs_of_every_kind(x, scale)
        if kind == "whole":
            _check_every_kind(held, x, scale)
        elif kind == "view":
            torch.testing.assert_close(held, e["tail"])
        elif kind == "list":
            for ours, eager in zip(held, e["list"]):
                torch.testing.assert_close(ours, eager)
        else:
            torch.testing.assert_close(held["y"], e["y"])
            torch.testing.assert_close(held["m"], e["m"])
    assert g.stats.twin_captures == 2 and g.stats.copy_recaptures == 1


def test_wrappers_sharing_a_pool_keep_each_others_held_results(graph_backend):
    """A second wrapper's graph in the shared pool (which holds the first's graph) returns
    copies, then is captured again to lend from buffers outside the pool; the twins of
    both go in the shared pool."""
    a = CudaGraphModule(_with_temporaries, warmup=1, backend=graph_backend, outputs="safe")
    b = CudaGraphModule(lambda x: _with_temporaries(x) * 5, warmup=1, backend=graph_backend, outputs="safe",
                        pool=a.pool)
    kept = []
    for i in range(16):
        x = torch.full((3,), float(i))
        kept.append((x, a(x), b(x)))
        if i % 5 == 4:
            kept = kept[-2:]
    for x, ra, rb in kept:
        torch.testing.assert_close(ra, _with_temporaries(x))
        torch.testing.assert_close(rb, _with_temporaries(x) * 5)


def _heavy(x):
    """128 MiB and more of temporaries for 4 KiB of results."""
    t = x.expand(16384, x.shape[0]) * 2.0
    u = torch.sin(t) + t
    return u.sum(0)


def _twin_cost(g, x):
    """(memory the capture added, memory the twin added, both as memory_reserved grew)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    a = g(x)  # the capture (or the first call of this signature's graph)
    torch.cuda.synchronize()
    captured = torch.cuda.memory_reserved()
    b = g(x * 2)  # `a` held: the twin
    torch.cuda.synchronize()
    twin = torch.cuda.memory_reserved() - captured
    torch.testing.assert_close(a, _heavy(x))
    torch.testing.assert_close(b, _heavy(x * 2))
    return captured - before, twin


SLACK = 4 << 20  # a new segment of the caching allocator for small blocks is 2 MiB


@pytest.mark.cuda
def test_a_twin_adds_about_its_outputs_to_the_memory_held(cuda):
    g = CudaGraphModule(_heavy, warmup=1, outputs="safe")
    x = torch.randn(1024, device=cuda)
    g(x)  # warmup
    first, twin = _twin_cost(g, x)
    out_bytes = 1024 * 4
    assert g.stats.twin_captures == 1
    assert first >= 128 << 20, first
    assert twin <= 2 * out_bytes + SLACK, (first, twin)  # was: the first capture's cost again
    assert g.stats.twin_bytes <= 2 * out_bytes + SLACK, g.stats
    assert g.stats.graph_bytes[0] >= 128 << 20


@pytest.mark.cuda
def test_signatures_share_one_pool_under_safe_outputs(cuda):
    """A second signature's graphs (the capture returning copies, then the lending one) go
    in the wrapper's pool, reusing the first graph's temporaries: the memory held grows by
    their outputs, not by another capture's 128 MiB (before: a pool of its own)."""
    g = CudaGraphModule(_heavy, warmup=1, outputs="safe", max_graphs=2)
    a = torch.randn(1024, device=cuda)
    g(a)
    g(a)  # the first graph, in the wrapper's pool: 128 MiB of temporaries
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    x = torch.randn(1023, device=cuda)
    g(x)  # warmup of the second signature
    kept = [g(x * i) for i in range(4)]  # its capture (copies), the lending capture, a twin
    torch.cuda.synchronize()
    assert g.stats.lending_captures == 1 and g.stats.graphs == 2 and g.stats.twin_captures >= 1
    assert torch.cuda.memory_reserved() <= reserved + 2 * SLACK, (reserved, torch.cuda.memory_reserved())
    for i, out in enumerate(kept):
        torch.testing.assert_close(out, _heavy(x * i))
    torch.testing.assert_close(g(a), _heavy(a))


@pytest.mark.cuda
def test_twins_and_the_copying_capture_reuse_the_first_captures_memory(cuda):
    """Two twins and the graph returning copies, all captured in the wrapper's pool, which
    already has what their temporaries need: neither the pool nor the memory held grows by
    a capture per graph (before: a pool of its own per twin, each the first capture's size)."""
    g = CudaGraphModule(_heavy, warmup=1, outputs="safe")
    x = torch.randn(1024, device=cuda)
    g(x)
    g(x)
    torch.cuda.synchronize()
    pool, reserved = g.stats.pool_bytes, torch.cuda.memory_reserved()
    kept = [g(x * i) for i in range(6)]  # lent by three sets, then copies
    torch.cuda.synchronize()
    assert g.stats.twin_captures == 2 and g.stats.copy_recaptures == 1
    assert g.stats.pool_bytes <= pool + SLACK, (pool, g.stats.pool_bytes)
    assert torch.cuda.memory_reserved() <= reserved + 2 * SLACK, (reserved, torch.cuda.memory_reserved())
    for i, out in enumerate(kept):
        torch.testing.assert_close(out, _heavy(x * i))


def test_a_kept_storage_of_a_dropped_result_keeps_its_bytes(graph_backend):
    g = _captured(f, torch.zeros(4), backend=graph_backend)
    storage = g(torch.ones(4)).untyped_storage()  # the result itself is gone; its storage is not
    g(torch.full((4,), 7.0))
    kept = torch.empty(0, device=storage.device).set_(storage)
    torch.testing.assert_close(kept, f(torch.ones(4)))


def test_a_kept_storage_of_one_result_of_several(graph_backend):
    def pair(x):
        return x * 2, x + 1

    g = _captured(pair, torch.zeros(4), backend=graph_backend)
    first, second = g(torch.ones(4))
    storage = second.untyped_storage()
    del first, second
    g(torch.full((4,), 7.0))
    torch.testing.assert_close(torch.empty(0, device=storage.device).set_(storage), torch.ones(4) + 1)
