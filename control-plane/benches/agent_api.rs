//! Status ingestion through the agent API: items/s over HTTPS (rustls) + bearer auth + JSON
//! decoding + validation against the WorkStore + replay screening, into a status processor
//! stand-in that takes every item. Batches of 500 items; each connection is one cluster's agent.
//!
//! `--processor`: into the hub's real status processor instead (the built-in AppWrapper
//! interpreter's health and reflected status, replay screening, each binding's per-cluster
//! `aggregatedStatus` item) with its health transitions recorded in a SQLite ledger through the
//! `LedgerWriter` (a fresh file under `target/`); a run ends when every item is answered and
//! the ledger is flushed. `--flip`: every report changes the health (Healthy, then Unhealthy with
//! an `[Infrastructure]` reason, and back), so every item is a transition and a ledger event;
//! without it only the first report of each binding is. The bindings are not in the hub
//! apiserver, so no status is written back (writes coalesce per binding and are not counted).
//!
//! The hub apiserver of a local fleet holds the bootstrap token, the Clusters and the
//! credentials (registration is real); the timed part touches only the API. Client and server
//! share the machine's cores.
//!
//!   cargo bench -p lifeboat-hub --bench agent_api -- --runs 3 [--seconds 10] [--clusters 4]
//!   cargo bench -p lifeboat-hub --bench agent_api -- --runs 3 --processor [--flip]

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::Body;
use http_body_util::BodyExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use lifeboat_api::protocol::{self, ObservedObject, StatusReport, StatusResponse, WorkStatus};
use lifeboat_e2e::fleet::{Fleet, workspace_root};
use lifeboat_e2e::process::cpu_seconds;
use lifeboat_hub::interpreters::{InterpreterHandle, Interpreters};
use lifeboat_hub::leadership::LeaderState;
use lifeboat_hub::ledger::{Ledger, LedgerFeed, LedgerMetrics, LedgerWriter, LedgerWriterTask};
use lifeboat_hub::status::intake;
use lifeboat_hub::status::processor::{self, ProcessorDeps, ProcessorMetrics};
use lifeboat_interpreter::{Runtime, RuntimeConfig};
use serde_json::json;
use support::{Hub, https_client, key, tls_pair, work};

const BATCH: usize = 500;
const BATCHES_PER_ROUND: usize = 10;
const SENTINEL: &str = "2000-01-01T00:00:00Z";

struct Args {
    runs: usize,
    seconds: u64,
    clusters: usize,
    processor: bool,
    flip: bool,
}

fn args() -> Result<Args, String> {
    let mut parsed = Args {
        runs: 3,
        seconds: 10,
        clusters: 4,
        processor: false,
        flip: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match arg.as_str() {
            "--runs" => parsed.runs = value("--runs")? as usize,
            "--seconds" => parsed.seconds = value("--seconds")?,
            "--clusters" => parsed.clusters = value("--clusters")? as usize,
            "--processor" => parsed.processor = true,
            "--flip" => parsed.flip = true,
            // cargo bench passes --bench; libtest-style filters are ignored.
            _ => {}
        }
    }
    Ok(parsed)
}

/// What an agent reports of a running AppWrapper (about 1 KiB of JSON).
fn observed(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {"name": name, "namespace": "ml", "generation": 3,
                     "labels": {"lifeboat.dev/binding": name, "kueue.x-k8s.io/queue-name": "gpu"}},
        "status": {
            "phase": "Running",
            "resettingCount": 0,
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "AppWrapperRunnable", "message": "", "lastTransitionTime": "2026-05-01T12:00:00Z"},
                {"type": "ResourcesDeployed", "status": "True", "reason": "AppWrapperRunnable", "message": "", "lastTransitionTime": "2026-05-01T12:00:01Z"},
                {"type": "PodsReady", "status": "True", "reason": "AppWrapperRunnable", "message": "", "lastTransitionTime": "2026-05-01T12:00:30Z"},
                {"type": "Unhealthy", "status": "False", "reason": "FoundNoFailedPods", "message": "", "lastTransitionTime": "2026-05-01T12:00:30Z"}
            ],
            "componentStatus": [
                {"name": "master", "kind": "PyTorchJob", "apiVersion": "kubeflow.org/v1",
                 "podSets": [{"replicas": 1, "path": "template.spec.pytorchReplicaSpecs.Master.template"},
                             {"replicas": 3, "path": "template.spec.pytorchReplicaSpecs.Worker.template"}],
                 "conditions": [{"type": "ResourcesDeployed", "status": "True", "reason": "Created", "message": "", "lastTransitionTime": "2026-05-01T12:00:01Z"}]}
            ]
        }
    })
}

