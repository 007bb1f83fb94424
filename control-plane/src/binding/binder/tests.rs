use super::*;
use crate::binding::placement::SchedulerPlacer;
use serde_json::json;

fn cluster(name: &str) -> Arc<Cluster> {
    Arc::new(Cluster::new(name, Default::default()))
}

fn binding(spec: Value, scheduled: Option<&str>) -> ResourceBinding {
    let mut b: ResourceBinding = serde_json::from_value(json!({
        "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
        "metadata": {"name": "w-deployment", "namespace": "ns"},
        "spec": spec,
    }))
    .unwrap();
    if let Some(s) = scheduled {
        b.status = Some(
            serde_json::from_value(json!({"conditions": [{
            "type": "Scheduled", "status": s, "reason": "x", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "lastScheduledTime": "2026-01-01T00:00:00Z"}))
            .unwrap(),
        );
    }
    b
}

#[test]
fn a_heartbeat_that_only_moves_its_time_changes_no_decision_input() {
    let mut c = (*member("a", None)).clone();
    let before = decision_fingerprint(&c);
    c.metadata.resource_version = Some("42".into());
    if let Some(s) = c.status.as_mut() {
        s.last_heartbeat_time = Some(at(30));
    }
    assert_eq!(decision_fingerprint(&c), before);
    // The inventory, the Ready condition, taints and labels are decision inputs.
    let mut noticed = c.clone();
    if let Some(s) = noticed.status.as_mut() {
        s.node_groups =
            serde_json::from_value(json!([{"count": 1, "free": {"nvidia.com/gpu": "8"}}])).unwrap();
    }
    assert_ne!(decision_fingerprint(&noticed), before);
    let mut lost = c.clone();
    if let Some(s) = lost.status.as_mut() {
        s.conditions[0].status = "Unknown".into();
    }
    assert_ne!(decision_fingerprint(&lost), before);
    let mut labelled = c.clone();
    labelled.metadata.labels = Some([("region".to_string(), "eu".to_string())].into());
    assert_ne!(decision_fingerprint(&labelled), before);
}

#[test]
fn scheduling_happens_only_when_something_moved() {
    let spec = json!({"resource": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "w"},
                      "replicas": 3, "clusters": [{"name": "a", "replicas": 3}]});
    let desired: ResourceBindingSpec = serde_json::from_value(spec.clone()).unwrap();
    let clusters = vec![cluster("a"), cluster("b")];
    assert!(needs_scheduling(None, &desired, &clusters));
    let current = binding(spec.clone(), Some("True"));
    assert!(!needs_scheduling(Some(&current), &desired, &clusters));
    // replicas changed
    let mut resized = desired.clone();
    resized.replicas = 5;
    assert!(needs_scheduling(Some(&current), &resized, &clusters));
    // its cluster is gone
    assert!(needs_scheduling(Some(&current), &desired, &[cluster("b")]));
    // not scheduled last time
    let failed = binding(spec.clone(), Some("False"));
    assert!(needs_scheduling(Some(&failed), &desired, &clusters));
    // a reschedule asked after the last schedule
    let mut asked = spec;
    asked["rescheduleTriggeredAt"] = json!("2026-02-01T00:00:00Z");
    let current = binding(asked.clone(), Some("True"));
    let desired: ResourceBindingSpec = serde_json::from_value(asked).unwrap();
    assert!(needs_scheduling(Some(&current), &desired, &clusters));
}

/// Places on the first cluster (by the order given) that no eviction task or history entry
/// names, as the ClusterEviction filter would.
struct FirstFree;

impl Placer for FirstFree {
    fn place(
        &self,
        binding: &ResourceBinding,
        clusters: &[Arc<Cluster>],
        _now: &Time,
    ) -> Result<Vec<TargetCluster>, Unschedulable> {
        let spec = &binding.spec;
        clusters
            .iter()
            .map(|c| c.name_any())
            .find(|n| {
                !spec
                    .graceful_eviction_tasks
                    .iter()
                    .any(|t| &t.from_cluster == n)
                    && !spec.eviction_history.iter().any(|r| &r.cluster_name == n)
            })
            .map(|name| vec![TargetCluster { name, replicas: 0 }])
            .ok_or_else(|| Unschedulable {
                summary: "0/1 clusters are available".into(),
                rejections: Vec::new(),
            })
    }
}

fn at(second: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_900_000_000 + second).unwrap())
}

