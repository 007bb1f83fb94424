//! Failover figures of the hub (issue 9) on a local fleet, with the real hub in this process
//! and simulated agents (`support/sim_agent.rs`, the real agent protocol over HTTPS; see
//! `hub_e2e.rs`). Templates are AppWrappers (one pod asking for 1 GPU); each agent holds the
//! work its stream hands it and reports its status when the bench says so. Every timestamp is
//! taken in this process: the instant a report is sent, and, through a watch of the bindings
//! and the agents' work streams, the instants the hub's results arrive.
//!
//! `--decision` (hub decision latency): `--templates` (1,500) AppWrappers over `--clusters`
//! (10) clusters, an equal share on each (the clusters register one at a time, from the last
//! name to the first, and a share is created after each: the scheduler breaks ties between
//! identical clusters by name, so every failover goes to `gpu-000`, or `gpu-001` from there),
//! under a policy with `failover.application` {`decisionConditions.tolerationSeconds:
//! 0`, `purgeMode: Gracefully`, `gracePeriodSeconds: 3600`, `blockPredecessorSeconds: 3600`}.
//! Every agent first reports its AppWrappers Running (Healthy), and the bench waits until each
//! binding's status says so. Then a report that an AppWrapper went Failed with class
//! Infrastructure (it crosses the toleration at once) is sent, and the latency runs from sending
//! it to both the eviction being seen in the binding (`evictionHistory` entry for the old
//! cluster) and the work appearing on another cluster's work stream (the later of the two).
//! Spaced: `--spaced` (200) reports one at a time (the next 100 ms after the previous one's
//! eviction and dispatch were both seen). Burst: `--bursts` (3) rounds of `--burst` (100)
//! reports, each report its own request, all sent at the same instant (latency from that
//! instant). Also shown: from the report to the binding's status showing the placement
//! Unhealthy (the processor's part).
//!
//! `--cluster-loss`: one cluster registers first and gets all `--templates` (1,000) bindings;
//! then `--clusters - 1` (9) more register, and the first one's agent stops (no heartbeats, work
//! stream closed). Policy: `failover.cluster` {`tolerationSeconds: --toleration` (10),
//! `purgeMode: Gracefully`}: the new copies are created without waiting for the lost agent to
//! confirm anything. The hub's lease is `--lease` (10 s). Figure: from the end of the cluster
//! toleration (the last heartbeat the hub accepted, as sent, + lease + toleration) until the
//! 1,000th binding's work appeared on another cluster's stream. The hub's cluster eviction rate
//! is its default (`--cluster-eviction-rate`, 50 bindings/s).
//!
//! Also from the instant the agent stopped (the hub sees only silence) to the first and the last
//! binding dispatched elsewhere. `--heartbeat` (2 s) is the agents' heartbeat interval; the
//! hub's fast profile (README) is `--lease 3 --heartbeat 1 --toleration 0`.
//!
//! After the bursts of `--burst`, one burst of `--big-burst` (1,000; 0 for none) reports at
//! once; `--templates` is then 1,500 (1,000 with `--cluster-loss`).
//!
//! Before the failovers, the floor of a burst: `--burst` and then `--big-burst` bindings
//! written at once (a merge patch of one annotation each, 32 in flight as the binder's
//! workers), the least time the hub's kube-apiserver needs for that many binding writes.
//!
//!   cargo bench --profile dev -p lifeboat-hub --bench failover -- --decision
//!   cargo bench --profile dev -p lifeboat-hub --bench failover -- --cluster-loss
//!   cargo bench --profile dev -p lifeboat-hub --bench failover -- --cluster-loss --lease 3 --heartbeat 1 --toleration 0 --templates 100

#[path = "support/sim_agent.rs"]
mod sim_agent;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use lifeboat_api::binding::{ResourceBinding, ResourceHealth};
use lifeboat_api::protocol::{WorkKey, WorkStatus};
use lifeboat_e2e::fleet::Fleet;
use lifeboat_e2e::load_average;
use serde_json::json;
use sim_agent::{
    BoxError, Handed, SimulatedAgent, appwrapper, appwrapper_resource, bootstrap, policy_resource,
    start_agents, start_hub, until,
};
use tokio::sync::mpsc;

