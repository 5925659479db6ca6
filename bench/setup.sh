#!/usr/bin/env bash
# Prepares the benchmark: a profiler in the project venv, and each peer in a venv of its own
# so that neither shares packages with sqlmq: PGQueuer in bench/.venv-pgqueuer, and
# faststream-sqlbroker (with FastStream's RabbitMQ and NATS clients, for its relay) in
# bench/.venv-sqlbroker; graphile-worker and pg-boss with npm in bench/node/.
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
if [ ! -x "$here/.venv-sqlbroker/bin/python" ]; then
    "$uv" venv --quiet --python "$root/.venv/bin/python" "$here/.venv-sqlbroker"
fi
"$uv" pip install --python "$here/.venv-sqlbroker/bin/python" --quiet faststream-sqlbroker \
    "faststream[rabbit,nats]" "sqlalchemy[asyncio]" asyncpg
"$here/.venv-sqlbroker/bin/python" -c "import importlib.metadata as m; print('faststream-sqlbroker', m.version('faststream-sqlbroker'), 'faststream', m.version('faststream'))"
# graphile-worker and pg-boss, the Node peers of `bench.run peers`, in bench/node/node_modules
# at the versions bench/node/package-lock.json pins.
if command -v npm >/dev/null; then
    (cd "$here/node" && npm ci --no-audit --no-fund --silent)
    node -e "for (const p of ['graphile-worker', 'pg-boss']) console.log(p, require('$here/node/node_modules/' + p + '/package.json').version)"
else
    echo "npm not found: the Node peers of bench.run peers are not installed" >&2
fi
