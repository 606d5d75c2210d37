"""Scenarios: Python state the graph reads, changed between calls; results held across calls.

A policy reads a module attribute and an optimizer's float learning rate; between steps the
program may change either, may hold every result (a rollout kept whole) or drop them. The
wrapper must give the plain results, or refuse (``on_stale="raise"``) before any effect.
"""

from hypothesis import strategies as st

from .scenarios import Scenario, register

TEMPLATE = """\
def build():
    net = nn.Linear({n}, {n}).to(device)
    net.scale = 1.5
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def fn(x):
        y = net(x) * net.scale + opt.param_groups[0]["lr"]
        return y.relu() if {relu} else y

    return {{"fn": fn, "net": net, "opt": opt, "held": []}}


def step(world, f, i):
    x = torch.full(({batch}, {n}), 0.25 * i, device=device)
    out = f(x)
    if {hold}:
        world["held"].append(out)
    if i in {change_at}:
        {change}
    return out
"""

CHANGES = {
    "none": "pass",
    "attribute": "world['net'].scale = 0.5 + i",
    "lr": "world['opt'].param_groups[0]['lr'] = 0.01 * (i + 1)",
}


@register("state")
@st.composite
def state_scenarios(draw):
    change = draw(st.sampled_from(sorted(CHANGES)))
    steps = draw(st.integers(3, 7))
    src = TEMPLATE.format(
        n=draw(st.integers(1, 4)),
        batch=draw(st.integers(1, 3)),
        relu=draw(st.booleans()),
        hold=draw(st.booleans()),
        change_at=set(draw(st.lists(st.integers(0, steps - 1), max_size=2))) or "()",
        change=CHANGES[change],
    )
    options = (("outputs", draw(st.sampled_from(["safe", "clone"]))),
               ("on_stale", draw(st.sampled_from(["raise", "recapture"]))))
    return Scenario(src=src, steps=steps, warmup=draw(st.integers(1, 2)), options=options,
                    refusable=dict(options)["on_stale"] == "raise", tags=frozenset({change}))
