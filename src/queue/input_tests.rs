// A job's input: `schedule_many` writes it, `take` hands it out with the
// pass by every path (one row without a statement, a batch through its
// statement, a claim, a key's limit, priorities), the ends of a pass keep it
// for the next, and bad input writes nothing (included in `tests`).

/// `take`'s rows of `queue` as `workflow=input` text, in order.
fn taken_inputs(sql: &str) -> Option<String> {
    one::<String>(&format!(
        "SELECT string_agg(workflow || '=' || coalesce(input::text, 'none'), ' ' ORDER BY workflow) FROM ({sql}) t"
    ))
}

#[pg_test]
fn schedule_many_writes_each_input_and_take_hands_it_out_by_every_path() {
    assert_eq!(
        one::<i64>(
            "SELECT sturdy.schedule_many(ARRAY['a', 'b', 'c', 'd'],
                                         ARRAY['{\"n\": 1}', '[2]', NULL, '\"x\"']::jsonb[], 'in1',
                                         now() - interval '1 minute')"
        ),
        Some(4)
    );
    // one row at a time (without a statement), then a batch (its statement)
    assert_eq!(taken_inputs("SELECT * FROM sturdy.take('in1')").as_deref(), Some("a={\"n\": 1}"));
    assert_eq!(
        taken_inputs("SELECT * FROM sturdy.take('in1', max => 10, claim => true)").as_deref(),
        Some("b=[2] c=none d=\"x\"")
    );
    // a queue whose rows have no input hands out NULL
    Spi::run("SELECT sturdy.schedule('plain', now() - interval '1 minute', 'in2')").unwrap();
    assert_eq!(taken_inputs("SELECT * FROM sturdy.take('in2')").as_deref(), Some("plain=none"));
}

#[pg_test]
fn limited_and_prioritized_takes_hand_out_the_input_too() {
    Spi::run(
        "SELECT sturdy.limit_queue('in3', running => 5, per_key => 1);
         SELECT sturdy.schedule_many(ARRAY['k1', 'k2', 'k3'], ARRAY['1', '2', '3']::jsonb[], 'in3',
                                     now() - interval '1 minute', keys => ARRAY['x', 'y', 'x']);
         SELECT sturdy.schedule_many(ARRAY['p1', 'p2'], ARRAY['{\"p\": 1}', '{\"p\": 2}']::jsonb[], 'in4',
                                     now() - interval '1 minute', priority => 3);
         SELECT sturdy.schedule('p0', now() - interval '2 minutes', 'in4');",
    )
    .unwrap();
    assert_eq!(
        taken_inputs("SELECT * FROM sturdy.take('in3', max => 10)").as_deref(),
        Some("k1=1 k2=2"),
        "one a key: k3 waits for x's place"
    );
    assert_eq!(taken_inputs("SELECT * FROM sturdy.take('in3')").as_deref(), None);
    assert_eq!(
        taken_inputs("SELECT * FROM sturdy.take('in4', max => 2)").as_deref(),
        Some("p1={\"p\": 1} p2={\"p\": 2}"),
        "the higher priority first, with its input"
    );
    assert_eq!(taken_inputs("SELECT * FROM sturdy.take('in4')").as_deref(), Some("p0=none"));
}

/// A wakeup, a failed pass and a sleep keep the row's input for its next
/// pass; the next `schedule_many` of the workflow replaces it; `schedule`
/// leaves it; a big input (toasted) comes back whole.
#[pg_test]
fn the_input_stays_with_the_row_until_the_next_schedule_many() {
    Spi::run(
        "SELECT sturdy.schedule_many(ARRAY['w'], ARRAY['{\"v\": 1}']::jsonb[], 'in5', now() - interval '1 minute');
         CREATE TEMP TABLE p AS SELECT * FROM sturdy.take('in5');
         SELECT sturdy.fail(workflow, receipt, 'boom', 'in5', retry_at => now() - interval '1 second') FROM p;",
    )
    .unwrap();
    assert_eq!(taken_inputs("SELECT * FROM sturdy.take('in5')").as_deref(), Some("w={\"v\": 1}"));
    Spi::run(
        "SELECT sturdy.schedule('w', now() - interval '1 second', 'in5');
         UPDATE sturdy.queue SET leased_until = NULL WHERE queue = 'in5';",
    )
    .unwrap();
    assert_eq!(
        taken_inputs("SELECT * FROM sturdy.take('in5')").as_deref(),
        Some("w={\"v\": 1}"),
        "schedule keeps the input"
    );
    Spi::run(
        "UPDATE sturdy.queue SET leased_until = NULL WHERE queue = 'in5';
         SELECT sturdy.schedule_many(ARRAY['w'], ARRAY[jsonb_build_object('big', repeat('x', 100000))],
                                     'in5', now() - interval '1 second');",
    )
    .unwrap();
    assert_eq!(
        one::<i32>("SELECT length(input->>'big') FROM sturdy.take('in5')"),
        Some(100_000),
        "a toasted input comes back whole"
    );
    Spi::run(
        "UPDATE sturdy.queue SET leased_until = NULL WHERE queue = 'in5';
         SELECT sturdy.schedule_many(ARRAY['w'], ARRAY[NULL]::jsonb[], 'in5', now() - interval '1 second');",
    )
    .unwrap();
    assert_eq!(
        taken_inputs("SELECT * FROM sturdy.take('in5')").as_deref(),
        Some("w=none"),
        "a NULL element writes no input: the old one is gone"
    );
}

#[pg_test]
fn schedule_many_refuses_bad_input_and_writes_nothing() {
    for (sql, state) in [
        ("SELECT sturdy.schedule_many(NULL)", "22004"),
        ("SELECT sturdy.schedule_many(ARRAY['a', NULL])", "22004"),
        ("SELECT sturdy.schedule_many(ARRAY['a', ''])", "22023"),
        ("SELECT sturdy.schedule_many(ARRAY['a', 'b'], ARRAY['1']::jsonb[])", "22023"),
        ("SELECT sturdy.schedule_many(ARRAY['a'], keys => ARRAY['x', 'y'])", "22023"),
        ("SELECT sturdy.schedule_many(ARRAY[['a'], ['b']])", "22023"),
        ("SELECT sturdy.schedule_many(ARRAY['a'], queue => '')", "22023"),
        ("SELECT sturdy.schedule_many(ARRAY['a'], priority => -1)", "22023"),
        ("SELECT sturdy.schedule_many(ARRAY['a'], visible_at => 'infinity')", "22023"),
        ("SELECT sturdy.schedule_many(ARRAY(SELECT 'w' || g FROM generate_series(1, 10001) g))", "22023"),
        ("SELECT sturdy.schedule_many(ARRAY['a'], ARRAY['\"\\u0000\"']::jsonb[])", "22P05"),
    ] {
        assert_eq!(sqlstate_of(sql), state, "{sql}");
    }
    assert_eq!(count("sturdy.queue"), 0, "nothing written");
}
