//! Failover decisions, pure: from a binding (its placement, failover policy, eviction tasks and
//! history, per-cluster status) plus the clusters' health and a clock, what to do now — reset
//! the workload in place, evict it from a cluster, or wait — and when to look again.
//!
//! The rules (Karmada's semantics where they are right):
//! - A placement Unhealthy for `tolerationSeconds` (counted from `unhealthySince`, which only a
//!   Healthy report clears) is evicted; `0` evicts in the same pass. `preConditions.delaySeconds`
//!   waits after the first status; `healthyState: Healthy` only moves placements that were
//!   Healthy once.
//! - The failure class decides whether moving helps: an Application failure stays (and says so)
//!   unless the policy opts in.
//! - A kind that resets itself in its cluster (AppWrapper) is moved only when it has Failed,
//!   when its cluster has no room for it (Capacity), or when a spot reclamation or Autopilot
//!   notice hits it and the cluster has no other room. Other kinds get `inPlaceReset.limit`
//!   resets in place (each after a pause and a new toleration) before a move.
//! - A reset in flight (the generation asked of a cluster is above the one its agent reports
//!   the object was re-created for) stops every decision on that cluster's status but cluster
//!   failover: the report is of the old object, or of none. A reset still in flight
//!   `inPlaceReset.timeoutSeconds` (default 600) after its pause has failed: the cluster could
//!   not delete or re-create the workload, so it is moved (`InPlaceResetTimedOut`, class
//!   Infrastructure) under the application failover's purge mode, or `FailoverBlocked` says so
//!   when the policy has no application failover.
//! - A manual reset (`work.lifeboat.dev/reset-request: CLUSTER/NONCE`) is served once per value.
//! - A cluster whose Ready condition stays not True for the cluster toleration (default 60 s),
//!   or which is deleted, loses its placements (cluster failover).
//! - Eviction tasks settle: Gracefully when the new placement is Healthy or the grace period is
//!   over (never vacuously when nothing else was placed); Never when the purge is confirmed;
//!   Directly once the old copy is confirmed gone (its agent's or the hub's own gone report, an
//!   operator's confirmation, the Cluster deleted: never on time alone), and then as Gracefully.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jsonpath_rust::JsonPath;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use lifeboat_api::binding::{
    ANNOTATION_RESET_REQUEST, AggregatedStatusItem, BLOCKED_NEVER_HEALTHY,
    BLOCKED_WAITING_FOR_FENCE, BLOCKED_WAITING_FOR_PURGE, BLOCKED_WAITING_FOR_PURGE_CONFIRMATION,
    EVICTION_APPLICATION_FAILURE, EVICTION_CLUSTER_DELETED, EVICTION_CLUSTER_FAILURE,
    EVICTION_PRODUCER, EVICTION_RESET_TIMED_OUT, EvictionRecord, GoneConfirmedBy,
    GracefulEvictionTask, InPlaceResetRecord, MAX_EVICTION_HISTORY, ResourceBinding,
    ResourceBindingSpec, ResourceHealth,
};
use lifeboat_api::health::FailureClass;
use lifeboat_api::policy::{
    ApplicationFailoverBehavior, ClusterFailoverBehavior, HealthyStatePrecondition, InPlaceReset,
    PurgeMode, StatePreservation,
};

mod apply;
mod tasks;

pub use apply::{apply_evictions, apply_resets, apply_task_changes, preserve, prune_history};
pub use tasks::{PurgeEvidence, TaskChange, may_create_in, new_placement_healthy, settle_tasks};

/// Karmada's `--graceful-eviction-timeout`: how long a task without a grace period lasts.
pub const DEFAULT_EVICTION_TIMEOUT: Duration = Duration::from_secs(600);

/// Health reasons (from the AppWrapper interpreter: the agent's condition reason) that say the
/// node under the workload is going away.
const NODE_NOTICE_REASONS: &[&str] = &["SpotReclamation", "AutopilotNoExecute"];

/// What the hub knows of one cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterState {
    /// Since when its Ready condition has not been True (lease expired), if it is not.
    pub not_ready_since: Option<Time>,
    /// The Cluster is being deleted on the hub: an operator's act that takes the cluster out of
    /// the fleet (its agent is told to remove the hub's work and stop; the hub's finalizer holds
    /// the Cluster until it has, or its lease ran out).
    pub deleted: bool,
}

