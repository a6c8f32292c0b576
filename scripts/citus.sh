#!/usr/bin/env bash
# A local Citus cluster for the scale-out suite and its measurements
# (docs/scale-out.md): a coordinator and N-1 workers, each a scratch cluster
# of its own (scripts/cluster.sh) on loopback ports, pg_sturdy installed on
# each, joined over their Unix sockets.
#
#   scripts/citus.sh available        exit 0 when Citus is installed into $PG_CONFIG's
#                                     PostgreSQL, or can be built (CITUS_SRC)
#   scripts/citus.sh build            build and install Citus from CITUS_SRC once
#   scripts/citus.sh start DIR NODES PORT DB   coordinator on PORT, workers on PORT+1..
#   scripts/citus.sh stop DIR NODES
#
# Citus is not part of pg_sturdy and never copied into it: users install it
# from their own packages. Here it is built from a release tarball given as
# CITUS_SRC (for instance the one this project's machines keep under
# ../shared/vendor/), in a scratch directory, and installed next to the
# server; a later run finds it installed and builds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

export PG_CONFIG=${PG_CONFIG:?the pg_config of a PostgreSQL Citus supports (16-18)}
pkglib=$("$PG_CONFIG" --pkglibdir)
bindir=$("$PG_CONFIG" --bindir)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

installed() { [ -f "$pkglib/citus.so" ]; }

build() {
    installed && return 0
    local src=${CITUS_SRC:-}
    [ -n "$src" ] && [ -f "$src" ] || { echo "citus: not installed and CITUS_SRC names no tarball" >&2; return 1; }
    local deps=() pkg
    for pkg in liblz4-dev libzstd-dev libcurl4-openssl-dev; do
        dpkg -s "$pkg" >/dev/null 2>&1 || deps+=("$pkg")
    done
    if [ ${#deps[@]} -gt 0 ]; then  # (scripts/bootstrap.sh installs them; a run without it)
        echo "citus: installing ${deps[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${deps[@]}" >/dev/null
    fi
    local work
    work=$(pwd)/target/citus-build
    rm -rf "$work"; mkdir -p "$work"
    tar -xzf "$src" -C "$work"
    local top
    top=$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -1)
    echo "citus: building $(basename "$top") against $("$PG_CONFIG" --version) (about a minute)"
    # the wheel's pg_config carries clang-only warning flags
    (cd "$top" && CC=clang ./configure --quiet PG_CONFIG="$PG_CONFIG" >"$work/configure.log" 2>&1 \
        && make -s -j2 >"$work/make.log" 2>&1 && make -s install >"$work/install.log" 2>&1) \
        || { echo "citus: build failed, see $work/*.log" >&2; tail -20 "$work"/*.log >&2; return 1; }
    installed
}

psql_at() { # dir port db sql
    as_pg "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h "$1" -p "$2" -U postgres -d "$3" -c "$4"
}

case "${1:?available|build|start|stop}" in
available)
    installed || [ -f "${CITUS_SRC:-/nonexistent}" ]
    ;;
build)
    build
    ;;
start)
    dir=${2:?directory}; nodes=${3:?node count}; port=${4:?coordinator port}; db=${5:?database}
    build
    for ((i = 0; i < nodes; i++)); do
        scripts/cluster.sh start "$dir/n$i" "$((port + i))" \
            "shared_preload_libraries = 'citus, pg_sturdy'" "max_connections = 200" \
            "max_prepared_transactions = 200" "citus.log_remote_commands = off" \
            "citus.local_hostname = '$dir/n$i'" >/dev/null
        psql_at "$dir/n$i" "$((port + i))" postgres "CREATE DATABASE $db"
        psql_at "$dir/n$i" "$((port + i))" "$db" "CREATE EXTENSION citus; CREATE EXTENSION pg_sturdy"
    done
    psql_at "$dir/n0" "$port" "$db" "SELECT pg_catalog.citus_set_coordinator_host('$dir/n0', $port)" >/dev/null
    for ((i = 1; i < nodes; i++)); do
        psql_at "$dir/n0" "$port" "$db" "SELECT pg_catalog.citus_add_node('$dir/n$i', $((port + i)))" >/dev/null
    done
    echo "citus: coordinator on port $port, $((nodes - 1)) worker(s), database $db"
    ;;
stop)
    dir=${2:?directory}; nodes=${3:?node count}
    for ((i = 0; i < nodes; i++)); do scripts/cluster.sh stop "$dir/n$i" >/dev/null 2>&1 || true; done
    ;;
*) echo "usage: $0 available | build | start DIR NODES PORT DB | stop DIR NODES" >&2; exit 2 ;;
esac
