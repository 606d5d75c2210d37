#!/usr/bin/env bash
# Diagnostics in one device call: where a GPU fuzz case's time goes (cProfile of one worker),
# how the fuzz scales with workers, and the host phases of the real programs' calls.
# Usage (device tool, carry .whl): bash scripts/gpu_diag.sh [profile|scale|phases]...
set -u
OUT=${OUT:-/tmp/graphmodule-diag}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/tensordict ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
fuzz() {  # fuzz SECONDS FOCUS SEED
  GM_FUZZ_BACKEND=cuda GM_FUZZ_SEED=$3 GM_FUZZ_EXAMPLES=1000000 timeout -s INT "$1" \
    python3 -m pytest -q -s -p no:cacheprovider -o addopts="--strict-markers --benchmark-disable" \
    "tests/test_differential.py::test_fuzz[$2]" 2>&1 | grep -E "cases run|differential failure|Error" | head -5
}
for what in "$@"; do
  case $what in
    profile)  # the cases after the 20th only (imports and first captures left out)
      GM_FUZZ_PROFILE=/tmp/fuzz.prof fuzz "${GM_PROFILE_SECONDS:-70}" mixed 4242 | tee "$OUT/fuzz-profile.txt"
      python3 - >>"$OUT/fuzz-profile.txt" <<'PY'
import pstats
s = pstats.Stats("/tmp/fuzz.prof")
s.sort_stats("tottime").print_stats(45)
s.sort_stats("cumulative").print_stats(60)
PY
      grep -B3 -A28 "Ordered by: internal" "$OUT/fuzz-profile.txt" | cut -c1-150 ;;
    scale)
      for n in ${GM_SCALE_WORKERS:-1 3}; do
        echo "== $n workers, ${GM_SCALE_SECONDS:-50} s" | tee -a "$OUT/fuzz-scale.txt"
        for ((i = 0; i < n; i++)); do fuzz "${GM_SCALE_SECONDS:-50}" mixed $((7000 + i)) > /tmp/scale$i.txt & done
        wait; cat /tmp/scale*.txt | tee -a "$OUT/fuzz-scale.txt"; rm -f /tmp/scale*.txt
      done ;;
    phases)
      timeout 200 python3 scripts/phase_times.py sac td3 --reps 300 2>&1 | tee "$OUT/phases.txt" | grep -E "^\||^==" ;;
  esac
done
