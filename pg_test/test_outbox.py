"""The outbox's pumps from several connections, and from pg_cron."""
import threading
import time

import psycopg
import pytest

from sturdy import DSN, Worker, connect, commit_a_second_late, wait_notifies


OUTBOX_LOG = """
    CREATE TABLE IF NOT EXISTS public.outbox_log (n bigserial, outbox bigint, aggregate text, pump text);
    CREATE OR REPLACE FUNCTION public.outbox_log(m sturdy.outbox, attempt int) RETURNS void LANGUAGE sql
      AS $$ INSERT INTO public.outbox_log (outbox, aggregate, pump)
            VALUES (m.id, m.aggregate_id, current_setting('application_name')) $$;
"""


def fresh_outbox(c, event):
    c.execute(OUTBOX_LOG)
    c.execute("TRUNCATE public.outbox_log, sturdy.subscriptions, sturdy.outbox CASCADE")
    c.execute("SELECT sturdy.subscribe(%s, 'public.outbox_log(sturdy.outbox, integer)')", (event,))


def test_four_pumps_deliver_five_thousand_exactly_once_and_in_order():
    """4 pumps at once over 5,000 deliveries (40 aggregates and unordered
    ones), each delivery inserting a row: exactly one row per delivery, and
    per aggregate the rows are in emit order."""
    total = 5000
    with connect() as c:
        fresh_outbox(c, "load")
        c.execute(
            "SELECT sturdy.emit('load', to_jsonb(i), CASE WHEN i %% 5 <> 0 THEN 'agg-' || (i %% 40) END)"
            " FROM generate_series(1, %s) i",
            (total,),
        )
    errors = []

    def pump(k):
        try:
            with psycopg.connect(DSN, autocommit=True, application_name=f"pump-{k}") as c:
                while True:
                    (seen,) = c.execute("SELECT seen FROM sturdy.pump(50)").fetchone()
                    if seen == 0:
                        (left,) = c.execute("SELECT count(*) FROM sturdy.deliveries WHERE state = 'pending'").fetchone()
                        if left == 0:
                            return
                        time.sleep(0.01)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [Worker(target=pump, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with connect() as c:
        rows, distinct, pumps = c.execute(
            "SELECT count(*), count(DISTINCT outbox), count(DISTINCT pump) FROM public.outbox_log"
        ).fetchone()
        out_of_order = c.execute(
            "SELECT aggregate FROM public.outbox_log WHERE aggregate IS NOT NULL GROUP BY aggregate"
            " HAVING array_agg(outbox ORDER BY n) <> array_agg(outbox ORDER BY outbox)"
        ).fetchall()
        states = c.execute("SELECT state, count(*) FROM sturdy.deliveries GROUP BY state").fetchall()
    assert (rows, distinct) == (total, total), f"{rows} rows for {distinct} deliveries, expected {total}"
    assert pumps > 1, "one pump did all the work: the run was not concurrent"
    assert out_of_order == [], f"aggregates delivered out of emit order: {out_of_order}"
    assert states == [("done", total)], states


def test_a_late_emit_below_a_busy_pumps_floor_is_delivered_within_seconds():
    """pump scans from a floor just below the oldest head it found last. An
    emit whose transaction commits a second after its now() is due below the
    floor of a pump that kept finding newer deliveries meanwhile (each round
    emits one and pumps one, so no call comes up short): that pump must still
    deliver it, once, by its periodic scan from the start."""
    with connect() as c:
        fresh_outbox(c, "floor")
    started, got = threading.Event(), {}
    delivered_late = ("SELECT count(*) FROM public.outbox_log l JOIN sturdy.outbox o ON o.id = l.outbox"
                      " WHERE o.payload = '\"late\"'")

    def busy_pump():
        with psycopg.connect(DSN, autocommit=True, application_name="busy-pump") as c:
            c.execute("SELECT sturdy.emit('floor', to_jsonb(i)) FROM generate_series(1, 20) i")
            started.set()
            end = time.monotonic() + 10
            while time.monotonic() < end and "late" not in got:
                c.execute("SELECT sturdy.emit('floor', '\"busy\"')")
                c.execute("SELECT * FROM sturdy.pump(1)")
                (late,) = c.execute(delivered_late).fetchone()
                if late:
                    got["late"] = time.monotonic()

    committed = commit_a_second_late(Worker(target=busy_pump), started,
                                     "SELECT sturdy.emit('floor', '\"late\"')")
    assert "late" in got, "an emit committed below the floor was never delivered"
    with connect() as c:
        (times,) = c.execute(delivered_late).fetchone()
    assert times == 1, f"delivered {times} times"
    print(f"     late emit delivered {got['late'] - committed:.2f} s after its commit")


def test_an_emit_wakes_an_idle_listening_pump_only_after_commit():
    """A pump loop that found nothing LISTENs on sturdy_outbox; an emit in
    another session notifies it at commit (with the event name), once."""
    with connect() as listener, connect(autocommit=False) as app:
        fresh_outbox(listener, "wake.e")
        listener.execute("LISTEN sturdy_outbox")
        assert listener.execute("SELECT seen FROM sturdy.pump()").fetchone() == (0,)
        app.execute("SELECT sturdy.emit('wake.e', '1')")
        assert wait_notifies(listener, 0.5) == [], "notified before commit"
        app.commit()
        assert wait_notifies(listener, 2.0) == [("sturdy_outbox", "wake.e")]
        app.execute("SELECT sturdy.emit('wake.e', '2')")
        app.commit()
        assert wait_notifies(listener, 0.5) == [], "the mark is spent until a pump finds nothing again"
        assert listener.execute("SELECT seen FROM sturdy.pump()").fetchone() == (2,)


def test_pg_cron_jobs_pump_and_tick_with_nobody_else_calling():
    """Real pg_cron jobs (every minute, the finest schedule pg_cron 1.4 has):
    `SELECT * FROM sturdy.pump(100)` delivers what was emitted, and
    `SELECT * FROM sturdy.batch_tick('cron-move')` moves a named batch job to
    completion."""
    with connect() as c:
        if not c.execute("SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_cron'").fetchone()[0]:
            pytest.skip("pg_cron is not installed for this server")
        if "pg_cron" not in c.execute("SHOW shared_preload_libraries").fetchone()[0]:
            pytest.skip("pg_cron is not in shared_preload_libraries")
        c.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")
        fresh_outbox(c, "cron.e")
        c.execute("SELECT sturdy.emit('cron.e', to_jsonb(i)) FROM generate_series(1, 10) i")
        c.execute("DROP TABLE IF EXISTS public.cron_rows")
        c.execute("CREATE TABLE public.cron_rows (id int PRIMARY KEY, moved boolean NOT NULL DEFAULT false)")
        c.execute("INSERT INTO public.cron_rows SELECT i FROM generate_series(1, 500) i")
        c.execute("DELETE FROM sturdy.batches WHERE name = 'cron-move'")
        c.execute("SELECT sturdy.batch_start('cron-move', 'public.cron_rows', 'moved = true', 'NOT moved',"
                  " chunk => 10000)")
        c.execute("SELECT cron.schedule('sturdy-pump', '* * * * *', 'SELECT * FROM sturdy.pump(100)')")
        c.execute("SELECT cron.schedule('sturdy-tick', '* * * * *',"
                  " 'SELECT * FROM sturdy.batch_tick(''cron-move'')')")
        try:
            deadline = time.monotonic() + 130
            while time.monotonic() < deadline:
                (done,) = c.execute("SELECT count(*) FROM sturdy.deliveries WHERE state = 'done'").fetchone()
                (complete,) = c.execute("SELECT complete FROM sturdy.batch_jobs WHERE name = 'cron-move'").fetchone()
                if done == 10 and complete:
                    break
                time.sleep(1)
            runs = c.execute(
                "SELECT j.jobname, status, return_message FROM cron.job_run_details d JOIN cron.job j USING (jobid)"
                " WHERE j.jobname IN ('sturdy-pump', 'sturdy-tick')"
            ).fetchall()
        finally:
            c.execute("SELECT cron.unschedule('sturdy-pump')")
            c.execute("SELECT cron.unschedule('sturdy-tick')")
        (logged,) = c.execute("SELECT count(DISTINCT outbox) FROM public.outbox_log").fetchone()
        (moved,) = c.execute("SELECT count(*) FROM public.cron_rows WHERE moved").fetchone()
    assert done == 10 and logged == 10, f"{done} done, {logged} logged; cron runs: {runs}"
    assert complete and moved == 500, f"batch complete={complete}, {moved} moved; cron runs: {runs}"
    assert runs and all(status == "succeeded" for _, status, _ in runs), runs
