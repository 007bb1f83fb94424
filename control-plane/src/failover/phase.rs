//! The binder's failover phase, IO-free: the clusters as [`failover`] sees them, one pass of
//! [`failover::decide`] and [`failover::settle_tasks`] over a binding's desired spec, the
//! `FailoverBlocked` condition, and the rate limit of cluster evictions. The binder applies the
//! result in the same spec write as its scheduling.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::ResourceExt;
use lifeboat_api::binding::{
    CONDITION_FAILOVER_BLOCKED, EVICTION_CLUSTER_DELETED, EVICTION_CLUSTER_FAILURE,
    ResourceBinding, ResourceBindingSpec, ResourceHealth,
};
use lifeboat_api::cluster::{CONDITION_READY, Cluster};
use lifeboat_api::policy::PurgeMode;

use crate::failover::decide::{
    self as failover, AppliedReset, Blocked, ClusterState, Context, Decision, Eviction, TaskChange,
};
use crate::status::aggregate::condition;

/// Read by `lifeboatctl get bindings` too: lifeboat-api.
pub use lifeboat_api::binding::confirmed_purges;

/// Reason of `FailoverBlocked` when an eviction was decided but no other cluster fits: the old
/// copy stays (karmada#7455 deletes it).
pub const REASON_NO_OTHER_CLUSTER: &str = lifeboat_api::binding::BLOCKED_NO_OTHER_CLUSTER_FITS;
/// Reason of `FailoverBlocked=False` once nothing blocks a failover any more.
pub use lifeboat_api::binding::BLOCKED_NOT_BLOCKED as REASON_NOT_BLOCKED;

/// Since when a Cluster has not been Ready, as a toleration counts: its `status.notReadySince`
/// (microseconds) when it belongs to the condition's transition (within the condition's
/// written second), else the end of the condition's written second: `lastTransitionTime`
/// keeps whole seconds and the transition happened within the second after it, so counting
/// from its start could end a toleration or a fencing period up to a second early (a failover
/// bench saw dispatches 0.4 s before the cluster toleration was over).
fn not_ready_since(ready: &Condition, precise: Option<&MicroTime>) -> Time {
    let written = ready.last_transition_time.0;
    let end_of_second = lifeboat_api::time::counted_from(written);
    match precise {
        Some(p) if p.0 >= written && p.0 <= end_of_second => {
            Time(lifeboat_api::time::counted_from(p.0))
        }
        _ => Time(end_of_second),
    }
}

/// The clusters as the failover decision sees them: since when each has not been Ready, and
/// whether it is being deleted.
///
/// No time makes a lost cluster's copies count as gone (a dead agent suspends nothing, and pods
/// keep running on their kubelets): a `Directly` eviction waits for evidence
/// ([`failover::PurgeEvidence`]).
pub fn cluster_states(clusters: &[Arc<Cluster>]) -> BTreeMap<String, ClusterState> {
    clusters
        .iter()
        .map(|c| {
            let ready = c
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION_READY));
            let precise = c.status.as_ref().and_then(|s| s.not_ready_since.as_ref());
            let not_ready_since = ready
                .filter(|r| r.status != "True")
                .map(|r| not_ready_since(r, precise));
            (
                c.name_any(),
                ClusterState {
                    not_ready_since,
                    deleted: c.metadata.deletion_timestamp.is_some(),
                },
            )
        })
        .collect()
}

/// The confirm-purge annotation's clusters that still have an eviction task waiting for it (a
/// `Never` task, or a `Directly` task whose old copy is not confirmed gone yet), when some do
/// not (`None`: nothing to prune; an empty list: the annotation goes). A confirmation whose
/// purge is done (or that came before any such eviction) must not confirm a later eviction from
/// that cluster in advance.
pub fn pruned_confirmations(binding: &ResourceBinding) -> Option<Vec<String>> {
    let confirmed = confirmed_purges(binding);
    let waiting: BTreeSet<&str> = binding
        .spec
        .graceful_eviction_tasks
        .iter()
        .filter(|t| match t.purge_mode {
            Some(PurgeMode::Never) => true,
            Some(PurgeMode::Directly) => t.purged_at.is_none(),
            _ => false,
        })
        .map(|t| t.from_cluster.as_str())
        .collect();
    let kept: Vec<String> = confirmed
        .iter()
        .filter(|c| waiting.contains(c.as_str()))
        .cloned()
        .collect();
    (kept.len() != confirmed.len()).then_some(kept)
}

