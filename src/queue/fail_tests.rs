// Failing passes: `fail`, `retry_queue` and take's `attempt` (included in
// `tests`, after tests.rs: its imports and `one` are these tests' too).

/// Take `queue`'s first row into `t` (replacing it): its workflow,
/// receipt and attempt.
fn take_into_t(queue: &str) {
    Spi::run(&format!(
        "DROP TABLE IF EXISTS t; CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('{queue}', '10 minutes')"
    ))
    .unwrap();
}

fn fail_t(rest: &str) -> Option<bool> {
    one::<bool>(&format!(
        "SELECT sturdy.fail(workflow, receipt, 'boom', 'fq'{rest}) FROM t"
    ))
}

/// Each failure counts on the row, keeps the error and code, and makes it
/// visible again after the doubled backoff (capped); at max_attempts it is
/// dead: never taken again, counted dead, its instance failed with the
/// error. A stale receipt fails nothing.
#[pg_test]
fn fail_backs_off_doubling_up_to_the_cap_and_kills_at_max_attempts() {
    Spi::run(
        "SELECT sturdy.retry_queue('fq', max_attempts => 3, backoff => '10 seconds',
                                   max_backoff => '15 seconds', jitter => 0);
         SELECT sturdy.start('proc', 'bk', queue => 'fq');
         UPDATE sturdy.queue SET visible_at = now() - interval '1 minute' WHERE queue = 'fq'",
    )
    .unwrap();
    let row = |what: &str| {
        one::<String>(&format!(
            "SELECT ({what})::text FROM sturdy.queue WHERE queue = 'fq'"
        ))
    };
    take_into_t("fq");
    assert_eq!(one::<i32>("SELECT attempt FROM t"), Some(1));
    assert_eq!(fail_t(", code => 'AB123'"), Some(true));
    assert_eq!(
        row("format('%s %s %s %s %s', attempts, visible_at = now() + interval '10 seconds', leased_until IS NULL, last_error, last_sqlstate)")
            .as_deref(),
        Some("1 t t boom AB123")
    );
    assert_eq!(fail_t(""), Some(false), "the receipt is spent");
    assert_eq!(one::<i64>("SELECT count(*) FROM sturdy.take('fq')"), Some(0), "backing off");

    Spi::run("UPDATE sturdy.queue SET visible_at = now() - interval '1 second' WHERE queue = 'fq'").unwrap();
    take_into_t("fq");
    assert_eq!(one::<i32>("SELECT attempt FROM t"), Some(2));
    assert_eq!(fail_t(""), Some(true));
    assert_eq!(
        row("format('%s %s %s', attempts, visible_at = now() + interval '15 seconds', last_sqlstate IS NULL)").as_deref(),
        Some("2 t t"),
        "20 s doubled, 15 s the cap; no code this time"
    );
    assert_eq!(
        one::<String>("SELECT format('%s %s %s', failing, dead, sleeping) FROM sturdy.queue_stats WHERE queue = 'fq'")
            .as_deref(),
        Some("1 0 1")
    );

    Spi::run("UPDATE sturdy.queue SET visible_at = now() - interval '1 second' WHERE queue = 'fq'").unwrap();
    take_into_t("fq");
    assert_eq!(one::<i32>("SELECT attempt FROM t"), Some(3));
    assert_eq!(fail_t(""), Some(true));
    assert_eq!(row("visible_at = 'infinity'").as_deref(), Some("true"), "dead");
    assert_eq!(one::<i64>("SELECT count(*) FROM sturdy.take('fq')"), Some(0));
    assert_eq!(
        one::<String>("SELECT format('%s %s %s', failing, dead, sleeping) FROM sturdy.queue_stats WHERE queue = 'fq'")
            .as_deref(),
        Some("0 1 0")
    );
    assert_eq!(
        one::<String>("SELECT format('%s %s %s', status, last_error, finished_at IS NOT NULL) FROM sturdy.instances WHERE business_key = 'bk'")
            .as_deref(),
        Some("failed boom t")
    );
}

