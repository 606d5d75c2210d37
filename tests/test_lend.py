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
import graphmodule._lend as lend
from graphmodule._lend import available



def test_lending_works_on_every_supported_torch():
    """torch 2.11 (the GPU machine's) lacks ``UntypedStorage._swap_data_ptr_``, which lending
    once needed: "safe" then silently cloned there, and these tests were all skipped."""
    assert available()
    g = _captured(f, torch.zeros(4))
    assert _entry(g).plan.lender is not None


def _entry(g):
    return g._entries[0]


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
    lender = _entry(g).plan.lender
    buffer = _entry(g).plan.graph[0]
    for i in range(5):
        out = g(torch.full((4,), float(i)))
        assert out.data_ptr() == buffer.data_ptr()  # zero-copy: the graph's own memory
        torch.testing.assert_close(out, f(torch.full((4,), float(i))))
        del out
    assert g.stats.twin_captures == 0 and g.stats.copy_recaptures == 0
    assert _entry(g).plan.lender is lender


def test_a_kept_result_keeps_its_value(graph_backend):
    g = _captured(f, torch.zeros(4), backend=graph_backend)
    xs = [torch.full((4,), float(i)) for i in range(40)]
    kept = [g(x) for x in xs]  # lent by each output set, then copies from a graph captured anew
    for x, out in zip(xs, kept):
        torch.testing.assert_close(out, f(x))
    assert g.stats.twin_captures == lend.OUTPUT_SETS - 1 and g.stats.copy_recaptures == 1
    assert _entry(g).plan.lender is None  # the graph returning copies replaced the lending two
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
    assert _entry(g).plan.lender is None
    out = g(torch.ones(4))
    assert out.data_ptr() != _entry(g).plan.graph[0].data_ptr()


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
    assert "outputs='safe'" in repr(CudaGraphModule(f, backend="eager", outputs="safe"))


def test_results_outlive_a_deleted_wrapper(graph_backend):
    import gc

    g = _captured(f, torch.zeros(4), backend=graph_backend)
    out = g(torch.ones(4))
    graph_memory = _entry(g).plan.graph[0].data_ptr()
    del g
    gc.collect()
    assert out.data_ptr() == graph_memory  # the graph's memory, kept alive by the result
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
    assert lend.OUTPUT_SETS == 3
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
    record_again = g._record_again

    def failing(entry, leaves, objs, lend):
        if not lend:
            raise RuntimeError("no memory for a copying graph")
        return record_again(entry, leaves, objs, lend)

    monkeypatch.setattr(g, "_record_again", failing)
    xs = [torch.full((4,), float(i)) for i in range(6)]
    kept = [g(x) for x in xs]  # three sets lent, then eager calls (their own results)
    for x, out in zip(xs, kept):
        torch.testing.assert_close(out, f(x))
    assert g.stats.twin_captures == 2 and g.stats.copy_recaptures == 0 and g.stats.eager_calls == 3
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
    assert _entry(g).plan.lender is not None


def test_a_loop_variable_alternates_between_the_twins_without_copies(graph_backend):
    g = _captured(f, torch.zeros(4), backend=graph_backend)
    entry = _entry(g)
    memories = set()
    out = None
    for i in range(20):
        out = g(torch.full((4,), float(i)))  # the last result is held by `out` during the call
        memories.add(out.data_ptr())
        torch.testing.assert_close(out, f(torch.full((4,), float(i))))
    assert g.stats.twin_captures == 1 and g.stats.copy_recaptures == 0
    assert memories == {entry.plan.graph[0].data_ptr(), entry.others[0].plan.graph[0].data_ptr()}


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
    assert g.stats.twin_captures == 1 and g._entries[0].others == [] and g.stats.copy_recaptures == 1
