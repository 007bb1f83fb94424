//! Failover across clusters on the local fleet (hub + 2 members), with the real hub and one
//! agent per member in hub mode, in this process (as in the placement suite).
//!
//! 1. Application failover (scenario 2 of issue 9): an AppWrapper (retryLimit 1, no failure
//!    grace period) whose pods keep failing on broken nodes: the first failure is reset in place
//!    by its agent (the hub does not move a resetting AppWrapper), the second, with no retries
//!    left, makes it Failed with class Infrastructure in its member; the hub evicts it
//!    (toleration 0), records the eviction (cluster, reason, class; blockPredecessorSeconds 0:
//!    for good) and runs it in the other member. Afterwards exactly one copy exists: Running in
//!    the new member, none in the old one, and the old cluster stays out of the placement.
//! 2. Cluster failover: another AppWrapper whose member's agent is killed moves to the other
//!    member once the lease has lapsed and the policy's cluster toleration is over. If the first
//!    AppWrapper runs in that member too, it stays there with `FailoverBlocked=True`
//!    (`NoOtherClusterFits`): its only other cluster is blocked for good.
//!
//! One test: the suite shares one hub cluster, and one hub binds it.

mod support;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, PostParams};
use lifeboat_api::binding::{
    BLOCKED_NO_OTHER_CLUSTER_FITS, CONDITION_FAILOVER_BLOCKED, EVICTION_APPLICATION_FAILURE,
    EVICTION_CLUSTER_FAILURE, ResourceBinding,
};
use lifeboat_api::cluster::Cluster;
use lifeboat_api::health::FailureClass;
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestError, TestResult};
use lifeboat_e2e::wait;
use serde_json::json;
use support::T;
use support::hub::{
    appwrapper_resource, binding_of, phase_in, placement, start_hub, tempfile_dir, two_agents,
    until_placed_on_one,
};

/// The cluster lease of the test hub (support::hub::start_hub).
const LEASE: Duration = Duration::from_secs(10);
/// The policy's cluster toleration.
const CLUSTER_TOLERATION: Duration = Duration::from_secs(5);
/// Slack over a toleration: status reports, one scheduling pass, the new agent applying.
const SLACK: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    harness::run(
        "failover",
        |c| {
            c.members = 2;
            c.nodes_per_member = 2;
            c.gpus_per_node = 8;
        },
        vec![E2eTest::new(
            "appwrappers_move_off_a_failed_placement_and_off_a_lost_cluster",
            failover,
        )],
    )
}

