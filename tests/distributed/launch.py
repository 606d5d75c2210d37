"""Start ``torchrun`` over a worker with a time limit, killing every process it started when
the limit passes (a process hung in NCCL does not answer torchrun's SIGTERM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "distributed", "worker.py")


class Ended(NamedTuple):
    code: int | None  # None: killed at the time limit
    output: str  # stdout and stderr of every process
    seconds: float


def torchrun(args: list[str], nproc: int = 2, timeout: float = 120.0, script: str = WORKER,
             env: dict[str, str] | None = None) -> Ended:
    """``torchrun --standalone --nproc_per_node=nproc script *args`` from the repository root
    (this environment passed on, NCCL's settings included, with ``env`` on top)."""
    env = dict(os.environ, **(env or {}), PYTHONUNBUFFERED="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               script, *args]
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+", errors="replace") as log:  # (a pipe could wait on orphans)
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                start_new_session=True)
        try:
            code: int | None = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the workers too, hung or not
            except ProcessLookupError:
                pass
            proc.wait()
        seconds = time.perf_counter() - start
        log.seek(0)
        return Ended(code, log.read(), seconds)
