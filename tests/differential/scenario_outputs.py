"""Scenarios: every kind of result, and what callers do with results between calls.

A step calls ``fn(x)`` (a float input, or a complex one for conjugate views), optionally under
``torch.no_grad()``, and gets one of: a fresh tensor, the input or a view of it, two views of
one result, a parameter, a view of a parameter or of a buffer, a result carrying a lazy
conjugate or negative bit, an ``nn.Parameter`` or a tensor subclass made in the function.
Then the caller holds the result, keeps only its storage, or changes it in place
(``t_()``, ``unsqueeze_()``, ``requires_grad_()``). A step returns, per tensor, the tensor
(its lazy bits resolved), its type, its bits and its strides; the held results and the bytes
of the kept storages are observed.

Focus ``outputs`` draws them all (#26 classes 6 and 7: views of parameters and buffers are new
objects at each call, lazy bits and result types are kept, a kept storage keeps its bytes).
"""

from hypothesis import strategies as st

from .scenarios import Scenario, register

TEMPLATE = """\
ACTIONS = {actions}
GRAD = {grad}


class Tagged(torch.Tensor):
    pass


def build():
    net = nn.Linear(3, 2).to(device)
    net.register_buffer("table", torch.arange(6.0, device=device).reshape(2, 3))

    def fn(x):
        return {body}

    return {{"fn": fn, "net": net, "held": [], "storages": []}}


def tensors(out):
    return list(out) if isinstance(out, tuple) else [out]


def show(t):
    return t.resolve_conj().resolve_neg(), type(t).__name__, t.is_conj(), t.is_neg(), t.stride()


def step(world, f, i):
    x = (torch.arange(6.0, device=device).reshape(2, 3) * 0.5 + i){complex}
    with torch.set_grad_enabled(GRAD):
        out = f(x)
    first = tensors(out)[0]
    shown = [show(t) for t in tensors(out)]
    action = ACTIONS[i]
    with torch.no_grad():
        if action == "hold":
            world["held"].append(out)
        elif action == "storage":
            world["storages"].append((first.untyped_storage(), first.dtype, first.storage_offset(),
                                      first.shape, first.stride()))
            shown = [(s[1],) + s[2:] for s in shown]  # (the result itself goes)
        elif action == "t_":
            first.t_()
        elif action == "unsqueeze_":
            first.unsqueeze_(0)
        elif action == "requires_grad_" and first.is_leaf and not first.requires_grad:
            first.requires_grad_()
    return shown


def observe(world):
    kept = [torch.empty(0, dtype=d, device=device).set_(s, o, shape, stride)
            for s, d, o, shape, stride in world["storages"]]
    return [[show(t) for t in tensors(out)] for out in world["held"]], [t.clone() for t in kept]
"""

KINDS = {
    "fresh": "x * 2 + 1",
    "input": "x",
    "input_view": "x[1:]",
    "two_views": "(x * 3, (x * 3)[1:])",
    "views_of_one_result": "x.exp(), x.exp().t()",
    "parameter": "net.weight, x + 1",
    "parameter_view": "net.weight.t(), x * 2",
    "buffer_view": "net.table[1:], x * 2",
    "conj_of_input": "x.conj()",
    "conj_of_result": "(x * 2).conj()",
    "neg_view": "torch._neg_view(x * 2)",
    "new_parameter": "nn.Parameter(x * 2)",
    "subclass": "(x * 2).as_subclass(Tagged)",
    "subclass_view_of_input": "x.as_subclass(Tagged)",
}
ACTIONS = ["none", "hold", "storage", "t_", "unsqueeze_", "requires_grad_"]


@register("outputs")
@st.composite
def output_scenarios(draw):
    kind = draw(st.sampled_from(sorted(KINDS)))
    steps = draw(st.integers(3, 8))
    src = TEMPLATE.format(
        actions=[draw(st.sampled_from(ACTIONS)) for _ in range(steps)],
        grad=draw(st.booleans()),
        body=KINDS[kind],
        complex=".to(torch.complex64) * (1 - 2j)" if kind.startswith("conj") else "",
    )
    options = (("outputs", draw(st.sampled_from(["safe", "safe", "clone"]))),)
    return Scenario(src=src, steps=steps, warmup=draw(st.integers(1, 2)), options=options,
                    tags=frozenset({kind}))
