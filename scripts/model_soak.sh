#!/usr/bin/env bash
# The queue's model checker (pg_test/model.py) for as long as asked, on a
# scratch cluster of its own with the installed build: `make soak` runs it
# after the churn soak, `make model` alone. MODEL_MINUTES (default 30) sets
# how long; MODEL_SEED picks the first episode's seed (default: random, printed).
# Exits non-zero with the seed and the shortest failing history when an
# invariant breaks.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${MODEL_DIR:-/tmp/pg_sturdy_model}
port=${MODEL_PORT:-55438}
minutes=${MODEL_MINUTES:-30}
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
bindir=$("$PG_CONFIG" --bindir)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

scripts/cluster.sh start "$dir" "$port" "shared_preload_libraries = 'pg_sturdy'"
trap 'scripts/cluster.sh stop "$dir" >/dev/null || true' EXIT
as_pg "$bindir/psql" -X -q -h "$dir" -p "$port" -U postgres -c "CREATE DATABASE sturdy_model" postgres
as_pg "$bindir/psql" -X -q -h "$dir" -p "$port" -U postgres -c "CREATE EXTENSION pg_sturdy" sturdy_model
seed=()
[ -n "${MODEL_SEED:-}" ] && seed=(--seed "$MODEL_SEED")
STURDY_SERVER="host=$dir port=$port user=postgres" STURDY_DB=sturdy_model \
    python3 pg_test/model.py --seconds "$((minutes * 60))" "${seed[@]}"
