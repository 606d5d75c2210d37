"""Graphs as layers: gradients through a captured graph.

A call captured with grad enabled whose outputs track gradients (its inputs require grad,
or parameters it reads do) is captured as a *layer*: the forward graph, then a backward
graph (``torch.autograd.grad`` of the outputs, from static grad-output buffers, captured as
``torch.cuda.make_graphed_callables`` does), and every call's outputs are attached to one
autograd node::

    your tensors ─copy─► forward graph ─► outputs ─► eager code ─► loss
        ▲                 (its activations stay in the graph's memory)       │ loss.backward()
        └─ grads ◄─ backward graph ◄─copy─ _GraphedLayer.backward ◄──────────┘

The node's inputs are the caller's tensors that require grad and the leaves the graph
reads that require grad (parameters): autograd accumulates the gradients it returns into
``.grad`` as eagerly (the buffers are returned as themselves, which autograd never keeps:
it copies them into ``.grad`` or adds them there).

Which kind a capture is, is decided at capture from what the function did (``_gradtrace``): a
function that ran backward itself (a train step: it changed a ``.grad``, or its outputs' graph was
freed) is one graph whose outputs refuse backward, and its inputs may not require grad.

What the node refuses, with an error instead of wrong gradients:

- a backward after a later call replayed the forward graph (one set of activations per
  graph: a pending backward is not kept apart, it is refused when it runs);
- a backward after the graph was released (``reset()``, an eviction, a re-capture);
- double backward (``create_graph=True``);
- a second backward without ``retain_graph=True``, or after a result of the graph's own
  memory (``outputs="static"``/``"safe"``) or a parameter was written in place (autograd's
  own errors, as eagerly);
- module backward hooks (they run Python, which a replay does not), at capture or added
  since; a parameter's own hooks (``p.register_hook``) run eagerly at every backward.

Memory: a forward's activations must stay as it left them until its backward. A call whose
warmup result tracked gradients is captured where no other graph writes (as lent outputs
are, see ``_runner_cuda``); the backward graph, whose results are consumed within the backward
pass, goes in the shared pool. It is run once eagerly on the captured forward's activations
before its capture (no second forward), so that what it uses initialises outside the capture.

Streams: a layer's graphs are captured on the runner's side stream, and so are the
parameters' AccumulateGrad nodes the captured autograd graph keeps (each parameter has one
while any graph holds it). Each call's node is made on that stream too, so that autograd runs
its backward there and hands the gradients to those nodes on their own stream; autograd
orders the streams (your gradients in, the inputs' gradients out, and your stream waits for
the backward's end).

With ``backend="simulate"`` the backward graph is the backward's recorded aten operations
(``_simulate``), replayed on the forward's activations as a GPU replays its kernels.
"""

from __future__ import annotations

import contextlib
from operator import attrgetter, getitem
from typing import Any, Iterator

import torch
from torch import nn
from torch.nn.modules import module as _nn_module

from ._errors import GraphStateError, Mismatch, MismatchKind, RequiresGradError, UnsupportedError
from ._gradtrace import Marks, _freed, _untrack, _walk
from ._inputs import StaticInputs
from ._policy import CapturePlan

__all__ = ["Layer", "capture_layer"]

Tensor = torch.Tensor
_requires_grad = attrgetter("requires_grad")

_STEP_ADVICE = (
    "the function runs backward itself (a train step), and a replay cannot extend that backward "
    "to the tensors you pass: pass x.detach() (the step's gradients stop at its inputs), or "
    "compute the loss outside the wrapped function (the wrapped block then backpropagates as a layer)."
)


@contextlib.contextmanager
def _hooks_hidden(tensors: list[Tensor]) -> Iterator[None]:
    """Tensor hooks of the leaves the backward is taken for do not run inside it: they run
    eagerly at every backward, when autograd hands them the gradient the node returns (run
    inside too, they would apply twice). A leaf's hooks live in its ``_backward_hooks`` dict,
    which autograd reads at each backward: emptied for the capture, then restored."""
    saved = []
    for t in tensors:
        hooks = getattr(t, "_backward_hooks", None)
        if hooks:
            saved.append((hooks, dict(hooks)))
            hooks.clear()
    try:
        yield
    finally:
        for hooks, items in saved:
            hooks.update(items)


