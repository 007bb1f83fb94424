//! Failover scenarios of issue 9 that take whole clusters away, on the local fleet (hub + 3
//! members of 2 GPU nodes), with the real hub and one agent per member in hub mode, in this
//! process: every GPU node of a member reclaimed (spot), and a member's kube-apiserver stopped.
//!
//! The tests share one hub (a hub binds the fleet's hub cluster) and run one after the other:
//! each breaks members the other would use. Each puts the fleet back as it found it (nodes,
//! apiserver) before it returns.

mod support;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::SignedDuration;
use kube::api::{Api, DeleteParams, PostParams};
use lifeboat_api::binding::{
    EVICTION_APPLICATION_FAILURE, EVICTION_CLUSTER_DELETED, EVICTION_CLUSTER_FAILURE,
    EvictionRecord, ResourceBinding, ResourceHealth,
};
use lifeboat_api::cluster::Cluster;
use lifeboat_api::health::FailureClass;
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestError, TestResult};
use lifeboat_e2e::{faults, nodes, wait};
use serde_json::json;
use support::T;
use support::scenario::{FleetHub, Scenario, describe_item, placement, start_fleet_hub};

/// Scenario 4's `blockPredecessorSeconds`: far longer than the test.
const BLOCK: i64 = 600;
/// Scenario 4's reclamation notice.
const NOTICE: Duration = Duration::from_secs(10);
/// Scenario 5's cluster toleration.
const CLUSTER_TOLERATION: i64 = 5;
const GPU: &str = "nvidia.com/gpu";

fn main() -> ExitCode {
    harness::run_serial(
        "cluster_scenarios",
        |c| {
            c.members = 3;
            c.nodes_per_member = 2;
            c.gpus_per_node = 8;
        },
        vec![
            E2eTest::new(
                "spot_reclamation_of_a_whole_cluster_moves_the_workload_and_blocks_the_cluster",
                spot_reclamation,
            ),
            E2eTest::new(
                "a_stopped_member_apiserver_is_a_cluster_failure",
                member_apiserver_stopped,
            ),
            E2eTest::new(
                "a_stopped_member_apiserver_moves_its_workload_in_seconds_at_toleration_0",
                member_apiserver_stopped_toleration_0,
            ),
            E2eTest::new(
                "after_a_member_apiserver_restart_new_work_runs_there_promptly",
                member_apiserver_restarted,
            ),
            E2eTest::new(
                "a_cluster_deleted_on_the_hub_moves_its_work_and_stops_its_agent_until_it_rejoins",
                cluster_deleted_on_the_hub,
            ),
        ],
    )
}

static HUB: tokio::sync::OnceCell<FleetHub> = tokio::sync::OnceCell::const_new();

/// The agents run with the default `--member-api-timeout` (how long a stopped member
/// apiserver goes unreported), as deployed.
async fn shared(ctx: &TestContext) -> Result<&'static FleetHub, TestError> {
    HUB.get_or_try_init(|| start_fleet_hub(ctx, |_| {}, |_| {}))
        .await
}

fn members(ctx: &TestContext) -> Result<[String; 3], TestError> {
    ctx.fleet
        .member_names()
        .try_into()
        .map_err(|m| format!("the suite needs 3 members, has {m:?}").into())
}

/// A Pod in `member` that holds `gpus` GPUs while the test runs.
async fn filler(ctx: &TestContext, member: &str, gpus: u32) -> Result<(), TestError> {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "filler"},
        "spec": {"containers": [{
            "name": "main", "image": "busybox", "command": ["sh", "-c", "sleep infinity"],
            "resources": {"limits": {GPU: gpus.to_string(), "cpu": "100m"}}}]}
    }))?;
    let ns = ctx.namespace(member).await?;
    Api::<Pod>::namespaced(ctx.client(member).await?, &ns)
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

