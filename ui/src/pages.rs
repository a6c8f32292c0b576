//! The pages: the overview, a queue, an instance, dead letters, stuck
//! instances, batch jobs.

use super::*;

/// Queues, and outbox subscriptions, the overview shows at most.
pub(crate) const OVERVIEW_ROWS: i64 = 500;

/// Batch jobs the overview shows at most (the batch jobs page has more).
const OVERVIEW_BATCHES: i64 = 20;

/// Samples a sparkline or a bar chart draws at most, the newest: all of the
/// last hour at the default rate of one a minute, the last 30 minutes at
/// one every 15 s.
const HISTORY_POINTS: i64 = 120;

/// Checkpoints an instance's page shows at most, in step order.
const CHECKPOINTS: i64 = 200;

/// Instances a search lists at most.
const FOUND: i64 = 20;

/// Characters of a checkpoint's value its row shows.
const VALUE_SHOWN: usize = 500;

pub(crate) async fn overview(State(app): State<Shared>) -> Page {
    let c = app.pool.get().await?;
    let last = c
        .query_one(
            "SELECT to_char(max(sampled_at), 'YYYY-MM-DD HH24:MI:SS TZ'),
                    extract(epoch FROM now() - max(sampled_at))::float8
               FROM sturdy.samples",
            &[],
        )
        .await?;
    let sampled_at = text(&last, 0);
    // the latest sample of each thing (from the last sampling only), at
    // most OVERVIEW_ROWS + 1 of each kind in the primary key's order, so
    // that many queues cannot push the outbox or the health signals off
    let latest = c
        .query(
            "WITH last AS (SELECT max(sampled_at) AS at FROM sturdy.samples)
             SELECT s.kind::text, s.name::text, s.subscriber, s.figures::text,
                    (s.figures->>'ready')::int8, (s.figures->>'leased')::int8, (s.figures->>'sleeping')::int8,
                    (s.figures->>'oldest_ready_seconds')::float8, (s.figures->>'paused')::bool,
                    (s.figures->>'held_back')::int8,
                    (s.figures->>'pending')::int8, (s.figures->>'retrying')::int8, (s.figures->>'dead')::int8,
                    (s.figures->>'oldest_pending_seconds')::float8,
                    (s.figures->>'count')::int8, s.figures->>'value', (s.figures->>'ok')::bool, s.figures->>'meaning',
                    COALESCE((s.figures->>'estimated')::bool, false), COALESCE((s.figures->>'more')::bool, false),
                    (s.figures->>'failing')::int8, (s.figures->>'dead')::int8
               FROM unnest(ARRAY['health', 'instances', 'queue', 'outbox']) WITH ORDINALITY AS k(kind, n)
              CROSS JOIN LATERAL (
                    SELECT * FROM sturdy.samples
                     WHERE kind = k.kind AND sampled_at = (SELECT at FROM last)
                     ORDER BY name, subscriber
                     LIMIT $1) s
              ORDER BY k.n, s.name, s.subscriber",
            &[&(OVERVIEW_ROWS + 1)],
        )
        .await?;
    let (queues, more_queues) = first_of(&latest, "queue", OVERVIEW_ROWS);
    let (outbox, more_outbox) = first_of(&latest, "outbox", OVERVIEW_ROWS);
    // an hour of history of each queue and subscription shown, newest
    // first by the primary key: depth and throughput
    let (mut kinds, mut names, mut subscribers) = (Vec::new(), Vec::new(), Vec::new());
    for r in queues.iter().chain(&outbox) {
        kinds.push(text(r, 0));
        names.push(text(r, 1));
        subscribers.push(text(r, 2));
    }
    let history = c
        .query(
            "SELECT t.n, h.depth, h.ended
               FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS t(kind, name, subscriber, n)
              CROSS JOIN LATERAL (
                    SELECT sampled_at,
                           COALESCE((figures->>'ready')::float8 + (figures->>'leased')::float8,
                                    (figures->>'pending')::float8) AS depth,
                           COALESCE((figures->>'ended')::float8, (figures->>'delivered')::float8, 0) AS ended
                      FROM sturdy.samples
                     WHERE kind = t.kind AND name = t.name AND subscriber = t.subscriber
                       AND sampled_at > now() - interval '1 hour'
                     ORDER BY sampled_at DESC
                     LIMIT $4) h
              ORDER BY t.n, h.sampled_at",
            &[&kinds, &names, &subscribers, &HISTORY_POINTS],
        )
        .await?;
    let history = series(&history, kinds.len());
    let shown_queues: Vec<String> = queues.iter().map(|r| text(r, 1)).collect();
    let limits = c
        .query(
            "SELECT queue::text, running, per_key, per_second, burst FROM sturdy.queue_limits
              WHERE queue = ANY($1::text[])",
            &[&shown_queues],
        )
        .await?;
    let batches = c
        .query(
            "SELECT name, done, remaining, rows_per_second, eta::text, complete
               FROM sturdy.batch_jobs ORDER BY complete, updated_at DESC LIMIT $1",
            &[&(OVERVIEW_BATCHES + 1)],
        )
        .await?;
    let (batches, more_batches) = first(&batches, OVERVIEW_BATCHES);
    drop(c);
    let of = |kind: &'static str| latest.iter().filter(move |r| text(r, 0) == kind);
    let limit_of = |queue: &str| {
        limits.iter().find(|l| text(l, 0) == queue).map(|l| {
            let mut parts = Vec::new();
            if let Some(n) = l.get::<_, Option<i32>>(1) {
                parts.push(format!("running {n}"));
            }
            if let Some(n) = l.get::<_, Option<i32>>(2) {
                parts.push(format!("per key {n}"));
            }
            if let Some(r) = l.get::<_, Option<f64>>(3) {
                parts.push(format!(
                    "{r}/s, burst {}",
                    l.get::<_, Option<i32>>(4).unwrap_or(0)
                ));
            }
            parts.join(", ")
        })
    };
    Ok(layout(
        "Overview",
        html! {
            h1 { "Overview" }
            @if sampled_at.is_empty() {
                p.bad { "No sample yet. Counts here are those sturdy.sample() keeps once a minute \
                         (sturdy-ui calls it unless started with --sample-every 0; pg_cron can)." }
            } @else {
                p.muted { "Counts as of the last sample, " (sampled_at) " (" (seconds(last.get::<_, Option<f64>>(1))) " ago): "
                          "sturdy.sample() keeps them once a minute, so this page never counts the live tables." }
            }
            h2 { "Health" }
            p.signals {
                @for r in of("health") {
                    @let ok = r.get::<_, Option<bool>>(16) == Some(true);
                    span class=(if ok { "signal ok" } else { "signal bad" }) title=(shown(&text(r, 17))) {
                        (shown(&text(r, 1))) ": " (shown(&text(r, 15)))
                    }
                }
            }
            @for r in of("health").filter(|r| r.get::<_, Option<bool>>(16) != Some(true)) {
                p { span.bad { (shown(&text(r, 1))) } ": " (shown(&text(r, 17))) }
            }
            h2 { "Queues" }
            table {
                tr { th { "queue" } th { "ready" } th { "leased" } th { "sleeping" } th { "oldest ready" }
                     th { "limits" } th { "held back" } th { "failing" } th { "dead" }
                     th { "depth, last hour" } th { "ended each sample" } }
                @for (r, s) in queues.iter().zip(&history) {
                    @let name = text(r, 1);
                    tr {
                        td { a href=(format!("/queue?name={}", encode(&name))) { (shown(&name)) }
                             @if r.get::<_, Option<bool>>(8) == Some(true) { " " span.bad { "paused" } } }
                        td.n { (about(r, 4)) } td.n { (int(r, 5)) } td.n { (about(r, 6)) }
                        td.n { (seconds(r.get::<_, Option<f64>>(7))) }
                        td { (shown(&limit_of(&name).unwrap_or_default())) }
                        td.n { (int(r, 9)) }
                        td.n { (int(r, 20)) }
                        td.n { @if int(r, 21) > 0 { a.bad href=(format!("/queue?name={}", encode(&name))) { (int(r, 21)) } }
                               @else { "0" } }
                        td { (sparkline(&s.iter().map(|p| p.0).collect::<Vec<_>>(), &format!("{name}: ready and leased, last hour"))) }
                        td { (sparkline(&s.iter().map(|p| p.1).collect::<Vec<_>>(), &format!("{name}: rows ended per minute, last hour"))) }
                    }
                }
            }
            @if more_queues { (more(&format!("the first {OVERVIEW_ROWS} queues by name"), html! {
                "The queue page of any one shows its rows; " code { "sturdy.queue_stats" } " counts them all (reading the live tables)." })) }
            h2 { "Outbox" }
            table {
                tr { th { "event" } th { "subscriber" } th { "pending" } th { "retrying" } th { "dead" }
                     th { "oldest pending" } th { "pending, last hour" } th { "delivered each sample" } }
                @for (r, s) in outbox.iter().zip(&history[queues.len()..]) {
                    @let (event, subscriber) = (text(r, 1), text(r, 2));
                    tr {
                        td { (shown(&event)) } td { (shown(&subscriber)) }
                        td.n { (int(r, 10)) } td.n { (int(r, 11)) }
                        td.n { @if int(r, 12) > 0 { a.bad href="/dead" { (int(r, 12)) } } @else { "0" } }
                        td.n { (seconds(r.get::<_, Option<f64>>(13))) }
                        td { (sparkline(&s.iter().map(|p| p.0).collect::<Vec<_>>(), &format!("{event}: pending, last hour"))) }
                        td { (sparkline(&s.iter().map(|p| p.1).collect::<Vec<_>>(), &format!("{event}: delivered per minute"))) }
                    }
                }
            }
            @if more_outbox { (more(&format!("the first {OVERVIEW_ROWS} subscriptions by event and subscriber"), html! {
                code { "sturdy.outbox_stats" } " counts them all (reading the live tables)." })) }
            h2 { "Workflow instances" }
            table {
                tr { @for r in of("instances") { th { (shown(&text(r, 1))) } } }
                tr { @for r in of("instances") {
                    td.n { @if text(r, 1) == "stuck" && int(r, 14) > 0 { a.bad href="/stuck" { (about(r, 14)) } }
                           @else { (about(r, 14)) } }
                } }
            }
            h2 { a href="/batches" { "Batch jobs" } }
            table {
                tr { th { "job" } th { "progress" } th { "done" } th { "remaining" } th { "rows/s" } th { "time left" } }
                @for b in batches {
                    @let (done, remaining) = (int(b, 1), int(b, 2));
                    tr {
                        td { (shown(&text(b, 0))) }
                        td { div.bar { div style=(format!("width:{:.0}%", percent(done, remaining))) {} } }
                        td.n { (done) } td.n { (remaining) } td.n { (int(b, 3)) }
                        td { @if b.get::<_, Option<bool>>(5) == Some(true) { "complete" } @else { (text(b, 4)) } }
                    }
                }
            }
            @if more_batches { (more(&format!("the first {OVERVIEW_BATCHES} batch jobs"), html! { a href="/batches" { "All of them →" } })) }
        },
    ))
}

