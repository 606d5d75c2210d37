"""Scenarios: whole train steps inside the wrapped function, with everything a step leaves behind observed.

The function runs forward, loss, backward, maybe gradient clipping, and an optimizer step
(SGD with momentum or Nesterov, Adam, AdamW, RMSprop; capturable where CUDA needs it, Adam and
AdamW fused on a CPU, where torch refuses capturable: both keep their step counts in tensors; float
or tensor learning rates). ``optimizer.zero_grad()`` runs inside the function, outside it
between calls, or after the step, with ``set_to_none`` True (torch's default) or False.
Results are held or dropped (held ones make ``outputs="safe"`` capture twins), and a second
batch size may get a graph of its own. After every step the parameters, every ``p.grad`` and
every ``.grad`` tensor read after earlier steps (kept in a list) are compared with the plain
step's: values, and which objects are the same (eagerly ``set_to_none`` binds a new tensor
at every backward).

A step may also store its loss on the module (``net.last_loss = loss.detach()``), observed after
every step. (A step that runs its optimizer before ``zero_grad()`` reads the ``.grad`` bound
before the call and is refused at capture, after the capturing call ran: see
``tests/test_train_step.py``.)

Focus ``trainstep`` (#26 class 2).
"""

from hypothesis import strategies as st

from .scenarios import Scenario, register

TEMPLATE = """\
BATCH = {batch}
HOLD = {hold}
CUDA = device == "cuda"


def build():
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).to(device)
    opt = {opt}

    def fn(x, y):
        {zero_inside}
        loss = (net(x) - y).pow(2).mean()
        loss.backward()
        {clip}
        opt.step()
        {after}
        return {ret}

    return {{"fn": fn, "net": net, "opt": opt, "held": [], "grads": [], "logged": []}}


def step(world, f, i):
    n = BATCH[i]
    x = (torch.arange(n * 4, dtype=torch.float32, device=device).reshape(n, 4) * 0.3 + 0.7 * i).sin()
    y = (torch.arange(n * 2, dtype=torch.float32, device=device).reshape(n, 2) * 0.2 - 0.3 * i).cos()
    {zero_outside}
    out = f(x, y)
    if i in HOLD:
        world["held"].append(out)
    world["grads"].append([p.grad for p in world["net"].parameters()])
    if {attribute}:
        world["logged"].append(world["net"].last_loss)
    return out


def observe(world):
    net = world["net"]
    return [p.detach().clone() for p in net.parameters()], world["grads"], world["logged"]
"""

OPTIMIZERS = {
    "sgd": "torch.optim.SGD(net.parameters(), lr=0.05)",
    "sgd_momentum": "torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)",
    "sgd_nesterov": "torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)",
    "adam": "torch.optim.Adam(net.parameters(), lr=0.01, capturable=CUDA, fused=not CUDA)",
    "adam_tensor_lr": "torch.optim.Adam(net.parameters(), lr=torch.tensor(0.01, device=device), capturable=CUDA, fused=not CUDA, foreach=False)",
    "adamw": "torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.1, capturable=CUDA, fused=not CUDA)",
    "rmsprop": "torch.optim.RMSprop(net.parameters(), lr=0.01, momentum=0.5, capturable=CUDA)",
}
ZERO = {  # where zero_grad runs: (inside the function before the forward, outside it, after the step)
    "inside": ("opt.zero_grad(set_to_none={none})", "pass", "pass"),
    "outside": ("pass", "world['opt'].zero_grad(set_to_none={none})", "pass"),
    "after": ("pass", "pass", "opt.zero_grad(set_to_none={none})"),
    "never": ("pass", "pass", "pass"),
}
CLIPS = {"none": "pass", "norm": "torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)",
         "value": "torch.nn.utils.clip_grad_value_(net.parameters(), 0.05)"}
RETURNS = ["loss.detach()", "(loss.detach(), net(x).detach())", "None"]
ATTRIBUTE = "net.last_loss = loss.detach()"


@register("trainstep")
@st.composite
def trainstep_scenarios(draw):
    warmup = draw(st.integers(1, 3))
    steps = draw(st.integers(warmup + 2, 9))
    max_graphs = draw(st.sampled_from([1, 1, 2]))
    batch = [draw(st.sampled_from([3, 5])) if max_graphs > 1 and i > warmup else 3 for i in range(steps)]
    zero = draw(st.sampled_from(sorted(ZERO)))
    none = draw(st.booleans())
    inside, outside, after = (part.format(none=none) for part in ZERO[zero])
    attribute = draw(st.booleans())
    if attribute:
        after = f"{after}; {ATTRIBUTE}"
    src = TEMPLATE.format(
        batch=batch,
        hold={i for i in range(steps) if draw(st.booleans())} or "()",
        opt=OPTIMIZERS[draw(st.sampled_from(sorted(OPTIMIZERS)))],
        zero_inside=inside,
        zero_outside=outside,
        clip=CLIPS[draw(st.sampled_from(sorted(CLIPS)))],
        after=after,
        ret=draw(st.sampled_from(RETURNS)),
        attribute=attribute,
    )
    options = (("outputs", draw(st.sampled_from(["safe", "safe", "clone"]))), ("max_graphs", max_graphs))
    return Scenario(src=src, steps=steps, warmup=warmup, options=options, refusable=False,
                    tags=frozenset({zero, f"set_to_none={none}"} | ({"attribute"} if attribute else set())))