/// The decision's inputs besides the binding.
pub struct Context<'a> {
    pub now: &'a Time,
    /// Every cluster the hub knows; a name missing here is a deleted cluster.
    pub clusters: &'a BTreeMap<String, ClusterState>,
    /// The kind resets itself inside its cluster (AppWrapper).
    pub resets_itself: bool,
    /// Whether the workload would fit in the named cluster as it is now (GangFit on its free
    /// capacity, which leaves out nodes with a reclamation notice).
    pub fits: &'a dyn Fn(&str) -> bool,
}

/// Evict the workload from a cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct Eviction {
    pub cluster: String,
    /// `ApplicationFailure`, `InPlaceResetTimedOut`, `ClusterFailure` or `ClusterDeleted`.
    pub reason: &'static str,
    pub class: FailureClass,
    pub message: String,
    pub purge_mode: PurgeMode,
    pub grace_period_seconds: Option<i32>,
    /// Labels for the new copy (state preservation).
    pub preserved: BTreeMap<String, String>,
    /// For the eviction record: how long the cluster stays out (`None`: forever).
    pub block_seconds: Option<i32>,
    /// When the trouble began: the copy's `unhealthySince`, or since when the cluster was not
    /// Ready (`None`: a deleted cluster).
    pub failing_since: Option<MicroTime>,
}

/// Ask the cluster's agent to delete and recreate the workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reset {
    pub cluster: String,
    /// A manual request (the annotation's value) rather than a failure.
    pub manual: Option<String>,
    pub pause_seconds: i32,
    /// The failure class of a failure reset.
    pub class: Option<FailureClass>,
    /// Why, for the binding's Event and the ledger.
    pub message: String,
}

impl Reset {
    /// `manual` or `failure`: the reason label of the reset counter and the ledger.
    pub fn reason(&self) -> &'static str {
        if self.manual.is_some() {
            RESET_MANUAL
        } else {
            RESET_FAILURE
        }
    }
}

/// Reasons of an in-place reset.
pub const RESET_FAILURE: &str = "failure";
pub const RESET_MANUAL: &str = "manual";

/// A reset written into the spec: what was decided, and the cluster's record after it.
#[derive(Debug, Clone, PartialEq)]
pub struct AppliedReset {
    pub reset: Reset,
    pub record: InPlaceResetRecord,
}

/// A failover the workload would need but does not get, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub cluster: String,
    pub reason: &'static str,
    pub message: String,
}

/// What to do now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    pub evictions: Vec<Eviction>,
    pub resets: Vec<Reset>,
    pub blocked: Vec<Blocked>,
    /// The earliest time a timer (toleration, delay, grace) expires.
    pub next_check: Option<Time>,
}

impl Decision {
    fn wake_at(&mut self, at: Time) {
        if self.next_check.as_ref().is_none_or(|t| at.0 < t.0) {
            self.next_check = Some(at);
        }
    }
}

/// `t` without its fraction of a second (as a whole-second field keeps it).
fn whole_second(t: &Time) -> Timestamp {
    Timestamp::from_second(t.0.as_second()).unwrap_or(t.0)
}

fn plus(t: &Time, seconds: i64) -> Time {
    Time(
        t.0.checked_add(SignedDuration::from_secs(seconds))
            .unwrap_or(Timestamp::MAX),
    )
}

fn reached(now: &Time, deadline: &Time) -> bool {
    now.0 >= deadline.0
}