/// Figure `col` of a sample row as `sample()` gave it: "≈" before an
/// estimate (a part of a table past what it counts row by row), "+" after
/// a count it stopped (stuck instances).
fn about(r: &Row, col: usize) -> String {
    let n = int(r, col);
    if r.get::<_, bool>(18) {
        format!("≈ {n}")
    } else if r.get::<_, bool>(19) {
        format!("{n}+")
    } else {
        n.to_string()
    }
}

/// The rows of `kind` of the overview's latest sample: the first `n`, and
/// whether there were more.
fn first_of<'a>(rows: &'a [Row], kind: &str, n: i64) -> (Vec<&'a Row>, bool) {
    let mut of: Vec<&Row> = rows.iter().filter(|r| text(r, 0) == kind).collect();
    let more = of.len() as i64 > n;
    of.truncate(usize::try_from(n).unwrap_or(0));
    (of, more)
}

pub(crate) fn percent(done: i64, remaining: i64) -> f64 {
    if done + remaining == 0 {
        100.0
    } else {
        100.0 * done as f64 / (done + remaining) as f64
    }
}

pub(crate) fn seconds(s: Option<f64>) -> String {
    match s {
        None => "-".into(),
        Some(s) if s < 120.0 => format!("{s:.0} s"),
        Some(s) if s < 7200.0 => format!("{:.0} min", s / 60.0),
        Some(s) => format!("{:.1} h", s / 3600.0),
    }
}

