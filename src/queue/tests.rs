use crate::testing::{count, sqlstate_of};
use pgrx::prelude::*;

fn one<T: pgrx::FromDatum + pgrx::IntoDatum>(sql: &str) -> Option<T> {
    Spi::get_one::<T>(sql).unwrap()
}

#[pg_test]
fn take_leases_the_oldest_ready_rows_up_to_max() {
    Spi::run(
        "SELECT sturdy.schedule('w3', now() - interval '1 minute');
         SELECT sturdy.schedule('w1', now() - interval '3 minutes');
         SELECT sturdy.schedule('w2', now() - interval '2 minutes');
         SELECT sturdy.schedule('later', now() + interval '1 hour');",
    )
    .unwrap();
    let taken = one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take(max => 2)");
    assert_eq!(taken.as_deref(), Some("w1,w2"));
    let taken = one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take(max => 10)");
    assert_eq!(
        taken.as_deref(),
        Some("w3"),
        "leased and sleeping rows are not taken"
    );
    assert_eq!(one::<i64>("SELECT count(*) FROM sturdy.take()"), Some(0));
    let receipt_is_lease_end = one::<bool>(
        "SELECT leased_until = now() + interval '1 minute' AND visible_at = now() - interval '3 minutes'
           FROM sturdy.queue WHERE workflow = 'w1'",
    );
    assert_eq!(
        receipt_is_lease_end,
        Some(true),
        "the lease is leased_until; visible_at stays when it was due"
    );
}

/// take's lease writes no indexed column, so its update is HOT: no new
/// index entry, the new version on the row's own page (sql/queue.sql's
/// fill factor leaves the room), for a batch scheduled together as for
/// a single row, with short workflow names and with uuid-long ones.
#[pg_test]
fn take_leases_by_a_hot_update() {
    Spi::run(
        "SELECT sturdy.schedule(CASE WHEN i <= 150 THEN 'hot-' || i ELSE 'order/' || gen_random_uuid() END,
                                now() - interval '1 minute', 'hot')
           FROM generate_series(1, 300) i",
    )
    .unwrap();
    let indexes = || {
        one::<i64>(
            "SELECT pg_relation_size('sturdy.queue_visible') + pg_relation_size('sturdy.queue_pkey')",
        )
    };
    let before = indexes();
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('hot', max => 200)"),
        Some(200)
    );
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('hot', claim => true)"),
        Some(1)
    );
    let updates = one::<String>(
        "SELECT n_tup_upd || ' updated, ' || n_tup_hot_upd || ' HOT'
           FROM pg_stat_xact_user_tables WHERE relid = 'sturdy.queue'::regclass",
    );
    assert_eq!(updates.as_deref(), Some("201 updated, 201 HOT"));
    let after = indexes();
    assert_eq!(before, after, "no index grew");
}

/// take hands its rows over in materialize mode: the same rows in the
/// select list as in FROM, and none is lost or repeated.
#[pg_test]
fn take_returns_rows_in_the_select_list_too() {
    Spi::run(
        "SELECT sturdy.schedule('s' || i, now() - i * interval '1 second') FROM generate_series(1, 5) i",
    )
    .unwrap();
    let taken = one::<String>(
        "SELECT string_agg((t).workflow, ',') FROM (SELECT sturdy.take(max => 3, claim => true) t) x",
    );
    assert_eq!(taken.as_deref(), Some("s5,s4,s3"));
    let tokens = one::<i64>(
        "SELECT sum(t)::bigint FROM (SELECT (sturdy.take(max => 5, claim => true)).token t) x",
    );
    assert_eq!(tokens, Some(2), "s2 and s1, each claimed with token 1");
    assert_eq!(one::<i64>("SELECT count(*) FROM sturdy.claims"), Some(5));
}

/// A take that comes up short in a transaction whose now() is stale (a
/// long scan, an old transaction) looks once more by the clock: what came
/// due since the transaction began is taken, what is due later is not.
#[pg_test]
fn a_take_in_a_stale_transaction_takes_what_came_due_by_the_clock() {
    let take = || {
        one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take('stale', max => 10)")
    };
    Spi::run(
        "SELECT sturdy.schedule('soon', clock_timestamp() + interval '500 milliseconds', 'stale');
         SELECT sturdy.schedule('later', clock_timestamp() + interval '1 hour', 'stale');",
    )
    .unwrap();
    assert_eq!(take(), None, "nothing is due yet, by either time");
    Spi::run("SELECT pg_sleep(0.8)").unwrap();
    assert_eq!(
        one::<bool>("SELECT min(visible_at) > now() FROM sturdy.queue WHERE queue = 'stale'"),
        Some(true),
        "by the transaction's now(), neither is due"
    );
    assert_eq!(take().as_deref(), Some("soon"));
    assert_eq!(take(), None);
    // stale by more than the lease: the lease, counted from now(), would
    // be over before the row was handed out, so not by the clock
    Spi::run("SELECT sturdy.schedule('brief', clock_timestamp(), 'stale')").unwrap();
    Spi::run("SELECT pg_sleep(0.05)").unwrap();
    assert_eq!(
        one::<String>(
            "SELECT string_agg(workflow, ',') FROM sturdy.take('stale', '100 milliseconds')"
        ),
        None
    );
    assert_eq!(
        one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take('stale', '1 hour')")
            .as_deref(),
        Some("brief")
    );
}

/// take scans from its floor, below the oldest row it took, not from the
/// first entry of the index; a schedule or wake_at before now() bumps the
/// generation, and the next take scans from the start again.
/// Rows scheduled together share a visible_at; `seq` orders them, and
/// under a backlog ready long ago the floor is the exact row the last
/// take got, so the next one starts there, not at the first of the batch
/// (whose entries, taken and done, stay until vacuum).
#[pg_test]
fn take_goes_in_arrival_order_within_a_batch_and_its_floor_is_that_exact_row() {
    let take = |max: i32| {
        one::<String>(&format!(
            "SELECT string_agg(workflow, ',' ORDER BY receipt, workflow) FROM sturdy.take('batch', max => {max})"
        ))
    };
    Spi::run(
        "SELECT sturdy.schedule(w, now() - interval '1 hour', 'batch')
           FROM unnest(ARRAY['e', 'd', 'c', 'b', 'a']) w",
    )
    .unwrap();
    assert_eq!(
        one::<i64>("SELECT count(DISTINCT visible_at) FROM sturdy.queue WHERE queue = 'batch'"),
        Some(1)
    );
    assert_eq!(take(1).as_deref(), Some("e"), "in arrival (seq) order");
    // a row at the same visible_at placed just before the floor's row
    // (e), behind take's back: the floor is exact, so a take from it
    // does not see it
    Spi::run(
        "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at, seq)
         SELECT 'batch', 'hidden', d.visible_at, now(), e.seq - 1
           FROM sturdy.queue d, sturdy.queue e
          WHERE d.queue = 'batch' AND d.workflow = 'd' AND e.queue = 'batch' AND e.workflow = 'e'",
    )
    .unwrap();
    assert_eq!(take(1).as_deref(), Some("d"), "from the floor");
    // a take that comes up short goes on from the start
    assert_eq!(take(10).as_deref(), Some("a,b,c,hidden"));
}

/// A one-row take stops at the first index entry of its queue that is
/// not yet due, without visiting its row: a queue of one ready row and
/// 500 sleeping ones costs a take a heap visit or two, not 500 (the
/// heap fetches counted through the index, in this transaction).
#[pg_test]
fn take_stops_at_the_first_entry_not_yet_due_without_visiting_it() {
    Spi::run(
        "SELECT sturdy.schedule('ready', now() - interval '1 minute', 'stops');
         SELECT sturdy.schedule('sleeps-' || i, now() + interval '1 hour', 'stops')
           FROM generate_series(1, 500) i",
    )
    .unwrap();
    let fetched = || {
        one::<i64>("SELECT pg_stat_get_xact_tuples_fetched('sturdy.queue_visible'::regclass)")
            .unwrap()
    };
    let before = fetched();
    assert_eq!(
        one::<String>("SELECT workflow FROM sturdy.take('stops')").as_deref(),
        Some("ready")
    );
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('stops')"),
        Some(0)
    );
    let visits = fetched() - before;
    assert!(
        visits < 20,
        "two takes visited {visits} rows: the sleeping ones were walked"
    );
}

/// A one-row take's scan reads a window of its queue's entries and, when
/// that closes before a row is leased, goes on after the last one: a take
/// from the start of a queue whose first 40 rows are leased (more than
/// the window) gets the 41st, the one row due.
#[pg_test]
fn take_goes_on_past_more_leased_rows_than_its_window() {
    Spi::run(
        "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at, taken_at, takes, leased_until)
         SELECT 'window', 'held-' || i, now() - interval '1 minute', now(), now(), 1,
                now() + interval '1 hour'
           FROM generate_series(1, 40) i;
         INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)
         VALUES ('window', 'free', now() - interval '1 minute', now())",
    )
    .unwrap();
    assert_eq!(
        one::<String>("SELECT workflow FROM sturdy.take('window')").as_deref(),
        Some("free")
    );
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('window')"),
        Some(0)
    );
}

#[pg_test]
fn take_writes_a_free_rows_lease_at_once_and_a_held_ones_after_the_lock() {
    Spi::run(
        "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)
         VALUES ('at-once', 'mine', now() - interval '2 minutes', now()),
                ('at-once', 'free', now() - interval '1 minute', now());
         SELECT 1 FROM sturdy.queue WHERE queue = 'at-once' AND workflow = 'mine' FOR UPDATE",
    )
    .unwrap();
    let take = || one::<String>("SELECT workflow FROM sturdy.take('at-once')");
    let before = crate::access::leased_unlocked();
    // the oldest, which this transaction holds already: leased after the
    // lock (it has it), where an update that may not wait would refuse it
    assert_eq!(take().as_deref(), Some("mine"));
    assert_eq!(crate::access::leased_unlocked(), before, "after the lock");
    assert_eq!(take().as_deref(), Some("free"));
    assert_eq!(crate::access::leased_unlocked(), before + 1, "at once");
    assert_eq!(
        one::<i64>(
            "SELECT count(*) FROM sturdy.queue
              WHERE queue = 'at-once' AND takes = 1 AND leased_until > now()"
        ),
        Some(2)
    );
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('at-once')"),
        Some(0)
    );
}

