//! The ledger on real databases: every behaviour once on SQLite (a temporary file) and once on
//! PostgreSQL (a database of its own on the server named by `LIFEBOAT_TEST_DATABASE_URL`).
//!
//! `make test` (through `scripts/postgres.sh`) always sets the URL, so there the PostgreSQL
//! trials run and fail when the server is unreachable. A plain `cargo test` without the URL
//! reports them as ignored, saying how to run them.

use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use libtest_mimic::{Arguments, Completion, Failed, Trial};
use lifeboat_api::health::FailureClass;
use lifeboat_ledger::{
    Backend, BindingRef, EventKind, Ledger, LedgerError, LedgerEvent, LedgerMetrics, LedgerPool,
    LedgerQuery, LedgerRecord, LedgerWriter, WriterConfig,
};
use prometheus::Registry;
use serde_json::json;
use sqlx::Executor;

#[path = "support/postgres.rs"]
mod postgres;

const URL_VAR: &str = "LIFEBOAT_TEST_DATABASE_URL";

type TestFn = fn(Db) -> Pin<Box<dyn Future<Output = ()> + Send>>;

const TESTS: &[(&str, TestFn)] = &[
    ("append_and_read_back", |db| {
        Box::pin(append_and_read_back(db))
    }),
    ("timeline_is_ordered_by_time_then_id", |db| {
        Box::pin(timeline_is_ordered_by_time_then_id(db))
    }),
    ("history_of_binding_filters_and_limits", |db| {
        Box::pin(history_of_binding_filters_and_limits(db))
    }),
    ("cluster_since_filters_and_limits", |db| {
        Box::pin(cluster_since_filters_and_limits(db))
    }),
    ("concurrent_writers_lose_nothing", |db| {
        Box::pin(concurrent_writers_lose_nothing(db))
    }),
    ("history_survives_a_restart", |db| {
        Box::pin(history_survives_a_restart(db))
    }),
    ("migrations_are_idempotent", |db| {
        Box::pin(migrations_are_idempotent(db))
    }),
    ("write_errors_are_counted_and_reported", |db| {
        Box::pin(write_errors_are_counted_and_reported(db))
    }),
    ("full_queue_drops_are_counted_and_reported", |db| {
        Box::pin(full_queue_drops_are_counted_and_reported(db))
    }),
    ("shutdown_writes_everything_queued", |db| {
        Box::pin(shutdown_writes_everything_queued(db))
    }),
    ("queries_use_the_indexes", |db| {
        Box::pin(queries_use_the_indexes(db))
    }),
    ("the_table_is_append_only", |db| {
        Box::pin(the_table_is_append_only(db))
    }),
    ("unreadable_rows_name_the_field", |db| {
        Box::pin(unreadable_rows_name_the_field(db))
    }),
    ("connect_errors_name_the_problem", |db| {
        Box::pin(connect_errors_name_the_problem(db))
    }),
];

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let postgres_url = std::env::var(URL_VAR).ok().filter(|url| !url.is_empty());
    if postgres_url.is_none() {
        eprintln!(
            "note: the PostgreSQL ledger tests need {URL_VAR}; `make ledger` (part of `make test`) \
             starts a throwaway PostgreSQL and sets it: \
             `scripts/postgres.sh cargo test -p lifeboat-ledger --test ledger`"
        );
    }
    // Probed once: an unreachable server fails every PostgreSQL trial at once, not after a
    // connection timeout each.
    let postgres = postgres_url.map(|url| probe_postgres(&url).map(|()| url));
    let mut trials = Vec::new();
    for backend in [Backend::Sqlite, Backend::Postgres] {
        for &(name, test) in TESTS {
            let postgres = postgres.clone();
            trials.push(Trial::ignorable_test(
                format!("{backend}::{name}"),
                move || run_trial(backend, name, test, postgres),
            ));
        }
    }
    libtest_mimic::run(&args, trials).exit_code()
}

fn probe_postgres(url: &str) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime.block_on(async {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await
            .map_err(|e| format!("PostgreSQL at {URL_VAR} is not reachable: {e}"))?;
        pool.close().await;
        Ok(())
    })
}