/// A query string value.
pub(crate) fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[derive(Deserialize)]
pub(crate) struct QueueQuery {
    name: String,
    /// the keyset of the last row shown: its visible_at (as text) and seq
    after: Option<String>,
    seq: Option<i64>,
    note: Option<String>,
}

pub(crate) async fn queue_page(State(app): State<Shared>, Query(q): Query<QueueQuery>) -> Page {
    let c = app.pool.get().await?;
    let rows = c
        .query(
            "SELECT q.workflow::text, q.visible_at::text, q.seq, q.leased_until::text, q.takes::int8,
                    q.key::text, q.priority::int8, c.owner, c.held_until::text,
                    q.leased_until > now(), q.visible_at > now(), q.attempts::int8
               FROM sturdy.queue q
               LEFT JOIN sturdy.claims c ON c.workflow = q.workflow
              WHERE q.queue = $1
                AND (q.visible_at, q.seq) > (COALESCE($2::text::timestamptz, '-infinity'), COALESCE($3::int8, 0))
                AND q.visible_at < 'infinity'
              ORDER BY q.visible_at, q.seq
              LIMIT $4",
            &[&q.name, &q.after, &q.seq, &(PAGE + 1)],
        )
        .await?;
    let (rows, more_rows) = first(&rows, PAGE);
    // the dead rows: at 'infinity', the end of take's index
    let dead = c
        .query(
            "SELECT q.workflow::text, q.attempts::int8, q.last_error, q.last_sqlstate, q.failed_at::text
               FROM sturdy.queue q
              WHERE q.queue = $1 AND q.visible_at = 'infinity'
              ORDER BY q.seq
              LIMIT $2",
            &[&q.name, &(PAGE + 1)],
        )
        .await?;
    let (dead, more_dead) = first(&dead, PAGE);
    let next = rows.last().filter(|_| more_rows).map(|r| {
        format!(
            "/queue?name={}&after={}&seq={}",
            encode(&q.name),
            encode(&text(r, 1)),
            int(r, 2)
        )
    });
    Ok(layout(
        "Queue",
        html! {
            h1 { "Queue " code { (shown(&q.name)) } }
            @if let Some(note) = &q.note { p.ok { (note_text(note)) } }
            p.muted { "Rows in take's order (visible_at, then arrival), " (PAGE) " a page." }
            table {
                tr { th { "workflow" } th { "state" } th { "visible at" } th { "leased until" } th { "takes" }
                     th { "failed" } th { "key" } th { "priority" } th { "claim held by" } th { "claim until" } }
                @for r in rows {
                    tr {
                        td { a href=(format!("/instance?q={}", encode(&text(r, 0)))) { (shown(&text(r, 0))) } }
                        td { @if r.get::<_, Option<bool>>(9) == Some(true) { "leased" }
                             @else if r.get::<_, Option<bool>>(10) == Some(true) { "sleeping" } @else { "ready" } }
                        td { (text(r, 1)) } td { (text(r, 3)) } td.n { (int(r, 4)) }
                        td.n { @if int(r, 11) > 0 { span.bad { (int(r, 11)) } } }
                        td { (shown(&text(r, 5))) } td.n { (int(r, 6)) }
                        td { (shown(&text(r, 7))) } td { (text(r, 8)) }
                    }
                }
            }
            @if rows.is_empty() { p { "No rows." } }
            @if let Some(next) = next { p { a href=(next) { "Next " (PAGE) " →" } } }
            h2 { "Dead" }
            p.muted { "Rows whose passes failed the queue's max_attempts times: never handed out again until redriven." }
            @if dead.is_empty() { p { "None." } } @else {
                table {
                    tr { th { "workflow" } th { "attempts" } th { "last error" } th { "code" } th { "failed at" } th { "" } }
                    @for r in dead {
                        tr {
                            td { a href=(format!("/instance?q={}", encode(&text(r, 0)))) { (shown(&text(r, 0))) } }
                            td.n { (int(r, 1)) } td { (shown(&text(r, 2))) } td { (shown(&text(r, 3))) } td { (text(r, 4)) }
                            td { @if app.config.allow_actions {
                                form.inline method="post" action="/queue/redrive" {
                                    input type="hidden" name="csrf" value=(app.csrf);
                                    input type="hidden" name="queue" value=(q.name);
                                    input type="hidden" name="workflow" value=(text(r, 0));
                                    button type="submit" { "Redrive" }
                                }
                            } }
                        }
                    }
                }
                @if more_dead { (more(&format!("the first {PAGE} dead rows"), html! {
                    code { "SELECT * FROM sturdy.queue WHERE visible_at = 'infinity'" } " lists them all." })) }
            }
        },
    ))
}

