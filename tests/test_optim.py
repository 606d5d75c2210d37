"""Optimizers built with ``capturable=False`` that the wrapped function steps: made capturable
before their first step where that is exact (the class has the flag, no state yet, every
parameter on the graph's device), with one warning; refused with the cause and the fix
where it is not.

The decision (``_optim.verdict``) is a pure function, tested here on facts. The rest goes
through the public API: on the simulated backend nothing changes (there is no CUDA graph,
and torch refuses ``capturable=True`` on CPU tensors); under ``cuda`` (the ``graph_backend``
fixture on a GPU, and the tests marked ``cuda``) the flag is set, one warning names the
optimizer, and the graphed run equals an eager run of a capturable optimizer exactly.

The tolerance against a ``capturable=False`` eager run: capturable Adam computes its bias
corrections as float32 tensors on the GPU (``1 - beta1 ** step`` on the step count), the
plain one in Python floats from the count read on the host, and orders the division
otherwise. The parameters differ in the last bits: a few units of float32 rounding per step,
about 1e-7 absolute after 20 to 50 steps of lr 1e-2 on networks like the one below; 1e-6
absolute (plus 1e-5 relative) after 20 steps leaves a margin of some ten times and still fails
for a step that is wrong (one update moves a parameter by about lr, 1e-2).
"""

import copy
import re

import pytest
import torch
from torch import nn
from torch.optim import optimizer as torch_optimizer

from graphmodule import CaptureError, CudaGraphModule
from graphmodule._diagnose import diagnose
from graphmodule._discover import Discovery
from graphmodule._optim import Facts, Verdict, explain, facts, stepping_capturable, verdict

CUDA0 = torch.device("cuda", 0)
CPU = torch.device("cpu")
STEPS = 20
LAST_BITS = {"rtol": 1e-5, "atol": 1e-6}  # capturable against capturable=False (see the module docstring)


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))


