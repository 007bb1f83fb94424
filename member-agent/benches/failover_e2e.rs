//! Failover end to end on the local fleet (issue 9's third figure, issue 20's table and latency
//! budget): the real hub and one real agent per member in hub mode, both in this process as in
//! the failover suite (`tests/failover.rs`, whose helpers this bench includes), on a fleet of a
//! hub and 2 members (2 kwok nodes of 8 GPUs each).
//!
//! Each run creates an AppWrapper on the hub (one Job, one pod asking for 1 GPU; `retryLimit: 0`
//! and `failureGracePeriodDuration: 0s`, so one infrastructure failure is terminal), waits until
//! it is Running in the member it was placed in, injects the mode's fault and times the move.
//! Between runs the AppWrapper is deleted on the hub and the fault repaired. The modes are the
//! rows of issue 20's table, each with its own PropagationPolicy (`blockPredecessorSeconds:
//! 3600` throughout):
//!
//! - `failed`: application failover `tolerationSeconds: 0`, `purgeMode: Gracefully`,
//!   `gracePeriodSeconds: 1`. The fault: the node under the pod is made NotReady
//!   (`faults::set_node_ready`, so the failure is classed Infrastructure) and the pod is failed
//!   (`faults::fail_pod`), the patches sent one after the other. Timed: the pod seen Failed in
//!   the old member (a watch of this process) → the AppWrapper seen Running in the other.
//! - `toleration`: the same with `tolerationSeconds: 1`.
//! - `cleanup`: the same fault, `gracePeriodSeconds: 600` (so the new copy's health, not the
//!   grace, ends the eviction). Timed: the pod seen Failed → the old copy seen deleted in the old
//!   member; also the new copy seen Running → the old copy seen deleted.
//! - `directly`: `purgeMode: Directly` (the new copy only after the old is gone). Timed as
//!   `failed`.
//! - `apiserver`: cluster failover `tolerationSeconds: 0`, `purgeMode: Gracefully`. The fault:
//!   the placed member's kube-apiserver is stopped (`Fleet::stop_apiserver`). Timed: from the
//!   stop → the AppWrapper seen Running in the other member. The apiserver is started again
//!   after each run.
//!
//! Latency budget (every mode but `apiserver`): the agents and the hub emit an event per stage of
//! the failover (`lifeboat_api::stages`, target `lifeboat::failover`); a layer of this process
//! records when each was emitted, and the watches of this process add Kubernetes' stages in the
//! member the workload moves to (its pod created, scheduled, Running; the AppWrapper Running).
//! Per stage the bench prints p50/p99 of the time since the previous stage and since the agent
//! saw the pod Failed, and whose the stage is. Before the runs, the floor of Kubernetes' share
//! on this fleet is measured: a bare Job of one pod created in a member, to its pod created
//! (Job controller), scheduled (kube-scheduler) and Running (kwok).
//!
//!   cargo bench --profile dev -p lifeboat-agent --bench failover_e2e -- [--runs 5]
//!       [--mode failed|toleration|cleanup|directly|apiserver|all] [--floor 10]

#[path = "../../e2e/tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams, PropagationPolicy};
use kube::runtime::watcher;
use lifeboat_api::appwrapper::constants::APPWRAPPER_LABEL;
use lifeboat_api::cluster::Cluster;
use lifeboat_api::stages;
use lifeboat_e2e::fleet::{Fleet, FleetConfig, workspace_root};
use lifeboat_e2e::harness::TestContext;
use lifeboat_e2e::{faults, load_average, wait};
use serde_json::{Value, json};
use support::hub::{
    appwrapper_resource, binding_of, placement, start_hub, tempfile_dir, two_agents,
};
use tracing_subscriber::layer::SubscriberExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const NAMESPACE: &str = "failover-e2e-bench";
/// Longest wait for one move before the bench gives up.
const MOVE_TIMEOUT: Duration = Duration::from_secs(90);

/// A row of issue 20's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Failed,
    Toleration,
    Cleanup,
    Directly,
    Apiserver,
}

impl Mode {
    const ALL: [Mode; 5] = [
        Mode::Failed,
        Mode::Toleration,
        Mode::Cleanup,
        Mode::Directly,
        Mode::Apiserver,
    ];

