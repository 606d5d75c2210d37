# Sourced by the GPU scripts: install the carried wheels (.whl/, for Python 3.12) into
# /tmp/site and put them and the repository on PYTHONPATH; without .whl/, the repository only.
# GM_SITE_ONCE=1: skip the install where /tmp/site already has it (a script that runs the fuzz
# several times in one call).
if ls .whl/*.whl >/dev/null 2>&1; then
  if [ -z "${GM_SITE_ONCE:-}" ] || [ ! -d /tmp/site/tensordict ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
  fi
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
