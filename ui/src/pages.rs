//! The pages: the overview, a queue, an instance, dead letters, stuck
//! instances, batch jobs.

use super::*;

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
    // the latest sample of each thing (from the last sampling only)
    let latest = c
        .query(
            "SELECT kind::text, name::text, subscriber, figures::text,
                    (figures->>'ready')::int8, (figures->>'leased')::int8, (figures->>'sleeping')::int8,
                    (figures->>'oldest_ready_seconds')::float8, (figures->>'paused')::bool,
                    (figures->>'held_back')::int8,
                    (figures->>'pending')::int8, (figures->>'retrying')::int8, (figures->>'dead')::int8,
                    (figures->>'oldest_pending_seconds')::float8,
                    (figures->>'count')::int8, figures->>'value', (figures->>'ok')::bool, figures->>'meaning'
               FROM sturdy.samples
              WHERE sampled_at = (SELECT max(sampled_at) FROM sturdy.samples)
              ORDER BY kind, name, subscriber
              LIMIT 500",
            &[],
        )
        .await?;
    // an hour of history, per minute: depth and throughput
    let history = c
        .query(
            "SELECT kind::text, name::text, subscriber,
                    COALESCE((figures->>'ready')::float8 + (figures->>'leased')::float8,
                             (figures->>'pending')::float8),
                    COALESCE((figures->>'ended')::float8, (figures->>'delivered')::float8, 0)
               FROM sturdy.samples
              WHERE sampled_at > now() - interval '1 hour' AND kind IN ('queue', 'outbox')
              ORDER BY sampled_at
              LIMIT 60000",
            &[],
        )
        .await?;
    let limits = c
        .query(
            "SELECT queue::text, running, per_key, per_second, burst FROM sturdy.queue_limits
              ORDER BY queue LIMIT 1000",
            &[],
        )
        .await?;
    let batches = c
        .query(
            "SELECT name, done, remaining, rows_per_second, eta::text, complete
               FROM sturdy.batch_jobs ORDER BY complete, updated_at DESC LIMIT 20",
            &[],
        )
        .await?;
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
                     th { "limits" } th { "held back" } th { "depth, last hour" } th { "ended each sample" } }
                @for r in of("queue") {
                    @let name = text(r, 1);
                    @let s = series(&history, "queue", &name, "");
                    tr {
                        td { a href=(format!("/queue?name={}", encode(&name))) { (shown(&name)) }
                             @if r.get::<_, Option<bool>>(8) == Some(true) { " " span.bad { "paused" } } }
                        td.n { (int(r, 4)) } td.n { (int(r, 5)) } td.n { (int(r, 6)) }
                        td.n { (seconds(r.get::<_, Option<f64>>(7))) }
                        td { (shown(&limit_of(&name).unwrap_or_default())) }
                        td.n { (int(r, 9)) }
                        td { (sparkline(&s.iter().map(|p| p.0).collect::<Vec<_>>(), &format!("{name}: ready and leased, last hour"))) }
                        td { (sparkline(&s.iter().map(|p| p.1).collect::<Vec<_>>(), &format!("{name}: rows ended per minute, last hour"))) }
                    }
                }
            }
            h2 { "Outbox" }
            table {
                tr { th { "event" } th { "subscriber" } th { "pending" } th { "retrying" } th { "dead" }
                     th { "oldest pending" } th { "pending, last hour" } th { "delivered each sample" } }
                @for r in of("outbox") {
                    @let (event, subscriber) = (text(r, 1), text(r, 2));
                    @let s = series(&history, "outbox", &event, &subscriber);
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
            h2 { "Workflow instances" }
            table {
                tr { @for r in of("instances") { th { (shown(&text(r, 1))) } } }
                tr { @for r in of("instances") {
                    td.n { @if text(r, 1) == "stuck" && int(r, 14) > 0 { a.bad href="/stuck" { (int(r, 14)) } }
                           @else { (int(r, 14)) } }
                } }
            }
            h2 { a href="/batches" { "Batch jobs" } }
            table {
                tr { th { "job" } th { "progress" } th { "done" } th { "remaining" } th { "rows/s" } th { "time left" } }
                @for b in &batches {
                    @let (done, remaining) = (int(b, 1), int(b, 2));
                    tr {
                        td { (shown(&text(b, 0))) }
                        td { div.bar { div style=(format!("width:{:.0}%", percent(done, remaining))) {} } }
                        td.n { (done) } td.n { (remaining) } td.n { (int(b, 3)) }
                        td { @if b.get::<_, Option<bool>>(5) == Some(true) { "complete" } @else { (text(b, 4)) } }
                    }
                }
            }
        },
    ))
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
}

