//! The ledger's database: connect and migrate, append (multi-row, one transaction), the two
//! history queries. SQL differs per backend only where it must (placeholders, the bulk insert,
//! JSONB), so there is one function per backend for those and shared decoding for the rest.

use std::str::FromStr;
use std::sync::LazyLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lifeboat_api::health::FailureClass;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::query::QueryAs;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Database, Encode, SqlSafeStr, SqlStr, Type};

use super::error::{Backend, LedgerError, redact_url};
use super::event::{BindingRef, EventKind, LedgerEvent, LedgerRecord};

/// What the hub uses when no `--database-url` is given: a SQLite file in the working directory.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://lifeboat-ledger.db";

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("migrations/postgres");

/// How long a SQLite connection waits for a lock held by another connection (a reader
/// checkpointing, another process) before the statement fails.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Page cache per connection (an upper bound, filled as pages are used). The default 2 MiB makes
/// a batch's index updates spill and re-read pages as soon as the indexes outgrow it; 64 MiB
/// holds the index pages of several thousand active bindings.
const SQLITE_CACHE_KIB: u32 = 64 * 1024;
/// Connections for queries (writes have one of their own).
const SQLITE_MAX_READERS: u32 = 4;
/// Pages in the WAL before it is copied back into the database file (SQLite's default: 1,000).
/// A batch dirties an index page per binding it touches, so with the default nearly every
/// batch paid for a checkpoint (copy and fsync); a larger WAL copies a page rewritten by
/// many batches once. 10,000 pages of 4 KiB: a WAL of about 40 MiB at most between checkpoints.
const SQLITE_WAL_AUTOCHECKPOINT_PAGES: u32 = 10_000;
const POSTGRES_MAX_CONNECTIONS: u32 = 8;
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// The connection pool of the ledger's database, for callers that need the database itself
/// (diagnostics, tests). The ledger's own queries go through [`Ledger`].
#[derive(Debug, Clone)]
pub enum LedgerPool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// The two history queries, named for [`Ledger::explain`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerQuery {
    HistoryOfBinding,
    ClusterSince,
}

impl LedgerQuery {
    fn name(self) -> &'static str {
        match self {
            LedgerQuery::HistoryOfBinding => "history of binding",
            LedgerQuery::ClusterSince => "cluster since",
        }
    }
}

/// The event ledger: an append-only table in SQLite (a file, by default) or PostgreSQL.
/// Cheap to clone (a pool handle). Writes from the hub's loops go through
/// [`LedgerWriter`](super::LedgerWriter), which batches them; [`Ledger::append`] is the direct
/// path it uses.
#[derive(Debug, Clone)]
pub struct Ledger {
    pool: LedgerPool,
    /// SQLite: the one connection that writes. SQLite has one writer at a time anyway, and a
    /// connection drops its page cache whenever another connection has written, so a single
    /// writing connection keeps its cached index pages from one batch to the next.
    sqlite_writer: Option<SqlitePool>,
}

impl Ledger {
    /// Opens the database named by `url` and brings its schema up to date.
    ///
    /// - `sqlite://PATH` (relative to the working directory), `sqlite:///ABSOLUTE/PATH`,
    ///   `sqlite::memory:`: the file is created when missing; WAL journal,
    ///   `synchronous=NORMAL` (a power loss may lose the last transactions, never corrupts),
    ///   5 s busy timeout.
    /// - `postgres://USER:PASSWORD@HOST:PORT/DATABASE` (or `postgresql://`), with libpq's
    ///   parameters such as `sslmode=require` (TLS through rustls).
    pub async fn connect(url: &str) -> Result<Ledger, LedgerError> {
        let backend = backend_of(url)?;
        let ledger = match backend {
            Backend::Sqlite => {
                let (readers, writer) = connect_sqlite(url).await?;
                Ledger {
                    pool: LedgerPool::Sqlite(readers),
                    sqlite_writer: Some(writer),
                }
            }
            Backend::Postgres => Ledger {
                pool: LedgerPool::Postgres(connect_postgres(url).await?),
                sqlite_writer: None,
            },
        };
        ledger.migrate().await?;
        Ok(ledger)
    }

