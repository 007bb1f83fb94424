//! Lifeboat as real processes on the local fleet (`Fleet::up` with Lifeboat: two `lifeboat-hub`
//! replicas with leader election, a `lifeboat-agent` per member in hub mode), broken the way
//! production breaks: SIGKILL of an agent, a restart of the hub, SIGKILL of every hub in the
//! middle of a failover, SIGKILL of the leading hub.
//! The tests run one at a time, in order, on one fleet (hub + 2 members).
//!
//! Needs the binaries: `cargo build -p lifeboat-hub -p lifeboat-agent` (`make e2e` does it).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::ApiResource;
use lifeboat_api::binding::{EVICTION_APPLICATION_FAILURE, ResourceBinding};
use lifeboat_api::cluster::{Cluster, HUB_SYSTEM_NAMESPACE};
use lifeboat_e2e::fleet::lifeboat::{
    HUB_LEASE, apply_propagation_policy, appwrapper_resource, cluster_ready, has_unreachable_taint,
    place_training, training_appwrapper, until_appwrapper_running,
};
use lifeboat_e2e::fleet::{LifeboatConfig, LifeboatProcess};
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestError, TestResult};
use lifeboat_e2e::wait;
use serde_json::json;

/// The hub's `--cluster-lease-seconds` in this suite.
const CLUSTER_LEASE: Duration = Duration::from_secs(10);
/// The hub's own leader Lease (lifeboat-hub's default, 15 s).
const HUB_LEADER_LEASE: Duration = Duration::from_secs(15);
/// Slack on top of the cluster lease: the health monitor's period (1 s) and API round trips on
/// a 2-core machine shared with other work.
const SLACK: Duration = Duration::from_secs(5);
/// Slack on top of the hub's Lease: the standby starts counting the lease when it first sees the
/// last renewal and looks again every retry period (2 s, up to 1.2× with jitter): up to two
/// periods late, plus API round trips.
const HANDOVER_SLACK: Duration = Duration::from_secs(8);
/// Everything else (placements, restarts).
const T: Duration = Duration::from_secs(120);

fn main() -> ExitCode {
    harness::run_serial(
        "lifeboat",
        |c| {
            c.members = 2;
            c.nodes_per_member = 2;
            c.gpus_per_node = 8;
            c.lifeboat = Some(LifeboatConfig {
                hubs: 2,
                cluster_lease_seconds: CLUSTER_LEASE.as_secs(),
                heartbeat_seconds: 2,
                agent_replicas: 1,
                bin_dir: None,
            });
        },
        vec![
            E2eTest::new(
                "a_killed_agent_leaves_its_cluster_unknown_and_tainted_then_ready_with_one_copy",
                killed_agent,
            ),
            E2eTest::new(
                "a_hub_restart_keeps_every_binding_and_placement",
                hub_restart,
            ),
            E2eTest::new(
                "a_hub_killed_mid_failover_recovers_with_one_copy_one_eviction_and_its_history",
                killed_mid_failover,
            ),
            E2eTest::new(
                "killing_the_leading_hub_hands_over_within_its_lease",
                leader_killed,
            ),
        ],
    )
}

fn appwrappers() -> ApiResource {
    appwrapper_resource()
}

/// A one-pod GPU training AppWrapper that runs until deleted.
fn training(name: &str, namespace: &str) -> Result<DynamicObject, TestError> {
    Ok(training_appwrapper(name, namespace)?)
}

/// Applies a PropagationPolicy pinning `name` to `member` and the AppWrapper to the hub; waits
/// until it runs there. Returns the member's copy.
async fn place(ctx: &TestContext, name: &str, member: &str) -> Result<DynamicObject, TestError> {
    let ns = ctx.namespace("hub").await?;
    let hub = ctx.client("hub").await?;
    place_training(&hub, &ns, name, member).await?;
    until_running(ctx, name, member, T).await
}