/// Rows of the last 50 ms, and one written behind take's back 70 ms
/// before now: a take gets the first, then the floor sits at it (every
/// transaction running began after it: `activity`), so the next take
/// from the floor does not walk down to the hidden row, and one that
/// comes up short finds it from the start. Where transaction starts are
/// not reported (`track_activities` off) the floor is `SLACK` (100 ms)
/// before the transaction, below the hidden row, and the next take gets
/// it.
fn recent_floor(queue: &str) -> (Option<String>, Option<String>, Option<String>) {
    let take = |max: i32| {
        one::<String>(&format!(
            "SELECT string_agg(workflow, ',' ORDER BY receipt, workflow)
               FROM sturdy.take('{queue}', max => {max})"
        ))
    };
    Spi::run(&format!(
        "SELECT sturdy.schedule('r' || i, now() - (60 - 10 * i) * interval '1 millisecond', '{queue}')
           FROM generate_series(1, 3) i"
    ))
    .unwrap();
    let first = take(1);
    Spi::run(&format!(
        "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)
         VALUES ('{queue}', 'hidden', now() - interval '70 milliseconds', now())"
    ))
    .unwrap();
    (first, take(1), take(10))
}

#[pg_test]
fn after_a_recent_row_the_floor_is_that_row_when_no_transaction_began_before_it() {
    // past the last sample of transaction starts this backend may keep
    Spi::run("SELECT pg_sleep(0.03)").unwrap();
    let (first, next, rest) = recent_floor("recent-floor");
    assert_eq!(first.as_deref(), Some("r1"), "from the start");
    assert_eq!(
        next.as_deref(),
        Some("r2"),
        "from the floor, above 'hidden'"
    );
    assert_eq!(rest.as_deref(), Some("hidden,r3"), "short: from the start");
}

#[pg_test]
fn without_transaction_starts_the_floor_is_slack_before_the_transaction() {
    Spi::run("SET LOCAL track_activities = off").unwrap();
    let (first, next, rest) = recent_floor("slack-floor");
    assert_eq!(first.as_deref(), Some("r1"), "from the start");
    assert_eq!(next.as_deref(), Some("hidden"), "from SLACK before now()");
    assert_eq!(rest.as_deref(), Some("r2,r3"));
}

#[pg_test]
fn take_scans_from_its_floor_and_a_past_dated_write_goes_back_to_the_start() {
    let take = || one::<String>("SELECT workflow FROM sturdy.take('floor')");
    Spi::run(
        "SELECT sturdy.schedule('f' || i, now() - (10 - i) * interval '1 second', 'floor')
           FROM generate_series(1, 9) i",
    )
    .unwrap();
    assert_eq!(take().as_deref(), Some("f1"));
    assert_eq!(take().as_deref(), Some("f2"));
    // a row written below the floor behind take's back (no generation
    // bump): a scan from the floor does not see it
    Spi::run(
        "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)
         VALUES ('floor', 'hidden', now() - interval '1 hour', now())",
    )
    .unwrap();
    assert_eq!(take().as_deref(), Some("f3"), "scanned from the floor");
    let generation = "SELECT last_value FROM sturdy.queue_generation";
    let before = one::<i64>(generation);
    Spi::run("SELECT sturdy.schedule('now', now(), 'floor')").unwrap();
    assert_eq!(
        one::<i64>(generation),
        before,
        "a schedule for now() bumps nothing"
    );
    Spi::run("SELECT sturdy.schedule('past', now() - interval '30 minutes', 'floor')").unwrap();
    assert_ne!(
        one::<i64>(generation),
        before,
        "a past-dated schedule bumps the generation"
    );
    assert_eq!(
        take().as_deref(),
        Some("hidden"),
        "the generation changed: from the start"
    );
    assert_eq!(take().as_deref(), Some("past"));
    Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('floor')").unwrap();
    assert_eq!(
        one::<String>("SELECT workflow FROM t").as_deref(),
        Some("f4")
    );
    assert_eq!(take().as_deref(), Some("f5"));
    assert_eq!(
        one::<bool>(
            "SELECT sturdy.wake_at(workflow, receipt, now() - interval '2 hours', 'floor') FROM t"
        ),
        Some(true)
    );
    assert_eq!(
        take().as_deref(),
        Some("f4"),
        "a past-dated wake_at: from the start"
    );
    let rest =
        one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take('floor', max => 10)");
    assert_eq!(rest.as_deref(), Some("f6,f7,f8,f9,now"));
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('floor')"),
        Some(0)
    );
}

#[pg_test]
fn queues_are_separate() {
    Spi::run("SELECT sturdy.schedule('a', now(), 'emails'); SELECT sturdy.schedule('a', now(), 'reports');").unwrap();
    assert_eq!(
        count("sturdy.queue"),
        2,
        "one workflow may wait in several queues"
    );
    assert_eq!(
        one::<String>("SELECT workflow FROM sturdy.take('emails')").as_deref(),
        Some("a")
    );
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('emails')"),
        Some(0)
    );
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('reports')"),
        Some(1)
    );
}

/// The generation's sequence is found by OID once per backend: dropped,
/// takes scan from the start (as in a schema of a released version);
/// re-created under a new OID, it is found again.
#[pg_test]
fn take_finds_its_generation_again_after_the_sequence_is_re_created() {
    let take = || one::<String>("SELECT workflow FROM sturdy.take('regen')");
    Spi::run(
        "SELECT sturdy.schedule('r' || i, now() - (10 - i) * interval '1 second', 'regen')
           FROM generate_series(1, 5) i",
    )
    .unwrap();
    assert_eq!(take().as_deref(), Some("r1"));
    Spi::run(
        "ALTER EXTENSION pg_sturdy DROP SEQUENCE sturdy.queue_generation;
         DROP SEQUENCE sturdy.queue_generation",
    )
    .unwrap();
    let hidden = "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)
                  VALUES ('regen', $1, now() - interval '1 hour', now())";
    Spi::run_with_args(hidden, &["hidden-1".into()]).unwrap();
    assert_eq!(
        take().as_deref(),
        Some("hidden-1"),
        "no generation: from the start"
    );
    Spi::run(
        "CREATE SEQUENCE sturdy.queue_generation;
         SELECT nextval('sturdy.queue_generation')",
    )
    .unwrap();
    assert_eq!(take().as_deref(), Some("r2"), "from the start");
    assert_eq!(take().as_deref(), Some("r3"), "from the floor");
    Spi::run_with_args(hidden, &["hidden-2".into()]).unwrap();
    assert_eq!(
        take().as_deref(),
        Some("r4"),
        "the new sequence is read: its generation holds, from the floor"
    );
    Spi::run("SELECT nextval('sturdy.queue_generation')").unwrap();
    assert_eq!(
        take().as_deref(),
        Some("hidden-2"),
        "a bump of the new sequence: from the start"
    );
}

#[pg_test]
fn done_needs_the_current_receipt() {
    Spi::run("SELECT sturdy.schedule('d1', now() - interval '1 second')").unwrap();
    Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take()").unwrap();
    assert_eq!(
        one::<bool>("SELECT sturdy.done(workflow, receipt - interval '1 us') FROM t"),
        Some(false)
    );
    assert_eq!(
        one::<bool>("SELECT sturdy.done(workflow, receipt) FROM t"),
        Some(true)
    );
    assert_eq!(count("sturdy.queue"), 0);
    assert_eq!(
        one::<bool>("SELECT sturdy.done(workflow, receipt) FROM t"),
        Some(false)
    );
}

/// A trigger on `sturdy.queue` (an audit, a foreign key to it) that
/// notes the workflow of each row `event` (`DELETE`, `UPDATE`) touches,
/// as its `row` (`OLD`, `NEW`) has it, in the temporary table `noted`;
/// dropped with `DROP TRIGGER noted ON sturdy.queue`.
fn note_rows(event: &str, row: &str) {
    Spi::run(&format!(
        "CREATE TEMP TABLE noted (workflow text);
         CREATE FUNCTION pg_temp.note_row() RETURNS trigger LANGUAGE plpgsql AS
           $f$BEGIN INSERT INTO noted VALUES ({row}.workflow); RETURN {row}; END$f$;
         CREATE TRIGGER noted AFTER {event} ON sturdy.queue
           FOR EACH ROW EXECUTE FUNCTION pg_temp.note_row();"
    ))
    .unwrap();
}

#[pg_test]
fn done_deletes_by_key_without_a_statement_and_with_one_where_a_trigger_must_fire() {
    let served = crate::access::served;
    Spi::run(
        "SELECT sturdy.schedule(w, now() - interval '1 second') FROM unnest(array['k1', 'k2', 'k3']) w;
         CREATE TEMP TABLE t AS SELECT * FROM sturdy.take(max => 3);",
    )
    .unwrap();
    let before = served();
    assert_eq!(
        one::<bool>("SELECT sturdy.done(workflow, receipt) FROM t WHERE workflow = 'k1'"),
        Some(true)
    );
    assert_eq!(served(), before + 1, "by key, without a statement");
    assert_eq!(
        one::<bool>(
            "SELECT sturdy.done(workflow, receipt + interval '1 us') FROM t WHERE workflow = 'k2'"
        ),
        Some(false),
        "the receipt rule holds that way too"
    );
    assert_eq!(served(), before + 2);
    // a trigger on the queue (an audit, a foreign key to it) must fire:
    // the statement, which fires it
    note_rows("DELETE", "OLD");
    assert_eq!(
        one::<bool>("SELECT sturdy.done(workflow, receipt) FROM t WHERE workflow = 'k2'"),
        Some(true)
    );
    assert_eq!(served(), before + 2, "through the statement");
    assert_eq!(
        one::<String>("SELECT string_agg(workflow, ',') FROM noted").as_deref(),
        Some("k2")
    );
    Spi::run("DROP TRIGGER noted ON sturdy.queue").unwrap();
    assert_eq!(
        one::<bool>("SELECT sturdy.done(workflow, receipt) FROM t WHERE workflow = 'k3'"),
        Some(true)
    );
    assert_eq!(
        served(),
        before + 3,
        "without it again once the trigger is gone"
    );
    assert_eq!(count("sturdy.queue"), 0);
}

