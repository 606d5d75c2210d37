#!/usr/bin/env bash
# One device call for the speed verdict of issue 6 and the tests a change touched:
# the named test files (one process each), then graphmodule against tensordict's wrapper in the
# real programs (pairs in one process per program), then the per-call host phases.
# Usage (device tool, carry .whl): bash scripts/gpu_speed.sh PAIRS TEST_FILE...
set -u
pairs=${1:-5}; shift
OUT=${OUT:-/tmp/graphmodule-speed}
mkdir -p "$OUT"
. "$(dirname "$0")/site.sh"  # the carried wheels on PYTHONPATH
export PYTHONUNBUFFERED=1
for f in "$@"; do
  printf '%-44s ' "$f" | tee -a "$OUT/tests.txt"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="-ra --strict-markers --benchmark-disable" "$f" \
    > /tmp/test.log 2>&1; echo "rc=$? $(tail -n 1 /tmp/test.log)" | tee -a "$OUT/tests.txt"
  grep -E "^(FAILED|ERROR)|^E " /tmp/test.log | head -20 >> "$OUT/tests.txt"
done
timeout 320 python3 benchmarks/programs.py --paired "$pairs" --programs td3,sac,ppo_tdmodule --out "$OUT" 2>&1 | tail -n 12
timeout 150 python3 scripts/phase_times.py sac td3 ppo_tdmodule --reps 300 2>&1 | tee "$OUT/phases.txt" | grep -E "^\||^=="