#[derive(Deserialize)]
pub(crate) struct Find {
    q: Option<String>,
    note: Option<String>,
    /// the keyset of the checkpoints: the last step shown
    after: Option<String>,
}

pub(crate) async fn instance_page(State(app): State<Shared>, Query(f): Query<Find>) -> Page {
    let q = f.q.unwrap_or_default();
    let c = app.pool.get().await?;
    // by id, by workflow or by business key (a key may have several)
    let found = c
        .query(
            "SELECT id, process::text, business_key::text, workflow::text, queue::text, status::text, revision,
                    variables::text, last_error, created_at::text, updated_at::text, finished_at::text
               FROM sturdy.instances
              WHERE id = CASE WHEN $1 ~ '^[0-9]{1,18}$' THEN $1::int8 END
              UNION ALL
             SELECT id, process, business_key, workflow, queue, status, revision,
                    variables::text, last_error, created_at::text, updated_at::text, finished_at::text
               FROM sturdy.instances WHERE workflow = $1
              UNION ALL
             (SELECT id, process, business_key, workflow, queue, status, revision,
                    variables::text, last_error, created_at::text, updated_at::text, finished_at::text
               FROM sturdy.instances WHERE business_key = $1 ORDER BY id DESC LIMIT $2)
              LIMIT $2",
            &[&q, &(FOUND + 1)],
        )
        .await?;
    let (found, more_found) = first(&found, FOUND);
    let one = (found.len() == 1).then(|| &found[0]);
    let mut history = Vec::new();
    let mut claim = None;
    let mut queued = Vec::new();
    let mut idempotency = Vec::new();
    if let Some(i) = one {
        let (id, workflow, queue) = (int(i, 0), text(i, 3), text(i, 4));
        // by the primary key (workflow, step), in its order: sturdy.load()
        // would read every checkpoint to sort them by time; a value is sent
        // only as far as the page shows it
        history = c
            .query(
                "SELECT step, left(value::text, $3), recorded_at::text, length(value::text)::int8
                   FROM sturdy.checkpoints
                  WHERE workflow = $1 AND step > COALESCE($2, '')
                  ORDER BY step
                  LIMIT $4",
                &[
                    &workflow,
                    &f.after,
                    &(VALUE_SHOWN as i32),
                    &(CHECKPOINTS + 1),
                ],
            )
            .await?;
        claim = c
            .query_opt(
                "SELECT token, held_until::text, owner, held_until > now() FROM sturdy.claims WHERE workflow = $1",
                &[&workflow],
            )
            .await?;
        queued = c
            .query(
                "SELECT queue::text, visible_at::text, leased_until::text, takes::int8 FROM sturdy.queue
                  WHERE queue = $1 AND workflow = $2",
                &[&queue, &workflow],
            )
            .await?;
        idempotency = c
            .query(
                "SELECT key::text, expires_at::text FROM sturdy.idempotency_keys WHERE instance = $1 LIMIT 5",
                &[&id],
            )
            .await?;
    }
    drop(c);
    let (history, more_history) = first(&history, CHECKPOINTS);
    let next_history = history
        .last()
        .filter(|_| more_history)
        .map(|h| format!("/instance?q={}&after={}", encode(&q), encode(&text(h, 0))));
    Ok(layout(
        "Instance",
        html! {
            @if let Some(note) = &f.note { p.ok { (note_text(note)) } }
            @match one {
                None => {
                    h1 { "Instances" }
                    @if q.is_empty() { p { "Find an instance by its id, workflow or business key (search box above)." } }
                    @else if found.is_empty() { p { "No instance has the id, workflow or business key " code { (shown(&q)) } "." } }
                    @else {
                        table {
                            tr { th { "id" } th { "process" } th { "business key" } th { "status" } th { "updated" } }
                            @for i in found {
                                tr { td { a href=(format!("/instance?q={}", int(i, 0))) { (int(i, 0)) } }
                                     td { (shown(&text(i, 1))) } td { (shown(&text(i, 2))) }
                                     td { (text(i, 5)) } td { (text(i, 10)) } }
                            }
                        }
                        @if more_found { (more(&format!("the first {FOUND} instances (by this business key, the newest first)"), html! {})) }
                    }
                }
                Some(i) => {
                    h1 { "Instance " (int(i, 0)) }
                    table {
                        tr { th { "process" } td { (shown(&text(i, 1))) } }
                        tr { th { "business key" } td { (shown(&text(i, 2))) } }
                        tr { th { "workflow" } td { (shown(&text(i, 3))) } }
                        tr { th { "queue" } td { a href=(format!("/queue?name={}", encode(&text(i, 4)))) { (shown(&text(i, 4))) } } }
                        tr { th { "status" } td { (text(i, 5)) } }
                        tr { th { "revision" } td { (int(i, 6)) } }
                        tr { th { "variables" } td { pre { (clipped(&text(i, 7), 2000)) } } }
                        tr { th { "last error" } td { pre.error { (clipped(&text(i, 8), 2000)) } } }
                        tr { th { "created, updated, finished" } td { (text(i, 9)) ", " (text(i, 10)) ", " (text(i, 11)) } }
                        tr { th { "idempotency key" } td {
                            @for k in &idempotency { (shown(&text(k, 0))) " (until " (text(k, 1)) ") " }
                            @if idempotency.is_empty() { span.muted { "none" } } } }
                    }
                    @if app.config.allow_actions && (text(i, 5) == "pending" || text(i, 5) == "running") {
                        form method="post" action=(format!("/instances/{}/cancel", int(i, 0))) {
                            input type="hidden" name="csrf" value=(app.csrf);
                            input type="hidden" name="from" value=(text(i, 5));
                            input type="hidden" name="revision" value=(int(i, 6));
                            button type="submit" { "Cancel this instance" }
                        }
                    }
                    h2 { "Claim" }
                    @match &claim {
                        Some(cl) => p { "token " (int(cl, 0)) ", held by " (shown(&text(cl, 2))) " until " (text(cl, 1))
                                         @if cl.get::<_, Option<bool>>(3) != Some(true) { " (lapsed)" } },
                        None => p.muted { "No claim." },
                    }
                    h2 { "Queue rows" }
                    @for r in &queued {
                        p { (shown(&text(r, 0))) ": visible at " (text(r, 1)) ", leased until " (text(r, 2)) ", taken " (int(r, 3)) " times" }
                    }
                    @if queued.is_empty() { p.muted { "None." } }
                    h2 { "History (checkpoints)" }
                    p.muted { "By step name, " (CHECKPOINTS) " at a time" @if let Some(after) = &f.after { ", after " code { (shown(after)) } } "." }
                    table {
                        tr { th { "step" } th { "value" } th { "recorded at" } }
                        @for h in history {
                            @let length = usize::try_from(int(h, 3)).unwrap_or(0);
                            tr { td { (shown(&text(h, 0))) } td { pre { (clipped_of(&text(h, 1), length, VALUE_SHOWN)) } } td { (text(h, 2)) } }
                        }
                    }
                    @if history.is_empty() { p.muted { "None." } }
                    @if let Some(next) = next_history {
                        (more(&format!("{}{CHECKPOINTS} checkpoints", if f.after.is_none() { "the first " } else { "" }),
                              html! { a href=(next) { "Next " (CHECKPOINTS) " →" } }))
                    }
                }
            }
        },
    ))
}

