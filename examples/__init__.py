"""Runnable examples; ``examples.envs`` holds the batched torch Pendulum used by the program tests,
``examples.training`` what the two training scripts share."""
