//! Failover decisions, pure: from a binding (its placement, failover policy, eviction tasks and
//! history, per-cluster status) plus the clusters' health and a clock, what to do now — reset
//! the workload in place, evict it from a cluster, or wait — and when to look again.
//!
//! The rules (issue 9, Karmada's semantics where they are right):
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

/// Applies resets to the spec: the cluster's record gets the next generation, the time and
/// pause, and counts a failure reset against the limit (a manual one records its request
/// instead). Returns what was applied, with each record as it now is.
pub fn apply_resets(
    spec: &mut ResourceBindingSpec,
    resets: &[Reset],
    now: &Time,
) -> Vec<AppliedReset> {
    let mut applied = Vec::new();
    for reset in resets {
        if !spec.clusters.iter().any(|c| c.name == reset.cluster) {
            continue;
        }
        let position = match spec
            .in_place_resets
            .iter()
            .position(|r| r.cluster_name == reset.cluster)
        {
            Some(p) => p,
            None => {
                spec.in_place_resets.push(InPlaceResetRecord {
                    cluster_name: reset.cluster.clone(),
                    generation: 0,
                    count: 0,
                    last_requested_at: now.clone(),
                    manual_request: None,
                    pause_seconds: None,
                });
                spec.in_place_resets.len() - 1
            }
        };
        let record = &mut spec.in_place_resets[position];
        record.generation += 1;
        record.last_requested_at = now.clone();
        record.pause_seconds = (reset.pause_seconds > 0).then_some(reset.pause_seconds);
        match &reset.manual {
            Some(value) => record.manual_request = Some(value.clone()),
            None => record.count += 1,
        }
        applied.push(AppliedReset {
            reset: reset.clone(),
            record: record.clone(),
        });
    }
    applied
}

/// The state-preservation labels from the evicted copy's reflected status. A rule whose path
/// finds nothing is left out (Karmada fails the eviction instead, which can block a failover
/// forever on a value the job has not written yet); a value that is not a valid label value is
/// left out too.
pub fn preserve(
    rules: &StatePreservation,
    item: Option<&AggregatedStatusItem>,
) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let Some(status) = item.and_then(|i| i.status.as_ref()) else {
        return labels;
    };
    for rule in &rules.rules {
        let Some(value) = json_path_value(status, &rule.json_path) else {
            continue;
        };
        if is_label_value(&value) {
            labels.insert(rule.alias_label_name.clone(), value);
        }
    }
    labels
}

/// kubectl JSONPath (`{.a.b[0]}`, relative to the object) → the value as a string.
fn json_path_value(object: &serde_json::Value, template: &str) -> Option<String> {
    let inner = template.trim().strip_prefix('{')?.strip_suffix('}')?.trim();
    let path = if inner.starts_with('$') {
        inner.to_string()
    } else if inner.starts_with('.') || inner.starts_with('[') {
        format!("${inner}")
    } else {
        format!("$.{inner}")
    };
    let found = object.query(&path).ok()?;
    let value = found.first()?;
    match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Null => None,
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::Bool(b) => Some(b.to_string()),
        other => Some(other.to_string()),
    }
}

fn is_label_value(value: &str) -> bool {
    value.len() <= 63
        && (value.is_empty()
            || (value.starts_with(|c: char| c.is_ascii_alphanumeric())
                && value.ends_with(|c: char| c.is_ascii_alphanumeric())
                && value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))))
}

