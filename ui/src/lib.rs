//! sturdy-ui: the page an on-call engineer opens first. Queues, the
//! outbox, workflow instances and batch jobs at a glance with an hour of
//! history; a queue's rows; an instance and its history; dead letters with
//! redrive; stuck instances with cancel.
//!
//! - Server-rendered HTML (`maud`, which escapes every value), charts as
//!   inline SVG, no script and nothing fetched from elsewhere.
//! - Every query bounded: pages of at most [`PAGE`] rows by keyset, each
//!   list read one row past what it shows so that the page can say there is
//!   more, a `statement_timeout` on every connection; the overview reads the
//!   counts `sturdy.sample()` keeps (`sturdy.samples`, once a minute) instead
//!   of counting the live tables, and says so.
//! - No request waits for ever: a connection of the pool is waited for at
//!   most [`ACQUIRE_WITHIN`], a new one made within [`CONNECT_WITHIN`], and a
//!   whole request is given up after [`REQUEST_WITHIN`].
//! - Listens on 127.0.0.1 by default; any other address needs `--token`.
//!   Without a token, a request must name this server on loopback in its
//!   `Host` (a page of another site whose name was rebound to 127.0.0.1
//!   names itself); with one, a login opens a session of [`SESSION`] whose
//!   random id, not the token, is the cookie. Read-only unless
//!   `--allow-actions`; each action is a POST carrying the process's CSRF
//!   token and calls one pg_sturdy function as the role the DSN connects as.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Form, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use serde::Deserialize;
use tokio::sync::{Mutex, Semaphore};
use tokio_postgres::{Client, NoTls, Row};

mod access;
mod html;
mod pages;
mod pool;

use access::*;
use html::*;
use pages::*;
use pool::*;

pub const USAGE: &str = "usage: sturdy-ui --dsn DSN [--listen ADDR:PORT] [--token TOKEN] [--allow-actions] [--sample-every SECONDS]

  --dsn            a libpq connection string of a database with pg_sturdy
  --listen         default 127.0.0.1:8089; any other address needs --token
  --token          required of every request: Authorization: Bearer TOKEN, or the
                   session cookie a login at /login sets (12 hours)
  --allow-actions  show and accept redrive and cancel (read-only without it)
  --sample-every   call sturdy.sample() this often (default 60; 0: never, when
                   pg_cron does)";

/// Rows a page shows at most.
pub const PAGE: i64 = 50;

/// How long any query of the dashboard may run.
const STATEMENT_TIMEOUT_MS: u32 = 5_000;

/// Connections the dashboard holds at most.
const POOL: usize = 4;

/// How long a request waits for one of the pool's connections before the
/// page says the pool is busy.
pub const ACQUIRE_WITHIN: Duration = Duration::from_secs(5);

/// How long making a connection may take, the TCP connect and the startup
/// together (unless the DSN gives its own `connect_timeout`).
pub const CONNECT_WITHIN: Duration = Duration::from_secs(5);

/// How long a whole request may take: a database that stops answering in
/// the middle of a query (a frozen server, a dropped network) is not
/// caught by `statement_timeout`, which the server itself enforces.
pub const REQUEST_WITHIN: Duration = Duration::from_secs(60);

/// How long a login's session lasts (not extended by use).
pub const SESSION: Duration = Duration::from_secs(12 * 60 * 60);

#[derive(Clone, Debug)]
pub struct Config {
    pub dsn: String,
    pub listen: SocketAddr,
    pub token: Option<String>,
    pub allow_actions: bool,
    pub sample_every: Option<Duration>,
}

impl Config {
    /// The command line, checked: a listen address other than loopback
    /// without a token is refused.
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Config, String> {
        let mut dsn = None;
        let mut listen: SocketAddr = "127.0.0.1:8089".parse().map_err(|e| format!("{e}"))?;
        let mut token = None;
        let mut allow_actions = false;
        let mut sample_every = Some(Duration::from_secs(60));
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
            match arg.as_str() {
                "--dsn" => dsn = Some(value("--dsn")?),
                "--listen" => {
                    let v = value("--listen")?;
                    listen = v.parse().map_err(|_| {
                        format!("--listen {v:?}: give ADDR:PORT, e.g. 127.0.0.1:8089")
                    })?;
                }
                "--token" => {
                    let v = value("--token")?;
                    if v.len() < 16 {
                        return Err("--token must be at least 16 characters".into());
                    }
                    token = Some(v);
                }
                "--allow-actions" => allow_actions = true,
                "--sample-every" => {
                    let v = value("--sample-every")?;
                    let s: u64 = v
                        .parse()
                        .map_err(|_| format!("--sample-every {v:?}: give whole seconds"))?;
                    sample_every = (s > 0).then(|| Duration::from_secs(s));
                }
                "-h" | "--help" => return Err("".into()),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        let dsn = dsn.ok_or("--dsn is required")?;
        if !listen.ip().is_loopback() && token.is_none() {
            return Err(format!(
                "refusing to listen on {listen} without --token: anyone who reaches it would see \
                 your queues and instances. Give --token (16+ characters), or listen on 127.0.0.1 \
                 and reach it through a tunnel"
            ));
        }
        Ok(Config {
            dsn,
            listen,
            token,
            allow_actions,
            sample_every,
        })
    }
}

struct App {
    config: Config,
    pool: Pool,
    /// Carried by every action's form: a page of another site cannot know it.
    csrf: String,
    /// The sessions logins opened (only with a token).
    sessions: Sessions,
}

type Shared = Arc<App>;

/// A page that could not be made: its status and what to say.
#[derive(Debug)]
pub struct Failure {
    status: StatusCode,
    message: String,
    sqlstate: Option<String>,
}

impl Failure {
    fn internal(message: &str) -> Failure {
        Failure {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            sqlstate: None,
        }
    }

