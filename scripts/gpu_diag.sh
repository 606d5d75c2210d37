#!/usr/bin/env bash
# Diagnostics in one device call: where a GPU fuzz case's time goes (cProfile of one worker),
# how the fuzz scales with workers, and the host phases of the real programs' calls.
# The fuzz runs go through scripts/gpu_fuzz.sh (install, deadline, progress, stacks).
# Usage (device tool, carry .whl): bash scripts/gpu_diag.sh [profile|scale|phases]...
set -u
OUT=${OUT:-/tmp/graphmodule-diag}
mkdir -p "$OUT"
here=$(dirname "$0")
GM_SITE_ONCE=1 . "$(dirname "$0")/site.sh"  # the carried wheels on PYTHONPATH
for what in "$@"; do
  case $what in
    profile)  # the cases after the 20th only (imports and first captures left out)
      GM_FUZZ_PROFILE=/tmp/fuzz.prof GM_FUZZ_FOCUSES=mixed OUT="$OUT/profile" \
        bash "$here/gpu_fuzz.sh" "${GM_PROFILE_SECONDS:-100}" 1
      python3 - > "$OUT/fuzz-profile.txt" <<'PY'
import pstats
s = pstats.Stats("/tmp/fuzz.prof")
s.sort_stats("tottime").print_stats(45)
s.sort_stats("cumulative").print_stats(60)
PY
      grep -B3 -A28 "Ordered by: internal" "$OUT/fuzz-profile.txt" | cut -c1-150 ;;
    scale)
      for n in ${GM_SCALE_WORKERS:-1 3}; do
        echo "== $n workers, ${GM_SCALE_SECONDS:-90} s" | tee -a "$OUT/fuzz-scale.txt"
        OUT="$OUT/scale$n" bash "$here/gpu_fuzz.sh" "${GM_SCALE_SECONDS:-90}" "$n" | tee -a "$OUT/fuzz-scale.txt"
      done ;;
    phases)
      export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
      timeout 200 python3 scripts/phase_times.py sac td3 --reps 300 2>&1 | tee "$OUT/phases.txt" | grep -E "^\||^==" ;;
  esac
done