/// What one failover pass over a binding decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pass {
    pub decision: Decision,
    pub task_changes: Vec<TaskChange>,
}

/// Runs the decision over `current` with the `desired` spec (so a policy edited during a
/// toleration applies from the edit).
pub fn decide(current: &ResourceBinding, desired: &ResourceBindingSpec, ctx: &Context<'_>) -> Pass {
    let mut view = current.clone();
    view.spec = desired.clone();
    let mut decision = failover::decide(&view, ctx);
    let task_changes =
        failover::settle_tasks(&view, ctx, &confirmed_purges(current), &mut decision);
    Pass {
        decision,
        task_changes,
    }
}

/// What the failover phase reads besides the binding.
pub struct Inputs<'a> {
    pub clusters: &'a [Arc<Cluster>],
    /// Whether the binding's workload fits in the named cluster alone (a node notice moves an
    /// AppWrapper only when it does not).
    pub fits: &'a dyn Fn(&str) -> bool,
    pub cluster_evictions: &'a Mutex<EvictionRateLimiter>,
    /// The clock of the decision (timers, eviction times).
    pub now: &'a Time,
    /// The clock of the rate limit.
    pub instant: Instant,
}

/// What the failover phase leaves for the rest of the binder's pass.
#[derive(Debug, Default)]
pub struct Step {
    /// The spec before this pass's evictions (settled tasks applied): kept when no other
    /// cluster fits.
    pub without_evictions: Option<ResourceBindingSpec>,
    pub evicted: Vec<Eviction>,
    /// Resets written into the spec.
    pub resets: Vec<AppliedReset>,
    pub blocked: Vec<Blocked>,
    /// Look again after this long (a toleration, a delay, a grace period, the rate limit).
    pub look_again: Option<Duration>,
    pub settled: Vec<TaskChange>,
}

/// The failover phase of a binder pass, its one entry: decides evictions and resets and
/// settles eviction tasks over the desired spec ([`decide`]), and applies them to it. Cluster
/// evictions wait for the rate limit.
pub fn step(
    current: &ResourceBinding,
    desired: &mut ResourceBindingSpec,
    inputs: &Inputs<'_>,
) -> Step {
    if current.spec.clusters.is_empty() && current.spec.graceful_eviction_tasks.is_empty() {
        return Step::default();
    }
    let now = inputs.now;
    let pass = decide_over(current, desired, inputs);
    let mut look_again = pass.decision.next_check.as_ref().map(|at| until(now, at));
    let mut evictions = Vec::new();
    for eviction in pass.decision.evictions {
        if is_cluster_eviction(&eviction) {
            let taken = inputs
                .cluster_evictions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .try_take(inputs.instant);
            if let Err(wait) = taken {
                look_again = Some(look_again.map_or(wait, |l| l.min(wait)));
                continue;
            }
        }
        evictions.push(eviction);
    }
    for change in &pass.task_changes {
        tracing::info!(?change, "eviction task settled");
    }
    // Resets first: they stay when an eviction is taken back for lack of another cluster.
    let resets = failover::apply_resets(desired, &pass.decision.resets, now);
    failover::apply_task_changes(desired, &pass.task_changes, now);
    let without_evictions = (!evictions.is_empty()).then(|| desired.clone());
    failover::apply_evictions(desired, &evictions, now);
    Step {
        without_evictions,
        evicted: evictions,
        resets,
        blocked: pass.decision.blocked,
        look_again,
        settled: pass.task_changes,
    }
}

/// What the failover decision says of a binding as a pass wrote it: what its evictions wait for
/// and when to look again; `None` when it has more to decide (an eviction, a reset, a task to
/// settle), which is another pass's.
pub struct AfterWrite {
    pub blocked: Vec<Blocked>,
    pub look_again: Option<Duration>,
}