    fn parse(s: &str) -> Option<Vec<Mode>> {
        Some(match s {
            "failed" => vec![Mode::Failed],
            "toleration" => vec![Mode::Toleration],
            "cleanup" => vec![Mode::Cleanup],
            "directly" => vec![Mode::Directly],
            "apiserver" => vec![Mode::Apiserver],
            "all" => Mode::ALL.to_vec(),
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Failed => "failed",
            Mode::Toleration => "toleration",
            Mode::Cleanup => "cleanup",
            Mode::Directly => "directly",
            Mode::Apiserver => "apiserver",
        }
    }

    /// The row's figure, as this bench times it.
    fn row(self) -> &'static str {
        match self {
            Mode::Failed => "pod seen Failed → Running in the other member, toleration 0",
            Mode::Toleration => "pod seen Failed → Running in the other member, toleration 1 s",
            Mode::Cleanup => "pod seen Failed → old copy seen deleted (Gracefully)",
            Mode::Directly => "pod seen Failed → Running in the other member, purgeMode Directly",
            Mode::Apiserver => {
                "member kube-apiserver stopped → Running in the other member, cluster toleration 0"
            }
        }
    }

    /// Karmada's figure for the row in issue 20 (the comparison; not run here).
    fn karmada(self) -> &'static str {
        match self {
            Mode::Failed => "0.67 s (0.89)",
            Mode::Toleration => "1.57 s (1.74)",
            Mode::Cleanup => "1.19 s (1.43)",
            Mode::Directly => "0.68 s (1.25)",
            Mode::Apiserver => "26.6 s (27.1)",
        }
    }

    fn policy(self) -> Value {
        let application = |toleration: i32, purge: &str, grace: Option<i32>| {
            let mut app = json!({
                "decisionConditions": {"tolerationSeconds": toleration},
                "purgeMode": purge,
                "blockPredecessorSeconds": 3600
            });
            if let Some(grace) = grace {
                app["gracePeriodSeconds"] = json!(grace);
            }
            json!({"application": app})
        };
        let failover = match self {
            Mode::Failed => application(0, "Gracefully", Some(1)),
            Mode::Toleration => application(1, "Gracefully", Some(1)),
            Mode::Cleanup => application(0, "Gracefully", Some(600)),
            Mode::Directly => application(0, "Directly", None),
            Mode::Apiserver => {
                json!({"cluster": {"tolerationSeconds": 0, "purgeMode": "Gracefully"}})
            }
        };
        json!({
            "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper"}],
            "failover": failover
        })
    }
}

type Instants = Mutex<HashMap<(String, String), Instant>>;

/// What the watches saw, by (member, AppWrapper name): the first instant.
#[derive(Default)]
struct Seen {
    pod_failed: Instants,
    pod_created: Instants,
    pod_scheduled: Instants,
    pod_running: Instants,
    running: Instants,
    gone: Instants,
}

impl Seen {
    fn first(map: &Instants, member: &str, name: &str) {
        map.lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((member.to_string(), name.to_string()))
            .or_insert_with(Instant::now);
    }

    fn get(map: &Instants, member: &str, name: &str) -> Option<Instant> {
        map.lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(member.to_string(), name.to_string()))
            .copied()
    }
}

/// Runs a watch until aborted, feeding `on_event` every event; errors are retried by the
/// watcher (the first of a run of errors is printed: a stopped apiserver makes many).
fn spawn_watch<K: Send + 'static>(
    stream: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    what: String,
    mut on_event: impl FnMut(watcher::Event<K>) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut failing = false;
        loop {
            match stream.try_next().await {
                Ok(Some(event)) => {
                    failing = false;
                    on_event(event);
                }
                Ok(None) => break,
                Err(e) => {
                    if !failing {
                        eprintln!("{what}: {e}; retrying");
                    }
                    failing = true;
                }
            }
        }
    })
}