def _module_hooks(modules: list[tuple[nn.Module, str]]) -> list[Mismatch]:
    found = []
    for m, where in modules:
        count = len(m._backward_hooks) + len(m._backward_pre_hooks)
        if count:
            found.append(Mismatch(where, MismatchKind.HOOK, "none", f"{count} module backward hook{'s' * (count > 1)}"))
    count = len(_nn_module._global_backward_hooks) + len(_nn_module._global_backward_pre_hooks)
    if count:
        found.append(Mismatch("torch.nn.modules.module (global)", MismatchKind.HOOK, "none",
                              f"{count} global module backward hook{'s' * (count > 1)}"))
    return found


def _places(params: list[Tensor], modules: list[tuple[nn.Module, str]]) -> tuple[list, list, list[str]]:
    """Where each leaf is read from (a module's ``_parameters`` entry, so that a parameter
    replaced by another over the same memory, which the graph still reads, gets the
    gradient), and its name for messages; leaves not found in a module are held as they are."""
    where: dict[int, tuple[Any, Any, str]] = {}
    for m, label in modules:
        for name, p in m._parameters.items():
            if p is not None:
                where.setdefault(id(p), (m._parameters, name, f"{label}.{name}"))
    containers, keys, labels = [], [], []
    for p in params:
        container, key, label = where.get(id(p), ([p], 0, f"a tensor of shape {tuple(p.shape)} the function reads"))
        containers.append(container)
        keys.append(key)
        labels.append(label)
    return containers, keys, labels


def capture_layer(
    *,
    owner: str,
    runner: Any,
    watch: Any,
    inputs: StaticInputs,
    tracked: list[int],
    marks: Marks | None,
    sources: list[Tensor],
    requires_grad: list[bool],
    texts: list[str],
    outputs: CapturePlan,
) -> Layer | None:
    """After the forward capture: the layer (its backward captured), or ``None`` where the
    call is not one (grad disabled, nothing tracks gradients, or a train step)."""
    if marks is None:  # grad disabled
        return None
    out_index = [j for j, rg in enumerate(requires_grad) if rg]
    outs = [sources[j] for j in out_index]
    nodes, leaves, outside = _walk(outs, marks.start)
    if marks.trained() or _freed(nodes):
        if tracked:
            raise RequiresGradError(owner, [Mismatch(texts[i], MismatchKind.REQUIRES_GRAD, "False", "True") for i in tracked],
                                    "captured as a train step (the function runs backward itself)",
                                    advice=_STEP_ADVICE)
        return None  # a train step: its outputs refuse backward (see _outputs)
    buffers = {id(inputs.leaves[i]) for i in tracked}
    order = {id(p): n for n, (m, _) in enumerate(watch.modules) for p in m._parameters.values() if p is not None}
    params = sorted((t for t in leaves if id(t) not in buffers), key=lambda t: order.get(id(t), len(order)))
    if outside:
        raise UnsupportedError(
            owner,
            "the function reads a tensor that requires grad and was computed before the call, without "
            "receiving it as an argument: gradients would have to flow through an earlier call's autograd graph.",
            "pass that tensor as an argument (gradients then reach it), or .detach() it.",
        )
    if not out_index or not (tracked or params):
        _untrack(inputs, tracked)
        return None
    modules = list(watch.modules)
    hooks = _module_hooks(modules)
    if hooks:
        raise UnsupportedError(owner, f"{hooks[0].path} has {hooks[0].got}, which a replay would not run "
                               "(a replay runs no Python).", _HOOK_ADVICE)
    frontier = [inputs.leaves[i] for i in tracked] + params
    position = {id(t): k for k, t in enumerate(frontier)}
    # which inputs and parameters each output reaches: a backward from outputs that reach
    # none of an input's paths leaves its .grad as eagerly (None, not zeros)
    reach = [frozenset(position[id(t)] for t in _walk([o], marks.start)[1] if id(t) in position) for o in outs]
    return Layer(owner=owner, runner=runner, inputs=inputs, tracked=tracked, params=params, out_index=out_index,
                 outs=outs, reach=reach, modules=modules, watch=watch, texts=texts, outputs=outputs)


_DONATED = (
    "a torch.compile'd module in it frees the activations its backward saved (AOTAutograd's donated "
    "buffers), and a layer's backward graph is captured from a backward that keeps them (retain_graph=True)."
)
_DONATED_ADVICE = (
    "set torch._functorch.config.donated_buffer = False before the compiled module first runs (its "
    "backward then keeps its buffers), or wrap the compiled module's whole train step instead of the module."
)