pub(crate) fn note_text(note: &str) -> &'static str {
    match note {
        "redriven" => "Redriven: the delivery is pending again, due now.",
        "not-dead" => "Nothing redriven: the delivery is not dead (any more).",
        "cancelled" => "Cancelled.",
        "workflow-redriven" => "Redriven: the workflow is ready again, its attempts reset.",
        "workflow-not-dead" => "Nothing redriven: the workflow is not dead (any more).",
        "moved-on" => "Not cancelled: the instance moved on since the page was shown.",
        _ => "",
    }
}

#[derive(Deserialize)]
pub(crate) struct After {
    after: Option<i64>,
    note: Option<String>,
}

pub(crate) async fn dead_page(State(app): State<Shared>, Query(a): Query<After>) -> Page {
    let c = app.pool.get().await?;
    let rows = c
        .query(
            "SELECT d.id, o.event::text, d.subscriber, d.attempts::int8, d.last_error, d.last_sqlstate::text,
                    o.payload::text, o.aggregate_id::text, o.created_at::text
               FROM sturdy.deliveries d JOIN sturdy.outbox o ON o.id = d.outbox_id
              WHERE d.state = 'dead' AND d.id > $1
              ORDER BY d.id LIMIT $2",
            &[&a.after.unwrap_or(0), &(PAGE + 1)],
        )
        .await?;
    let (rows, more) = first(&rows, PAGE);
    let next = rows
        .last()
        .filter(|_| more)
        .map(|r| format!("/dead?after={}", int(r, 0)));
    Ok(layout(
        "Dead letters",
        html! {
            h1 { "Dead letters" }
            @if let Some(note) = &a.note { p.ok { (note_text(note)) } }
            p.muted { "Deliveries that failed max_attempts times, oldest first, " (PAGE) " a page." }
            table {
                tr { th { "delivery" } th { "event" } th { "subscriber" } th { "attempts" } th { "error" }
                     th { "SQLSTATE" } th { "payload" } th { "aggregate" } th { "emitted" } th { "" } }
                @for r in rows {
                    tr {
                        td.n { (int(r, 0)) } td { (shown(&text(r, 1))) } td { (shown(&text(r, 2))) }
                        td.n { (int(r, 3)) } td { pre.error { (clipped(&text(r, 4), 500)) } }
                        td { code { (shown(&text(r, 5))) } } td { pre { (clipped(&text(r, 6), 500)) } }
                        td { (shown(&text(r, 7))) } td { (text(r, 8)) }
                        td { @if app.config.allow_actions {
                            form.inline method="post" action=(format!("/deliveries/{}/redrive", int(r, 0))) {
                                input type="hidden" name="csrf" value=(app.csrf);
                                button type="submit" { "Redrive" }
                            }
                        } }
                    }
                }
            }
            @if rows.is_empty() { p { "No dead letters." } }
            @if let Some(next) = next { p { a href=(next) { "Next " (PAGE) " →" } } }
        },
    ))
}