#[pg_test]
fn a_one_row_take_leases_without_a_statement_and_with_one_where_a_trigger_must_fire() {
    let served = crate::access::served;
    Spi::run(
        "SELECT sturdy.schedule('t1', now() - interval '2 seconds');
         SELECT sturdy.schedule('t2', now() - interval '1 second');",
    )
    .unwrap();
    let before = served();
    assert_eq!(
        one::<String>("SELECT workflow FROM sturdy.take()").as_deref(),
        Some("t1")
    );
    assert_eq!(served(), before + 1, "leased without a statement");
    assert_eq!(
        one::<bool>(
            "SELECT leased_until = now() + interval '1 minute' AND taken_at = now() AND takes = 1
                    AND visible_at = now() - interval '2 seconds' AND scheduled_at = now()
               FROM sturdy.queue WHERE workflow = 't1'"
        ),
        Some(true),
        "the lease written as the statement writes it, the rest kept"
    );
    note_rows("UPDATE", "NEW");
    assert_eq!(
        one::<String>("SELECT workflow FROM sturdy.take()").as_deref(),
        Some("t2")
    );
    assert_eq!(
        served(),
        before + 1,
        "through the statement, which fires the trigger"
    );
    assert_eq!(
        one::<String>("SELECT string_agg(workflow, ',') FROM noted").as_deref(),
        Some("t2")
    );
    Spi::run("DROP TRIGGER noted ON sturdy.queue").unwrap();
    assert_eq!(one::<i64>("SELECT count(*) FROM sturdy.take()"), Some(0));
    assert!(served() > before + 1, "without it again");
    Spi::run("SELECT sturdy.schedule('t3', now() - interval '1 second')").unwrap();
    assert_eq!(
        one::<String>("SELECT workflow || ':' || (token IS NULL) FROM sturdy.take()")
            .as_deref(),
        Some("t3:true"),
        "a row past the last floor, found from the start; no claim, no token"
    );
}

/// A schedule inserts before it looks (one descent of the primary key)
/// once at most four of its backend's last 32 upserts into the queue
/// found a row (access/insert.rs, `FOUND_AT_MOST`); where its key's row is there
/// after all, the key's check sends it to that row, which it updates as a
/// look would have; and enough rows found turn it back to looking first.
#[pg_test]
fn a_schedule_among_new_keys_inserts_first_and_still_updates_the_row_there() {
    let blind = || crate::access::INSERTED_FIRST.with(|n| n.get());
    let schedule = |w: &str, hours: i32| {
        Spi::run(&format!(
            "SELECT sturdy.schedule('{w}', now() + interval '{hours} hours', 'blind')"
        ))
        .unwrap()
    };
    let new_keys = |tag: &str, n: usize| {
        for i in 0..n {
            schedule(&format!("b-{tag}-{i}"), 1);
        }
    };
    schedule("b-a", 1);
    let seq = one::<i64>("SELECT seq FROM sturdy.queue WHERE workflow = 'b-a'");
    // five rows found in a row: this backend looks first from here
    for _ in 0..5 {
        schedule("b-a", 2);
    }
    let (tried, missed) = blind();
    new_keys("look", 28);
    assert_eq!(
        blind(),
        (tried, missed),
        "while five of the last 32 found a row, each looked first"
    );
    new_keys("first", 1);
    assert_eq!(blind(), (tried + 1, missed), "four of 32: inserted first");
    for hours in 3..8 {
        schedule("b-a", hours);
    }
    assert_eq!(
        blind(),
        (tried + 6, missed + 5),
        "five inserted first, each met the row there"
    );
    assert_eq!(
        one::<String>(
            "SELECT concat_ws(':', count(*), min(visible_at - now()), min(seq))
               FROM sturdy.queue WHERE queue = 'blind' AND workflow = 'b-a'"
        ),
        Some(format!("1:07:00:00:{}", seq.unwrap())),
        "one row, updated in place (its seq kept)"
    );
    assert_eq!(count("sturdy.queue WHERE queue = 'blind'"), 30);
    new_keys("last", 1);
    assert_eq!(
        blind(),
        (tried + 6, missed + 5),
        "five found again: looks first"
    );
}

#[pg_test]
fn schedule_upserts_without_a_statement_and_with_one_where_the_table_asks_for_more() {
    let served = crate::access::served;
    let row = |w: &str| {
        one::<String>(&format!(
            "SELECT concat_ws(':', visible_at - now(), taken_at IS NULL, takes, leased_until IS NULL,
                              scheduled_at = now(), seq)
               FROM sturdy.queue WHERE queue = 'ups' AND workflow = '{w}'"
        ))
        .unwrap_or_default()
    };
    let before = served();
    Spi::run("SELECT sturdy.schedule('u1', now() - interval '1 second', 'ups')").unwrap();
    assert_eq!(served(), before + 1, "inserted without a statement");
    let seq = one::<i64>("SELECT last_value FROM sturdy.queue_seq").unwrap();
    assert_eq!(
        row("u1"),
        format!("-00:00:01:t:0:t:t:{seq}"),
        "the row the statement inserts: takes and seq by their defaults"
    );
    Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('ups')").unwrap();
    Spi::run("SELECT sturdy.schedule('u1', now() + interval '1 hour', 'ups')").unwrap();
    assert_eq!(served(), before + 3, "updated without a statement");
    assert_eq!(
        row("u1"),
        format!("01:00:00:t:1:f:t:{seq}"),
        "woken: the lease kept for the pass, takes and the place's seq kept"
    );
    assert_eq!(
        one::<bool>("SELECT sturdy.done(workflow, receipt, 'ups') FROM t"),
        Some(false),
        "the wakeup outlives the pass"
    );
    assert_eq!(
        row("u1"),
        format!("01:00:00:t:1:t:t:{seq}"),
        "the pass over: its lease cleared, the row due at the wakeup's time"
    );
    // a column of the user's own with a default: the statement gives it
    Spi::run("ALTER TABLE sturdy.queue ADD COLUMN note text DEFAULT 'given'").unwrap();
    let before = served();
    Spi::run("SELECT sturdy.schedule('u2', now(), 'ups')").unwrap();
    assert_eq!(served(), before, "through the statement");
    assert_eq!(
        one::<String>("SELECT note FROM sturdy.queue WHERE workflow = 'u2'").as_deref(),
        Some("given")
    );
    // dropped, it is NULL in every new row: no statement needed
    Spi::run("ALTER TABLE sturdy.queue DROP COLUMN note").unwrap();
    Spi::run("SELECT sturdy.schedule('u3', now(), 'ups')").unwrap();
    assert_eq!(served(), before + 1, "without a statement again");
    // a default of ours changed: the statement gives the new one
    Spi::run("ALTER TABLE sturdy.queue ALTER COLUMN takes SET DEFAULT 7").unwrap();
    Spi::run("SELECT sturdy.schedule('u4', now(), 'ups')").unwrap();
    assert_eq!(served(), before + 1);
    assert_eq!(
        one::<i32>("SELECT takes FROM sturdy.queue WHERE workflow = 'u4'"),
        Some(7)
    );
    Spi::run("ALTER TABLE sturdy.queue ALTER COLUMN takes SET DEFAULT 0").unwrap();
    // a CHECK constraint or a NOT NULL on a column the row leaves NULL:
    // the statement, which enforces it
    Spi::run("ALTER TABLE sturdy.queue ADD CONSTRAINT short CHECK (length(workflow) < 4)")
        .unwrap();
    assert_eq!(
        sqlstate_of("SELECT sturdy.schedule('too long', now(), 'ups')"),
        "23514"
    );
    Spi::run("ALTER TABLE sturdy.queue DROP CONSTRAINT short").unwrap();
    Spi::run(
        "UPDATE sturdy.queue SET taken_at = now();
         ALTER TABLE sturdy.queue ALTER COLUMN taken_at SET NOT NULL",
    )
    .unwrap();
    assert_eq!(
        sqlstate_of("SELECT sturdy.schedule('u5', now(), 'ups')"),
        "23502"
    );
    Spi::run("ALTER TABLE sturdy.queue ALTER COLUMN taken_at DROP NOT NULL").unwrap();
    // another unique index: an arbiter of the statement's own choosing
    Spi::run("CREATE UNIQUE INDEX queue_seq_unique ON sturdy.queue (seq)").unwrap();
    Spi::run("SELECT sturdy.schedule('u6', now(), 'ups')").unwrap();
    Spi::run("DROP INDEX sturdy.queue_seq_unique").unwrap();
    // a trigger: the statement, which fires it
    note_rows("INSERT OR UPDATE", "NEW");
    Spi::run("SELECT sturdy.schedule('u7', now(), 'ups'); SELECT sturdy.schedule('u7', now(), 'ups');")
        .unwrap();
    assert_eq!(
        one::<String>("SELECT string_agg(workflow, ',') FROM noted").as_deref(),
        Some("u7,u7")
    );
    Spi::run("DROP TRIGGER noted ON sturdy.queue").unwrap();
    assert_eq!(served(), before + 1, "all through the statement");
    Spi::run("SELECT sturdy.schedule('u8', now(), 'ups')").unwrap();
    assert_eq!(
        served(),
        before + 2,
        "and without it once the table is ours again"
    );
    assert_eq!(
        one::<String>(
            "SELECT string_agg(workflow, ',' ORDER BY workflow) FROM sturdy.queue WHERE queue = 'ups'"
        )
        .as_deref(),
        Some("u1,u2,u3,u4,u6,u7,u8")
    );
}

