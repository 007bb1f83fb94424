//! In-place resets on the local fleet (hub + 2 members), with the real hub and one agent per
//! member in hub mode, in this process (as in the failover suite). Scenario 11 of issue 9:
//!
//! 1. A PyTorchJob under a policy with `failover.application {decisionConditions:
//!    {tolerationSeconds: 0}, inPlaceReset: {limit: 2, pauseSeconds: 1}}` fails in its member
//!    (there is no training operator on the fleet: the test writes the `Failed` condition
//!    through the status subresource, as the operator would). It is reset in place: the agent
//!    deletes it and creates it again (a new UID in the same member, annotated with the reset
//!    generation), the binding records the reset, the ledger, an Event and the hub's counter
//!    show it. Twice; the third failure moves it to the other member, with an eviction record.
//! 2. A manual reset of the moved, healthy PyTorchJob with the built `lifeboatctl reset`
//!    re-creates it once in its member and does not move it; asked in the cluster it left,
//!    `lifeboatctl reset` fails naming the one it is on.
//! 3. A reset its member cannot carry out (a finalizer the test set holds the old object) is
//!    given up after `inPlaceReset.timeoutSeconds` (5 s here), and the job moves to the other
//!    member with an `InPlaceResetTimedOut` eviction record.
//!
//! One test: the suite shares one hub cluster, and one hub binds it. Needs the built
//! `lifeboatctl`: `cargo build -p lifeboatctl` (`make lifeboat-bins`).

mod support;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use lifeboat_api::binding::{
    ANNOTATION_RESET_GENERATION, EVICTION_APPLICATION_FAILURE, EVICTION_RESET_TIMED_OUT,
    ResourceBinding, ResourceHealth,
};
use lifeboat_api::health::FailureClass;
use lifeboat_e2e::fleet::lifeboat::lifeboat_bin_dir;
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestError, TestResult};
use lifeboat_e2e::wait;
use lifeboat_ledger::{EventKind, Ledger};
use serde_json::{Value, json};
use support::hub::{
    binding_of, install_operator_crd, member_api, placement, start_hub_with, tempfile_dir,
    two_agents, until_placed_on_one,
};
use support::{T, metric, metrics_text};

const JOB: &str = "train";
const BINDING: &str = "train-pytorchjob";
/// The job of part 3, whose old copy a finalizer holds.
const HELD: &str = "held";
const FINALIZER: &str = "e2e.lifeboat.dev/hold";

fn main() -> ExitCode {
    harness::run(
        "reset",
        |c| {
            c.members = 2;
            c.nodes_per_member = 2;
        },
        vec![E2eTest::new(
            "a_failing_pytorchjob_is_reset_in_place_twice_then_moved_a_manual_reset_recreates_it_once_and_a_reset_that_cannot_complete_moves_it",
            reset,
        )],
    )
}

fn pytorchjob_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("kubeflow.org", "v1", "PyTorchJob"))
}

/// A PyTorchJob with one master and one worker (no operator runs it: no pods).
fn pytorchjob(namespace: &str, name: &str) -> Value {
    let role = json!({"replicas": 1, "restartPolicy": "OnFailure", "template": {"spec": {
        "containers": [{"name": "pytorch", "image": "busybox", "command": ["sh", "-c", "sleep 3600"],
                        "resources": {"requests": {"cpu": "100m"}}}]}}});
    json!({
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"pytorchReplicaSpecs": {"Master": role, "Worker": role}}
    })
}

/// The job in a member: its UID and reset annotation, if it exists.
async fn job_in(
    api: &Api<DynamicObject>,
    name: &str,
) -> Result<Option<(String, Option<String>)>, String> {
    Ok(api
        .get_opt(name)
        .await
        .map_err(|e| e.to_string())?
        .map(|o| {
            let generation = o
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_RESET_GENERATION))
                .cloned();
            (o.metadata.uid.unwrap_or_default(), generation)
        }))
}

/// Waits for the job in a member with a UID other than `old` (if given); returns its UID.
async fn new_copy(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    old: Option<&str>,
    generation: Option<&str>,
) -> Result<String, TestError> {
    Ok(wait::until(what, T, || async {
        match job_in(api, name).await? {
            Some((uid, g)) if Some(uid.as_str()) != old && g.as_deref() == generation => Ok(uid),
            other => Err(format!("job (uid, reset generation) {other:?}")),
        }
    })
    .await?)
}

