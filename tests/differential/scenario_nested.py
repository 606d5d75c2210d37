"""Scenarios: a wrapper called inside another wrapper's function, and on its own.

A policy is called a few times inside a rollout; the rollout is the wrapped function. In the
wrapped world the policy is itself a ``CudaGraphModule`` (its own ``max_graphs`` and
``on_graph_limit``), so it runs inline while the rollout captures, and on its own (graphs
of its own, evicted or not) when the program calls it directly at other batch sizes between
rollouts; the program may also update the policy's weights in place. In the plain world the
policy is the plain module. The results must be the plain ones, or a refusal before any
effect where the policy has no room for another batch size.
"""

from hypothesis import strategies as st

from .scenarios import Scenario, register

TEMPLATE = """\
DIRECT = {direct!r}
UPDATES = {updates!r}


def build():
    net = nn.Sequential(nn.Linear({n}, {n}), nn.Tanh()).to(device)
    box = {{"policy": net}}

    def rollout(obs):
        for _ in range({calls}):
            obs = obs * 0.5 + box["policy"](obs)
        return obs

    return {{"fn": rollout, "net": net, "box": box, "held": []}}


def step(world, f, i):
    if i == 0 and isinstance(f, CudaGraphModule):  # the wrapped world's policy is graphed too
        world["box"]["policy"] = CudaGraphModule(world["net"], warmup={inner_warmup}, backend=f.options.backend,
                                                 {inner_options})
    policy = world["box"]["policy"]
    with torch.no_grad():
        out = f(torch.full(({batch}, {n}), 0.1 * i, device=device))
        direct = [policy(torch.full((b, {n}), -0.1 * i, device=device)) for b in DIRECT.get(i, ())]
        if i in UPDATES:
            world["net"][0].weight.mul_(0.9)
    if {hold}:
        world["held"].append(out)
    return out, direct
"""


@register("nested")
@st.composite
def nested_scenarios(draw):
    steps = draw(st.integers(3, 7))
    batch = draw(st.integers(1, 4))
    sizes = st.lists(st.integers(1, 4), min_size=1, max_size=2)
    direct = draw(st.dictionaries(st.integers(0, steps - 1), sizes, max_size=steps))
    max_graphs = draw(st.integers(1, 3))
    limit = draw(st.sampled_from(["raise", "evict"]))
    inner = {"max_graphs": max_graphs, "on_graph_limit": limit, "outputs": draw(st.sampled_from(["safe", "clone"]))}
    src = TEMPLATE.format(
        direct=direct,
        updates=set(draw(st.lists(st.integers(0, steps - 1), max_size=2))) or "()",
        n=draw(st.integers(1, 3)),
        calls=draw(st.integers(1, 3)),
        batch=batch,
        inner_warmup=draw(st.integers(1, 2)),
        inner_options=", ".join(f"{k}={v!r}" for k, v in inner.items()),
        hold=draw(st.booleans()),
    )
    # the policy sees the rollout's batch size (in its warmup calls) and each direct one
    distinct = {batch} | {b for bs in direct.values() for b in bs}
    options = (("outputs", draw(st.sampled_from(["safe", "clone"]))),)
    return Scenario(src=src, steps=steps, warmup=draw(st.integers(1, 2)), options=options,
                    refusable=len(distinct) > max_graphs and limit == "raise",
                    tags=frozenset({f"inner max_graphs={max_graphs}", limit}))
