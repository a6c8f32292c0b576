#!/usr/bin/env bash
# Install what building and testing pg_sturdy needs, skipping what is there:
# Debian packages, cargo-pgrx 0.18.1, and `cargo pgrx init` for Debian's PG 15.
set -euo pipefail

PG_CONFIG=${PG_CONFIG:-/usr/bin/pg_config}
PGRX_VERSION=0.18.1
packages=(postgresql-15 postgresql-server-dev-15 postgresql-contrib libclang-dev clang sudo
          build-essential pkg-config libssl-dev)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "bootstrap: installing ${missing[*]}"
    as_root=(); [ "$(id -u)" = 0 ] || as_root=(sudo)
    "${as_root[@]}" apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! cargo pgrx --version 2>/dev/null | grep -q " $PGRX_VERSION\$"; then
    echo "bootstrap: installing cargo-pgrx $PGRX_VERSION (a few minutes)"
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked --quiet
fi

if ! grep -qs "pg15 *= *\"$PG_CONFIG\"" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
    echo "bootstrap: cargo pgrx init --pg15 $PG_CONFIG"
    cargo pgrx init --pg15 "$PG_CONFIG" >/dev/null
fi
# the multi-connection tests and the demo's listening worker talk to the
# server through psycopg 3
if ! python3 -c 'import psycopg' 2>/dev/null; then
    echo "bootstrap: pip install psycopg[binary]"
    python3 -m pip install --quiet --disable-pip-version-check 'psycopg[binary]>=3.2,<4'
fi
echo "bootstrap: ready (cargo-pgrx $PGRX_VERSION, $("$PG_CONFIG" --version))"
