#!/usr/bin/env bash
# The out-of-process suites: a scratch cluster of our own, the extension as
# installed by `cargo pgrx install`, then PostgreSQL's pg_regress (golden files
# for what a psql user sees) and pg_isolation_regress (races, with real
# concurrent sessions). Exits non-zero when any suite fails.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${SUITES_DIR:-/tmp/pg_sturdy_suites}
port=${SUITES_PORT:-55433}
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
bindir=$("$PG_CONFIG" --bindir)
pgxs=$("$PG_CONFIG" --pkglibdir)/pgxs/src/test
out=$dir/out
# every file is a test: pg_regress runs them in the order of their names
regress=($(cd pg_test/regress/sql && LC_ALL=C ls *.sql | sed 's/\.sql$//'))
isolation=($(cd pg_test/isolation/specs && LC_ALL=C ls *.spec | sed 's/\.spec$//'))

echo "suites: $("$PG_CONFIG" --version)"
# pg_sturdy preloaded, as docs/operations.md advises on PostgreSQL 15 (where the
# takes' shared floors need it; 17 and later share them without); and
# pg_cron, where this server has it (Debian's postgresql-15-cron), for the
# test of a cron job pumping the outbox.
conf=("shared_preload_libraries = 'pg_sturdy'")
if [ -f "$("$PG_CONFIG" --pkglibdir)/pg_cron.so" ]; then
    conf=("shared_preload_libraries = 'pg_cron, pg_sturdy'" "cron.database_name = 'sturdy_concurrency'"
          "cron.use_background_workers = on" "max_worker_processes = 16")
fi
scripts/cluster.sh start "$dir/cluster" "$port" "${conf[@]}"
trap 'scripts/cluster.sh stop "$dir/cluster" >/dev/null || true' EXIT
rm -rf "$out"; mkdir -p "$out/regress" "$out/isolation"
# The test tools run as the postgres OS user, who may not be able to read a
# checkout under root's home: give them a copy of the inputs.
rm -rf "$dir/inputs"; cp -r pg_test "$dir/inputs"
[ "$(id -u)" = 0 ] && chown -R postgres: "$out" "$dir/inputs"
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
common=(--bindir="$bindir" --host="$dir/cluster" --port="$port" --user=postgres --load-extension=pg_sturdy)

status=0
as_pg "$pgxs/regress/pg_regress" "${common[@]}" --dbname=sturdy_regress \
    --inputdir="$dir/inputs/regress" --outputdir="$out/regress" "${regress[@]}" | tee "$out/regress.log" || status=1
as_pg "$pgxs/isolation/pg_isolation_regress" "${common[@]}" --dbname=sturdy_isolation \
    --inputdir="$dir/inputs/isolation" --outputdir="$out/isolation" "${isolation[@]}" | tee "$out/isolation.log" || status=1
# The pytest suites (pg_test/test_*.py): several real connections at once,
# from outside; the fast path against its statements; node-postgres;
# pg_dump; ALTER EXTENSION UPDATE; a failover on clusters of their own.
as_pg "$bindir/psql" -X -q -h "$dir/cluster" -p "$port" -U postgres -c "CREATE DATABASE sturdy_concurrency" postgres
as_pg "$bindir/psql" -X -q -h "$dir/cluster" -p "$port" -U postgres -c "CREATE EXTENSION pg_sturdy" sturdy_concurrency
export STURDY_BINDIR=$bindir STURDY_DATADIR=$dir/cluster/data STURDY_DB=sturdy_concurrency \
    STURDY_FAILOVER_DIR=$dir/failover STURDY_FAILOVER_PORT=${FAILOVER_PORT:-55450}