/// Decides evictions and resets for the binding's current placements.
pub fn decide(binding: &ResourceBinding, ctx: &Context<'_>) -> Decision {
    let mut decision = Decision::default();
    let spec = &binding.spec;
    let failover = spec.failover.clone().unwrap_or_default();
    let cluster_policy = failover.cluster.clone().unwrap_or_default();
    let evicting: BTreeSet<&str> = spec
        .graceful_eviction_tasks
        .iter()
        .map(|t| t.from_cluster.as_str())
        .collect();
    for target in &spec.clusters {
        let name = target.name.as_str();
        if evicting.contains(name) {
            continue;
        }
        // Cluster failover first: a lost cluster's health reports mean nothing.
        if let Some(eviction) = cluster_failover(binding, name, &cluster_policy, ctx, &mut decision)
        {
            decision.evictions.push(eviction);
            continue;
        }
        if ctx
            .clusters
            .get(name)
            .is_some_and(|c| c.not_ready_since.is_some())
        {
            // Lost, within its toleration: its last status is stale; wait for the cluster.
            continue;
        }
        if reset_in_flight(binding, name) {
            // The agent has not re-created the workload yet: its last status is of the old
            // object (or of none), so nothing is decided on it but the reset's own timeout.
            reset_timeout(
                binding,
                name,
                failover.application.as_ref(),
                ctx,
                &mut decision,
            );
            continue;
        }
        if let Some(reset) = manual_reset(binding, name) {
            decision.resets.push(reset);
            continue;
        }
        if let Some(app) = &failover.application
            && let Some(item) = binding.cluster_status(name)
        {
            application_failover(binding, name, item, app, ctx, &mut decision);
        }
    }
    decision
}

fn cluster_failover(
    binding: &ResourceBinding,
    name: &str,
    policy: &ClusterFailoverBehavior,
    ctx: &Context<'_>,
    decision: &mut Decision,
) -> Option<Eviction> {
    let eviction = |reason: &'static str, message: String| Eviction {
        cluster: name.to_string(),
        reason,
        class: FailureClass::Infrastructure,
        message,
        purge_mode: policy.purge_mode(),
        grace_period_seconds: None,
        preserved: policy
            .state_preservation
            .as_ref()
            .map(|sp| preserve(sp, binding.cluster_status(name)))
            .unwrap_or_default(),
        block_seconds: binding
            .spec
            .failover
            .as_ref()
            .and_then(|f| f.application.as_ref())
            .map(block_seconds)
            .unwrap_or(Some(
                ApplicationFailoverBehavior::DEFAULT_BLOCK_PREDECESSOR_SECONDS,
            )),
        failing_since: None,
    };
    let Some(state) = ctx.clusters.get(name).filter(|s| !s.deleted) else {
        return Some(eviction(
            EVICTION_CLUSTER_DELETED,
            format!("cluster {name} was deleted"),
        ));
    };
    let since = state.not_ready_since.as_ref()?;
    let toleration = i64::from(policy.toleration_seconds());
    let deadline = plus(since, toleration);
    if reached(ctx.now, &deadline) {
        Some(Eviction {
            failing_since: Some(MicroTime(since.0)),
            ..eviction(
                EVICTION_CLUSTER_FAILURE,
                format!(
                    "cluster {name} has not been Ready since {} (toleration {toleration}s)",
                    since.0
                ),
            )
        })
    } else {
        decision.wake_at(deadline);
        None
    }
}

fn block_seconds(app: &ApplicationFailoverBehavior) -> Option<i32> {
    match app.block_predecessor_seconds() {
        0 => None,
        s => Some(s),
    }
}