#[pg_test]
fn take_and_done_follow_changes_to_the_queue_table_they_do_not_know() {
    let served = crate::access::served;
    Spi::run(
        "SELECT sturdy.schedule(w, now() - interval '1 second', 'alt')
           FROM unnest(array['x1', 'x2', 'x3']) w;",
    )
    .unwrap();
    // an index with an expression: the statement, which maintains it
    Spi::run("CREATE INDEX queue_lower ON sturdy.queue (lower(workflow))").unwrap();
    let before = served();
    assert_eq!(
        one::<String>("SELECT workflow FROM sturdy.take('alt')").as_deref(),
        Some("x1")
    );
    assert_eq!(
        served(),
        before,
        "through the statement while the index is there"
    );
    Spi::run("DROP INDEX sturdy.queue_lower").unwrap();
    // a column of the user's own: kept through the lease, the row still
    // leased without a statement
    Spi::run("ALTER TABLE sturdy.queue ADD COLUMN note text DEFAULT 'kept'").unwrap();
    assert_eq!(
        one::<String>("SELECT workflow FROM sturdy.take('alt')").as_deref(),
        Some("x2")
    );
    assert_eq!(served(), before + 1, "without a statement again");
    assert_eq!(
        one::<String>(
            "SELECT string_agg(workflow || '=' || note || ':' || takes, ',' ORDER BY workflow)
               FROM sturdy.queue WHERE queue = 'alt'"
        )
        .as_deref(),
        Some("x1=kept:1,x2=kept:1,x3=kept:0")
    );
    assert_eq!(
        one::<bool>(
            "SELECT sturdy.done(workflow, leased_until, 'alt') FROM sturdy.queue
              WHERE queue = 'alt' AND workflow = 'x2'"
        ),
        Some(true)
    );
    assert_eq!(served(), before + 2);
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.queue WHERE queue = 'alt'"),
        Some(2)
    );
    // a table inheriting from the queue: statements reach its rows, so
    // the statements run
    Spi::run(
        "CREATE TEMP TABLE kid () INHERITS (sturdy.queue);
         INSERT INTO kid (queue, workflow, visible_at, scheduled_at)
         VALUES ('alt', 'x4', now() - interval '1 second', now());",
    )
    .unwrap();
    assert_eq!(
        one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take('alt', max => 1)")
            .as_deref(),
        Some("x3")
    );
    assert_eq!(
        one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take('alt', max => 1)")
            .as_deref(),
        Some("x4"),
        "the inheriting table's row, as the statement finds it"
    );
    assert_eq!(
        one::<bool>(
            "SELECT sturdy.done(workflow, leased_until, 'alt') FROM kid WHERE workflow = 'x4'"
        ),
        Some(true)
    );
    assert_eq!(served(), before + 2, "all three through the statements");
    assert_eq!(one::<i64>("SELECT count(*) FROM kid"), Some(0));
}

#[pg_test]
fn a_take_that_cannot_lease_in_place_indexes_the_new_version() {
    let served = crate::access::served;
    // rows of ~580 bytes filling fresh pages (a new, empty file: nothing
    // on them to prune): a leased version (16 bytes more) fits on none
    // of them, so the update cannot be HOT
    Spi::run(
        "CREATE EXTENSION IF NOT EXISTS amcheck;
         TRUNCATE sturdy.queue;
         ALTER TABLE sturdy.queue SET (fillfactor = 100);
         SELECT sturdy.schedule('nohot-' || lpad(i::text, 3, '0') || repeat('x', 500),
                                now() - interval '1 second', 'nohot')
           FROM generate_series(1, 60) i;",
    )
    .unwrap();
    let first =
        "SELECT (ctid::text::point)[0] FROM sturdy.queue WHERE workflow LIKE 'nohot-001%'";
    let page = one::<f64>(first);
    let before = served();
    assert_eq!(
        one::<bool>("SELECT workflow LIKE 'nohot-001%' FROM sturdy.take('nohot')"),
        Some(true)
    );
    assert_eq!(served(), before + 1, "leased without a statement");
    assert_ne!(
        one::<f64>(first),
        page,
        "the new version went to another page"
    );
    assert_eq!(
        one::<i64>(
            "SELECT pg_stat_get_xact_tuples_updated('sturdy.queue'::regclass)
                  - pg_stat_get_xact_tuples_hot_updated('sturdy.queue'::regclass)"
        ),
        Some(1),
        "one update, not HOT"
    );
    Spi::run("SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off").unwrap();
    assert_eq!(
        one::<bool>(
            "SELECT leased_until IS NOT NULL FROM sturdy.queue
              WHERE queue = 'nohot' AND workflow = (SELECT workflow FROM sturdy.queue
                                                     WHERE workflow LIKE 'nohot-001%')"
        ),
        Some(true),
        "the primary key finds the new version"
    );
    assert_eq!(
        one::<i64>(
            "SELECT count(*) FROM sturdy.queue WHERE queue = 'nohot' AND visible_at <= now()"
        ),
        Some(60),
        "and so does take's index"
    );
    Spi::run(
        "SELECT bt_index_check('sturdy.queue_pkey', true), bt_index_check('sturdy.queue_visible', true)",
    )
    .unwrap();
    assert_eq!(
        one::<bool>(
            "SELECT sturdy.done(workflow, leased_until, 'nohot') FROM sturdy.queue
              WHERE workflow LIKE 'nohot-001%'"
        ),
        Some(true)
    );
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.queue WHERE queue = 'nohot'"),
        Some(59)
    );
}

#[pg_test]
fn a_role_given_grant_usage_takes_and_finishes_without_statements() {
    let served = crate::access::served;
    Spi::run(
        "CREATE ROLE sturdy_test_worker;
         SELECT sturdy.grant_usage('sturdy_test_worker');
         SET LOCAL ROLE sturdy_test_worker;
         SELECT sturdy.schedule('g1', now() - interval '1 second', 'granted');",
    )
    .unwrap();
    let before = served();
    Spi::run("CREATE TEMP TABLE got AS SELECT * FROM sturdy.take('granted', claim => true)")
        .unwrap();
    let leased = served();
    assert!(leased > before, "the lease without a statement");
    assert_eq!(
        one::<bool>("SELECT sturdy.done(workflow, receipt, 'granted') FROM got"),
        Some(true)
    );
    assert_eq!(served(), leased + 1, "the delete without a statement");
    assert_eq!(
        one::<i64>("SELECT token FROM sturdy.claims WHERE workflow = 'g1'"),
        Some(1),
        "and the claim, by its statement"
    );
    Spi::run("RESET ROLE").unwrap();
}

#[pg_test]
fn done_is_refused_as_its_delete_is_without_the_privilege_or_in_a_read_only_transaction() {
    Spi::run(
        "SELECT sturdy.schedule('ro', now() - interval '1 second');
         CREATE TEMP TABLE t AS SELECT * FROM sturdy.take();
         GRANT SELECT ON t TO PUBLIC;
         CREATE ROLE sturdy_test_reader;
         GRANT USAGE ON SCHEMA sturdy TO sturdy_test_reader;
         GRANT EXECUTE ON FUNCTION sturdy.done(text, timestamptz, text) TO sturdy_test_reader;
         GRANT SELECT ON sturdy.queue TO sturdy_test_reader;",
    )
    .unwrap();
    let done = "SELECT sturdy.done(workflow, receipt) FROM pg_temp.t";
    Spi::run("SET LOCAL ROLE sturdy_test_reader").unwrap();
    assert_eq!(sqlstate_of(done), "42501", "no DELETE on sturdy.queue");
    Spi::run(
        "RESET ROLE;
         REVOKE SELECT ON sturdy.queue FROM sturdy_test_reader;
         GRANT DELETE ON sturdy.queue TO sturdy_test_reader;
         SET LOCAL ROLE sturdy_test_reader;",
    )
    .unwrap();
    assert_eq!(
        sqlstate_of(done),
        "42501",
        "DELETE, but no SELECT on the columns it tests"
    );
    Spi::run("RESET ROLE").unwrap();
    Spi::run("SET LOCAL transaction_read_only = on").unwrap();
    assert_eq!(sqlstate_of(done), "25006");
    assert_eq!(count("sturdy.queue"), 1, "nothing removed");
}

#[pg_test]
fn a_privilege_comes_and_goes_with_the_grant_or_the_membership_that_gives_it() {
    let served = crate::access::served;
    Spi::run(
        "SELECT sturdy.schedule(w, now() - interval '1 second') FROM unnest(array['m1', 'm2', 'm3']) w;
         CREATE TEMP TABLE t AS SELECT * FROM sturdy.take(max => 3);
         GRANT SELECT ON t TO PUBLIC;
         CREATE ROLE sturdy_test_member;
         CREATE ROLE sturdy_test_deleter;
         GRANT USAGE ON SCHEMA sturdy TO sturdy_test_member;
         GRANT EXECUTE ON FUNCTION sturdy.done(text, timestamptz, text) TO sturdy_test_member;
         GRANT SELECT ON sturdy.queue TO sturdy_test_member;
         GRANT DELETE ON sturdy.queue TO sturdy_test_deleter;",
    )
    .unwrap();
    let done = |w: &str| {
        format!("SELECT sturdy.done(workflow, receipt) FROM pg_temp.t WHERE workflow = '{w}'")
    };
    Spi::run("SET LOCAL ROLE sturdy_test_member").unwrap();
    assert_eq!(sqlstate_of(&done("m1")), "42501", "no DELETE yet");
    // a membership that gives DELETE: found at once
    Spi::run("RESET ROLE; GRANT sturdy_test_deleter TO sturdy_test_member; SET LOCAL ROLE sturdy_test_member")
        .unwrap();
    let before = served();
    assert_eq!(one::<bool>(&done("m1")), Some(true));
    assert_eq!(
        served(),
        before + 1,
        "through the access path, the privilege found"
    );
    // the membership revoked: refused again, not served by what was known
    Spi::run("RESET ROLE; REVOKE sturdy_test_deleter FROM sturdy_test_member; SET LOCAL ROLE sturdy_test_member")
        .unwrap();
    assert_eq!(sqlstate_of(&done("m2")), "42501", "the membership is gone");
    // a grant to the role itself, then its revoke
    Spi::run("RESET ROLE; GRANT DELETE ON sturdy.queue TO sturdy_test_member; SET LOCAL ROLE sturdy_test_member")
        .unwrap();
    assert_eq!(one::<bool>(&done("m2")), Some(true));
    assert_eq!(served(), before + 2);
    Spi::run("RESET ROLE; REVOKE DELETE ON sturdy.queue FROM sturdy_test_member; SET LOCAL ROLE sturdy_test_member")
        .unwrap();
    assert_eq!(sqlstate_of(&done("m3")), "42501", "the grant is gone");
    Spi::run("RESET ROLE").unwrap();
    assert_eq!(count("sturdy.queue"), 1, "m3 still queued");
}

