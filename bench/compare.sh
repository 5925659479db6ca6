#!/usr/bin/env bash
# Benchmarks a landed revision and the working tree in one run, alternating, so both see the
# same machine: a refactoring's "no figure more than 5 % worse" is read from one output.
#
#   bash bench/compare.sh REV [BENCHMARKS] [DATABASES] [EXTRA bench.run ARGS...]
#   bash bench/compare.sh bf1890f "drain publish latency" "postgresql mariadb sqlite"
#
# REV is checked out (read-only) into a temporary git worktree; its sqlmq is imported through
# PYTHONPATH by the same virtual environment, so only the package differs. Output: each
# benchmark's table for "before" (REV) then "after" (this tree), per database.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
rev="${1:?usage: bench/compare.sh REV [BENCHMARKS] [DATABASES] [ARGS...]}"
benches="${2:-drain publish latency}"
dbs="${3:-postgresql mariadb sqlite}"
shift $(( $# < 3 ? $# : 3 ))
old="$(mktemp -d)/before"
git -C "$here" worktree add --detach "$old" "$rev" >/dev/null
trap 'git -C "$here" worktree remove --force "$old"' EXIT
py="$here/.venv/bin/python"
for db in $dbs; do
  for b in $benches; do
    echo "=== $b on $db: before ($rev)"
    (cd "$old" && PYTHONPATH="$old" "$py" -m bench.run "$b" --db "$db" --no-peer "$@")
    echo "=== $b on $db: after (working tree)"
    (cd "$here" && "$py" -m bench.run "$b" --db "$db" --no-peer "$@")
  done
done
echo "reproduce: bash bench/compare.sh $rev \"$benches\" \"$dbs\" $*"