fn application_failover(
    binding: &ResourceBinding,
    name: &str,
    item: &AggregatedStatusItem,
    app: &ApplicationFailoverBehavior,
    ctx: &Context<'_>,
    decision: &mut Decision,
) {
    if item.health != ResourceHealth::Unhealthy {
        return;
    }
    let now = ctx.now;
    if let Some(pre) = &app.pre_conditions {
        if let Some(delay) = pre.delay_seconds {
            let start = item
                .first_observed_at
                .clone()
                .unwrap_or_else(|| now.clone());
            let monitored_from = plus(&start, i64::from(delay));
            if !reached(now, &monitored_from) {
                decision.wake_at(monitored_from);
                return;
            }
        }
        if pre.healthy_state == Some(HealthyStatePrecondition::Healthy)
            && item.last_healthy_time.is_none()
        {
            decision.blocked.push(Blocked {
                cluster: name.to_string(),
                reason: BLOCKED_NEVER_HEALTHY,
                message: format!(
                    "the workload was never Healthy in {name}; preConditions.healthyState leaves this failure to the cluster"
                ),
            });
            return;
        }
    }
    let class = item.failure_class.unwrap_or(FailureClass::Unknown);
    if !app.moves(class) {
        decision.blocked.push(Blocked {
            cluster: name.to_string(),
            reason: EVICTION_APPLICATION_FAILURE,
            message: format!(
                "the workload failed on its own in {name} ({}): it would fail the same way elsewhere, so it is not moved (failover.application.moveOnApplicationFailure moves it)",
                item.health_reason.as_deref().unwrap_or("class Application")
            ),
        });
        return;
    }
    let toleration = i64::from(app.toleration_seconds());
    // `unhealthySince` keeps microseconds, rounded so that a toleration never ends early; one
    // an older hub wrote with whole seconds counts from the end of its second. A toleration of
    // 0 is over as soon as the state is seen, so it waits for no rounding.
    let written = item
        .unhealthy_since
        .as_ref()
        .map(|t| Time(t.0))
        .unwrap_or_else(|| now.clone());
    let since = if toleration > 0 {
        Time(lifeboat_api::time::counted_from(written.0))
    } else {
        written.clone()
    };
    if ctx.resets_itself {
        let phase = item
            .status
            .as_ref()
            .and_then(|s| s.get("phase"))
            .and_then(|p| p.as_str())
            .unwrap_or("");
        let reason = item.health_reason.as_deref().unwrap_or("");
        let node_notice = NODE_NOTICE_REASONS.iter().any(|r| reason.starts_with(r));
        let movable = phase == "Failed"
            || class == FailureClass::Capacity
            || (node_notice && !(ctx.fits)(name));
        if !movable {
            // The agent's retry loop is on it.
            return;
        }
    } else if let Some(reset) = app.in_place_reset.as_ref().filter(|r| r.limit > 0) {
        let record = binding
            .spec
            .in_place_resets
            .iter()
            .find(|r| r.cluster_name == name);
        let pause = i64::from(reset.pause_seconds.unwrap_or(0));
        // A reset restarts the clock: the next one (or the move) waits for the pause and a
        // new toleration after it.
        let anchor = match record {
            // (`lastRequestedAt` keeps whole seconds: compared at that precision.)
            Some(r) if r.last_requested_at.0 >= whole_second(&written) => {
                plus(&r.last_requested_at, pause)
            }
            _ => since.clone(),
        };
        let deadline = plus(&anchor, toleration);
        if !reached(now, &deadline) {
            decision.wake_at(deadline);
            return;
        }
        let done = record.map(|r| r.count).unwrap_or(0);
        if done < reset.limit {
            decision.resets.push(Reset {
                cluster: name.to_string(),
                manual: None,
                pause_seconds: reset.pause_seconds.unwrap_or(0),
                class: Some(class),
                message: format!(
                    "unhealthy in {name} since {} ({}): in-place reset {} of {} (inPlaceReset.limit) before a move",
                    written.0,
                    item.health_reason.as_deref().unwrap_or("no reason given"),
                    done + 1,
                    reset.limit
                ),
            });
            return;
        }
    }
    let deadline = plus(&since, toleration);
    if !reached(now, &deadline) {
        decision.wake_at(deadline);
        return;
    }
    let message = format!(
        "unhealthy in {name} since {} ({}; toleration {toleration}s)",
        written.0,
        item.health_reason.as_deref().unwrap_or("no reason given")
    );
    decision.evictions.push(Eviction {
        class,
        failing_since: Some(MicroTime(written.0)),
        ..workload_eviction(app, name, EVICTION_APPLICATION_FAILURE, message, Some(item))
    });
}

/// An eviction for one workload's failure, under the application failover's purge mode, grace
/// period, state preservation and block (class Infrastructure until the caller says otherwise).
fn workload_eviction(
    app: &ApplicationFailoverBehavior,
    name: &str,
    reason: &'static str,
    message: String,
    item: Option<&AggregatedStatusItem>,
) -> Eviction {
    Eviction {
        cluster: name.to_string(),
        reason,
        class: FailureClass::Infrastructure,
        message,
        purge_mode: app.purge_mode(),
        grace_period_seconds: (app.purge_mode() == PurgeMode::Gracefully)
            .then(|| app.grace_period_seconds()),
        preserved: app
            .state_preservation
            .as_ref()
            .map(|sp| preserve(sp, item))
            .unwrap_or_default(),
        block_seconds: block_seconds(app),
        failing_since: item.and_then(|i| i.unhealthy_since.clone()),
    }
}

