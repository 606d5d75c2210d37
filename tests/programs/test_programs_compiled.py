"""The no-argument train step, ``torch.compile``-d inside the wrapper (LeanRL's
``CudaGraphModule(torch.compile(update), warmup=5)``), eagerly and through the wrappers.

Apart from test_programs.py because compiling takes long: on CPU dynamo's ``aot_eager``
backend (no C++ build), on CUDA inductor, recompiled for every run; tensordict's CUDA run is
made in a child process (see ``test_programs.run_on_cuda``).
"""

import pytest

from . import train_step
from .common import make_wrap
from .test_programs import assert_same_metrics, check_cuda_run, check_reference, run_on_cuda

CPU = dict(steps=12, batch_size=32, hidden=32, compile=True, compile_backend="aot_eager")
CUDA = dict(steps=50, compile=True)


def test_simulated_graphs_match_eager_compiled():
    ref = train_step.run_train_step(make_wrap("eager"), device="cpu", seed=0, **CPU)
    check_reference("train_step_compiled", ref)
    wrap = make_wrap("graphmodule", backend="simulate")
    got = train_step.run_train_step(wrap, device="cpu", seed=0, **CPU)
    assert_same_metrics(got, ref, rtol=1e-5, atol=1e-6)
    (graphed,) = wrap.built
    assert graphed.stats.captures == 1 and graphed.stats.replays > 0, graphed.explain()


@pytest.mark.cuda
@pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores:UserWarning")  # inductor's advice
@pytest.mark.parametrize("wrapper", ["tensordict", "graphmodule"])
def test_cuda_wrappers_match_eager_compiled(wrapper, cuda):
    ref, got, built = run_on_cuda(train_step.run_train_step, CUDA, wrapper, cuda)
    check_cuda_run("train_step_compiled", wrapper, ref, got, built)
    assert len(built) == 1