fn member(name: &str, ready_since: Option<(&str, i64)>) -> Arc<Cluster> {
    let mut c = Cluster::new(name, Default::default());
    let (status, since) = ready_since.unwrap_or(("True", 0));
    c.status = Some(
        serde_json::from_value(json!({"conditions": [{
            "type": "Ready", "status": status, "reason": "x", "message": "",
            "lastTransitionTime": at(since).0.to_string()}]}))
        .unwrap(),
    );
    Arc::new(c)
}

/// An AppWrapper-less Job binding placed on `placed`, scheduled, with these status items.
fn placed(failover: Value, placed: &[&str], items: Value) -> ResourceBinding {
    let clusters: Vec<Value> = placed.iter().map(|c| json!({"name": c})).collect();
    serde_json::from_value(json!({
        "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
        "metadata": {"name": "w-job", "namespace": "ns", "generation": 2},
        "spec": {"resource": {"apiVersion": "batch/v1", "kind": "Job", "name": "w"},
                 "clusters": clusters, "failover": failover},
        "status": {"schedulerObservedGeneration": 2, "aggregatedStatus": items,
                   "lastScheduledTime": at(0).0.to_string(),
                   "conditions": [{"type": "Scheduled", "status": "True", "reason": "Success",
                                   "message": "", "lastTransitionTime": at(0).0.to_string()}]}
    }))
    .unwrap()
}

/// Unhealthy since the start of second `since`: the hub's whole-second `unhealthySince` is
/// written in the second before (a whole-second time counts from the end of its second).
fn unhealthy(cluster: &str, since: i64, class: &str) -> Value {
    json!({"clusterName": cluster, "applied": true, "health": "Unhealthy",
           "failureClass": class, "healthReason": "FoundFailedPods: pod p failed",
           "unhealthySince": at(since - 1).0.to_string(),
           "firstObservedAt": at(0).0.to_string(), "lastHealthyTime": at(0).0.to_string()})
}

fn app_failover(toleration: i32) -> Value {
    json!({"application": {"decisionConditions": {"tolerationSeconds": toleration},
                           "purgeMode": "Gracefully"}})
}

fn plan_at(
    current: &ResourceBinding,
    clusters: &[Arc<Cluster>],
    now: i64,
    limiter: &Mutex<EvictionRateLimiter>,
    instant: Instant,
) -> Planned {
    let now = at(now);
    plan(
        Some(current),
        current.clone(),
        &PlanInputs {
            clusters,
            placer: &FirstFree,
            cluster_evictions: limiter,
            now: &now,
            instant,
            scheduling_seconds: None,
        },
    )
}

fn names(spec: &ResourceBindingSpec) -> Vec<&str> {
    spec.clusters.iter().map(|c| c.name.as_str()).collect()
}

#[test]
fn an_unhealthy_placement_moves_in_one_write_once_its_toleration_is_over() {
    let b = placed(
        app_failover(60),
        &["a"],
        json!([unhealthy("a", 100, "Infrastructure")]),
    );
    let clusters = [member("a", None), member("b", None)];
    let limiter = Mutex::new(EvictionRateLimiter::new(50.0));
    let early = plan_at(&b, &clusters, 159, &limiter, Instant::now());
    assert_eq!(names(&early.spec), ["a"]);
    assert!(early.scheduling.is_none() && early.spec.graceful_eviction_tasks.is_empty());
    // The binder looks again exactly when the toleration ends.
    assert_eq!(early.retry, Some(Duration::from_secs(1)));

    let due = plan_at(&b, &clusters, 160, &limiter, Instant::now());
    assert_eq!(names(&due.spec), ["b"]);
    assert!(matches!(due.scheduling, Some(Ok(()))));
    let task = &due.spec.graceful_eviction_tasks[0];
    assert_eq!(
        (task.from_cluster.as_str(), task.reason.as_str()),
        ("a", "ApplicationFailure")
    );
    assert_eq!(task.clusters_before_failover, ["a"]);
    let record = &due.spec.eviction_history[0];
    assert_eq!(record.cluster_name, "a");
    assert_eq!(
        record.failure_class,
        Some(lifeboat_api::health::FailureClass::Infrastructure)
    );
    assert_eq!(record.evicted_at, at(160));
    assert!(due.blocked.is_empty());
}

