"""Scenarios: modes entered and left between calls (grad mode, no_grad, inference_mode, autocast).

Each step calls the wrapper under a mode drawn for it: grad enabled, ``torch.no_grad()`` or
``torch.inference_mode()``, with or without ``torch.autocast`` (its cast cache on or off),
with the input made inside the mode, before it, or before it under inference mode (an
inference tensor). Results may be held across mode changes. The wrapper must give the
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


def make(i):
    return torch.full(({batch}, {n}), 0.25 * i - 0.5, device=device)


def step(world, f, i):
    grad, cast, made = MODES[i]
    if made == "under inference_mode":
        with torch.inference_mode():
            x = make(i)
    elif made == "before":
        x = make(i)
    with contextlib.ExitStack() as stack:
        enter(stack, grad, cast)
        if made == "inside":
            x = make(i)
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

GRADS = ("grad", "no_grad", "inference")
CASTS = (None, "no cache", "cache")
MADE = ("inside", "before", "under inference_mode")


def modes_strategy(grads: tuple) -> st.SearchStrategy:
    """Per step ``(grad, autocast, where the input is made)``: a few distinct modes, revisited."""
    mode = st.tuples(st.sampled_from(grads), st.sampled_from(CASTS), st.sampled_from(MADE))
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
    # served unless a mode has no room for its graph, autocast's cache is on, or an inference
    # tensor is written or saved for backward outside inference mode (refused where it may be)
    refusable = (any(cast == "cache" for _, cast in distinct) or (len(distinct) > max_graphs and limit == "raise")
                 or any(grad != "inference" and made == "under inference_mode" for grad, _, made in modes))
    tags = {f"{grad}+{cast}" for grad, cast in distinct} | {body}
    return Scenario(src=src, steps=len(modes), warmup=draw(st.integers(1, 2)), options=options,
                    refusable=refusable, tags=frozenset(tags))


@register("modes")
@st.composite
def modes_scenarios(draw):
    return mode_scenarios(draw, GRADS)