/// Applies evictions to the spec: the cluster leaves `clusters`, a task and a history record
/// are added. Returns the evicted clusters (those that were placed there).
pub fn apply_evictions(
    spec: &mut ResourceBindingSpec,
    evictions: &[Eviction],
    now: &Time,
) -> Vec<String> {
    let before: Vec<String> = spec.clusters.iter().map(|c| c.name.clone()).collect();
    let mut evicted = Vec::new();
    for eviction in evictions {
        let Some(position) = spec
            .clusters
            .iter()
            .position(|c| c.name == eviction.cluster)
        else {
            continue;
        };
        let target = spec.clusters.remove(position);
        evicted.push(eviction.cluster.clone());
        if !spec
            .graceful_eviction_tasks
            .iter()
            .any(|t| t.from_cluster == eviction.cluster)
        {
            spec.graceful_eviction_tasks.push(GracefulEvictionTask {
                from_cluster: eviction.cluster.clone(),
                purge_mode: Some(eviction.purge_mode),
                replicas: (target.replicas > 0).then_some(target.replicas),
                reason: eviction.reason.to_string(),
                message: Some(eviction.message.clone()),
                producer: EVICTION_PRODUCER.to_string(),
                grace_period_seconds: eviction.grace_period_seconds,
                suppress_deletion: (eviction.purge_mode == PurgeMode::Never).then_some(true),
                preserved_label_state: eviction.preserved.clone(),
                clusters_before_failover: before.clone(),
                creation_timestamp: Some(now.clone()),
                purged_at: None,
                failing_since: eviction.failing_since.clone(),
            });
        }
        spec.eviction_history.push(EvictionRecord {
            cluster_name: eviction.cluster.clone(),
            reason: eviction.reason.to_string(),
            failure_class: Some(eviction.class),
            message: Some(eviction.message.clone()),
            evicted_at: now.clone(),
            expires_at: eviction.block_seconds.map(|s| plus(now, i64::from(s))),
            preserved_label_state: eviction.preserved.clone(),
            clusters_before_failover: before.clone(),
        });
        spec.in_place_resets
            .retain(|r| r.cluster_name != eviction.cluster);
    }
    prune_history(&mut spec.eviction_history, now);
    evicted
}

/// Keeps at most [`MAX_EVICTION_HISTORY`] records: expired ones go first, then the oldest.
pub fn prune_history(history: &mut Vec<EvictionRecord>, now: &Time) {
    if history.len() <= MAX_EVICTION_HISTORY {
        return;
    }
    let expired = |r: &EvictionRecord| r.expires_at.as_ref().is_some_and(|t| t.0 <= now.0);
    let mut excess = history.len() - MAX_EVICTION_HISTORY;
    history.retain(|r| {
        if excess > 0 && expired(r) {
            excess -= 1;
            false
        } else {
            true
        }
    });
    if history.len() > MAX_EVICTION_HISTORY {
        let drop = history.len() - MAX_EVICTION_HISTORY;
        history.drain(..drop);
    }
}

/// What shows that a `Directly` eviction's old copy no longer runs. Time alone never does: a
/// cluster that has been silent for long may still run its pods (a dead agent suspends
/// nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PurgeEvidence {
    /// The cluster's agent deleted the copy and saw it gone.
    Agent,
    /// The hub deleted it through the member's kube-apiserver (the cluster's fencing
    /// credential) and saw it gone.
    Hub,
    /// An operator confirmed it (`lifeboatctl confirm-purge`).
    Operator,
    /// The Cluster was deleted on the hub.
    ClusterDeleted,
}

impl PurgeEvidence {
    /// For the ledger and Events.
    pub fn as_str(self) -> &'static str {
        match self {
            PurgeEvidence::Agent => "agent",
            PurgeEvidence::Hub => "hub-fence",
            PurgeEvidence::Operator => "operator",
            PurgeEvidence::ClusterDeleted => "cluster-deleted",
        }
    }
}

/// A change to an eviction task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskChange {
    /// The old copy is confirmed gone: the new copy may be created.
    Purged {
        cluster: String,
        evidence: PurgeEvidence,
    },
    /// The task is done: its old copy (if kept) is removed now.
    Remove { cluster: String, why: String },
}