/// Watches the pods and AppWrappers of `namespace` in `member`.
fn watch_member(
    client: kube::Client,
    member: String,
    namespace: &str,
    seen: Arc<Seen>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let appwrappers: Api<DynamicObject> =
        Api::namespaced_with(client, namespace, &appwrapper_resource());
    let (pod_member, pod_seen) = (member.clone(), seen.clone());
    let pods = watcher(pods, watcher::Config::default());
    let appwrappers = watcher(appwrappers, watcher::Config::default());
    let pod_watch = spawn_watch(pods, format!("pod watch of {member}"), move |event| {
        let (watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) = event else {
            return;
        };
        // Pods of an AppWrapper carry its label; the floor's bare Jobs' pods their Job's name.
        let labels = pod.metadata.labels.as_ref();
        let Some(owner) = labels
            .and_then(|l| l.get(APPWRAPPER_LABEL).or_else(|| l.get("job-name")))
            .cloned()
        else {
            return;
        };
        let m = &pod_member;
        Seen::first(&pod_seen.pod_created, m, &owner);
        if pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some()
        {
            Seen::first(&pod_seen.pod_scheduled, m, &owner);
        }
        match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Failed") => Seen::first(&pod_seen.pod_failed, m, &owner),
            Some("Running") => Seen::first(&pod_seen.pod_running, m, &owner),
            _ => {}
        }
    });
    let aw_watch = spawn_watch(
        appwrappers,
        format!("AppWrapper watch of {member}"),
        move |event| match event {
            watcher::Event::Apply(aw) | watcher::Event::InitApply(aw) => {
                if aw.data["status"]["phase"].as_str() == Some("Running")
                    && let Some(name) = &aw.metadata.name
                {
                    Seen::first(&seen.running, &member, name);
                }
            }
            watcher::Event::Delete(aw) => {
                if let Some(name) = &aw.metadata.name {
                    Seen::first(&seen.gone, &member, name);
                }
            }
            _ => {}
        },
    );
    vec![pod_watch, aw_watch]
}

/// One stage event of the agents or the hub, as this process's layer saw it.
#[derive(Debug, Clone)]
struct StageEvent {
    at: Instant,
    stage: String,
    cluster: String,
    /// The object's fields (`namespace`, `appwrapper`, `work`) joined.
    object: String,
}

/// Records the stage events (target `lifeboat::failover`) of the hub and agents in this process.
#[derive(Clone, Default)]
struct StageLayer {
    events: Arc<Mutex<Vec<StageEvent>>>,
}

#[derive(Default)]
struct StageVisitor {
    stage: String,
    cluster: String,
    object: String,
}

impl tracing::field::Visit for StageVisitor {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.record_debug(field, &value as &dyn std::fmt::Debug);
        if field.name() == "stage" {
            self.stage = value.to_string();
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "stage" => {}
            "cluster" => self.cluster = format!("{value:?}"),
            "namespace" | "appwrapper" | "work" => {
                self.object.push_str(&format!("{value:?} "));
            }
            _ => {}
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for StageLayer {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if event.metadata().target() != stages::TARGET {
            return;
        }
        let mut visitor = StageVisitor::default();
        event.record(&mut visitor);
        // `%` fields arrive through `record_debug` as their Display text, strings quoted.
        let unquote = |s: &str| s.trim_matches('"').to_string();
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(StageEvent {
                at: Instant::now(),
                stage: visitor.stage,
                cluster: unquote(&visitor.cluster),
                object: visitor.object,
            });
    }
}

impl StageLayer {
    /// The first `stage` event at or after `since` about `name` (in `cluster` when given).
    fn first(
        &self,
        stage: &str,
        name: &str,
        cluster: Option<&str>,
        since: Instant,
    ) -> Option<Instant> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|e| e.at >= since && e.stage == stage && e.object.contains(name))
            .filter(|e| cluster.is_none_or(|c| e.cluster == c))
            .map(|e| e.at)
            .min()
    }
}

/// Whose time a stage is (ending at it, from the previous one).
#[derive(Clone, Copy)]
enum Owner {
    Lifeboat,
    Kubernetes,
    Both,
}

impl Owner {
    fn label(self) -> &'static str {
        match self {
            Owner::Lifeboat => "Lifeboat",
            Owner::Kubernetes => "Kubernetes",
            Owner::Both => "both",
        }
    }
}