/// See [`AfterWrite`].
pub fn after_write(written: &ResourceBinding, inputs: &Inputs<'_>) -> Option<AfterWrite> {
    let pass = decide_over(written, &written.spec, inputs);
    if !pass.decision.evictions.is_empty()
        || !pass.decision.resets.is_empty()
        || !pass.task_changes.is_empty()
    {
        return None;
    }
    Some(AfterWrite {
        blocked: pass.decision.blocked,
        look_again: pass
            .decision
            .next_check
            .as_ref()
            .map(|at| until(inputs.now, at)),
    })
}

/// The pure failover decision over `current` with the `desired` spec, the clusters and the
/// clock of `inputs`.
fn decide_over(
    current: &ResourceBinding,
    desired: &ResourceBindingSpec,
    inputs: &Inputs<'_>,
) -> Pass {
    let states = cluster_states(inputs.clusters);
    let ctx = Context {
        now: inputs.now,
        clusters: &states,
        resets_itself: current.spec.resource.kind == "AppWrapper",
        fits: inputs.fits,
    };
    decide(current, desired, &ctx)
}

/// A cluster failover (the cluster is lost or deleted), as opposed to one workload's failure
/// (an application failure, an in-place reset that timed out): these are rate-limited.
pub fn is_cluster_eviction(eviction: &Eviction) -> bool {
    matches!(
        eviction.reason,
        EVICTION_CLUSTER_FAILURE | EVICTION_CLUSTER_DELETED
    )
}

/// The binding may need the failover phase again soon: it has a failover policy and a placement
/// that is not Healthy, an eviction in progress, a blocked failover to clear, a manual reset
/// asked and not served, or a reset in flight (its timeout). The binder is queued on such a
/// binding's changes.
pub fn wants_a_look(binding: &ResourceBinding) -> bool {
    if !binding.spec.graceful_eviction_tasks.is_empty()
        || failover::manual_reset_pending(binding)
        || binding
            .spec
            .in_place_resets
            .iter()
            .any(|r| failover::reset_in_flight(binding, &r.cluster_name))
    {
        return true;
    }
    if binding.spec.failover.is_none() {
        return false;
    }
    let status = binding.status.as_ref();
    status.is_some_and(|s| {
        s.aggregated_status
            .iter()
            .any(|i| i.health == ResourceHealth::Unhealthy)
            || s.conditions
                .iter()
                .any(|c| c.type_ == CONDITION_FAILOVER_BLOCKED && c.status == "True")
    })
}