fn run_trial(
    backend: Backend,
    name: &'static str,
    test: TestFn,
    postgres: Option<Result<String, String>>,
) -> Result<Completion, Failed> {
    let postgres_url = match (backend, postgres) {
        (Backend::Sqlite, _) => None,
        (Backend::Postgres, None) => {
            return Ok(Completion::ignored_with(format!(
                "{URL_VAR} is not set (run `make ledger`)"
            )));
        }
        (Backend::Postgres, Some(Err(unreachable))) => return Err(unreachable.into()),
        (Backend::Postgres, Some(Ok(url))) => Some(url),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime.block_on(async move {
        let db = Db::create(backend, name, postgres_url.as_deref())
            .await
            .map_err(Failed::from)?;
        // A panicking test must still drop its database.
        let outcome = tokio::spawn(test(db.clone())).await;
        db.remove().await;
        match outcome {
            Ok(()) => Ok(Completion::Completed),
            Err(e) if e.is_panic() => {
                let payload = e.into_panic();
                let message = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "panicked".into());
                Err(Failed::from(message))
            }
            Err(e) => Err(Failed::from(e.to_string())),
        }
    })
}

// ---------------------------------------------------------------------------------------------
// A fresh database per trial.

#[derive(Clone)]
struct Db {
    backend: Backend,
    url: String,
    cleanup: Cleanup,
}

#[derive(Clone)]
enum Cleanup {
    Dir(PathBuf),
    Database { admin_url: String, name: String },
}

impl Db {
    async fn create(
        backend: Backend,
        test: &str,
        postgres_url: Option<&str>,
    ) -> Result<Db, String> {
        let unique = format!("lifeboat_ledger_{}_{test}", std::process::id());
        match backend {
            Backend::Sqlite => {
                let dir = std::env::temp_dir().join(&unique);
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                Ok(Db {
                    backend,
                    url: format!("sqlite://{}", dir.join("ledger.db").display()),
                    cleanup: Cleanup::Dir(dir),
                })
            }
            Backend::Postgres => {
                let admin_url = postgres_url.ok_or("no PostgreSQL URL")?.to_owned();
                let url = postgres::create_database(&admin_url, &unique).await?;
                Ok(Db {
                    backend,
                    url,
                    cleanup: Cleanup::Database {
                        admin_url,
                        name: unique,
                    },
                })
            }
        }
    }

    async fn remove(&self) {
        match &self.cleanup {
            Cleanup::Dir(dir) => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Cleanup::Database { admin_url, name } => {
                postgres::drop_database(admin_url, name).await;
            }
        }
    }

