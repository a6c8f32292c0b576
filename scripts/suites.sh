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
regress=(claims checkpoints security hostile_setup hostile_claims hostile_checkpoints hostile_queue hostile_outbox hostile_workflow hostile_batch hostile_temp catalog encoding)
isolation=(claim-race claim-record-rr record-takeover transact-supply take-skip-locked take-rewritten wakeup-during-pass arrive-notify pump-skip-locked emit-visibility start-idempotency transition-race finish-transition finish-wakeup finish-renew finish-concurrent done-concurrent schedule-concurrent batch-race batch-done-wakeup)

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
# Several real connections at once, from outside: draining, fan-out, NOTIFY.
as_pg "$bindir/psql" -X -q -h "$dir/cluster" -p "$port" -U postgres -c "CREATE DATABASE sturdy_concurrency" postgres
as_pg "$bindir/psql" -X -q -h "$dir/cluster" -p "$port" -U postgres -c "CREATE EXTENSION pg_sturdy" sturdy_concurrency
python3 pg_test/concurrency.py "host=$dir/cluster port=$port user=postgres dbname=sturdy_concurrency" \
    | tee "$out/concurrency.log" || status=1
# On 15 the takes share their floors only with the library preloaded; the
# take tests once more on a cluster without it, each connection by its own.
: > "$out/concurrency_plain.log"
if "$bindir/postgres" --version | grep -q ' 15\.'; then
    scripts/cluster.sh start "$dir/plain" "$((port + 3))" >/dev/null
    as_pg "$bindir/psql" -X -q -h "$dir/plain" -p "$((port + 3))" -U postgres -c "CREATE DATABASE sturdy_concurrency" postgres
    as_pg "$bindir/psql" -X -q -h "$dir/plain" -p "$((port + 3))" -U postgres -c "CREATE EXTENSION pg_sturdy" sturdy_concurrency
    python3 pg_test/concurrency.py "host=$dir/plain port=$((port + 3)) user=postgres dbname=sturdy_concurrency" take,floor,scan \
        | sed 's/^concurrency:/concurrency without preload:/' | tee "$out/concurrency_plain.log" || status=1
    scripts/cluster.sh stop "$dir/plain" >/dev/null
fi
# The calls served without a statement against their statements, over what
# users do to tables; timeouts, cancels and a deadlock at every wait.
python3 pg_test/fastpath.py "host=$dir/cluster port=$port user=postgres" | tee "$out/fastpath.log" || status=1
# A worker's loop through node-postgres, which binds every parameter untyped.
NODE_PATH=${NODE_DIR:-/opt/pg_sturdy/node}/node_modules node pg_test/node_worker.cjs "$dir/cluster" "$port" \
    | tee "$out/node.log" || status=1
# pg_dump of a database with rows in every table, restored into a fresh one.
python3 pg_test/dump_restore.py "$bindir" "host=$dir/cluster port=$port user=postgres" \
    | tee "$out/dump_restore.log" || status=1
# ALTER EXTENSION UPDATE from every released version: rows kept, the catalog a fresh install's.
python3 pg_test/upgrade.py "host=$dir/cluster port=$port user=postgres" | tee "$out/upgrade.log" || status=1
# A primary and a synchronous standby of their own: failover under load.
python3 pg_test/failover.py "$bindir" "$dir/failover" "${FAILOVER_PORT:-55450}" | tee "$out/failover.log" || status=1
# Last, as it kills the cluster: kill -9 mid-load, of a backend and of the
# postmaster; nothing acknowledged lost, nothing half-done, the load drains.
python3 pg_test/crash.py "$bindir" "$dir/cluster/data" "host=$dir/cluster port=$port user=postgres" \
    | tee "$out/crash.log" || status=1
logs=("$out"/concurrency.log "$out"/fastpath.log "$out"/concurrency_plain.log "$out"/node.log "$out"/dump_restore.log "$out"/upgrade.log "$out"/failover.log "$out"/crash.log)
total=$(( ${#regress[@]} + ${#isolation[@]} + $(cat "${logs[@]}" | grep -cE '^(ok|FAIL) ') ))
failed=$(cat "$out"/regress.log "$out"/isolation.log | grep -cE '^(not ok|test .* \.\.\. FAILED)' || true)
failed=$(( failed + $(cat "${logs[@]}" | grep -c '^FAIL ' || true) ))
# a test whose requirement this server lacks says so, and is counted
skipped=$(cat "${logs[@]}" | grep -c '^skip ' || true)

if [ "$status" != 0 ]; then
    for d in "$out"/*/regression.diffs; do [ -s "$d" ] && { echo "== $d"; head -200 "$d"; }; done
    echo "suites: $((total - failed)) passed, $failed failed, $skipped skipped"
    exit 1
fi
echo "suites: $total passed, 0 failed, $skipped skipped"
