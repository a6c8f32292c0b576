//! A pg_sturdy worker in Rust (tokio-postgres). Takes each job with a claim,
//! does its steps once each (a step recorded by an earlier pass is not done
//! again), finishes it; sleeps on LISTEN when the queue is empty, or polls
//! with backoff (`--poll`: behind PgBouncer in transaction mode, which cannot
//! LISTEN). SIGTERM ends it cleanly: a job in hand is handed back at once.
//!
//!     sturdy-worker CONNECTION_STRING [QUEUE] [--poll] [--lease SECONDS]
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Notify, watch};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, Client, Error, NoTls};

const STEPS: [&str; 3] = ["reserve", "charge", "ship"];

/// `query_typed`: parameters with their types and an unnamed statement, sent
/// in one round trip, which a pooler in transaction mode keeps together.
async fn run(db: &Client, sql: &str, params: &[(&(dyn ToSql + Sync), Type)]) -> Result<Vec<tokio_postgres::Row>, Error> {
    db.query_typed(sql, params).await
}

/// The job's real work: here, a value saying who did it after what.
fn do_step(step: &str, workflow: &str, done: &[String]) -> Value {
    let mut after = done.to_vec();
    after.sort();
    json!({"step": step, "workflow": workflow, "pid": std::process::id(), "after": after})
}

async fn run_pass(db: &Client, queue: &str, workflow: &str, receipt: SystemTime, token: i64,
                  stop: &watch::Receiver<bool>) -> Result<(), Error> {
    let mut done: Vec<String> = run(db, "SELECT step FROM sturdy.load($1)", &[(&workflow, Type::TEXT)]).await?
        .iter().map(|r| r.get(0)).collect();
    for step in STEPS {
        if *stop.borrow() { // hand the job back now, not when its lease ends
            run(db, "SELECT sturdy.wake_at($1, $2, now(), $3)",
                &[(&workflow, Type::TEXT), (&receipt, Type::TIMESTAMPTZ), (&queue, Type::TEXT)]).await?;
            run(db, "SELECT sturdy.release($1, $2)", &[(&workflow, Type::TEXT), (&token, Type::INT8)]).await?;
            return Ok(());
        }
        if !done.iter().any(|d| d == step) {
            let value = do_step(step, workflow, &done);
            run(db, "SELECT recorded FROM sturdy.record($1, $2, $3, $4)", &[(&workflow, Type::TEXT),
                (&step, Type::TEXT), (&value, Type::JSONB), (&token, Type::INT8)]).await?;
            done.push(step.to_string());
        }
    }
    run(db, "SELECT sturdy.finish($1, $2, $3, queue => $4)", &[(&workflow, Type::TEXT), (&token, Type::INT8),
        (&receipt, Type::TIMESTAMPTZ), (&queue, Type::TEXT)]).await?;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let poll = argv.iter().any(|a| a == "--poll");
    let lease: f64 = argv.iter().position(|a| a == "--lease").map_or(30.0, |i| argv[i + 1].parse().unwrap());
    let plain: Vec<&String> = argv.iter().enumerate()
        .filter(|(i, a)| !a.starts_with("--") && (*i == 0 || argv[i - 1] != "--lease")).map(|(_, a)| a).collect();
    let queue = plain.get(1).map_or("default", |q| q.as_str());
    let (db, mut connection) = tokio_postgres::connect(plain[0], NoTls).await?;
    let woken = std::sync::Arc::new(Notify::new());
    let notified = woken.clone();
    tokio::spawn(async move { // drives the connection; a NOTIFY wakes the loop
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let AsyncMessage::Notification(_) = message { notified.notify_one(); }
        }
    });
    let (stop_tx, stop) = watch::channel(false);
    let waker = woken.clone();
    tokio::spawn(async move {
        let (mut term, mut int) = (signal(SignalKind::terminate()).unwrap(), signal(SignalKind::interrupt()).unwrap());
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        stop_tx.send_replace(true);
        waker.notify_one();
    });
    if !poll { db.batch_execute("LISTEN sturdy").await?; }
    let mut backoff = Duration::from_millis(50);
    while !*stop.borrow() {
        let jobs = run(&db, "SELECT workflow, receipt, token FROM sturdy.take($1, make_interval(secs => $2), \
                             claim => true, wake => $3)",
                       &[(&queue, Type::TEXT), (&lease, Type::FLOAT8), (&!poll, Type::BOOL)]).await?;
        let Some(job) = jobs.first() else {
            // a poller backs off up to a second; a listener sleeps until a NOTIFY (or a second, for a missed one)
            let _ = tokio::time::timeout(if poll { backoff } else { Duration::from_secs(1) }, woken.notified()).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
            continue;
        };
        backoff = Duration::from_millis(50);
        let (workflow, receipt, token): (String, SystemTime, Option<i64>) = (job.get(0), job.get(1), job.get(2));
        let Some(token) = token else { continue }; // another pass holds the workflow: it comes back later
        if let Err(e) = run_pass(&db, queue, &workflow, receipt, token, &stop).await {
            // fenced: a newer pass owns the workflow; drop this one
            if e.code().map(|c| c.code()) != Some("SD001") { return Err(e); }
        }
    }
    Ok(())
}
