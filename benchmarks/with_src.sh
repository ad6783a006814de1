#!/usr/bin/env bash
# Runs a command in a copy of this checkout whose `src` is another commit's, for A/B runs on
# one device machine (the machine's copy has no .git). Make the tarball on the CPU first:
#
#   git archive COMMIT src > .cache/sN/old-src.tar
#   bash benchmarks/with_src.sh .cache/sN/old-src.tar COMMIT python3 -m infer.cli bench offline ...
#
# The copy lives in /tmp/repo_<tarball name> and is made once; COMMIT (12 hex digits) goes to
# INFER_GIT_COMMIT so the results name it.
set -u
tarball=$(realpath "$1") commit=$2
shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
copy=/tmp/repo_$(basename "$tarball" .tar)
if [ ! -d "$copy" ]; then
  mkdir -p "$copy" && (cd "$here" && tar --exclude=./src --exclude=./.whl -cf - .) | tar -xf - -C "$copy"
  tar -xf "$tarball" -C "$copy"
fi
cd "$copy"
export PYTHONPATH="/tmp/site:$copy/src" INFER_GIT_COMMIT="$commit"
"$@"