    /// Applies the migrations in `ledger/migrations/<backend>/` that the database has not
    /// seen yet (none on an up-to-date database). [`Ledger::connect`] already does this.
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        let backend = self.backend();
        let result = match (&self.pool, &self.sqlite_writer) {
            (LedgerPool::Sqlite(_), Some(writer)) => SQLITE_MIGRATIONS.run(writer).await,
            (LedgerPool::Sqlite(readers), None) => SQLITE_MIGRATIONS.run(readers).await,
            (LedgerPool::Postgres(pool), _) => POSTGRES_MIGRATIONS.run(pool).await,
        };
        result.map_err(|source| LedgerError::Migrate { backend, source })
    }

    pub fn backend(&self) -> Backend {
        match self.pool {
            LedgerPool::Sqlite(_) => Backend::Sqlite,
            LedgerPool::Postgres(_) => Backend::Postgres,
        }
    }

    /// The pool the queries use (on SQLite, writes have a connection of their own).
    pub fn pool(&self) -> &LedgerPool {
        &self.pool
    }

    /// Closes every connection; later calls on this ledger (and its clones) fail.
    pub async fn close(&self) {
        if let Some(writer) = &self.sqlite_writer {
            writer.close().await;
        }
        match &self.pool {
            LedgerPool::Sqlite(pool) => pool.close().await,
            LedgerPool::Postgres(pool) => pool.close().await,
        }
    }

    /// Appends `events` in one transaction: all of them or none. Ids are given in slice order.
    pub async fn append(&self, events: &[LedgerEvent]) -> Result<(), LedgerError> {
        if events.is_empty() {
            return Ok(());
        }
        let result = match (&self.pool, &self.sqlite_writer) {
            (LedgerPool::Sqlite(_), Some(writer)) => append_sqlite(writer, events).await,
            (LedgerPool::Sqlite(readers), None) => append_sqlite(readers, events).await,
            (LedgerPool::Postgres(pool), _) => append_postgres(pool, events).await,
        };
        result.map_err(|source| LedgerError::Write {
            backend: self.backend(),
            events: events.len(),
            source,
        })
    }

    /// The latest `limit` events of the binding `namespace/name`, oldest first (by time, then
    /// id). Served by the index `ledger_events_binding`.
    pub async fn history_of_binding(
        &self,
        namespace: &str,
        name: &str,
        limit: u32,
    ) -> Result<Vec<LedgerRecord>, LedgerError> {
        let rows = self
            .fetch(Lookup::Binding { namespace, name }, limit)
            .await?;
        // Read newest first so that the index serves the limit; the timeline is oldest first.
        rows.into_iter().rev().map(Row::into_record).collect()
    }

    /// The first `limit` events on `cluster` at or after `since`, oldest first (by time, then
    /// id). Served by the index `ledger_events_cluster`. To page, call again with the `at` of
    /// the last record (records at exactly that time come again; skip ids already seen).
    pub async fn cluster_since(
        &self,
        cluster: &str,
        since: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<LedgerRecord>, LedgerError> {
        let since_micros = since.timestamp_micros();
        let rows = self
            .fetch(
                Lookup::Cluster {
                    cluster,
                    since_micros,
                },
                limit,
            )
            .await?;
        rows.into_iter().map(Row::into_record).collect()
    }

    async fn fetch(&self, lookup: Lookup<'_>, limit: u32) -> Result<Vec<Row>, LedgerError> {
        let query = lookup.query();
        match &self.pool {
            LedgerPool::Sqlite(pool) => {
                bind_lookup(sqlx::query_as(sql(Backend::Sqlite, query)), lookup, limit)
                    .fetch_all(pool)
                    .await
            }
            LedgerPool::Postgres(pool) => {
                bind_lookup(sqlx::query_as(sql(Backend::Postgres, query)), lookup, limit)
                    .fetch_all(pool)
                    .await
            }
        }
        .map_err(|source| self.query_error(query, source))
    }

    /// The database's plan for one of the history queries (SQLite: `EXPLAIN QUERY PLAN`,
    /// PostgreSQL: `EXPLAIN`), one line per plan node: to check that an index serves it.
    pub async fn explain(&self, query: LedgerQuery) -> Result<String, LedgerError> {
        let sample = match query {
            LedgerQuery::HistoryOfBinding => Lookup::Binding {
                namespace: "default",
                name: "binding",
            },
            LedgerQuery::ClusterSince => Lookup::Cluster {
                cluster: "member-1",
                since_micros: 0,
            },
        };
        let explain = |prefix: &str| {
            AssertSqlSafe(format!("{prefix} {}", sql(self.backend(), query).as_str()))
        };
        let lines: Result<Vec<String>, sqlx::Error> = match &self.pool {
            LedgerPool::Sqlite(pool) => {
                let plan =
                    sqlx::query_as::<_, (i64, i64, i64, String)>(explain("EXPLAIN QUERY PLAN"));
                bind_lookup(plan, sample, 100)
                    .fetch_all(pool)
                    .await
                    .map(|rows| rows.into_iter().map(|(_, _, _, detail)| detail).collect())
            }
            LedgerPool::Postgres(pool) => {
                let plan = sqlx::query_as::<_, (String,)>(explain("EXPLAIN"));
                bind_lookup(plan, sample, 100)
                    .fetch_all(pool)
                    .await
                    .map(|rows| rows.into_iter().map(|(line,)| line).collect())
            }
        };
        lines
            .map(|lines| lines.join("\n"))
            .map_err(|source| self.query_error(query, source))
    }

    fn query_error(&self, query: LedgerQuery, source: sqlx::Error) -> LedgerError {
        LedgerError::Query {
            backend: self.backend(),
            query: query.name(),
            source,
        }
    }
}