#[pg_test]
fn a_schedule_during_a_pass_survives_done() {
    Spi::run("SELECT sturdy.schedule('d2', now() - interval '1 second')").unwrap();
    Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take()").unwrap();
    Spi::run("SELECT sturdy.schedule('d2')").unwrap();
    assert_eq!(
        one::<bool>("SELECT sturdy.done(workflow, receipt) FROM t"),
        Some(false)
    );
    assert_eq!(
        one::<bool>(
            "SELECT visible_at <= now() AND leased_until IS NULL FROM sturdy.queue WHERE workflow = 'd2'"
        ),
        Some(true),
        "ready again, the lease forgotten"
    );
}

#[pg_test]
fn wake_at_suspends_under_the_receipt_rule() {
    Spi::run("SELECT sturdy.schedule('s1', now() - interval '1 second')").unwrap();
    Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take()").unwrap();
    assert_eq!(
        one::<bool>(
            "SELECT sturdy.wake_at(workflow, receipt, now() + interval '1 day') FROM t"
        ),
        Some(true)
    );
    let sleeping = one::<String>(
        "SELECT format('%s/%s/%s', ready, leased, sleeping) FROM sturdy.queue_stats",
    );
    assert_eq!(sleeping.as_deref(), Some("0/0/1"));
    // the receipt is spent: a second wake_at with it changes nothing
    assert_eq!(
        one::<bool>("SELECT sturdy.wake_at(workflow, receipt, now()) FROM t"),
        Some(false)
    );
}

#[pg_test]
fn take_with_claim_claims_each_row_for_the_lease() {
    Spi::run(
        "SELECT sturdy.schedule('c1', now() - interval '2 seconds');
         SELECT sturdy.schedule('c2', now() - interval '1 second');
         SELECT sturdy.claim('c2', '1 hour', 'someone');",
    )
    .unwrap();
    let rows = one::<String>(
        "SELECT string_agg(workflow || ':' || coalesce(token::text, 'held'), ',') FROM sturdy.take(max => 5, claim => true)",
    );
    assert_eq!(rows.as_deref(), Some("c1:1,c2:held"));
    let held = one::<bool>(
        "SELECT held_until = now() + interval '1 minute' FROM sturdy.claims WHERE workflow = 'c1'",
    );
    assert_eq!(held, Some(true));
}

#[pg_test]
fn take_one_with_claim_claims_it_or_says_it_is_held() {
    Spi::run(
        "SELECT sturdy.schedule('o1', now() - interval '2 seconds');
         SELECT sturdy.schedule('o2', now() - interval '1 second');
         SELECT sturdy.claim('o2', '1 hour', 'someone');",
    )
    .unwrap();
    let first = one::<String>(
        "SELECT workflow || ':' || coalesce(token::text, 'held') FROM sturdy.take(claim => true)",
    );
    assert_eq!(first.as_deref(), Some("o1:1"));
    let second = one::<String>(
        "SELECT workflow || ':' || coalesce(token::text, 'held') FROM sturdy.take(claim => true)",
    );
    assert_eq!(
        second.as_deref(),
        Some("o2:held"),
        "still taken (leased), but not claimed"
    );
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take(claim => true)"),
        Some(0)
    );
    let leased = one::<i64>("SELECT count(*) FROM sturdy.queue WHERE taken_at IS NOT NULL");
    assert_eq!(leased, Some(2));
}

#[pg_test]
fn arrive_supplies_and_schedules_together() {
    let v =
        one::<String>("SELECT sturdy.arrive('a1', 'approval', '\"yes\"', 'approvals')::text");
    assert_eq!(v.as_deref(), Some("\"yes\""));
    assert_eq!(
        one::<String>("SELECT workflow FROM sturdy.take('approvals')").as_deref(),
        Some("a1")
    );
    let again =
        one::<String>("SELECT sturdy.arrive('a1', 'approval', '\"no\"', 'approvals')::text");
    assert_eq!(
        again.as_deref(),
        Some("\"yes\""),
        "first writer wins, and the wakeup still lands"
    );
    assert_eq!(
        one::<String>("SELECT format('%s/%s', ready, leased) FROM sturdy.queue_stats WHERE queue = 'approvals'")
            .as_deref(),
        Some("0/1"),
        "landed on the pass: its lease kept, no second pass beside it"
    );
    assert_eq!(
        one::<bool>(
            "SELECT sturdy.done('a1', (SELECT leased_until FROM sturdy.queue WHERE workflow = 'a1'), 'approvals')"
        ),
        Some(false),
        "the pass's done declines"
    );
    assert_eq!(
        one::<String>("SELECT format('%s/%s', ready, leased) FROM sturdy.queue_stats WHERE queue = 'approvals'")
            .as_deref(),
        Some("1/0"),
        "and leaves the row ready for the wakeup"
    );
}

#[pg_test]
fn queue_stats_tells_ready_leased_and_sleeping_apart() {
    Spi::run(
        "SELECT sturdy.schedule('r1', now() - interval '10 seconds', 'q');
         SELECT sturdy.schedule('r2', now() - interval '5 seconds', 'q');
         SELECT sturdy.schedule('s1', now() + interval '1 hour', 'q');
         SELECT sturdy.take('q');",
    )
    .unwrap();
    let stats = one::<String>(
        "SELECT format('%s/%s/%s/%s', ready, leased, sleeping, oldest_ready_age) FROM sturdy.queue_stats WHERE queue = 'q'",
    );
    assert_eq!(stats.as_deref(), Some("1/1/1/00:00:05"));
}

#[pg_test]
fn queue_bad_arguments_are_refused_and_write_nothing() {
    for (sql, state) in [
        ("SELECT sturdy.schedule(NULL)", "22004"),
        ("SELECT sturdy.schedule('')", "22023"),
        ("SELECT sturdy.schedule('w', NULL)", "22004"),
        ("SELECT sturdy.schedule('w', now(), '')", "22023"),
        ("SELECT sturdy.schedule('w', now(), NULL)", "22004"),
        ("SELECT * FROM sturdy.take('')", "22023"),
        ("SELECT * FROM sturdy.take('q', '0 s')", "22023"),
        (
            "SELECT * FROM sturdy.take('q', '-12 mons 360 days 00:00:01')",
            "22023",
        ),
        ("SELECT * FROM sturdy.take('q', NULL)", "22004"),
        ("SELECT * FROM sturdy.take('q', '1 minute', 0)", "22023"),
        ("SELECT * FROM sturdy.take('q', '1 minute', -3)", "22023"),
        ("SELECT * FROM sturdy.take('q', '1 minute', NULL)", "22004"),
        (
            "SELECT * FROM sturdy.take('q', '1 minute', 1, NULL)",
            "22004",
        ),
        ("SELECT sturdy.done('w', NULL::timestamptz)", "22004"),
        ("SELECT sturdy.done('', now())", "22023"),
        ("SELECT sturdy.wake_at('w', now(), NULL)", "22004"),
        ("SELECT sturdy.wake_at('w', NULL, now())", "22004"),
        ("SELECT sturdy.arrive('w', 's', NULL)", "22004"),
        ("SELECT sturdy.arrive('w', '', '1')", "22023"),
        ("SELECT sturdy.arrive('w', 's', '1', '')", "22023"),
    ] {
        assert_eq!(sqlstate_of(sql), state, "{sql}");
    }
    assert_eq!(count("sturdy.queue"), 0);
    assert_eq!(count("sturdy.checkpoints"), 0);
}

#[pg_test]
fn done_for_a_batch_removes_the_rows_whose_receipts_match() {
    Spi::run(
        "SELECT sturdy.schedule('b' || i, now() - i * interval '1 second', 'batch') FROM generate_series(1, 5) i;
         CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('batch', max => 5);
         SELECT sturdy.schedule('b3', now(), 'batch');",
    )
    .unwrap();
    // b3 was rescheduled during the pass: it stays; a NULL pair matches nothing
    let removed = one::<i64>(
        "SELECT sturdy.done_many(array_agg(workflow) || NULL::text, array_agg(receipt) || NULL::timestamptz, 'batch') FROM t",
    );
    assert_eq!(removed, Some(4));
    assert_eq!(
        one::<String>(
            "SELECT string_agg(workflow, ',') FROM sturdy.queue WHERE queue = 'batch'"
        )
        .as_deref(),
        Some("b3")
    );
    assert_eq!(
        one::<i64>("SELECT sturdy.done_many('{}', '{}', 'batch')"),
        Some(0)
    );
    // one done of each name: literals need no cast
    assert_eq!(
        one::<bool>("SELECT sturdy.done('b3', '2000-01-01', 'batch')"),
        Some(false)
    );
}

#[pg_test]
fn done_for_a_batch_of_this_backends_take_removes_exactly_those_rows() {
    Spi::run(
        "SELECT sturdy.schedule('l' || i, now() - i * interval '1 second', 'leased') FROM generate_series(1, 6) i;
         CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('leased', max => 6);",
    )
    .unwrap();
    // another queue's done finds none of them
    assert_eq!(
        one::<i64>(
            "SELECT sturdy.done_many(array_agg(workflow), array_agg(receipt), 'other') FROM t"
        ),
        Some(0)
    );
    let by_tid = || super::BY_TID.with(|n| n.get());
    let before = by_tid();
    // a part of the batch, out of order, one pair twice
    let part = one::<i64>(
        "SELECT sturdy.done_many(array_agg(workflow ORDER BY workflow DESC) || 'l2'::text,
                            array_agg(receipt ORDER BY workflow DESC) || (SELECT receipt FROM t WHERE workflow = 'l2'), 'leased')
           FROM t WHERE workflow IN ('l1', 'l2', 'l5')",
    );
    assert_eq!(part, Some(3));
    assert_eq!(by_tid(), before + 1, "by tuple id");
    assert_eq!(
        one::<i64>(
            "SELECT sturdy.done_many(array_agg(workflow), array_agg(receipt), 'leased') FROM t WHERE workflow IN ('l1', 'l2')"
        ),
        Some(0),
        "already removed"
    );
    assert_eq!(by_tid(), before + 2);
    // l3's version moved without its receipt changing: its tuple id finds
    // the dead version, and the receipt rule by key removes it
    Spi::run(
        "UPDATE sturdy.queue SET takes = takes WHERE queue = 'leased' AND workflow = 'l3'",
    )
    .unwrap();
    assert_eq!(
        one::<i64>(
            "SELECT sturdy.done_many(array_agg(workflow), array_agg(receipt), 'leased') FROM t"
        ),
        Some(3),
        "l3, l4, l6"
    );
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.queue WHERE queue = 'leased'"),
        Some(0)
    );
}

