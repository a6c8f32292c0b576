#!/usr/bin/env bash
# `make ui`: sturdy-ui against the demo's scratch cluster (target/demo, port
# DEMO_PORT or 55434), started here if it is not running, with a small scene
# where the database has none (two queues, a dead letter, a stuck instance, a
# batch job). Set PGSTURDY_DSN to look at another database instead (the
# extension installed there). Ctrl-C stops the dashboard and the cluster it
# started. Extra arguments go to sturdy-ui (--allow-actions, --listen ...).
set -euo pipefail
cd "$(dirname "$0")/.."
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
psql=$("$PG_CONFIG" --bindir)/psql
ui=${STURDY_UI:-$PWD/target/ui/release/sturdy-ui}

if [ -z "${PGSTURDY_DSN:-}" ]; then
    dir=$PWD/target/demo port=${DEMO_PORT:-55434}
    if [ "$(id -u)" = 0 ] && ! runuser -u postgres -- test -x "$PWD"; then dir=/tmp/pg_sturdy_demo; fi
    if ! [ -S "$dir/.s.PGSQL.$port" ]; then
        scripts/cluster.sh start "$dir" "$port" >/dev/null
        trap 'scripts/cluster.sh stop "$dir" >/dev/null' EXIT
    fi
    PGSTURDY_DSN="host=$dir port=$port user=postgres dbname=postgres"
    "$psql" "$PGSTURDY_DSN" -X -q -v ON_ERROR_STOP=1 <<'SQL'
CREATE EXTENSION IF NOT EXISTS pg_sturdy;
SELECT NOT EXISTS (SELECT FROM sturdy.queue) AND NOT EXISTS (SELECT FROM sturdy.instances) AS empty \gset
\if :empty
SELECT count(sturdy.schedule('mail-' || i, now() - i * interval '1 second', 'emails')) FROM generate_series(1, 40) i;
SELECT sturdy.limit_queue('emails', running => 5);
SELECT count(*) FROM sturdy.take('emails', '10 minutes', 3);
SELECT count(sturdy.schedule('report-' || i, now() + interval '1 hour', 'reports')) FROM generate_series(1, 5) i;
CREATE OR REPLACE FUNCTION public.send_invoice(m sturdy.outbox, attempt int) RETURNS void LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'mail server refused %', m.payload->>'to' USING ERRCODE = '08006'; END $$;
SELECT sturdy.subscribe('invoice.due', 'public.send_invoice(sturdy.outbox, integer)', 1);
SELECT * FROM sturdy.emit('invoice.due', '{"to": "ops@example.com"}', 'invoice-1');
SELECT * FROM sturdy.pump();
SELECT sturdy.start('ship', 'order-' || i, '{}') FROM generate_series(1, 3) i;
UPDATE sturdy.instances SET updated_at = now() - interval '2 hours' WHERE business_key = 'order-1';
CREATE TABLE IF NOT EXISTS public.ui_orders (id bigint PRIMARY KEY, status text);
INSERT INTO public.ui_orders SELECT i, 'new' FROM generate_series(1, 20000) i ON CONFLICT DO NOTHING;
SELECT sturdy.batch_start('archive orders', 'public.ui_orders', 'status = $1', 'status = $2', ARRAY['archived', 'new'], chunk => 1000);
SELECT * FROM sturdy.batch_tick('archive orders');
\endif
SQL
fi
echo "ui: sturdy-ui against $PGSTURDY_DSN (Ctrl-C stops it)"
"$ui" --dsn "$PGSTURDY_DSN" "$@"
