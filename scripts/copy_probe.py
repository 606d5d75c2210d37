"""An input copy through the CUDA API itself instead of ``copy_``: faster alone, slower in TD3 (GPU).

The evidence behind not shipping it (benchmarks/RESULTS.md, session 2026-11-24, eighth).
graphmodule copies a one-tensor input with ``buffer.copy_(x)``. This script swaps that copy,
for the duration of a run, for a ctypes call of the driver's ``cuMemcpyDtoDAsync`` or the
runtime's ``cudaMemcpyAsync`` on the caller's current stream (what ``copy_`` enqueues for a
contiguous same-dtype copy, without the dispatcher), and measures:

- ``isolated``: host µs of each copy alone and of the replay (median of 7 x 5 000 calls),
  then wall µs per call (15 alternating rounds of 2 000 calls, median) of the hand-written
  floor with either copy and of graphmodule with either copy (default outputs, each result
  dropped or held during the next call as ``out = g(x)`` in a loop; static outputs), for
  the tiny graph and the batch-1 policy;
- ``td3``: TD3's loop (``tests/programs/td3.py``) with graphmodule, one run per kind in
  turn: host µs of each policy call and of its input copy.

    python scripts/copy_probe.py [isolated] [td3]
"""

import contextlib
import ctypes
import os
import statistics
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "benchmarks"), ROOT]

import torch  # noqa: E402
from profile_hot_path import per_call  # noqa: E402
from workloads import WORKLOADS, capture_by_hand  # noqa: E402

from graphmodule import CudaGraphModule, _inputs  # noqa: E402

warnings.simplefilter("ignore")


def _loaded(name: str) -> str:
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if name in os.path.basename(path):
                return path
    raise SystemExit(f"{name} is not loaded")


def raw_copies() -> dict:
    """kind -> copy(dst_ptr, src_ptr, nbytes, stream): the driver's and the runtime's."""
    torch.zeros(1, device="cuda")
    drv = ctypes.PyDLL("libcuda.so.1").cuMemcpyDtoDAsync_v2
    drv.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
    drv.restype = ctypes.c_int
    rt = ctypes.PyDLL(_loaded("libcudart")).cudaMemcpyAsync
    rt.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    rt.restype = ctypes.c_int
    return {"driver": drv, "runtime": lambda d, s, n, stream: rt(d, s, n, 3, stream)}


@contextlib.contextmanager
def copying_with(kind: str, copies: dict):
    """graphmodule's one-buffer input copy made by ``copies[kind]`` (``copy_``: "torch")."""
    if kind == "torch":
        yield
        return
    raw, real = copies[kind], _inputs.StaticInputs.copy_from
    stream = torch._C._cuda_getCurrentRawStream

    def copy_from(self, leaves):
        one = self._one
        if one is None:
            return real(self, leaves)
        dst, src = one[0], leaves[one[1]]
        assert src.is_contiguous() and dst.is_contiguous() and src.dtype == dst.dtype
        assert raw(dst.data_ptr(), src.data_ptr(), dst.numel() * dst.element_size(), stream(dst.device.index)) == 0

    _inputs.StaticInputs.copy_from = copy_from
    try:
        yield
    finally:
        _inputs.StaticInputs.copy_from = real


@torch.no_grad()
def isolated(copies: dict) -> None:
    stream = torch._C._cuda_getCurrentRawStream
    for name in ("tiny_fn", "policy_b1"):
        case = WORKLOADS[name](torch.device("cuda"))
        x = case.args[0]
        static = x.clone()
        graph, _ = capture_by_hand(case.fn, (static,))
        n = x.numel() * x.element_size()
        dst, src = static.data_ptr(), x.data_ptr()
        drv = copies["driver"]
        rows = [("copy_", lambda: static.copy_(x)),
                ("cudaMemcpyAsync", lambda: copies["runtime"](dst, src, n, stream(0))),
                ("cuMemcpyDtoDAsync", lambda: drv(dst, src, n, stream(0))),
                ("replay", graph.replay)]
        for label, fn in rows:
            fn()
            print(f"{name:10s} {label:20s} host {per_call(fn, 5000, wait=False):7.2f} us", flush=True)

        def floor():
            static.copy_(x)
            graph.replay()

        def drv_floor():
            drv(static.data_ptr(), x.data_ptr(), n, stream(0))
            graph.replay()

        # label -> (the copy graphmodule makes, the call)
        variants = {"floor": ("torch", floor), "floor, driver copy": ("torch", drv_floor)}
        for kind in ("driver", "torch"):
            for outputs, held in (("safe", False), ("safe", True), ("static", False)):
                g = CudaGraphModule(case.fn, warmup=2, outputs=outputs)
                holder = [g(x)]
                holder[0] = g(x)  # captured, and the twin too
                holder[0] = g(x)
                call = (lambda g=g, h=holder: h.__setitem__(0, g(x))) if held else (lambda g=g: g(x))
                variants[f"gm {outputs}{', held' if held else ''}, {kind}"] = (kind, call)
        times = {k: [] for k in variants}
        for _ in range(15):
            for k, (kind, fn) in variants.items():
                with copying_with(kind, copies):  # set once per round, outside the timed calls
                    times[k].append(per_call(fn, 2000, repeats=1))
        base = statistics.median(times["floor"])
        for k, ts in times.items():
            m = statistics.median(ts)
            print(f"{name:10s} {k:26s} wall {m:7.2f} us  {m / base:5.2f}x floor", flush=True)


def td3(copies: dict, rounds: int = 3) -> None:
    from tests.programs.td3 import run_td3

    for _ in range(rounds):
        for kind in ("driver", "runtime", "torch"):
            calls, copy_times, wrappers = [], [], []
            real = _inputs.StaticInputs.copy_from

            with copying_with(kind, copies):
                patched = _inputs.StaticInputs.copy_from

                def timed(self, leaves, patched=patched):
                    t0 = time.perf_counter()
                    patched(self, leaves)
                    if self._one is not None and self._one[0].shape == (4, 3):  # the policy's observation
                        copy_times.append(time.perf_counter() - t0)

                _inputs.StaticInputs.copy_from = timed

                def wrap(fn, **kw):
                    g = CudaGraphModule(fn, **kw)
                    wrappers.append(g)
                    if len(wrappers) > 1:
                        return g

                    def policy(*a, **k):
                        t0 = time.perf_counter()
                        out = g(*a, **k)
                        calls.append(time.perf_counter() - t0)
                        return out

                    return policy

                try:
                    run_td3(wrap, steps=1500, device="cuda", learning_starts=100)
                finally:
                    _inputs.StaticInputs.copy_from = real
            x = [1e6 * c for c in calls[200:]]
            y = [1e6 * c for c in copy_times[200:]]
            print(f"{kind:8s} policy call mean {statistics.mean(x):6.1f} median {statistics.median(x):6.1f} us | "
                  f"its input copy mean {statistics.mean(y):5.1f} median {statistics.median(y):5.1f} us", flush=True)


if __name__ == "__main__":
    copies = raw_copies()
    for what in sys.argv[1:] or ["isolated", "td3"]:
        {"isolated": isolated, "td3": td3}[what](copies)