fn backend_of(url: &str) -> Result<Backend, LedgerError> {
    if url.starts_with("sqlite:") {
        Ok(Backend::Sqlite)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Backend::Postgres)
    } else {
        Err(LedgerError::InvalidUrl {
            url: redact_url(url),
            reason: "expected sqlite://PATH, sqlite::memory: or postgres://USER@HOST/DATABASE"
                .into(),
        })
    }
}

/// The pool for queries and the single-connection pool for writes, on the same database.
async fn connect_sqlite(url: &str) -> Result<(SqlitePool, SqlitePool), LedgerError> {
    let options = SqliteConnectOptions::from_str(url)
        .map_err(|e| LedgerError::InvalidUrl {
            url: redact_url(url),
            reason: e.to_string(),
        })?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(SQLITE_BUSY_TIMEOUT)
        .pragma("cache_size", format!("-{SQLITE_CACHE_KIB}"))
        .pragma("temp_store", "memory")
        .pragma(
            "wal_autocheckpoint",
            SQLITE_WAL_AUTOCHECKPOINT_PAGES.to_string(),
        );
    let connect_error = |source| LedgerError::Connect {
        backend: Backend::Sqlite,
        source,
    };
    // The writer first: it creates the file and sets WAL mode before the readers open it.
    // It stays open, and with it its page cache (and an in-memory database).
    let writer = SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options.clone())
        .await
        .map_err(connect_error)?;
    let readers = SqlitePoolOptions::new()
        .max_connections(SQLITE_MAX_READERS)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(connect_error)?;
    Ok((readers, writer))
}

async fn connect_postgres(url: &str) -> Result<PgPool, LedgerError> {
    let options = PgConnectOptions::from_str(url).map_err(|e| LedgerError::InvalidUrl {
        url: redact_url(url),
        reason: e.to_string(),
    })?;
    PgPoolOptions::new()
        .max_connections(POSTGRES_MAX_CONNECTIONS)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(|source| LedgerError::Connect {
            backend: Backend::Postgres,
            source,
        })
}

const COLUMNS: &str = "at_micros, kind, binding_namespace, binding_name, binding_uid, cluster, \
                       from_state, to_state, reason, class, details";
const COLUMN_COUNT: usize = 11;
/// The parameters of one history query.
#[derive(Clone, Copy)]
enum Lookup<'a> {
    Binding { namespace: &'a str, name: &'a str },
    Cluster { cluster: &'a str, since_micros: i64 },
}

