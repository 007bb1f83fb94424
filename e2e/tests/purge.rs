//! Purge modes and state preservation on the local fleet (hub + 2 members), with the real hub and
//! one agent per member in hub mode, in this process (as in the failover suite).
//!
//! 1. `Directly`: an AppWrapper (retryLimit 0) fails on broken nodes; the hub evicts it and the
//!    old copy's agent deletes it. The deletion is held (a finalizer of the test's): while the
//!    old copy is only being deleted the hub waits (`FailoverBlocked=True`, `WaitingForPurge`,
//!    no new copy). The old member's agent is killed and a new one started: it learns the purge
//!    from its snapshot, finds the copy by its labels and, once the test lets the copy go,
//!    reports it gone; only then does the hub create the new copy. Both members are polled
//!    throughout: never two copies (AppWrapper objects) at once, never two members with live
//!    pods; the new copy was created at or after the time the hub took the gone report
//!    (`goneAt`) and purged the task.
//! 2. `Never` with state preservation: a ResourceInterpreterCustomization on the hub reflects a
//!    checkpoint (a condition the test writes on the member through the status subresource)
//!    into the binding's status; the policy preserves it (`statePreservation.rules`). After the
//!    failover the new copy carries the checkpoint as a label; the old copy stays (also once the
//!    new one is Healthy) and the binding says it waits for `confirm-purge`; the confirmation
//!    (the annotation `lifeboatctl confirm-purge` writes) removes it, and the hub then drops the
//!    confirmation.
//!
//! One test: the suite shares one hub cluster, and one hub binds it.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use lifeboat_agent::agent::SpawnedAgent;
use lifeboat_api::binding::{
    ANNOTATION_CONFIRM_PURGE, BLOCKED_WAITING_FOR_PURGE, BLOCKED_WAITING_FOR_PURGE_CONFIRMATION,
    CONDITION_FAILOVER_BLOCKED, EVICTION_APPLICATION_FAILURE, EvictionRecord, ResourceBinding,
};
use lifeboat_api::config::ResourceInterpreterCustomization;
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestError, TestResult};
use lifeboat_e2e::wait;
use serde_json::{Value, json};
use support::T;
use support::hub::{
    appwrapper_resource, binding_of, bootstrap, fail_on_broken_nodes, live, phase_in, placement,
    repair_nodes, start_agent, start_hub, tempfile_dir, until_placed_on_one,
};

/// Slack over a failover: status reports, a scheduling pass, the deletion, the new apply.
const SLACK: Duration = Duration::from_secs(60);
/// The label the checkpoint is carried in.
const CHECKPOINT_LABEL: &str = "training.lifeboat.dev/checkpoint";
const CHECKPOINT: &str = "step-1200";
/// How long the old copy of a Never eviction is watched staying after the new one is Healthy.
const STAYS: Duration = Duration::from_secs(5);

fn main() -> ExitCode {
    harness::run(
        "purge",
        |c| {
            c.members = 2;
            c.nodes_per_member = 2;
            c.gpus_per_node = 8;
        },
        vec![E2eTest::new(
            "directly_waits_for_the_old_copy_gone_and_never_for_confirm_purge_carrying_the_checkpoint",
            purge,
        )],
    )
}

/// The AppWrappers of `namespace` in `member`.
async fn appwrappers_in(
    ctx: &TestContext,
    member: &str,
    namespace: &str,
) -> Result<Api<DynamicObject>, TestError> {
    Ok(Api::namespaced_with(
        ctx.client(member).await?,
        namespace,
        &appwrapper_resource(),
    ))
}

/// Creates AppWrapper `name` on the hub: one pod of one GPU, no retries, no failure grace.
async fn create_appwrapper(hub: &Api<DynamicObject>, ns: &str, name: &str) -> TestResult {
    let mut aw = serde_json::to_value(support::appwrapper(
        name,
        &[("retryLimit", "0"), ("failureGracePeriodDuration", "0s")],
        vec![support::job(&format!("{name}-job"), "sleep 3600", 1, 1)],
    )?)?;
    aw["metadata"]["namespace"] = json!(ns);
    hub.create(&PostParams::default(), &serde_json::from_value(aw)?)
        .await?;
    Ok(())
}