/// The same AppWrapper, Unhealthy: the agent's condition with the failure class.
fn observed_unhealthy(name: &str) -> serde_json::Value {
    let mut object = observed(name);
    object["status"]["conditions"][3] = json!({
        "type": "Unhealthy", "status": "True", "reason": "FoundFailedPods",
        "message": "[Infrastructure] node gpu-node-3 is NotReady",
        "lastTransitionTime": "2026-05-01T12:10:00Z"
    });
    object
}

/// One batch's body, split around the observation time (filled in per round, so every round
/// is a newer report and none is screened out as a replay).
fn batch_template(
    namespace: &str,
    batch: usize,
    observed: fn(&str) -> serde_json::Value,
) -> Result<Vec<String>, serde_json::Error> {
    let sentinel: Timestamp = SENTINEL.parse().unwrap_or(Timestamp::UNIX_EPOCH);
    let items = (0..BATCH)
        .map(|i| {
            let name = format!("w{}", batch * BATCH + i);
            Ok(WorkStatus {
                key: key(namespace, &name),
                binding_uid: format!("uid-{name}"),
                revision: 1,
                applied: true,
                applied_message: None,
                observed: Some(ObservedObject::from_value(&observed(&name))?),
                observed_at: Time(sentinel),
                reset_generation: None,
                fenced: false,
                gone: false,
            })
        })
        .collect::<Result<Vec<_>, serde_json::Error>>()?;
    let body = serde_json::to_string(&StatusReport { items, full: false })?;
    Ok(body.split(SENTINEL).map(str::to_string).collect())
}

struct Outcome {
    items: u64,
    latencies: Vec<Duration>,
    /// The agent's next run starts after it (reports stay newer, health keeps alternating).
    last_round: i64,
}