const NAMESPACE: &str = "failover-bench";
/// Creates in flight at once.
const CREATE_CONCURRENCY: usize = 16;
/// The class and message the agent writes when an AppWrapper's pod failed on a broken node.
const FAILURE: &str = "[Infrastructure] node gpu-node-7 NotReady";
/// Longest wait for one failover before the bench gives up.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(180);

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Decision,
    ClusterLoss,
}

struct Args {
    mode: Mode,
    templates: usize,
    clusters: usize,
    spaced: usize,
    bursts: usize,
    burst: usize,
    /// One more burst of this many after the others (0: none).
    big_burst: usize,
    toleration: u64,
    lease: u64,
    heartbeat: u64,
}

fn args() -> Result<Args, String> {
    let mut parsed = Args {
        mode: Mode::Decision,
        templates: 1_500,
        clusters: 10,
        spaced: 200,
        bursts: 3,
        burst: 100,
        big_burst: 1_000,
        toleration: 10,
        lease: 10,
        heartbeat: 2,
    };
    let mut templates_given = false;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .and_then(|v| v.parse::<usize>().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match arg.as_str() {
            "--decision" => parsed.mode = Mode::Decision,
            "--cluster-loss" => parsed.mode = Mode::ClusterLoss,
            "--templates" => {
                parsed.templates = value("--templates")?;
                templates_given = true;
            }
            "--big-burst" => parsed.big_burst = value("--big-burst")?,
            "--heartbeat" => parsed.heartbeat = value("--heartbeat")? as u64,
            "--clusters" => parsed.clusters = value("--clusters")?,
            "--spaced" => parsed.spaced = value("--spaced")?,
            "--bursts" => parsed.bursts = value("--bursts")?,
            "--burst" => parsed.burst = value("--burst")?,
            "--toleration" => parsed.toleration = value("--toleration")? as u64,
            "--lease" => parsed.lease = value("--lease")? as u64,
            // cargo bench passes --bench; libtest-style filters are ignored.
            _ => {}
        }
    }
    if parsed.mode == Mode::ClusterLoss && !templates_given {
        parsed.templates = 1_000;
    }
    if parsed.heartbeat == 0 || parsed.heartbeat >= parsed.lease {
        return Err(format!(
            "--heartbeat {} must be greater than 0 and less than --lease {}",
            parsed.heartbeat, parsed.lease
        ));
    }
    if parsed.clusters < 2 {
        return Err("--clusters must be at least 2 (a failover needs somewhere to go)".into());
    }
    if parsed.mode == Mode::Decision
        && parsed.spaced + parsed.bursts * parsed.burst + parsed.big_burst > parsed.templates
    {
        return Err(format!(
            "--spaced {} + --bursts {} × --burst {} + --big-burst {} fail more bindings than --templates {}",
            parsed.spaced, parsed.bursts, parsed.burst, parsed.big_burst, parsed.templates
        ));
    }
    Ok(parsed)
}

/// One failover the bench waits for: the binding's work leaves cluster `from`.
struct Pending {
    from: String,
    /// The hub answered the report: the processor took it (the agent API and the processor's
    /// part are done; the binder's begins).
    answered: Option<Instant>,
    /// The binding's status shows the placement on `from` Unhealthy.
    unhealthy: Option<Instant>,
    /// The binding's `evictionHistory` names `from`.
    evicted: Option<Instant>,
    /// The work appeared on another cluster's stream.
    dispatched: Option<Instant>,
}

/// What the watches saw of the failovers the bench waits for.
#[derive(Default)]
struct Tracker {
    pending: Mutex<HashMap<WorkKey, Pending>>,
}