#[pg_test]
fn done_for_a_batch_from_an_older_take_goes_by_key() {
    Spi::run(
        "SELECT sturdy.schedule('o' || i, now() - i * interval '1 second', 'older') FROM generate_series(1, 4) i;
         CREATE TEMP TABLE first AS SELECT * FROM sturdy.take('older', max => 2);
         CREATE TEMP TABLE second AS SELECT * FROM sturdy.take('older', max => 2);",
    )
    .unwrap();
    // this backend remembers only the second take; the first's rows go by key
    let by_tid = || super::BY_TID.with(|n| n.get());
    let before = by_tid();
    assert_eq!(
        one::<i64>(
            "SELECT sturdy.done_many(array_agg(workflow), array_agg(receipt), 'older') FROM first"
        ),
        Some(2)
    );
    let left = || {
        one::<String>(
            "SELECT string_agg(q.workflow, ',' ORDER BY q.workflow) FROM sturdy.queue q WHERE q.queue = 'older'",
        )
    };
    assert_eq!(
        left(),
        one::<String>("SELECT string_agg(workflow, ',' ORDER BY workflow) FROM second"),
        "the first take's rows went, the second's stay"
    );
    assert_eq!(
        one::<i64>(
            "SELECT sturdy.done_many(array_agg(workflow), array_agg(receipt), 'older')
               FROM (SELECT * FROM first UNION ALL SELECT * FROM second) b"
        ),
        Some(2),
        "a mix of both takes: the second's remain"
    );
    assert_eq!(left(), None, "every row gone");
    assert_eq!(by_tid(), before, "both by key");
}

/// A `done` of the row this backend's last one-row take leased goes
/// straight to the version that take wrote; with a receipt that does not
/// match, or once the row was rescheduled or its version moved, it goes
/// by key, and the receipt rule decides as ever.
#[pg_test]
fn done_after_a_take_goes_to_the_leased_version_and_by_key_otherwise() {
    let by_tid = || super::ONE_BY_TID.with(|n| n.get());
    let left = |w: &str| {
        one::<i64>(&format!(
            "SELECT count(*) FROM sturdy.queue WHERE queue = 'tid' AND workflow = '{w}'"
        ))
    };
    Spi::run(
        "SELECT sturdy.schedule('t' || i, now() - (10 - i) * interval '1 second', 'tid')
           FROM generate_series(1, 4) i",
    )
    .unwrap();
    let take = |t: &str| {
        Spi::run(&format!(
            "CREATE TEMP TABLE {t} AS SELECT * FROM sturdy.take('tid')"
        ))
        .unwrap()
    };
    let done = |t: &str, shift: &str| {
        one::<bool>(&format!(
            "SELECT sturdy.done(workflow, receipt - interval '{shift}', 'tid') FROM {t}"
        ))
    };
    let before = by_tid();
    take("a");
    assert_eq!(done("a", "0 s"), Some(true));
    assert_eq!((by_tid(), left("t1")), (before + 1, Some(0)), "t1 by tid");
    // a receipt that does not match removes nothing; the right one then
    // still goes to the version
    take("b");
    assert_eq!(done("b", "1 s"), Some(false));
    assert_eq!((by_tid(), left("t2")), (before + 1, Some(1)));
    assert_eq!(done("b", "0 s"), Some(true));
    assert_eq!((by_tid(), left("t2")), (before + 2, Some(0)), "t2 by tid");
    // rescheduled on top of the pass: the wakeup stays
    take("c");
    Spi::run("SELECT sturdy.schedule('t3', now(), 'tid')").unwrap();
    assert_eq!(done("c", "0 s"), Some(false));
    assert_eq!((by_tid(), left("t3")), (before + 2, Some(1)), "t3 kept");
    // the version moved without its receipt changing: by key, removed
    Spi::run("DELETE FROM sturdy.queue WHERE queue = 'tid' AND workflow = 't3'").unwrap();
    take("d");
    Spi::run("UPDATE sturdy.queue SET takes = takes WHERE queue = 'tid' AND workflow = 't4'")
        .unwrap();
    assert_eq!(done("d", "0 s"), Some(true));
    assert_eq!((by_tid(), left("t4")), (before + 2, Some(0)), "t4 by key");
}

#[pg_test]
fn done_for_a_batch_refuses_bad_arrays_and_removes_nothing() {
    Spi::run("SELECT sturdy.schedule('x', now(), 'batch'); CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('batch');")
        .unwrap();
    for (sql, state) in [
        (
            "SELECT sturdy.done_many(NULL::text[], ARRAY[now()])",
            "22004",
        ),
        (
            "SELECT sturdy.done_many(ARRAY['x'], NULL::timestamptz[])",
            "22004",
        ),
        (
            "SELECT sturdy.done_many(ARRAY['x'], ARRAY[now()], NULL)",
            "22004",
        ),
        (
            "SELECT sturdy.done_many(ARRAY['x'], ARRAY[now()], '')",
            "22023",
        ),
        (
            "SELECT sturdy.done_many(ARRAY['x', 'y'], (SELECT array_agg(receipt) FROM t), 'batch')",
            "22023",
        ),
        (
            "SELECT sturdy.done_many(ARRAY[['x']], (SELECT array_agg(receipt) FROM t), 'batch')",
            "22023",
        ),
        (
            "SELECT sturdy.done_many(ARRAY['x'], ARRAY[[now()]], 'batch')",
            "22023",
        ),
    ] {
        assert_eq!(sqlstate_of(sql), state, "{sql}");
    }
    assert_eq!(count("sturdy.queue"), 1);
}

/// The wakeup rule: an empty take marks its queue as having a waiter; the
/// next schedule that makes a row ready there clears it (and notifies);
/// schedules for later, and schedules with no waiter, leave it alone.
#[pg_test]
fn an_empty_take_marks_a_waiter_and_a_ready_schedule_clears_it() {
    let marked = |q: &str| {
        one::<bool>(&format!(
            "SELECT EXISTS (SELECT FROM sturdy.queue_waiters WHERE queue = '{q}')"
        ))
    };
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('idle', max => 3)"),
        Some(0)
    );
    assert_eq!(marked("idle"), Some(true));
    Spi::run("SELECT sturdy.schedule('later', now() + interval '1 hour', 'idle')").unwrap();
    assert_eq!(
        marked("idle"),
        Some(true),
        "a schedule for later wakes nobody"
    );
    Spi::run("SELECT sturdy.schedule('now', now(), 'idle')").unwrap();
    assert_eq!(marked("idle"), Some(false));
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('idle')"),
        Some(1)
    );
    assert_eq!(
        marked("idle"),
        Some(false),
        "a take that found work marks nothing"
    );
    // wake_at with a deadline already due clears the mark like a schedule
    Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('idle2'); SELECT sturdy.schedule('w', now(), 'idle2')")
        .unwrap();
    Spi::run("DROP TABLE t; CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('idle2')")
        .unwrap();
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('idle2')"),
        Some(0)
    );
    assert_eq!(marked("idle2"), Some(true));
    assert_eq!(
        one::<bool>("SELECT sturdy.wake_at(workflow, receipt, now(), 'idle2') FROM t"),
        Some(true)
    );
    assert_eq!(marked("idle2"), Some(false));
}

/// A poller's empty take (`wake => false`) marks nothing, one row or a
/// batch, and a schedule after it clears nothing; NULL `wake` is refused
/// with 22004 before anything is taken.
#[pg_test]
fn an_empty_take_with_wake_false_marks_nothing() {
    let marked = || {
        one::<bool>("SELECT EXISTS (SELECT FROM sturdy.queue_waiters WHERE queue = 'polled')")
    };
    for max in [1, 5] {
        assert_eq!(
            one::<i64>(&format!(
                "SELECT count(*) FROM sturdy.take('polled', max => {max}, wake => false)"
            )),
            Some(0)
        );
        assert_eq!(marked(), Some(false), "max {max}");
    }
    Spi::run("SELECT sturdy.schedule('p1', now(), 'polled')").unwrap();
    assert_eq!(
        sqlstate_of("SELECT * FROM sturdy.take('polled', wake => NULL)"),
        "22004"
    );
    assert_eq!(
        one::<bool>("SELECT leased_until IS NULL FROM sturdy.queue WHERE queue = 'polled'"),
        Some(true),
        "the refused take leased nothing"
    );
    assert_eq!(
        one::<String>("SELECT workflow FROM sturdy.take('polled', wake => false)").as_deref(),
        Some("p1")
    );
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('polled')"),
        Some(0)
    );
    assert_eq!(marked(), Some(true), "the default still marks");
}

/// A row taken 2,147,483,647 times cannot be taken again: its `takes + 1`
/// raises 22003 as the statement's would, the lease not written, with or
/// without a statement (a trigger sends the take to its statement).
#[pg_test]
fn a_take_past_the_largest_takes_raises_22003_and_leases_nothing() {
    Spi::run(
        "SELECT sturdy.schedule('many', now() - interval '1 second', 'maxed');
         UPDATE sturdy.queue SET takes = 2147483647 WHERE queue = 'maxed'",
    )
    .unwrap();
    for trigger in [false, true] {
        if trigger {
            crate::testing::trigger_noop("sturdy.queue", "UPDATE");
        }
        assert_eq!(
            sqlstate_of("SELECT * FROM sturdy.take('maxed')"),
            "22003",
            "with a trigger: {trigger}"
        );
        assert_eq!(
            one::<bool>(
                "SELECT takes = 2147483647 AND leased_until IS NULL FROM sturdy.queue WHERE queue = 'maxed'"
            ),
            Some(true),
            "nothing written (with a trigger: {trigger})"
        );
    }
    Spi::run("UPDATE sturdy.queue SET takes = 0 WHERE queue = 'maxed'").unwrap();
    assert_eq!(
        one::<String>("SELECT workflow FROM sturdy.take('maxed')").as_deref(),
        Some("many")
    );
}