async fn agent(
    client: support::HttpsClient,
    url: String,
    token: String,
    variants: Arc<Vec<Vec<Vec<String>>>>,
    first_round: i64,
    until: Instant,
) -> Result<Outcome, String> {
    let mut outcome = Outcome {
        items: 0,
        latencies: Vec::new(),
        last_round: first_round,
    };
    let mut round = first_round;
    while Instant::now() < until {
        round += 1;
        let at = Timestamp::from_second(1_780_000_000 + round)
            .map_err(|e| e.to_string())?
            .to_string();
        let templates = &variants[round.unsigned_abs() as usize % variants.len()];
        for template in templates.iter() {
            let body = template.join(&at);
            let request = http::Request::post(&url)
                .header("authorization", format!("Bearer {token}"))
                .header("content-type", "application/json")
                .body(Body::from(body))
                .map_err(|e| e.to_string())?;
            let started = Instant::now();
            let response = client.request(request).await.map_err(|e| e.to_string())?;
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            outcome.latencies.push(started.elapsed());
            let answer: StatusResponse = serde_json::from_slice(&bytes)
                .map_err(|e| format!("{status}: {e}: {}", String::from_utf8_lossy(&bytes)))?;
            if !answer.rejected.is_empty() || answer.accepted != BATCH {
                return Err(format!("batch not fully taken: {answer:?}"));
            }
            outcome.items += answer.accepted as u64;
        }
        outcome.last_round = round;
    }
    Ok(outcome)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// The real status processor and a SQLite ledger behind the API (`--processor`).
struct Pipeline {
    ledger: LedgerWriter,
    ledger_task: LedgerWriterTask,
    ledger_file: std::path::PathBuf,
    registry: prometheus::Registry,
}

impl Pipeline {
    /// Items the processor accepted so far.
    fn accepted(&self) -> u64 {
        support::metric(
            &self.registry,
            "lifeboat_hub_status_items_processed_total",
            &[("result", "accepted")],
        ) as u64
    }

    /// Events the ledger wrote so far.
    fn ledger_events(&self) -> u64 {
        support::metric(&self.registry, "lifeboat_ledger_events_total", &[]) as u64
    }

    /// Health transitions the processor made so far (each one a ledger event).
    fn transitions(&self) -> u64 {
        support::metric(&self.registry, "lifeboat_hub_health_transitions_total", &[]) as u64
    }

    /// Waits until the ledger has written an event for every transition made so far (they
    /// pass the feed task on their way to the writer, so one flush may come too early).
    async fn settle(&self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let wanted = self.transitions();
            self.ledger.flush().await?;
            if self.ledger_events() >= wanted {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the ledger wrote {} events for {wanted} transitions",
                    self.ledger_events()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

async fn start_pipeline(
    client: kube::Client,
    namespace: &str,
) -> Result<(Hub, Pipeline), Box<dyn std::error::Error + Send + Sync>> {
    let (intake, receiver) = intake::channel(1024);
    let hub = Hub::start_with_intake(client.clone(), namespace, "bench", intake).await?;
    let dir = workspace_root().join("target/agent-api-bench-ledger");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let ledger_file = dir.join("ledger.db");
    let registry = prometheus::Registry::new();
    let ledger = Ledger::connect(&format!("sqlite://{}", ledger_file.display())).await?;
    let (writer, ledger_task) =
        LedgerWriter::spawn(ledger, LedgerMetrics::new(&registry)?, Default::default());
    let (_leader, leading) = tokio::sync::watch::channel(LeaderState::leader());
    let feed = LedgerFeed::new(writer.clone(), leading);
    let (transitions, transitions_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(lifeboat_hub::status::record::health_transitions(
        feed,
        transitions_rx,
        hub.work.clone(),
    ));
    let builtin = Interpreters::builtin(Arc::new(Runtime::new(RuntimeConfig::default())))?;
    processor::run(
        receiver,
        ProcessorDeps {
            client,
            // No binding objects: the decisions are made, nothing is written back.
            bindings: kube::runtime::reflector::store().0,
            work: hub.work.clone(),
            interpreters: InterpreterHandle::new(Interpreters::layered(builtin, &[]).0),
            metrics: ProcessorMetrics::new(&registry)?,
            transitions: Some(transitions),
            written: None,
            full_reports: None,
            write_concurrency: 8,
            handoff: None,
        },
    );
    Ok((
        hub,
        Pipeline {
            ledger: writer,
            ledger_task,
            ledger_file,
            registry,
        },
    ))
}

async fn bench(fleet: &Fleet, args: &Args) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let client = fleet.client("hub").await?;
    let (hub, pipeline) = if args.processor {
        let (hub, pipeline) = start_pipeline(client, "agent-api-bench-processor").await?;
        (hub, Some(pipeline))
    } else {
        (
            Hub::start_counting(client, "agent-api-bench", |_| {}).await?,
            None,
        )
    };
    let taken = || match &pipeline {
        Some(p) => p.accepted(),
        None => hub.taken.load(Ordering::Relaxed),
    };
    let (server_tls, client_tls) = tls_pair(&workspace_root().join("target/agent-api-bench-pki"))?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(hub.api.clone().serve(listener, server_tls, async {
        let _ = stopped.await;
    }));

    let observations: &[fn(&str) -> serde_json::Value] = if args.flip {
        &[observed, observed_unhealthy]
    } else {
        &[observed]
    };
    let mut agents = Vec::new();
    for c in 0..args.clusters {
        let cluster = format!("bench-{c}");
        let token = hub.register(&cluster).await?;
        for w in 0..BATCH * BATCHES_PER_ROUND {
            hub.work
                .upsert(&cluster, work(&hub.namespace, &format!("w{w}")));
        }
        let variants = observations
            .iter()
            .map(|observe| {
                (0..BATCHES_PER_ROUND)
                    .map(|b| batch_template(&hub.namespace, b, *observe))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        agents.push((cluster, token, Arc::new(variants)));
    }
    println!(
        "{} clusters x {} work items, batches of {BATCH}, {} s per run, HTTPS on 127.0.0.1:{port}, into {}",
        args.clusters,
        BATCH * BATCHES_PER_ROUND,
        args.seconds,
        match (&pipeline, args.flip) {
            (None, _) => "a processor stand-in".to_string(),
            (Some(p), flip) => format!(
                "the status processor and a SQLite ledger ({}), {}",
                p.ledger_file.display(),
                if flip {
                    "every item a health transition"
                } else {
                    "transitions on the first report only"
                }
            ),
        }
    );

    let mut rates = Vec::new();
    let mut per_cpu = Vec::new();
    let mut rounds = vec![0i64; agents.len()];
    // Run 0 warms up (connections, allocator) and is not counted.
    for run in 0..=args.runs {
        let seconds = if run == 0 { 2 } else { args.seconds };
        let before = taken();
        let events_before = pipeline.as_ref().map(Pipeline::ledger_events);
        let cpu_before = cpu_seconds(std::process::id() as i32).unwrap_or(0.0);
        let started = Instant::now();
        let until = started + Duration::from_secs(seconds);
        let tasks: Vec<_> = agents
            .iter()
            .zip(&rounds)
            .map(|((cluster, token, variants), round)| {
                tokio::spawn(agent(
                    https_client(client_tls.clone()),
                    format!("https://localhost:{port}{}", protocol::status_path(cluster)),
                    token.clone(),
                    variants.clone(),
                    *round,
                    until,
                ))
            })
            .collect();
        let mut items = 0;
        let mut latencies = Vec::new();
        for (task, round) in tasks.into_iter().zip(rounds.iter_mut()) {
            let outcome = task.await??;
            items += outcome.items;
            latencies.extend(outcome.latencies);
            *round = outcome.last_round;
        }
        // The ledger is part of the pipeline: a run ends when it has written what it was given.
        if let Some(p) = &pipeline {
            p.settle().await?;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let cpu = cpu_seconds(std::process::id() as i32).unwrap_or(0.0) - cpu_before;
        let taken = taken() - before;
        if taken != items {
            return Err(
                format!("the intake took {taken} items, the agents were told {items}").into(),
            );
        }
        let events = match (&pipeline, events_before) {
            (Some(p), Some(before)) => {
                let events = p.ledger_events() - before;
                if args.flip && run > 0 && events != items {
                    return Err(format!(
                        "{items} items changed health but the ledger wrote {events} events"
                    )
                    .into());
                }
                format!("; {events} ledger events written")
            }
            _ => String::new(),
        };
        latencies.sort();
        let rate = items as f64 / elapsed;
        if run > 0 {
            rates.push(rate);
            per_cpu.push(items as f64 / cpu.max(f64::EPSILON));
            println!(
                "run {run}: {items} items in {elapsed:.2} s = {rate:.0} items/s{events}; batch latency p50 {:.1} ms, p99 {:.1} ms ({} batches); {cpu:.2} CPU-s in this process = {:.0} items per CPU-second",
                percentile(&latencies, 0.5).as_secs_f64() * 1e3,
                percentile(&latencies, 0.99).as_secs_f64() * 1e3,
                latencies.len(),
                items as f64 / cpu.max(f64::EPSILON)
            );
        }
    }
    rates.sort_by(|a, b| a.total_cmp(b));
    per_cpu.sort_by(|a, b| a.total_cmp(b));
    if let (Some(min), Some(max)) = (rates.first(), rates.last()) {
        println!(
            "status ingestion through the agent API{}: median {:.0} items/s ({min:.0} to {max:.0}, {} runs), median {:.0} items per CPU-second of this process; target >= 20,000 items/s",
            if pipeline.is_some() {
                " into the processor and the SQLite ledger"
            } else {
                ""
            },
            rates[rates.len() / 2],
            rates.len(),
            per_cpu[per_cpu.len() / 2]
        );
    }
    let _ = stop.send(());
    server.await??;
    if let Some(p) = pipeline {
        p.ledger_task.shutdown().await?;
    }
    Ok(())
}

/// The hub binary's allocator, so the hub in this process runs as it does there.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    support::on_fleet("agent-api-bench", |fleet| async move {
        bench(&fleet, &args).await
    })
}