async fn until_running(api: &Api<DynamicObject>, name: &str, where_: &str) -> TestResult {
    wait::until(&format!("{name} Running {where_}"), T, || async {
        match phase_in(api, name).await?.as_deref() {
            Some("Running") => Ok(()),
            p => Err(format!("phase {p:?}")),
        }
    })
    .await?;
    Ok(())
}

async fn until_gone(api: &Api<DynamicObject>, name: &str, what: &str) -> TestResult {
    wait::until(what, T, || async {
        match phase_in(api, name).await? {
            None => Ok(()),
            Some(p) => Err(format!("still there ({p})")),
        }
    })
    .await?;
    Ok(())
}

/// An AppWrapper placed and Running: the cluster it runs in, the other member, and the
/// AppWrappers of both.
struct Placed {
    old: String,
    new: String,
    old_api: Api<DynamicObject>,
    new_api: Api<DynamicObject>,
}

/// Creates AppWrapper `name` on the hub (`appwrappers`, of namespace `ns`) and waits until it
/// runs where it is placed.
async fn create_and_run(
    ctx: &TestContext,
    (appwrappers, bindings): (&Api<DynamicObject>, &Api<ResourceBinding>),
    members: &[String],
    ns: &str,
    name: &str,
) -> Result<Placed, TestError> {
    create_appwrapper(appwrappers, ns, name).await?;
    let old = until_placed_on_one(bindings, name, T).await?;
    let new = members
        .iter()
        .find(|m| **m != old)
        .cloned()
        .ok_or("no other member")?;
    let placed = Placed {
        old_api: appwrappers_in(ctx, &old, ns).await?,
        new_api: appwrappers_in(ctx, &new, ns).await?,
        old,
        new,
    };
    until_running(&placed.old_api, name, "where it was placed").await?;
    Ok(placed)
}

/// Waits until `name` is placed on `to` only; returns its eviction record of `from`.
async fn until_moved(
    bindings: &Api<ResourceBinding>,
    name: &str,
    from: &str,
    to: &str,
) -> Result<EvictionRecord, TestError> {
    let moved = wait::until(&format!("{name} moved to {to}"), SLACK, || async {
        let b = binding_of(bindings, name).await?;
        if placement(&b) == [to.to_string()] {
            Ok(b)
        } else {
            Err(format!(
                "clusters {:?}, tasks {:?}",
                placement(&b),
                b.spec.graceful_eviction_tasks
            ))
        }
    })
    .await?;
    Ok(moved
        .spec
        .eviction_history
        .into_iter()
        .find(|r| r.cluster_name == from)
        .ok_or_else(|| format!("no eviction record of {name} for {from}"))?)
}

/// What the poller of part 1 saw.
#[derive(Default)]
struct Seen {
    polls: AtomicUsize,
    /// Most members holding a copy (the AppWrapper object) at once.
    most_copies: AtomicUsize,
    /// Most members with live pods at once.
    most_with_pods: AtomicUsize,
    /// The binding's goneAt for the old cluster and the task's purgedAt, when first seen.
    gone_at: std::sync::Mutex<Option<Time>>,
    purged_at: std::sync::Mutex<Option<Time>>,
}

async fn purge(ctx: Arc<TestContext>) -> TestResult {
    let dir = tempfile_dir(&ctx.namespace)?;
    let hub = ctx.client("hub").await?;
    lifeboat_agent::install::ensure_crd(&hub).await?;
    let hub_url = start_hub(&ctx).await?;
    bootstrap(&hub, &dir).await?;
    let members = ctx.fleet.member_names();
    let mut agents = BTreeMap::new();
    for member in &members {
        agents.insert(
            member.clone(),
            start_agent(&ctx, member, &hub_url, &dir, &region(&members, member)).await?,
        );
    }
    support::hub::until_clusters_ready(&hub, members.iter()).await?;
    let ns = ctx.namespace("hub").await?;
    for member in &members {
        ctx.namespace(member).await?;
    }
    let appwrappers: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &ns, &appwrapper_resource());
    let bindings: Api<ResourceBinding> = Api::namespaced(hub.clone(), &ns);

    let suite = Suite {
        ctx,
        hub,
        ns,
        members,
        appwrappers,
        bindings,
        hub_url,
        dir,
        agents: tokio::sync::Mutex::new(agents),
    };
    directly(&suite).await?;
    never_with_checkpoint(&suite).await?;
    Ok(())
}

