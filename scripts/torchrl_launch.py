"""Run one of TorchRL's published training scripts with graphmodule's CudaGraphModule in
tensordict's place, and append how long it took to a results file (one JSON object a line).

    python scripts/torchrl_launch.py RESULTS.jsonl [--wrapper graphmodule|tensordict] \
        DIR/sac/sac.py env.name=Pendulum-v1 collector.total_frames=10000 compile.cudagraphs=True ...

The arguments after the script are its hydra overrides. ``--wrapper graphmodule`` (the default)
binds ``tensordict.nn.CudaGraphModule`` to graphmodule's before torchrl is imported, so that
the script's ``from tensordict.nn import CudaGraphModule`` and torchrl's own imports of the name
(its collectors' ``cudagraph_policy=True``) get ours; ``--wrapper tensordict`` leaves
tensordict's. The published scripts of earlier torchrl releases use names that torchrl 0.14 renamed (the
collectors ``SyncDataCollector``, ``aSyncDataCollector``, ...; an env's ``single_action_spec``;
the PPO losses' ``critic_coef`` and ``entropy_coef``):
where the installed torchrl lacks a name, it is bound to the renamed one. ``Pendulum64-v1`` is
registered with gymnasium: Pendulum-v1 with float64 observations, as MuJoCo's envs give them, for
the scripts whose env transforms expect float64 (PPO's ``DoubleToFloat``).
``scripts/torchrl_scripts.sh`` runs the scripts this way.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time
import traceback
import warnings

# torchrl 0.14 renamed its collectors; the scripts of earlier releases import the old names
RENAMED_COLLECTORS = {
    "SyncDataCollector": "Collector",
    "aSyncDataCollector": "AsyncCollector",
    "MultiSyncDataCollector": "MultiSyncCollector",
    "MultiaSyncDataCollector": "MultiAsyncCollector",
}


def bind_graphmodule() -> list:
    """Bind ``tensordict.nn.CudaGraphModule`` (and every torchrl module's copy of the name) to
    graphmodule's; returns the list the wrappers made are appended to."""
    import tensordict.nn

    import graphmodule

    made: list = []
    tensordicts = tensordict.nn.CudaGraphModule

    # GM_WRAPPER_OPTIONS="on_capture_failure=eager" (comma-separated): options the wrapped class
    # adds where the script passes none (PPO's GAE in torchrl 0.14.1 checks for NaN on the host)
    options = dict(item.split("=", 1) for item in os.environ.get("GM_WRAPPER_OPTIONS", "").split(",") if item)

    class CudaGraphModule(graphmodule.CudaGraphModule):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**options, **kwargs})
            made.append(self)

    tensordict.nn.CudaGraphModule = CudaGraphModule
    import torchrl.collectors  # noqa: F401  (imported after the binding: they import ours)
    import torchrl.objectives  # noqa: F401

    for module in list(sys.modules.values()):  # any that imported the name before
        if getattr(module, "CudaGraphModule", None) is tensordicts and module.__name__.startswith("torchrl"):
            module.CudaGraphModule = CudaGraphModule
    return made


def alias_renamed_collectors() -> list[str]:
    import torchrl.collectors

    aliased = []
    for old, new in RENAMED_COLLECTORS.items():
        if not hasattr(torchrl.collectors, old) and hasattr(torchrl.collectors, new):
            setattr(torchrl.collectors, old, getattr(torchrl.collectors, new))
            aliased.append(old)
    return aliased


def alias_renamed_env_attributes() -> list[str]:
    from torchrl.envs import EnvBase

    if hasattr(EnvBase, "single_action_spec"):
        return []
    EnvBase.single_action_spec = property(lambda env: env.action_spec_unbatched)
    return ["EnvBase.single_action_spec"]


def rename_removed_ppo_arguments() -> list[str]:
    """The PPO losses' ``critic_coef`` and ``entropy_coef``, removed in torchrl 0.11, passed under
    their new names (``critic_coeff``, ``entropy_coeff``)."""
    import inspect

    from torchrl.objectives.ppo import PPOLoss

    if "critic_coeff" not in inspect.signature(PPOLoss.__init__).parameters:
        return []
    init = PPOLoss.__init__

    def __init__(self, *args, **kwargs):
        for old in ("critic_coef", "entropy_coef"):
            if old in kwargs:
                kwargs[old + "f"] = kwargs.pop(old)
        init(self, *args, **kwargs)

    PPOLoss.__init__ = __init__
    return ["PPOLoss(critic_coef=, entropy_coef=)"]


def register_pendulum64() -> None:
    import gymnasium
    import numpy as np
    from gymnasium.envs.classic_control.pendulum import PendulumEnv
    from gymnasium.wrappers import DtypeObservation

    if "Pendulum64-v1" not in gymnasium.registry:
        gymnasium.register("Pendulum64-v1", entry_point=lambda **kw: DtypeObservation(PendulumEnv(**kw), np.float64),
                           max_episode_steps=200)


def override(overrides: list[str], key: str) -> str | None:
    values = [o.split("=", 1)[1] for o in overrides if o.startswith(key + "=")]
    return values[-1] if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="the JSON-lines file a line is appended to")
    parser.add_argument("--wrapper", choices=["graphmodule", "tensordict"], default="graphmodule")
    parser.add_argument("script")
    parser.add_argument("overrides", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    script = os.path.abspath(args.script)
    results = os.path.abspath(args.results)

    os.environ["HYDRA_FULL_ERROR"] = "1"  # hydra re-raises the script's error: it goes in the results
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    made = bind_graphmodule() if args.wrapper == "graphmodule" else []
    aliased = alias_renamed_collectors() + alias_renamed_env_attributes() + rename_removed_ppo_arguments()
    register_pendulum64()
    import torch

    sys.path.insert(0, os.path.dirname(script))  # (the scripts import their utils.py)
    sys.argv = [script, *args.overrides]
    error = None
    start = time.perf_counter()
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            error = f"SystemExit({exit_.code})"
    except Exception as err:  # the run's failure is a result: written down, then raised by rc
        traceback.print_exc()
        error = f"{type(err).__name__}: {err}"
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    wall = time.perf_counter() - start

    frames = override(args.overrides, "collector.total_frames")
    frames = int(frames.replace("_", "")) if frames else None
    row = {
        "script": os.path.relpath(script, os.path.dirname(os.path.dirname(os.path.dirname(script)))),
        "cudagraphs": override(args.overrides, "compile.cudagraphs"),
        "wrapper": args.wrapper,
        "wall_s": round(wall, 2),
        "frames": frames,
        "frames_per_s": round(frames / wall, 1) if frames and not error else None,
        "error": error,
        "graphs": [
            {"module": repr(w.module)[:60], **{k: getattr(w.stats, k) for k in
             ("warmup_calls", "captures", "replays", "eager_calls", "capture_failures", "input_mismatches", "recaptures")}}
            for w in made
        ],
        "aliased": aliased,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "overrides": args.overrides,
    }
    with open(results, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps({k: row[k] for k in ("script", "cudagraphs", "wrapper", "wall_s", "frames_per_s", "error")}))
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main())