/// limit_queue, pause and resume refuse what they cannot use, with its
/// SQLSTATE, and write nothing.
#[pg_test]
fn flow_control_refuses_bad_limits_and_writes_nothing() {
    for (sql, state) in [
        ("SELECT sturdy.limit_queue(NULL, 3)", "22004"),
        ("SELECT sturdy.limit_queue('', 3)", "22023"),
        ("SELECT sturdy.limit_queue(repeat('q', 2000), 3)", "22023"),
        ("SELECT sturdy.pause(repeat('q', 2000))", "22023"),
        ("SELECT sturdy.limit_queue('q', 0)", "22023"),
        ("SELECT sturdy.limit_queue('q', -1)", "22023"),
        ("SELECT sturdy.limit_queue('q', per_second => 0)", "22023"),
        ("SELECT sturdy.limit_queue('q', per_second => -5)", "22023"),
        ("SELECT sturdy.limit_queue('q', per_second => 'NaN')", "22023"),
        ("SELECT sturdy.limit_queue('q', per_second => 'Infinity')", "22023"),
        ("SELECT sturdy.limit_queue('q', burst => 5)", "22023"),
        ("SELECT sturdy.limit_queue('q', per_second => 10, burst => 0)", "22023"),
        ("SELECT sturdy.limit_queue('q', per_key => 0)", "22023"),
        ("SELECT sturdy.limit_queue('q', running => 3, per_key => -2)", "22023"),
        ("SELECT sturdy.limit_queue('q', running => 10001)", "22023"),
        ("SELECT sturdy.limit_queue('q', running => 2147483647)", "22023"),
        ("SELECT sturdy.limit_queue('q', per_key => 1001)", "22023"),
        ("SELECT sturdy.limit_queue('q', per_second => 1e308)", "22023"),
        ("SELECT sturdy.limit_queue('q', per_second => 1, burst => 1000001)", "22023"),
        ("SELECT sturdy.pause(NULL)", "22004"),
        ("SELECT sturdy.resume('')", "22023"),
    ] {
        assert_eq!(sqlstate_of(sql), state, "{sql}");
    }
    assert_eq!(count("sturdy.queue_limits"), 0);
    assert_eq!(count("sturdy.queue_places"), 0);
    assert_eq!(count("sturdy.queue_key_places"), 0);
}

/// schedule refuses a priority it cannot order and a key that is no name,
/// and writes nothing.
#[pg_test]
fn schedule_refuses_bad_priorities_and_keys() {
    for (sql, state) in [
        ("SELECT sturdy.schedule('w', priority => -1)", "22023"),
        ("SELECT sturdy.schedule('w', priority => NULL)", "22004"),
        ("SELECT sturdy.schedule('w', key => '')", "22023"),
        ("SELECT sturdy.schedule('w', key => repeat('k', 2000))", "22023"),
    ] {
        assert_eq!(sqlstate_of(sql), state, "{sql}");
    }
    assert_eq!(count("sturdy.queue"), 0);
}

/// Ready rows go out by priority, highest first, then by visible_at, then
/// arrival; a sleeping prioritized row waits for its time; a reschedule
/// sets the priority, and arrive and wake_at keep it.
#[pg_test]
fn take_hands_out_higher_priorities_first() {
    Spi::run(
        "SELECT sturdy.schedule('low' || i, now() - interval '1 hour' + i * interval '1 second', 'p')
           FROM generate_series(1, 50) i;
         SELECT sturdy.schedule('five-late', now() - interval '1 minute', 'p', priority => 5);
         SELECT sturdy.schedule('five-early', now() - interval '2 minutes', 'p', priority => 5);
         SELECT sturdy.schedule('two', now() - interval '3 minutes', 'p', priority => 2);
         SELECT sturdy.schedule('nine-asleep', now() + interval '1 hour', 'p', priority => 9);",
    )
    .unwrap();
    assert_eq!(
        one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take('p', max => 5)").as_deref(),
        Some("five-early,five-late,two,low1,low2")
    );
    assert_eq!(
        one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take('p')").as_deref(),
        Some("low3"),
        "one row at a time too"
    );
    // a reschedule sets the priority; arrive keeps it
    Spi::run(
        "SELECT sturdy.schedule('low10', now(), 'p', priority => 7);
         SELECT sturdy.arrive('low10', 'step', '1', 'p');",
    )
    .unwrap();
    assert_eq!(
        one::<i32>("SELECT priority FROM sturdy.queue WHERE workflow = 'low10'"),
        Some(7)
    );
    assert_eq!(
        one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take('p', max => 2)").as_deref(),
        Some("low10,low4")
    );
    Spi::run("SELECT sturdy.schedule('low20', now(), 'p')").unwrap();
    assert_eq!(
        one::<i32>("SELECT priority FROM sturdy.queue WHERE workflow = 'low20'"),
        Some(0),
        "a schedule without one gives the default"
    );
}

/// With `per_key`, no key has more passes leased than that, all takes
/// together; rows without a key are not limited; places are made for a key
/// met without them, and done, done_many and wake_at free them.
#[pg_test]
fn the_per_key_limit_leases_at_most_per_key_of_each_key() {
    Spi::run(
        "SELECT sturdy.schedule('k' || i, now() - interval '1 hour' + i * interval '1 second', 'keyed',
                                key => 'tenant' || (i % 3))
           FROM generate_series(1, 30) i;
         SELECT sturdy.schedule('free' || i, now() - interval '1 minute', 'keyed') FROM generate_series(1, 3) i;
         SELECT sturdy.limit_queue('keyed', per_key => 2);",
    )
    .unwrap();
    assert_eq!(count("sturdy.queue_key_places WHERE queue = 'keyed'"), 6);
    Spi::run("SELECT sturdy.schedule('late', now() - interval '2 hours', 'keyed', key => 'newcomer')").unwrap();
    Spi::run("CREATE TEMP TABLE got AS SELECT * FROM sturdy.take('keyed', max => 100)").unwrap();
    assert_eq!(count("got"), 2 * 3 + 1 + 3, "two of each key, the newcomer's one, the three without");
    assert_eq!(
        count("sturdy.queue_key_places WHERE key = 'newcomer'"),
        2,
        "places made on demand"
    );
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('keyed', max => 100)"),
        Some(0)
    );
    assert_eq!(
        one::<i64>(
            "SELECT max(n) FROM (SELECT count(*) AS n FROM sturdy.queue
                                  WHERE queue = 'keyed' AND leased_until > now() GROUP BY key) c"
        ),
        Some(3),
        "the three without a key"
    );
    assert_eq!(
        one::<i64>("SELECT held_back FROM sturdy.queue_stats WHERE queue = 'keyed'"),
        Some(24)
    );
    // done, done_many and wake_at each free a place of tenant1
    Spi::run(
        "SELECT sturdy.done(workflow, receipt, 'keyed') FROM got WHERE workflow = 'k1';
         SELECT sturdy.done_many(array_agg(workflow), array_agg(receipt), 'keyed') FROM got WHERE workflow = 'k2';
         SELECT sturdy.wake_at(workflow, receipt, now() + interval '1 hour', 'keyed') FROM got WHERE workflow = 'k3';",
    )
    .unwrap();
    assert_eq!(
        one::<String>(
            "SELECT string_agg(q.key, ',' ORDER BY q.key) FROM sturdy.take('keyed', max => 100) t
               JOIN sturdy.queue q ON q.queue = 'keyed' AND q.workflow = t.workflow"
        )
        .as_deref(),
        Some("tenant0,tenant1,tenant2")
    );
    // a lapsed receipt frees its place too
    Spi::run(
        "UPDATE sturdy.queue_key_places SET receipt = now() - interval '1 second'
          WHERE key = 'tenant0' AND place = 1",
    )
    .unwrap();
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('keyed', max => 100)"),
        Some(1)
    );
    Spi::run("SELECT sturdy.limit_queue('keyed')").unwrap();
    assert_eq!(count("sturdy.queue_key_places"), 0);
}

/// A paused queue hands out nothing (and marks no waiter: it is not empty);
/// schedules go on; resume hands out again. Each says whether it changed
/// anything.
#[pg_test]
fn a_paused_queue_hands_out_nothing_until_resumed() {
    Spi::run("SELECT sturdy.schedule('p1', now() - interval '1 second', 'paused')").unwrap();
    assert_eq!(one::<bool>("SELECT sturdy.pause('paused')"), Some(true));
    assert_eq!(one::<bool>("SELECT sturdy.pause('paused')"), Some(false));
    Spi::run("SELECT sturdy.schedule('p2', now() - interval '1 second', 'paused')").unwrap();
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('paused', max => 5)"),
        Some(0)
    );
    assert_eq!(
        one::<bool>("SELECT EXISTS (SELECT FROM sturdy.queue_waiters WHERE queue = 'paused')"),
        Some(false),
        "a paused queue is not an empty one"
    );
    assert_eq!(
        one::<String>(
            "SELECT format('%s %s %s', paused, ready, held_back) FROM sturdy.queue_stats WHERE queue = 'paused'"
        )
        .as_deref(),
        Some("t 2 2")
    );
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('default')"),
        Some(0),
        "another queue is not paused"
    );
    assert_eq!(one::<bool>("SELECT sturdy.resume('paused')"), Some(true));
    assert_eq!(one::<bool>("SELECT sturdy.resume('paused')"), Some(false));
    assert_eq!(count("sturdy.queue_limits"), 0, "nothing left to keep");
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('paused', max => 5)"),
        Some(2)
    );
}