/// A reset was asked of the cluster's agent and the workload it reports is not the re-created
/// one yet: the requested generation is above the one the reported object was re-created for.
pub fn reset_in_flight(binding: &ResourceBinding, cluster: &str) -> bool {
    let Some(record) = InPlaceResetRecord::of(&binding.spec.in_place_resets, cluster) else {
        return false;
    };
    let completed = binding
        .cluster_status(cluster)
        .and_then(|i| i.reset_generation)
        .unwrap_or(0);
    record.generation > completed
}

/// A reset in flight past its pause and `inPlaceReset.timeoutSeconds` (the policy's, else the
/// default) has failed: the workload is moved as an application failure would be, whatever its
/// class and health (the cluster could not delete or re-create it, so there is no copy to trust
/// there), or, with no application failover in the policy (a manual reset), the binding says it
/// is stuck. Before that, the decision wakes at the deadline.
fn reset_timeout(
    binding: &ResourceBinding,
    name: &str,
    app: Option<&ApplicationFailoverBehavior>,
    ctx: &Context<'_>,
    decision: &mut Decision,
) {
    let Some(record) = InPlaceResetRecord::of(&binding.spec.in_place_resets, name) else {
        return;
    };
    let timeout = i64::from(
        app.and_then(|a| a.in_place_reset.as_ref())
            .map(InPlaceReset::timeout_seconds)
            .unwrap_or(InPlaceReset::DEFAULT_TIMEOUT_SECONDS),
    );
    let pause = i64::from(record.pause_seconds.unwrap_or(0));
    // `lastRequestedAt` is read back with whole seconds: counted from the end of its second,
    // the timeout never ends early.
    let asked = Time(lifeboat_api::time::counted_from(record.last_requested_at.0));
    let deadline = plus(&asked, pause + timeout);
    if !reached(ctx.now, &deadline) {
        decision.wake_at(deadline);
        return;
    }
    let item = binding.cluster_status(name);
    let completed = item.and_then(|i| i.reset_generation).unwrap_or(0);
    let what = format!(
        "in-place reset {} asked of {name} at {} was not completed within {timeout}s after its {pause}s pause (inPlaceReset.timeoutSeconds; the agent reports generation {completed} done)",
        record.generation, record.last_requested_at.0
    );
    let Some(app) = app else {
        decision.blocked.push(Blocked {
            cluster: name.to_string(),
            reason: EVICTION_RESET_TIMED_OUT,
            message: format!("{what}: the policy has no failover.application to move the workload"),
        });
        return;
    };
    let mut eviction = workload_eviction(app, name, EVICTION_RESET_TIMED_OUT, what, item);
    if eviction.failing_since.is_none() {
        eviction.failing_since = Some(MicroTime(record.last_requested_at.0));
    }
    decision.evictions.push(eviction);
}

/// A manual reset asked through the binding's annotation and not served yet. It pauses as the
/// policy's `inPlaceReset.pauseSeconds` says (0 without one).
fn manual_reset(binding: &ResourceBinding, cluster: &str) -> Option<Reset> {
    let value = binding
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_RESET_REQUEST)?;
    let asked_cluster = value.split('/').next().unwrap_or("");
    if asked_cluster != cluster {
        return None;
    }
    let served = InPlaceResetRecord::of(&binding.spec.in_place_resets, cluster)
        .and_then(|r| r.manual_request.as_deref());
    let pause_seconds = binding
        .spec
        .failover
        .as_ref()
        .and_then(|f| f.application.as_ref())
        .and_then(|a| a.in_place_reset.as_ref())
        .and_then(|r| r.pause_seconds)
        .unwrap_or(0);
    (served != Some(value.as_str())).then(|| Reset {
        cluster: cluster.to_string(),
        manual: Some(value.clone()),
        pause_seconds,
        class: None,
        message: format!("asked by hand in {cluster} ({ANNOTATION_RESET_REQUEST}={value})"),
    })
}

/// A manual reset is asked (the annotation names a placed cluster) and not served yet.
pub fn manual_reset_pending(binding: &ResourceBinding) -> bool {
    binding
        .spec
        .clusters
        .iter()
        .any(|c| manual_reset(binding, &c.name).is_some())
}

#[cfg(test)]
mod tests;