pub(crate) async fn queue_page(State(app): State<Shared>, Query(q): Query<QueueQuery>) -> Page {
    let c = app.pool.get().await?;
    let rows = c
        .query(
            "SELECT q.workflow::text, q.visible_at::text, q.seq, q.leased_until::text, q.takes::int8,
                    q.key::text, q.priority::int8, c.owner, c.held_until::text,
                    q.leased_until > now(), q.visible_at > now()
               FROM sturdy.queue q
               LEFT JOIN sturdy.claims c ON c.workflow = q.workflow
              WHERE q.queue = $1
                AND (q.visible_at, q.seq) > (COALESCE($2::text::timestamptz, '-infinity'), COALESCE($3::int8, 0))
              ORDER BY q.visible_at, q.seq
              LIMIT $4",
            &[&q.name, &q.after, &q.seq, &PAGE],
        )
        .await?;
    let next = rows.last().filter(|_| rows.len() as i64 == PAGE).map(|r| {
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
            p.muted { "Rows in take's order (visible_at, then arrival), " (PAGE) " a page." }
            table {
                tr { th { "workflow" } th { "state" } th { "visible at" } th { "leased until" } th { "takes" }
                     th { "key" } th { "priority" } th { "claim held by" } th { "claim until" } }
                @for r in &rows {
                    tr {
                        td { a href=(format!("/instance?q={}", encode(&text(r, 0)))) { (shown(&text(r, 0))) } }
                        td { @if r.get::<_, Option<bool>>(9) == Some(true) { "leased" }
                             @else if r.get::<_, Option<bool>>(10) == Some(true) { "sleeping" } @else { "ready" } }
                        td { (text(r, 1)) } td { (text(r, 3)) } td.n { (int(r, 4)) }
                        td { (shown(&text(r, 5))) } td.n { (int(r, 6)) }
                        td { (shown(&text(r, 7))) } td { (text(r, 8)) }
                    }
                }
            }
            @if rows.is_empty() { p { "No rows." } }
            @if let Some(next) = next { p { a href=(next) { "Next " (PAGE) " →" } } }
        },
    ))
}

#[derive(Deserialize)]
pub(crate) struct Find {
    q: Option<String>,
    note: Option<String>,
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
               FROM sturdy.instances WHERE business_key = $1 ORDER BY id DESC LIMIT 20)
              LIMIT 20",
            &[&q],
        )
        .await?;
    let one = (found.len() == 1).then(|| &found[0]);
    let mut history = Vec::new();
    let mut claim = None;
    let mut queued = Vec::new();
    let mut idempotency = Vec::new();
    if let Some(i) = one {
        let (id, workflow, queue) = (int(i, 0), text(i, 3), text(i, 4));
        history = c
            .query(
                "SELECT step, value::text, recorded_at::text FROM sturdy.load($1) LIMIT 200",
                &[&workflow],
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
                            @for i in &found {
                                tr { td { a href=(format!("/instance?q={}", int(i, 0))) { (int(i, 0)) } }
                                     td { (shown(&text(i, 1))) } td { (shown(&text(i, 2))) }
                                     td { (text(i, 5)) } td { (text(i, 10)) } }
                            }
                        }
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
                    table {
                        tr { th { "step" } th { "value" } th { "recorded at" } }
                        @for h in &history {
                            tr { td { (shown(&text(h, 0))) } td { pre { (clipped(&text(h, 1), 500)) } } td { (text(h, 2)) } }
                        }
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
            &[&a.after.unwrap_or(0), &PAGE],
        )
        .await?;
    let next = rows
        .last()
        .filter(|_| rows.len() as i64 == PAGE)
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
                @for r in &rows {
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
               FROM sturdy.stuck('1 hour') s
              ORDER BY s.stalled_since LIMIT $1",
            &[&PAGE],
        )
        .await?;
    Ok(layout(
        "Stuck instances",
        html! {
            h1 { "Stuck instances" }
            p.muted { "Pending or running, without a status change or a checkpoint for an hour; the longest stalled first, at most " (PAGE) "." }
            table {
                tr { th { "id" } th { "process" } th { "business key" } th { "status" } th { "stalled since" } th { "" } }
                @for r in &rows {
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
            &[&PAGE],
        )
        .await?;
    let history = c
        .query(
            "SELECT name::text, to_char(sampled_at, 'HH24:MI'), (figures->>'chunk')::float8,
                    (figures->>'last_seconds')::float8
               FROM sturdy.samples WHERE kind = 'batch' AND sampled_at > now() - interval '1 hour'
              ORDER BY sampled_at LIMIT 6000",
            &[],
        )
        .await?;
    drop(c);
    Ok(layout(
        "Batch jobs",
        html! {
            h1 { "Batch jobs" }
            @for j in &jobs {
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
        },
    ))
}