/// What both parts share: the hub, the test's namespace there, the members and their agents.
struct Suite {
    ctx: Arc<TestContext>,
    hub: kube::Client,
    ns: String,
    members: Vec<String>,
    appwrappers: Api<DynamicObject>,
    bindings: Api<ResourceBinding>,
    hub_url: String,
    /// The agents' files (hub CA, bootstrap token).
    dir: PathBuf,
    agents: tokio::sync::Mutex<BTreeMap<String, SpawnedAgent>>,
}

/// Each member's region (the first is in us-east-1).
fn region(members: &[String], member: &str) -> String {
    if members.first().is_some_and(|m| m == member) {
        "us-east-1".into()
    } else {
        "eu-west-1".into()
    }
}

impl Suite {
    /// Kills `member`'s agent (no shutdown of any kind) and starts a new one, which knows
    /// nothing of the works the old one had.
    async fn restart_agent(&self, member: &str) -> TestResult {
        let mut agents = self.agents.lock().await;
        if let Some(old) = agents.remove(member) {
            old.abort().await;
        }
        let region = region(&self.members, member);
        let new = start_agent(&self.ctx, member, &self.hub_url, &self.dir, &region).await?;
        agents.insert(member.to_string(), new);
        Ok(())
    }
}

/// A finalizer of the test's: the object it holds is deleted (deletionTimestamp set, its
/// dependents removed) but stays served until the test lets it go.
const HOLD: &str = "e2e.lifeboat.dev/hold";

