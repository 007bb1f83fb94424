//! Failover scenarios of issue 9 on the local fleet (hub + 2 members of 4 GPU nodes), with the
//! real hub and one agent per member in hub mode, in this process: what the AppWrapper's own
//! fault tolerance keeps in its cluster, what the hub does not move, how the application
//! toleration is counted across a flapping health, and when `purgeMode: Gracefully` removes the
//! old copy.
//!
//! The tests share one hub (a hub binds the fleet's hub cluster) and run at once, each in its own
//! namespace with its own PropagationPolicy. Their pods are pinned to node pools so that a node
//! fault of one test cannot touch another's pods: nodes 0 and 1 of each member form the pool
//! `autopilot` (scenario 1 flags one of them), nodes 2 and 3 the pool `general`.
//!
//! Scenarios 4 and 5 (whole clusters lost) are in `cluster_scenarios.rs`.

mod support;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use lifeboat_api::appwrapper::AppWrapperPhase as Phase;
use lifeboat_api::binding::{
    CONDITION_FAILOVER_BLOCKED, EVICTION_APPLICATION_FAILURE, EvictionRecord, ResourceBinding,
    ResourceHealth,
};
use lifeboat_api::health::FailureClass;
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestError, TestResult};
use lifeboat_e2e::{faults, nodes, wait};
use serde_json::{Value, json};
use support::T;
use support::scenario::{
    FleetHub, Scenario, describe_item, job, node_of_running_pod, placement, start_fleet_hub,
};
use support::set_node_label as label_nodes;

/// The node pool label and its pools.
const POOL: &str = "lifeboat-e2e/pool";
const AUTOPILOT_POOL: &str = "autopilot";
const GENERAL_POOL: &str = "general";
/// Scenario 9's application toleration.
const FLAP_TOLERATION: i64 = 20;
/// Scenario 9: the second Unhealthy comes at least this long after the first.
const FLAP_GAP: Duration = Duration::from_secs(8);
/// Scenario 10: how long the old copy is watched while the new one cannot become Healthy.
const HOLD: Duration = Duration::from_secs(8);
/// Scenario 10b's grace period.
const GRACE: i64 = 15;

fn main() -> ExitCode {
    harness::run(
        "scenarios",
        |c| {
            c.members = 2;
            c.nodes_per_member = 4;
            c.gpus_per_node = 8;
        },
        vec![
            E2eTest::new(
                "autopilot_evict_migrates_inside_the_cluster_and_the_hub_keeps_the_placement",
                autopilot_evict,
            ),
            E2eTest::new(
                "a_terminal_exit_code_is_not_moved_and_the_binding_says_why",
                terminal_exit_code,
            ),
            E2eTest::new(
                "unhealthy_unknown_unhealthy_keeps_the_toleration_from_the_first_unhealthy",
                health_flaps,
            ),
            E2eTest::new(
                "gracefully_keeps_the_old_copy_until_the_new_one_is_healthy",
                gracefully_until_healthy,
            ),
            E2eTest::new(
                "gracefully_removes_the_old_copy_after_the_grace_period_when_the_new_one_never_gets_healthy",
                gracefully_until_grace_period,
            ),
        ],
    )
}

static HUB: tokio::sync::OnceCell<FleetHub> = tokio::sync::OnceCell::const_new();

/// The suite's hub and agents, started by the first test that asks; the node pools labelled.
async fn shared(ctx: &TestContext) -> Result<&'static FleetHub, TestError> {
    HUB.get_or_try_init(|| async {
        let hub = start_fleet_hub(ctx, |_| {}, |_| {}).await?;
        for member in ctx.fleet.member_names() {
            let pool = |range: std::ops::Range<usize>| -> Vec<String> {
                range.map(|i| nodes::node_name(&member, i)).collect()
            };
            label_nodes(ctx, &member, &pool(0..2), POOL, Some(AUTOPILOT_POOL)).await?;
            label_nodes(ctx, &member, &pool(2..4), POOL, Some(GENERAL_POOL)).await?;
        }
        Ok(hub)
    })
    .await
}