/// With `running`, a take hands out at most the free places; done, finish
/// and wake_at free them; each place names its pass.
#[pg_test]
fn the_running_limit_hands_out_free_places_only() {
    Spi::run(
        "SELECT sturdy.schedule('r' || i, now() - interval '1 second', 'running') FROM generate_series(1, 6) i;
         SELECT sturdy.limit_queue('running', running => 2)",
    )
    .unwrap();
    assert_eq!(count("sturdy.queue_places WHERE queue = 'running'"), 2);
    Spi::run("CREATE TEMP TABLE got AS SELECT * FROM sturdy.take('running', max => 5)").unwrap();
    assert_eq!(count("got"), 2);
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('running', max => 5)"),
        Some(0)
    );
    assert_eq!(
        count("sturdy.queue_places p JOIN got g ON g.workflow = p.workflow AND g.receipt = p.receipt"),
        2,
        "each place names its pass"
    );
    assert_eq!(
        one::<i64>("SELECT held_back FROM sturdy.queue_stats WHERE queue = 'running'"),
        Some(4)
    );
    assert_eq!(
        one::<bool>("SELECT sturdy.done(workflow, receipt, 'running') FROM got ORDER BY workflow LIMIT 1"),
        Some(true)
    );
    Spi::run("DROP TABLE got; CREATE TEMP TABLE got AS SELECT * FROM sturdy.take('running', max => 5, claim => true)")
        .unwrap();
    assert_eq!(count("got"), 1, "one place freed by done");
    assert_eq!(
        one::<bool>("SELECT sturdy.finish(workflow, token, receipt, queue => 'running') FROM got"),
        Some(true)
    );
    Spi::run("DROP TABLE got; CREATE TEMP TABLE got AS SELECT * FROM sturdy.take('running')").unwrap();
    assert_eq!(count("got"), 1, "one place freed by finish");
    assert_eq!(
        one::<bool>("SELECT sturdy.wake_at(workflow, receipt, now() + interval '1 hour', 'running') FROM got"),
        Some(true)
    );
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('running', max => 5)"),
        Some(1),
        "one place freed by wake_at"
    );
    // cleared: no limit, no places
    Spi::run("SELECT sturdy.limit_queue('running')").unwrap();
    assert_eq!(count("sturdy.queue_limits"), 0);
    assert_eq!(count("sturdy.queue_places"), 0);
    assert_eq!(
        one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take('running', max => 5)").as_deref(),
        Some("r6"),
        "the one ready row left (r2 is leased, r4 asleep)"
    );
}

/// With `per_second` and `burst`, a take hands out at most the whole tokens
/// in the bucket; within one transaction (one now()) nothing refills it.
#[pg_test]
fn the_rate_limit_hands_out_the_bucket() {
    Spi::run(
        "SELECT sturdy.schedule('t' || i, now() - interval '1 second', 'rated') FROM generate_series(1, 10) i;
         SELECT sturdy.limit_queue('rated', per_second => 1000, burst => 3)",
    )
    .unwrap();
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('rated', max => 10)"),
        Some(3)
    );
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('rated', max => 10)"),
        Some(0)
    );
    assert_eq!(
        one::<f64>("SELECT tokens FROM sturdy.queue_limits WHERE queue = 'rated'"),
        Some(0.0)
    );
    // burst defaults to a second's worth
    Spi::run("SELECT sturdy.limit_queue('other', per_second => 2.5)").unwrap();
    assert_eq!(
        one::<i32>("SELECT burst FROM sturdy.queue_limits WHERE queue = 'other'"),
        Some(3)
    );
}

/// sweep removes the free per-key places of keys with no row left in their
/// queue, at most `max` keys a call; a key with rows, or with a place held,
/// keeps its places; a take that meets a swept key again makes them again.
#[pg_test]
fn sweep_removes_the_places_of_keys_gone_from_their_queue() {
    Spi::run(
        "SELECT sturdy.schedule('s' || i, now() - interval '1 minute', 'swept', key => 'k' || i)
           FROM generate_series(1, 4) i;
         SELECT sturdy.limit_queue('swept', per_key => 2);
         CREATE TEMP TABLE got AS SELECT * FROM sturdy.take('swept');
         SELECT sturdy.done(workflow, receipt, 'swept') FROM got;
         DELETE FROM sturdy.queue WHERE queue = 'swept' AND workflow IN ('s2', 's3');",
    )
    .unwrap();
    // k1: done, no row (free places); k2, k3: rows gone; k4: a row left
    let kinds = |max: i32| {
        one::<i64>(&format!(
            "SELECT deleted FROM sturdy.sweep('7 days', {max}) WHERE kind = 'key_places'"
        ))
    };
    assert_eq!(kinds(2), Some(2), "at most max keys a call");
    assert_eq!(kinds(10), Some(1));
    assert_eq!(kinds(10), Some(0));
    assert_eq!(
        one::<String>("SELECT string_agg(DISTINCT key, ',') FROM sturdy.queue_key_places").as_deref(),
        Some("k4")
    );
    // a held place keeps its key's places, though the key has no row
    Spi::run(
        "SELECT sturdy.schedule('s5', now() - interval '1 minute', 'swept', key => 'k5');
         SELECT count(*) FROM sturdy.take('swept', max => 5);
         DELETE FROM sturdy.queue WHERE queue = 'swept' AND workflow = 's5';",
    )
    .unwrap();
    assert_eq!(count("sturdy.queue_key_places WHERE key = 'k5' AND receipt > now()"), 1);
    assert_eq!(kinds(10), Some(0));
    Spi::run("SELECT sturdy.schedule('s1', now() - interval '1 minute', 'swept', key => 'k1')").unwrap();
    assert_eq!(
        one::<i64>("SELECT count(*) FROM sturdy.take('swept', max => 5)"),
        Some(1),
        "k1's places made again"
    );
    assert_eq!(count("sturdy.queue_key_places WHERE key = 'k1'"), 2);
}

/// A one-row take of a limited queue locks and writes its place without a
/// statement, and the pass's `done` in the same backend frees that very
/// version; a key without places goes by the statement, which makes them.
#[pg_test]
fn one_row_takes_hold_places_without_a_statement_and_their_done_frees_them() {
    let served = crate::access::served;
    Spi::run(
        "SELECT sturdy.schedule(w, now() - interval '1 minute' + n * interval '1 second', 'capped')
           FROM unnest(array['r1', 'r2']) WITH ORDINALITY AS t(w, n);
         SELECT sturdy.limit_queue('capped', running => 1);",
    )
    .unwrap();
    let taken = |queue: &str| {
        one::<String>(&format!(
            "SELECT string_agg(workflow, ',') FROM sturdy.take('{queue}')"
        ))
    };
    let before = served();
    assert_eq!(taken("capped").as_deref(), Some("r1"));
    assert_eq!(
        served(),
        before + 3,
        "the place locked, the row leased, the place written"
    );
    assert_eq!(
        one::<bool>(
            "SELECT p.workflow = 'r1' AND p.receipt = q.leased_until
               FROM sturdy.queue_places p, sturdy.queue q
              WHERE p.queue = 'capped' AND q.workflow = 'r1'"
        ),
        Some(true),
        "the pass in its place"
    );
    assert_eq!(taken("capped"), None, "no place left");
    let before = served();
    assert_eq!(
        one::<bool>(
            "SELECT sturdy.done('r1', leased_until, 'capped') FROM sturdy.queue WHERE workflow = 'r1'"
        ),
        Some(true)
    );
    assert_eq!(served(), before + 2, "the row deleted, the place freed where it lives");
    assert_eq!(
        count("sturdy.queue_places WHERE workflow IS NULL AND receipt IS NULL"),
        1
    );
    assert_eq!(taken("capped").as_deref(), Some("r2"));

    // per key: rows of a key whose place is held are passed over
    Spi::run(
        "SELECT sturdy.schedule(w, now() - interval '1 minute' + n * interval '1 second', 'keyed', key => k)
           FROM unnest(array['k1', 'k2', 'k3'], array['acme', 'acme', 'zeta']) WITH ORDINALITY AS t(w, k, n);
         SELECT sturdy.schedule('n1', now() - interval '10 seconds', 'keyed');
         SELECT sturdy.limit_queue('keyed', per_key => 1);",
    )
    .unwrap();
    let before = served();
    assert_eq!(taken("keyed").as_deref(), Some("k1"));
    assert_eq!(served(), before + 3);
    assert_eq!(taken("keyed").as_deref(), Some("k3"), "k2 waits for acme's place");
    assert_eq!(taken("keyed").as_deref(), Some("n1"), "a row without a key");
    assert_eq!(taken("keyed"), None);
    assert_eq!(
        count("sturdy.queue_key_places WHERE workflow IS NOT NULL AND receipt > now()"),
        2
    );
    // a key met without places: by the statement, which makes them
    Spi::run("SELECT sturdy.schedule('k4', now() - interval '5 seconds', 'keyed', key => 'new')")
        .unwrap();
    assert_eq!(taken("keyed").as_deref(), Some("k4"));
    assert_eq!(
        one::<String>("SELECT workflow FROM sturdy.queue_key_places WHERE key = 'new'").as_deref(),
        Some("k4")
    );
    let before = served();
    assert_eq!(
        one::<bool>(
            "SELECT sturdy.done('k1', leased_until, 'keyed') FROM sturdy.queue WHERE workflow = 'k1'"
        ),
        Some(true)
    );
    assert_eq!(served(), before + 2, "the row deleted, acme's place freed where it lives");
    assert_eq!(taken("keyed").as_deref(), Some("k2"));
    // a batch's places, written by its statement, freed by the rows' keys
    Spi::run(
        "SELECT sturdy.schedule(w, now() - interval '30 seconds', 'keyed', key => k)
           FROM unnest(array['b1', 'b2'], array['bx', 'by']) AS t(w, k);
         CREATE TEMP TABLE batch AS SELECT * FROM sturdy.take('keyed', max => 5);",
    )
    .unwrap();
    assert_eq!(count("batch"), 2);
    let held = |key: &str| {
        count(&format!(
            "sturdy.queue_key_places WHERE key = '{key}' AND receipt > now()"
        ))
    };
    assert_eq!((held("bx"), held("by")), (1, 1));
    assert_eq!(
        one::<bool>("SELECT sturdy.done(workflow, receipt, 'keyed') FROM batch WHERE workflow = 'b1'"),
        Some(true)
    );
    assert_eq!(
        one::<i64>(
            "SELECT sturdy.done_many(array_agg(workflow), array_agg(receipt), 'keyed')
               FROM batch WHERE workflow = 'b2'"
        ),
        Some(1)
    );
    assert_eq!((held("bx"), held("by")), (0, 0));
}
