"""What each process runs under torchrun for ``tests/test_distributed.py``.

    torchrun --nproc_per_node=2 tests/distributed/worker.py examples [--steps N]
    torchrun --nproc_per_node=2 tests/distributed/worker.py exit ORDER [--model ddp|fsdp]
    torchrun --nproc_per_node=2 tests/distributed/worker.py rule CASE [CASE ...]

``examples``: both examples' steps, eager against graphed, in one process group; then a
wrapper alive at ``destroy_process_group()`` is found released. ``exit``: a graphed DDP (or
FSDP2) step captured and replayed, then the program ends in the given ORDER (see
:data:`ORDERS`). ``rule``: for each CASE (see :data:`CASES`), a DDP step built that way, run
graphed beside its eager twin; prints ``RESULT ...`` with what happened (the capture's error,
or the differences).
Rank 0 prints the lines the tests read.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from examples import ddp_train_step, fsdp_train_step  # noqa: E402
from examples.common.distributed import Pair, init, make_batches, mlp, race, run, train_step  # noqa: E402
from graphmodule import CaptureError, CudaGraphModule  # noqa: E402

#: how a program ends once its wrapper has captured collectives
ORDERS = {
    "alive": "destroy_process_group() with the wrapper alive, then exit",
    "never": "exit without destroy_process_group(), the wrapper in a global and a class attribute",
    "exception": "an uncaught exception, without destroy_process_group()",
    "finally": "an exception through `finally: destroy_process_group()`",
    "sysexit": "sys.exit(0) from inside the function that holds the wrapper",
    "reset": "reset() on the wrapper, then destroy_process_group() (by hand)",
}

#: DDP steps by how they are built: (keyword arguments of rule_pair)
CASES = {
    "ok": {},
    "warmup2": {"warmup": 2},
    "warmup10": {"warmup": 10},
    "no-static": {"static_graph": False},
    "find-unused": {"static_graph": False, "find_unused_parameters": True},
    "find-unused-static": {"find_unused_parameters": True},
    "default-stream": {"side_stream": False},
    "adam": {"capturable": False},  # made capturable by the wrapper
    "gloo": {"gloo": True},
    "fsdp-warmup1": {"fsdp": True, "warmup": 1},
    "fsdp-warmup2": {"fsdp": True, "warmup": 2},
}

WIDTH, DEPTH, BATCH = 64, 3, 16


class Holder:
    wrapper = None  # a class attribute outlives every frame (torn down last at exit)


def say(*parts: object) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(*parts, flush=True)


def graphed_step(model: str, setup, warmup: int = 11):
    net = mlp(WIDTH, DEPTH, setup.device)
    wrapped = ddp_train_step.ddp(net, setup) if model == "ddp" else fsdp_train_step.shard(net, setup)
    return CudaGraphModule(train_step(wrapped, setup.device), warmup=warmup, backend=setup.graph_backend)


def exit_order(order: str, model: str) -> None:
    setup = init()
    graphed = graphed_step(model, setup)
    run(graphed, make_batches(setup, 14, BATCH, WIDTH), 12, setup.device)
    say(f"captured: state {graphed.state}, {graphed.stats.replays} replays; now: {ORDERS[order]}")
    dist.barrier()
    if order == "alive":
        dist.destroy_process_group()
        say(f"destroyed; the wrapper is in state {graphed.state} with {graphed.stats.graphs} graph(s)")
    elif order == "never":
        Holder.wrapper = graphed
        globals()["kept"] = graphed
    elif order == "exception":
        raise RuntimeError("the program ends by an exception")
    elif order == "finally":
        try:
            raise RuntimeError("the program ends by an exception")
        finally:
            dist.destroy_process_group()
    elif order == "sysexit":
        sys.exit(0)
    elif order == "reset":
        graphed.reset()
        dist.destroy_process_group()
    say("exit")


def rule_pair(setup, warmup=11, static_graph=True, find_unused_parameters=False, side_stream=True,
              capturable=True, gloo=False, fsdp=False) -> Pair:
    """A graphed step and its eager twin, built as asked."""
    def build(net):
        if fsdp:
            return fsdp_train_step.shard(net, setup)
        group = dist.new_group(backend="gloo") if gloo else None
        stream = torch.cuda.Stream() if side_stream and setup.device.type == "cuda" else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            out = DistributedDataParallel(net, device_ids=[setup.device.index] if setup.device.type == "cuda" else None,
                                          static_graph=static_graph, find_unused_parameters=find_unused_parameters,
                                          process_group=group)
        if stream is not None:
            torch.cuda.current_stream().wait_stream(stream)
        return out

    net = mlp(WIDTH, DEPTH, setup.device)
    graphed_model, eager_model = build(copy.deepcopy(net)), build(net)
    on_gpu = setup.device.type == "cuda"
    graphed = CudaGraphModule(train_step(graphed_model, setup.device, capturable and on_gpu), warmup=warmup,
                              backend=setup.graph_backend)
    # a plain Adam that the graphed step steps is made capturable before its first step
    # (graphmodule._optim): the eager twin's is capturable, as it then is
    return Pair(graphed, train_step(eager_model, setup.device, on_gpu), graphed_model, eager_model)


def rule(cases: list[str]) -> None:
    setup = init()
    for case in cases:
        pair = rule_pair(setup, **CASES[case])
        try:
            numbers = race(setup, pair, 16, BATCH, WIDTH, 0)
        except CaptureError as err:
            say(f"RESULT {case}: CaptureError cause={err.cause}")
            say(str(err))
        except Exception as exc:  # noqa: BLE001 - reported for the test to read
            say(f"RESULT {case}: {type(exc).__name__}")
            say("".join(traceback.format_exception(exc))[-3000:])
        else:
            stats = pair.graphed.stats
            say(f"RESULT {case}: state={pair.graphed.state} captures={stats.captures} replays={stats.replays} "
                f"loss_diff={numbers['loss_diff']:.3e} param_diff={numbers['param_diff']:.3e}")
        dist.barrier()
    dist.destroy_process_group()


def examples(steps: int) -> None:
    setup = init()
    argv = ["--steps", str(steps), "--width", "64", "--depth", "3", "--batch", "16"]
    for name, example in (("ddp", ddp_train_step), ("fsdp", fsdp_train_step)):
        numbers = example.main(argv)
        say(f"RESULT {name}: loss_diff={numbers['loss_diff']:.3e} param_diff={numbers['param_diff']:.3e}")
    graphed = graphed_step("ddp", setup)
    run(graphed, make_batches(setup, 13, BATCH, WIDTH), 12, setup.device)
    captured = graphed.state
    dist.barrier()
    dist.destroy_process_group()
    say(f"RESULT destroy: captured={captured} after={graphed.state} graphs={graphed.stats.graphs}")
    if setup.device.type == "cpu":
        # gloo's teardown at exit can deadlock (its thread frees a finished barrier's work, which needs
        # the GIL, while the main thread, holding it, joins that thread): what the smoke checks is done
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("examples").add_argument("--steps", type=int, default=14)
    p = sub.add_parser("exit")
    p.add_argument("order", choices=ORDERS)
    p.add_argument("--model", choices=("ddp", "fsdp"), default="ddp")
    sub.add_parser("rule").add_argument("cases", nargs="+", choices=CASES)
    args = parser.parse_args()
    if args.what == "examples":
        examples(args.steps)
    elif args.what == "exit":
        exit_order(args.order, args.model)
    else:
        rule(args.cases)