/// The `FailoverBlocked` condition: True with the first reason and every message while a
/// failover is blocked; False once it is not (only if it was ever set).
pub fn blocked_condition(
    blocked: &[Blocked],
    previous: &[Condition],
    generation: Option<i64>,
    now: &Time,
) -> Option<Condition> {
    if let Some(first) = blocked.first() {
        let message = blocked
            .iter()
            .map(|b| b.message.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        return Some(condition(
            CONDITION_FAILOVER_BLOCKED,
            "True",
            first.reason,
            message,
            previous,
            generation,
            now,
        ));
    }
    previous
        .iter()
        .any(|c| c.type_ == CONDITION_FAILOVER_BLOCKED)
        .then(|| {
            condition(
                CONDITION_FAILOVER_BLOCKED,
                "False",
                REASON_NOT_BLOCKED,
                "no failover is blocked".into(),
                previous,
                generation,
                now,
            )
        })
}

/// How long until `at` (zero if past).
pub fn until(now: &Time, at: &Time) -> Duration {
    let d = at.0.duration_since(now.0);
    Duration::try_from(d).unwrap_or(Duration::ZERO)
}

/// A token bucket for cluster evictions (Karmada's `--cluster-eviction-rate`, default 0.5/s
/// there; here 50/s), so a lost cluster's bindings move at a bounded rate.
#[derive(Debug)]
pub struct EvictionRateLimiter {
    per_second: f64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl EvictionRateLimiter {
    /// `per_second` evictions on average, up to `per_second` (at least one) at once.
    pub fn new(per_second: f64) -> EvictionRateLimiter {
        let per_second = if per_second.is_finite() && per_second > 0.0 {
            per_second
        } else {
            f64::MAX
        };
        let burst = per_second.clamp(1.0, 1e9);
        EvictionRateLimiter {
            per_second,
            burst,
            tokens: burst,
            last: None,
        }
    }

    /// Takes one token at `now`, or says how long until one is there.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        if let Some(last) = self.last {
            let elapsed = now.saturating_duration_since(last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                ((1.0 - self.tokens) / self.per_second).max(0.001),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use lifeboat_api::binding::ANNOTATION_CONFIRM_PURGE;
    use serde_json::json;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(1_900_000_000 + second).unwrap())
    }

    fn cluster(name: &str, ready: Option<(&str, i64)>, deleting: bool) -> Arc<Cluster> {
        let mut c: Cluster = serde_json::from_value(json!({
            "apiVersion": "cluster.lifeboat.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": name}, "spec": {}
        }))
        .unwrap();
        if let Some((status, since)) = ready {
            c.status = Some(
                serde_json::from_value(json!({"conditions": [{
                    "type": "Ready", "status": status, "reason": "x", "message": "",
                    "lastTransitionTime": at(since).0.to_string()}]}))
                .unwrap(),
            );
        }
        if deleting {
            c.metadata.deletion_timestamp = Some(at(0));
        }
        Arc::new(c)
    }

    #[test]
    fn clusters_not_ready_count_from_the_ready_transition() {
        let states = cluster_states(&[
            cluster("a", Some(("True", 5)), false),
            cluster("b", Some(("Unknown", 7)), false),
            cluster("c", None, true),
        ]);
        assert_eq!(states["a"], ClusterState::default());
        // Written as second 7: counted from the end of that second.
        assert_eq!(states["b"].not_ready_since, Some(at(8)));
        assert!(states["c"].deleted && states["c"].not_ready_since.is_none());
    }

    #[test]
    fn not_ready_since_to_the_microsecond_counts_as_written() {
        let with = |precise: &str| {
            let mut c = (*cluster("b", Some(("Unknown", 7)), false)).clone();
            c.status.as_mut().unwrap().not_ready_since = Some(MicroTime(precise.parse().unwrap()));
            cluster_states(&[Arc::new(c)])["b"].not_ready_since.clone()
        };
        let seven = at(7).0;
        let plus = |ms: i64| {
            Time(
                seven
                    .checked_add(k8s_openapi::jiff::SignedDuration::from_micros(ms))
                    .unwrap(),
            )
        };
        // Within the condition's second: taken as written.
        assert_eq!(with(&plus(250_001).0.to_string()), Some(plus(250_001)));
        // Not the condition's transition (later than its second, or before it): the end of the
        // condition's second, as without it.
        assert_eq!(with(&plus(1_500_000).0.to_string()), Some(at(8)));
        assert_eq!(with(&plus(-1).0.to_string()), Some(at(8)));
    }

    #[test]
    fn confirmations_of_done_purges_are_pruned() {
        let mut b: ResourceBinding = serde_json::from_value(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "w", "namespace": "ns",
                         "annotations": {ANNOTATION_CONFIRM_PURGE: "a,b"}},
            "spec": {"resource": {"apiVersion": "v1", "kind": "Job", "name": "w"},
                     "gracefulEvictionTasks": [
                        {"fromCluster": "a", "purgeMode": "Never", "reason": "ApplicationFailure", "producer": "hub"},
                        {"fromCluster": "b", "purgeMode": "Never", "reason": "ApplicationFailure", "producer": "hub"}]}
        }))
        .unwrap();
        // both still wait for their confirmed purge
        assert_eq!(pruned_confirmations(&b), None);
        // a's purge is done: its confirmation goes, b's stays
        b.spec.graceful_eviction_tasks.remove(0);
        assert_eq!(pruned_confirmations(&b), Some(vec!["b".to_string()]));
        // a Directly task whose old copy is not confirmed gone yet waits for it too (a's still
        // goes)
        b.spec.graceful_eviction_tasks[0].purge_mode = Some(PurgeMode::Directly);
        assert_eq!(pruned_confirmations(&b), Some(vec!["b".to_string()]));
        // once purged, it does not
        b.spec.graceful_eviction_tasks[0].purged_at = Some(at(3));
        assert_eq!(pruned_confirmations(&b), Some(vec![]));
        // nor a Gracefully task
        b.spec.graceful_eviction_tasks[0].purged_at = None;
        b.spec.graceful_eviction_tasks[0].purge_mode = Some(PurgeMode::Gracefully);
        assert_eq!(pruned_confirmations(&b), Some(vec![]));
        // no annotation: nothing to do
        b.metadata.annotations = None;
        assert_eq!(pruned_confirmations(&b), None);
    }

    #[test]
    fn the_blocked_condition_is_set_then_cleared_never_invented() {
        let blocked = [Blocked {
            cluster: "a".into(),
            reason: "ApplicationFailure",
            message: "failed on its own".into(),
        }];
        assert_eq!(blocked_condition(&[], &[], Some(1), &at(0)), None);
        let set = blocked_condition(&blocked, &[], Some(1), &at(0)).unwrap();
        assert_eq!(
            (set.status.as_str(), set.reason.as_str()),
            ("True", "ApplicationFailure")
        );
        let cleared = blocked_condition(&[], &[set], Some(1), &at(5)).unwrap();
        assert_eq!(
            (cleared.status.as_str(), cleared.reason.as_str()),
            ("False", REASON_NOT_BLOCKED)
        );
        assert_eq!(cleared.last_transition_time, at(5));
    }

    #[test]
    fn only_bindings_with_something_to_decide_are_looked_at_again() {
        let mut b: ResourceBinding = serde_json::from_value(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "w", "namespace": "ns"},
            "spec": {"resource": {"apiVersion": "v1", "kind": "Job", "name": "w"},
                     "clusters": [{"name": "a"}]},
            "status": {"aggregatedStatus": [{"clusterName": "a", "health": "Unhealthy"}]}
        }))
        .unwrap();
        // no failover policy: nothing to decide
        assert!(!wants_a_look(&b));
        b.spec.failover = Some(Default::default());
        assert!(wants_a_look(&b));
        b.status.as_mut().unwrap().aggregated_status[0].health = ResourceHealth::Healthy;
        assert!(!wants_a_look(&b));
        // a manual reset asked of a placed cluster, Healthy or not, with or without a policy
        let mut asked = b.clone();
        asked.spec.failover = None;
        asked.metadata.annotations = Some(
            [(
                lifeboat_api::binding::ANNOTATION_RESET_REQUEST.to_string(),
                "a/1".to_string(),
            )]
            .into(),
        );
        assert!(wants_a_look(&asked));
        b.spec
            .graceful_eviction_tasks
            .push(lifeboat_api::binding::GracefulEvictionTask {
                from_cluster: "x".into(),
                purge_mode: Some(PurgeMode::Gracefully),
                ..Default::default()
            });
        assert!(wants_a_look(&b));
    }

    #[test]
    fn the_limiter_lets_a_burst_through_then_refills_at_its_rate() {
        let mut limiter = EvictionRateLimiter::new(50.0);
        let start = Instant::now();
        for _ in 0..50 {
            assert!(limiter.try_take(start).is_ok());
        }
        let wait = limiter.try_take(start).unwrap_err();
        assert!(wait <= Duration::from_millis(21) && wait >= Duration::from_millis(19));
        // 100 ms later: 5 more
        let later = start + Duration::from_millis(100);
        for _ in 0..5 {
            assert!(limiter.try_take(later).is_ok());
        }
        assert!(limiter.try_take(later).is_err());
    }

    #[test]
    fn time_until_a_deadline_is_never_negative() {
        assert_eq!(until(&at(10), &at(12)), Duration::from_secs(2));
        assert_eq!(until(&at(10), &at(8)), Duration::ZERO);
    }
}