/// A Directly eviction's block (and so its fence) is decided on the binding as the pass
/// wrote it, in that pass: the echo of the write is not looked at again.
#[test]
fn a_directly_eviction_is_blocked_on_its_purge_in_the_pass_that_writes_it() {
    let limiter = Mutex::new(EvictionRateLimiter::new(50.0));
    // An application failure in a Ready cluster: its agent confirms the purge.
    let application = placed(
        json!({"application": {"decisionConditions": {"tolerationSeconds": 0},
                               "purgeMode": "Directly"}}),
        &["a"],
        json!([unhealthy("a", 100, "Infrastructure")]),
    );
    let ready = [member("a", None), member("b", None)];
    // A cluster not Ready since 50 with a toleration of 60 s: nobody there can confirm it.
    let cluster = placed(
        json!({"cluster": {"tolerationSeconds": 60, "purgeMode": "Directly"}}),
        &["a"],
        json!([]),
    );
    let lost = [member("a", Some(("False", 50))), member("b", None)];
    for (binding, clusters, reason) in [
        (&application, &ready, api_binding::BLOCKED_WAITING_FOR_PURGE),
        (&cluster, &lost, api_binding::BLOCKED_WAITING_FOR_FENCE),
    ] {
        let due = plan_at(binding, clusters, 160, &limiter, Instant::now());
        assert_eq!(names(&due.spec), ["b"]);
        assert!(due.blocked.is_empty(), "nothing waits before the write");
        let mut written = binding.clone();
        written.spec = due.spec;
        written.metadata.generation = Some(3);
        let now = at(160);
        let after = after_write(
            &written,
            &PlanInputs {
                clusters,
                placer: &FirstFree,
                cluster_evictions: &limiter,
                now: &now,
                instant: Instant::now(),
                scheduling_seconds: None,
            },
        )
        .expect("the written binding has nothing more to decide");
        let blocked: Vec<(&str, &str)> = after
            .blocked
            .iter()
            .map(|b| (b.cluster.as_str(), b.reason))
            .collect();
        assert_eq!(blocked, [("a", reason)]);
    }
}

#[test]
fn no_other_cluster_fits_keeps_the_copy_and_says_so() {
    let b = placed(
        app_failover(0),
        &["a"],
        json!([unhealthy("a", 100, "Infrastructure")]),
    );
    let limiter = Mutex::new(EvictionRateLimiter::new(50.0));
    let planned = plan_at(&b, &[member("a", None)], 100, &limiter, Instant::now());
    assert_eq!(names(&planned.spec), ["a"]);
    assert!(planned.spec.graceful_eviction_tasks.is_empty());
    assert!(planned.spec.eviction_history.is_empty());
    // Scheduled still describes the placement the binding keeps.
    assert!(planned.scheduling.is_none());
    assert_eq!(planned.blocked.len(), 1);
    assert_eq!(planned.blocked[0].reason, phase::REASON_NO_OTHER_CLUSTER);
    assert_eq!(planned.retry, Some(NO_OTHER_CLUSTER_RETRY));
}

#[test]
fn an_application_failure_without_opt_in_stays_and_says_why() {
    let b = placed(
        app_failover(0),
        &["a"],
        json!([unhealthy("a", 100, "Application")]),
    );
    let limiter = Mutex::new(EvictionRateLimiter::new(50.0));
    let clusters = [member("a", None), member("b", None)];
    let planned = plan_at(&b, &clusters, 500, &limiter, Instant::now());
    assert_eq!(names(&planned.spec), ["a"]);
    assert!(planned.spec.eviction_history.is_empty());
    assert_eq!(planned.blocked[0].reason, "ApplicationFailure");
    assert_eq!(planned.retry, None);
}

#[test]
fn a_lost_clusters_bindings_move_after_its_toleration_at_the_eviction_rate() {
    // No failover policy at all: cluster failover still applies, with its defaults (60 s).
    let b = placed(Value::Null, &["a"], json!([]));
    // Written as second 0: the toleration counts from the end of that second.
    let clusters = [member("a", Some(("Unknown", 0))), member("b", None)];
    let limiter = Mutex::new(EvictionRateLimiter::new(1.0));
    let start = Instant::now();
    let early = plan_at(&b, &clusters, 31, &limiter, start);
    assert_eq!(names(&early.spec), ["a"]);
    assert_eq!(early.retry, Some(Duration::from_secs(30)));

    let first = plan_at(&b, &clusters, 61, &limiter, start);
    assert_eq!(names(&first.spec), ["b"]);
    assert_eq!(first.spec.eviction_history[0].reason, "ClusterFailure");
    // The next binding in the same instant waits for the bucket (1/s).
    let second = plan_at(&b, &clusters, 61, &limiter, start);
    assert_eq!(names(&second.spec), ["a"]);
    assert!(second.spec.graceful_eviction_tasks.is_empty());
    let wait = second.retry.unwrap();
    assert!(wait > Duration::from_millis(900) && wait <= Duration::from_secs(1));
    let later = plan_at(&b, &clusters, 62, &limiter, start + Duration::from_secs(1));
    assert_eq!(names(&later.spec), ["b"]);
}