/// Waits until the AppWrapper runs in `member`; returns it.
async fn until_running(
    ctx: &TestContext,
    name: &str,
    member: &str,
    timeout: Duration,
) -> Result<DynamicObject, TestError> {
    let in_member: Api<DynamicObject> =
        Api::namespaced_with(ctx.client(member).await?, &ctx.namespace, &appwrappers());
    Ok(until_appwrapper_running(&in_member, name, member, timeout).await?)
}

/// The copies of an AppWrapper in each member (name → uid).
async fn copies(ctx: &TestContext, name: &str) -> Result<BTreeMap<String, String>, TestError> {
    let mut out = BTreeMap::new();
    for member in ctx.fleet.member_names() {
        let api: Api<DynamicObject> =
            Api::namespaced_with(ctx.client(&member).await?, &ctx.namespace, &appwrappers());
        if let Some(aw) = api.get_opt(name).await? {
            out.insert(member, aw.metadata.uid.unwrap_or_default());
        }
    }
    Ok(out)
}

/// The clusters of every binding in the test's namespace (by the template's name).
async fn placements(
    ctx: &TestContext,
) -> Result<BTreeMap<String, (String, Vec<String>)>, TestError> {
    let bindings: Api<ResourceBinding> = Api::namespaced(ctx.client("hub").await?, &ctx.namespace);
    Ok(bindings
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|b| {
            (
                b.spec.resource.name.clone(),
                (
                    b.metadata.uid.clone().unwrap_or_default(),
                    b.spec.clusters.iter().map(|c| c.name.clone()).collect(),
                ),
            )
        })
        .collect())
}

/// uid, generation and resourceVersion of an object.
fn identity(aw: &DynamicObject) -> (String, i64, String) {
    (
        aw.metadata.uid.clone().unwrap_or_default(),
        aw.metadata.generation.unwrap_or_default(),
        aw.metadata.resource_version.clone().unwrap_or_default(),
    )
}