fn general_nodes(member: &str) -> Vec<String> {
    (2..4).map(|i| nodes::node_name(member, i)).collect()
}

/// Application failover that would move at once (toleration 0) and blocks the old cluster
/// for good, with `extra` merged in.
fn application(extra: Value) -> Value {
    let mut app = json!({
        "decisionConditions": {"tolerationSeconds": 0},
        "purgeMode": "Gracefully",
        "blockPredecessorSeconds": 0
    });
    if let (Some(app), Some(extra)) = (app.as_object_mut(), extra.as_object()) {
        app.extend(extra.clone());
    }
    json!({ "application": app })
}

fn time(t: &Timestamp) -> String {
    t.to_string()
}

/// The binding stayed where it was: one cluster, no eviction ever, no task.
fn never_moved(b: &ResourceBinding, cluster: &str) -> Result<(), TestError> {
    if placement(b) != [cluster.to_string()]
        || !b.spec.eviction_history.is_empty()
        || !b.spec.graceful_eviction_tasks.is_empty()
    {
        return Err(format!(
            "moved: clusters {:?}, evictionHistory {:?}, tasks {:?}",
            placement(b),
            b.spec.eviction_history,
            b.spec.graceful_eviction_tasks
        )
        .into());
    }
    Ok(())
}

async fn no_copy_in(s: &Scenario, member: &str, name: &str) -> Result<(), TestError> {
    match s.in_member(member).await?.get_opt(name).await? {
        None => Ok(()),
        Some(_) => Err(format!("{name} has a copy in {member}").into()),
    }
}

/// Fails the Running (or Pending, on a node) pod of AppWrapper `aw` in `member`.
async fn fail_pod_of(
    ctx: &TestContext,
    member: &str,
    aw: &str,
    exit_code: i32,
) -> Result<String, TestError> {
    let pod = wait::until(&format!("a live pod of {aw} on a node"), T, || async {
        let pods = support::pods_of(ctx, member, aw)
            .await
            .map_err(|e| e.to_string())?;
        pods.into_iter()
            .find(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.spec.as_ref().is_some_and(|s| s.node_name.is_some())
                    && matches!(
                        p.status.as_ref().and_then(|s| s.phase.as_deref()),
                        Some("Pending" | "Running")
                    )
            })
            .and_then(|p| p.metadata.name)
            .ok_or_else(|| "none yet".to_string())
    })
    .await?;
    faults::fail_pod(&ctx.client(member).await?, &ctx.namespace, &pod, exit_code).await?;
    Ok(pod)
}

/// Scenario 1: a GPU flagged `EVICT` by Autopilot. The agent migrates the AppWrapper to another
/// node of its cluster (a reset that is not a retry); the hub sees the copy Unhealthy
/// (`AutopilotNoExecute`) under a policy that would move it at once, but the workload still
/// fits in its cluster, so the binding keeps its cluster: no eviction record, no task, no copy in
/// the other member.
async fn autopilot_evict(ctx: Arc<TestContext>) -> TestResult {
    shared(&ctx).await?;
    let s = Scenario::new(ctx.clone(), application(json!({}))).await?;
    let aw = support::appwrapper(
        "migrant",
        // The reset's pause keeps the copy Resetting (Unhealthy) for 5 s: the hub sees it.
        &[("retryPausePeriodDuration", "5s")],
        vec![job("migrant-job", &[(POOL, AUTOPILOT_POOL)], None)],
    )?;
    s.create(&aw).await?;
    let placed = s.placed("migrant").await?;
    let other = s.other(&placed)?;
    let member = s.in_member(&placed).await?;
    support::until_ready(&member, "migrant").await?;
    s.until_health("migrant", &placed, ResourceHealth::Healthy, None)
        .await?;
    let first = node_of_running_pod(&ctx, &placed, "migrant")
        .await?
        .ok_or("no running pod")?;
    let client = ctx.client(&placed).await?;
    faults::set_gpu_health(&client, &first, "EVICT").await?;
    let result = async {
        s.until_health(
            "migrant",
            &placed,
            ResourceHealth::Unhealthy,
            Some("AutopilotNoExecute"),
        )
        .await?;
        let migrated = support::until(
            &member,
            "migrant",
            "Running again after the migration",
            T,
            |aw| {
                support::phase(aw) == Phase::Running
                    && aw.status.as_ref().is_some_and(|s| {
                        s.transitions
                            .iter()
                            .any(|t| t.reason == "AutopilotNoExecute")
                    })
                    && support::condition(aw, "PodsReady").is_some_and(|c| c.0 == "True")
            },
        )
        .await?;
        if migrated.status.unwrap_or_default().retries != 0 {
            return Err::<(), TestError>("an Autopilot migration counted as a retry".into());
        }
        let second = node_of_running_pod(&ctx, &placed, "migrant")
            .await?
            .ok_or("no running pod after the migration")?;
        if second == first {
            return Err(format!("the pod runs on the flagged node {first} again").into());
        }
        let b = s
            .until_health("migrant", &placed, ResourceHealth::Healthy, None)
            .await?;
        never_moved(&b, &placed)?;
        no_copy_in(&s, &other, "migrant").await
    }
    .await;
    faults::set_gpu_health(&client, &first, nodes::GPU_HEALTHY).await?;
    result
}