/// `retry_at` overrides the backoff; one already past makes the row
/// ready now; `done` after `fail` from the same pass finds nothing.
#[pg_test]
fn fail_at_a_time_given_and_done_after_fail_is_false() {
    Spi::run("SELECT sturdy.schedule('w', now() - interval '1 minute', 'fq')").unwrap();
    take_into_t("fq");
    assert_eq!(
        fail_t(", retry_at => now() + interval '1 hour'"),
        Some(true)
    );
    assert_eq!(
        one::<bool>("SELECT visible_at = now() + interval '1 hour' FROM sturdy.queue WHERE workflow = 'w'"),
        Some(true)
    );
    assert_eq!(
        one::<bool>("SELECT sturdy.done(workflow, receipt, 'fq') FROM t"),
        Some(false)
    );
    Spi::run("UPDATE sturdy.queue SET visible_at = now() - interval '1 second' WHERE workflow = 'w'").unwrap();
    take_into_t("fq");
    assert_eq!(fail_t(", retry_at => now() - interval '5 seconds'"), Some(true));
    assert_eq!(
        one::<String>("SELECT string_agg(format('%s %s', workflow, attempt), ',') FROM sturdy.take('fq', max => 5)")
            .as_deref(),
        Some("w 3"),
        "ready at once, as the third attempt"
    );
}

/// A failed pass is over: taken with a claim, its token is fenced (its
/// writes raise SD001) and the retry, due at once, claims the workflow at
/// once instead of finding it held until the old lease's end.
#[pg_test]
fn fail_fences_the_failed_pass_and_frees_its_claim_for_the_retry() {
    Spi::run("SELECT sturdy.schedule('w', now() - interval '1 minute', 'fq')").unwrap();
    Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('fq', '10 minutes', claim => true)").unwrap();
    assert_eq!(one::<bool>("SELECT token IS NOT NULL FROM t"), Some(true));
    assert_eq!(fail_t(", retry_at => now()"), Some(true));
    assert_eq!(
        sqlstate_of("SELECT sturdy.record(workflow, 'late', '1', token) FROM t"),
        "SD001",
        "the failed pass writes nothing more"
    );
    assert_eq!(
        one::<String>("SELECT format('%s %s %s', n.workflow, n.attempt, n.token > t.token) FROM sturdy.take('fq', '10 minutes', claim => true) n, t")
            .as_deref(),
        Some("w 2 t"),
        "the retry holds the claim"
    );
}

/// Without a policy a queue retries as retry_queue's defaults: a second,
/// doubled, with a tenth of jitter; 25 attempts.
#[pg_test]
fn a_queue_without_a_policy_backs_off_a_second_with_jitter() {
    Spi::run("SELECT sturdy.schedule('w', now() - interval '1 minute', 'nq')").unwrap();
    take_into_t("nq");
    assert_eq!(
        one::<bool>("SELECT sturdy.fail(workflow, receipt, 'x', 'nq') FROM t"),
        Some(true)
    );
    assert_eq!(
        one::<bool>(
            "SELECT visible_at BETWEEN now() + interval '0.9 seconds' AND now() + interval '1.1 seconds'
               FROM sturdy.queue WHERE workflow = 'w'"
        ),
        Some(true)
    );
    Spi::run("UPDATE sturdy.queue SET attempts = 24, visible_at = now() - interval '1 second' WHERE workflow = 'w'")
        .unwrap();
    take_into_t("nq");
    assert_eq!(one::<i32>("SELECT attempt FROM t"), Some(25));
    Spi::run("SELECT sturdy.fail(workflow, receipt, 'x', 'nq') FROM t").unwrap();
    assert_eq!(
        one::<bool>("SELECT visible_at = 'infinity' FROM sturdy.queue WHERE workflow = 'w'"),
        Some(true),
        "dead at the 25th failure"
    );
}