impl Tracker {
    fn expect(&self, key: &WorkKey, from: &str) {
        self.lock().insert(
            key.clone(),
            Pending {
                from: from.to_string(),
                answered: None,
                unhealthy: None,
                evicted: None,
                dispatched: None,
            },
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<WorkKey, Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn binding_seen(&self, binding: &ResourceBinding, at: Instant) {
        let key = WorkKey {
            namespace: binding.metadata.namespace.clone().unwrap_or_default(),
            name: binding.metadata.name.clone().unwrap_or_default(),
        };
        let mut pending = self.lock();
        let Some(p) = pending.get_mut(&key) else {
            return;
        };
        if p.unhealthy.is_none()
            && binding.status.as_ref().is_some_and(|s| {
                s.aggregated_status
                    .iter()
                    .any(|i| i.cluster_name == p.from && i.health == ResourceHealth::Unhealthy)
            })
        {
            p.unhealthy = Some(at);
        }
        if p.evicted.is_none()
            && binding
                .spec
                .eviction_history
                .iter()
                .any(|r| r.cluster_name == p.from)
        {
            p.evicted = Some(at);
        }
    }

    fn answered(&self, key: &WorkKey, at: Instant) {
        if let Some(p) = self.lock().get_mut(key) {
            p.answered = Some(at);
        }
    }

    fn handed(&self, handed: &Handed) {
        let mut pending = self.lock();
        if let Some(p) = pending.get_mut(&handed.key)
            && p.dispatched.is_none()
            && p.from != handed.cluster
        {
            p.dispatched = Some(handed.at);
        }
    }

    /// The failovers of `keys` once each was both evicted and dispatched, taken out.
    fn done(&self, keys: &[WorkKey]) -> Option<Vec<Pending>> {
        let mut pending = self.lock();
        let complete = keys.iter().all(|k| {
            pending
                .get(k)
                .is_some_and(|p| p.evicted.is_some() && p.dispatched.is_some())
        });
        if !complete {
            return None;
        }
        Some(keys.iter().filter_map(|k| pending.remove(k)).collect())
    }

    /// Waits until every failover of `keys` was both evicted and dispatched. The instants are
    /// taken by the watches; this loop only paces the bench.
    async fn wait(&self, keys: &[WorkKey]) -> Result<Vec<Pending>, BoxError> {
        let deadline = Instant::now() + FAILOVER_TIMEOUT;
        loop {
            if let Some(done) = self.done(keys) {
                return Ok(done);
            }
            if Instant::now() > deadline {
                let pending = self.lock();
                let missing: Vec<String> = keys
                    .iter()
                    .filter_map(|k| {
                        let p = pending
                            .get(k)
                            .filter(|p| p.evicted.is_none() || p.dispatched.is_none())?;
                        Some(format!(
                            "{k} (evicted {}, dispatched {})",
                            p.evicted.is_some(),
                            p.dispatched.is_some()
                        ))
                    })
                    .take(5)
                    .collect();
                return Err(format!(
                    "failovers not done within {FAILOVER_TIMEOUT:?}: {}",
                    missing.join(", ")
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Watches the bindings of the namespace and reads the agents' handed work into `tracker`.
fn track(
    hub: &kube::Client,
    tracker: Arc<Tracker>,
    mut handed: mpsc::UnboundedReceiver<Handed>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let bindings: Api<ResourceBinding> = Api::namespaced(hub.clone(), NAMESPACE);
    let from_watch = tracker.clone();
    let watch = tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(bindings, watcher::Config::default()));
        loop {
            match stream.try_next().await {
                Ok(Some(watcher::Event::Apply(b) | watcher::Event::InitApply(b))) => {
                    from_watch.binding_seen(&b, Instant::now());
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => eprintln!("binding watch: {e}; retrying"),
            }
        }
    });
    let stream = tokio::spawn(async move {
        while let Some(h) = handed.recv().await {
            tracker.handed(&h);
        }
    });
    vec![watch, stream]
}

async fn apply_policy(hub: &kube::Client, failover: serde_json::Value) -> Result<(), BoxError> {
    let policies: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), NAMESPACE, &policy_resource());
    let policy: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "policy.lifeboat.dev/v1alpha1", "kind": "PropagationPolicy",
        "metadata": {"name": "gpu-training", "namespace": NAMESPACE},
        "spec": {
            "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper"}],
            "failover": failover
        }
    }))?;
    policies
        .patch(
            "gpu-training",
            &PatchParams::apply("failover-bench").force(),
            &Patch::Apply(&policy),
        )
        .await?;
    // The hub re-binds every template when a policy changes: let it see this one first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(())
}