def _train_step(net, opt):
    def step(x, y):
        opt.zero_grad()
        loss = (net(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _batch(i):
    gen = torch.Generator().manual_seed(i)  # (on the CPU, whatever the default device)
    x, y = torch.randn(8, 4, generator=gen, device="cpu"), torch.randn(8, 1, generator=gen, device="cpu")
    device = torch.get_default_device()
    return x.to(device), y.to(device)


def _ours(record):
    """The warnings graphmodule gave (``pytest.warns`` also records torch's once-per-process
    notices, which the test setup otherwise ignores)."""
    return [str(w.message) for w in record if str(w.message).startswith("CudaGraphModule(")]


def _switched(owner, names, device, which="it"):
    return (f"{owner} made the optimizer(s) it steps capturable (capturable=True on their param_groups, "
            f"before their first step): {names}. A CUDA graph steps only capturable optimizers, whose step "
            f"counts and bias corrections are tensors on {device}, as torch.compile makes them; parameters "
            f"can differ from a capturable=False eager step in the last bits. To silence this warning, "
            f"create {which} with capturable=True.")


def _equal(a, b):
    assert torch.equal(a, b), (a, b)


def _fused(owner, names):
    return (f"{owner} made the optimizer(s) it steps fused (fused=True on their param_groups, before their "
            f"first step): {names}. On a GPU the wrapper makes them capturable, which torch refuses for CPU "
            f"tensors; backend='simulate' stands in with a fused step, whose step counts are tensors too. "
            f"Parameters can differ from a plain eager step in the last bits. To silence this warning, create "
            f"them with fused=True on the CPU and capturable=True on a GPU.")


class TestVerdict:
    """The decision, on facts: switched only where the switch is exact."""

    @pytest.mark.parametrize(("found", "device", "expected"), [
        (Facts((False,), False, frozenset({CUDA0})), CUDA0, Verdict.SWITCH),
        (Facts((False, True), False, frozenset({CUDA0})), CUDA0, Verdict.SWITCH),
        (Facts((False,), False, frozenset()), CUDA0, Verdict.SWITCH),
        (Facts((True, True), False, frozenset({CUDA0})), CUDA0, Verdict.CAPTURABLE),
        (Facts((True,), True, frozenset({CUDA0})), CUDA0, Verdict.CAPTURABLE),
        (Facts((None,), False, frozenset({CUDA0})), CUDA0, Verdict.NO_FLAG),
        (Facts((False,), True, frozenset({CUDA0})), CUDA0, Verdict.STEPPED),
        (Facts((False,), False, frozenset({CUDA0, CPU})), CUDA0, Verdict.OFF_DEVICE),
        (Facts((False,), False, frozenset({torch.device("cuda", 1)})), CUDA0, Verdict.OFF_DEVICE),
        (Facts((False,), True, frozenset({CPU})), CUDA0, Verdict.OFF_DEVICE),
        (Facts((False,), False, frozenset({CPU})), None, Verdict.NO_GRAPH),
        (Facts((False,), False, frozenset({CPU})), CPU, Verdict.NO_GRAPH),
    ], ids=["plain", "one-group-plain", "no-params", "capturable", "capturable-stepped", "sgd", "stepped",
            "a-param-on-cpu", "other-gpu", "cpu-stepped", "no-graph", "cpu-device"])
    def test_verdict(self, found, device, expected):
        assert verdict(found, device) is expected

    @pytest.mark.parametrize(("found", "expected"), [
        (Facts((False,), False, frozenset({CPU}), fusable=True), Verdict.FUSE),
        (Facts((False,), False, frozenset({CPU}), fusable=False), Verdict.NO_GRAPH),  # RMSprop, say
        (Facts((False,), True, frozenset({CPU}), fusable=True), Verdict.NO_GRAPH),  # stepped before
        (Facts((True,), False, frozenset({CPU}), fusable=True), Verdict.NO_GRAPH),  # (capturable: torch refuses)
        (Facts((None,), False, frozenset({CPU}), fusable=False), Verdict.NO_GRAPH),  # SGD
        (Facts((False,), False, frozenset({CUDA0}), fusable=True), Verdict.NO_GRAPH),
    ])
    def test_the_simulated_stand_in(self, found, expected):
        assert verdict(found, None, simulated=True) is expected

    def test_facts_of_an_optimizer_before_and_after_its_first_step(self):
        net = _net()
        opt = torch.optim.Adam([{"params": net[0].parameters()}, {"params": net[2].parameters(), "lr": 0.1}])
        assert facts(opt) == Facts((False, False), False, frozenset({CPU}), fusable=True)
        opt.state[net[0].weight]  # (a defaultdict: reading makes an empty entry, not a step)
        assert not facts(opt).stepped
        _train_step(net, opt)(*_batch(0))
        assert facts(opt) == Facts((False, False), True, frozenset({CPU}), fusable=True)

    @pytest.mark.parametrize("name", ["SGD", "Adagrad"])
    def test_facts_of_a_class_without_the_flag(self, name):
        opt = getattr(torch.optim, name)(_net().parameters(), lr=0.1)
        assert facts(opt).flags == (None,)
        assert verdict(facts(opt), CUDA0) is Verdict.NO_FLAG


class TestExplain:
    """A capture torch refused names the optimizer, why it was not switched and the fix."""

    _REFUSED = RuntimeError("Attempting CUDA graph capture of step() for an instance of Adam but param_groups' "
                            "capturable is False.")

    @pytest.mark.cuda
    def test_an_optimizer_that_stepped_before(self, cuda):
        net = _net().to(cuda)
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        step = _train_step(net, opt)
        step(*(t.to(cuda) for t in _batch(0)))
        err = explain(diagnose("CudaGraphModule(step)", self._REFUSED), Discovery(step), cuda)
        assert err.cause == "optimizer-not-capturable"
        assert err.hint == (
            "expected a capturable optimizer, got Adam with capturable=False with state from before the wrapper's "
            "first call (a step or load_state_dict: its step counts are on the host) at closure variable 'opt' of "
            "_train_step.<locals>.step; "
            "do: create it with capturable=True, or before the first call set capturable=True in each of its "
            "param_groups and reload its state (opt.load_state_dict(opt.state_dict()) moves its step counts "
            "to the GPU).")

    @pytest.mark.parametrize("stepped", [False, True])
    def test_an_optimizer_with_parameters_elsewhere(self, stepped):
        net = _net()
        step = _train_step(net, torch.optim.Adam(net.parameters(), lr=1e-2))
        if stepped:  # (as a warmup call leaves it: not switched, it stepped on the CPU)
            step(*_batch(0))
        err = explain(diagnose("CudaGraphModule(step)", self._REFUSED), Discovery(step), CUDA0)
        assert err.hint == (
            "expected a capturable optimizer, got Adam with capturable=False with parameters on cpu (the graph "
            "runs on cuda:0) at closure variable 'opt' of _train_step.<locals>.step; do: move its parameters "
            "to cuda:0 before creating it, with capturable=True.")

    def test_other_causes_and_capturable_optimizers_are_left_alone(self):
        net = _net()
        step = _train_step(net, torch.optim.SGD(net.parameters(), lr=1e-2))
        refused = diagnose("CudaGraphModule(step)", self._REFUSED)
        assert explain(refused, Discovery(step), CUDA0) is refused  # (SGD has no flag: not the one)
        other = diagnose("CudaGraphModule(step)", RuntimeError("operation not permitted when stream is capturing"))
        assert explain(other, Discovery(step), CUDA0) is other


def test_the_step_hook_lives_for_the_warmup_call_only():
    hooks = torch_optimizer._global_optimizer_pre_hooks
    before = dict(hooks)
    net = _net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    step = _train_step(net, opt)
    seen = []

    def body():
        seen.append(len(hooks) - len(before))
        step(*_batch(0))
        raise KeyError("the function's own error")

    with pytest.raises(KeyError, match="the function's own error"):
        stepping_capturable("CudaGraphModule(step)", step, CUDA0, body)
    assert seen == [1] and dict(hooks) == before  # (removed though the call raised)
    assert opt.param_groups[0]["capturable"] is False  # (its parameters are on the CPU)


def _runs(graph_backend, make_opt, seed=0):
    """A wrapped train step and ``STEPS`` calls of it, beside eager twins: one whose optimizer
    is capturable where the graphed one is made so (on CUDA), one made by ``make_opt``."""
    net = _net(seed)
    twins = [copy.deepcopy(net), copy.deepcopy(net)]
    opt = make_opt(net.parameters())
    g = CudaGraphModule(_train_step(net, opt), warmup=2, backend=graph_backend)
    cuda = graph_backend == "cuda"
    # (simulated: fused, its stand-in on the CPU)
    same = _train_step(twins[0], torch.optim.Adam(twins[0].parameters(), lr=1e-2, capturable=cuda, fused=not cuda))
    plain = _train_step(twins[1], make_opt(twins[1].parameters()))
    return net, opt, g, same, plain, twins


def test_a_plain_adam_is_made_capturable_before_its_first_step(graph_backend):
    net, opt, g, same, plain, (twin, plain_twin) = _runs(graph_backend, lambda ps: torch.optim.Adam(ps, lr=1e-2))
    cuda = graph_backend == "cuda"
    if cuda:
        with pytest.warns(UserWarning) as record:
            g(*_batch(0))
        assert _ours(record) == [_switched(
            "CudaGraphModule(step)", "Adam at closure variable 'opt' of _train_step.<locals>.step", CUDA0)]
    else:  # simulated: fused, its stand-in on the CPU
        with pytest.warns(UserWarning) as record:
            g(*_batch(0))
        assert _ours(record) == [_fused(
            "CudaGraphModule(step)", "Adam at closure variable 'opt' of _train_step.<locals>.step")]
    assert opt.param_groups[0]["capturable"] is cuda
    assert opt.param_groups[0]["fused"] is not cuda
    assert opt.state[net[0].weight]["step"].device == (CUDA0 if cuda else CPU)
    same(*_batch(0))
    plain(*_batch(0))
    # the same steps as an eager capturable (simulated: fused) Adam's; on CUDA to float32's
    # precision, since a graph's kernels may round otherwise than the eager calls' (cuBLAS)
    same_as = (lambda a, b: torch.testing.assert_close(a, b, rtol=1.3e-6, atol=1e-6)) if cuda else _equal
    for i in range(1, STEPS):  # the rest of the warmup, the capture and the replays: no other warning
        loss = g(*_batch(i))
        same_as(loss, same(*_batch(i)))
        plain(*_batch(i))
    assert g.state == "captured" and g.stats.replays == STEPS - 2
    for p, q, r in zip(net.parameters(), twin.parameters(), plain_twin.parameters()):
        same_as(p, q)
        torch.testing.assert_close(p, r, **LAST_BITS)  # and the last-bit difference from a plain one's


@pytest.mark.cuda
def test_a_fused_adam_switched_steps_as_the_plain_fused_one(cuda):
    with torch.device(cuda):
        net, opt, g, _, plain, (_, plain_twin) = _runs("cuda", lambda ps: torch.optim.Adam(ps, lr=1e-2, fused=True))
        with pytest.warns(UserWarning, match="made the optimizer"):
            g(*_batch(0))
        plain(*_batch(0))
        for i in range(1, STEPS):
            assert torch.equal(g(*_batch(i)), plain(*_batch(i)))
    assert opt.param_groups[0]["capturable"] is True and g.state == "captured"
    for p, r in zip(net.parameters(), plain_twin.parameters()):
        assert torch.equal(p, r)  # fused Adam's math ignores the flag: no last-bit difference


def test_sgd_has_no_flag_and_steps_as_it_is(graph_backend):
    net, opt, g, _, plain, (_, plain_twin) = _runs(
        graph_backend, lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9))
    for i in range(STEPS):
        assert torch.equal(g(*_batch(i)), plain(*_batch(i)))
    assert "capturable" not in opt.param_groups[0] and g.state == "captured"
    for p, r in zip(net.parameters(), plain_twin.parameters()):
        assert torch.equal(p, r)


def test_two_optimizers_are_named_in_one_warning(graph_backend):
    critic, actor = _net(0), _net(1)
    q_opt, a_opt = torch.optim.Adam(critic.parameters(), lr=1e-3), torch.optim.AdamW(actor.parameters(), lr=1e-3)

    def update(x, y):
        q_opt.zero_grad()
        (critic(x) - y).pow(2).mean().backward()
        q_opt.step()
        a_opt.zero_grad()
        (actor(x) - critic(x).detach()).pow(2).mean().backward()
        a_opt.step()

    g = CudaGraphModule(update, warmup=1, backend=graph_backend)
    if graph_backend == "cuda":
        with pytest.warns(UserWarning) as record:
            g(*_batch(0))
        names = ("Adam at closure variable 'q_opt' of test_two_optimizers_are_named_in_one_warning.<locals>.update; "
                 "AdamW at closure variable 'a_opt' of test_two_optimizers_are_named_in_one_warning.<locals>.update")
        assert _ours(record) == [_switched("CudaGraphModule(update)", names, CUDA0, "them")]
    else:
        with pytest.warns(UserWarning) as record:
            g(*_batch(0))
        names = ("Adam at closure variable 'q_opt' of test_two_optimizers_are_named_in_one_warning.<locals>.update; "
                 "AdamW at closure variable 'a_opt' of test_two_optimizers_are_named_in_one_warning.<locals>.update")
        assert _ours(record) == [_fused("CudaGraphModule(update)", names)]
    for i in range(1, 4):
        g(*_batch(i))
    assert [q_opt.param_groups[0]["capturable"], a_opt.param_groups[0]["capturable"]] == [graph_backend == "cuda"] * 2
    assert g.state == "captured"


def test_an_optimizer_the_function_reaches_but_does_not_step_is_left_alone(graph_backend):
    net = _net()
    net.optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)  # found by discovery, never stepped by g
    g = CudaGraphModule(net, warmup=1, backend=graph_backend)
    with torch.no_grad():
        for i in range(3):
            assert torch.equal(g(_batch(i)[0]), net(_batch(i)[0]))
    assert net.optimizer.param_groups[0]["capturable"] is False