/// Every way to take says which attempt it is: the one-row take without a
/// statement, a batch, with a claim, by priority and under a per-key limit.
#[pg_test]
fn every_take_says_which_attempt() {
    Spi::run(
        "SELECT sturdy.schedule('a' || i, now() - interval '1 minute', 'aq') FROM generate_series(1, 6) i;
         UPDATE sturdy.queue SET attempts = 4 WHERE workflow IN ('a2', 'a4', 'a6');
         SELECT sturdy.schedule('p', now(), 'pq', priority => 3);
         UPDATE sturdy.queue SET attempts = 2 WHERE workflow = 'p';
         SELECT sturdy.schedule('k', now(), 'kq', key => 'tenant');
         UPDATE sturdy.queue SET attempts = 7 WHERE workflow = 'k';
         SELECT sturdy.limit_queue('kq', per_key => 1)",
    )
    .unwrap();
    let attempts = |sql: &str| one::<String>(&format!("SELECT string_agg(workflow || ':' || attempt, ',' ORDER BY workflow) FROM {sql}"));
    assert_eq!(attempts("sturdy.take('aq')").as_deref(), Some("a1:1"));
    assert_eq!(attempts("sturdy.take('aq')").as_deref(), Some("a2:5"));
    assert_eq!(
        attempts("sturdy.take('aq', max => 2)").as_deref(),
        Some("a3:1,a4:5")
    );
    assert_eq!(
        attempts("sturdy.take('aq', max => 2, claim => true)").as_deref(),
        Some("a5:1,a6:5")
    );
    assert_eq!(attempts("sturdy.take('pq')").as_deref(), Some("p:3"));
    assert_eq!(attempts("sturdy.take('kq', max => 3)").as_deref(), Some("k:8"));
    // the columns a caller of an earlier version selects still resolve
    assert_eq!(
        one::<i64>("SELECT count(*) FROM (SELECT workflow, receipt, token FROM sturdy.take('aq')) x"),
        Some(0)
    );
}

/// Bad input: a class-22 error naming the argument, nothing written.
#[pg_test]
fn fail_and_retry_queue_refuse_bad_input() {
    Spi::run("SELECT sturdy.schedule('w', now() - interval '1 minute', 'fq')").unwrap();
    take_into_t("fq");
    for (sql, state) in [
        ("SELECT sturdy.fail(NULL, receipt, 'e', 'fq') FROM t", "22004"),
        ("SELECT sturdy.fail(workflow, NULL, 'e', 'fq') FROM t", "22004"),
        ("SELECT sturdy.fail(workflow, receipt, 'e', NULL) FROM t", "22004"),
        ("SELECT sturdy.fail(workflow, receipt, 'e', 'fq', code => 'abc') FROM t", "22023"),
        ("SELECT sturdy.fail(workflow, receipt, 'e', 'fq', code => '123456') FROM t", "22023"),
        ("SELECT sturdy.fail(workflow, receipt, 'e', 'fq', retry_at => 'infinity') FROM t", "22023"),
        ("SELECT sturdy.retry_queue('fq', max_attempts => 0)", "22023"),
        ("SELECT sturdy.retry_queue('fq', max_attempts => 1000001)", "22023"),
        ("SELECT sturdy.retry_queue('fq', backoff => '-1 second')", "22023"),
        ("SELECT sturdy.retry_queue('fq', backoff => '1 day -25 hours')", "22023"),
        ("SELECT sturdy.retry_queue('fq', max_backoff => '2 years')", "22023"),
        ("SELECT sturdy.retry_queue('fq', jitter => 1.5)", "22023"),
        ("SELECT sturdy.retry_queue('fq', jitter => -0.1)", "22023"),
        ("SELECT sturdy.retry_queue('fq', jitter => 'NaN')", "22023"),
        ("SELECT sturdy.retry_queue(NULL)", "22004"),
        ("SELECT sturdy.retry_queue('')", "22023"),
    ] {
        assert_eq!(sqlstate_of(sql), state, "{sql}");
    }
    assert_eq!(count("sturdy.queue_retry"), 0);
    assert_eq!(
        one::<bool>("SELECT attempts IS NULL AND leased_until IS NOT NULL FROM sturdy.queue WHERE workflow = 'w'"),
        Some(true),
        "nothing written"
    );
    // a policy, then NULLs and defaults: back to no row
    Spi::run("SELECT sturdy.retry_queue('fq', max_attempts => 5)").unwrap();
    assert_eq!(count("sturdy.queue_retry"), 1);
    Spi::run("SELECT sturdy.retry_queue('fq', max_attempts => NULL, backoff => NULL, max_backoff => NULL, jitter => NULL)")
        .unwrap();
    assert_eq!(count("sturdy.queue_retry"), 0);
    // a long error is cut to its first 1,000 characters
    Spi::run("SELECT sturdy.fail(workflow, receipt, repeat('é', 5000), 'fq') FROM t").unwrap();
    assert_eq!(
        one::<i32>("SELECT length(last_error) FROM sturdy.queue WHERE workflow = 'w'"),
        Some(1000)
    );
}