/// Creates the AppWrappers numbered `templates` and waits until the work of every AppWrapper
/// created so far (0 to its end) is held by one of `agents`.
async fn create_templates(
    hub: &kube::Client,
    templates: std::ops::Range<usize>,
    agents: &[SimulatedAgent],
) -> Result<(), BoxError> {
    let appwrappers: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), NAMESPACE, &appwrapper_resource());
    let created = templates.end;
    let objects = templates
        .clone()
        .map(|i| appwrapper(NAMESPACE, &format!("train-{i:05}")))
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    futures::stream::iter(objects)
        .map(|object| {
            let api = appwrappers.clone();
            async move { api.create(&PostParams::default(), &object).await }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    until("every binding's work held by a cluster", || async {
        let held: usize = agents.iter().map(|a| held(a).len()).sum();
        if held == created {
            Ok(())
        } else {
            Err(format!("{held} of {created}"))
        }
    })
    .await?;
    println!(
        "{} AppWrappers created and their work on the clusters' streams in {:.1} s",
        templates.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn held(agent: &SimulatedAgent) -> Vec<WorkKey> {
    let mut keys: Vec<WorkKey> = agent
        .works
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .keys()
        .cloned()
        .collect();
    keys.sort();
    keys
}

/// Every agent reports all it holds Running; waits until every binding's status says Healthy.
async fn report_healthy(
    hub: &kube::Client,
    agents: &[SimulatedAgent],
    templates: usize,
) -> Result<(), BoxError> {
    for agent in agents {
        let items: Vec<WorkStatus> = held(agent)
            .iter()
            .filter_map(|k| agent.status_of(k, None))
            .collect();
        if items.is_empty() {
            continue;
        }
        let response = agent.report(items).await?;
        if !response.rejected.is_empty() {
            return Err(format!("healthy reports rejected: {:?}", response.rejected).into());
        }
    }
    let bindings: Api<ResourceBinding> = Api::namespaced(hub.clone(), NAMESPACE);
    until("every binding Healthy in its status", || async {
        let list = bindings
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let healthy = list
            .items
            .iter()
            .filter(|b| {
                b.status.as_ref().is_some_and(|s| {
                    !s.aggregated_status.is_empty()
                        && s.aggregated_status
                            .iter()
                            .all(|i| i.health == ResourceHealth::Healthy)
                })
            })
            .count();
        if healthy == templates {
            Ok(())
        } else {
            Err(format!("{healthy} of {templates} Healthy"))
        }
    })
    .await
}

/// The value at quantile `q` (nearest rank) of sorted `values`.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn summary(label: &str, mut ms: Vec<f64>) {
    ms.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{label}: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} failovers)",
        quantile(&ms, 0.5),
        quantile(&ms, 0.9),
        quantile(&ms, 0.99),
        ms.last().copied().unwrap_or(f64::NAN),
        ms.len()
    );
}

/// Prints the latency figures of `done`, each from its report's `sent` instant.
fn figures(case: &str, done: &[(Instant, Pending)]) {
    let ms = |f: fn(&Pending) -> Option<Instant>| -> Vec<f64> {
        done.iter()
            .filter_map(|(sent, p)| f(p).map(|at| at.saturating_duration_since(*sent)))
            .map(|d| d.as_secs_f64() * 1000.0)
            .collect()
    };
    summary(
        &format!("{case}: report → eviction written and new placement dispatched"),
        ms(|p| p.evicted.max(p.dispatched)),
    );
    summary(
        &format!("{case}:   report → answered (agent API and status processor)"),
        ms(|p| p.answered),
    );
    let hub_share: Vec<f64> = done
        .iter()
        .filter_map(|(_, p)| Some(p.dispatched?.saturating_duration_since(p.answered?)))
        .map(|d| d.as_secs_f64() * 1000.0)
        .collect();
    summary(
        &format!("{case}:   answered → work on another cluster's stream (binder)"),
        hub_share,
    );
    summary(
        &format!("{case}:   report → binding status Unhealthy seen"),
        ms(|p| p.unhealthy),
    );
    summary(
        &format!("{case}:   report → eviction seen"),
        ms(|p| p.evicted),
    );
    summary(
        &format!("{case}:   report → work on another cluster's stream"),
        ms(|p| p.dispatched),
    );
}

