#!/usr/bin/env bash
# Prepares the benchmark: a profiler in the project venv, and PGQueuer in the benchmark's
# own venv (bench/.venv-pgqueuer) so the peer never shares packages with sqlmq.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
uv="$root/.venv/bin/uv"
"$uv" pip install --python "$root/.venv/bin/python" --quiet -e "$root[bench]"
if [ ! -x "$here/.venv-pgqueuer/bin/python" ]; then
    "$uv" venv --quiet --python "$root/.venv/bin/python" "$here/.venv-pgqueuer"
fi
"$uv" pip install --python "$here/.venv-pgqueuer/bin/python" --quiet pgqueuer asyncpg
"$here/.venv-pgqueuer/bin/python" -c "import importlib.metadata as m; print('pgqueuer', m.version('pgqueuer'))"