/// redrive: a dead row ready again as attempt 1, its error kept; false for
/// a row that is not dead. One argument is the outbox's redrive, two this.
#[pg_test]
fn redrive_makes_a_dead_row_ready_with_its_count_reset() {
    Spi::run(
        "SELECT sturdy.retry_queue('rq', max_attempts => 1);
         SELECT sturdy.schedule('w', now() - interval '1 minute', 'rq');
         SELECT sturdy.schedule('alive', now() + interval '1 hour', 'rq')",
    )
    .unwrap();
    Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('rq', '1 minute')").unwrap();
    assert_eq!(
        one::<bool>("SELECT sturdy.fail(workflow, receipt, 'boom', 'rq') FROM t"),
        Some(true)
    );
    assert_eq!(one::<bool>("SELECT sturdy.redrive('alive', 'rq')"), Some(false));
    assert_eq!(one::<bool>("SELECT sturdy.redrive('nobody', 'rq')"), Some(false));
    assert_eq!(one::<bool>("SELECT sturdy.redrive('w', 'rq')"), Some(true));
    assert_eq!(one::<bool>("SELECT sturdy.redrive('w', 'rq')"), Some(false), "no longer dead");
    assert_eq!(
        one::<String>("SELECT format('%s %s %s', attempts IS NULL, last_error, visible_at = now()) FROM sturdy.queue WHERE workflow = 'w'")
            .as_deref(),
        Some("t boom t")
    );
    assert_eq!(
        one::<String>("SELECT workflow || ':' || attempt FROM sturdy.take('rq')").as_deref(),
        Some("w:1")
    );
    // untyped literals: one argument is the outbox's (bigint), two are ours
    assert_eq!(sqlstate_of("SELECT sturdy.redrive('w')"), "22P02");
    assert_eq!(sqlstate_of("SELECT sturdy.redrive(NULL, 'rq')"), "22004");
}

/// cancel removes a waiting, sleeping, failing or dead row; a pass under
/// way finds done false and its claim fenced, and its place of a running
/// limit is free at once.
#[pg_test]
fn cancel_removes_any_row_and_fences_the_pass_under_way() {
    Spi::run(
        "SELECT sturdy.limit_queue('cq', running => 1);
         SELECT sturdy.schedule('waiting', now() - interval '2 minutes', 'cq');
         SELECT sturdy.schedule('sleeping', now() + interval '1 hour', 'cq');
         SELECT sturdy.schedule('running', now() - interval '3 minutes', 'cq');
         SELECT sturdy.schedule('dead', now() + interval '1 hour', 'cq');
         UPDATE sturdy.queue SET visible_at = 'infinity', attempts = 25 WHERE workflow = 'dead'",
    )
    .unwrap();
    Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('cq', '10 minutes', claim => true)").unwrap();
    assert_eq!(one::<String>("SELECT workflow FROM t").as_deref(), Some("running"));
    assert_eq!(one::<i64>("SELECT count(*) FROM sturdy.take('cq')"), Some(0), "the one place is held");
    for w in ["waiting", "sleeping", "dead", "running"] {
        assert_eq!(
            one::<bool>(&format!("SELECT sturdy.cancel('{w}', 'cq')")),
            Some(true),
            "{w}"
        );
    }
    assert_eq!(count("sturdy.queue WHERE queue = 'cq'"), 0);
    assert_eq!(one::<bool>("SELECT sturdy.cancel('running', 'cq')"), Some(false));
    assert_eq!(
        one::<bool>("SELECT sturdy.done(workflow, receipt, 'cq') FROM t"),
        Some(false)
    );
    assert_eq!(
        sqlstate_of("SELECT sturdy.record(workflow, 'step', '1', token) FROM t"),
        "SD001",
        "the cancelled pass's claim is fenced"
    );
    Spi::run("SELECT sturdy.schedule('next', now() - interval '1 minute', 'cq')").unwrap();
    assert_eq!(
        one::<String>("SELECT workflow FROM sturdy.take('cq')").as_deref(),
        Some("next"),
        "the cancelled pass's place is free"
    );
    assert_eq!(sqlstate_of("SELECT sturdy.cancel(NULL, 'cq')"), "22004");
    assert_eq!(sqlstate_of("SELECT sturdy.cancel('', 'cq')"), "22023");
}

