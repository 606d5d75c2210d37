"""Differential testing of ``CudaGraphModule`` against the plain function, with hypothesis.

- :mod:`.strategies`: generated cases (call trees and function bodies, as Python source).
- :mod:`.oracle`: runs a case's call sequence through the wrapper and eagerly, compares
  everything observable, and raises a :class:`~.oracle.DifferentialFailure` with a diff.

Used by ``tests/test_differential.py``; ``GM_FUZZ_EXAMPLES`` and ``GM_FUZZ_BACKEND`` bound it.
"""
