//! Connecting: the pool (bounded connects and waits), the schema migrated on the first
//! connection, and the target named for messages without the password.

use std::str::FromStr;

use deadpool_postgres::{Manager, Pool, Runtime};
use tokio_postgres::{Config, NoTls};

use super::{
    CONNECT_TIMEOUT, MAX_CONNECTIONS, PG_SCHEMA_VERSION, POOL_WAIT_TIMEOUT, PgStore, schema,
};
use crate::error::OpenError;

impl PgStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/dbname`, or
    /// libpq's `key=value` form) and migrates its `keel` schema to [`PG_SCHEMA_VERSION`].
    ///
    /// # Errors
    ///
    /// [`OpenError::DatabaseUrl`] when `url` does not parse; [`OpenError::Postgres`] when
    /// the server cannot be reached or refuses (authentication, missing database,
    /// permissions); [`OpenError::NewerDatabaseSchema`] when a newer keel migrated it.
    ///
    /// # Cancel safety
    ///
    /// If dropped, a migration in flight is rolled back by the server or committed whole.
    pub async fn connect(url: &str) -> Result<PgStore, OpenError> {
        let mut config = Config::from_str(url)
            .map_err(|source| OpenError::DatabaseUrl { source: Box::new(source) })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("keel");
        }
        let target = describe_target(&config);
        let postgres_error = |source: Box<dyn std::error::Error + Send + Sync>| {
            OpenError::Postgres { target: target.clone(), source }
        };
        let pool = Pool::builder(Manager::new(config, NoTls))
            .max_size(MAX_CONNECTIONS)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(CONNECT_TIMEOUT))
            .wait_timeout(Some(POOL_WAIT_TIMEOUT))
            .build()
            .map_err(|error| postgres_error(Box::new(error)))?;
        let mut client = pool.get().await.map_err(|error| postgres_error(Box::new(error)))?;
        match schema::migrate(&mut client).await.map_err(|error| postgres_error(Box::new(error)))? {
            schema::Migration::Current => {}
            schema::Migration::Newer(found) => {
                return Err(OpenError::NewerDatabaseSchema {
                    target,
                    found,
                    supported: PG_SCHEMA_VERSION,
                });
            }
        }
        drop(client);
        Ok(PgStore { pool, target })
    }
}

/// `user@host:port/dbname`, leaving out the password and anything unset.
pub(super) fn describe_target(config: &Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let mut target = String::new();
    if let Some(user) = config.get_user() {
        target.push_str(user);
        target.push('@');
    }
    target.push_str(&hosts.join(","));
    if let [port] = config.get_ports() {
        target.push_str(&format!(":{port}"));
    }
    if let Some(dbname) = config.get_dbname() {
        target.push('/');
        target.push_str(dbname);
    }
    target
}
