"""Scenarios: modes entered and left between calls (grad mode, no_grad, autocast).

Each step calls the wrapper under a mode drawn for it: grad enabled or ``torch.no_grad()``,
with or without ``torch.autocast`` (its cast cache on or off), with the input made inside
the mode or before it. Results may be held across mode changes. The wrapper must give the
plain results, or refuse a mode it has no graph for (``max_graphs``) or cannot replay
(autocast's cast cache) before any effect.
"""

from hypothesis import strategies as st

from .scenarios import Scenario, register

TEMPLATE = """\
import contextlib

MODES = {modes!r}


def build():
    net = nn.Sequential(nn.Linear({n}, {n}), nn.{act}()).to(device)

    def fn(x):
        {body}

    return {{"fn": fn, "net": net, "held": []}}


def enter(stack, grad, cast):
    stack.enter_context({{"grad": torch.enable_grad, "no_grad": torch.no_grad,
                         "inference": torch.inference_mode}}[grad]())
    if cast is not None:
        low = torch.bfloat16 if device == "cpu" else torch.float16
        stack.enter_context(torch.autocast(device, dtype=low, cache_enabled=cast == "cache"))


def step(world, f, i):
    grad, cast, inside = MODES[i]
    with contextlib.ExitStack() as stack:
        if not inside:
            x = torch.full(({batch}, {n}), 0.25 * i - 0.5, device=device)
        enter(stack, grad, cast)
        if inside:
            x = torch.full(({batch}, {n}), 0.25 * i - 0.5, device=device)
        out = f(x)
    if {hold}:
        world["held"].append(out)
    return out
"""

BODIES = {
    "net": "return net(x)",
    "two outputs": "h = net(x)\n        return h, (h * x).sum(-1)",
    "writes its input": "x.mul_(2)\n        return net(x)",
}

GRADS = ("grad", "no_grad")
CASTS = (None, "no cache", "cache")


def modes_strategy(grads: tuple) -> st.SearchStrategy:
    """Per step ``(grad, autocast, input made inside the mode)``: a few distinct modes, revisited."""
    mode = st.tuples(st.sampled_from(grads), st.sampled_from(CASTS), st.booleans())
    return st.lists(mode, min_size=1, max_size=3).flatmap(
        lambda distinct: st.lists(st.sampled_from(distinct), min_size=3, max_size=8))


def mode_scenarios(draw, grads: tuple) -> Scenario:
    modes = draw(modes_strategy(grads))
    body = draw(st.sampled_from(sorted(BODIES)))
    distinct = {(grad, cast) for grad, cast, _ in modes}
    max_graphs = draw(st.integers(1, 3))
    limit = draw(st.sampled_from(["raise", "evict"]))
    src = TEMPLATE.format(
        modes=modes,
        n=draw(st.integers(1, 3)),
        batch=draw(st.integers(1, 2)),
        act=draw(st.sampled_from(["ReLU", "Tanh", "Identity"])),
        body=BODIES[body],
        hold=draw(st.booleans()),
    )
    options = (("outputs", draw(st.sampled_from(["safe", "clone"]))), ("max_graphs", max_graphs),
               ("on_graph_limit", limit))
    # served unless a mode has no room for its graph, or autocast's cache is on
    refusable = any(cast == "cache" for _, cast in distinct) or (len(distinct) > max_graphs and limit == "raise")
    tags = {f"{grad}+{cast}" for grad, cast in distinct} | {body}
    return Scenario(src=src, steps=len(modes), warmup=draw(st.integers(1, 2)), options=options,
                    refusable=refusable, tags=frozenset(tags))


@register("modes")
@st.composite
def modes_scenarios(draw):
    return mode_scenarios(draw, GRADS)