/// Writes the job's conditions through the status subresource, as the training operator does;
/// only on the copy with this UID.
async fn set_conditions(
    api: &Api<DynamicObject>,
    name: &str,
    uid: &str,
    conditions: Value,
) -> TestResult {
    let current = api.get(name).await?;
    if current.metadata.uid.as_deref() != Some(uid) {
        return Err(format!(
            "the job is {:?}, not the copy {uid} the test meant",
            current.metadata.uid
        )
        .into());
    }
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": conditions}})),
    )
    .await?;
    Ok(())
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    json!({"type": type_, "status": status, "reason": reason, "message": message,
           "lastUpdateTime": now, "lastTransitionTime": now})
}

/// The conditions of a failed job: its worker's pod was lost with its node (the message the
/// training operator writes, with the node named).
fn failed(namespace: &str, name: &str) -> Value {
    let message = format!(
        "PyTorchJob {namespace}/{name} is failed because 1 Worker replica(s) failed: pod {name}-worker-0 was lost with its node (NodeNotReady)."
    );
    json!([
        condition("Created", "True", "PyTorchJobCreated", "created"),
        condition("Running", "False", "PyTorchJobRunning", "not running"),
        condition("Failed", "True", "PyTorchJobFailed", &message),
    ])
}

/// The conditions of a running job.
fn running() -> Value {
    json!([
        condition("Created", "True", "PyTorchJobCreated", "created"),
        condition("Running", "True", "PyTorchJobRunning", "running"),
    ])
}

/// A job the hub placed on one of two members, with its copy there.
struct PlacedJob<'m> {
    /// The member it was placed on.
    at: String,
    /// The other member.
    other: &'m String,
    /// The job's objects in `at` and in `other`.
    here: Api<DynamicObject>,
    there: Api<DynamicObject>,
    /// The UID of its copy in `at`.
    uid: String,
}

/// Creates job `name` on the hub and waits until it is placed on one of `members` and its copy
/// exists there.
async fn create_and_place<'m>(
    ctx: &TestContext,
    jobs: &Api<DynamicObject>,
    bindings: &Api<ResourceBinding>,
    name: &str,
    members: [&'m String; 2],
) -> Result<PlacedJob<'m>, TestError> {
    jobs.create(
        &PostParams::default(),
        &serde_json::from_value(pytorchjob(&ctx.namespace, name))?,
    )
    .await?;
    let at = until_placed_on_one(bindings, name, T).await?;
    let other = if &at == members[0] {
        members[1]
    } else {
        members[0]
    };
    let here = member_api(ctx, &at, &pytorchjob_resource()).await?;
    let there = member_api(ctx, other, &pytorchjob_resource()).await?;
    let uid = new_copy(&here, name, &format!("{name} in its member"), None, None).await?;
    Ok(PlacedJob {
        at,
        other,
        here,
        there,
        uid,
    })
}

/// The binding's reset record of `cluster`: (generation, count, manual request).
fn record(b: &ResourceBinding, cluster: &str) -> Option<(i64, i32, Option<String>)> {
    b.spec
        .in_place_resets
        .iter()
        .find(|r| r.cluster_name == cluster)
        .map(|r| (r.generation, r.count, r.manual_request.clone()))
}

/// The reset generation the hub knows `cluster`'s copy was re-created for.
fn reported(b: &ResourceBinding, cluster: &str) -> Option<i64> {
    b.cluster_status(cluster).and_then(|i| i.reset_generation)
}

async fn hub_counter(metrics: SocketAddr, reason: &str) -> Result<f64, String> {
    let text = metrics_text(metrics).await?;
    Ok(metric(
        &text,
        &format!("lifeboat_hub_in_place_resets_total{{reason=\"{reason}\"}}"),
    )
    .unwrap_or(0.0))
}