/// Settles the binding's eviction tasks. `confirmed` lists clusters whose purge a human
/// confirmed (purgeMode Never).
pub fn settle_tasks(
    binding: &ResourceBinding,
    ctx: &Context<'_>,
    confirmed: &BTreeSet<String>,
    decision: &mut Decision,
) -> Vec<TaskChange> {
    let now = ctx.now;
    let new_placement_healthy = new_placement_healthy(binding);
    let mut changes = Vec::new();
    for task in &binding.spec.graceful_eviction_tasks {
        let cluster = task.from_cluster.clone();
        let created = task
            .creation_timestamp
            .clone()
            .unwrap_or_else(|| now.clone());
        let timeout = task
            .grace_period_seconds
            .map(i64::from)
            .unwrap_or(DEFAULT_EVICTION_TIMEOUT.as_secs() as i64);
        let expires = plus(&created, timeout);
        match task.purge_mode.unwrap_or_default() {
            PurgeMode::Never => {
                if task.suppress_deletion == Some(false) || confirmed.contains(&cluster) {
                    changes.push(TaskChange::Remove {
                        cluster,
                        why: "the purge was confirmed".into(),
                    });
                } else {
                    decision.blocked.push(Blocked {
                        cluster: cluster.clone(),
                        reason: BLOCKED_WAITING_FOR_PURGE_CONFIRMATION,
                        message: format!(
                            "the old copy in {cluster} stays until `lifeboatctl confirm-purge` (purgeMode Never)"
                        ),
                    });
                }
            }
            PurgeMode::Gracefully => {
                if new_placement_healthy {
                    changes.push(TaskChange::Remove {
                        cluster,
                        why: "the new placement is Healthy".into(),
                    });
                } else if reached(now, &expires) {
                    changes.push(TaskChange::Remove {
                        cluster,
                        why: format!("the grace period of {timeout}s is over"),
                    });
                } else {
                    decision.wake_at(expires);
                }
            }
            PurgeMode::Directly => {
                if task.purged_at.is_none() {
                    let state = ctx.clusters.get(&cluster);
                    if let Some(evidence) =
                        purge_evidence(binding, &cluster, &created, state, confirmed)
                    {
                        changes.push(TaskChange::Purged { cluster, evidence });
                    } else {
                        decision
                            .blocked
                            .push(waiting_for_purge(binding, &cluster, state));
                    }
                } else if new_placement_healthy {
                    changes.push(TaskChange::Remove {
                        cluster,
                        why: "the new placement is Healthy".into(),
                    });
                } else if reached(now, &expires) {
                    changes.push(TaskChange::Remove {
                        cluster,
                        why: format!("the eviction timeout of {timeout}s is over"),
                    });
                } else {
                    decision.wake_at(expires);
                }
            }
        }
    }
    changes
}

/// The binding is scheduled for its generation, placed somewhere, and Healthy everywhere it
/// is placed. Never true for an empty placement (karmada#7455 treats that as healthy and
/// deletes the only copy).
pub fn new_placement_healthy(binding: &ResourceBinding) -> bool {
    let spec = &binding.spec;
    if spec.clusters.is_empty() {
        return false;
    }
    let scheduled_now = binding
        .status
        .as_ref()
        .and_then(|s| s.scheduler_observed_generation)
        == binding.metadata.generation;
    scheduled_now
        && spec.clusters.iter().all(|c| {
            binding
                .cluster_status(&c.name)
                .is_some_and(|i| i.health == ResourceHealth::Healthy)
        })
}

/// The evidence that a `Directly` eviction's old copy in `cluster` no longer runs, if there is
/// any: a gone report after the eviction (from the agent, or from the hub's own fence), the
/// Cluster deleted, or an operator's confirmation.
fn purge_evidence(
    binding: &ResourceBinding,
    cluster: &str,
    evicted_at: &Time,
    state: Option<&ClusterState>,
    confirmed: &BTreeSet<String>,
) -> Option<PurgeEvidence> {
    if let Some(by) = old_copy_gone(binding, cluster, evicted_at) {
        return Some(match by {
            GoneConfirmedBy::Agent => PurgeEvidence::Agent,
            GoneConfirmedBy::Hub => PurgeEvidence::Hub,
        });
    }
    // A Cluster deleted on the hub is held by the hub's finalizer until its agent has removed
    // the hub's work and stopped (or its lease ran out): gone, it is an operator's word that
    // nothing runs there any more; while it is held, its agent is still at work.
    if state.is_none() {
        return Some(PurgeEvidence::ClusterDeleted);
    }
    confirmed
        .contains(cluster)
        .then_some(PurgeEvidence::Operator)
}