/// The stages of one move, in order: name, whose time the step to it is, and when it happened.
type Budget = Vec<(&'static str, Owner, Option<Instant>)>;

/// One move's figures.
struct Moved {
    /// The row's figure.
    row: Duration,
    /// The new copy Running → the old copy gone (`cleanup`).
    running_to_gone: Option<Duration>,
    budget: Option<Budget>,
}

struct Bench {
    ctx: TestContext,
    hub: kube::Client,
    seen: Arc<Seen>,
    stages: StageLayer,
    members: [String; 2],
}

impl Bench {
    async fn one_run(&self, mode: Mode, run: usize) -> Result<Moved, BoxError> {
        let name = format!("{}-{run:03}", mode.name());
        let appwrappers: Api<DynamicObject> =
            Api::namespaced_with(self.hub.clone(), NAMESPACE, &appwrapper_resource());
        let bindings: Api<lifeboat_api::binding::ResourceBinding> =
            Api::namespaced(self.hub.clone(), NAMESPACE);
        let mut train = serde_json::to_value(support::appwrapper(
            &name,
            &[("retryLimit", "0"), ("failureGracePeriodDuration", "0s")],
            vec![support::job(&format!("{name}-job"), "sleep 3600", 1, 1)],
        )?)?;
        train["metadata"]["namespace"] = json!(NAMESPACE);
        appwrappers
            .create(&PostParams::default(), &serde_json::from_value(train)?)
            .await?;
        let placed = wait::until(&format!("{name} placed"), support::T, || async {
            let b = binding_of(&bindings, &name).await?;
            match placement(&b).as_slice() {
                [one] => Ok(one.clone()),
                other => Err(format!("clusters {other:?}")),
            }
        })
        .await?;
        let other = if placed == self.members[0] {
            self.members[1].clone()
        } else {
            self.members[0].clone()
        };
        let seen = &self.seen;
        wait::until(
            &format!("{name} Running in {placed}"),
            support::T,
            || async {
                Seen::get(&seen.running, &placed, &name)
                    .map(|_| ())
                    .ok_or_else(|| "not yet".to_string())
            },
        )
        .await?;
        let member = self.ctx.client(&placed).await?;
        let (pods, nodes) = support::hub::live_pods_on_nodes(&self.ctx, &placed, &name).await?;
        let fault = Instant::now();
        if mode == Mode::Apiserver {
            self.ctx.fleet.stop_apiserver(&placed)?;
        } else {
            // The node under the pod goes NotReady and the pod fails, both patches sent at once
            // (support::hub::fail_pods takes a pod already gone as failed).
            for node in &nodes {
                faults::set_node_ready(&member, node, false).await?;
            }
            support::hub::fail_pods(&member, NAMESPACE, &pods).await?;
        }
        let moved = async {
            let running = wait::until(
                &format!("{name} Running in {other}"),
                MOVE_TIMEOUT,
                || async {
                    Seen::get(&seen.running, &other, &name).ok_or_else(|| "not yet".to_string())
                },
            )
            .await?;
            let pod_failed = Seen::get(&seen.pod_failed, &placed, &name);
            let start = match mode {
                Mode::Apiserver => fault,
                // The agent may act on the NotReady node first and delete the pod before it
                // fails: then the fault's first patch is the start.
                _ => pod_failed.unwrap_or(fault),
            };
            let mut moved = Moved {
                row: running.saturating_duration_since(start),
                running_to_gone: None,
                budget: None,
            };
            if mode == Mode::Cleanup {
                let gone = wait::until(
                    &format!("{name}'s old copy gone from {placed}"),
                    MOVE_TIMEOUT,
                    || async {
                        Seen::get(&seen.gone, &placed, &name).ok_or_else(|| "not yet".to_string())
                    },
                )
                .await?;
                moved.row = gone.saturating_duration_since(start);
                moved.running_to_gone = Some(gone.saturating_duration_since(running));
            }
            if mode != Mode::Apiserver {
                // The AppWrapper is Running once its Job exists: its pod may still be starting.
                wait::until(
                    &format!("{name}'s pod Running in {other}"),
                    MOVE_TIMEOUT,
                    || async {
                        Seen::get(&seen.pod_running, &other, &name)
                            .ok_or_else(|| "not yet".to_string())
                    },
                )
                .await?;
                moved.budget = Some(self.budget(&name, &placed, &other, fault, running));
            }
            println!(
                "  run {run}: {name} {placed} → {other}: {:.0} ms{}{}; load average (1 min) {}",
                moved.row.as_secs_f64() * 1000.0,
                moved
                    .running_to_gone
                    .map(|d| format!(
                        " (new copy Running → old copy gone {:.0} ms)",
                        d.as_secs_f64() * 1000.0
                    ))
                    .unwrap_or_default(),
                if pod_failed.is_none() && mode != Mode::Apiserver {
                    " (timed from the fault: the pod was never seen Failed)"
                } else {
                    ""
                },
                load_average()
            );
            Ok::<_, BoxError>(moved)
        }
        .await;
        // Clean up for the next run, whatever happened: the fault repaired, the AppWrapper gone
        // (its GPU freed).
        if mode == Mode::Apiserver {
            self.ctx.fleet.start_apiserver(&placed).await?;
            until_cluster_ready(&self.hub, &placed).await?;
        }
        appwrappers.delete(&name, &DeleteParams::default()).await?;
        if mode != Mode::Apiserver {
            support::hub::repair_nodes(&self.ctx, &placed, &nodes).await?;
        }
        for m in [&placed, &other] {
            let api: Api<DynamicObject> =
                support::hub::member_api(&self.ctx, m, &appwrapper_resource()).await?;
            wait::until(&format!("{name} gone from {m}"), MOVE_TIMEOUT, || async {
                match api.get_opt(&name).await {
                    Ok(None) => Ok(()),
                    Ok(Some(_)) => Err("still there".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            })
            .await?;
        }
        moved
    }

    /// The stages of the move of `name` from `old` to `new` after `fault`. Each stage of the
    /// agents and the hub is the first event of its kind at or after the stage before it (the
    /// chain of cause and effect: an earlier report, e.g. of the NotReady node, is not the one
    /// that carried the failure). The AppWrapper is Running in `new` (at `running`) once its
    /// agent created the Job, so its pod's stages may come after.
    fn budget(&self, name: &str, old: &str, new: &str, fault: Instant, running: Instant) -> Budget {
        let chain = [
            (stages::POD_FAILED_SEEN, old),
            (stages::APPWRAPPER_FAILED_WRITTEN, old),
            (stages::REPORT_SENT, old),
            (stages::REPORT_RECEIVED, old),
            (stages::HEALTH_DECIDED, old),
            (stages::EVICTION_WRITTEN, old),
            (stages::WORK_DISPATCHED, new),
            (stages::WORK_RECEIVED, new),
            (stages::OBJECT_APPLIED, new),
        ];
        let mut budget: Budget = Vec::new();
        let mut since = fault;
        for (stage, cluster) in chain {
            let at = self.stages.first(stage, name, Some(cluster), since);
            since = at.unwrap_or(since);
            budget.push((stage, Owner::Lifeboat, at));
        }
        let seen = &self.seen;
        budget.extend([
            ("AppWrapper Running (seen)", Owner::Lifeboat, Some(running)),
            // The new agent's reconcile creates the Job, the Job controller its pod.
            (
                "pod created (seen)",
                Owner::Both,
                Seen::get(&seen.pod_created, new, name),
            ),
            (
                "pod scheduled (seen)",
                Owner::Kubernetes,
                Seen::get(&seen.pod_scheduled, new, name),
            ),
            (
                "pod Running (seen)",
                Owner::Kubernetes,
                Seen::get(&seen.pod_running, new, name),
            ),
        ]);
        budget
    }
}

/// Waits until the Cluster `member` is Ready on the hub.
async fn until_cluster_ready(hub: &kube::Client, member: &str) -> Result<(), BoxError> {
    let clusters: Api<Cluster> = Api::all(hub.clone());
    wait::until(
        &format!("{member} Ready on the hub"),
        MOVE_TIMEOUT,
        || async {
            let c = clusters.get(member).await.map_err(|e| e.to_string())?;
            if support::hub::ready(&c) {
                Ok(())
            } else {
                Err("not Ready".to_string())
            }
        },
    )
    .await?;
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// p50 and p99 (nearest rank) of `values`, sorted in place.
fn p50_p99(values: &mut [f64]) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    let at =
        |p: f64| values[((values.len() as f64 * p).ceil() as usize).clamp(1, values.len()) - 1];
    (at(0.5), at(0.99))
}

fn summary(mode: Mode, moves: &[Moved]) {
    let mut rows: Vec<Duration> = moves.iter().map(|m| m.row).collect();
    rows.sort();
    if let (Some(p50), Some(max)) = (rows.get((rows.len().max(1) - 1) / 2), rows.last()) {
        println!(
            "{}: {}: p50 {:.0} ms, max {:.0} ms ({} runs); Karmada in issue 20: {}",
            mode.name(),
            mode.row(),
            ms(*p50),
            ms(*max),
            rows.len(),
            mode.karmada()
        );
    }
    let mut gone: Vec<Duration> = moves.iter().filter_map(|m| m.running_to_gone).collect();
    gone.sort();
    if let (Some(p50), Some(max)) = (gone.get((gone.len().max(1) - 1) / 2), gone.last()) {
        println!(
            "{}: new copy seen Running → old copy seen deleted: p50 {:.0} ms, max {:.0} ms (target ≤ 500 ms after the new copy is Healthy)",
            mode.name(),
            ms(*p50),
            ms(*max)
        );
    }
    let budgets: Vec<&Budget> = moves.iter().filter_map(|m| m.budget.as_ref()).collect();
    let Some(first) = budgets.first() else {
        return;
    };
    println!(
        "{}: latency budget over {} runs (ms; step: since the previous stage seen; total: since the agent saw the pod Failed):",
        mode.name(),
        budgets.len()
    );
    println!(
        "  {:<28} {:>10} {:>10} {:>10} {:>10} {:>6}  whose",
        "stage", "step p50", "step p99", "total p50", "total p99", "runs"
    );
    for (i, (stage, owner, _)) in first.iter().enumerate() {
        let mut steps = Vec::new();
        let mut totals = Vec::new();
        for budget in &budgets {
            let Some(at) = budget[i].2 else { continue };
            if let Some(start) = budget[0].2 {
                totals.push(signed_ms(start, at));
            }
            if let Some(prev) = budget[..i].iter().rev().find_map(|s| s.2) {
                steps.push(signed_ms(prev, at));
            }
        }
        let fmt = |v: &mut Vec<f64>| {
            if v.is_empty() {
                ("-".to_string(), "-".to_string())
            } else {
                let (a, b) = p50_p99(v);
                (format!("{a:.0}"), format!("{b:.0}"))
            }
        };
        let (s50, s99) = fmt(&mut steps);
        let (t50, t99) = fmt(&mut totals);
        println!(
            "  {stage:<28} {s50:>10} {s99:>10} {t50:>10} {t99:>10} {:>6}  {}",
            totals.len().max(steps.len()),
            owner.label()
        );
    }
}

/// `later - earlier` in ms, negative when `later` came first.
fn signed_ms(earlier: Instant, later: Instant) -> f64 {
    match later.checked_duration_since(earlier) {
        Some(d) => ms(d),
        None => -ms(earlier.duration_since(later)),
    }
}

/// Kubernetes' share on this fleet, without Lifeboat: `n` bare Jobs of one pod (the same pod as
/// the AppWrappers') created in `member` one after the other, each timed from the create request
/// to its pod seen created, scheduled and Running.
async fn floor(ctx: &TestContext, seen: &Seen, member: &str, n: usize) -> Result<(), BoxError> {
    let jobs: Api<Job> = Api::namespaced(ctx.client(member).await?, NAMESPACE);
    let mut created = Vec::new();
    let mut scheduled = Vec::new();
    let mut running = Vec::new();
    for i in 0..n {
        let name = format!("floor-{i:03}");
        let job: Job = serde_json::from_value(support::job(&name, "sleep 3600", 1, 1))?;
        let t0 = Instant::now();
        jobs.create(&PostParams::default(), &job).await?;
        let r = wait::until(&format!("{name}'s pod Running"), support::T, || async {
            Seen::get(&seen.pod_running, member, &name).ok_or_else(|| "not yet".to_string())
        })
        .await?;
        let since = |map: &Instants| Seen::get(map, member, &name).map(|at| signed_ms(t0, at));
        created.extend(since(&seen.pod_created));
        scheduled.extend(since(&seen.pod_scheduled));
        running.push(signed_ms(t0, r));
        let background = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        jobs.delete(&name, &background).await?;
    }
    for (what, values) in [
        ("pod created (Job controller)", &mut created),
        ("pod scheduled (kube-scheduler)", &mut scheduled),
        ("pod Running (kwok)", &mut running),
    ] {
        if values.is_empty() {
            continue;
        }
        let (p50, p99) = p50_p99(values);
        println!(
            "Kubernetes floor in {member}, a bare Job created → {what}: p50 {p50:.0} ms, p99 {p99:.0} ms ({} Jobs)",
            values.len()
        );
    }
    Ok(())
}

async fn bench(fleet: Arc<Fleet>, stage_layer: StageLayer, args: &Args) -> Result<(), BoxError> {
    let ctx = TestContext::new(fleet.clone(), NAMESPACE);
    let dir = tempfile_dir(NAMESPACE)?;
    let hub = ctx.client("hub").await?;
    lifeboat_agent::install::ensure_crd(&hub).await?;
    let hub_url = start_hub(&ctx).await?;
    let names = fleet.member_names();
    let [first, second] = names.as_slice() else {
        return Err("the fleet needs two members".into());
    };
    let members = [first.clone(), second.clone()];
    let _agents = two_agents(&ctx, &hub, &hub_url, &dir, [first, second]).await?;
    let seen = Arc::new(Seen::default());
    let mut watches = Vec::new();
    for member in &members {
        watches.extend(watch_member(
            ctx.client(member).await?,
            member.clone(),
            NAMESPACE,
            seen.clone(),
        ));
    }
    let bench = Bench {
        ctx,
        hub,
        seen,
        stages: stage_layer,
        members,
    };
    let result = async {
        if args.floor > 0 {
            floor(&bench.ctx, &bench.seen, &bench.members[0], args.floor).await?;
        }
        let mut all = Vec::new();
        for &mode in &args.modes {
            lifeboat_e2e::fleet::lifeboat::apply_propagation_policy(
                &bench.hub,
                NAMESPACE,
                "failover",
                mode.policy(),
            )
            .await?;
            // The binder reads policies from its cache: let it see the new one.
            tokio::time::sleep(Duration::from_secs(1)).await;
            println!("mode {}: {}", mode.name(), mode.row());
            let mut moves = Vec::new();
            for run in 1..=args.runs {
                moves.push(bench.one_run(mode, run).await?);
            }
            summary(mode, &moves);
            all.push((mode, moves));
        }
        if all.len() > 1 {
            println!("summary (p50 and max per row):");
            for (mode, moves) in &all {
                summary_line(*mode, moves);
            }
        }
        Ok::<(), BoxError>(())
    }
    .await;
    for watch in watches {
        watch.abort();
    }
    result
}

fn summary_line(mode: Mode, moves: &[Moved]) {
    let mut rows: Vec<Duration> = moves.iter().map(|m| m.row).collect();
    rows.sort();
    if let (Some(p50), Some(max)) = (rows.get((rows.len().max(1) - 1) / 2), rows.last()) {
        println!(
            "  | {} | {:.2} s ({:.2}) | Karmada {} |",
            mode.row(),
            p50.as_secs_f64(),
            max.as_secs_f64(),
            mode.karmada()
        );
    }
}

struct Args {
    runs: usize,
    modes: Vec<Mode>,
    floor: usize,
}

fn args() -> Result<Args, BoxError> {
    let mut args = Args {
        runs: 5,
        modes: vec![Mode::Failed],
        floor: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--runs" => {
                args.runs = it
                    .next()
                    .and_then(|v| v.parse::<usize>().ok())
                    .filter(|n| *n > 0)
                    .ok_or("--runs needs a positive number")?;
            }
            "--floor" => {
                args.floor = it
                    .next()
                    .and_then(|v| v.parse::<usize>().ok())
                    .ok_or("--floor needs a number of Jobs")?;
            }
            "--mode" => {
                args.modes = it.next().as_deref().and_then(Mode::parse).ok_or(
                    "--mode needs one of failed, toleration, cleanup, directly, apiserver, all",
                )?;
            }
            // cargo bench passes --bench.
            _ => {}
        }
    }
    Ok(args)
}

fn main() -> Result<(), BoxError> {
    let args = args()?;
    // The stage events only (the hub's and agents' other logs stay off, as before).
    let stage_layer = StageLayer::default();
    let filter = tracing_subscriber::filter::Targets::new()
        .with_target(stages::TARGET, tracing::Level::DEBUG);
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(
        tracing_subscriber::Layer::with_filter(stage_layer.clone(), filter),
    ))?;
    println!(
        "profile: {}; load average (1 min) at start: {}",
        if cfg!(debug_assertions) {
            "dev (debug assertions on)"
        } else {
            "release"
        },
        load_average()
    );
    let rt = tokio::runtime::Runtime::new()?;
    let mut config =
        FleetConfig::new(workspace_root().join("target/e2e-fleets/failover-e2e-bench"));
    config.members = 2;
    config.nodes_per_member = 2;
    config.gpus_per_node = 8;
    let started = Instant::now();
    let fleet = Arc::new(rt.block_on(Fleet::up(config))?);
    println!(
        "fleet: hub + 2 members, 2 nodes of 8 GPUs each, ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let result = rt.block_on(bench(fleet.clone(), stage_layer, &args));
    // The hub and agents stop with the runtime, before the fleet they talk to goes away.
    rt.shutdown_timeout(Duration::from_secs(5));
    fleet.teardown();
    result
}
