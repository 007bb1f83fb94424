//! Failover end to end on the local fleet (issue 9's third figure, issue 20's clean-up,
//! `Directly` and lost-member rows): the real hub and one real agent per member in hub mode,
//! both in this process as in the failover suite (`tests/failover.rs`, whose helpers this bench
//! includes), on a fleet of a hub and 2 members (2 kwok nodes of 8 GPUs each).
//!
//! Application failover (default): policy `failover.application` {`decisionConditions.
//! tolerationSeconds: 0`, `purgeMode: Gracefully` (or `Directly` with `--purge directly`),
//! `gracePeriodSeconds: 1` with `Gracefully` (the smallest the CRD takes; the new copy does not
//! wait for it),
//! `blockPredecessorSeconds: 3600`}. Each run creates an AppWrapper on the hub (one Job, one pod
//! asking for 1 GPU; `retryLimit: 0` and `failureGracePeriodDuration: 0s`, so one infrastructure
//! failure is terminal) and waits until it is Running in the member it was placed in. The
//! fault: the node under its pod is made NotReady (`faults::set_node_ready`, so the failure is
//! classed Infrastructure) and the pod is failed (`faults::fail_pod`), the patches sent one
//! after the other; with `Directly` only the pod is failed (exit code 1, class Application,
//! moved by `moveOnApplicationFailure: true`): a pod deleted on a NotReady node is never
//! confirmed gone, rightly. Timed: from sending the first patch to the AppWrapper seen Running in the
//! other member (a watch of this process); from the pod seen Failed in the old member (watch)
//! when it was (the agent may act on the NotReady node first and delete the pod before it
//! fails); and when the old AppWrapper was seen deleted in the old member (watch): after the new
//! copy Running with `Gracefully` (clean-up), before it with `Directly` (the new copy only after
//! the old one is gone: a run where it is not fails the bench). The first run is the first
//! failover after the agents installed the AppWrapper CRD (issue 20: a foreground deletion then
//! waited for the member's garbage collector to discover the kind). Between runs the
//! AppWrapper is deleted on the hub and the node repaired.
//!
//! `--member-loss`: policy `failover.cluster` {`tolerationSeconds: 0`, `purgeMode: Gracefully`};
//! the fault is the kube-apiserver of the AppWrapper's member stopped. Timed: from the stop to
//! the AppWrapper seen Running in the other member. Then the apiserver is started again and the
//! run waits until the member is Ready on the hub and its old copy withdrawn.
//!
//!   cargo bench --profile dev -p lifeboat-agent --bench failover_e2e -- [--runs 5]
//!       [--purge gracefully|directly | --member-loss]

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::runtime::watcher;
use lifeboat_api::appwrapper::constants::APPWRAPPER_LABEL;
use lifeboat_e2e::fleet::{Fleet, FleetConfig, workspace_root};
use lifeboat_e2e::harness::TestContext;
use lifeboat_e2e::{faults, load_average, wait};
use serde_json::json;
use support::hub::{
    appwrapper_resource, binding_of, placement, start_hub, tempfile_dir, two_agents,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const NAMESPACE: &str = "failover-e2e-bench";
/// Longest wait for one move before the bench gives up.
const MOVE_TIMEOUT: Duration = Duration::from_secs(60);

/// What the watches saw, by (member, AppWrapper name): the first instant.
#[derive(Default)]
struct Seen {
    pod_failed: Mutex<HashMap<(String, String), Instant>>,
    running: Mutex<HashMap<(String, String), Instant>>,
    deleted: Mutex<HashMap<(String, String), Instant>>,
}

impl Seen {
    fn first(map: &Mutex<HashMap<(String, String), Instant>>, member: &str, name: &str) {
        map.lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((member.to_string(), name.to_string()))
            .or_insert_with(Instant::now);
    }

    fn get(
        map: &Mutex<HashMap<(String, String), Instant>>,
        member: &str,
        name: &str,
    ) -> Option<Instant> {
        map.lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(member.to_string(), name.to_string()))
            .copied()
    }
}

