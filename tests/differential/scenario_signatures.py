"""Scenarios: calls of several signatures, served by graphs and, the same way, without CUDA.

A policy is called with batches of two sizes and two memory layouts (row-major, or a
column-major copy of the same values), with grad on or off, in train or eval mode; its weight
may be replaced by an equal one between steps (stale for a graph), and results may be held.
The wrapper keeps up to ``max_graphs`` graphs, raises or evicts at the limit, and raises or
captures again when stale. The plain function is the oracle of every value; the focus runs
each program a third time with ``backend="eager"`` (the fallback without CUDA), which must
serve and refuse the same steps, with the same counters (``also="eager"``, see
``scenarios.run_scenario``).
"""

from hypothesis import strategies as st

from .scenarios import Scenario, register

TEMPLATE = """\
CALLS = {calls}  # per step: batch, grad enabled, train mode, layout
LAYOUTS = [call[3] for call in CALLS]  # (a matmul rounds by layout: see scenarios.py)
REPLACE_AT = {replace_at}
HOLD = {hold}


def build():
    lin = nn.Linear({n}, {n}).to(device)
    lin.requires_grad_({params_grad})
    net = nn.Sequential(lin, nn.Dropout(0.0))

    def fn(x):
        return net(x).relu() * 2

    return {{"fn": fn, "net": net, "held": []}}


def step(world, f, i):
    batch, grad, train, layout = CALLS[i]
    net = world["net"]
    net.train(train)
    if i in REPLACE_AT:  # the same values in another tensor: a graph reads the old one
        net[0].weight = nn.Parameter(net[0].weight.detach().clone(), requires_grad={params_grad})
    x = torch.arange(batch * {n}, dtype=torch.float32, device=device).reshape(batch, {n}) * 0.25 - i
    if layout == "column_major":
        x = x.t().contiguous().t()
    with torch.set_grad_enabled(grad):
        out = f(x)
    if i in HOLD:
        world["held"].append(out)
    return out
"""


@register("signatures")
@st.composite
def signature_scenarios(draw):
    n = draw(st.integers(2, 3))
    steps = draw(st.integers(3, 10))
    calls = [(draw(st.sampled_from([2, 3])), draw(st.booleans()), draw(st.booleans()),
              draw(st.sampled_from(["row_major", "column_major"]))) for _ in range(steps)]
    options = (("max_graphs", draw(st.integers(1, 3))),
               ("on_graph_limit", draw(st.sampled_from(["raise", "evict"]))),
               ("on_stale", draw(st.sampled_from(["raise", "recapture"]))),
               ("outputs", draw(st.sampled_from(["safe", "clone"]))))
    src = TEMPLATE.format(
        calls=calls,
        n=n,
        params_grad=draw(st.booleans()),
        replace_at=set(draw(st.lists(st.integers(1, steps - 1), max_size=2))) or "()",
        hold=set(draw(st.lists(st.integers(0, steps - 1), max_size=steps))) or "()",
    )
    return Scenario(src=src, steps=steps, warmup=draw(st.integers(1, 2)), options=options, also="eager",
                    tags=frozenset({dict(options)["on_graph_limit"], dict(options)["on_stale"]}))
