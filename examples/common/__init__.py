"""What the examples share, not an example itself: ``envs`` (batched torch Pendulum and
CartPole, also used by the program tests) and ``training`` (what ``train_ppo.py`` and
``train_sac.py`` share: flags, modes, replay buffer, progress, evaluation, outputs)."""