@pytest.mark.cuda
def test_an_optimizer_that_stepped_before_is_refused_with_the_fix(cuda):
    torch.manual_seed(0)
    net = _net().to(cuda)
    twin = copy.deepcopy(net)
    opt, opt_e = torch.optim.Adam(net.parameters(), lr=1e-2), torch.optim.Adam(twin.parameters(), lr=1e-2)
    step, eager = _train_step(net, opt), _train_step(twin, opt_e)
    x, y = (t.to(cuda) for t in _batch(0))
    step(x, y)  # stepped eagerly before the wrapper: its step counts are CPU tensors
    eager(x, y)
    g = CudaGraphModule(step, warmup=1)
    g(x, y)  # a warmup call: nothing switched, no warning
    eager(x, y)
    with pytest.raises(CaptureError) as info:
        g(x, y)
    assert info.value.cause == "optimizer-not-capturable"
    assert str(info.value).splitlines()[1] == (
        "Likely cause (optimizer-not-capturable): expected a capturable optimizer, got Adam with capturable=False "
        "with state from before the wrapper's first call (a step or load_state_dict: its step counts are on the "
        "host) at closure variable 'opt' of _train_step.<locals>.step; do: create it with capturable=True, or before the first call set "
        "capturable=True in each of its param_groups and reload its state (opt.load_state_dict(opt.state_dict()) "
        "moves its step counts to the GPU).")
    # the advice, followed, on both: the graph steps as the eager capturable optimizer does
    for o in (opt, opt_e):
        for group in o.param_groups:
            group["capturable"] = True
        o.load_state_dict(o.state_dict())
        assert o.state[o.param_groups[0]["params"][0]]["step"].device == cuda
    g.reset()
    for i in range(1, 8):
        x, y = (t.to(cuda) for t in _batch(i))
        assert torch.equal(g(x, y), eager(x, y))
    assert g.state == "captured"
    for p, q in zip(net.parameters(), twin.parameters()):
        assert torch.equal(p, q)