/// Scenario 3: an application failure. The pod exits with a code the AppWrapper lists in
/// `terminalExitCodes`: the agent fails the AppWrapper at once (no retry, class Application).
/// The policy moves failures at once but not application failures (no
/// `moveOnApplicationFailure`): the binding stays, with `FailoverBlocked=True` (reason
/// `ApplicationFailure`) naming the cluster; no eviction record, no copy in the other member.
async fn terminal_exit_code(ctx: Arc<TestContext>) -> TestResult {
    shared(&ctx).await?;
    let s = Scenario::new(ctx.clone(), application(json!({}))).await?;
    let aw = support::appwrapper(
        "crash",
        &[
            ("terminalExitCodes", "42"),
            ("failureGracePeriodDuration", "0s"),
        ],
        vec![job("crash-job", &[(POOL, GENERAL_POOL)], None)],
    )?;
    s.create(&aw).await?;
    let placed = s.placed("crash").await?;
    let other = s.other(&placed)?;
    let member = s.in_member(&placed).await?;
    support::until_ready(&member, "crash").await?;
    fail_pod_of(&ctx, &placed, "crash", 42).await?;
    let failed = support::until_phase(&member, "crash", Phase::Failed).await?;
    let unhealthy = support::condition(&failed, "Unhealthy").unwrap_or_default();
    if !unhealthy.2.starts_with("[Application]") || !unhealthy.2.contains("terminal") {
        return Err(format!("Unhealthy condition {unhealthy:?}").into());
    }
    // The binder decides on the processor's newest items before they are written, and the
    // status write follows its own (crate `handoff` of the hub): the condition may be seen a
    // moment before the item it was decided on.
    let b = s
        .until_binding(
            "crash",
            "FailoverBlocked=True (ApplicationFailure) and the item of class Application",
            T,
            |b| {
                let c = b.condition(CONDITION_FAILOVER_BLOCKED);
                match c {
                    Some(c) if c.status == "True" && c.reason == EVICTION_APPLICATION_FAILURE => {}
                    other => {
                        return Err(format!(
                            "FailoverBlocked {:?}",
                            other.map(|c| (&c.status, &c.reason))
                        ));
                    }
                }
                let item = b.cluster_status(&placed);
                if item.and_then(|i| i.failure_class) != Some(FailureClass::Application) {
                    return Err(format!("status item {}", describe_item(item)));
                }
                Ok(())
            },
        )
        .await?;
    let message = b
        .condition(CONDITION_FAILOVER_BLOCKED)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    if !message.contains(&placed) || !message.contains("moveOnApplicationFailure") {
        return Err(format!("FailoverBlocked message {message:?}").into());
    }
    never_moved(&b, &placed)?;
    no_copy_in(&s, &other, "crash").await
}