impl Lookup<'_> {
    fn query(self) -> LedgerQuery {
        match self {
            Lookup::Binding { .. } => LedgerQuery::HistoryOfBinding,
            Lookup::Cluster { .. } => LedgerQuery::ClusterSince,
        }
    }
}

/// Binds a lookup's parameters (`?1`/`$1`, `?2`/`$2`) and the limit (`?3`/`$3`).
fn bind_lookup<'q, DB, O>(
    query: QueryAs<'q, DB, O, <DB as Database>::Arguments>,
    lookup: Lookup<'q>,
    limit: u32,
) -> QueryAs<'q, DB, O, <DB as Database>::Arguments>
where
    DB: Database,
    &'q str: Encode<'q, DB> + Type<DB>,
    i64: Encode<'q, DB> + Type<DB>,
{
    let query = match lookup {
        Lookup::Binding { namespace, name } => query.bind(namespace).bind(name),
        Lookup::Cluster {
            cluster,
            since_micros,
        } => query.bind(cluster).bind(since_micros),
    };
    query.bind(i64::from(limit))
}

/// The SQL of a history query: the same on both backends but for the placeholder sign and
/// PostgreSQL's JSONB read back as text.
fn sql(backend: Backend, query: LedgerQuery) -> SqlStr {
    fn build(backend: Backend, query: LedgerQuery) -> SqlStr {
        let (p, details) = match backend {
            Backend::Sqlite => ("?", "details"),
            Backend::Postgres => ("$", "details::text AS details"),
        };
        let select = format!(
            "SELECT id, at_micros, kind, binding_namespace, binding_name, binding_uid, cluster, \
             from_state, to_state, reason, class, {details} FROM ledger_events"
        );
        let sql = match query {
            LedgerQuery::HistoryOfBinding => format!(
                "{select} WHERE binding_namespace = {p}1 AND binding_name = {p}2 \
                 ORDER BY at_micros DESC, id DESC LIMIT {p}3"
            ),
            LedgerQuery::ClusterSince => format!(
                "{select} WHERE cluster = {p}1 AND at_micros >= {p}2 \
                 ORDER BY at_micros, id LIMIT {p}3"
            ),
        };
        AssertSqlSafe(sql).into_sql_str()
    }
    static STATEMENTS: LazyLock<[SqlStr; 4]> = LazyLock::new(|| {
        [
            build(Backend::Sqlite, LedgerQuery::HistoryOfBinding),
            build(Backend::Sqlite, LedgerQuery::ClusterSince),
            build(Backend::Postgres, LedgerQuery::HistoryOfBinding),
            build(Backend::Postgres, LedgerQuery::ClusterSince),
        ]
    });
    let index = match (backend, query) {
        (Backend::Sqlite, LedgerQuery::HistoryOfBinding) => 0,
        (Backend::Sqlite, LedgerQuery::ClusterSince) => 1,
        (Backend::Postgres, LedgerQuery::HistoryOfBinding) => 2,
        (Backend::Postgres, LedgerQuery::ClusterSince) => 3,
    };
    STATEMENTS[index].clone()
}

/// Rows per multi-row INSERT on SQLite. A batch is cut greedily into statements of these sizes,
/// so only four statements are ever prepared (and cached) per connection, and a large batch
/// costs one round trip to SQLite's worker thread per 64 rows.
const SQLITE_CHUNKS: [usize; 4] = [64, 16, 4, 1];

fn sqlite_insert(rows: usize) -> SqlStr {
    static STATEMENTS: LazyLock<Vec<SqlStr>> = LazyLock::new(|| {
        SQLITE_CHUNKS
            .iter()
            .map(|&rows| {
                let row = format!("({})", ["?"; COLUMN_COUNT].join(", "));
                let sql = format!(
                    "INSERT INTO ledger_events ({COLUMNS}) VALUES {}",
                    vec![row.as_str(); rows].join(", ")
                );
                AssertSqlSafe(sql).into_sql_str()
            })
            .collect()
    });
    let index = SQLITE_CHUNKS.iter().position(|&n| n == rows).unwrap_or(0);
    STATEMENTS[index].clone()
}

