#!/usr/bin/env bash
# The demo: two workers, one workflow, fencing in action (each "worker" line
# runs on its own connection); then a queue worker that sleeps on LISTEN,
# takes with a claim, suspends with wake_at and wakes when an approval
# arrives (scripts/demo_worker.py); then the outbox: an order and its event
# committed together, two subscribers, retries with backoff, a dead letter
# and its redrive; workflow instances; and batch chunks: a 1,000,000-row
# backlog ticked through with adapting chunks, and the seed's race. By
# default it starts a scratch cluster under
# target/demo; set PGSTURDY_DSN to run it against an existing server instead
# (the extension must be installed there: `make install`, then it creates it).
set -euo pipefail
cd "$(dirname "$0")/.."
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
psql=$("$PG_CONFIG" --bindir)/psql

if [ -z "${PGSTURDY_DSN:-}" ]; then
    dir=$PWD/target/demo port=${DEMO_PORT:-55434}
    # as root the server runs as postgres, who must be able to reach target/
    if [ "$(id -u)" = 0 ] && ! runuser -u postgres -- test -x "$PWD"; then
        dir=/tmp/pg_sturdy_demo
        echo "demo: the postgres user cannot reach $PWD; using $dir for the cluster"
    fi
    echo "demo: a scratch cluster of $("$PG_CONFIG" --version)"
    scripts/cluster.sh start "$dir" "$port" >/dev/null
    trap 'scripts/cluster.sh stop "$dir" >/dev/null' EXIT
    PGSTURDY_DSN="host=$dir port=$port user=postgres dbname=postgres"
fi

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
# q WHO SQL: run SQL on a fresh connection, labelled with who runs it.
q() {
    local who=$1 sql=$2
    printf '\033[36m%s>\033[0m %s\n' "$who" "$sql"
    "$psql" "$PGSTURDY_DSN" -X -q -P pager=off -P null='(null)' 2>&1 <<SQL | sed 's/^/    /'
$sql;
\\if :ERROR
\\echo '(SQLSTATE' :LAST_ERROR_SQLSTATE')'
\\endif
SQL
}

q setup "DROP EXTENSION IF EXISTS pg_sturdy CASCADE; CREATE EXTENSION pg_sturdy;"

say "Two workers race for workflow 'order-42'; the first wins token 1, the second gets NULL"
q worker-a "SELECT sturdy.claim('order-42', lease => '2 seconds', owner => 'worker-a') AS token"
q worker-b "SELECT sturdy.claim('order-42', lease => '2 seconds', owner => 'worker-b') AS token"

say "Worker A records its first step under token 1"
q worker-a "SELECT * FROM sturdy.record('order-42', 'reserve-stock', '{\"sku\": \"X-1\", \"qty\": 2}', token => 1)"

say "Worker A stalls (a GC pause, a lost network) and its 2-second lease lapses ..."
sleep 2.5
q worker-b "SELECT sturdy.claim('order-42', lease => '1 minute', owner => 'worker-b') AS token"

say "Worker B takes over: it reads what is done and carries on with token 2"
q worker-b "SELECT step, value FROM sturdy.load('order-42')"
q worker-b "SELECT * FROM sturdy.record('order-42', 'charge-card', '{\"amount\": 99.5}', token => 2)"

say "Worker A wakes up and tries to write with its stale token: refused with SD001, nothing written"
q worker-a "SELECT * FROM sturdy.record('order-42', 'charge-card', '{\"amount\": 99.5}', token => 1)"
q worker-a "SELECT sturdy.fence('order-42', 1)"

say "An approval arrives from outside any pass (a webhook): supply, first writer wins"
q webhook "SELECT sturdy.supply('order-42', 'manager-approval', '{\"by\": \"dana\"}')"
q webhook "SELECT sturdy.supply('order-42', 'manager-approval', '{\"by\": \"someone-else\"}')"