@pytest.mark.cuda
def test_an_optimizer_that_stepped_before_runs_eagerly_when_asked(cuda):
    net = _net().to(cuda)
    twin = copy.deepcopy(net)
    step = _train_step(net, torch.optim.Adam(net.parameters(), lr=1e-2))
    eager = _train_step(twin, torch.optim.Adam(twin.parameters(), lr=1e-2))
    x, y = (t.to(cuda) for t in _batch(0))
    step(x, y)
    eager(x, y)
    g = CudaGraphModule(step, warmup=1, on_capture_failure="eager")
    assert torch.equal(g(x, y), eager(x, y))
    with pytest.warns(UserWarning, match=re.escape("Likely cause (optimizer-not-capturable): expected a capturable")):
        assert torch.equal(g(x, y), eager(x, y))
    for i in range(1, 5):
        x, y = (t.to(cuda) for t in _batch(i))
        assert torch.equal(g(x, y), eager(x, y))
    assert g.state == "eager"
    for p, q in zip(net.parameters(), twin.parameters()):
        assert torch.equal(p, q)  # served eagerly: the plain optimizer's own steps


@pytest.mark.cuda
def test_an_optimizer_of_cpu_parameters_is_not_switched(cuda):
    net = _net()  # on the CPU: its steps are not the graph's work
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    x, y = _batch(0)

    def step():
        opt.zero_grad()
        (net(x) - y).pow(2).mean().backward()
        opt.step()

    g = CudaGraphModule(step, warmup=1)
    g()
    with pytest.raises(CaptureError) as info:
        g()
    assert opt.param_groups[0]["capturable"] is False
    assert info.value.hint == (
        "expected a capturable optimizer, got Adam with capturable=False with parameters on cpu (the graph "
        "runs on cuda:0) at closure variable 'opt' of test_an_optimizer_of_cpu_parameters_is_not_switched."
        "<locals>.step; do: move its parameters to cuda:0 before creating it, with capturable=True.")