async fn reset(ctx: Arc<TestContext>) -> TestResult {
    let dir = tempfile_dir(&ctx.namespace)?;
    let hub = ctx.client("hub").await?;
    let members = ctx.fleet.member_names();
    let [first, second] = members.as_slice() else {
        return Err("the fleet needs two members".into());
    };
    for cluster in ["hub", first.as_str(), second.as_str()] {
        install_operator_crd(&ctx.client(cluster).await?, &pytorchjob_resource()).await?;
    }
    let metrics: SocketAddr = ([127, 0, 0, 1], lifeboat_e2e::ports::free_port()?).into();
    let hub_url = start_hub_with(&ctx, |o| o.metrics_bind = Some(metrics)).await?;
    let _agents = two_agents(&ctx, &hub, &hub_url, &dir, [first, second]).await?;
    let ns = ctx.namespace.clone();
    lifeboat_e2e::fleet::lifeboat::apply_propagation_policy(
        &hub,
        &ns,
        "reset",
        json!({
            "resourceSelectors": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"}],
            "failover": {"application": {
                "decisionConditions": {"tolerationSeconds": 0},
                "inPlaceReset": {"limit": 2, "pauseSeconds": 1},
                "purgeMode": "Gracefully",
                "gracePeriodSeconds": 600
            }}
        }),
    )
    .await?;
    let jobs: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &ns, &pytorchjob_resource());
    let bindings: Api<ResourceBinding> = Api::namespaced(hub.clone(), &ns);
    let PlacedJob {
        at: placed,
        other,
        here,
        there,
        mut uid,
    } = create_and_place(&ctx, &jobs, &bindings, JOB, [first, second]).await?;

    // 1. Two failures: two resets in place.
    for generation in 1..=2_i64 {
        set_conditions(&here, JOB, &uid, failed(&ns, JOB)).await?;
        let previous = uid.clone();
        uid = new_copy(
            &here,
            JOB,
            &format!("reset {generation}: a new copy in {placed}"),
            Some(&previous),
            Some(&generation.to_string()),
        )
        .await?;
        let b = wait::until(
            &format!("reset {generation} recorded and reported done"),
            T,
            || async {
                let b = binding_of(&bindings, JOB).await?;
                let state = (record(&b, &placed), reported(&b, &placed));
                if state
                    == (
                        Some((generation, generation as i32, None)),
                        Some(generation),
                    )
                {
                    Ok(b)
                } else {
                    Err(format!("(record, reported generation) {state:?}"))
                }
            },
        )
        .await?;
        if placement(&b) != [placed.clone()] || !b.spec.eviction_history.is_empty() {
            return Err(format!(
                "reset {generation}: clusters {:?}, evictions {:?}",
                placement(&b),
                b.spec.eviction_history
            )
            .into());
        }
        if job_in(&there, JOB).await?.is_some() {
            return Err(format!("reset {generation}: a copy appeared in {other}").into());
        }
        tracing::info!(generation, %uid, "reset in place");
    }
    let failure_resets = hub_counter(metrics, "failure").await?;
    if failure_resets != 2.0 {
        return Err(format!(
            "lifeboat_hub_in_place_resets_total{{reason=failure}} = {failure_resets}"
        )
        .into());
    }

    // The third failure: the limit is used up, it moves.
    set_conditions(&here, JOB, &uid, failed(&ns, JOB)).await?;
    let moved = wait::until("the job moved to the other member", T, || async {
        let b = binding_of(&bindings, JOB).await?;
        if placement(&b) == [other.clone()] {
            Ok(b)
        } else {
            Err(format!("clusters {:?}", placement(&b)))
        }
    })
    .await?;
    let eviction = moved
        .spec
        .eviction_history
        .iter()
        .find(|r| r.cluster_name == placed)
        .ok_or("no eviction record for the first member")?;
    // The built-in PyTorchJob interpreter gives class Unknown for Failed: a class that moves.
    if eviction.reason != EVICTION_APPLICATION_FAILURE
        || eviction
            .failure_class
            .is_none_or(|c| c == FailureClass::Application)
        || moved.spec.eviction_history.len() != 1
        || !moved.spec.in_place_resets.is_empty()
    {
        return Err(format!(
            "after the move: history {:?}, resets {:?}",
            moved.spec.eviction_history, moved.spec.in_place_resets
        )
        .into());
    }
    let moved_uid = new_copy(&there, JOB, "the job in the other member", None, None).await?;

    // The ledger and the Events show both resets.
    let ledger = Ledger::connect(&format!("sqlite://{}", dir.join("ledger.db").display())).await?;
    wait::until("the ledger records both resets", T, || async {
        let history = ledger
            .history_of_binding(&ns, BINDING, 500)
            .await
            .map_err(|e| e.to_string())?;
        let resets: Vec<(i64, String)> = history
            .iter()
            .filter(|r| {
                r.event.kind == EventKind::Decision
                    && r.event.to.as_deref() == Some("InPlaceReset")
                    && r.event.cluster.as_deref() == Some(placed.as_str())
            })
            .map(|r| {
                (
                    r.event.details["generation"].as_i64().unwrap_or(0),
                    r.event.reason.clone().unwrap_or_default(),
                )
            })
            .collect();
        let asked = history
            .iter()
            .filter(|r| {
                r.event.kind == EventKind::Dispatch
                    && r.event.reason.as_deref() == Some("ResetRequested")
            })
            .count();
        if resets == [(1, "Failure".to_string()), (2, "Failure".to_string())] && asked == 2 {
            Ok(())
        } else {
            Err(format!(
                "reset decisions {resets:?}, reset dispatches {asked}"
            ))
        }
    })
    .await?;
    let events: Api<Event> = Api::namespaced(hub.clone(), &ns);
    let reset_events = |events: Vec<Event>| -> Vec<String> {
        events
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some("InPlaceReset")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(BINDING)
            })
            .map(|e| e.note.unwrap_or_default())
            .collect()
    };
    wait::until("an InPlaceReset Event per reset", T, || async {
        let notes = reset_events(
            events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items,
        );
        let failures = notes
            .iter()
            .filter(|n| n.contains(placed.as_str()) && n.contains("of 2"))
            .count();
        if failures == 2 {
            Ok(())
        } else {
            Err(format!("notes {notes:?}"))
        }
    })
    .await?;

    // 2. A manual reset of the healthy copy: re-created once, not moved.
    set_conditions(&there, JOB, &moved_uid, running()).await?;
    wait::until(
        "the moved job Healthy and the old copy's task done",
        T,
        || async {
            let b = binding_of(&bindings, JOB).await?;
            let health = b.cluster_status(other).map(|i| i.health);
            if health == Some(ResourceHealth::Healthy) && b.spec.graceful_eviction_tasks.is_empty()
            {
                Ok(())
            } else {
                Err(format!(
                    "health {health:?}, tasks {:?}",
                    b.spec.graceful_eviction_tasks
                ))
            }
        },
    )
    .await?;
    wait::until("the old copy withdrawn", T, || async {
        match job_in(&here, JOB).await? {
            None => Ok(()),
            Some(copy) => Err(format!("still there: {copy:?}")),
        }
    })
    .await?;
    let binding_arg = format!("{ns}/{BINDING}");
    let (code, _, stderr) =
        lifeboatctl(&ctx, &["reset", &binding_arg, "--cluster", placed.as_str()]).await?;
    let refused = format!(
        "error: --cluster {placed}: ResourceBinding {binding_arg} is not placed there (spec.clusters: {other})\n"
    );
    if (code, stderr.as_str()) != (Some(2), refused.as_str()) {
        return Err(
            format!("a reset asked where it is not placed: exit {code:?}, {stderr:?}").into(),
        );
    }
    let (code, stdout, stderr) = lifeboatctl(&ctx, &["reset", &binding_arg]).await?;
    let said = format!(
        "asked for an in-place reset of {binding_arg} in {other} (work.lifeboat.dev/reset-request="
    );
    let asked_value = stdout
        .strip_prefix(said.as_str())
        .and_then(|rest| rest.strip_suffix(")\n"))
        .filter(|value| code == Some(0) && value.starts_with(&format!("{other}/")))
        .ok_or_else(|| format!("lifeboatctl reset: exit {code:?}, {stdout:?} {stderr:?}"))?
        .to_string();
    let reset_uid = new_copy(
        &there,
        JOB,
        "the manual reset's new copy",
        Some(&moved_uid),
        Some("1"),
    )
    .await?;
    let b = wait::until("the manual reset recorded and reported done", T, || async {
        let b = binding_of(&bindings, JOB).await?;
        let state = (record(&b, other), reported(&b, other));
        if state == (Some((1, 0, Some(asked_value.clone()))), Some(1)) {
            Ok(b)
        } else {
            Err(format!("(record, reported generation) {state:?}"))
        }
    })
    .await?;
    if placement(&b) != [other.clone()] || b.spec.eviction_history.len() != 1 {
        return Err(format!(
            "after the manual reset: clusters {:?}, history {:?}",
            placement(&b),
            b.spec.eviction_history
        )
        .into());
    }
    wait::until("the manual reset counted", T, || async {
        match hub_counter(metrics, "manual").await? {
            1.0 => Ok(()),
            n => Err(format!(
                "lifeboat_hub_in_place_resets_total{{reason=manual}} = {n}"
            )),
        }
    })
    .await?;
    // Served once: the hub's record of the request stays, and nothing re-creates the copy again
    // (the request is served, and the report says the reset is done).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let b = binding_of(&bindings, JOB).await?;
    let now = job_in(&there, JOB).await?;
    if record(&b, other).map(|r| r.0) != Some(1)
        || now.as_ref().map(|(u, _)| u.as_str()) != Some(reset_uid.as_str())
        || job_in(&here, JOB).await?.is_some()
    {
        return Err(format!(
            "after the manual reset: record {:?}, job {now:?}",
            record(&b, other)
        )
        .into());
    }

    // 3. A reset its member cannot carry out: a finalizer nobody removes holds the old object.
    //    A second policy (a higher priority, for this job only) gives up after 5 s: the job moves.
    lifeboat_e2e::fleet::lifeboat::apply_propagation_policy(
        &hub,
        &ns,
        "reset-timeout",
        json!({
            "resourceSelectors": [
                {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": HELD}
            ],
            "priority": 10,
            "failover": {"application": {
                "decisionConditions": {"tolerationSeconds": 0},
                "inPlaceReset": {"limit": 1, "timeoutSeconds": 5},
                "purgeMode": "Gracefully",
                "gracePeriodSeconds": 600
            }}
        }),
    )
    .await?;
    let PlacedJob {
        at: held_at,
        other: held_to,
        here: held_here,
        there: held_there,
        uid: held_uid,
    } = create_and_place(&ctx, &jobs, &bindings, HELD, [first, second]).await?;
    held_here
        .patch(
            HELD,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": [FINALIZER]}})),
        )
        .await?;
    set_conditions(&held_here, HELD, &held_uid, failed(&ns, HELD)).await?;
    let timed_out = async {
        let moved = wait::until("the held job's reset timed out and it moved", T, || async {
            let b = binding_of(&bindings, HELD).await?;
            if placement(&b) == [held_to.clone()] {
                Ok(b)
            } else {
                Err(format!(
                    "clusters {:?}, resets {:?}, reported {:?}",
                    placement(&b),
                    record(&b, &held_at),
                    reported(&b, &held_at)
                ))
            }
        })
        .await?;
        let eviction = moved
            .spec
            .eviction_history
            .iter()
            .find(|r| r.cluster_name == held_at)
            .ok_or("no eviction record for the held job's first member")?;
        if eviction.reason != EVICTION_RESET_TIMED_OUT
            || eviction.failure_class != Some(FailureClass::Infrastructure)
            || !eviction
                .message
                .as_deref()
                .is_some_and(|m| m.contains("in-place reset 1") && m.contains("within 5s"))
        {
            return Err(format!("the held job's eviction: {eviction:?}").into());
        }
        // The reset never completed: the old copy is still there, being deleted.
        let old = held_here.get_opt(HELD).await?;
        if old
            .as_ref()
            .is_none_or(|o| o.metadata.deletion_timestamp.is_none())
        {
            return Err(format!("the held copy: {:?}", old.map(|o| o.metadata)).into());
        }
        new_copy(
            &held_there,
            HELD,
            "the held job in the other member",
            None,
            None,
        )
        .await?;
        Ok::<(), TestError>(())
    }
    .await;
    // Let the old copy go whatever happened, so that the namespace can be removed.
    let released = held_here
        .patch(
            HELD,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await;
    timed_out?;
    if let Err(e) = released
        && !matches!(&e, kube::Error::Api(s) if s.code == 404)
    {
        return Err(e.into());
    }
    Ok(())
}

/// Runs the built `lifeboatctl` against the hub cluster: its exit code, stdout and stderr.
async fn lifeboatctl(
    ctx: &TestContext,
    args: &[&str],
) -> Result<(Option<i32>, String, String), TestError> {
    let output = tokio::process::Command::new(lifeboat_bin_dir()?.join("lifeboatctl"))
        .args(args)
        .env("KUBECONFIG", ctx.fleet.kubeconfig("hub")?)
        .output()
        .await?;
    Ok((
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}