/// Why a `Directly` eviction's new copy still waits: the old copy's agent is deleting it, or
/// (its cluster not Ready) nobody there can say it is gone.
fn waiting_for_purge(
    binding: &ResourceBinding,
    cluster: &str,
    state: Option<&ClusterState>,
) -> Blocked {
    if state.is_some_and(|s| s.deleted) {
        return Blocked {
            cluster: cluster.to_string(),
            reason: BLOCKED_WAITING_FOR_PURGE,
            message: format!(
                "the new copy waits until the Cluster {cluster}, being deleted, is gone: its agent removes the hub's work and stops, or its lease runs out (purgeMode Directly)"
            ),
        };
    }
    let not_ready_since = state.and_then(|s| s.not_ready_since.as_ref());
    let Some(since) = not_ready_since else {
        return Blocked {
            cluster: cluster.to_string(),
            reason: BLOCKED_WAITING_FOR_PURGE,
            message: format!(
                "the new copy waits until the agent in {cluster} confirms the old one gone (purgeMode Directly)"
            ),
        };
    };
    let (namespace, name) = (
        binding.metadata.namespace.as_deref().unwrap_or_default(),
        binding.metadata.name.as_deref().unwrap_or_default(),
    );
    Blocked {
        cluster: cluster.to_string(),
        reason: BLOCKED_WAITING_FOR_FENCE,
        message: format!(
            "the new copy waits for evidence that the old one in {cluster} no longer runs (purgeMode Directly): \
             {cluster} is not Ready since {}, so its agent cannot confirm it; the hub deletes it through the member's \
             kube-apiserver if the cluster gave a fencing credential, or `lifeboatctl confirm-purge {namespace}/{name} {cluster}` \
             confirms it by hand",
            since.0
        ),
    }
}

/// Who reported the old copy gone after the eviction (a gone report, taken only for work the
/// hub withdrew from that cluster: an `applied: false` report of a copy whose update failed is
/// not one, its object may still run).
fn old_copy_gone(
    binding: &ResourceBinding,
    cluster: &str,
    evicted_at: &Time,
) -> Option<GoneConfirmedBy> {
    binding
        .cluster_status(cluster)
        .filter(|item| !item.applied && item.gone_at.as_ref().is_some_and(|t| t.0 >= evicted_at.0))
        .map(|item| item.gone_confirmed_by.unwrap_or(GoneConfirmedBy::Agent))
}

/// Applies task changes to the spec.
pub fn apply_task_changes(spec: &mut ResourceBindingSpec, changes: &[TaskChange], now: &Time) {
    for change in changes {
        match change {
            TaskChange::Purged { cluster, .. } => {
                if let Some(task) = spec
                    .graceful_eviction_tasks
                    .iter_mut()
                    .find(|t| &t.from_cluster == cluster)
                {
                    task.purged_at = Some(now.clone());
                }
            }
            TaskChange::Remove { cluster, .. } => {
                spec.graceful_eviction_tasks
                    .retain(|t| &t.from_cluster != cluster);
            }
        }
    }
}

/// Whether the new copy may be created in `cluster`: not while a Directly eviction's old copy
/// (elsewhere) is not confirmed gone.
pub fn may_create_in(spec: &ResourceBindingSpec, cluster: &str) -> bool {
    spec.graceful_eviction_tasks.iter().all(|t| {
        t.purge_mode != Some(PurgeMode::Directly)
            || t.purged_at.is_some()
            || t.clusters_before_failover.iter().any(|c| c == cluster)
    })
}

/// The labels the copy in `cluster` carries: those of the most recent eviction that preserved
/// state (the last checkpoint the workload reported before it was moved), for a cluster of the
/// placement that was not placed before that eviction, i.e. a copy made after it. A copy that
/// ran before it (another cluster of a multi-cluster placement) and an old copy an eviction
/// keeps are left as they are. The record outlives the eviction task, so a copy keeps its
/// labels when the task settles (Karmada drops them then, and only labels with `Directly`).
pub fn preserved_labels(spec: &ResourceBindingSpec, cluster: &str) -> BTreeMap<String, String> {
    if !spec.clusters.iter().any(|c| c.name == cluster) {
        return BTreeMap::new();
    }
    spec.eviction_history
        .iter()
        .rev()
        .find(|r| !r.preserved_label_state.is_empty())
        .filter(|r| !r.clusters_before_failover.iter().any(|c| c == cluster))
        .map(|r| r.preserved_label_state.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