/// sweep counts a lease that ran out with no take to meet it, as a take
/// would (from the lease's end; a row at its last attempt dies and fails
/// its instance), leaves live leases alone, removes dead rows past the
/// retention and keeps younger ones, within `max` of each, queue by queue.
#[pg_test]
fn sweep_counts_leases_run_out_and_removes_long_dead_rows() {
    Spi::run(
        "SELECT sturdy.retry_queue('sq', max_attempts => 2, backoff => '1 hour', jitter => 0);
         SELECT sturdy.start('proc', 'bk-sweep', queue => 'sq');
         SELECT sturdy.schedule('plain', now() - interval '3 minutes', 'sq');
         SELECT sturdy.schedule('live', now() - interval '2 minutes', 'sq');
         SELECT sturdy.schedule('olddead', now(), 'sq');
         SELECT sturdy.schedule('newdead', now(), 'sq');
         SELECT sturdy.schedule('otherdead', now(), 'sq2');
         UPDATE sturdy.queue SET visible_at = now() - interval '4 minutes'
          WHERE queue = 'sq' AND workflow NOT IN ('plain', 'live', 'olddead', 'newdead');
         UPDATE sturdy.queue SET visible_at = 'infinity', attempts = 2, last_error = 'x',
                failed_at = now() - interval '8 days'
          WHERE workflow IN ('olddead', 'otherdead');
         UPDATE sturdy.queue SET visible_at = 'infinity', attempts = 2, last_error = 'x',
                failed_at = now() - interval '1 day'
          WHERE workflow = 'newdead'",
    )
    .unwrap();
    assert_eq!(one::<i64>("SELECT count(*) FROM sturdy.take('sq', '10 minutes', 3)"), Some(3));
    // two passes whose workers went away: their leases ended half an hour
    // ago; the instance's row was at its last attempt
    Spi::run(
        "UPDATE sturdy.queue SET leased_until = now() - interval '30 minutes'
          WHERE queue = 'sq' AND leased_until IS NOT NULL AND workflow <> 'live';
         UPDATE sturdy.queue SET attempts = 1
          WHERE queue = 'sq' AND workflow NOT IN ('plain', 'live', 'olddead', 'newdead')",
    )
    .unwrap();
    let swept = |max: i32| {
        Spi::run(&format!(
            "DROP TABLE IF EXISTS s; CREATE TEMP TABLE s AS SELECT * FROM sturdy.sweep('7 days', {max})"
        ))
        .unwrap();
        (
            one::<i64>("SELECT deleted FROM s WHERE kind = 'lapsed'"),
            one::<i64>("SELECT deleted FROM s WHERE kind = 'dead'"),
        )
    };
    assert_eq!(swept(1), (Some(1), Some(1)), "max bounds each kind");
    assert_eq!(swept(1000), (Some(1), Some(1)), "the rest, in the other queue too");
    assert_eq!(swept(1000), (Some(0), Some(0)), "nothing counted twice");
    let row = |w: &str| {
        one::<String>(&format!(
            "SELECT format('%s %s %s', attempts, last_error,
                           CASE WHEN visible_at = 'infinity' THEN 'dead' ELSE (visible_at - now())::text END)
               FROM sturdy.queue WHERE workflow = {w} AND leased_until IS NULL"
        ))
    };
    assert_eq!(
        row("'plain'").as_deref(),
        Some("1 the lease ran out 00:30:00"),
        "backed off from the lease's end"
    );
    assert_eq!(
        row("(SELECT workflow FROM sturdy.status('bk-sweep'))").as_deref(),
        Some("2 the lease ran out dead"),
        "its last attempt"
    );
    assert_eq!(row("'newdead'").as_deref(), Some("2 x dead"), "dead for a day: kept");
    assert_eq!(count("sturdy.queue WHERE workflow IN ('olddead', 'otherdead')"), 0);
    assert_eq!(
        one::<String>("SELECT status || ': ' || last_error FROM sturdy.status('bk-sweep')").as_deref(),
        Some("failed: the lease ran out")
    );
    assert_eq!(
        one::<bool>("SELECT leased_until > now() FROM sturdy.queue WHERE workflow = 'live'"),
        Some(true),
        "a live lease is not a failure"
    );
}

