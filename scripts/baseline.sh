#!/usr/bin/env bash
# graphmodule as it was at a git revision, importable beside the working tree's package as
# ``graphmodule_base``: the side-by-side table then times both in one run (its ``baseline``
# columns), so that a change's cost is read from one machine state, not from two runs.
#
#   bash scripts/baseline.sh REV DIR
#   GRAPHMODULE_BASELINE=DIR python benchmarks/run.py --out OUT --only side-by-side
#
# The package imports its own modules by relative imports only, so a renamed copy is a package
# of its own (checked below).
set -eu
if [ $# -ne 2 ]; then
  echo "usage: bash scripts/baseline.sh REV DIR" >&2
  exit 2
fi
rev=$1
dir=$2
cd "$(dirname "$0")/.."
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git archive "$rev" graphmodule | tar -x -C "$tmp"
if grep -rqE "^\s*(from|import) graphmodule(\.|\s|$)" "$tmp/graphmodule"; then
  echo "graphmodule at $rev imports itself by its name: a renamed copy would import the working tree's" >&2
  exit 1
fi
rm -rf "$dir/graphmodule_base"
mv "$tmp/graphmodule" "$dir/graphmodule_base"
echo "$dir/graphmodule_base: graphmodule at $(git rev-parse --short "$rev")"