/// Scenario 9: the health flaps Unhealthy, Unknown, Unhealthy and the toleration timer is not
/// reset. The Unknown is the agent's own retry: an AppWrapper (retryLimit 1) whose pod fails is
/// Unhealthy (Resetting, for the 5 s retry pause); the agent resets it and, while the new pod sits in its init container (kwok keeps
/// it there for an hour), the AppWrapper is Running without ready pods, which the AppWrapper
/// interpreter judges Unknown; the test fails the new pod, and the AppWrapper is Unhealthy
/// again, then Failed (no retry left), which lets the hub move it. Real (it is what the agent
/// reports through any reset) and deterministic (the test decides when each pod fails; nothing
/// in between turns Healthy).
///
/// Asserted: `unhealthySince` keeps its first value through the Unknown and the second
/// Unhealthy; the eviction is not before the first Unhealthy + toleration, and comes before the
/// second failure + toleration (when a reset timer would have allowed it at the earliest); its
/// record names the first Unhealthy.
async fn health_flaps(ctx: Arc<TestContext>) -> TestResult {
    shared(&ctx).await?;
    let s = Scenario::new(
        ctx.clone(),
        application(json!({
            "decisionConditions": {"tolerationSeconds": FLAP_TOLERATION},
            "gracePeriodSeconds": 600,
            "moveOnApplicationFailure": true
        })),
    )
    .await?;
    let aw = support::appwrapper(
        "flappy",
        // The reset's pause keeps the first failure Unhealthy (Resetting) for 5 s, so the hub
        // sees it (its Job fails with its pod, which resets the AppWrapper at once).
        &[("retryLimit", "1"), ("retryPausePeriodDuration", "5s")],
        vec![job("flappy-job", &[(POOL, GENERAL_POOL)], Some(3600))],
    )?;
    s.create(&aw).await?;
    let placed = s.placed("flappy").await?;
    let other = s.other(&placed)?;
    fail_pod_of(&ctx, &placed, "flappy", 1).await?;
    let first = s
        .until_health("flappy", &placed, ResourceHealth::Unhealthy, None)
        .await?;
    let since = first
        .cluster_status(&placed)
        .and_then(|i| i.unhealthy_since.clone())
        .ok_or("Unhealthy without unhealthySince")?;
    // The reset: the new pod waits in its init container.
    let unknown = s
        .until_health("flappy", &placed, ResourceHealth::Unknown, None)
        .await?;
    let kept = |b: &ResourceBinding| {
        b.cluster_status(&placed)
            .and_then(|i| i.unhealthy_since.clone())
    };
    if kept(&unknown) != Some(since.clone()) {
        return Err(format!(
            "Unknown changed unhealthySince: {}",
            describe_item(unknown.cluster_status(&placed))
        )
        .into());
    }
    let gap_end = since.0.checked_add(SignedDuration::try_from(FLAP_GAP)?)?;
    if let Ok(wait) = Duration::try_from(Timestamp::now().duration_until(gap_end)) {
        tokio::time::sleep(wait).await;
    }
    let still = s.binding("flappy").await?;
    let item = still.cluster_status(&placed);
    if item.map(|i| i.health) != Some(ResourceHealth::Unknown)
        || kept(&still) != Some(since.clone())
    {
        return Err(format!("before the second failure: {}", describe_item(item)).into());
    }
    let second_failure = Timestamp::now();
    fail_pod_of(&ctx, &placed, "flappy", 1).await?;
    let again = s
        .until_health("flappy", &placed, ResourceHealth::Unhealthy, None)
        .await?;
    if kept(&again) != Some(since.clone()) {
        return Err(format!(
            "the second Unhealthy changed unhealthySince: {}",
            describe_item(again.cluster_status(&placed))
        )
        .into());
    }
    let moved = s
        .until_binding(
            "flappy",
            "flappy moved to the other member",
            T + Duration::from_secs(FLAP_TOLERATION as u64),
            |b| {
                if placement(b) == [other.clone()] {
                    Ok(())
                } else {
                    Err(format!(
                        "clusters {:?}, {}",
                        placement(b),
                        describe_item(b.cluster_status(&placed))
                    ))
                }
            },
        )
        .await?;
    let record: &EvictionRecord = moved
        .spec
        .eviction_history
        .iter()
        .find(|r| r.cluster_name == placed)
        .ok_or("no eviction record")?;
    let evicted = record.evicted_at.0.as_second();
    let first_unhealthy = since.0.as_second();
    if evicted < first_unhealthy + FLAP_TOLERATION {
        return Err(format!(
            "evicted at {} before the first Unhealthy ({}) + toleration {FLAP_TOLERATION}s",
            time(&record.evicted_at.0),
            time(&since.0)
        )
        .into());
    }
    if evicted >= second_failure.as_second() + FLAP_TOLERATION {
        return Err(format!(
            "evicted at {}, toleration counted from the second failure ({second_failure}), not from the first Unhealthy ({})",
            time(&record.evicted_at.0),
            time(&since.0)
        )
        .into());
    }
    if record.reason != EVICTION_APPLICATION_FAILURE
        || !record
            .message
            .as_deref()
            .is_some_and(|m| m.contains(&time(&since.0)))
    {
        return Err(format!("eviction record {record:?}").into());
    }
    tracing::info!(
        first_unhealthy = %time(&since.0),
        %second_failure,
        evicted = %time(&record.evicted_at.0),
        "flappy moved"
    );
    Ok(())
}