/// Adds (`true`) or removes the test's finalizer on AppWrapper `name` (read-modify-write with
/// the resourceVersion: its controller's finalizer is kept).
async fn hold(api: &Api<DynamicObject>, name: &str, on: bool) -> TestResult {
    wait::until(&format!("{HOLD} set to {on} on {name}"), T, || async {
        let aw = api.get(name).await.map_err(|e| e.to_string())?;
        let mut finalizers = aw.metadata.finalizers.clone().unwrap_or_default();
        finalizers.retain(|f| f != HOLD);
        if on {
            finalizers.push(HOLD.to_string());
        }
        let patch = json!({"metadata": {"resourceVersion": aw.metadata.resource_version,
                                        "finalizers": finalizers}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await?;
    Ok(())
}

/// Part 1: Directly.
async fn directly(suite: &Suite) -> TestResult {
    let Suite {
        ctx,
        hub,
        ns,
        members,
        appwrappers,
        bindings,
        ..
    } = suite;
    lifeboat_e2e::fleet::lifeboat::apply_propagation_policy(
        hub,
        ns,
        "directly",
        json!({
            "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "train"}],
            "failover": {"application": {
                "decisionConditions": {"tolerationSeconds": 0},
                "purgeMode": "Directly",
                "blockPredecessorSeconds": 0
            }}
        }),
    )
    .await?;
    let Placed {
        old,
        new,
        old_api,
        new_api,
    } = create_and_run(ctx, (appwrappers, bindings), members, ns, "train").await?;

    // Both members and the binding, polled until the move is over.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Seen::default());
    let poller = {
        let (ctx, stop, seen) = (ctx.clone(), stop.clone(), seen.clone());
        let (members, bindings, old, ns) = (
            members.to_vec(),
            bindings.clone(),
            old.clone(),
            ns.to_string(),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let (mut copies, mut with_pods) = (0, 0);
                for member in &members {
                    let api = appwrappers_in(&ctx, member, &ns)
                        .await
                        .map_err(|e| e.to_string())?;
                    if api
                        .get_opt("train")
                        .await
                        .map_err(|e| format!("polling {member}: {e}"))?
                        .is_some()
                    {
                        copies += 1;
                    }
                    let pods = support::pods_of(&ctx, member, "train")
                        .await
                        .map_err(|e| format!("polling {member}: {e}"))?;
                    if live(&pods) > 0 {
                        with_pods += 1;
                    }
                }
                seen.most_copies.fetch_max(copies, Ordering::SeqCst);
                seen.most_with_pods.fetch_max(with_pods, Ordering::SeqCst);
                if let Ok(b) = binding_of(&bindings, "train").await {
                    let gone = b.cluster_status(&old).and_then(|i| i.gone_at.clone());
                    let purged = b
                        .spec
                        .graceful_eviction_tasks
                        .iter()
                        .find(|t| t.from_cluster == old)
                        .and_then(|t| t.purged_at.clone());
                    for (slot, value) in [(&seen.gone_at, gone), (&seen.purged_at, purged)] {
                        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
                        if slot.is_none() {
                            *slot = value;
                        }
                    }
                }
                seen.polls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok::<(), String>(())
        })
    };

    // The old copy's deletion will be held (a finalizer of the test's), so the hub is seen to
    // wait while the old copy is only being deleted, and its agent restarts meanwhile.
    hold(&old_api, "train", true).await?;
    let broken = fail_on_broken_nodes(ctx, &old, ns, "train").await?;
    let record = until_moved(bindings, "train", &old, &new).await?;
    if record.reason != EVICTION_APPLICATION_FAILURE {
        return Err(format!("eviction record {record:?}").into());
    }
    wait::until("the old copy being deleted, held", T, || async {
        let aw = old_api
            .get_opt("train")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the old copy is gone: the hold did not hold")?;
        if aw.metadata.deletion_timestamp.is_some() {
            Ok(())
        } else {
            Err("not being deleted yet".to_string())
        }
    })
    .await?;
    let deadline = tokio::time::Instant::now() + STAYS;
    while tokio::time::Instant::now() < deadline {
        let b = binding_of(bindings, "train").await?;
        let blocked = b
            .condition(CONDITION_FAILOVER_BLOCKED)
            .map(|c| c.reason.clone());
        let purged = b
            .spec
            .graceful_eviction_tasks
            .iter()
            .any(|t| t.from_cluster == old && t.purged_at.is_some());
        if purged || new_api.get_opt("train").await?.is_some() {
            return Err(format!(
                "the new copy went ahead while the old one was only being deleted (purged {purged}, FailoverBlocked {blocked:?})"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let b = binding_of(bindings, "train").await?;
    let blocked = b
        .condition(CONDITION_FAILOVER_BLOCKED)
        .map(|c| (c.status.clone(), c.reason.clone()));
    if blocked != Some(("True".into(), BLOCKED_WAITING_FOR_PURGE.into())) {
        return Err(format!("while waiting: FailoverBlocked {blocked:?}").into());
    }
    // A new agent (it never had the work) learns the purge from its snapshot, finds the old
    // copy by its labels and reports it gone once it is.
    suite.restart_agent(&old).await?;
    hold(&old_api, "train", false).await?;
    until_running(&new_api, "train", "in the other member").await?;
    until_gone(&old_api, "train", "the old copy gone").await?;
    wait::until("the eviction task done", T, || async {
        let b = binding_of(bindings, "train").await?;
        if b.spec.graceful_eviction_tasks.is_empty() {
            Ok(())
        } else {
            Err(format!("tasks {:?}", b.spec.graceful_eviction_tasks))
        }
    })
    .await?;
    stop.store(true, Ordering::SeqCst);
    poller.await.map_err(|e| e.to_string())??;
    repair_nodes(ctx, &old, &broken).await?;

    let polls = seen.polls.load(Ordering::SeqCst);
    let most_copies = seen.most_copies.load(Ordering::SeqCst);
    let most_with_pods = seen.most_with_pods.load(Ordering::SeqCst);
    if polls < 10 || most_copies != 1 || most_with_pods > 1 {
        return Err(format!(
            "over {polls} polls: at most {most_copies} members held a copy of train at once \
             (want exactly 1), at most {most_with_pods} had live pods (want at most 1)"
        )
        .into());
    }
    let gone_at = seen
        .gone_at
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .ok_or("the binding never recorded the old copy gone (goneAt)")?;
    let purged_at = seen
        .purged_at
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .ok_or("the eviction task was never purged (purgedAt)")?;
    let created = new_api
        .get("train")
        .await?
        .metadata
        .creation_timestamp
        .ok_or("the new copy has no creationTimestamp")?;
    // Whole seconds on the wire: equal seconds are in order; the poller proved the order.
    if created.0 < gone_at.0 || created.0 < purged_at.0 || purged_at.0 < gone_at.0 {
        return Err(format!(
            "the new copy was created at {} but the old one was reported gone at {} and the task \
             purged at {}",
            created.0, gone_at.0, purged_at.0
        )
        .into());
    }
    tracing::info!(
        polls,
        gone_at = %gone_at.0,
        purged_at = %purged_at.0,
        created = %created.0,
        "Directly: the new copy after the old one was gone"
    );
    // train goes, so that part 2 breaks no node under it.
    appwrappers
        .delete("train", &kube::api::DeleteParams::default())
        .await?;
    until_gone(&new_api, "train", "train removed from the other member").await?;
    Ok(())
}

/// Part 2: Never, with the checkpoint carried over.
async fn never_with_checkpoint(suite: &Suite) -> TestResult {
    let Suite {
        ctx,
        hub,
        ns,
        members,
        appwrappers,
        bindings,
        ..
    } = suite;
    // The hub reflects the checkpoint (the message of the Checkpointed condition) besides what
    // the built-in rule reflects.
    let customization: ResourceInterpreterCustomization = serde_json::from_value(json!({
        "apiVersion": "config.lifeboat.dev/v1alpha1", "kind": "ResourceInterpreterCustomization",
        "metadata": {"name": "appwrapper-checkpoint"},
        "spec": {
            "target": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper"},
            "customizations": {"statusReflection": {"luaScript": r#"
function ReflectStatus(observedObj)
  local status = {}
  local s = observedObj.status
  if s == nil then
    return status
  end
  status.phase = s.phase
  status.resettingCount = s.resettingCount
  status.conditions = s.conditions
  if s.conditions ~= nil then
    for _, c in ipairs(s.conditions) do
      if c.type == "Checkpointed" then
        status.checkpoint = c.message
      end
    end
  end
  return status
end
"#}}
        }
    }))?;
    Api::<ResourceInterpreterCustomization>::all(hub.clone())
        .patch(
            "appwrapper-checkpoint",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&customization),
        )
        .await?;
    lifeboat_e2e::fleet::lifeboat::apply_propagation_policy(
        hub,
        ns,
        "never",
        json!({
            "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "resume"}],
            "failover": {"application": {
                "decisionConditions": {"tolerationSeconds": 0},
                "purgeMode": "Never",
                "blockPredecessorSeconds": 0,
                "statePreservation": {"rules": [
                    {"aliasLabelName": CHECKPOINT_LABEL, "jsonPath": "{.checkpoint}"}
                ]}
            }}
        }),
    )
    .await?;
    let Placed {
        old,
        new,
        old_api,
        new_api,
    } = create_and_run(ctx, (appwrappers, bindings), members, ns, "resume").await?;

    // The job checkpoints: a condition on the AppWrapper in its member, through the status
    // subresource (with the resourceVersion: the agent's controller writes status too).
    wait::until("the checkpoint written in the member", T, || async {
        let aw = old_api.get("resume").await.map_err(|e| e.to_string())?;
        let mut conditions: Vec<Value> = aw.data["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        conditions.retain(|c| c["type"] != "Checkpointed");
        conditions.push(json!({
            "type": "Checkpointed", "status": "True", "reason": "Saved", "message": CHECKPOINT,
            "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
        }));
        let patch = json!({"metadata": {"resourceVersion": aw.metadata.resource_version},
                           "status": {"conditions": conditions}});
        old_api
            .patch_status("resume", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await?;
    wait::until("the checkpoint reflected in the binding", T, || async {
        let b = binding_of(bindings, "resume").await?;
        let reflected = b
            .cluster_status(&old)
            .and_then(|i| i.status.as_ref())
            .and_then(|s| s.get("checkpoint"))
            .cloned();
        if reflected == Some(json!(CHECKPOINT)) {
            Ok(())
        } else {
            Err(format!("reflected checkpoint {reflected:?}"))
        }
    })
    .await?;

    let broken = fail_on_broken_nodes(ctx, &old, ns, "resume").await?;
    let record = until_moved(bindings, "resume", &old, &new).await?;
    if record
        .preserved_label_state
        .get(CHECKPOINT_LABEL)
        .map(String::as_str)
        != Some(CHECKPOINT)
    {
        return Err(format!(
            "the eviction record preserved {:?}",
            record.preserved_label_state
        )
        .into());
    }
    // The new copy resumes from the checkpoint: it carries it as a label.
    until_running(&new_api, "resume", "in the other member").await?;
    let label = |aw: &DynamicObject| {
        aw.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(CHECKPOINT_LABEL))
            .cloned()
    };
    let carried = label(&new_api.get("resume").await?);
    if carried.as_deref() != Some(CHECKPOINT) {
        return Err(format!("the new copy's {CHECKPOINT_LABEL} label is {carried:?}").into());
    }

    // Never: the old copy stays, also once the new one is Healthy (Gracefully would remove it
    // then), and the binding says it waits for a confirmation.
    wait::until(
        "the new copy Healthy, the binding waiting for confirm-purge",
        T,
        || async {
            let b = binding_of(bindings, "resume").await?;
            let healthy = b
                .cluster_status(&new)
                .is_some_and(|i| i.health.as_str() == "Healthy");
            let blocked = b
                .condition(CONDITION_FAILOVER_BLOCKED)
                .map(|c| (c.status.clone(), c.reason.clone()));
            if healthy
                && blocked == Some(("True".into(), BLOCKED_WAITING_FOR_PURGE_CONFIRMATION.into()))
            {
                Ok(())
            } else {
                Err(format!(
                    "new copy healthy {healthy}, FailoverBlocked {blocked:?}"
                ))
            }
        },
    )
    .await?;
    let deadline = tokio::time::Instant::now() + STAYS;
    while tokio::time::Instant::now() < deadline {
        if phase_in(&old_api, "resume").await?.is_none() {
            return Err("the old copy of a Never eviction went without a confirmation".into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let b = binding_of(bindings, "resume").await?;
    if !b
        .spec
        .graceful_eviction_tasks
        .iter()
        .any(|t| t.from_cluster == old && t.purge_mode.map(|m| m.as_str()) == Some("Never"))
    {
        return Err(format!(
            "no Never task for {old}: {:?}",
            b.spec.graceful_eviction_tasks
        )
        .into());
    }

    // confirm-purge: the annotation lifeboatctl writes (a merge patch with the resourceVersion).
    let name = b.metadata.name.clone().ok_or("the binding has no name")?;
    bindings
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {
                "resourceVersion": b.metadata.resource_version,
                "annotations": {ANNOTATION_CONFIRM_PURGE: old},
            }})),
        )
        .await?;
    until_gone(&old_api, "resume", "the old copy gone after confirm-purge").await?;
    wait::until("the task and the confirmation gone", T, || async {
        let b = binding_of(bindings, "resume").await?;
        let annotation = b
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_CONFIRM_PURGE))
            .cloned();
        if b.spec.graceful_eviction_tasks.is_empty() && annotation.is_none() {
            Ok(())
        } else {
            Err(format!(
                "tasks {:?}, annotation {annotation:?}",
                b.spec.graceful_eviction_tasks
            ))
        }
    })
    .await?;
    // The new copy kept its label once the task was gone (the history record carries it).
    let after = new_api.get("resume").await?;
    if label(&after).as_deref() != Some(CHECKPOINT) || phase_in(&new_api, "resume").await?.is_none()
    {
        return Err(format!(
            "after the purge the new copy's label is {:?}",
            label(&after)
        )
        .into());
    }
    repair_nodes(ctx, &old, &broken).await?;
    Ok(())
}