async fn failover(ctx: Arc<TestContext>) -> TestResult {
    let dir = tempfile_dir(&ctx.namespace)?;
    let hub = ctx.client("hub").await?;
    lifeboat_agent::install::ensure_crd(&hub).await?;
    let hub_url = start_hub(&ctx).await?;
    let members = ctx.fleet.member_names();
    let [first, second] = members.as_slice() else {
        return Err("the fleet needs two members".into());
    };
    let mut agents = two_agents(&ctx, &hub, &hub_url, &dir, [first, second]).await?;
    let clusters: Api<Cluster> = Api::all(hub.clone());
    let ns = ctx.namespace.clone();
    lifeboat_e2e::fleet::lifeboat::apply_propagation_policy(
        &hub,
        &ns,
        "failover",
        json!({
            "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper"}],
            "failover": {
                "application": {
                    "decisionConditions": {"tolerationSeconds": 0},
                    "purgeMode": "Gracefully",
                    "gracePeriodSeconds": 600,
                    "blockPredecessorSeconds": 0
                },
                "cluster": {"tolerationSeconds": CLUSTER_TOLERATION.as_secs(), "purgeMode": "Gracefully"}
            }
        }),
    )
    .await?;
    let appwrappers: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &ns, &appwrapper_resource());
    let bindings: Api<ResourceBinding> = Api::namespaced(hub.clone(), &ns);
    let in_member = |member: &str| {
        let ctx = ctx.clone();
        let member = member.to_string();
        let ns = ns.clone();
        async move {
            Ok::<_, TestError>(Api::<DynamicObject>::namespaced_with(
                ctx.client(&member).await?,
                &ns,
                &appwrapper_resource(),
            ))
        }
    };

    // 1. Application failover.
    let mut train = serde_json::to_value(support::appwrapper(
        "train",
        &[
            ("retryLimit", "1"),
            ("retryPausePeriodDuration", "1s"),
            ("failureGracePeriodDuration", "0s"),
        ],
        vec![support::job("train-job", "sleep 3600", 1, 1)],
    )?)?;
    train["metadata"]["namespace"] = json!(ns);
    appwrappers
        .create(&PostParams::default(), &serde_json::from_value(train)?)
        .await?;
    let placed = until_placed_on_one(&bindings, "train", T).await?;
    let other = if &placed == first { second } else { first };
    let old_api = in_member(&placed).await?;
    let new_api = in_member(other).await?;
    wait::until("train Running where it was placed", T, || async {
        match phase_in(&old_api, "train").await?.as_deref() {
            Some("Running") => Ok(()),
            p => Err(format!("phase {p:?}")),
        }
    })
    .await?;

    // Its pod fails on a NotReady node: an Infrastructure failure its agent resets in place
    // (one retry), with a new pod on the member's other node; the binding stays where it is.
    let mut broken = support::hub::fail_on_broken_nodes(&ctx, &placed, &ns, "train").await?;
    wait::until("train reset in place once and Running again", T, || async {
        let aw = old_api
            .get_opt("train")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the copy is gone")?;
        let status = &aw.data["status"];
        match (status["resettingCount"].as_i64(), status["phase"].as_str()) {
            (Some(1), Some("Running")) => Ok(()),
            other => Err(format!("resettingCount and phase {other:?}")),
        }
    })
    .await?;
    let b = binding_of(&bindings, "train").await?;
    if placement(&b) != [placed.clone()] || !b.spec.eviction_history.is_empty() {
        return Err(format!(
            "moved while it reset itself: clusters {:?}, history {:?}",
            placement(&b),
            b.spec.eviction_history
        )
        .into());
    }
    // Its new pod fails on a broken node too: no retries left, Failed, and the hub moves it.
    broken.extend(support::hub::fail_on_broken_nodes(&ctx, &placed, &ns, "train").await?);
    let failed_at = Instant::now();
    // It goes Failed there (the hub may move it, and withdraw the Failed copy, before this
    // test sees the phase: the binding's record says why it moved).
    // Moved (toleration 0) to the other member, where it runs.
    let moved = wait::until("train moved to the other member", SLACK, || async {
        let b = binding_of(&bindings, "train").await?;
        if placement(&b) == [other.clone()] {
            Ok(b)
        } else {
            Err(format!("clusters {:?}", placement(&b)))
        }
    })
    .await?;
    let moved_after = failed_at.elapsed();
    let record = moved
        .spec
        .eviction_history
        .iter()
        .find(|r| r.cluster_name == placed)
        .ok_or("no eviction record for the old cluster")?;
    if record.reason != EVICTION_APPLICATION_FAILURE
        || record.failure_class != Some(FailureClass::Infrastructure)
        || record.expires_at.is_some()
        || !record
            .message
            .as_deref()
            .is_some_and(|m| m.contains("NotReady"))
    {
        return Err(format!("eviction record {record:?}").into());
    }
    wait::until("train Running in the other member", T, || async {
        match phase_in(&new_api, "train").await?.as_deref() {
            Some("Running") => Ok(()),
            p => Err(format!("phase {p:?}")),
        }
    })
    .await?;
    // The new copy is Healthy: the old one is withdrawn. Exactly one copy afterwards.
    wait::until("the old copy withdrawn", T, || async {
        match phase_in(&old_api, "train").await? {
            None => Ok(()),
            Some(p) => Err(format!("still there ({p})")),
        }
    })
    .await?;
    let settled = wait::until("the eviction task done", T, || async {
        let b = binding_of(&bindings, "train").await?;
        if b.spec.graceful_eviction_tasks.is_empty() {
            Ok(b)
        } else {
            Err("task still there".to_string())
        }
    })
    .await?;
    if placement(&settled) != [other.clone()] || settled.spec.eviction_history.len() != 1 {
        return Err(format!(
            "after the move: clusters {:?}, history {:?}",
            placement(&settled),
            settled.spec.eviction_history
        )
        .into());
    }
    tracing::info!(?moved_after, "train moved");
    support::hub::repair_nodes(&ctx, &placed, &broken).await?;

    // 2. Cluster failover: serve's member loses its agent.
    let mut serve = serde_json::to_value(support::appwrapper(
        "serve",
        &[],
        vec![support::job("serve-job", "sleep 3600", 1, 1)],
    )?)?;
    serve["metadata"]["namespace"] = json!(ns);
    appwrappers
        .create(&PostParams::default(), &serde_json::from_value(serve)?)
        .await?;
    let lost = until_placed_on_one(&bindings, "serve", T).await?;
    let survivor = if &lost == first { second } else { first };
    let lost_api = in_member(&lost).await?;
    wait::until("serve Running", T, || async {
        match phase_in(&lost_api, "serve").await?.as_deref() {
            Some("Running") => Ok(()),
            p => Err(format!("phase {p:?}")),
        }
    })
    .await?;
    let agent = agents.remove(&lost).ok_or("no agent for the lost member")?;
    agent.abort().await;
    let killed_at = Instant::now();
    let moved = wait::until(
        "serve moved off the lost cluster",
        LEASE + CLUSTER_TOLERATION + SLACK,
        || async {
            let b = binding_of(&bindings, "serve").await?;
            if placement(&b) == [survivor.clone()] {
                Ok(b)
            } else {
                Err(format!("clusters {:?}", placement(&b)))
            }
        },
    )
    .await?;
    let moved_after = killed_at.elapsed();
    let record = moved
        .spec
        .eviction_history
        .iter()
        .find(|r| r.cluster_name == lost)
        .ok_or("no eviction record for the lost cluster")?;
    if record.reason != EVICTION_CLUSTER_FAILURE {
        return Err(format!("eviction record {record:?}").into());
    }
    // Not before the cluster toleration, counted from the Ready transition.
    let lost_cluster = clusters.get(&lost).await?;
    let not_ready = lost_cluster
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .filter(|c| c.status != "True")
        .ok_or("the lost cluster is still Ready")?;
    let earliest = not_ready.last_transition_time.0.checked_add(
        k8s_openapi::jiff::SignedDuration::from_secs(CLUSTER_TOLERATION.as_secs() as i64),
    )?;
    if record.evicted_at.0 < earliest {
        return Err(format!(
            "evicted at {} but the cluster is not Ready only since {} (toleration {CLUSTER_TOLERATION:?})",
            record.evicted_at.0, not_ready.last_transition_time.0
        )
        .into());
    }
    let survivor_api = in_member(survivor).await?;
    wait::until("serve Running on the survivor", T, || async {
        match phase_in(&survivor_api, "serve").await?.as_deref() {
            Some("Running") => Ok(()),
            p => Err(format!("phase {p:?}")),
        }
    })
    .await?;
    tracing::info!(?moved_after, "serve moved");
    // When train shares the lost cluster, it has nowhere to go (its first cluster is blocked for
    // good): its copy is kept, not purged (karmada#7455), and the binding says why.
    if &lost == other {
        wait::until("train kept on the lost cluster, blocked", T, || async {
            let b = binding_of(&bindings, "train").await?;
            let blocked = b
                .condition(CONDITION_FAILOVER_BLOCKED)
                .map(|c| (c.status.clone(), c.reason.clone()));
            if placement(&b) == [other.clone()]
                && blocked == Some(("True".into(), BLOCKED_NO_OTHER_CLUSTER_FITS.into()))
            {
                Ok(())
            } else {
                Err(format!(
                    "clusters {:?}, FailoverBlocked {blocked:?}",
                    placement(&b)
                ))
            }
        })
        .await?;
        tracing::info!("train kept on the lost cluster: no other cluster fits");
    }
    Ok(())
}
