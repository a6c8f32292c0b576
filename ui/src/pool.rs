//! A few connections to the database, made as needed and kept.

use super::*;

/// A few connections, made as needed and kept.
pub(crate) struct Pool {
    config: tokio_postgres::Config,
    idle: Mutex<Vec<Client>>,
    permits: Semaphore,
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

impl Pool {
    pub(crate) fn new(dsn: &str) -> Result<Pool, String> {
        let mut config: tokio_postgres::Config = dsn.parse().map_err(|e| format!("--dsn: {e}"))?;
        config.application_name("sturdy-ui");
        config.options(format!("-c statement_timeout={STATEMENT_TIMEOUT_MS}"));
        Ok(Pool {
            config,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(POOL),
        })
    }

    pub(crate) async fn get(&self) -> Result<Conn<'_>, Failure> {
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| Failure::internal("the pool is closed"))?;
        let kept = self.idle.lock().await.pop();
        let client = match kept {
            Some(c) if !c.is_closed() => c,
            _ => {
                let (client, connection) = self
                    .config
                    .connect(NoTls)
                    .await
                    .map_err(|e| Failure::database(&e))?;
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