/// Watches the pods and AppWrappers of the bench's namespace in `member`.
fn watch_member(
    client: kube::Client,
    member: String,
    seen: Arc<Seen>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let appwrappers: Api<DynamicObject> =
        Api::namespaced_with(client, NAMESPACE, &appwrapper_resource());
    let (pod_member, pod_seen) = (member.clone(), seen.clone());
    let pod_watch = tokio::spawn(async move {
        let mut stream = std::pin::pin!(lifeboat_runtime::watch::backoff(watcher(
            pods,
            watcher::Config::default()
        )));
        loop {
            match stream.try_next().await {
                Ok(Some(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => {
                    let failed =
                        pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed");
                    if let (true, Some(aw)) = (
                        failed,
                        pod.metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get(APPWRAPPER_LABEL)),
                    ) {
                        Seen::first(&pod_seen.pod_failed, &pod_member, aw);
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => eprintln!("pod watch of {pod_member}: {e}; retrying"),
            }
        }
    });
    let aw_watch = tokio::spawn(async move {
        let mut stream = std::pin::pin!(lifeboat_runtime::watch::backoff(watcher(
            appwrappers,
            watcher::Config::default()
        )));
        loop {
            match stream.try_next().await {
                Ok(Some(watcher::Event::Apply(aw) | watcher::Event::InitApply(aw))) => {
                    if aw.data["status"]["phase"].as_str() == Some("Running")
                        && let Some(name) = &aw.metadata.name
                    {
                        Seen::first(&seen.running, &member, name);
                    }
                }
                Ok(Some(watcher::Event::Delete(aw))) => {
                    if let Some(name) = &aw.metadata.name {
                        Seen::first(&seen.deleted, &member, name);
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => eprintln!("AppWrapper watch of {member}: {e}; retrying"),
            }
        }
    });
    vec![pod_watch, aw_watch]
}

/// One move's figures: from the pod seen Failed, and from the fault's first patch.
struct Moved {
    from_pod_failed: Option<Duration>,
    from_patch: Duration,
    /// The old copy seen deleted, after (`Gracefully`) or before (`Directly`) the new one
    /// Running; signed milliseconds, new Running → old deleted.
    old_deleted_after_running_ms: f64,
    /// The pod seen Failed → the old copy seen deleted.
    old_deleted_from_pod_failed: Option<Duration>,
}

/// Which failover the bench drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Application { directly: bool },
    MemberLoss,
}

async fn one_run(
    ctx: &TestContext,
    hub: &kube::Client,
    seen: &Seen,
    run: usize,
    members: &[String; 2],
    directly: bool,
) -> Result<Moved, BoxError> {
    let name = format!("train-{run}");
    let appwrappers: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), NAMESPACE, &appwrapper_resource());
    let bindings: Api<lifeboat_api::binding::ResourceBinding> =
        Api::namespaced(hub.clone(), NAMESPACE);
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
    let other = if placed == members[0] {
        &members[1]
    } else {
        &members[0]
    };
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
    let member = ctx.client(&placed).await?;
    let (pods, nodes) = support::hub::live_pods_on_nodes(ctx, &placed, &name).await?;
    // The fault: the node under the pod goes NotReady and the pod fails, both patches sent at
    // once (support::hub::fail_pods takes a pod already gone as failed).
    let patched = Instant::now();
    // With `Directly` the node stays Ready: a pod being deleted on a NotReady node may still run
    // (no kubelet confirms it stopped), so its copy is rightly never reported gone.
    if !directly {
        for node in &nodes {
            faults::set_node_ready(&member, node, false).await?;
        }
    }
    support::hub::fail_pods(&member, NAMESPACE, &pods).await?;
    let running = wait::until(
        &format!("{name} Running in {other}"),
        MOVE_TIMEOUT,
        || async { Seen::get(&seen.running, other, &name).ok_or_else(|| "not yet".to_string()) },
    )
    .await?;
    let deleted = wait::until(
        &format!("the old {name} deleted in {placed}"),
        MOVE_TIMEOUT,
        || async { Seen::get(&seen.deleted, &placed, &name).ok_or_else(|| "not yet".to_string()) },
    )
    .await?;
    let pod_failed = Seen::get(&seen.pod_failed, &placed, &name);
    let signed_ms = |from: Instant, to: Instant| {
        if to >= from {
            (to - from).as_secs_f64() * 1000.0
        } else {
            -((from - to).as_secs_f64() * 1000.0)
        }
    };
    let moved = Moved {
        from_pod_failed: pod_failed.map(|f| running.saturating_duration_since(f)),
        from_patch: running.saturating_duration_since(patched),
        old_deleted_after_running_ms: signed_ms(running, deleted),
        old_deleted_from_pod_failed: pod_failed.map(|f| deleted.saturating_duration_since(f)),
    };
    println!(
        "run {run}: {name} {placed} → {other}: pod seen Failed → Running in {other} {}, fault injected → Running {:.0} ms, new Running → old deleted {:+.0} ms; load average (1 min) {}",
        moved
            .from_pod_failed
            .map(|d| format!("{:.0} ms", d.as_secs_f64() * 1000.0))
            .unwrap_or_else(|| "n/a (the pod was never seen Failed)".into()),
        moved.from_patch.as_secs_f64() * 1000.0,
        moved.old_deleted_after_running_ms,
        load_average()
    );
    if directly && deleted > running {
        return Err(format!(
            "Directly: {name} Running in {other} {:.0} ms before the old copy was deleted in {placed}",
            moved.old_deleted_after_running_ms
        )
        .into());
    }
    // Clean up for the next run: the AppWrapper gone (its GPU freed), the node Ready again.
    appwrappers.delete(&name, &DeleteParams::default()).await?;
    support::hub::repair_nodes(ctx, &placed, &nodes).await?;
    Ok(moved)
}

fn summary(label: &str, values: Vec<Duration>, target: &str) {
    summary_ms(
        label,
        values.iter().map(|d| d.as_secs_f64() * 1000.0).collect(),
        target,
    );
}

fn summary_ms(label: &str, mut values: Vec<f64>, target: &str) {
    values.sort_by(f64::total_cmp);
    if values.is_empty() {
        println!("{label}: no samples");
        return;
    }
    let listed: Vec<String> = values.iter().map(|v| format!("{v:.0}")).collect();
    println!(
        "{label}: p50 {:.0} ms, max {:.0} ms ({} runs: {} ms); target {target}",
        values[(values.len() - 1) / 2],
        values[values.len() - 1],
        values.len(),
        listed.join(", ")
    );
}

/// One lost member: its kube-apiserver stopped under the AppWrapper; returns the time from the
/// stop to the AppWrapper seen Running in the other member.
async fn member_loss_run(
    ctx: &TestContext,
    hub: &kube::Client,
    seen: &Seen,
    run: usize,
    members: &[String; 2],
) -> Result<Duration, BoxError> {
    let name = format!("serve-{run}");
    let appwrappers: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), NAMESPACE, &appwrapper_resource());
    let bindings: Api<lifeboat_api::binding::ResourceBinding> =
        Api::namespaced(hub.clone(), NAMESPACE);
    let mut serve = serde_json::to_value(support::appwrapper(
        &name,
        &[],
        vec![support::job(&format!("{name}-job"), "sleep infinity", 1, 1)],
    )?)?;
    serve["metadata"]["namespace"] = json!(NAMESPACE);
    appwrappers
        .create(&PostParams::default(), &serde_json::from_value(serve)?)
        .await?;
    let placed = wait::until(&format!("{name} placed"), support::T, || async {
        let b = binding_of(&bindings, &name).await?;
        match placement(&b).as_slice() {
            [one] => Ok(one.clone()),
            other => Err(format!("clusters {other:?}")),
        }
    })
    .await?;
    let other = if placed == members[0] {
        &members[1]
    } else {
        &members[0]
    };
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
    // The hub knows it Healthy there (else the move could be a placement, not a failover).
    wait::until(
        &format!("{name} Healthy on the hub"),
        support::T,
        || async {
            let b = binding_of(&bindings, &name).await?;
            match b.cluster_status(&placed) {
                Some(i) if i.health == lifeboat_api::binding::ResourceHealth::Healthy => Ok(()),
                other => Err(format!("{:?}", other.map(|i| i.health))),
            }
        },
    )
    .await?;
    let stopped = Instant::now();
    ctx.fleet.stop_apiserver(&placed)?;
    let running = wait::until(
        &format!("{name} Running in {other}"),
        MOVE_TIMEOUT,
        || async { Seen::get(&seen.running, other, &name).ok_or_else(|| "not yet".to_string()) },
    )
    .await;
    ctx.fleet.start_apiserver(&placed).await?;
    let moved = running?.saturating_duration_since(stopped);
    println!(
        "run {run}: {name} {placed} → {other}: kube-apiserver of {placed} stopped → Running in {other} {:.0} ms; load average (1 min) {}",
        moved.as_secs_f64() * 1000.0,
        load_average()
    );
    // Back as it was: the member Ready on the hub, the old copy withdrawn, the AppWrapper gone.
    let clusters: Api<lifeboat_api::cluster::Cluster> = Api::all(hub.clone());
    wait::until(&format!("{placed} Ready again"), support::T, || async {
        let c = clusters.get(&placed).await.map_err(|e| e.to_string())?;
        let ready = c
            .status
            .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready"));
        match ready {
            Some(c) if c.status == "True" => Ok(()),
            other => Err(format!("{:?}", other.map(|c| (c.status, c.reason)))),
        }
    })
    .await?;
    let old: Api<DynamicObject> = Api::namespaced_with(
        ctx.client(&placed).await?,
        NAMESPACE,
        &appwrapper_resource(),
    );
    wait::until(
        &format!("the old {name} withdrawn from {placed}"),
        support::T,
        || async {
            match old.get_opt(&name).await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_string()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await?;
    appwrappers.delete(&name, &DeleteParams::default()).await?;
    Ok(moved)
}

async fn bench(fleet: Arc<Fleet>, runs: usize, mode: Mode) -> Result<(), BoxError> {
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
    let failover = match mode {
        // (`gracePeriodSeconds` is refused with `Directly`.)
        Mode::Application { directly: true } => json!({"application": {
            "decisionConditions": {"tolerationSeconds": 0},
            "purgeMode": "Directly",
            "moveOnApplicationFailure": true,
            "blockPredecessorSeconds": 3600
        }}),
        Mode::Application { directly: false } => json!({"application": {
            "decisionConditions": {"tolerationSeconds": 0},
            "purgeMode": "Gracefully",
            "gracePeriodSeconds": 1,
            "blockPredecessorSeconds": 3600
        }}),
        Mode::MemberLoss => json!({"cluster": {"tolerationSeconds": 0, "purgeMode": "Gracefully"}}),
    };
    lifeboat_e2e::fleet::lifeboat::apply_propagation_policy(
        &hub,
        NAMESPACE,
        "failover",
        json!({
            "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper"}],
            "failover": failover,
        }),
    )
    .await?;
    let seen = Arc::new(Seen::default());
    let mut watches = Vec::new();
    for member in &members {
        watches.extend(watch_member(
            ctx.client(member).await?,
            member.clone(),
            seen.clone(),
        ));
    }
    let mut from_pod = Vec::new();
    let mut from_patch = Vec::new();
    let mut cleanup = Vec::new();
    let mut gone_from_pod = Vec::new();
    let mut lost = Vec::new();
    let mut result = Ok(());
    for run in 1..=runs {
        let outcome = match mode {
            Mode::Application { directly } => one_run(&ctx, &hub, &seen, run, &members, directly)
                .await
                .map(|moved| {
                    from_pod.extend(moved.from_pod_failed);
                    from_patch.push(moved.from_patch);
                    cleanup.push(moved.old_deleted_after_running_ms);
                    gone_from_pod.extend(moved.old_deleted_from_pod_failed);
                }),
            Mode::MemberLoss => member_loss_run(&ctx, &hub, &seen, run, &members)
                .await
                .map(|moved| lost.push(moved)),
        };
        if let Err(e) = outcome {
            result = Err(e);
            break;
        }
    }
    for watch in watches {
        watch.abort();
    }
    result?;
    match mode {
        Mode::Application { directly } => {
            let running_target = if directly {
                "p50 ≤ 400 ms (issue 20)"
            } else {
                "< 5 s"
            };
            summary(
                "pod seen Failed → AppWrapper seen Running in the other member",
                from_pod,
                running_target,
            );
            summary(
                "fault injected (first patch sent) → AppWrapper seen Running in the other member",
                from_patch,
                "-",
            );
            if directly {
                summary(
                    "pod seen Failed → old AppWrapper seen deleted",
                    gone_from_pod,
                    "-",
                );
                summary_ms(
                    "old AppWrapper seen deleted → new one seen Running (never negative)",
                    cleanup.iter().map(|v| -v).collect(),
                    "≥ 0",
                );
            } else {
                summary_ms(
                    "new AppWrapper seen Running → old one seen deleted (clean-up)",
                    cleanup,
                    "≤ 500 ms every run (issue 20)",
                );
            }
        }
        Mode::MemberLoss => summary(
            "member kube-apiserver stopped → AppWrapper seen Running in the other member",
            lost,
            "< 5 s (issue 20)",
        ),
    }
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let mut runs = 5;
    let mut mode = Mode::Application { directly: false };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--runs" => {
                runs = it
                    .next()
                    .and_then(|v| v.parse::<usize>().ok())
                    .filter(|n| *n > 0)
                    .ok_or("--runs needs a positive number")?;
            }
            "--purge" => {
                mode = match it.next().as_deref() {
                    Some("gracefully" | "Gracefully") => Mode::Application { directly: false },
                    Some("directly" | "Directly") => Mode::Application { directly: true },
                    other => {
                        return Err(
                            format!("--purge: {other:?} is not gracefully or directly").into()
                        );
                    }
                }
            }
            "--member-loss" => mode = Mode::MemberLoss,
            _ => {}
        }
    }
    println!("mode: {mode:?}");
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
    let result = rt.block_on(bench(fleet.clone(), runs, mode));
    // The hub and agents stop with the runtime, before the fleet they talk to goes away.
    rt.shutdown_timeout(Duration::from_secs(5));
    fleet.teardown();
    result
}