/// A member whose GPU nodes are all of one capacity type, as its agent reports them.
fn gpu_member(name: &str, capacity_type: &str) -> Arc<Cluster> {
    let mut c = (*member(name, None)).clone();
    if let Some(status) = c.status.as_mut() {
        status.node_groups = serde_json::from_value(json!([{"count": 2,
            "free": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti", "pods": "110"},
            "capacityType": capacity_type}]))
        .unwrap();
        status.api_enablements = serde_json::from_value(json!([{
            "groupVersion": "workload.codeflare.dev/v1beta2",
            "resources": [{"name": "appwrappers", "kind": "AppWrapper"}]}]))
        .unwrap();
    }
    Arc::new(c)
}

#[test]
fn a_spot_appwrapper_whose_member_lost_its_spot_nodes_moves_with_the_real_scheduler() {
    // Every spot node of `a` has a reclamation notice (its agent reports on-demand capacity
    // only); the agent resets the AppWrapper (SpotReclamation). It cannot run in `a` any
    // more, so the hub moves it to `b` at once.
    let b: ResourceBinding = serde_json::from_value(json!({
        "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
        "metadata": {"name": "train-appwrapper", "namespace": "ml", "generation": 1},
        "spec": {
            "resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "train"},
            "replicas": 1, "gang": true,
            "replicaRequirements": {
                "resourceRequest": {"nvidia.com/gpu": "8"},
                "nodeClaim": {"nodeSelector": {"karpenter.sh/capacity-type": "spot"}}},
            "clusters": [{"name": "a", "replicas": 1}],
            "failover": {"application": {"decisionConditions": {"tolerationSeconds": 0}}}
        },
        "status": {"schedulerObservedGeneration": 1, "aggregatedStatus": [{
            "clusterName": "a", "applied": true, "health": "Unhealthy",
            "failureClass": "Infrastructure", "unhealthySince": at(10).0.to_string(),
            "healthReason": "SpotReclamation: pod train-0 runs on node a-1, which has a spot reclamation notice",
            "status": {"phase": "Resetting"}}]}
    }))
    .unwrap();
    let placer = SchedulerPlacer::new(&lifeboat_scheduler::SchedulerConfig::default());
    let limiter = Mutex::new(EvictionRateLimiter::new(50.0));
    let now = at(11);
    let clusters = [gpu_member("a", "on-demand"), gpu_member("b", "spot")];
    let planned = plan(
        Some(&b),
        b.clone(),
        &PlanInputs {
            clusters: &clusters,
            placer: &placer,
            cluster_evictions: &limiter,
            now: &now,
            instant: Instant::now(),
            scheduling_seconds: None,
        },
    );
    assert_eq!(names(&planned.spec), ["b"], "{:?}", planned.blocked);
    assert_eq!(planned.evicted.len(), 1);
    // While `a` still has room for it, the member's own reset is left to work.
    let roomy = [gpu_member("a", "spot"), gpu_member("b", "spot")];
    let kept = plan(
        Some(&b),
        b.clone(),
        &PlanInputs {
            clusters: &roomy,
            placer: &placer,
            cluster_evictions: &limiter,
            now: &now,
            instant: Instant::now(),
            scheduling_seconds: None,
        },
    );
    assert_eq!(names(&kept.spec), ["a"]);
}

#[test]
fn a_deleted_cluster_loses_its_placement_with_a_record() {
    let b = placed(Value::Null, &["a"], json!([]));
    let limiter = Mutex::new(EvictionRateLimiter::new(50.0));
    let planned = plan_at(&b, &[member("b", None)], 0, &limiter, Instant::now());
    assert_eq!(names(&planned.spec), ["b"]);
    assert_eq!(planned.spec.eviction_history[0].reason, "ClusterDeleted");
}

