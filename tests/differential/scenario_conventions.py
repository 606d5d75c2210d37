"""Scenarios: one TensorDict module called in both styles, in any order.

A policy (a ``TensorDictModule``, or a ``TensorDictSequential`` writing an intermediate key
and a nested one) is called with a TensorDict of batch size ``[B]`` (holding other entries,
and, in some programs, a nested TensorDict its nested out_key writes into), with keyword arguments
named after its ``in_keys``, or with a positional tensor; results may be held. Each call must
give what the plain module gives (the returned TensorDict is the caller's, with the same
entries; keyword calls return the out_keys' tensors), served by the graphs of the other
style where the wrapper has no room for another (#26, class 8): a program whose calls all have
one batch of observations is served at every step. The focus runs each program
on ``backend="eager"`` too, which must serve and refuse the same calls (``also="eager"``).
"""

from hypothesis import strategies as st

from .scenarios import Scenario, register

TEMPLATE = """\
CALLS = {calls}  # per step: style, batch
HOLD = {hold}


def build():
    from tensordict.nn import TensorDictModule, TensorDictSequential

    first = TensorDictModule(nn.Linear(3, 4), in_keys=["obs"], out_keys=["hidden"])
    if {sequential}:
        fn = TensorDictSequential(first, TensorDictModule(nn.Linear(4, 2), in_keys=["hidden"],
                                                          out_keys=[("next", "act")]))
    else:
        fn = first
    return {{"fn": fn.to(device), "held": []}}


def step(world, f, i):
    style, batch = CALLS[i]
    obs = torch.arange(batch * 3, dtype=torch.float32, device=device).reshape(batch, 3) * 0.5 - i
    with torch.no_grad():
        if style == "keywords":
            out = f(obs=obs)
        elif style == "positional":
            out = f(obs)
        else:
            td = TensorDict(obs=obs, other=torch.ones(batch, device=device), batch_size=[batch] if style == "td" else [])
            if {nested}:  # (the module's nested out_key writes into it)
                td["next"] = TensorDict(keep=torch.zeros(batch, device=device), batch_size=td.batch_size)
            out = f(td)
            assert out is td
    if i in HOLD:
        world["held"].append(out)
    return out
"""

STYLES = ["td", "td_no_batch", "keywords", "positional"]


@register("conventions")
@st.composite
def convention_scenarios(draw):
    steps = draw(st.integers(3, 9))
    batch = draw(st.integers(1, 3))
    batches = [batch, batch + 1] if draw(st.booleans()) else [batch]
    calls = [(draw(st.sampled_from(STYLES)), draw(st.sampled_from(batches))) for _ in range(steps)]
    options = (("max_graphs", draw(st.integers(1, 2))), ("outputs", draw(st.sampled_from(["safe", "clone"]))))
    src = TEMPLATE.format(
        calls=calls,
        sequential=(sequential := draw(st.booleans())),
        nested=sequential and draw(st.booleans()),
        hold=set(draw(st.lists(st.integers(0, steps - 1), max_size=steps))) or "()",
    )
    # one batch of observations: one signature, whatever the styles, so every call is served
    refusable = len({b for _, b in calls}) > 1
    return Scenario(src=src, steps=steps, warmup=draw(st.integers(1, 2)), options=options, also="eager",
                    refusable=refusable, tags=frozenset(style for style, _ in calls))