say "Exactly-once in-database effect: transact runs ship() once and records its result"
q setup "CREATE TABLE shipments (workflow text, carrier text);
CREATE FUNCTION ship(arg jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
BEGIN INSERT INTO shipments VALUES (arg->>'workflow', arg->>'carrier');
      RETURN jsonb_build_object('shipped_by', arg->>'carrier'); END \$\$;"
q worker-b "SELECT sturdy.transact('order-42', 2, 'ship', 'ship(jsonb)', '{\"workflow\": \"order-42\", \"carrier\": \"ups\"}')"
say "A retry of the same step (say the worker crashed before it saw the answer) returns the recorded value; ship() does not run again"
q worker-b "SELECT sturdy.transact('order-42', 2, 'ship', 'ship(jsonb)', '{\"workflow\": \"order-42\", \"carrier\": \"dhl\"}')"
q anyone "SELECT count(*) AS shipments FROM shipments"

say "The history, as load shows it, and the claim"
q anyone "SELECT step, value, to_char(recorded_at, 'HH24:MI:SS.MS') AS at FROM sturdy.load('order-42')"
q anyone "SELECT workflow, token, owner FROM sturdy.claims"
q worker-b "SELECT sturdy.release('order-42', 2) AS released"

say "The queue: a worker that sleeps on LISTEN, suspends for an approval, and wakes when it arrives"
python3 scripts/demo_worker.py "$PGSTURDY_DSN"
say "The outbox: an order and its event commit together; two subscribers, in the server"
q setup "CREATE TABLE orders (id text PRIMARY KEY, total numeric);
CREATE TABLE emails (order_id text, attempt int);
CREATE TABLE crm_status (online boolean);
INSERT INTO crm_status VALUES (false);
-- the mail server times out twice, then takes the message
CREATE FUNCTION send_email(m sturdy.outbox, attempt int) RETURNS void LANGUAGE plpgsql AS \$\$
BEGIN
  INSERT INTO emails VALUES (m.payload->>'order', attempt);
  IF attempt < 3 THEN RAISE EXCEPTION 'smtp: timed out' USING ERRCODE = 'EM001'; END IF;
END \$\$;
-- the CRM is down until someone fixes it
CREATE FUNCTION update_crm(m sturdy.outbox, attempt int) RETURNS void LANGUAGE plpgsql AS \$\$
BEGIN
  IF NOT (SELECT online FROM crm_status) THEN
    RAISE EXCEPTION 'crm: 503 service unavailable' USING ERRCODE = 'CR503';
  END IF;
END \$\$;
SELECT sturdy.subscribe('order.placed', 'send_email(sturdy.outbox, integer)', max_attempts => 5);
SELECT sturdy.subscribe('order.placed', 'update_crm(sturdy.outbox, integer)', max_attempts => 2);"
q app "BEGIN;
INSERT INTO orders VALUES ('order-42', 99.50);
SELECT * FROM sturdy.emit('order.placed', '{\"order\": \"order-42\", \"total\": 99.50}', aggregate_id => 'order-42');
COMMIT"
say "A pump (a pg_cron job, a worker loop) delivers: both subscribers fail; their effects are rolled back, the attempts counted"
q pump "SELECT * FROM sturdy.pump()"
q anyone "SELECT count(*) AS emails_kept FROM emails"
q anyone "SELECT subscriber, state, attempts, next_attempt_at - now() AS retry_in, last_sqlstate, last_error FROM sturdy.deliveries ORDER BY id"
say "Two seconds later (2^1): the mail server times out again, the CRM is dead after its 2 attempts"
sleep 2.2
q pump "SELECT * FROM sturdy.pump()"
say "Four seconds later (2^2): the email goes out on its third attempt"
sleep 4.2
q pump "SELECT * FROM sturdy.pump()"
q anyone "SELECT order_id, attempt FROM emails"
q anyone "SELECT event, subscriber, pending, retrying, done, dead, oldest_pending_age FROM sturdy.outbox_stats ORDER BY subscriber"
say "The CRM is fixed: redrive its dead delivery, and the next pump delivers it"
q ops "UPDATE crm_status SET online = true"
q ops "SELECT sturdy.redrive(id) FROM sturdy.deliveries WHERE state = 'dead'"
q pump "SELECT * FROM sturdy.pump()"
q anyone "SELECT event, subscriber, pending, retrying, done, dead FROM sturdy.outbox_stats ORDER BY subscriber"
say "Workflow instances: an API starts a fulfilment with an idempotency key, and its retry gets the same instance"
q api "SELECT sturdy.start('fulfil', 'order-77', '{\"order\": 77}', idempotency_key => 'req-9f2c') AS instance"
q api-retry "SELECT sturdy.start('fulfil', 'order-77', '{\"order\": 77}', idempotency_key => 'req-9f2c') AS instance"
q anyone "SELECT id, workflow, status, revision, step FROM sturdy.status('order-77')"
say "A worker's whole pass in two calls: take with a claim, then finish (records the step, moves the instance, releases, removes the row)"
q worker "SELECT workflow, receipt, token FROM sturdy.take('fulfil', claim => true) \\gset
\\echo took :workflow with token :token
SELECT sturdy.finish(:'workflow', :token, :'receipt', 'shipped', '{\"carrier\": \"ups\"}', status => 'succeeded', queue => 'fulfil') AS removed"
q anyone "SELECT id, workflow, status, revision, step FROM sturdy.status('order-77')"
say "An instance nobody moves: stuck finds it (its last progress was two hours ago)"
q api "SELECT sturdy.start('fulfil', 'order-78') AS instance"
q demo "UPDATE sturdy.instances SET updated_at = now() - interval '2 hours' WHERE business_key = 'order-78'"
q ops "SELECT business_key, workflow, status, now() - stalled_since AS stalled_for FROM sturdy.stuck('1 hour')"
say "Sweep, a week later (simulated): the finished instance goes with its checkpoints, claim and keys; the stuck one stays"
q demo "UPDATE sturdy.instances SET finished_at = now() - interval '8 days' WHERE status = 'succeeded';
UPDATE sturdy.idempotency_keys SET expires_at = now() - interval '7 days'"
q cron "SELECT * FROM sturdy.sweep('7 days', 1000)"
q anyone "SELECT business_key, status FROM sturdy.instances"
say "Batch chunks: a 1,000,000-row backlog moved by batch_tick calls (what a pg_cron job would run), each chunk sized from the last one's rate"
q setup "CREATE TABLE receipts (id int PRIMARY KEY, status text NOT NULL, amount numeric NOT NULL);
INSERT INTO receipts SELECT i, 'planned', i % 1000 FROM generate_series(1, 1000000) i;
VACUUM ANALYZE receipts;
SELECT sturdy.batch_start('plan-to-pending', 'receipts', 'status = \$1', 'status = \$2',
                          ARRAY['pending', 'planned'], chunk => 1000, target_seconds => 0.5)"
printf '    %5s %9s %9s %8s %6s %10s\n' tick done remaining seconds done? next_chunk
for tick in $(seq 1 200); do
    line=$("$psql" "$PGSTURDY_DSN" -X -qAt -F ' ' -c "SELECT done, remaining, round(seconds::numeric, 3), complete FROM sturdy.batch_tick('plan-to-pending')" \
                                              -c "SELECT chunk FROM sturdy.batches WHERE name = 'plan-to-pending'" | tr '\n' ' ')
    set -- $line
    printf '    %5s %9s %9s %8s %6s %10s\n' "$tick" "$1" "$2" "$3" "$4" "$5"
    [ "$4" = t ] && break
done
q anyone "SELECT name, done, remaining, chunks, rows_per_second, complete FROM sturdy.batch_jobs"
q anyone "SELECT status, count(*) FROM receipts GROUP BY status"

say "The seed's race: a user cancels a receipt while a chunk is updating; the chunk waits for that row, re-checks the pending predicate on the new version, and skips it"
q setup "CREATE TABLE small (id int PRIMARY KEY, status text NOT NULL);
INSERT INTO small SELECT i, 'planned' FROM generate_series(1, 5) i"
"$psql" "$PGSTURDY_DSN" -X -q -c "BEGIN" -c "UPDATE small SET status = 'cancelled' WHERE id = 3" -c "SELECT pg_sleep(2)" -c "COMMIT" >/dev/null &
user=$!
sleep 0.5
printf '\033[36m%s>\033[0m %s\n' user "BEGIN; UPDATE small SET status = 'cancelled' WHERE id = 3; -- holds the row 2 s, then COMMIT"
q batch "SELECT done, remaining, complete FROM sturdy.batch('small', 'status = \$1', 'status = \$2', ARRAY['pending', 'planned'], 100)"
wait "$user"
q anyone "SELECT id, status FROM small ORDER BY id"
say "Done."