pytest_run() { # log name, then what pytest gets
    local log=$out/$1.log; shift
    STURDY_SERVER=${server:-"host=$dir/cluster port=$port user=postgres"} \
        python3 -m pytest "$@" 2>&1 | tee "$log"
    return "${PIPESTATUS[0]}"
}
pytest_run pytest pg_test --ignore=pg_test/test_crash.py --ignore=pg_test/citus || status=1
# The Python client (clients/python): its calls, its worker, and its
# examples, against this server and through PgBouncer in transaction mode.
pytest_run pytest_client clients/python/tests || status=1
# The public harness's adapter (bench/harness): its records and arithmetic, no
# server (with HARNESS=<its checkout>, also through the harness's own parser).
pytest_run pytest_harness bench/harness || status=1
# On 15 the takes share their floors only with the library preloaded; the
# take tests once more on a cluster without it, each connection by its own.
if "$bindir/postgres" --version | grep -q ' 15\.'; then
    scripts/cluster.sh start "$dir/plain" "$((port + 3))" >/dev/null
    as_pg "$bindir/psql" -X -q -h "$dir/plain" -p "$((port + 3))" -U postgres -c "CREATE DATABASE sturdy_concurrency" postgres
    as_pg "$bindir/psql" -X -q -h "$dir/plain" -p "$((port + 3))" -U postgres -c "CREATE EXTENSION pg_sturdy" sturdy_concurrency
    server="host=$dir/plain port=$((port + 3)) user=postgres" \
        pytest_run pytest_plain pg_test/test_queue.py pg_test/test_floors.py -k "take or floor or scan" || status=1
    scripts/cluster.sh stop "$dir/plain" >/dev/null
fi
# Scale-out on Citus (docs/scale-out.md): a coordinator and two workers of
# their own, where Citus is installed into this server or its release source
# is given (CITUS_SRC, built once into the server's install). Citus 14 needs
# PostgreSQL 16 or later. A run without it says so and counts one skip.
citus_skipped=0
citus_dir=$dir/citus
if [ "$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')" -lt 16 ]; then
    echo "suites: SKIPPED the Citus suite: Citus 14 needs PostgreSQL 16 or later, this is $("$PG_CONFIG" --version)"
    citus_skipped=1
elif ! scripts/citus.sh available; then
    echo "suites: SKIPPED the Citus suite: Citus is not installed and CITUS_SRC names no release tarball"
    citus_skipped=1
else
    # once for each placement of claims and checkpoints distribute() makes:
    # with the queues (its default), and by workflow, each on a cluster of
    # its own (a placement once made is kept)
    for placement in with_queues by_workflow; do
        if ! scripts/citus.sh start "$citus_dir" 3 "$((port + 20))" sturdy_citus; then
            echo "suites: the Citus cluster did not start"; status=1; break
        fi
        if as_pg "$bindir/psql" -X -q -h "$citus_dir/n0" -p "$((port + 20))" -U postgres -d sturdy_citus \
            -c "SELECT sturdy.distribute($([ $placement = with_queues ] && echo true || echo false))" >/dev/null; then
            STURDY_CITUS_PLACEMENT=$placement STURDY_DB=sturdy_citus \
                STURDY_CITUS_NODES="host=$citus_dir/n1 port=$((port + 21)) user=postgres;host=$citus_dir/n2 port=$((port + 22)) user=postgres" \
                server="host=$citus_dir/n0 port=$((port + 20)) user=postgres" pytest_run "pytest_citus_$placement" pg_test/citus || status=1
        else
            echo "suites: sturdy.distribute() failed on the Citus cluster"; status=1
        fi
        scripts/citus.sh stop "$citus_dir" 3
        rm -rf "$citus_dir"
    done
fi

# Last, as it kills the cluster: kill -9 mid-load, of a backend and of the
# postmaster; nothing acknowledged lost, nothing half-done, the load drains.
pytest_run pytest_crash pg_test/test_crash.py || status=1

# pytest's closing line ("== 3 failed, 140 passed, 2 skipped in 310.2s ==")
# of each run, summed with pg_regress's and the isolation tester's counts
count() { # what: passed, failed, skipped or error
    cat "$out"/pytest*.log | { grep -E '^=+ .* in [0-9.]+s' || true; } | { grep -oE "[0-9]+ $1" || true; } \
        | awk '{n += $1} END {print n + 0}'
}
regress_failed=$(cat "$out"/regress.log "$out"/isolation.log | grep -cE '^(not ok|test .* \.\.\. FAILED)' || true)
failed=$(( regress_failed + $(count failed) + $(count error) ))
passed=$(( ${#regress[@]} + ${#isolation[@]} - regress_failed + $(count passed) ))
skipped=$(( $(count skipped) + citus_skipped ))

if [ "$status" != 0 ]; then
    for d in "$out"/*/regression.diffs; do [ -s "$d" ] && { echo "== $d"; head -200 "$d"; }; done
    echo "suites: $passed passed, $failed failed, $skipped skipped"
    exit 1
fi
echo "suites: $passed passed, 0 failed, $skipped skipped"
