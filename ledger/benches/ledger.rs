//! Criterion benchmarks of the ledger: events/s through the batched writer (a burst from several
//! producers, recorded and flushed), the direct batch append it uses, and one event per
//! transaction (what an unbatched ledger would cost). SQLite in a file (WAL); PostgreSQL when
//! `LIFEBOAT_TEST_DATABASE_URL` is set (`make bench` runs this under `scripts/postgres.sh`,
//! which starts a throwaway server), in a database `lifeboat_ledger_bench` created for the run.
//!
//! The events are shaped like the hub's: mostly health transitions and dispatches of bindings
//! with UIDs, reasons and small `details`, and one decision in ten with its inputs (chosen and
//! rejected clusters, timers) in `details`: 375 bytes of JSON per event on average (printed).

use std::path::Path;
use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use lifeboat_api::health::FailureClass;
use lifeboat_ledger::{
    BindingRef, EventKind, Ledger, LedgerEvent, LedgerMetrics, LedgerWriter, WriterConfig,
};
use serde_json::json;

#[path = "../tests/support/postgres.rs"]
mod postgres;

const BURST: usize = 20_000;
const PRODUCERS: usize = 4;
const BATCH: usize = 1_000;

/// Event `i` of a realistic mix.
fn event(i: usize) -> LedgerEvent {
    let at = Utc::now() + TimeDelta::microseconds(i as i64);
    let binding = BindingRef::new(
        format!("team-{}", i % 40),
        format!("llm-pretrain-run-{}", i % 5_000),
    )
    .with_uid(format!("7c9e6679-7425-40de-944b-{:012x}", i % 5_000));
    let cluster = format!("gpu-cluster-{}", i % 16);
    match i % 10 {
        0 => LedgerEvent::new(EventKind::Decision, at)
            .with_binding(binding)
            .with_cluster(cluster)
            .with_transition("Unhealthy", "evict")
            .with_class(FailureClass::Infrastructure)
            .with_reason("tolerationSeconds 300 elapsed")
            .with_details(json!({
                "health": "Unhealthy",
                "purgeMode": "Gracefully",
                "gracePeriodSeconds": 600,
                "timer": {"unhealthySince": "2026-11-23T09:00:00Z", "tolerationSeconds": 300},
                "chosen": "gpu-cluster-3",
                "rejected": [
                    {"cluster": "gpu-cluster-7", "reason": "insufficient nvidia.com/gpu"},
                    {"cluster": "gpu-cluster-9", "reason": "taint cluster.lifeboat.dev/not-ready:NoExecute"}
                ]
            })),
        1..=3 => LedgerEvent::new(EventKind::Dispatch, at)
            .with_binding(binding)
            .with_cluster(cluster)
            .with_to("Applied")
            .with_details(json!({"resourceVersion": "884213", "generation": 7})),
        _ => LedgerEvent::new(EventKind::HealthTransition, at)
            .with_binding(binding)
            .with_cluster(cluster)
            .with_transition("Healthy", "Unhealthy")
            .with_class(FailureClass::Infrastructure)
            .with_reason("[Infrastructure] node gpu-node-17 NotReady (Autopilot GPU health)")
            .with_details(json!({"pods": 4, "failedPods": 1, "node": "gpu-node-17"})),
    }
}

const BENCH_DATABASE: &str = "lifeboat_ledger_bench";

/// CPU time (user + system) this process has used so far, from `/proc/self/stat` (Linux; USER_HZ
/// is 100 on every Linux architecture). On a machine shared with other builds the wall-clock
/// figures depend on the load; CPU time per event does much less, and with SQLite in the process
/// it is the whole cost of a write.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

struct Database {
    name: &'static str,
    ledger: Ledger,
    /// The PostgreSQL server to drop the benchmark's database from afterwards.
    admin_url: Option<String>,
}