/// The key held by `agents` at `index` of the clusters' round-robin order (so consecutive
/// failovers come from different clusters).
fn round_robin(agents: &[SimulatedAgent]) -> Vec<(usize, WorkKey)> {
    let held: Vec<Vec<WorkKey>> = agents.iter().map(held).collect();
    let longest = held.iter().map(Vec::len).max().unwrap_or(0);
    (0..longest)
        .flat_map(|i| {
            held.iter()
                .enumerate()
                .filter_map(move |(a, keys)| keys.get(i).map(|k| (a, k.clone())))
        })
        .collect()
}

/// Starts the clusters one at a time, from the last name to the first, creating an equal share
/// of the templates after each: identical clusters score the same and the scheduler breaks ties
/// by name, so each share goes to the cluster just started, and a placed binding stays where it
/// is. Returns the agents in name order.
async fn spread(
    hub: &kube::Client,
    args: &Args,
    endpoint: &Arc<sim_agent::AgentEndpoint>,
    handed: &mpsc::UnboundedSender<Handed>,
) -> Result<Vec<SimulatedAgent>, BoxError> {
    let mut agents: Vec<SimulatedAgent> = Vec::new();
    let share = args.templates.div_ceil(args.clusters);
    for (n, c) in (0..args.clusters).rev().enumerate() {
        let name = format!("gpu-{c:03}");
        agents
            .extend(start_agents(hub, endpoint, std::slice::from_ref(&name), Some(handed)).await?);
        let start = (n * share).min(args.templates);
        let end = ((n + 1) * share).min(args.templates);
        create_templates(hub, start..end, &agents).await?;
    }
    agents.reverse();
    Ok(agents)
}

/// Sends a failure report for each of `chosen` at the same instant (each its own request) and
/// waits for their failovers; each comes back with that instant.
async fn burst(
    agents: &[SimulatedAgent],
    tracker: &Tracker,
    chosen: Vec<(usize, WorkKey)>,
) -> Result<Vec<(Instant, Pending)>, BoxError> {
    let mut requests = Vec::with_capacity(chosen.len());
    for (a, key) in &chosen {
        let agent = &agents[*a];
        let item = agent
            .status_of(key, Some(FAILURE))
            .ok_or_else(|| format!("{} no longer holds {key}", agent.cluster))?;
        tracker.expect(key, &agent.cluster);
        requests.push((agent, item));
    }
    let sent = Instant::now();
    let responses = futures::future::join_all(requests.into_iter().map(|(agent, item)| {
        let key = item.key.clone();
        async move {
            let response = agent.report(vec![item]).await;
            tracker.answered(&key, Instant::now());
            response
        }
    }))
    .await;
    for response in responses {
        let response = response?;
        if !response.rejected.is_empty() {
            return Err(format!("failure report rejected: {:?}", response.rejected).into());
        }
    }
    let keys: Vec<WorkKey> = chosen.into_iter().map(|(_, k)| k).collect();
    let done = tracker.wait(&keys).await?;
    Ok(done.into_iter().map(|p| (sent, p)).collect())
}

/// Writes `n` bindings at once, each the cheapest write there is (a JSON merge patch of one
/// annotation, BINDER_WORKERS in flight as the binder has), and prints how long the hub's
/// kube-apiserver took: the least a burst of `n` failovers can take here, since each persists
/// its eviction in a binding write before anything is dispatched.
async fn write_floor(hub: &kube::Client, n: usize) -> Result<(), BoxError> {
    const BINDER_WORKERS: usize = 32;
    let bindings: Api<ResourceBinding> = Api::namespaced(hub.clone(), NAMESPACE);
    let listed = bindings.list(&Default::default()).await?.items;
    // How big the written objects are (what the apiserver decodes, validates, converts for
    // managed fields and stores on each write): the JSON of the first, with its managed fields.
    if let Some(first) = listed.first() {
        let bytes = serde_json::to_vec(first)?.len();
        let managers = first.metadata.managed_fields.as_ref().map_or(0, Vec::len);
        let status_bytes = serde_json::to_vec(&first.status)?.len();
        println!(
            "floor: a binding is {bytes} bytes of JSON ({status_bytes} of status, {managers} managed-field entries)"
        );
    }
    let names: Vec<String> = listed
        .into_iter()
        .filter_map(|b| b.metadata.name)
        .take(n)
        .collect();
    let load = load_average();
    let started = Instant::now();
    let mut ms: Vec<f64> = futures::stream::iter(names)
        .map(|name| {
            let api = bindings.clone();
            async move {
                let patch = json!({"metadata": {"annotations": {"bench.lifeboat.dev/floor": format!("{n}")}}});
                let at = Instant::now();
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| at.elapsed().as_secs_f64() * 1000.0)
            }
        })
        .buffer_unordered(BINDER_WORKERS)
        .try_collect()
        .await?;
    let all = started.elapsed();
    ms.sort_by(|a, b| a.total_cmp(b));
    println!(
        "floor: {} binding writes at once ({BINDER_WORKERS} in flight, merge patch of one annotation): all written in {:.0} ms ({:.0} writes/s); per write p50 {:.1} ms, p99 {:.1} ms; load average (1 min) {load}",
        ms.len(),
        all.as_secs_f64() * 1000.0,
        ms.len() as f64 / all.as_secs_f64(),
        quantile(&ms, 0.5),
        quantile(&ms, 0.99),
    );
    Ok(())
}