#[test]
fn the_old_copy_goes_once_the_new_placement_is_healthy() {
    let mut b = placed(
        app_failover(0),
        &["b"],
        json!([{"clusterName": "b", "applied": true, "health": "Unknown"}]),
    );
    b.spec.graceful_eviction_tasks.push(
        serde_json::from_value(json!({
        "fromCluster": "a", "purgeMode": "Gracefully", "reason": "ApplicationFailure",
        "producer": "lifeboat-hub", "gracePeriodSeconds": 600,
        "creationTimestamp": at(0).0.to_string()}))
        .unwrap(),
    );
    let clusters = [member("a", None), member("b", None)];
    let limiter = Mutex::new(EvictionRateLimiter::new(50.0));
    // Not Healthy yet: the task stays, and the binder looks again when the grace ends.
    let waiting = plan_at(&b, &clusters, 100, &limiter, Instant::now());
    assert_eq!(waiting.spec.graceful_eviction_tasks.len(), 1);
    assert_eq!(waiting.retry, Some(Duration::from_secs(500)));
    b.status.as_mut().unwrap().aggregated_status[0].health =
        lifeboat_api::binding::ResourceHealth::Healthy;
    let done = plan_at(&b, &clusters, 100, &limiter, Instant::now());
    assert!(done.spec.graceful_eviction_tasks.is_empty());
    assert_eq!(names(&done.spec), ["b"]);
}

#[test]
fn a_failing_workload_is_reset_in_place_in_the_same_write_then_moved() {
    let failover = json!({"application": {"decisionConditions": {"tolerationSeconds": 0},
        "purgeMode": "Gracefully", "inPlaceReset": {"limit": 1, "pauseSeconds": 2}}});
    let mut b = placed(
        failover,
        &["a"],
        json!([unhealthy("a", 100, "Infrastructure")]),
    );
    let clusters = [member("a", None), member("b", None)];
    let limiter = Mutex::new(EvictionRateLimiter::new(50.0));
    let reset = plan_at(&b, &clusters, 100, &limiter, Instant::now());
    assert_eq!(names(&reset.spec), ["a"], "reset in place, not moved");
    assert!(reset.scheduling.is_none() && reset.spec.eviction_history.is_empty());
    assert_eq!(reset.resets.len(), 1);
    assert_eq!(
        reset.resets[0].reset.reason(),
        failover::decide::RESET_FAILURE
    );
    let record = &reset.spec.in_place_resets[0];
    assert_eq!(
        (
            record.cluster_name.as_str(),
            record.generation,
            record.count
        ),
        ("a", 1, 1)
    );
    assert_eq!(record.last_requested_at, at(100));
    assert_eq!(record.pause_seconds, Some(2));
    assert_eq!(reset.resets[0].record, *record);
    // The work of cluster a asks for it.
    b.spec = reset.spec.clone();
    assert_eq!(
        dispatch::reset_request(&b, "a"),
        Some(lifeboat_api::protocol::ResetRequest {
            generation: 1,
            pause_seconds: 2
        })
    );
    // In flight: the next pass changes nothing until the reset's timeout (asked in second
    // 100, a 2 s pause, the default 600 s), and looks again then.
    let waiting = plan_at(&b, &clusters, 702, &limiter, Instant::now());
    assert!(waiting.resets.is_empty());
    assert_eq!(waiting.spec, b.spec);
    assert_eq!(waiting.retry, Some(Duration::from_secs(1)));
    // Never completed: moved, and the record leaves with the copy.
    let timed_out = plan_at(&b, &clusters, 703, &limiter, Instant::now());
    assert_eq!(names(&timed_out.spec), ["b"]);
    assert!(timed_out.spec.in_place_resets.is_empty());
    assert_eq!(
        timed_out.spec.eviction_history[0].reason,
        "InPlaceResetTimedOut"
    );
    // Re-created (generation 1), failing again: the limit is used up, it moves, and the
    // record leaves with the copy.
    b.status.as_mut().unwrap().aggregated_status[0].reset_generation = Some(1);
    let moved = plan_at(&b, &clusters, 10_000, &limiter, Instant::now());
    assert!(moved.resets.is_empty());
    assert_eq!(names(&moved.spec), ["b"]);
    assert!(moved.spec.in_place_resets.is_empty());
    assert_eq!(moved.spec.eviction_history[0].cluster_name, "a");
}

#[test]
fn policy_labels_are_label_safe() {
    let long = PolicyReference {
        kind: "PropagationPolicy".into(),
        namespace: "n".repeat(40),
        name: "p".repeat(40),
        generation: None,
    };
    assert!(policy_label(&long).len() <= 63);
    let cpp = PolicyReference {
        kind: "ClusterPropagationPolicy".into(),
        namespace: String::new(),
        name: "gpu".into(),
        generation: None,
    };
    assert_eq!(policy_label(&cpp), "gpu");
}