    fn database(e: &tokio_postgres::Error) -> Failure {
        let (message, sqlstate) = match e.as_db_error() {
            Some(db) => (
                match db.hint() {
                    Some(hint) => format!("{} ({hint})", db.message()),
                    None => db.message().to_string(),
                },
                Some(db.code().code().to_string()),
            ),
            None => (e.to_string(), None),
        };
        let status = match sqlstate.as_deref() {
            Some("42501") => StatusCode::FORBIDDEN,
            Some(s) if s.starts_with("22") => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Failure {
            status,
            message,
            sqlstate,
        }
    }

    fn busy(message: &str) -> Failure {
        Failure::refused(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    fn refused(status: StatusCode, message: &str) -> Failure {
        Failure {
            status,
            message: message.into(),
            sqlstate: None,
        }
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Failure {
        Failure::database(&e)
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let body = layout(
            "Error",
            html! {
                h1 { "Could not show this" }
                p.error { (shown(&self.message)) }
                @if let Some(code) = &self.sqlstate {
                    p { "SQLSTATE " code { (code) } }
                    @if code == "42501" {
                        p { "The role sturdy-ui connects as lacks a privilege: the extension's owner runs "
                            code { "SELECT sturdy.grant_usage('that_role')" } "." }
                    }
                }
            },
        );
        (self.status, body).into_response()
    }
}

type Page = Result<Markup, Failure>;

/// Make the router for `config` (its pool connects on first use).
pub fn router(config: Config) -> Result<Router, String> {
    let pool = Pool::new(&config.dsn)?;
    let csrf = random_hex(24).map_err(|e| format!("no randomness for the CSRF token: {e}"))?;
    let app: Shared = Arc::new(App {
        config,
        pool,
        csrf,
        sessions: Sessions::default(),
    });
    Ok(Router::new()
        .route("/", get(overview))
        .route("/queue", get(queue_page))
        .route("/instance", get(instance_page))
        .route("/dead", get(dead_page))
        .route("/stuck", get(stuck_page))
        .route("/batches", get(batches_page))
        .route("/deliveries/{id}/redrive", post(redrive))
        .route("/queue/redrive", post(redrive_workflow))
        .route("/instances/{id}/cancel", post(cancel))
        .route("/login", get(login_form).post(login))
        .route("/logout", post(logout))
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app))
}

/// Serve until interrupted; sample every `--sample-every` meanwhile.
pub async fn serve(config: Config) -> Result<(), String> {
    let listen = config.listen;
    let every = config.sample_every;
    let dsn = config.dsn.clone();
    let app = router(config)?;
    if let Some(every) = every {
        let pool = Pool::new(&dsn)?;
        tokio::spawn(async move {
            loop {
                if let Err(e) = sample(&pool).await {
                    eprintln!("sturdy-ui: sturdy.sample() failed: {}", e.message);
                }
                tokio::time::sleep(every).await;
            }
        });
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    eprintln!("sturdy-ui: listening on http://{listen}");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| e.to_string())
}

/// `n` random bytes as hex.
fn random_hex(n: usize) -> Result<String, getrandom::Error> {
    let mut bytes = vec![0u8; n];
    getrandom::getrandom(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

async fn sample(pool: &Pool) -> Result<(), Failure> {
    let c = pool.get().await?;
    c.execute("SELECT sturdy.sample()", &[]).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn a_public_address_needs_a_token() {
        assert!(Config::from_args(args("--dsn x --listen 0.0.0.0:8089")).is_err());
        assert!(
            Config::from_args(args(
                "--dsn x --listen 0.0.0.0:8089 --token 0123456789abcdef"
            ))
            .is_ok()
        );
        assert!(Config::from_args(args("--dsn x --listen 0.0.0.0:8089 --token short")).is_err());
        let c = Config::from_args(args("--dsn x")).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:8089");
        assert!(!c.allow_actions);
        assert!(
            Config::from_args(args("--listen 127.0.0.1:1")).is_err(),
            "--dsn is required"
        );
    }

    #[test]
    fn text_is_shown_as_text() {
        let page = html! { td { (shown("<script>alert('x')</script>\u{7}\"")) } }.into_string();
        assert!(!page.contains("<script>"));
        assert!(page.contains("&lt;script&gt;"));
        assert!(page.contains("\\u{0007}"));
        assert!(page.contains("&quot;"));
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "abcd"));
    }
}