/// Each binder pass stage's (count, total seconds) so far
/// (`lifeboat_hub_binder_stage_duration_seconds`).
fn stages(registry: &prometheus::Registry) -> Vec<(String, u64, f64)> {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == "lifeboat_hub_binder_stage_duration_seconds")
        .flat_map(|f| f.get_metric().to_vec())
        .map(|m| {
            let stage = m
                .get_label()
                .iter()
                .find(|l| l.name() == "stage")
                .map(|l| l.value().to_string())
                .unwrap_or_default();
            let h = m.get_histogram();
            (stage, h.get_sample_count(), h.get_sample_sum())
        })
        .collect()
}

/// What the binder's passes spent per stage since `before`, and its reconciles.
fn print_stages(case: &str, registry: &prometheus::Registry, before: &[(String, u64, f64)]) {
    let now = stages(registry);
    let parts: Vec<String> = now
        .iter()
        .map(|(stage, count, sum)| {
            let (c0, s0) = before
                .iter()
                .find(|(s, _, _)| s == stage)
                .map_or((0, 0.0), |(_, c, s)| (*c, *s));
            let (count, sum) = (count - c0, sum - s0);
            format!(
                "{stage} {count} × {:.2} ms = {:.2} s",
                if count > 0 {
                    sum * 1000.0 / count as f64
                } else {
                    0.0
                },
                sum
            )
        })
        .collect();
    println!("{case}: binder stages: {}", parts.join("; "));
}