fn databases(runtime: &tokio::runtime::Runtime, dir: &Path) -> Vec<Database> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("bench dir");
    let mut databases = vec![Database {
        name: "sqlite",
        ledger: runtime
            .block_on(Ledger::connect(&format!(
                "sqlite://{}",
                dir.join("ledger.db").display()
            )))
            .expect("sqlite"),
        admin_url: None,
    }];
    match std::env::var("LIFEBOAT_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => {
            let ledger = runtime.block_on(async {
                let bench_url = postgres::create_database(&url, BENCH_DATABASE)
                    .await
                    .expect("PostgreSQL");
                Ledger::connect(&bench_url)
                    .await
                    .expect("PostgreSQL ledger")
            });
            databases.push(Database {
                name: "postgres",
                ledger,
                admin_url: Some(url),
            });
        }
        _ => eprintln!(
            "note: LIFEBOAT_TEST_DATABASE_URL is not set: PostgreSQL not measured \
             (`make bench` runs it under scripts/postgres.sh)"
        ),
    }
    databases
}

fn ledger_benches(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = std::env::temp_dir().join(format!("lifeboat-ledger-bench-{}", std::process::id()));
    let databases = databases(&runtime, &dir);
    let events: Vec<LedgerEvent> = (0..BURST).map(event).collect();
    let bytes: usize = events
        .iter()
        .map(|e| serde_json::to_string(e).map_or(0, |s| s.len()))
        .sum();
    eprintln!(
        "events: {} bytes of JSON per event on average",
        bytes / BURST
    );

    let mut group = c.benchmark_group("ledger");
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));

    group.throughput(Throughput::Elements(BURST as u64));
    for db in &databases {
        let id = BenchmarkId::new(format!("writer_burst_{PRODUCERS}_producers"), db.name);
        let mut written = 0u64;
        let cpu_before = process_cpu();
        group.bench_function(id, |b| {
            b.iter_custom(|iters| {
                written += iters * BURST as u64;
                runtime.block_on(async {
                    let registry = prometheus::Registry::new();
                    let metrics = LedgerMetrics::new(&registry).expect("metrics");
                    let (writer, task) =
                        LedgerWriter::spawn(db.ledger.clone(), metrics, WriterConfig::default());
                    let mut elapsed = Duration::ZERO;
                    for _ in 0..iters {
                        let started = Instant::now();
                        let mut producers = Vec::new();
                        for chunk in events.chunks(BURST / PRODUCERS) {
                            let writer = writer.clone();
                            let chunk = chunk.to_vec();
                            producers.push(tokio::spawn(async move {
                                for event in chunk {
                                    writer.record(event).await.expect("record");
                                }
                            }));
                        }
                        for producer in producers {
                            producer.await.expect("producer");
                        }
                        writer.flush().await.expect("flush");
                        elapsed += started.elapsed();
                    }
                    task.shutdown().await.expect("shutdown");
                    elapsed
                })
            })
        });
        if let (Some(before), Some(after)) = (cpu_before, process_cpu()) {
            let cpu = after.saturating_sub(before).as_secs_f64();
            eprintln!(
                "{}: {written} events through the writer, {cpu:.2} s CPU of this process: \
                 {:.1} µs CPU per event, {:.0} events per CPU-second{}",
                db.name,
                cpu * 1e6 / written as f64,
                written as f64 / cpu,
                if db.name == "postgres" {
                    " (the server's own work is not included)"
                } else {
                    ""
                }
            );
        }
    }

    group.throughput(Throughput::Elements(BATCH as u64));
    for db in &databases {
        group.bench_function(
            BenchmarkId::new(format!("append_batch_{BATCH}"), db.name),
            |b| {
                b.iter(|| {
                    runtime
                        .block_on(db.ledger.append(&events[..BATCH]))
                        .expect("append")
                })
            },
        );
    }

    group.throughput(Throughput::Elements(1));
    for db in &databases {
        group.bench_function(BenchmarkId::new("append_single", db.name), |b| {
            b.iter(|| {
                runtime
                    .block_on(db.ledger.append(&events[..1]))
                    .expect("append")
            })
        });
    }
    group.finish();

    for db in databases {
        runtime.block_on(async {
            db.ledger.close().await;
            if let Some(admin_url) = &db.admin_url {
                postgres::drop_database(admin_url, BENCH_DATABASE).await;
            }
        });
    }
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, ledger_benches);
criterion_main!(benches);