async fn append_sqlite(pool: &SqlitePool, events: &[LedgerEvent]) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    let mut rest = events;
    while !rest.is_empty() {
        let rows = SQLITE_CHUNKS
            .into_iter()
            .find(|&n| n <= rest.len())
            .unwrap_or(1);
        let (chunk, tail) = rest.split_at(rows);
        let mut insert = sqlx::query(sqlite_insert(rows));
        for event in chunk {
            let binding = event.binding.as_ref();
            insert = insert
                .bind(event.at.timestamp_micros())
                .bind(event.kind.as_str())
                .bind(binding.map(|b| b.namespace.clone()))
                .bind(binding.map(|b| b.name.clone()))
                .bind(binding.and_then(|b| b.uid.clone()))
                .bind(event.cluster.clone())
                .bind(event.from.clone())
                .bind(event.to.clone())
                .bind(event.reason.clone())
                .bind(event.class.map(FailureClass::as_str))
                .bind(event.details.to_string());
        }
        insert.execute(&mut *tx).await?;
        rest = tail;
    }
    tx.commit().await
}

/// One statement for any batch size: the columns go as arrays and `UNNEST` turns them into
/// rows; `WITH ORDINALITY ... ORDER BY` makes the identity column follow the batch order.
const POSTGRES_INSERT: &str = "INSERT INTO ledger_events (at_micros, kind, binding_namespace, \
     binding_name, binding_uid, cluster, from_state, to_state, reason, class, details) \
     SELECT at_micros, kind, binding_namespace, binding_name, binding_uid, cluster, from_state, \
     to_state, reason, class, details::jsonb \
     FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], \
     $7::text[], $8::text[], $9::text[], $10::text[], $11::text[]) WITH ORDINALITY \
     AS batch(at_micros, kind, binding_namespace, binding_name, binding_uid, cluster, \
     from_state, to_state, reason, class, details, position) \
     ORDER BY position";

async fn append_postgres(pool: &PgPool, events: &[LedgerEvent]) -> Result<(), sqlx::Error> {
    let n = events.len();
    let mut at = Vec::with_capacity(n);
    let mut kind = Vec::with_capacity(n);
    let mut namespace = Vec::with_capacity(n);
    let mut name = Vec::with_capacity(n);
    let mut uid = Vec::with_capacity(n);
    let mut cluster = Vec::with_capacity(n);
    let mut from = Vec::with_capacity(n);
    let mut to = Vec::with_capacity(n);
    let mut reason = Vec::with_capacity(n);
    let mut class = Vec::with_capacity(n);
    let mut details = Vec::with_capacity(n);
    for event in events {
        let binding = event.binding.as_ref();
        at.push(event.at.timestamp_micros());
        kind.push(event.kind.as_str());
        namespace.push(binding.map(|b| b.namespace.as_str()));
        name.push(binding.map(|b| b.name.as_str()));
        uid.push(binding.and_then(|b| b.uid.as_deref()));
        cluster.push(event.cluster.as_deref());
        from.push(event.from.as_deref());
        to.push(event.to.as_deref());
        reason.push(event.reason.as_deref());
        class.push(event.class.map(FailureClass::as_str));
        details.push(event.details.to_string());
    }
    sqlx::query(POSTGRES_INSERT)
        .bind(at)
        .bind(kind)
        .bind(namespace)
        .bind(name)
        .bind(uid)
        .bind(cluster)
        .bind(from)
        .bind(to)
        .bind(reason)
        .bind(class)
        .bind(details)
        .execute(pool)
        .await
        .map(|_| ())
}

/// A row as both backends return it (PostgreSQL's JSONB read back as text).
#[derive(sqlx::FromRow)]
struct Row {
    id: i64,
    at_micros: i64,
    kind: String,
    binding_namespace: Option<String>,
    binding_name: Option<String>,
    binding_uid: Option<String>,
    cluster: Option<String>,
    from_state: Option<String>,
    to_state: Option<String>,
    reason: Option<String>,
    class: Option<String>,
    details: String,
}