_HOOK_ADVICE = (
    "register the hook on a module outside the wrapped block, or hook the parameters' gradients "
    "(p.register_hook), which run eagerly at every backward."
)


class Layer:
    """A captured backward graph, and how a call's outputs are attached to it."""

    def __init__(self, *, owner, runner, inputs, tracked, params, out_index, outs, reach, modules, watch, texts,
                 outputs: CapturePlan):
        self.owner, self.runner, self.inputs = owner, runner, inputs
        self.reach = reach if len(set(reach)) > 1 else None  # None: every output reaches the same
        self.tracked, self.out_index, self.modules = tracked, out_index, modules
        self.texts = [texts[i] for i in tracked]
        self._containers, self._keys, self.labels = _places(params, modules)
        # leaves the graph reads that did not require grad: one that does now would get none
        frozen = [t for t in watch.externals.values() if t.is_leaf and not t.requires_grad
                  and t.dtype.is_floating_point and id(t) not in {id(p) for p in params}]
        self._frozen = [(c, k, label) for c, k, label in zip(*_places(frozen, modules)) if not isinstance(c, list)]
        self._frozen_places = [c for c, _, _ in self._frozen], [k for _, k, _ in self._frozen]
        # the hook dicts of every module the graph reaches, and the global ones (registering a
        # hook adds to them): a hook added since the capture would not run in a replay
        self._hooks = [d for m, _ in modules for d in (m._backward_hooks, m._backward_pre_hooks)]
        self._hooks += [_nn_module._global_backward_hooks, _nn_module._global_backward_pre_hooks]
        # gradients handed on to your code are copies, as results are (outputs="static": the buffers)
        self.clone_grads = outputs.clone
        # results that are the graph's memory (static, lent) are saved: a write into one before
        # the backward, which may read it, is autograd's in-place error
        self.save_outputs = outputs.lend or not outputs.clone
        self.generation = 0  # forward replays so far: a backward needs its own call's activations
        self.anchor = torch.empty(0, device="cpu")
        self.keep = outs  # the captured autograd graph: its saved activations stay allocated
        self.grad_out = [torch.zeros_like(o, memory_format=torch.contiguous_format) for o in outs]
        frontier = self._frontier()
        # the backward once eagerly first, on the forward's activations (no second forward):
        # libraries it uses initialise themselves outside the capture
        try:
            runner.run_eager(lambda: self._grad(outs, frontier))
        except RuntimeError as err:
            if "donated buffer" not in str(err):
                raise
            raise UnsupportedError(owner, _DONATED, _DONATED_ADVICE) from None
        # (in the shared pool: only the forward's activations must outlive a replay, until this
        # backward; the gradients it returns are consumed within the backward pass)
        captured = runner.capture(lambda: self._grad(outs, frontier), owner)
        self.handle, self.grad_in = captured.handle, list(captured.out)
        self.capture_bytes, self.capture_seconds = captured.bytes, captured.seconds  # (the entry's, with its forward's)

    def _frontier(self) -> list[Tensor]:
        return [self.inputs.leaves[i] for i in self.tracked] + self.params()

    def params(self) -> list[Tensor]:
        return list(map(getitem, self._containers, self._keys))

    def _grad(self, outs: list[Tensor], frontier: list[Tensor]) -> tuple:
        with _hooks_hidden(frontier):
            return torch.autograd.grad(outs, frontier, grad_outputs=self.grad_out, retain_graph=True,
                                       allow_unused=True)

    # -- calls -------------------------------------------------------------------------
    def ok(self) -> bool:
        """Whether a call finds what :meth:`mismatches` checks unchanged (every call: C-level passes).

        A parameter frozen since the capture needs no check: autograd drops the gradient the
        backward graph still computes for it, as eagerly it computes none."""
        if any(self._hooks):
            return False
        return not self._frozen or not any(map(_requires_grad, map(getitem, *self._frozen_places)))

    def mismatches(self) -> list[Mismatch]:
        """What a call may not change since the capture: a parameter the backward graph gives no
        gradient (it did not require grad) that requires grad now; module backward hooks."""
        found = [Mismatch(label, MismatchKind.REQUIRES_GRAD, "False", "True")
                 for c, k, label in self._frozen if getitem(c, k).requires_grad]
        return found + _module_hooks(self.modules)

    def values(self, plan: Any, leaves: Any) -> list[Any]:
        """This call's outputs (``plan.values``), those that track gradients attached to the node."""
        self.generation += 1
        box: list[Any] = []
        edges = [leaves[i] for i in self.tracked] + self.params()
        values = plan.values()  # (on your stream, after the replay)
        # The node is made on the capture's stream, where the parameters' AccumulateGrad
        # nodes were made (the forward capture made them; the autograd graph it keeps,
        # keeps them): autograd runs its backward there, and hands the gradients it
        # returns to those nodes on their own stream. Made on yours, each backward warned
        # of a stream mismatch (and synchronised the two streams). It launches nothing.
        outs = self.runner.on_capture_stream(_GraphedLayer.apply, self, plan, values, box, *edges)
        for j, t in zip(self.out_index, outs):
            box[j] = t
        return box

    def backward(self, generation: int, grads: tuple) -> list[Any]:
        if self.handle is None:
            raise GraphStateError(
                f"{self.owner} cannot backpropagate through this result: expected the graph that produced "
                "it, got none (it was released by reset(), an eviction or a re-capture) at the graph's "
                "outputs; call backward before the graph goes."
            )
        if generation != self.generation:
            raise GraphStateError(
                f"{self.owner} cannot backpropagate through the result of an earlier call: expected that "
                f"call's activations (replay {generation} of the graph), got those of a later call (replay "
                f"{self.generation}, which overwrote them) at the graph's saved activations; call backward "
                "before calling the wrapper again, or use one CudaGraphModule per use of the block in a step."
            )
        grad_out = self.grad_out
        if len(grad_out) == 1:
            grad_out[0].copy_(grads[0])
        elif all(g is not None for g in grads):
            torch._foreach_copy_(grad_out, list(grads))
        else:  # outputs the loss does not depend on get None (not materialized): zeros
            for buffer, grad in zip(grad_out, grads):
                buffer.copy_(grad) if grad is not None else buffer.zero_()
        self.runner.replay(self.handle)
        out = list(self.grad_in)
        if self.reach is not None:
            reached = frozenset().union(*(r for r, g in zip(self.reach, grads) if g is not None))
            out = [g if k in reached else None for k, g in enumerate(out)]
        if self.clone_grads:
            n = len(self.tracked)
            params = self.params()
            for k, g in enumerate(out):
                # a caller's input passes its gradient on to your code; a parameter only
                # to autograd (which copies it into .grad), unless it has hooks
                if g is not None and (k < n or getattr(params[k - n], "_backward_hooks", None)):
                    out[k] = g.clone()
        return out

    def describe(self) -> str:
        reached = self.texts + self.labels
        shown = ", ".join(reached[:4]) + (f" and {len(reached) - 4} more" if len(reached) > 4 else "")
        return f"gradients: a forward and a backward graph (a layer); backward reaches {shown}"

    def release(self) -> None:
        if self.handle is not None:
            self.runner.release(self.handle)
        self.handle = None
        self.keep = []


