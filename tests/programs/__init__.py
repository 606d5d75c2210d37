"""Real programs: RL training loops written the way published scripts write them.

Each program is a function ``run_*(wrap, *, steps, device, seed, **config) -> dict`` where
``wrap(fn, **kwargs)`` is the only thing that changes between runs: no wrapper (eager),
``tensordict.nn.CudaGraphModule`` or ``graphmodule.CudaGraphModule`` (see
:func:`programs.common.make_wrap`). The result holds per-iteration metrics (losses, rewards,
episode returns) under ``"metrics"`` and the throughput under ``"timing"``.

- :mod:`programs.ppo`: PPO (GAE, minibatch epochs), update as a closure with a tensor
  counter (TorchRL's ppo_mujoco.py) or as a TensorDictModule called with ``tensordict_out``
  (LeanRL's ppo_continuous_action_torchcompile.py).
- :mod:`programs.sac`: SAC with a replay buffer, TensorDict policy, target update in the graph.
- :mod:`programs.td3`: TD3 with a keyword-called policy, delayed policy update, target
  networks lerped outside the graph.
- :mod:`programs.train_step`: a no-argument train step, optionally ``torch.compile``-d.

Used by ``tests/programs/test_programs.py`` and ``benchmarks/programs.py``.
"""