pub(crate) async fn stuck_page(State(app): State<Shared>) -> Page {
    let c = app.pool.get().await?;
    let rows = c
        .query(
            "SELECT s.id, s.process, s.business_key, s.workflow, s.status, s.stalled_since::text,
                    (SELECT i.revision FROM sturdy.instances i WHERE i.id = s.id)
               FROM sturdy.stuck('1 hour', $1::int4) s",
            &[&((PAGE + 1) as i32)],
        )
        .await?;
    let (rows, more_rows) = first(&rows, PAGE);
    Ok(layout(
        "Stuck instances",
        html! {
            h1 { "Stuck instances" }
            p.muted { "Pending or running, without a status change or a checkpoint for an hour; the longest stalled first, at most " (PAGE) "." }
            table {
                tr { th { "id" } th { "process" } th { "business key" } th { "status" } th { "stalled since" } th { "" } }
                @for r in rows {
                    tr {
                        td { a href=(format!("/instance?q={}", int(r, 0))) { (int(r, 0)) } }
                        td { (shown(&text(r, 1))) } td { (shown(&text(r, 2))) } td { (text(r, 4)) } td { (text(r, 5)) }
                        td { @if app.config.allow_actions {
                            form.inline method="post" action=(format!("/instances/{}/cancel", int(r, 0))) {
                                input type="hidden" name="csrf" value=(app.csrf);
                                input type="hidden" name="from" value=(text(r, 4));
                                input type="hidden" name="revision" value=(int(r, 6));
                                button type="submit" { "Cancel" }
                            }
                        } }
                    }
                }
            }
            @if more_rows { (more(&format!("the {PAGE} longest stalled"), html! {
                code { "sturdy.stuck('1 hour')" } " lists them all." })) }
            @if rows.is_empty() { p { "Nothing is stuck." } }
        },
    ))
}

