# Sourced by gpu_check.sh and gpu_fuzz.sh: makes the packages the GPU check needs importable,
# and the repository's own code the one imported.
#
# Beyond torch (with numpy and pytest), the GPU check needs: tensordict (with pyvers and
# cloudpickle), optree, hypothesis (with sortedcontainers), pytest-benchmark (with py-cpuinfo)
# and gymnasium (with farama-notifications). Where pip reaches an index: pip install -e ".[test]".
# Offline, put their wheels in .whl/ at the repository root, downloaded on a machine that has
# network access for the GPU machine's Python (here 3.12):
#   pip download -d .whl --no-deps --only-binary=:all: --python-version 3.12 tensordict pyvers \
#     cloudpickle optree hypothesis sortedcontainers pytest-benchmark py-cpuinfo gymnasium farama-notifications
# tests/test_torchrl.py also needs torchrl==0.14.1 (skipped without it), and
# scripts/torchrl_scripts.sh torchrl, hydra-core, omegaconf==2.3.1, tqdm and pyyaml (the same
# command), and antlr4-python3-runtime==4.9.3, which PyPI has as a source package only:
#   pip wheel -w .whl --no-deps antlr4-python3-runtime==4.9.3
# They are installed into $GM_SITE (default /tmp/graphmodule-site), put on PYTHONPATH with the
# repository. GM_SITE_ONCE=1 skips the install where $GM_SITE already holds it.
GM_SITE=${GM_SITE:-/tmp/graphmodule-site}
if ls .whl/*.whl >/dev/null 2>&1; then
  if [ -z "${GM_SITE_ONCE:-}" ] || [ ! -d "$GM_SITE/tensordict" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$GM_SITE" .whl/*.whl || exit 1
  fi
  export PYTHONPATH=$GM_SITE:$PWD
else
  export PYTHONPATH=$PWD
fi
missing=$(python3 - <<'PY'
import importlib.util
names = ["torch", "numpy", "pytest", "tensordict", "pyvers", "optree", "hypothesis", "pytest_benchmark", "gymnasium"]
print(" ".join(n for n in names if importlib.util.find_spec(n) is None))
PY
)
if [ -n "$missing" ]; then
  echo "missing Python packages: $missing (install them, or put their wheels in .whl/: see scripts/wheels.sh)" >&2
  exit 1
fi