/// A scenario 10 AppWrapper: its pod needs label `key` on a `general` node, which the hub's
/// inventory does not report (so the hub places it anywhere) and the test sets per member.
async fn graceful_setup(
    ctx: &Arc<TestContext>,
    name: &str,
    key: &str,
    grace_period: i64,
) -> Result<(Scenario, String, String), TestError> {
    shared(ctx).await?;
    let s = Scenario::new(
        ctx.clone(),
        application(json!({
            "gracePeriodSeconds": grace_period,
            "moveOnApplicationFailure": true
        })),
    )
    .await?;
    let aw = support::appwrapper(
        name,
        &[("retryLimit", "0"), ("failureGracePeriodDuration", "0s")],
        vec![job(
            &format!("{name}-job"),
            &[(POOL, GENERAL_POOL), (key, "true")],
            None,
        )],
    )?;
    s.create(&aw).await?;
    let placed = s.placed(name).await?;
    let other = s.other(&placed)?;
    label_nodes(ctx, &placed, &general_nodes(&placed), key, Some("true")).await?;
    support::until_ready(&s.in_member(&placed).await?, name).await?;
    s.until_health(name, &placed, ResourceHealth::Healthy, None)
        .await?;
    // An application failure (exit 1), which this policy moves at once.
    fail_pod_of(ctx, &placed, name, 1).await?;
    s.until_binding(name, &format!("{name} moved"), T, |b| {
        let tasked = b
            .spec
            .graceful_eviction_tasks
            .iter()
            .any(|t| t.from_cluster == placed);
        if placement(b) == [other.clone()] && tasked {
            Ok(())
        } else {
            Err(format!(
                "clusters {:?}, tasks {:?}",
                placement(b),
                b.spec.graceful_eviction_tasks
            ))
        }
    })
    .await?;
    // The new copy exists (its pod cannot be scheduled: no node there has the label).
    let new_api = s.in_member(&other).await?;
    wait::until(&format!("{name} applied in {other}"), T, || async {
        match new_api.get_opt(name).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err("not yet".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    Ok((s, placed, other))
}

/// The old copy is still there and not being deleted.
async fn old_copy_present(s: &Scenario, member: &str, name: &str) -> Result<bool, TestError> {
    Ok(s.in_member(member)
        .await?
        .get_opt(name)
        .await?
        .is_some_and(|aw| aw.metadata.deletion_timestamp.is_none()))
}

async fn until_old_copy_gone(s: &Scenario, member: &str, name: &str) -> Result<(), TestError> {
    let api = s.in_member(member).await?;
    wait::until(
        &format!("the old copy of {name} in {member} gone"),
        T,
        || async {
            match api.get_opt(name).await {
                Ok(None) => Ok(()),
                Ok(Some(aw)) => Err(format!("still there, phase {:?}", support::phase(&aw))),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await?;
    Ok(())
}

/// Once the old copy is gone: the binding is placed on `new` alone, the eviction task is done,
/// and the new copy is Healthy or not, as `healthy` says.
async fn after_handover(s: &Scenario, name: &str, new: &str, healthy: bool) -> TestResult {
    let b = s.binding(name).await?;
    if new_copy_healthy(&b, new) != healthy
        || !b.spec.graceful_eviction_tasks.is_empty()
        || placement(&b) != [new.to_string()]
    {
        return Err(format!(
            "the old copy went; now clusters {:?}, new copy {}, tasks {:?}",
            placement(&b),
            describe_item(b.cluster_status(new)),
            b.spec.graceful_eviction_tasks
        )
        .into());
    }
    Ok(())
}

/// Removes a scenario 10 label from every member's nodes.
async fn unlabel(ctx: &TestContext, key: &str) -> TestResult {
    for member in ctx.fleet.member_names() {
        label_nodes(ctx, &member, &general_nodes(&member), key, None).await?;
    }
    Ok(())
}

fn new_copy_healthy(b: &ResourceBinding, cluster: &str) -> bool {
    b.cluster_status(cluster)
        .is_some_and(|i| i.health == ResourceHealth::Healthy)
}

/// Scenario 10, first case: `purgeMode: Gracefully` (grace period 600 s) removes the old copy
/// only once the new one is Healthy. The AppWrapper fails in its first member and moves; its
/// pod needs a node label the new member does not have yet, so the new copy is not Healthy: for
/// 8 s the old copy stays (not even being deleted) and the eviction task with it. The test then
/// labels the new member's nodes: the new copy becomes Healthy and only then the old copy goes.
async fn gracefully_until_healthy(ctx: Arc<TestContext>) -> TestResult {
    let key = "lifeboat-e2e/handover";
    let result = async {
        let (s, old, new) = graceful_setup(&ctx, "handover", key, 600).await?;
        let hold_end = tokio::time::Instant::now() + HOLD;
        while tokio::time::Instant::now() < hold_end {
            let b = s.binding("handover").await?;
            if new_copy_healthy(&b, &new) {
                return Err("the new copy is Healthy though its pod cannot run".into());
            }
            if !old_copy_present(&s, &old, "handover").await? {
                return Err(format!(
                    "the old copy in {old} went while the new one is not Healthy ({})",
                    describe_item(b.cluster_status(&new))
                )
                .into());
            }
            if !b
                .spec
                .graceful_eviction_tasks
                .iter()
                .any(|t| t.from_cluster == old)
            {
                return Err("the eviction task ended while the new copy is not Healthy".into());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        label_nodes(&ctx, &new, &general_nodes(&new), key, Some("true")).await?;
        until_old_copy_gone(&s, &old, "handover").await?;
        after_handover(&s, "handover", &new, true).await
    }
    .await;
    unlabel(&ctx, key).await?;
    result
}

/// Scenario 10, second case: the new copy never gets Healthy (its pod can never be scheduled),
/// so `purgeMode: Gracefully` with `gracePeriodSeconds: 15` removes the old copy once the grace
/// period counted from the eviction task is over, not before: until then the old copy stays
/// (polled throughout); afterwards it goes while the new copy is still not Healthy.
async fn gracefully_until_grace_period(ctx: Arc<TestContext>) -> TestResult {
    let key = "lifeboat-e2e/stranded";
    let result = async {
        let (s, old, new) = graceful_setup(&ctx, "stranded", key, GRACE).await?;
        let b = s.binding("stranded").await?;
        let created = b
            .spec
            .graceful_eviction_tasks
            .iter()
            .find(|t| t.from_cluster == old)
            .and_then(|t| t.creation_timestamp.clone())
            .ok_or("the eviction task has no creation time")?;
        // Second precision: the task was created at or after this.
        let grace_end = created.0.as_second() + GRACE;
        while Timestamp::now().as_second() < grace_end {
            if !old_copy_present(&s, &old, "stranded").await? {
                return Err(format!(
                    "the old copy went at {} before the grace period ({GRACE}s from {}) ended",
                    Timestamp::now(),
                    time(&created.0)
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        until_old_copy_gone(&s, &old, "stranded").await?;
        after_handover(&s, "stranded", &new, false).await
    }
    .await;
    unlabel(&ctx, key).await?;
    result
}