pub(crate) async fn batches_page(State(app): State<Shared>) -> Page {
    let c = app.pool.get().await?;
    let jobs = c
        .query(
            "SELECT name, target::text, done, remaining, chunk::int8, chunks::int8, rows_per_second, eta::text,
                    last_seconds::float8, complete
               FROM sturdy.batch_jobs ORDER BY complete, updated_at DESC LIMIT $1",
            &[&(PAGE + 1)],
        )
        .await?;
    let (jobs, more_jobs) = first(&jobs, PAGE);
    // an hour of history of each job shown, newest first by the primary key
    let names: Vec<String> = jobs.iter().map(|j| text(j, 0)).collect();
    let history = c
        .query(
            "SELECT t.name, to_char(h.sampled_at, 'HH24:MI'), h.chunk, h.last_seconds
               FROM unnest($1::text[]) WITH ORDINALITY AS t(name, n)
              CROSS JOIN LATERAL (
                    SELECT sampled_at, (figures->>'chunk')::float8 AS chunk,
                           (figures->>'last_seconds')::float8 AS last_seconds
                      FROM sturdy.samples
                     WHERE kind = 'batch' AND name = t.name AND subscriber = ''
                       AND sampled_at > now() - interval '1 hour'
                     ORDER BY sampled_at DESC
                     LIMIT $2) h
              ORDER BY t.n, h.sampled_at",
            &[&names, &HISTORY_POINTS],
        )
        .await?;
    drop(c);
    Ok(layout(
        "Batch jobs",
        html! {
            h1 { "Batch jobs" }
            @for j in jobs {
                @let name = text(j, 0);
                @let (done, remaining) = (int(j, 2), int(j, 3));
                h2 { (shown(&name)) " " span.muted { "on " (shown(&text(j, 1))) } }
                table {
                    tr { th { "progress" } td { div.bar { div style=(format!("width:{:.0}%", percent(done, remaining))) {} } } }
                    tr { th { "done, remaining" } td { (done) ", " (remaining) } }
                    tr { th { "chunk, chunks" } td { (int(j, 4)) ", " (int(j, 5)) } }
                    tr { th { "rows/s, time left" } td { (int(j, 6)) ", "
                        @if j.get::<_, Option<bool>>(9) == Some(true) { "complete" } @else { (text(j, 7)) } } }
                }
                @let sizes: Vec<(String, f64)> = history.iter().filter(|h| text(h, 0) == name).map(|h| (text(h, 1), h.get::<_, Option<f64>>(2).unwrap_or(0.0))).collect();
                @let secs: Vec<(String, f64)> = history.iter().filter(|h| text(h, 0) == name).map(|h| (text(h, 1), h.get::<_, Option<f64>>(3).unwrap_or(0.0))).collect();
                @if !sizes.is_empty() {
                    p { "Chunk size, last hour" br; (bars(&sizes, &format!("{name}: chunk size per minute"))) }
                    p { "Seconds of the last chunk, last hour" br; (bars(&secs, &format!("{name}: seconds per chunk"))) }
                }
            }
            @if jobs.is_empty() { p { "No named batch jobs." } }
            @if more_jobs { (more(&format!("the first {PAGE} batch jobs (unfinished first, then the latest to run)"), html! {
                code { "sturdy.batch_jobs" } " lists them all." })) }
        },
    ))
}