def test_a_plain_adam_in_a_compiled_step_is_switched_too(graph_backend):
    # torch.compile traces the step with the switch's pre-hook in it: the hook runs as Python
    # there (dynamo cannot trace it, and warned), the step is switched before it is traced
    net = _net()
    twin = copy.deepcopy(net)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    g = CudaGraphModule(torch.compile(_train_step(net, opt)), warmup=2, backend=graph_backend)
    cuda = graph_backend == "cuda"
    same = _train_step(twin, torch.optim.Adam(twin.parameters(), lr=1e-2, capturable=cuda, fused=not cuda))
    with pytest.warns(UserWarning) as record:
        torch.testing.assert_close(g(*_batch(0)), same(*_batch(0)), **LAST_BITS)
    place = "Adam at closure variable 'opt' of _train_step.<locals>.step"
    assert _ours(record) == ([_switched("CudaGraphModule(step)", place, CUDA0)] if cuda
                             else [_fused("CudaGraphModule(step)", place)])
    assert not [w for w in record if "Dynamo" in str(w.message)]  # (the hook is not traced)
    for i in range(1, STEPS):  # the compiled warmup calls, the capture and replays that step
        torch.testing.assert_close(g(*_batch(i)), same(*_batch(i)), **LAST_BITS)
    assert g.state == "captured" and g.stats.replays == STEPS - 2
    assert opt.param_groups[0]["capturable"] is cuda and opt.param_groups[0]["fused"] is not cuda
    for p, q in zip(net.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, **LAST_BITS)  # (compiled kernels against eager ones: last bits)


def test_sgd_in_a_compiled_step_steps_at_every_replay(graph_backend):
    # a compiled step's kernels (Triton, C++) are what the graph replays; the simulated graph
    # records the step's operations, as the compiled kernels compute them
    net = _net()
    twin = copy.deepcopy(net)
    g = CudaGraphModule(torch.compile(_train_step(net, torch.optim.SGD(net.parameters(), lr=1e-2, momentum=0.9))),
                        warmup=2, backend=graph_backend)
    plain = _train_step(twin, torch.optim.SGD(twin.parameters(), lr=1e-2, momentum=0.9))
    for i in range(STEPS):
        torch.testing.assert_close(g(*_batch(i)), plain(*_batch(i)), **LAST_BITS)
    assert g.state == "captured" and g.stats.replays == STEPS - 2
    for p, q in zip(net.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, **LAST_BITS)