async fn remove_filler(ctx: &TestContext, member: &str) -> Result<(), TestError> {
    match Api::<Pod>::namespaced(ctx.client(member).await?, &ctx.namespace)
        .delete("filler", &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The GPUs the hub's Cluster status says are (allocatable, allocated) in `member`.
async fn gpus_on_hub(hub: &kube::Client, member: &str) -> Result<(String, String), String> {
    let cluster = Api::<Cluster>::all(hub.clone())
        .get(member)
        .await
        .map_err(|e| e.to_string())?;
    let summary = cluster
        .status
        .and_then(|s| s.resource_summary)
        .unwrap_or_default();
    let get = |list: &std::collections::BTreeMap<String, lifeboat_api::cluster::Quantity>| {
        list.get(GPU)
            .map(|q| q.0.clone())
            .unwrap_or_else(|| "0".into())
    };
    Ok((get(&summary.allocatable), get(&summary.allocated)))
}

async fn until_gpus_on_hub(
    hub: &kube::Client,
    member: &str,
    allocatable: &str,
    allocated: &str,
) -> Result<(), TestError> {
    let want = (allocatable.to_string(), allocated.to_string());
    wait::until(
        &format!("{member}'s GPUs (allocatable, allocated) {want:?} on the hub"),
        T,
        || async {
            let seen = gpus_on_hub(hub, member).await?;
            if seen == want {
                Ok(())
            } else {
                Err(format!("{seen:?}"))
            }
        },
    )
    .await?;
    Ok(())
}

/// Reclaims every node in `names` of `member` at once (notice, then the node goes).
fn reclaim_all(
    client: &kube::Client,
    names: &[String],
) -> Vec<tokio::task::JoinHandle<lifeboat_e2e::Result<()>>> {
    names
        .iter()
        .map(|node| {
            let client = client.clone();
            let node = node.clone();
            tokio::spawn(async move { faults::reclaim_spot_node(&client, &node, NOTICE).await })
        })
        .collect()
}

async fn joined(
    tasks: Vec<tokio::task::JoinHandle<lifeboat_e2e::Result<()>>>,
) -> Result<(), TestError> {
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// New GPU nodes `<member>-gpu-<index>` (capacity back after a reclamation).
async fn add_nodes(
    ctx: &TestContext,
    member: &str,
    indexes: std::ops::Range<usize>,
) -> Result<(), TestError> {
    let index = ctx.fleet.cluster(member)?.member_index();
    let api: Api<Node> = Api::all(ctx.client(member).await?);
    for i in indexes {
        let node = nodes::kwok_node(member, index, i, nodes::NodeShape::gpu_node(8));
        match api.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn record_for<'a>(b: &'a ResourceBinding, cluster: &str) -> Result<&'a EvictionRecord, TestError> {
    b.spec
        .eviction_history
        .iter()
        .find(|r| r.cluster_name == cluster)
        .ok_or_else(|| format!("no eviction record for {cluster}").into())
}

/// The record of a reclamation: class Infrastructure, the spot notice named, blocked for
/// exactly `blockPredecessorSeconds`.
fn check_reclamation_record(record: &EvictionRecord) -> Result<(), TestError> {
    let blocked_until = record
        .evicted_at
        .0
        .checked_add(SignedDuration::from_secs(BLOCK))?;
    if record.reason != EVICTION_APPLICATION_FAILURE
        || record.failure_class != Some(FailureClass::Infrastructure)
        || !record
            .message
            .as_deref()
            .is_some_and(|m| m.contains("SpotReclamation"))
        || record.expires_at.as_ref().map(|t| t.0) != Some(blocked_until)
    {
        return Err(format!("eviction record {record:?}").into());
    }
    Ok(())
}

/// Scenario 4: every GPU node of cluster A is reclaimed (spot). The AppWrapper's pods are on
/// nodes with a reclamation notice and A has no other room, so the hub moves it to B at once
/// (toleration 0) and blocks A for `blockPredecessorSeconds` (600: the eviction record expires
/// exactly then). A gets new nodes (capacity back, more free GPUs than C), then B's nodes are
/// reclaimed too: the workload goes to C, never to A while A is blocked.
///
/// Where it goes is made deterministic by free capacity (the scheduler prefers the most free
/// GPUs): pods holding 2 GPUs in B and 4 in C make A the first choice, B the second, and after
/// A's new nodes A would again be preferred over C if its block were not respected.
async fn spot_reclamation(ctx: Arc<TestContext>) -> TestResult {
    shared(&ctx).await?;
    let [a, b, c] = members(&ctx)?;
    let s = Scenario::new(
        ctx.clone(),
        json!({"application": {
            "decisionConditions": {"tolerationSeconds": 0},
            "purgeMode": "Gracefully",
            "blockPredecessorSeconds": BLOCK
        }}),
    )
    .await?;
    filler(&ctx, &b, 2).await?;
    filler(&ctx, &c, 4).await?;
    let a_client = ctx.client(&a).await?;
    let b_client = ctx.client(&b).await?;
    let mut reclaiming = Vec::new();
    let result = async {
        until_gpus_on_hub(&s.hub, &b, "16", "2").await?;
        until_gpus_on_hub(&s.hub, &c, "16", "4").await?;
        let job = support::job("spotty-job", "sleep infinity", 1, 4);
        let aw = support::appwrapper(
            "spotty",
            // A long pause: the copy stays Resetting (Unhealthy, SpotReclamation) until the hub
            // has seen A's inventory without the reclaimed nodes.
            &[("retryPausePeriodDuration", "60s")],
            vec![job],
        )?;
        s.create(&aw).await?;
        let placed = s.placed("spotty").await?;
        if placed != a {
            return Err(format!("placed on {placed}, expected {a} (the most free GPUs)").into());
        }
        support::until_ready(&s.in_member(&a).await?, "spotty").await?;
        s.until_health("spotty", &a, ResourceHealth::Healthy, None)
            .await?;

        let a_nodes: Vec<String> = (0..2).map(|i| nodes::node_name(&a, i)).collect();
        reclaiming.extend(reclaim_all(&a_client, &a_nodes));
        let moved = s
            .until_binding("spotty", &format!("spotty moved to {b}"), T, |binding| {
                if placement(binding) == [b.clone()] {
                    Ok(())
                } else {
                    Err(format!(
                        "clusters {:?}, {}",
                        placement(binding),
                        describe_item(binding.cluster_status(&a))
                    ))
                }
            })
            .await?;
        let from_a = record_for(&moved, &a)?.clone();
        check_reclamation_record(&from_a)?;
        support::until_ready(&s.in_member(&b).await?, "spotty").await?;
        s.until_health("spotty", &b, ResourceHealth::Healthy, None)
            .await?;
        joined(std::mem::take(&mut reclaiming)).await?;

        // A gets capacity again: more free GPUs than C.
        add_nodes(&ctx, &a, 2..4).await?;
        until_gpus_on_hub(&s.hub, &a, "16", "0").await?;

        let b_nodes: Vec<String> = (0..2).map(|i| nodes::node_name(&b, i)).collect();
        reclaiming.extend(reclaim_all(&b_client, &b_nodes));
        let moved = s
            .until_binding("spotty", &format!("spotty moved to {c}"), T, |binding| {
                match placement(binding).as_slice() {
                    [only] if *only == c => Ok(()),
                    // Placed on A: no need to wait longer (refused below).
                    clusters if clusters.contains(&a) => Ok(()),
                    clusters => Err(format!(
                        "clusters {clusters:?}, {}",
                        describe_item(binding.cluster_status(&b))
                    )),
                }
            })
            .await?;
        if placement(&moved) != [c.clone()] {
            return Err(format!(
                "placed on {:?} while {a} is blocked until {:?}",
                placement(&moved),
                from_a.expires_at
            )
            .into());
        }
        let from_b = record_for(&moved, &b)?;
        check_reclamation_record(from_b)?;
        if record_for(&moved, &a)? != &from_a {
            return Err("A's eviction record changed".into());
        }
        support::until_ready(&s.in_member(&c).await?, "spotty").await?;
        Ok::<(), TestError>(())
    }
    .await;
    // Put the fleet back: B's capacity, no fillers.
    let cleanup = async {
        joined(reclaiming).await?;
        add_nodes(&ctx, &b, 2..4).await?;
        remove_filler(&ctx, &b).await?;
        remove_filler(&ctx, &c).await?;
        Ok::<(), TestError>(())
    }
    .await;
    result.and(cleanup)
}

/// The Ready condition of a Cluster on the hub: status, reason, last transition.
async fn ready_condition(
    hub: &kube::Client,
    member: &str,
) -> Result<Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>, String> {
    let cluster = Api::<Cluster>::all(hub.clone())
        .get(member)
        .await
        .map_err(|e| e.to_string())?;
    Ok(cluster
        .status
        .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready")))
}

/// Scenario 5: member A's kube-apiserver stops. Its agent (leader election off, as the fleet
/// runs it) still reaches the hub, but not its member: once the member's apiserver has not
/// answered for the agent's bound, its heartbeats say so and the hub marks the Cluster
/// `Ready=False` (`MemberAPIUnreachable`). After `failover.cluster.tolerationSeconds` from that
/// transition (not before) the binding moves off A (`ClusterFailure`) and the AppWrapper runs
/// elsewhere. A's apiserver starts again: A is Ready again and its old copy is withdrawn.
async fn member_apiserver_stopped(ctx: Arc<TestContext>) -> TestResult {
    shared(&ctx).await?;
    let s = Scenario::new(
        ctx.clone(),
        json!({"cluster": {"tolerationSeconds": CLUSTER_TOLERATION, "purgeMode": "Gracefully"}}),
    )
    .await?;
    let aw = support::appwrapper(
        "serve",
        &[],
        vec![support::job("serve-job", "sleep infinity", 1, 1)],
    )?;
    s.create(&aw).await?;
    let lost = s.placed("serve").await?;
    let lost_api = s.in_member(&lost).await?;
    support::until_ready(&lost_api, "serve").await?;
    s.until_health("serve", &lost, ResourceHealth::Healthy, None)
        .await?;
    ctx.fleet.stop_apiserver(&lost)?;
    let result = async {
        let not_ready = wait::until(&format!("{lost} not Ready on the hub"), T, || async {
            match ready_condition(&s.hub, &lost).await? {
                Some(c) if c.status != "True" => Ok(c),
                other => Err(format!("{:?}", other.map(|c| (c.status, c.reason)))),
            }
        })
        .await?;
        if not_ready.status != "False" || not_ready.reason != "MemberAPIUnreachable" {
            return Err(format!(
                "Ready {} ({}): {}",
                not_ready.status, not_ready.reason, not_ready.message
            )
            .into());
        }
        let moved = s
            .until_binding(
                "serve",
                &format!("serve moved off {lost}"),
                T,
                |b| match placement(b).as_slice() {
                    [one] if *one != lost => Ok(()),
                    other => Err(format!("clusters {other:?}")),
                },
            )
            .await?;
        let record = record_for(&moved, &lost)?;
        let earliest = not_ready
            .last_transition_time
            .0
            .checked_add(SignedDuration::from_secs(CLUSTER_TOLERATION))?;
        if record.reason != EVICTION_CLUSTER_FAILURE || record.evicted_at.0 < earliest {
            return Err(format!(
                "eviction record {record:?}; {lost} not Ready since {}",
                not_ready.last_transition_time.0
            )
            .into());
        }
        let target = placement(&moved).remove(0);
        support::until_ready(&s.in_member(&target).await?, "serve").await?;
        Ok::<(), TestError>(())
    }
    .await;
    ctx.fleet.start_apiserver(&lost).await?;
    result?;
    wait::until(&format!("{lost} Ready again"), T, || async {
        match ready_condition(&s.hub, &lost).await? {
            Some(c) if c.status == "True" => Ok(()),
            other => Err(format!("{:?}", other.map(|c| (c.status, c.reason)))),
        }
    })
    .await?;
    wait::until(&format!("the old copy in {lost} withdrawn"), T, || async {
        match lost_api.get_opt("serve").await {
            Ok(None) => Ok(()),
            Ok(Some(aw)) => Err(format!("still there ({:?})", support::phase(&aw))),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    Ok(())
}

/// A bound on "stopped member apiserver → its workload Running in another member" at cluster
/// toleration 0 that fails what the issue measured (27.8 s p50: the agent's 30 s silence bound
/// before the hub heard of it), with room for a loaded machine; the goal is < 5 s, measured by
/// `benches/failover_e2e.rs --member-loss` (BENCHMARKS.md), not here.
const LOST_MEMBER_BOUND: Duration = Duration::from_secs(15);

/// Issue 20: member A's kube-apiserver stops under a workload whose policy fails clusters over
/// at once (`tolerationSeconds: 0`, `Gracefully`). The agent notices within its bound (default
/// `--member-api-timeout` 2 s) and tells the hub in a heartbeat sent at once; the hub marks A
/// not Ready (`MemberAPIUnreachable`) and moves the workload, which runs in another member
/// within [`LOST_MEMBER_BOUND`]. A's apiserver starts again: its old copy is withdrawn.
async fn member_apiserver_stopped_toleration_0(ctx: Arc<TestContext>) -> TestResult {
    shared(&ctx).await?;
    let s = Scenario::new(
        ctx.clone(),
        json!({"cluster": {"tolerationSeconds": 0, "purgeMode": "Gracefully"}}),
    )
    .await?;
    let aw = support::appwrapper(
        "serve",
        &[],
        vec![support::job("serve-job", "sleep infinity", 1, 1)],
    )?;
    s.create(&aw).await?;
    let lost = s.placed("serve").await?;
    let lost_api = s.in_member(&lost).await?;
    support::until_ready(&lost_api, "serve").await?;
    s.until_health("serve", &lost, ResourceHealth::Healthy, None)
        .await?;
    let stopped = std::time::Instant::now();
    ctx.fleet.stop_apiserver(&lost)?;
    let result = async {
        let moved = s
            .until_binding(
                "serve",
                &format!("serve moved off {lost}"),
                LOST_MEMBER_BOUND,
                |b| match placement(b).as_slice() {
                    [one] if *one != lost => Ok(()),
                    other => Err(format!("clusters {other:?}")),
                },
            )
            .await?;
        let record = record_for(&moved, &lost)?;
        if record.reason != EVICTION_CLUSTER_FAILURE {
            return Err(format!("eviction record {record:?}").into());
        }
        let target = placement(&moved).remove(0);
        let left = LOST_MEMBER_BOUND.saturating_sub(stopped.elapsed());
        support::until(
            &s.in_member(&target).await?,
            "serve",
            &format!("serve Running in {target}"),
            left,
            |aw| support::phase(aw) == lifeboat_api::appwrapper::AppWrapperPhase::Running,
        )
        .await?;
        println!(
            "{lost}'s kube-apiserver stopped → serve Running in {target}: {:.1} s",
            stopped.elapsed().as_secs_f64()
        );
        let condition = ready_condition(&s.hub, &lost).await?;
        match condition {
            Some(c) if c.status == "False" && c.reason == "MemberAPIUnreachable" => {
                Ok::<(), TestError>(())
            }
            other => Err(format!(
                "{lost}'s Ready condition: {:?}",
                other.map(|c| (c.status, c.reason))
            )
            .into()),
        }
    }
    .await;
    ctx.fleet.start_apiserver(&lost).await?;
    result?;
    wait::until(&format!("the old copy in {lost} withdrawn"), T, || async {
        match lost_api.get_opt("serve").await {
            Ok(None) => Ok(()),
            Ok(Some(aw)) => Err(format!("still there ({:?})", support::phase(&aw))),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    Ok(())
}

/// How long the member's apiserver stays down in the restart test: long enough for
/// kube-runtime's default watch backoff (0.8 s doubling to 30 s) to reach waits of tens of
/// seconds, as a real apiserver restart does.
const APISERVER_DOWN: Duration = Duration::from_secs(20);
/// A bound on "apiserver ready again → new work placed there Running" that fails what the issue
/// measured (watches idle about 50 s), with room for a loaded machine.
const RESUME_BOUND: Duration = Duration::from_secs(15);

/// Issue 20: member A's kube-apiserver restarts (down [`APISERVER_DOWN`]) under a workload that
/// stays (cluster toleration far longer than the test). Right after it is ready again, a new
/// AppWrapper placed on A is created on the hub: the agent applies it, its controller (watches
/// of AppWrappers, wrapped kinds) runs it, and its status watch reports it Running to the hub,
/// within [`RESUME_BOUND`] of the apiserver being ready. The first workload is Healthy again
/// too (untimed: its pods are the member's scheduler's and kwok's).
async fn member_apiserver_restarted(ctx: Arc<TestContext>) -> TestResult {
    shared(&ctx).await?;
    let s = Scenario::new(ctx.clone(), json!({})).await?;
    let [a, ..] = members(&ctx)?;
    lifeboat_e2e::fleet::lifeboat::apply_propagation_policy(
        &s.hub,
        &s.ns,
        "scenario",
        json!({
            "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper"}],
            "placement": {"clusterAffinity": {"clusterNames": [a]}},
            "failover": {"cluster": {"tolerationSeconds": 3600, "purgeMode": "Gracefully"}},
        }),
    )
    .await?;
    let first = support::appwrapper(
        "before",
        &[],
        vec![support::job("before-job", "sleep infinity", 1, 1)],
    )?;
    s.create(&first).await?;
    let api = s.in_member(&a).await?;
    support::until_ready(&api, "before").await?;
    s.until_health("before", &a, ResourceHealth::Healthy, None)
        .await?;
    ctx.fleet.stop_apiserver(&a)?;
    tokio::time::sleep(APISERVER_DOWN).await;
    ctx.fleet.start_apiserver(&a).await?;
    let ready = std::time::Instant::now();
    let second = support::appwrapper(
        "after",
        &[],
        vec![support::job("after-job", "sleep infinity", 1, 1)],
    )?;
    s.create(&second).await?;
    support::until(
        &api,
        "after",
        &format!("after Running in {a}"),
        RESUME_BOUND,
        |aw| support::phase(aw) == lifeboat_api::appwrapper::AppWrapperPhase::Running,
    )
    .await?;
    let running = ready.elapsed();
    let left = RESUME_BOUND.saturating_sub(running);
    // The agent's status watch reported the copy Running (its pods becoming ready is the
    // member's scheduler and kwok, whose own watches come back on client-go's backoff).
    s.until_binding(
        "after",
        "after reported Running to the hub",
        left,
        |b| match b.cluster_status(&a) {
            Some(i)
                if i.health == ResourceHealth::Healthy
                    || i.health_reason
                        .as_deref()
                        .is_some_and(|r| r.starts_with("Running")) =>
            {
                Ok(())
            }
            other => Err(describe_item(other)),
        },
    )
    .await?;
    println!(
        "{a}'s kube-apiserver ready again → new work Running there {:.1} s, reported Running to the hub {:.1} s",
        running.as_secs_f64(),
        ready.elapsed().as_secs_f64()
    );
    s.until_health("before", &a, ResourceHealth::Healthy, None)
        .await?;
    Ok(())
}

/// The hub's agent heartbeat interval in these suites (`support::hub::start_hub_with`).
const HEARTBEAT: Duration = Duration::from_secs(2);

/// Fails if Cluster `member` shows up on the hub within `span` (checked every 250 ms).
async fn stays_deleted(hub: &kube::Client, member: &str, span: Duration) -> TestResult {
    let clusters: Api<Cluster> = Api::all(hub.clone());
    let until = std::time::Instant::now() + span;
    while std::time::Instant::now() < until {
        if let Some(c) = clusters.get_opt(member).await? {
            return Err(format!(
                "Cluster {member} is back (created {:?}, agent {:?})",
                c.metadata.creation_timestamp.map(|t| t.0.to_string()),
                c.status.and_then(|s| s.agent).map(|a| a.identity)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// When the hub removed `member` as its agent's credential Secret says, if it did.
async fn removed_mark(ctx: &TestContext, member: &str) -> Result<Option<String>, TestError> {
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
        ctx.client(member).await?,
        support::CREDENTIAL_NAMESPACE,
    )
    .get_opt(support::CREDENTIAL_NAME)
    .await?;
    Ok(secret
        .as_ref()
        .and_then(lifeboat_agent::uplink::credential::removed_at))
}

/// `kubectl delete clusters.cluster.lifeboat.dev A` on the hub: the binding moves off A
/// (`ClusterDeleted`) and runs elsewhere; A's agent is told to stop, removes the hub's work from
/// A, marks its credential Secret removed and says so, and the hub lets the Cluster go. A stays
/// deleted (no agent registers it again) for several heartbeat intervals, also after its agent
/// restarted. Deleting the credential Secret (the explicit act to join again) brings A back,
/// Ready.
async fn cluster_deleted_on_the_hub(ctx: Arc<TestContext>) -> TestResult {
    let fleet_hub = shared(&ctx).await?;
    let s = Scenario::new(
        ctx.clone(),
        json!({"cluster": {"tolerationSeconds": CLUSTER_TOLERATION, "purgeMode": "Gracefully"}}),
    )
    .await?;
    let aw = support::appwrapper(
        "leaver",
        &[],
        vec![support::job("leaver-job", "sleep infinity", 1, 1)],
    )?;
    s.create(&aw).await?;
    let deleted = s.placed("leaver").await?;
    let deleted_api = s.in_member(&deleted).await?;
    support::until_ready(&deleted_api, "leaver").await?;
    s.until_health("leaver", &deleted, ResourceHealth::Healthy, None)
        .await?;
    let clusters: Api<Cluster> = Api::all(s.hub.clone());
    clusters.delete(&deleted, &DeleteParams::default()).await?;

    // The workload moves.
    let moved = s
        .until_binding(
            "leaver",
            &format!("leaver moved off {deleted}"),
            T,
            |b| match placement(b).as_slice() {
                [one] if *one != deleted => Ok(()),
                other => Err(format!("clusters {other:?}")),
            },
        )
        .await?;
    let record = record_for(&moved, &deleted)?;
    if record.reason != EVICTION_CLUSTER_DELETED {
        return Err(format!("eviction record {record:?}").into());
    }
    let target = placement(&moved).remove(0);
    support::until_ready(&s.in_member(&target).await?, "leaver").await?;
    // `kubectl get rb -o wide` shows where it runs now (the status summary).
    s.until_binding("leaver", "the summary names the new placement", T, |b| {
        let summary = b.status.as_ref().and_then(|s| s.summary.clone());
        match summary {
            Some(summary) if summary.clusters == target && summary.failures.is_empty() => Ok(()),
            other => Err(format!("summary {other:?}")),
        }
    })
    .await?;

    // The agent stops: the hub's work leaves the member, the Cluster goes, and nobody
    // registers it again.
    wait::until(&format!("the copy in {deleted} removed"), T, || async {
        match deleted_api.get_opt("leaver").await {
            Ok(None) => Ok(()),
            Ok(Some(aw)) => Err(format!("still there ({:?})", support::phase(&aw))),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    wait::until(&format!("Cluster {deleted} gone"), T, || async {
        match clusters.get_opt(&deleted).await {
            Ok(None) => Ok(()),
            Ok(Some(c)) => Err(format!("finalizers {:?}", c.metadata.finalizers)),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    stays_deleted(&s.hub, &deleted, 5 * HEARTBEAT).await?;
    let mark = removed_mark(&ctx, &deleted).await?;
    if mark.is_none() {
        return Err(format!("{deleted}'s credential Secret is not marked removed").into());
    }

    // Restarted, the agent stays stopped.
    fleet_hub.restart_agent(&ctx, &deleted).await?;
    stays_deleted(&s.hub, &deleted, 5 * HEARTBEAT).await?;
    if removed_mark(&ctx, &deleted).await? != mark {
        return Err(format!("{deleted}'s removed mark changed after the restart").into());
    }

    // The explicit act to join again: the credential Secret deleted.
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
        ctx.client(&deleted).await?,
        support::CREDENTIAL_NAMESPACE,
    )
    .delete(support::CREDENTIAL_NAME, &DeleteParams::default())
    .await?;
    support::hub::until_clusters_ready(&s.hub, [&deleted]).await?;
    if removed_mark(&ctx, &deleted).await?.is_some() {
        return Err(format!("{deleted} joined again but its Secret is still marked").into());
    }
    Ok(())
}