/// extend keeps a pass's row for longer: a new receipt from now, which
/// done then needs (the old one is stale); a stale receipt or a lease run
/// out gets NULL and writes nothing; the places of a running and a per-key
/// limit move with the pass, so the limit still counts it.
#[pg_test]
fn extend_moves_the_lease_and_the_places_of_the_pass() {
    Spi::run(
        "SELECT sturdy.limit_queue('xq', running => 1);
         SELECT sturdy.limit_queue('xk', per_key => 1);
         SELECT sturdy.schedule('w', now() - interval '1 minute', 'xq');
         SELECT sturdy.schedule('next', now() - interval '1 minute', 'xq');
         SELECT sturdy.schedule('k1', now() - interval '1 minute', 'xk', key => 'a');
         SELECT sturdy.schedule('k2', now() - interval '1 minute', 'xk', key => 'a')",
    )
    .unwrap();
    Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('xq', '1 minute')").unwrap();
    Spi::run("CREATE TEMP TABLE tk AS SELECT * FROM sturdy.take('xk', '1 minute')").unwrap();
    assert_eq!(
        one::<bool>("SELECT sturdy.extend(workflow, receipt, '10 minutes', 'xq') = now() + interval '10 minutes' FROM t"),
        Some(true)
    );
    assert_eq!(
        one::<bool>("SELECT sturdy.extend(workflow, receipt, '10 minutes', 'xq') IS NULL FROM t"),
        Some(true),
        "the old receipt is stale"
    );
    assert_eq!(
        one::<bool>("SELECT leased_until = now() + interval '10 minutes' FROM sturdy.queue WHERE workflow = 'w'"),
        Some(true)
    );
    assert_eq!(
        one::<bool>("SELECT receipt = now() + interval '10 minutes' FROM sturdy.queue_places WHERE queue = 'xq' AND workflow = 'w'"),
        Some(true),
        "the running place moved with the pass"
    );
    assert_eq!(
        one::<bool>("SELECT sturdy.extend(workflow, receipt, '5 minutes', 'xk') IS NOT NULL FROM tk"),
        Some(true)
    );
    assert_eq!(
        one::<bool>("SELECT receipt = now() + interval '5 minutes' FROM sturdy.queue_key_places WHERE queue = 'xk' AND workflow = 'k1'"),
        Some(true),
        "the key's place moved with the pass"
    );
    assert_eq!(
        one::<bool>("SELECT sturdy.done(workflow, receipt, 'xq') FROM t"),
        Some(false),
        "done needs the new receipt"
    );
    assert_eq!(
        one::<bool>("SELECT sturdy.done('w', now() + interval '10 minutes', 'xq')"),
        Some(true)
    );
    // a lease that ran out is a failed pass, not one to keep
    Spi::run("UPDATE sturdy.queue SET leased_until = now() - interval '1 second' WHERE workflow = 'k1'").unwrap();
    assert_eq!(
        one::<bool>("SELECT sturdy.extend('k1', now() - interval '1 second', '5 minutes', 'xk') IS NULL"),
        Some(true)
    );
    // bad input is refused and moves nothing: k2's lease (and its place) stay
    Spi::run("CREATE TEMP TABLE before AS SELECT workflow, leased_until FROM sturdy.queue").unwrap();
    assert_eq!(sqlstate_of("SELECT sturdy.extend('w', NULL, '1 minute', 'xq')"), "22004");
    assert_eq!(sqlstate_of("SELECT sturdy.extend(NULL, now(), '1 minute', 'xq')"), "22004");
    assert_eq!(sqlstate_of("SELECT sturdy.extend('w', now(), '0', 'xq')"), "22023");
    assert_eq!(sqlstate_of("SELECT sturdy.extend('w', now(), '1 minute', '')"), "22023");
    assert_eq!(sqlstate_of("SELECT sturdy.extend('k1', now() - interval '1 second', '-1 minute', 'xk')"), "22023");
    assert_eq!(
        count("sturdy.queue q JOIN before b USING (workflow) WHERE q.leased_until IS DISTINCT FROM b.leased_until"),
        0,
        "nothing written"
    );
}