impl Row {
    fn into_record(self) -> Result<LedgerRecord, LedgerError> {
        let id = self.id;
        let corrupt = |field, reason: String| LedgerError::Corrupt { id, field, reason };
        let at = DateTime::from_timestamp_micros(self.at_micros)
            .ok_or_else(|| corrupt("at_micros", format!("{} is out of range", self.at_micros)))?;
        let kind = EventKind::parse(&self.kind)
            .ok_or_else(|| corrupt("kind", format!("unknown kind {:?}", self.kind)))?;
        let binding = match (self.binding_namespace, self.binding_name) {
            (Some(namespace), Some(name)) => Some(BindingRef {
                namespace,
                name,
                uid: self.binding_uid,
            }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(corrupt("binding_name", "missing beside a namespace".into()));
            }
            (None, Some(_)) => {
                return Err(corrupt("binding_namespace", "missing beside a name".into()));
            }
        };
        let class = match self.class {
            None => None,
            Some(text) => Some(
                FailureClass::parse(&text)
                    .ok_or_else(|| corrupt("class", format!("unknown class {text:?}")))?,
            ),
        };
        let details = serde_json::from_str(&self.details)
            .map_err(|e| corrupt("details", format!("not JSON: {e}")))?;
        Ok(LedgerRecord {
            id,
            event: LedgerEvent {
                at,
                kind,
                binding,
                cluster: self.cluster,
                from: self.from_state,
                to: self.to_state,
                reason: self.reason,
                class,
                details,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_pick_the_backend_or_say_what_is_expected() {
        assert_eq!(backend_of("sqlite://ledger.db").unwrap(), Backend::Sqlite);
        assert_eq!(backend_of("sqlite::memory:").unwrap(), Backend::Sqlite);
        assert_eq!(
            backend_of("postgres://hub@localhost/lifeboat").unwrap(),
            Backend::Postgres
        );
        assert_eq!(
            backend_of("postgresql://hub@localhost/lifeboat").unwrap(),
            Backend::Postgres
        );
        let err = backend_of("mysql://root:hunter2@db/lifeboat").unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("--database-url \"mysql://root:***@db/lifeboat\""),
            "{text}"
        );
        assert!(text.contains("expected sqlite://PATH"), "{text}");
        assert_eq!(err.metric_label(), "invalid_url");
    }

    #[test]
    fn sqlite_statements_cover_each_chunk_size() {
        for rows in SQLITE_CHUNKS {
            let sql = sqlite_insert(rows);
            assert_eq!(sql.as_str().matches('?').count(), rows * COLUMN_COUNT);
        }
        assert_eq!(COLUMNS.split(',').count(), COLUMN_COUNT);
    }

    fn row() -> Row {
        Row {
            id: 3,
            at_micros: 1_000_000,
            kind: "Eviction".into(),
            binding_namespace: Some("ns".into()),
            binding_name: Some("b".into()),
            binding_uid: None,
            cluster: Some("member-1".into()),
            from_state: None,
            to_state: None,
            reason: None,
            class: Some("Capacity".into()),
            details: "{\"a\":1}".into(),
        }
    }

    #[test]
    fn rows_decode_and_bad_rows_name_the_field() {
        let record = row().into_record().unwrap();
        assert_eq!(record.id, 3);
        assert_eq!(record.event.kind, EventKind::Eviction);
        assert_eq!(record.event.class, Some(FailureClass::Capacity));
        assert_eq!(record.event.at.timestamp(), 1);

        type Spoil = fn(&mut Row);
        let cases: [(Spoil, &str); 5] = [
            (
                |r| r.kind = "Teleport".into(),
                "field kind: unknown kind \"Teleport\"",
            ),
            (|r| r.class = Some("Cosmic".into()), "field class"),
            (|r| r.details = "{".into(), "field details: not JSON"),
            (|r| r.binding_name = None, "field binding_name"),
            (|r| r.at_micros = i64::MAX, "field at_micros"),
        ];
        for (spoil, expected) in cases {
            let mut bad = row();
            spoil(&mut bad);
            let err = bad.into_record().unwrap_err();
            assert!(err.to_string().contains(expected), "{err}");
            assert!(err.to_string().starts_with("ledger event 3:"), "{err}");
        }
    }
}
