"""Scenarios: calls laid out in every way, so that every kind of capture is made from every kind of call.

Each step calls ``fn(x, y)`` (or ``fn(td)`` reading two keys) with distinct tensors, one tensor
passed twice, a transposed, strided, expanded or offset tensor, overlapping views of one
tensor, or the pair swapped, and holds the result or drops it. With ``outputs="safe"`` the held results make the
wrapper capture the call again (a twin, a graph returning copies, a lending capture for a
second signature), each time triggered by whatever call came then. A step returns the result;
a graphed layer also backpropagates, and the step returns the parameters' gradients. The
results' strides are not compared: a graph's results are laid out as its capture's, whatever
the call's layout (docs/limits.md), and its values are eager's up to the last bits where a
call's layout is not its capture's (a matmul rounds by layout; ``LAYOUTS``).

A graph captured from a call whose inputs share memory may refuse later calls whose inputs do
not (it copies one buffer per group): a refusal is accepted only where a program has such a
capture. Everywhere else every call must be served, whatever its layout and whatever capture
made the graph that serves it (every graph of a signature is captured from the layout of its
first).

Focus ``aliasing``; what it found before each graph was captured from its signature's layout
(#26 class 1): a twin, copying or lending capture made from ``g(x, x)`` served ``g(a, b)`` as
if ``b`` were ``a``.
"""

from hypothesis import strategies as st

from .scenarios import Scenario, register

TEMPLATE = """\
CALLS = {calls}
LAYOUTS = {layouts}  # per step: the memory layout of x and y
HOLD = {hold}


def build():
    lin = nn.Linear({n}, {n}).to(device)
    lin.requires_grad_({layer})

    def fn({params}):
        {unpack}
        return {body}

    return {{"fn": fn, "lin": lin, "held": []}}


def pair(kind, i, n):
    a = torch.arange(n * n, dtype=torch.float32, device=device).reshape(n, n) * 0.25 + i
    b = torch.arange(n * n, dtype=torch.float32, device=device).reshape(n, n).flip(0) * 0.5 - i
    if kind == "aliased":
        return a, a
    if kind == "swapped":
        return b, a
    if kind == "transposed":
        return a.t(), b
    if kind == "both_transposed":
        return a.t(), b.t()
    if kind == "strided":
        return torch.cat([a, b], 1)[:, ::2], b
    if kind == "expanded":
        return a, b[1].expand(n, n)
    if kind == "offset":
        return a, torch.cat([a.reshape(-1)[:3], b.reshape(-1)])[3:].view(n, n)
    if kind == "overlapping":
        flat = torch.arange(n * n + n, dtype=torch.float32, device=device) * 0.25 + i
        return flat[: n * n].view(n, n), flat[n:].view(n, n)
    return a, b


def tensors(out):
    return list(out) if isinstance(out, tuple) else [out]


def step(world, f, i):
    kind, n = CALLS[i]
    x, y = pair(kind, i, n)
    lin = world["lin"]
    lin.zero_grad()
    out = f({call})
    grads = None
    if {layer}:
        sum(t.sum() for t in tensors(out)).backward()
        grads = [p.grad.clone() for p in lin.parameters()]
        out = tuple(t.detach() for t in tensors(out))
    if i in HOLD:
        world["held"].append(out)
    return out, grads
"""

BODIES = [
    "x * 100 + y",
    "x * 100 + y, x.sin() - y",
    "x @ y + x",
    "torch.where(x > y, x, y) * 2",
    "(x + y).relu(), x.sum(0)",
]
LAYER_BODIES = ["lin(x) + 3 * lin(y)", "lin(x * y), lin(y) - x"]
KINDS = ["distinct", "aliased", "swapped", "transposed", "both_transposed", "strided", "expanded", "offset",
         "overlapping"]
SHARED = {"aliased", "overlapping"}  # inputs sharing memory: a graph captured so may refuse others
# the kinds whose tensors are not dense and row-major (the others are, shared or not)
LAYOUT = {"transposed": "x transposed", "both_transposed": "x and y transposed", "strided": "x strided",
          "expanded": "y expanded"}


def capturing_calls(shapes: list[int], warmup: int, max_graphs: int) -> list[int]:
    """The indices of the calls that capture a signature's first graph, by shape (neither
    aliasing nor strides are part of a signature): the call after ``warmup`` calls, then, for
    the other shape, the call after ``warmup`` more of its own."""
    if len(shapes) <= warmup:
        return []
    first = shapes[warmup]
    out = [warmup]
    pending = 0
    for i in range(warmup + 1, len(shapes)):
        if shapes[i] != first and max_graphs > 1:
            if pending == warmup:
                out.append(i)
                break
            pending += 1
    return out


@register("aliasing")
@st.composite
def aliasing_scenarios(draw) -> Scenario:
    warmup = draw(st.integers(1, 2))
    steps = draw(st.integers(warmup + 2, 9))
    max_graphs = draw(st.sampled_from([1, 2]))
    n = draw(st.integers(2, 3))
    shapes = [n] * steps
    if max_graphs > 1:
        shapes = [draw(st.sampled_from([n, n + 1])) if i > warmup else n for i in range(steps)]
    kinds = [draw(st.sampled_from(KINDS)) for _ in range(steps)]
    captures = capturing_calls(shapes, warmup, max_graphs)
    layer = draw(st.booleans())
    body = draw(st.sampled_from(LAYER_BODIES if layer else BODIES))
    td = not layer and draw(st.booleans())
    hold = {i for i in range(steps) if draw(st.booleans())}
    outputs = draw(st.sampled_from(["safe", "safe", "clone"]))
    options = (("outputs", outputs), ("max_graphs", max_graphs)) + ((("in_keys", []),) if td else ())
    src = TEMPLATE.format(
        calls=list(zip(kinds, shapes)),
        layouts=[LAYOUT.get(kind, "row-major") for kind in kinds],
        hold=hold or "()",
        n=n,
        layer=layer,
        params="td" if td else "x, y",
        unpack='x, y = td["a"], td["b"]' if td else "pass",
        body=body,
        call="TensorDict(a=x, b=y, batch_size=[n])" if td else "x, y",
    )
    refusable = any(kinds[i] in SHARED for i in captures)
    tags = {kinds[i] for i in captures} | ({"layer"} if layer else set()) | ({"td"} if td else set())
    return Scenario(src=src, steps=steps, warmup=warmup, options=options, refusable=refusable,
                    tags=frozenset(tags))
