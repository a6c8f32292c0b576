#!/usr/bin/env bash
# A scratch PostgreSQL cluster of our own ($PG_CONFIG's install, default 15), for the demo, the out-of-process
# test suites and the benchmark. Postgres refuses to run as root, so as root
# everything runs as the `postgres` OS user.
#
#   scripts/cluster.sh start DIR PORT [extra postgresql.conf lines...]
#   scripts/cluster.sh stop DIR
#
# The socket lives in DIR; connect with: psql -h DIR -p PORT -U postgres
set -euo pipefail

bindir=$("${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}" --bindir)
cmd=${1:?start|stop}; dir=${2:?data directory}
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

case "$cmd" in
start)
    port=${3:?port}; shift 3
    if [ -f "$dir/data/postmaster.pid" ]; then as_pg "$bindir/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true; fi
    rm -rf "$dir"; mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    as_pg "$bindir/initdb" -D "$dir/data" -U postgres -A trust --no-sync >/dev/null
    {
        echo "port = $port"
        echo "listen_addresses = ''"
        echo "unix_socket_directories = '$dir'"
        echo "max_connections = 100"
        echo "shared_buffers = 256MB"
        for line in "$@"; do echo "$line"; done
    } | as_pg tee -a "$dir/data/postgresql.conf" >/dev/null
    # pgrx appends a Rust backtrace to every error DETAIL when the server has
    # RUST_BACKTRACE set; users never see that, and neither should our tests.
    as_pg env -u RUST_BACKTRACE -u RUST_LIB_BACKTRACE "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null
    echo "cluster: started on port $port, socket $dir"
    ;;
stop)
    [ -f "$dir/data/postmaster.pid" ] && as_pg "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    echo "cluster: stopped"
    ;;
*) echo "usage: $0 start DIR PORT | stop DIR" >&2; exit 2 ;;
esac