    async fn open(&self) -> Ledger {
        let ledger = Ledger::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connect: {e}"));
        assert_eq!(ledger.backend(), self.backend);
        ledger
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers.

fn t(seconds: i64) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-23T09:00:00Z")
        .expect("valid time")
        .with_timezone(&Utc)
        + TimeDelta::seconds(seconds)
}

fn binding(namespace: &str, name: &str) -> BindingRef {
    BindingRef::new(namespace, name)
}

fn health(at: DateTime<Utc>, b: &BindingRef, cluster: &str) -> LedgerEvent {
    LedgerEvent::new(EventKind::HealthTransition, at)
        .with_binding(b.clone())
        .with_cluster(cluster)
        .with_transition("Healthy", "Unhealthy")
        .with_class(FailureClass::Infrastructure)
        .with_reason("[Infrastructure] node gpu-1 NotReady")
}

async fn append(ledger: &Ledger, events: &[LedgerEvent]) {
    ledger
        .append(events)
        .await
        .unwrap_or_else(|e| panic!("append: {e}"));
}

async fn history(ledger: &Ledger, b: &BindingRef, limit: u32) -> Vec<LedgerRecord> {
    ledger
        .history_of_binding(&b.namespace, &b.name, limit)
        .await
        .unwrap_or_else(|e| panic!("history_of_binding: {e}"))
}

async fn on_cluster(
    ledger: &Ledger,
    cluster: &str,
    since: DateTime<Utc>,
    limit: u32,
) -> Vec<LedgerRecord> {
    ledger
        .cluster_since(cluster, since, limit)
        .await
        .unwrap_or_else(|e| panic!("cluster_since: {e}"))
}

fn events_of(records: &[LedgerRecord]) -> Vec<LedgerEvent> {
    records.iter().map(|r| r.event.clone()).collect()
}

async fn count_rows(ledger: &Ledger) -> i64 {
    let result = match ledger.pool() {
        LedgerPool::Sqlite(pool) => {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM ledger_events")
                .fetch_one(pool)
                .await
        }
        LedgerPool::Postgres(pool) => {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM ledger_events")
                .fetch_one(pool)
                .await
        }
    };
    result.expect("count rows")
}

/// Runs one statement on the ledger's own database (for what the ledger API does not offer).
async fn execute(ledger: &Ledger, sql: &'static str) -> Result<(), sqlx::Error> {
    match ledger.pool() {
        LedgerPool::Sqlite(pool) => pool.execute(sql).await.map(|_| ()),
        LedgerPool::Postgres(pool) => pool.execute(sql).await.map(|_| ()),
    }
}

fn metrics() -> (Registry, LedgerMetrics) {
    let registry = Registry::new();
    let metrics = LedgerMetrics::new(&registry).expect("register metrics");
    (registry, metrics)
}

fn counter(metrics: &LedgerMetrics, name: &str, label: &str) -> u64 {
    match name {
        "writes" => metrics.writes.with_label_values(&[label]).get(),
        "events" => metrics.events.with_label_values(&[label]).get(),
        "dropped" => metrics.dropped.with_label_values(&[label]).get(),
        other => panic!("no counter {other}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Tests.

async fn append_and_read_back(db: Db) {
    let ledger = db.open().await;
    let b = binding("team-a", "train-llm").with_uid("4f1d6c1e-3c1a-4bd0-9d52-2b1f0c7f7a11");
    let events = vec![
        LedgerEvent::new(EventKind::Placement, t(0))
            .with_binding(b.clone())
            .with_cluster("member-1")
            .with_to("Scheduled")
            .with_detail("score", 87),
        LedgerEvent::new(EventKind::Dispatch, t(1))
            .with_binding(b.clone())
            .with_cluster("member-1")
            .with_to("Applied"),
        health(t(2), &b, "member-1"),
        LedgerEvent::new(EventKind::Decision, t(3))
            .with_binding(b.clone())
            .with_cluster("member-1")
            .with_to("evict")
            .with_class(FailureClass::Infrastructure)
            .with_reason("tolerationSeconds 30 elapsed")
            .with_details(json!({
                "health": "Unhealthy",
                "purgeMode": "Gracefully",
                "timer": {"startedAt": "2026-11-23T09:00:02Z", "tolerationSeconds": 30},
                "chosen": "member-2",
                "rejected": [{"cluster": "member-3", "reason": "taint NoExecute"}],
                "note": "ünïcødé ✓ \"quoted\" \\ back-slashed"
            })),
        LedgerEvent::new(EventKind::Eviction, t(4))
            .with_binding(b.clone())
            .with_cluster("member-1")
            .with_reason("application failover"),
        LedgerEvent::new(EventKind::ClusterTransition, t(5))
            .with_cluster("member-1")
            .with_transition("Ready", "NotReady")
            .with_reason("lease expired"),
        // No binding, no cluster: still recorded (e.g. a hub-wide decision to wait).
        LedgerEvent::new(EventKind::Decision, t(6)).with_to("wait"),
    ];
    append(&ledger, &events).await;

    let timeline = history(&ledger, &b, 100).await;
    assert_eq!(events_of(&timeline), events[..5].to_vec());
    let on_member = on_cluster(&ledger, "member-1", t(0), 100).await;
    assert_eq!(events_of(&on_member), events[..6].to_vec());
    assert_eq!(count_rows(&ledger).await, 7);
    // Ids follow the order of the batch.
    let ids: Vec<i64> = on_member.iter().map(|r| r.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids {ids:?}");
    // The JSON form `lifeboatctl history --json` will print.
    let json = serde_json::to_value(&timeline[2]).expect("serialize");
    assert_eq!(json["kind"], "HealthTransition");
    assert_eq!(json["class"], "Infrastructure");
    assert_eq!(
        json["binding"]["uid"],
        "4f1d6c1e-3c1a-4bd0-9d52-2b1f0c7f7a11"
    );
    ledger.close().await;
}

async fn timeline_is_ordered_by_time_then_id(db: Db) {
    let ledger = db.open().await;
    let b = binding("ns", "job");
    // Written out of time order, and three events in the same microsecond.
    let late = health(t(10), &b, "member-1").with_reason("late");
    let early = health(t(1), &b, "member-1").with_reason("early");
    let tie: Vec<LedgerEvent> = (0..3)
        .map(|i| health(t(5), &b, "member-1").with_reason(format!("tie-{i}")))
        .collect();
    append(&ledger, std::slice::from_ref(&late)).await;
    append(&ledger, &tie[..2]).await;
    append(&ledger, std::slice::from_ref(&early)).await;
    append(&ledger, &tie[2..]).await;

    let expected = ["early", "tie-0", "tie-1", "tie-2", "late"];
    for records in [
        history(&ledger, &b, 10).await,
        on_cluster(&ledger, "member-1", t(0), 10).await,
    ] {
        let reasons: Vec<&str> = records
            .iter()
            .map(|r| r.event.reason.as_deref().unwrap_or(""))
            .collect();
        assert_eq!(reasons, expected);
        // Within the same time, the order is the write order (the id).
        assert!(records[1].id < records[2].id && records[2].id < records[3].id);
    }
    ledger.close().await;
}

async fn history_of_binding_filters_and_limits(db: Db) {
    let ledger = db.open().await;
    let b = binding("team-a", "job");
    let mut events = Vec::new();
    for i in 0..10 {
        events.push(health(t(i), &b, "member-1").with_detail("i", i));
        // Same name in another namespace, another name in the same namespace, no binding.
        events.push(health(t(i), &binding("team-b", "job"), "member-1"));
        events.push(health(t(i), &binding("team-a", "job-2"), "member-1"));
        events.push(LedgerEvent::new(EventKind::ClusterTransition, t(i)).with_cluster("member-1"));
    }
    append(&ledger, &events).await;

    let all = history(&ledger, &b, 100).await;
    assert_eq!(all.len(), 10);
    assert!(all.iter().all(|r| r.event.binding.as_ref() == Some(&b)));
    // A limit keeps the latest events, oldest first.
    let latest = history(&ledger, &b, 3).await;
    let is: Vec<i64> = latest
        .iter()
        .map(|r| r.event.details["i"].as_i64().expect("i"))
        .collect();
    assert_eq!(is, [7, 8, 9]);
    assert!(history(&ledger, &b, 0).await.is_empty());
    assert!(
        history(&ledger, &binding("team-a", "nope"), 10)
            .await
            .is_empty()
    );
    assert!(history(&ledger, &binding("", "job"), 10).await.is_empty());
    ledger.close().await;
}

async fn cluster_since_filters_and_limits(db: Db) {
    let ledger = db.open().await;
    let b = binding("ns", "job");
    let mut events = Vec::new();
    for i in 0..10 {
        events.push(health(t(i), &b, "member-1").with_detail("i", i));
        events.push(health(t(i), &b, "member-2"));
        events.push(health(t(i), &b, "member-10"));
        events.push(LedgerEvent::new(EventKind::Decision, t(i)).with_binding(b.clone()));
    }
    append(&ledger, &events).await;

    let is = |records: &[LedgerRecord]| -> Vec<i64> {
        records
            .iter()
            .map(|r| r.event.details["i"].as_i64().expect("i"))
            .collect()
    };
    let all = on_cluster(&ledger, "member-1", t(-100), 100).await;
    assert_eq!(is(&all), (0..10).collect::<Vec<_>>());
    assert!(
        all.iter()
            .all(|r| r.event.cluster.as_deref() == Some("member-1"))
    );
    // `since` is inclusive, to the microsecond.
    assert_eq!(
        is(&on_cluster(&ledger, "member-1", t(7), 100).await),
        [7, 8, 9]
    );
    let just_after = t(7) + TimeDelta::microseconds(1);
    assert_eq!(
        is(&on_cluster(&ledger, "member-1", just_after, 100).await),
        [8, 9]
    );
    // A limit keeps the first events after `since`.
    assert_eq!(
        is(&on_cluster(&ledger, "member-1", t(2), 3).await),
        [2, 3, 4]
    );
    assert!(on_cluster(&ledger, "member-1", t(10), 100).await.is_empty());
    assert!(on_cluster(&ledger, "member-1", t(0), 0).await.is_empty());
    assert!(on_cluster(&ledger, "member-3", t(0), 100).await.is_empty());
    ledger.close().await;
}

async fn concurrent_writers_lose_nothing(db: Db) {
    const TASKS: i64 = 8;
    const PER_TASK: i64 = 2_500;
    let ledger = db.open().await;
    let (_registry, metrics) = metrics();
    // A small queue, so that producers also go through the full-queue wait; a long enough wait
    // that nothing is dropped.
    let (writer, task) = LedgerWriter::spawn(
        ledger.clone(),
        metrics.clone(),
        WriterConfig {
            capacity: 256,
            max_batch: 512,
            enqueue_timeout: Duration::from_secs(60),
            ..WriterConfig::default()
        },
    );
    let mut producers = Vec::new();
    for p in 0..TASKS {
        let writer = writer.clone();
        producers.push(tokio::spawn(async move {
            let b = binding("team", &format!("job-{p}"));
            for i in 0..PER_TASK {
                let event = health(t(i), &b, &format!("member-{p}")).with_detail("seq", i);
                writer.record(event).await.expect("record");
            }
        }));
    }
    for producer in producers {
        producer.await.expect("producer");
    }
    writer.flush().await.expect("flush");

    let mut ids = HashSet::new();
    for p in 0..TASKS {
        let records = on_cluster(&ledger, &format!("member-{p}"), t(0), 10_000).await;
        let seqs: Vec<i64> = records
            .iter()
            .map(|r| r.event.details["seq"].as_i64().expect("seq"))
            .collect();
        assert_eq!(seqs, (0..PER_TASK).collect::<Vec<_>>(), "producer {p}");
        // One producer's events get increasing ids in the order it recorded them.
        assert!(
            records.windows(2).all(|w| w[0].id < w[1].id),
            "producer {p}"
        );
        ids.extend(records.iter().map(|r| r.id));
    }
    let total = TASKS * PER_TASK;
    assert_eq!(ids.len() as i64, total);
    assert_eq!(count_rows(&ledger).await, total);
    assert_eq!(
        counter(&metrics, "events", "HealthTransition") as i64,
        total
    );
    assert_eq!(counter(&metrics, "dropped", "queue_full"), 0);
    assert_eq!(counter(&metrics, "writes", "error"), 0);
    // Batched: fewer transactions than events.
    let writes = counter(&metrics, "writes", "ok") as i64;
    assert!(writes < total, "{writes} writes for {total} events");
    assert_eq!(metrics.batch_events.get_sample_sum() as i64, total);
    task.shutdown().await.expect("shutdown");
    assert_eq!(metrics.queue_depth.get(), 0);
    ledger.close().await;
}

async fn history_survives_a_restart(db: Db) {
    let b = binding("ns", "job");
    let before = {
        let ledger = db.open().await;
        let (_registry, metrics) = metrics();
        let (writer, task) = LedgerWriter::spawn(ledger.clone(), metrics, WriterConfig::default());
        for i in 0..3 {
            writer
                .record(health(t(i), &b, "member-1"))
                .await
                .expect("record");
        }
        task.shutdown().await.expect("shutdown");
        let records = history(&ledger, &b, 10).await;
        ledger.close().await;
        records
    };
    assert_eq!(before.len(), 3);

    let ledger = db.open().await;
    assert_eq!(history(&ledger, &b, 10).await, before);
    append(&ledger, &[health(t(3), &b, "member-1")]).await;
    let after = history(&ledger, &b, 10).await;
    assert_eq!(after[..3], before[..]);
    assert!(after[3].id > before[2].id, "ids go on increasing");
    ledger.close().await;
}

async fn migrations_are_idempotent(db: Db) {
    let first = db.open().await;
    append(&first, &[health(t(0), &binding("ns", "job"), "member-1")]).await;
    first.migrate().await.expect("migrate again");
    let second = db.open().await;
    second.migrate().await.expect("migrate again");
    let applied = match second.pool() {
        LedgerPool::Sqlite(pool) => {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM _sqlx_migrations WHERE success")
                .fetch_one(pool)
                .await
        }
        LedgerPool::Postgres(pool) => {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM _sqlx_migrations WHERE success")
                .fetch_one(pool)
                .await
        }
    }
    .expect("read _sqlx_migrations");
    let files = std::fs::read_dir(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(db.backend.as_str()),
    )
    .expect("migrations dir")
    .count();
    assert_eq!(applied as usize, files);
    assert_eq!(count_rows(&second).await, 1);
    first.close().await;
    second.close().await;
}

async fn write_errors_are_counted_and_reported(db: Db) {
    let ledger = db.open().await;
    ledger.close().await;
    let event = health(t(0), &binding("ns", "job"), "member-1");

    let error = ledger
        .append(std::slice::from_ref(&event))
        .await
        .expect_err("a closed pool cannot write");
    assert_eq!(error.metric_label(), "write");
    assert!(
        error
            .to_string()
            .starts_with(&format!("writing 1 ledger events ({})", db.backend)),
        "{error}"
    );

    let (registry, metrics) = metrics();
    let (writer, task) = LedgerWriter::spawn(
        ledger.clone(),
        metrics.clone(),
        WriterConfig {
            write_attempts: 2,
            retry_backoff: Duration::from_millis(1),
            ..WriterConfig::default()
        },
    );
    writer.record(event).await.expect("accepted into the queue");
    match writer.flush().await {
        Err(LedgerError::EventsLost { lost, last_error }) => {
            assert_eq!(lost, 1);
            assert!(
                last_error.contains("writing 1 ledger events"),
                "{last_error}"
            );
        }
        other => panic!("expected EventsLost, got {other:?}"),
    }
    assert_eq!(
        counter(&metrics, "writes", "error"),
        2,
        "each attempt counts"
    );
    assert_eq!(counter(&metrics, "writes", "ok"), 0);
    assert_eq!(counter(&metrics, "dropped", "write_error"), 1);
    assert_eq!(counter(&metrics, "events", "HealthTransition"), 0);
    assert_eq!(metrics.write_duration.get_sample_count(), 2);
    let text = {
        use prometheus::Encoder;
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .expect("encode");
        String::from_utf8(out).expect("utf-8")
    };
    assert!(
        text.contains("lifeboat_ledger_writes_total{result=\"error\"} 2"),
        "{text}"
    );
    // Reported once: the next flush has nothing new to report.
    writer.flush().await.expect("nothing lost since");
    task.shutdown().await.expect("shutdown");
}

/// Holds the table's write lock on a connection of its own until dropped.
struct TableLock {
    release: tokio::sync::oneshot::Sender<()>,
    done: tokio::task::JoinHandle<()>,
}

async fn lock_table(ledger: &Ledger) -> TableLock {
    let (locked_tx, locked) = tokio::sync::oneshot::channel();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let pool = ledger.pool().clone();
    let done = tokio::spawn(async move {
        match pool {
            LedgerPool::Sqlite(pool) => {
                let mut conn = pool.acquire().await.expect("acquire");
                conn.execute("BEGIN IMMEDIATE").await.expect("lock");
                let _ = locked_tx.send(());
                let _ = released.await;
                conn.execute("ROLLBACK").await.expect("unlock");
            }
            LedgerPool::Postgres(pool) => {
                let mut tx = pool.begin().await.expect("begin");
                tx.execute("LOCK TABLE ledger_events IN EXCLUSIVE MODE")
                    .await
                    .expect("lock");
                let _ = locked_tx.send(());
                let _ = released.await;
                tx.rollback().await.expect("unlock");
            }
        }
    });
    locked.await.expect("locked");
    TableLock { release, done }
}

impl TableLock {
    async fn release(self) {
        let _ = self.release.send(());
        self.done.await.expect("unlock");
    }
}

async fn full_queue_drops_are_counted_and_reported(db: Db) {
    let ledger = db.open().await;
    let (_registry, metrics) = metrics();
    let lock = lock_table(&ledger).await;
    let (writer, task) = LedgerWriter::spawn(
        ledger.clone(),
        metrics.clone(),
        WriterConfig {
            capacity: 4,
            max_batch: 2,
            enqueue_timeout: Duration::from_millis(50),
            ..WriterConfig::default()
        },
    );
    let b = binding("ns", "job");
    // The writer blocks on the lock with at most one batch; then the queue fills.
    let mut accepted = 0;
    let refused = loop {
        match writer.record(health(t(accepted), &b, "member-1")).await {
            Ok(()) => accepted += 1,
            Err(error) => break error,
        }
        assert!(accepted <= 6, "the queue never filled");
    };
    assert!(accepted >= 4, "accepted {accepted}");
    assert!(
        matches!(
            refused,
            LedgerError::QueueFull {
                capacity: 4,
                kind: EventKind::HealthTransition
            }
        ),
        "{refused:?}"
    );
    assert_eq!(refused.metric_label(), "queue_full");
    assert!(
        refused
            .to_string()
            .contains("queue is full (4 events waiting)"),
        "{refused}"
    );
    let refused_now = writer.try_record(health(t(99), &b, "member-1"));
    assert!(matches!(refused_now, Err(LedgerError::QueueFull { .. })));
    assert_eq!(counter(&metrics, "dropped", "queue_full"), 2);

    lock.release().await;
    writer.flush().await.expect("what was accepted is written");
    assert_eq!(count_rows(&ledger).await, accepted);
    assert_eq!(
        counter(&metrics, "events", "HealthTransition") as i64,
        accepted
    );
    task.shutdown().await.expect("shutdown");
    ledger.close().await;
}

async fn shutdown_writes_everything_queued(db: Db) {
    let ledger = db.open().await;
    let (_registry, metrics) = metrics();
    let (writer, task) =
        LedgerWriter::spawn(ledger.clone(), metrics.clone(), WriterConfig::default());
    let b = binding("ns", "job");
    for i in 0..1_000 {
        writer
            .try_record(health(t(i), &b, "member-1"))
            .expect("room in the queue");
    }
    task.shutdown().await.expect("shutdown");
    assert_eq!(count_rows(&ledger).await, 1_000);
    // The writer is gone: a late event is refused and counted, not silently lost.
    let late = writer.record(health(t(2_000), &b, "member-1")).await;
    assert!(matches!(late, Err(LedgerError::WriterClosed)), "{late:?}");
    assert!(matches!(
        writer.flush().await,
        Err(LedgerError::WriterClosed)
    ));
    assert_eq!(counter(&metrics, "dropped", "writer_closed"), 1);
    ledger.close().await;
}

async fn queries_use_the_indexes(db: Db) {
    let ledger = db.open().await;
    // A realistic spread: 200 bindings over 10 clusters, 25 events each, plus cluster events.
    let mut events = Vec::new();
    for n in 0..200 {
        let b = binding(&format!("team-{}", n % 20), &format!("job-{n}"));
        for i in 0..25 {
            events.push(health(t(i * 60 + n), &b, &format!("member-{}", n % 10)));
        }
    }
    for i in 0..500 {
        events.push(
            LedgerEvent::new(EventKind::ClusterTransition, t(i))
                .with_cluster(format!("member-{}", i % 10))
                .with_transition("Ready", "NotReady"),
        );
    }
    append(&ledger, &events).await;
    execute(&ledger, "ANALYZE").await.expect("analyze");

    let history_plan = ledger
        .explain(LedgerQuery::HistoryOfBinding)
        .await
        .expect("explain");
    let cluster_plan = ledger
        .explain(LedgerQuery::ClusterSince)
        .await
        .expect("explain");
    match db.backend {
        Backend::Sqlite => {
            assert!(
                history_plan.contains("SEARCH ledger_events USING INDEX ledger_events_binding"),
                "{history_plan}"
            );
            assert!(
                cluster_plan.contains("SEARCH ledger_events USING INDEX ledger_events_cluster"),
                "{cluster_plan}"
            );
            for plan in [&history_plan, &cluster_plan] {
                // The index also gives the order: no sort step.
                assert!(!plan.contains("TEMP B-TREE"), "{plan}");
            }
        }
        Backend::Postgres => {
            assert!(
                history_plan.contains("Index Scan Backward using ledger_events_binding"),
                "{history_plan}"
            );
            assert!(
                cluster_plan.contains("Index Scan using ledger_events_cluster"),
                "{cluster_plan}"
            );
            for plan in [&history_plan, &cluster_plan] {
                assert!(!plan.contains("Seq Scan"), "{plan}");
                assert!(!plan.contains("Sort"), "{plan}");
            }
        }
    }
    ledger.close().await;
}

async fn the_table_is_append_only(db: Db) {
    let ledger = db.open().await;
    let b = binding("ns", "job");
    append(&ledger, &[health(t(0), &b, "member-1")]).await;
    let mut statements = vec![
        "UPDATE ledger_events SET reason = 'rewritten'",
        "DELETE FROM ledger_events",
    ];
    if db.backend == Backend::Postgres {
        statements.push("TRUNCATE ledger_events");
    }
    for sql in statements {
        let error = execute(&ledger, sql).await.expect_err(sql);
        assert!(error.to_string().contains("append-only"), "{sql}: {error}");
    }
    let records = history(&ledger, &b, 10).await;
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0].event.reason.as_deref(),
        Some("[Infrastructure] node gpu-1 NotReady")
    );
    ledger.close().await;
}

async fn unreadable_rows_name_the_field(db: Db) {
    let ledger = db.open().await;
    let b = binding("ns", "job");
    append(&ledger, &[health(t(0), &b, "member-1")]).await;
    // As a newer hub with a kind this version does not know would write it.
    execute(
        &ledger,
        "INSERT INTO ledger_events (at_micros, kind, binding_namespace, binding_name, cluster) \
         VALUES (1795424400000000, 'Teleport', 'ns', 'job', 'member-1')",
    )
    .await
    .expect("insert");
    let error = ledger
        .history_of_binding("ns", "job", 10)
        .await
        .expect_err("unknown kind");
    assert_eq!(error.metric_label(), "corrupt");
    assert!(
        error
            .to_string()
            .contains("field kind: unknown kind \"Teleport\""),
        "{error}"
    );
    assert!(error.to_string().starts_with("ledger event 2:"), "{error}");
    ledger.close().await;
}

async fn connect_errors_name_the_problem(db: Db) {
    let bad_url = match db.backend {
        Backend::Sqlite => "sqlite:///nonexistent-lifeboat-dir/sub/ledger.db".to_owned(),
        Backend::Postgres => {
            // The right server, a wrong password.
            let (scheme, rest) = db.url.split_once("://").expect("URL");
            let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
            format!("{scheme}://lifeboat:wrong-password@{host}")
        }
    };
    let error = Ledger::connect(&bad_url).await.expect_err("cannot connect");
    assert_eq!(error.metric_label(), "connect", "{error}");
    let text = error.to_string();
    assert!(
        text.starts_with(&format!(
            "connecting to the ledger database ({})",
            db.backend
        )),
        "{text}"
    );
    assert!(!text.contains("wrong-password"), "{text}");

    let error = Ledger::connect("mysql://root:hunter2@db/lifeboat")
        .await
        .expect_err("unsupported");
    assert_eq!(error.metric_label(), "invalid_url");
    assert!(!error.to_string().contains("hunter2"), "{error}");
}
