//! A few connections to the database, made as needed and kept.

use super::*;

/// A few connections, made as needed and kept.
pub(crate) struct Pool {
    config: tokio_postgres::Config,
    idle: Mutex<Vec<Client>>,
    permits: Semaphore,
    /// How long a request waits for a permit ([`ACQUIRE_WITHIN`]).
    acquire_within: Duration,
    /// How long making a connection may take, startup included.
    connect_within: Duration,
}

/// A connection of the pool, back in it when dropped.
pub(crate) struct Conn<'a> {
    pool: &'a Pool,
    client: Option<Client>,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl std::ops::Deref for Conn<'_> {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.client.as_ref().expect("a connection until dropped")
    }
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        if let Some(client) = self.client.take()
            && !client.is_closed()
            && let Ok(mut idle) = self.pool.idle.try_lock()
        {
            idle.push(client);
        }
    }
}

/// The `options` the dashboard connects with: the DSN's own, then its
/// `statement_timeout`. The server applies `-c` settings in order, so every
/// setting of the DSN is kept but a `statement_timeout` of its own, which
/// ours overrides: the dashboard's queries are bounded whatever the DSN
/// says.
pub(crate) fn options_with_timeout(theirs: Option<&str>, ms: u32) -> Result<String, String> {
    let ours = format!("-c statement_timeout={ms}");
    let theirs = theirs.unwrap_or("").trim_end();
    // a backslash escapes the character after it: one left at the end
    // would join their last setting to ours
    let escapes = theirs.bytes().rev().take_while(|&b| b == b'\\').count();
    if escapes % 2 == 1 {
        return Err(format!(
            "--dsn: options {theirs:?} ends with a lone backslash"
        ));
    }
    Ok(if theirs.is_empty() {
        ours
    } else {
        format!("{theirs} {ours}")
    })
}

impl Pool {
    pub(crate) fn new(dsn: &str) -> Result<Pool, String> {
        let mut config: tokio_postgres::Config = dsn.parse().map_err(|e| format!("--dsn: {e}"))?;
        if config.get_application_name().is_none() {
            config.application_name("sturdy-ui");
        }
        let options = options_with_timeout(config.get_options(), STATEMENT_TIMEOUT_MS)?;
        config.options(options);
        let connect_within = config
            .get_connect_timeout()
            .copied()
            .unwrap_or(CONNECT_WITHIN);
        config.connect_timeout(connect_within);
        Ok(Pool::with(config, POOL, ACQUIRE_WITHIN, connect_within))
    }

    fn with(
        config: tokio_postgres::Config,
        size: usize,
        acquire_within: Duration,
        connect_within: Duration,
    ) -> Pool {
        Pool {
            config,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(size),
            acquire_within,
            connect_within,
        }
    }

    pub(crate) async fn get(&self) -> Result<Conn<'_>, Failure> {
        let permit = match tokio::time::timeout(self.acquire_within, self.permits.acquire()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(Failure::internal("the pool is closed")),
            Err(_) => {
                return Err(Failure::busy(&format!(
                    "The database pool is busy: its {POOL} connections stayed in use by other \
                     requests for {} s. Try again in a moment.",
                    self.acquire_within.as_secs()
                )));
            }
        };
        let kept = self.idle.lock().await.pop();
        let client = match kept {
            Some(c) if !c.is_closed() => c,
            _ => {
                // connect_timeout bounds each TCP connect; this, the whole
                // of it (a server that accepts and then never answers the
                // startup, or a name that takes for ever to resolve)
                let (client, connection) =
                    match tokio::time::timeout(self.connect_within, self.config.connect(NoTls))
                        .await
                    {
                        Ok(made) => made.map_err(|e| Failure::database(&e))?,
                        Err(_) => {
                            return Err(Failure::busy(&format!(
                                "Could not connect to the database within {} s: it may be down \
                                 or unreachable.",
                                self.connect_within.as_secs()
                            )));
                        }
                    };
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                client
            }
        };
        Ok(Conn {
            pool: self,
            client: Some(client),
            _permit: permit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dsns_options_are_kept_and_ours_come_last() {
        assert_eq!(
            options_with_timeout(None, 5000).unwrap(),
            "-c statement_timeout=5000"
        );
        assert_eq!(
            options_with_timeout(Some(""), 5000).unwrap(),
            "-c statement_timeout=5000"
        );
        assert_eq!(
            options_with_timeout(Some("-c search_path=app -c statement_timeout=0 "), 5000).unwrap(),
            "-c search_path=app -c statement_timeout=0 -c statement_timeout=5000"
        );
        assert_eq!(
            options_with_timeout(Some(r"-c application_name=a\\"), 5000).unwrap(),
            r"-c application_name=a\\ -c statement_timeout=5000"
        );
        assert!(options_with_timeout(Some(r"-c application_name=a\"), 5000).is_err());
    }

    #[test]
    fn the_pool_keeps_the_dsns_settings() {
        let pool = Pool::new(
            "host=/tmp dbname=x options='-c work_mem=64MB' application_name=mine connect_timeout=2",
        )
        .unwrap();
        assert_eq!(
            pool.config.get_options(),
            Some("-c work_mem=64MB -c statement_timeout=5000")
        );
        assert_eq!(pool.config.get_application_name(), Some("mine"));
        assert_eq!(pool.connect_within, Duration::from_secs(2));
        let pool = Pool::new("host=/tmp dbname=x").unwrap();
        assert_eq!(pool.config.get_application_name(), Some("sturdy-ui"));
        assert_eq!(pool.connect_within, CONNECT_WITHIN);
    }

    /// A server that accepts connections and never says a word.
    async fn silent() -> (tokio::net::TcpListener, u16) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        (listener, port)
    }

    #[tokio::test]
    async fn a_silent_server_is_given_up_on() {
        let (_listener, port) = silent().await;
        let config = format!("host=127.0.0.1 port={port} dbname=x user=x")
            .parse()
            .unwrap();
        let pool = Pool::with(config, 1, ACQUIRE_WITHIN, Duration::from_millis(200));
        let start = Instant::now();
        let Err(failure) = pool.get().await else {
            panic!("a connection to a server that never answers")
        };
        assert_eq!(failure.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            failure.message.contains("Could not connect"),
            "{}",
            failure.message
        );
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_busy_pool_says_so() {
        let config = "host=/nonexistent dbname=x".parse().unwrap();
        let pool = Pool::with(config, 1, Duration::from_millis(200), CONNECT_WITHIN);
        let _held = pool.permits.acquire().await.unwrap();
        let Err(failure) = pool.get().await else {
            panic!("a connection of a pool whose only one is in use")
        };
        assert_eq!(failure.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            failure.message.contains("pool is busy"),
            "{}",
            failure.message
        );
    }
}