/// The member's AppWrapper once its resourceVersion held for 3 s.
async fn settled(
    ctx: &TestContext,
    name: &str,
    member: &str,
) -> Result<(String, i64, String), TestError> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client(member).await?, &ctx.namespace, &appwrappers());
    let mut last = identity(&api.get(name).await?);
    let mut since = Instant::now();
    let deadline = Instant::now() + T;
    while since.elapsed() < Duration::from_secs(3) {
        if Instant::now() > deadline {
            return Err(format!("{name} in {member} kept changing: {last:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = identity(&api.get(name).await?);
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    Ok(last)
}

async fn cluster(ctx: &TestContext, name: &str) -> Result<Cluster, TestError> {
    let clusters: Api<Cluster> = Api::all(ctx.client("hub").await?);
    Ok(clusters.get(name).await?)
}

/// Waits until the Cluster's Ready condition is `ready` and it has (or lacks) the unreachable
/// taint; returns it.
async fn until_cluster(
    ctx: &TestContext,
    name: &str,
    ready: &str,
    tainted: bool,
    timeout: Duration,
) -> Result<Cluster, TestError> {
    let what = format!("Cluster {name} Ready={ready}, unreachable taint {tainted}");
    Ok(wait::until(&what, timeout, || async {
        let c = cluster(ctx, name).await.map_err(|e| e.to_string())?;
        if ready_status(&c) == ready && has_unreachable_taint(&c) == tainted {
            Ok(c)
        } else {
            Err(format!(
                "Ready={}, taints {:?}",
                ready_status(&c),
                c.spec.taints
            ))
        }
    })
    .await?)
}

fn ready_status(c: &Cluster) -> String {
    cluster_ready(c).map(|(s, _)| s).unwrap_or_default()
}

async fn leader(ctx: &TestContext) -> Result<Option<String>, TestError> {
    let leases: Api<Lease> = Api::namespaced(ctx.client("hub").await?, HUB_SYSTEM_NAMESPACE);
    Ok(leases
        .get_opt(HUB_LEASE)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

fn hub_process(identity: &str) -> Result<LifeboatProcess, TestError> {
    identity
        .strip_prefix("lifeboat-hub-")
        .and_then(|i| i.parse().ok())
        .map(LifeboatProcess::Hub)
        .ok_or_else(|| format!("the hub Lease names {identity}, no hub of the fleet").into())
}

async fn killed_agent(ctx: Arc<TestContext>) -> TestResult {
    let members = ctx.fleet.member_names();
    let (victim, other) = (members[0].clone(), members[1].clone());
    let before = place(&ctx, "survivor", &victim).await?;
    let uid = before.metadata.uid.clone().unwrap_or_default();

    ctx.fleet.kill_lifeboat(&LifeboatProcess::agent(&victim))?;
    let killed = Instant::now();
    let c = until_cluster(&ctx, &victim, "Unknown", true, CLUSTER_LEASE + SLACK).await?;
    eprintln!(
        "{victim}: Unknown and tainted {:.1}s after its agent was killed (lease {}s)",
        killed.elapsed().as_secs_f64(),
        CLUSTER_LEASE.as_secs()
    );
    assert!(c.metadata.name.as_deref() == Some(victim.as_str()));
    let healthy = cluster(&ctx, &other).await?;
    assert_eq!(ready_status(&healthy), "True", "{other} is not affected");
    assert!(!has_unreachable_taint(&healthy));

    ctx.fleet
        .restart_lifeboat(&LifeboatProcess::agent(&victim))
        .await?;
    until_cluster(&ctx, &victim, "True", false, T).await?;
    // The restarted agent re-syncs with the hub: give it time to (wrongly) re-create anything.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = until_running(&ctx, "survivor", &victim, T).await?;
    assert_eq!(
        after.metadata.uid.as_deref(),
        Some(uid.as_str()),
        "the AppWrapper in {victim} was re-created"
    );
    assert_eq!(
        copies(&ctx, "survivor").await?,
        BTreeMap::from([(victim.clone(), uid)]),
        "one copy, in {victim} only"
    );
    let pods: Api<Pod> = Api::namespaced(ctx.client(&victim).await?, &ctx.namespace);
    let running = pods
        .list(&ListParams::default().labels("workload.codeflare.dev/appwrapper=survivor"))
        .await?
        .items;
    assert_eq!(running.len(), 1, "one trainer pod: {running:?}");
    Ok(())
}

async fn hub_restart(ctx: Arc<TestContext>) -> TestResult {
    let members = ctx.fleet.member_names();
    let kept = [
        ("kept-a", members[0].clone()),
        ("kept-b", members[1].clone()),
    ];
    for (name, member) in &kept {
        place(&ctx, name, member).await?;
    }
    // Both settled (the agents' status writes after Running are done), then what they are.
    let mut member_objects = BTreeMap::new();
    for (name, member) in &kept {
        member_objects.insert(
            name.to_string(),
            (member.clone(), settled(&ctx, name, member).await?),
        );
    }
    let bindings_before = placements(&ctx).await?;
    assert_eq!(bindings_before.len(), 2, "{bindings_before:?}");

    // Every hub replica goes: no hub at all for a moment, then both start again.
    let hubs: Vec<LifeboatProcess> = ctx
        .fleet
        .lifeboat_processes()
        .into_iter()
        .filter(|p| matches!(p, LifeboatProcess::Hub(_)))
        .collect();
    for hub in &hubs {
        ctx.fleet.stop_lifeboat(hub)?;
    }
    for hub in &hubs {
        ctx.fleet.restart_lifeboat(hub).await?;
    }
    ctx.fleet.until_lifeboat_ready(T).await?;
    // The restarted hub acts: a template applied now is placed (its first pass over the old
    // ones is done before it opens the work streams).
    place(&ctx, "after-restart", &members[1]).await?;

    let bindings_after = placements(&ctx).await?;
    for (name, before) in &bindings_before {
        assert_eq!(
            bindings_after.get(name),
            Some(before),
            "binding of {name}: uid and clusters kept"
        );
    }
    for (name, (member, before)) in &member_objects {
        let api: Api<DynamicObject> =
            Api::namespaced_with(ctx.client(member).await?, &ctx.namespace, &appwrappers());
        let aw = api.get(name).await?;
        assert_eq!(
            &identity(&aw),
            before,
            "{name} in {member}: the same object (uid, generation, resourceVersion), not written again"
        );
        assert_eq!(
            copies(&ctx, name).await?.keys().collect::<Vec<_>>(),
            vec![member],
            "{name}: one copy"
        );
    }
    Ok(())
}

/// The binding of the AppWrapper `name` in the test's namespace.
async fn binding_of(ctx: &TestContext, name: &str) -> Result<ResourceBinding, String> {
    let bindings: Api<ResourceBinding> = Api::namespaced(
        ctx.client("hub").await.map_err(|e| e.to_string())?,
        &ctx.namespace,
    );
    lifeboat_e2e::fleet::lifeboat::binding_of(&bindings, name).await
}

/// Scenario 7 of the failover issue: every hub is SIGKILLed right after it wrote an eviction
/// and started again. The policy's purge mode is Never, so the failover is still in progress at
/// the kill, whatever the timing: its eviction task keeps the old copy until a human confirms.
/// The new leader recovers (waits for the agents' full state) before it decides anything; it
/// neither evicts again nor purges the old copy by itself; once the purge is confirmed the
/// workload runs once, in the other member, the binding holds exactly one eviction, and the
/// ledger's timeline has that eviction (backfilled from the binding if the kill lost it) and
/// everything recorded before the kill.
async fn killed_mid_failover(ctx: Arc<TestContext>) -> TestResult {
    let members = ctx.fleet.member_names();
    let ns = ctx.namespace("hub").await?;
    let hub = ctx.client("hub").await?;
    let name = "moving";
    apply_propagation_policy(
        &hub,
        &ns,
        name,
        json!({
            "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": name}],
            "placement": {"clusterAffinity": {"clusterNames": members}},
            "failover": {"application": {
                "decisionConditions": {"tolerationSeconds": 0},
                "purgeMode": "Never"
            }}
        }),
    )
    .await?;
    // No retries and no failure grace: the first failure is final in its member.
    let mut template = training(name, &ns)?;
    template.metadata.annotations = Some(
        [
            ("workload.codeflare.dev.appwrapper/retryLimit", "0"),
            (
                "workload.codeflare.dev.appwrapper/failureGracePeriodDuration",
                "0s",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    let on_hub: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &ns, &appwrappers());
    on_hub.create(&PostParams::default(), &template).await?;
    let placed = wait::until(&format!("{name} placed"), T, || async {
        match lifeboat_e2e::fleet::lifeboat::placement(&binding_of(&ctx, name).await?).as_slice() {
            [one] => Ok(one.clone()),
            other => Err(format!("clusters {other:?}")),
        }
    })
    .await?;
    let other = members
        .iter()
        .find(|m| **m != placed)
        .cloned()
        .ok_or("no other member")?;
    until_running(&ctx, name, &placed, T).await?;

    // Its pod fails on a NotReady node: a final Infrastructure failure in `placed`.
    let member = ctx.client(&placed).await?;
    let pods: Api<Pod> = Api::namespaced(member.clone(), &ns);
    let selector = format!("workload.codeflare.dev/appwrapper={name}");
    let running = pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    let nodes: Vec<String> = running
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    if nodes.is_empty() {
        return Err(format!("no pod of {name} on a node in {placed}").into());
    }
    for node in &nodes {
        lifeboat_e2e::faults::set_node_ready(&member, node, false).await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for pod in &running {
        let pod = pod.metadata.name.clone().unwrap_or_default();
        match lifeboat_e2e::faults::fail_pod(&member, &ns, &pod, 1).await {
            Ok(()) => {}
            // The agent may have failed the AppWrapper for the NotReady node first (its pods go).
            Err(e) if e.to_string().contains("NotFound") => {}
            Err(e) => return Err(e.into()),
        }
    }
    // The moment the eviction is written, every hub dies.
    let evicted = wait::until("the eviction written", T, || async {
        let b = binding_of(&ctx, name).await?;
        if b.spec
            .eviction_history
            .iter()
            .any(|r| r.cluster_name == placed)
        {
            Ok(b)
        } else {
            Err(format!(
                "clusters {:?}, no eviction yet",
                lifeboat_e2e::fleet::lifeboat::placement(&b)
            ))
        }
    })
    .await?;
    let hubs: Vec<LifeboatProcess> = ctx
        .fleet
        .lifeboat_processes()
        .into_iter()
        .filter(|p| matches!(p, LifeboatProcess::Hub(_)))
        .collect();
    for process in &hubs {
        ctx.fleet.kill_lifeboat(process)?;
    }
    let task_of = |b: &ResourceBinding| {
        b.spec
            .graceful_eviction_tasks
            .iter()
            .any(|t| t.from_cluster == placed)
    };
    assert!(
        task_of(&evicted),
        "the failover is in progress at the kill: {:?}",
        evicted.spec.graceful_eviction_tasks
    );
    for node in &nodes {
        lifeboat_e2e::faults::set_node_ready(&member, node, true).await?;
    }
    for process in &hubs {
        ctx.fleet.restart_lifeboat(process).await?;
    }
    ctx.fleet.until_lifeboat_ready(T).await?;

    // The new leader finishes the failover as written: Running in the other member, the old
    // copy kept (Never), one eviction.
    let moved = until_running(&ctx, name, &other, T).await?;
    let kept = binding_of(&ctx, name).await?;
    assert!(
        task_of(&kept),
        "the old copy's task is kept until confirmed"
    );
    assert_eq!(
        kept.spec.eviction_history.len(),
        1,
        "{:?}",
        kept.spec.eviction_history
    );
    assert!(
        copies(&ctx, name).await?.contains_key(&placed),
        "the old copy in {placed} stays until the purge is confirmed"
    );
    // The purge is confirmed (what `lifeboatctl confirm-purge` writes): the old copy goes.
    let bindings: Api<ResourceBinding> = Api::namespaced(hub.clone(), &ns);
    bindings
        .patch(
            kept.metadata.name.as_deref().unwrap_or_default(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {
                lifeboat_api::binding::ANNOTATION_CONFIRM_PURGE: placed
            }}})),
        )
        .await?;
    let done = wait::until("the eviction task done, the old copy gone", T, || async {
        let b = binding_of(&ctx, name).await?;
        let copies = copies(&ctx, name).await.map_err(|e| e.to_string())?;
        if lifeboat_e2e::fleet::lifeboat::placement(&b) == [other.clone()]
            && b.spec.graceful_eviction_tasks.is_empty()
            && copies.keys().collect::<Vec<_>>() == [&other]
        {
            Ok(b)
        } else {
            Err(format!(
                "clusters {:?}, tasks {:?}, copies {copies:?}",
                lifeboat_e2e::fleet::lifeboat::placement(&b),
                b.spec.graceful_eviction_tasks
            ))
        }
    })
    .await?;
    let evictions: Vec<_> = done
        .spec
        .eviction_history
        .iter()
        .map(|r| (&r.cluster_name, &r.reason))
        .collect();
    assert_eq!(
        evictions,
        [(&placed, &EVICTION_APPLICATION_FAILURE.to_string())],
        "exactly one eviction, from {placed}"
    );
    // One copy, the same object as soon as it ran (never created twice).
    let (uid, _, _) = settled(&ctx, name, &other).await?;
    assert_eq!(
        Some(uid.as_str()),
        moved.metadata.uid.as_deref(),
        "{name} in {other} was created again"
    );

    // The ledger's timeline: the eviction exactly once, the placements and dispatches from
    // before the kill still there.
    let ledger_file = ctx
        .fleet
        .kubeconfig("hub")?
        .parent()
        .ok_or("the hub's state folder")?
        .join("lifeboat-ledger.db");
    let ledger =
        lifeboat_ledger::Ledger::connect(&format!("sqlite://{}", ledger_file.display())).await?;
    let binding_name = done.metadata.name.clone().unwrap_or_default();
    let history = wait::until("the eviction in the ledger", T, || async {
        let history = ledger
            .history_of_binding(&ns, &binding_name, 10_000)
            .await
            .map_err(|e| e.to_string())?;
        let evictions = history
            .iter()
            .filter(|r| r.event.kind == lifeboat_ledger::EventKind::Eviction)
            .count();
        if evictions >= 1 {
            Ok(history)
        } else {
            Err(format!("{} events, no eviction yet", history.len()))
        }
    })
    .await?;
    let of = |kind: lifeboat_ledger::EventKind, cluster: &str| {
        history
            .iter()
            .filter(|r| r.event.kind == kind && r.event.cluster.as_deref() == Some(cluster))
            .count()
    };
    use lifeboat_ledger::EventKind::{Dispatch, Eviction, Placement};
    assert_eq!(
        of(Eviction, &placed),
        1,
        "one eviction from {placed}: {history:#?}"
    );
    assert_eq!(of(Eviction, &other), 0, "no eviction from {other}");
    assert!(
        of(Placement, &placed) >= 1,
        "the first placement on {placed} is kept"
    );
    assert!(
        of(Dispatch, &placed) >= 1,
        "the dispatch to {placed} is kept"
    );
    assert!(of(Dispatch, &other) >= 1, "the dispatch to {other}");
    ledger.close().await;
    Ok(())
}

async fn leader_killed(ctx: Arc<TestContext>) -> TestResult {
    let members = ctx.fleet.member_names();
    let old = wait::until("a hub leads", T, || async {
        leader(&ctx)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "no holder".to_string())
    })
    .await?;
    let old_process = hub_process(&old)?;
    let heartbeat_before = cluster(&ctx, &members[0])
        .await?
        .status
        .and_then(|s| s.last_heartbeat_time);

    ctx.fleet.kill_lifeboat(&old_process)?;
    let killed = Instant::now();
    let new = wait::until(
        "the standby takes the hub's Lease",
        HUB_LEADER_LEASE + HANDOVER_SLACK,
        || async {
            match leader(&ctx).await.map_err(|e| e.to_string())? {
                Some(h) if h != old => Ok(h),
                other => Err(format!("holder {other:?}")),
            }
        },
    )
    .await?;
    eprintln!(
        "{new} leads {:.1}s after {old} was killed (Lease {}s)",
        killed.elapsed().as_secs_f64(),
        HUB_LEADER_LEASE.as_secs()
    );

    // A template applied after the kill is placed by the new leader and runs.
    place(&ctx, "after-handover", &members[0]).await?;
    // The agents follow the new leader: their heartbeats reach it, the Clusters stay Ready.
    for member in &members {
        wait::until(
            &format!("{member} heartbeats to the new leader"),
            T,
            || async {
                let c = cluster(&ctx, member).await.map_err(|e| e.to_string())?;
                let beat = c
                    .status
                    .as_ref()
                    .and_then(|s| s.last_heartbeat_time.clone());
                let fresh = match (&heartbeat_before, &beat) {
                    (Some(before), Some(now)) => now.0 > before.0,
                    (None, Some(_)) => true,
                    _ => false,
                };
                if ready_status(&c) == "True" && fresh {
                    Ok(())
                } else {
                    Err(format!(
                        "Ready={}, last heartbeat {beat:?}",
                        ready_status(&c)
                    ))
                }
            },
        )
        .await?;
    }

    // The killed replica comes back as the standby (its agent API answers 503 NotLeader; not
    // asserted here: kube's client retries 503 answers for minutes).
    ctx.fleet.restart_lifeboat(&old_process).await?;
    ctx.fleet.until_lifeboat_ready(T).await?;
    assert_eq!(leader(&ctx).await?.as_deref(), Some(new.as_str()));
    Ok(())
}