class _GraphedLayer(torch.autograd.Function):
    """One call of a layer: forward, the call's outputs; backward, a backward-graph replay."""

    @staticmethod
    def forward(ctx, layer: Layer, plan: Any, values: list, box: list, *edges: Tensor):
        box.extend(values)
        graph = plan.graph
        # the graph's own buffers (outputs="static") get an object per call for autograd
        outs = tuple(values[j].detach() if values[j] is graph[j] else values[j] for j in layer.out_index)
        ctx.layer, ctx.generation = layer, layer.generation
        ctx.set_materialize_grads(False)
        n = len(layer.tracked)
        # saved, so that autograd raises as eagerly for a second backward without retain_graph,
        # and for an in-place write since the forward into what the backward graph reads: the
        # parameters, and results that are the graph's memory
        ctx.save_for_backward(layer.anchor, *edges[n:], *(outs if layer.save_outputs else ()))
        return outs

    @staticmethod
    def backward(ctx, *grads: Tensor):
        layer: Layer = ctx.layer
        if torch.is_grad_enabled():
            raise GraphStateError(
                f"{layer.owner} cannot backpropagate with create_graph=True: expected a first-order "
                "backward, got create_graph=True at the graph's outputs; the backward graph replays fixed "
                "kernels, which autograd cannot differentiate again: compute higher-order gradients "
                "with the module itself, unwrapped."
            )
        ctx.saved_tensors  # noqa: B018 - autograd's own checks (freed graph, in-place writes)
        return (None, None, None, None, *layer.backward(ctx.generation, grads))