async fn decision(
    hub: &kube::Client,
    args: &Args,
    agents: &[SimulatedAgent],
    tracker: &Tracker,
    registry: &prometheus::Registry,
) -> Result<(), BoxError> {
    let per_cluster: Vec<String> = agents
        .iter()
        .map(|a| format!("{} {}", a.cluster, held(a).len()))
        .collect();
    println!("placement: {}", per_cluster.join(", "));
    if let Some(empty) = agents.iter().find(|a| held(a).is_empty()) {
        return Err(format!("the bindings are not spread: {} holds none", empty.cluster).into());
    }
    report_healthy(hub, agents, args.templates).await?;
    // Let the status writes, template statuses and ledger of the healthy round settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut victims = round_robin(agents).into_iter();

    // The floor of a burst on this machine: the hub's kube-apiserver taking as many binding
    // writes at once as the burst has failovers (each failover persists its eviction in one).
    for n in [args.burst, args.big_burst] {
        if n > 0 {
            write_floor(hub, n.min(args.templates)).await?;
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
    }

    println!(
        "load average (1 min) before the spaced case: {}",
        load_average()
    );
    let mut mark = stages(registry);
    let mut reconciles = support::metric(registry, "lifeboat_hub_binder_reconciles_total", &[]);
    let mut case_done = |case: &str| {
        print_stages(case, registry, &mark);
        let now = support::metric(registry, "lifeboat_hub_binder_reconciles_total", &[]);
        println!("{case}: {:.0} binder reconciles", now - reconciles);
        mark = stages(registry);
        reconciles = now;
    };
    let mut spaced = Vec::with_capacity(args.spaced);
    for (a, key) in victims.by_ref().take(args.spaced) {
        let agent = &agents[a];
        let item = agent
            .status_of(&key, Some(FAILURE))
            .ok_or_else(|| format!("{} no longer holds {key}", agent.cluster))?;
        tracker.expect(&key, &agent.cluster);
        let sent = Instant::now();
        let response = agent.report(vec![item]).await?;
        tracker.answered(&key, Instant::now());
        if !response.rejected.is_empty() {
            return Err(format!("failure report rejected: {:?}", response.rejected).into());
        }
        let mut done = tracker.wait(std::slice::from_ref(&key)).await?;
        spaced.extend(done.pop().map(|p| (sent, p)));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    figures("spaced", &spaced);
    case_done("spaced");
    println!(
        "load average (1 min) after the spaced case: {}",
        load_average()
    );

    let mut burst_done = Vec::new();
    for round in 1..=args.bursts {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let chosen: Vec<(usize, WorkKey)> = victims.by_ref().take(args.burst).collect();
        let done = burst(agents, tracker, chosen).await?;
        println!(
            "burst {round}: {} reports sent at once, load average (1 min) {}",
            done.len(),
            load_average()
        );
        burst_done.extend(done);
    }
    figures(
        &format!("burst ({} × {})", args.bursts, args.burst),
        &burst_done,
    );
    case_done("bursts");
    if args.big_burst > 0 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let chosen: Vec<(usize, WorkKey)> = victims.by_ref().take(args.big_burst).collect();
        let done = burst(agents, tracker, chosen).await?;
        println!(
            "burst of {}: reports sent at once, load average (1 min) {}",
            done.len(),
            load_average()
        );
        figures(&format!("burst (1 × {})", args.big_burst), &done);
        case_done("big burst");
    }
    println!(
        "hub: {:.0} failovers counted, {:.0} binder reconciles, {:.0} binding status writes",
        support::metric(registry, "lifeboat_hub_failovers_total", &[]),
        support::metric(registry, "lifeboat_hub_binder_reconciles_total", &[]),
        support::metric(registry, "lifeboat_hub_binding_status_writes_total", &[]),
    );
    Ok(())
}

async fn cluster_loss(
    hub: &kube::Client,
    args: &Args,
    endpoint: &Arc<sim_agent::AgentEndpoint>,
    handed: &mpsc::UnboundedSender<Handed>,
    tracker: &Tracker,
) -> Result<(), BoxError> {
    // The lost cluster alone first, so that it gets every binding.
    let lost_name = "gpu-lost".to_string();
    let lost = start_agents(
        hub,
        endpoint,
        std::slice::from_ref(&lost_name),
        Some(handed),
    )
    .await?
    .pop()
    .ok_or("no agent for the lost cluster")?;
    create_templates(hub, 0..args.templates, std::slice::from_ref(&lost)).await?;
    report_healthy(hub, std::slice::from_ref(&lost), args.templates).await?;
    let others: Vec<String> = (1..args.clusters).map(|c| format!("gpu-{c:03}")).collect();
    let _survivors = start_agents(hub, endpoint, &others, Some(handed)).await?;
    // New clusters move nothing that is placed (the hub reschedules only on a reason).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let keys = held(&lost);
    if keys.len() != args.templates {
        return Err(format!(
            "the lost cluster holds {} of {} works before it is lost",
            keys.len(),
            args.templates
        )
        .into());
    }
    for key in &keys {
        tracker.expect(key, &lost_name);
    }
    println!(
        "{} bindings on {lost_name}, {} other clusters Ready; load average (1 min) {}",
        keys.len(),
        others.len(),
        load_average()
    );
    // Stopped right after a heartbeat was accepted, so none is in flight: the lease the hub
    // holds is the one that heartbeat renewed.
    let heartbeat_sent = || {
        *lost
            .last_heartbeat_sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    };
    let before = heartbeat_sent();
    let last_heartbeat = until("the lost cluster's next heartbeat", || async {
        match heartbeat_sent() {
            Some(sent) if Some(sent) != before => Ok(sent),
            _ => Err("not yet".to_string()),
        }
    })
    .await?;
    lost.stop();
    let stopped = Instant::now();
    let toleration_over =
        last_heartbeat + Duration::from_secs(args.lease) + Duration::from_secs(args.toleration);
    let deadline = Instant::now() + Duration::from_secs(args.lease + args.toleration + 300);
    let done = loop {
        if let Some(done) = tracker.done(&keys) {
            break done;
        }
        if Instant::now() > deadline {
            let moved = tracker
                .lock()
                .values()
                .filter(|p| p.dispatched.is_some())
                .count();
            return Err(
                format!("only {moved} of {} moved off the lost cluster", keys.len()).into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let dispatched: Vec<Instant> = done.iter().filter_map(|p| p.dispatched).collect();
    let first = dispatched
        .iter()
        .min()
        .copied()
        .ok_or("nothing dispatched")?;
    let last = dispatched
        .iter()
        .max()
        .copied()
        .ok_or("nothing dispatched")?;
    let early = dispatched.iter().filter(|d| **d < toleration_over).count();
    let signed = |at: Instant| -> f64 {
        if at >= toleration_over {
            at.duration_since(toleration_over).as_secs_f64()
        } else {
            -toleration_over.duration_since(at).as_secs_f64()
        }
    };
    println!(
        "cluster loss: agent stopped {:.1} s after its last accepted heartbeat was sent; lease {} s + toleration {} s",
        stopped.duration_since(last_heartbeat).as_secs_f64(),
        args.lease,
        args.toleration
    );
    println!(
        "cluster loss: after the end of the toleration, first binding dispatched elsewhere at {:+.2} s, all {} at {:+.2} s ({:.0} bindings/s from first to last; {} dispatched before the end of the toleration); target all within 60 s; load average (1 min) {}",
        signed(first),
        dispatched.len(),
        signed(last),
        (dispatched.len().saturating_sub(1)) as f64
            / last.duration_since(first).as_secs_f64().max(f64::EPSILON),
        early,
        load_average()
    );
    println!(
        "cluster loss: from the agent stopped (the hub sees only silence), first binding dispatched elsewhere after {:.2} s, all {} after {:.2} s (lease {} s, heartbeat every {} s, toleration {} s)",
        first.saturating_duration_since(stopped).as_secs_f64(),
        dispatched.len(),
        last.saturating_duration_since(stopped).as_secs_f64(),
        args.lease,
        args.heartbeat,
        args.toleration
    );
    Ok(())
}

async fn bench(fleet: &Fleet, args: &Args) -> Result<(), BoxError> {
    let client = fleet.client("hub").await?;
    sim_agent::ensure_appwrapper_crd(&client).await?;
    let lease = Duration::from_secs(args.lease);
    let (url, registry) = start_hub(fleet, "failover-bench", |options| {
        options.agent_api.lease_duration = lease;
        options.agent_api.heartbeat_interval = Duration::from_secs(args.heartbeat);
        options.cluster_health.lease_duration = lease;
    })
    .await?;
    let endpoint = bootstrap(&client, &url).await?;
    support::ensure_namespace(&client, NAMESPACE).await?;
    let (handed_tx, handed_rx) = mpsc::unbounded_channel();
    let tracker = Arc::new(Tracker::default());
    let tasks = track(&client, tracker.clone(), handed_rx);
    let result = match args.mode {
        Mode::Decision => {
            apply_policy(
                &client,
                json!({"application": {
                    "decisionConditions": {"tolerationSeconds": 0},
                    "purgeMode": "Gracefully",
                    "gracePeriodSeconds": 3600,
                    "blockPredecessorSeconds": 3600
                }}),
            )
            .await?;
            let agents = spread(&client, args, &endpoint, &handed_tx).await?;
            println!(
                "hub in process on {url}; {} simulated clusters Ready",
                agents.len()
            );
            decision(&client, args, &agents, &tracker, &registry).await
        }
        Mode::ClusterLoss => {
            apply_policy(
                &client,
                json!({"cluster": {
                    "tolerationSeconds": args.toleration,
                    "purgeMode": "Gracefully"
                }}),
            )
            .await?;
            cluster_loss(&client, args, &endpoint, &handed_tx, &tracker).await
        }
    };
    for task in tasks {
        task.abort();
    }
    result
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
    println!(
        "profile: {}; load average (1 min) at start: {}",
        if cfg!(debug_assertions) {
            "dev (debug assertions on)"
        } else {
            "release"
        },
        load_average()
    );
    // No member runs an agent: the fleet has one member only because a fleet needs one.
    support::on_fleet("failover-bench", |fleet| async move {
        bench(&fleet, &args).await
    })
}
