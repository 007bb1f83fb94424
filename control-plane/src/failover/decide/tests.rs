use super::*;
use crate::work::dispatch::preserved_labels;
use lifeboat_api::binding::{InPlaceResetRecord, TargetCluster};
use serde_json::{Value, json};

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(1_900_000_000 + second).unwrap())
}

fn binding(failover: Value, clusters: &[&str], items: Value) -> ResourceBinding {
    let clusters: Vec<Value> = clusters.iter().map(|c| json!({"name": c})).collect();
    serde_json::from_value(json!({
        "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
        "metadata": {"name": "w", "namespace": "ns", "generation": 3},
        "spec": {"resource": {"apiVersion": "batch/v1", "kind": "Job", "name": "w"},
                 "clusters": clusters, "failover": failover},
        "status": {"schedulerObservedGeneration": 3, "aggregatedStatus": items}
    }))
    .unwrap()
}

/// Unhealthy since the start of second `since`: the hub's whole-second `unhealthySince` is
/// written in the second before (a whole-second time counts from the end of its second).
fn unhealthy(cluster: &str, since: i64, class: &str) -> Value {
    json!({"clusterName": cluster, "applied": true, "health": "Unhealthy",
           "failureClass": class, "healthReason": "FoundFailedPods: pod p failed",
           "unhealthySince": at(since - 1).0.to_string(),
           "firstObservedAt": at(0).0.to_string(),
           "lastHealthyTime": at(0).0.to_string(),
           "status": {"phase": "Running", "checkpoint": "ckpt-42"}})
}

fn ready(names: &[&str]) -> BTreeMap<String, ClusterState> {
    names
        .iter()
        .map(|n| (n.to_string(), ClusterState::default()))
        .collect()
}

fn decide_at(b: &ResourceBinding, now: i64, clusters: &BTreeMap<String, ClusterState>) -> Decision {
    decide_with(b, now, clusters, false, true)
}

fn decide_with(
    b: &ResourceBinding,
    now: i64,
    clusters: &BTreeMap<String, ClusterState>,
    resets_itself: bool,
    fits: bool,
) -> Decision {
    let now = at(now);
    let fits = move |_: &str| fits;
    decide(
        b,
        &Context {
            now: &now,
            clusters,
            resets_itself,
            fits: &fits,
        },
    )
}

fn app(extra: Value) -> Value {
    let mut app =
        json!({"decisionConditions": {"tolerationSeconds": 60}, "purgeMode": "Gracefully"});
    if let (Some(a), Some(e)) = (app.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            a.insert(k.clone(), v.clone());
        }
    }
    json!({"application": app})
}

#[test]
fn an_unhealthy_placement_is_evicted_once_the_toleration_is_over() {
    let b = binding(
        app(json!({})),
        &["a", "b"],
        json!([unhealthy("a", 100, "Infrastructure")]),
    );
    let clusters = ready(&["a", "b"]);
    let d = decide_at(&b, 159, &clusters);
    assert!(d.evictions.is_empty());
    assert_eq!(d.next_check, Some(at(160)));
    let d = decide_at(&b, 160, &clusters);
    assert_eq!(d.evictions.len(), 1);
    let e = &d.evictions[0];
    assert_eq!((e.cluster.as_str(), e.reason), ("a", "ApplicationFailure"));
    assert_eq!(e.class, FailureClass::Infrastructure);
    assert_eq!(e.purge_mode, PurgeMode::Gracefully);
    assert_eq!(e.grace_period_seconds, Some(600));
    assert_eq!(e.block_seconds, Some(600));
}

#[test]
fn a_whole_second_unhealthy_since_counts_from_the_end_of_its_second() {
    // Written at second 100 (whole seconds, as read back from the binding): the unhealthy
    // state began somewhere in second 100, so a 60 s toleration is over at 161, not 160.
    let mut item = unhealthy("a", 0, "Infrastructure");
    item["unhealthySince"] = json!(at(100).0.to_string());
    let b = binding(app(json!({})), &["a", "b"], json!([item]));
    let clusters = ready(&["a", "b"]);
    let d = decide_at(&b, 160, &clusters);
    assert!(d.evictions.is_empty());
    assert_eq!(d.next_check, Some(at(161)));
    assert_eq!(decide_at(&b, 161, &clusters).evictions.len(), 1);
}

#[test]
fn a_toleration_of_one_second_costs_one_second_to_the_microsecond() {
    // The processor took the Unhealthy report at 100.3 s; the binding keeps that to the
    // microsecond through the API (JSON and back).
    let taken = at(100).0 + SignedDuration::from_millis(300);
    let mut item = unhealthy("a", 0, "Infrastructure");
    item["unhealthySince"] = serde_json::to_value(lifeboat_api::time::stored(taken)).unwrap();
    let b = binding(
        app(json!({"decisionConditions": {"tolerationSeconds": 1}})),
        &["a", "b"],
        json!([item]),
    );
    let clusters = ready(&["a", "b"]);
    let decide_at_time = |now: Timestamp| {
        let now = Time(now);
        decide(
            &b,
            &Context {
                now: &now,
                clusters: &clusters,
                resets_itself: false,
                fits: &|_| true,
            },
        )
    };
    let over = taken + SignedDuration::from_secs(1);
    // Not a microsecond early...
    let d = decide_at_time(over - SignedDuration::from_micros(1));
    assert!(d.evictions.is_empty());
    // ...and at most a microsecond late (not the rest of second 101).
    let next = d.next_check.expect("a next check").0;
    assert!(
        next >= over && next <= over + SignedDuration::from_micros(1),
        "{next}"
    );
    let d = decide_at_time(next);
    assert_eq!(d.evictions.len(), 1);
    assert_eq!(
        d.evictions[0].failing_since,
        Some(lifeboat_api::time::stored(taken))
    );
}

#[test]
fn zero_toleration_evicts_in_the_same_pass() {
    let b = binding(
        app(json!({"decisionConditions": {"tolerationSeconds": 0}, "blockPredecessorSeconds": 0})),
        &["a"],
        json!([unhealthy("a", 100, "Capacity")]),
    );
    let d = decide_at(&b, 100, &ready(&["a"]));
    assert_eq!(d.evictions.len(), 1);
    // blockPredecessorSeconds 0: the cluster never gets this workload again
    assert_eq!(d.evictions[0].block_seconds, None);
}

#[test]
fn unknown_and_healthy_placements_stay() {
    let mut item = unhealthy("a", 100, "Infrastructure");
    item["health"] = json!("Unknown");
    let b = binding(app(json!({})), &["a"], json!([item]));
    assert_eq!(decide_at(&b, 10_000, &ready(&["a"])), Decision::default());
}

#[test]
fn the_delay_precondition_waits_after_the_first_status() {
    let b = binding(
        app(
            json!({"decisionConditions": {"tolerationSeconds": 0}, "preConditions": {"delaySeconds": 100}}),
        ),
        &["a"],
        json!([unhealthy("a", 10, "Infrastructure")]),
    );
    let d = decide_at(&b, 50, &ready(&["a"]));
    assert!(d.evictions.is_empty());
    assert_eq!(d.next_check, Some(at(100)));
    assert_eq!(decide_at(&b, 100, &ready(&["a"])).evictions.len(), 1);
}

#[test]
fn healthy_state_precondition_leaves_never_healthy_placements_to_the_cluster() {
    let mut item = unhealthy("a", 10, "Infrastructure");
    item.as_object_mut().unwrap().remove("lastHealthyTime");
    let b = binding(
        app(
            json!({"decisionConditions": {"tolerationSeconds": 0}, "preConditions": {"healthyState": "Healthy"}}),
        ),
        &["a"],
        json!([item]),
    );
    let d = decide_at(&b, 50, &ready(&["a"]));
    assert!(d.evictions.is_empty());
    assert_eq!(d.blocked[0].reason, "NeverHealthy");
}

#[test]
fn application_failures_stay_unless_the_policy_moves_them() {
    let b = binding(
        app(json!({})),
        &["a"],
        json!([unhealthy("a", 0, "Application")]),
    );
    let d = decide_at(&b, 1000, &ready(&["a"]));
    assert!(d.evictions.is_empty());
    assert_eq!(d.blocked[0].reason, "ApplicationFailure");
    assert!(d.blocked[0].message.contains("moveOnApplicationFailure"));
    let b = binding(
        app(json!({"moveOnApplicationFailure": true})),
        &["a"],
        json!([unhealthy("a", 0, "Application")]),
    );
    assert_eq!(decide_at(&b, 1000, &ready(&["a"])).evictions.len(), 1);
}

#[test]
fn an_appwrapper_moves_when_failed_out_of_room_or_losing_its_nodes_without_room() {
    let clusters = ready(&["a"]);
    let with = |phase: &str, class: &str, reason: &str| {
        let mut item = unhealthy("a", 0, class);
        item["status"]["phase"] = json!(phase);
        item["healthReason"] = json!(reason);
        binding(app(json!({})), &["a"], json!([item]))
    };
    // resetting in place: the agent's retry loop is on it
    let b = with("Resetting", "Infrastructure", "FoundFailedPods: x");
    assert!(
        decide_with(&b, 1000, &clusters, true, true)
            .evictions
            .is_empty()
    );
    // retries exhausted
    let b = with("Failed", "Infrastructure", "FoundFailedPods: x");
    assert_eq!(
        decide_with(&b, 1000, &clusters, true, true).evictions.len(),
        1
    );
    // no room in the cluster
    let b = with(
        "Running",
        "Capacity",
        "InsufficientPodsReady: unschedulable",
    );
    assert_eq!(
        decide_with(&b, 1000, &clusters, true, true).evictions.len(),
        1
    );
    // a spot notice: moved only when the cluster has no other room
    let b = with(
        "Resetting",
        "Infrastructure",
        "SpotReclamation: pod p on node n",
    );
    assert!(
        decide_with(&b, 1000, &clusters, true, true)
            .evictions
            .is_empty()
    );
    assert_eq!(
        decide_with(&b, 1000, &clusters, true, false)
            .evictions
            .len(),
        1
    );
}

#[test]
fn in_place_resets_come_first_each_after_a_pause_and_a_new_toleration() {
    let failover = app(json!({"decisionConditions": {"tolerationSeconds": 10},
                              "inPlaceReset": {"limit": 2, "pauseSeconds": 5}}));
    let mut b = binding(
        failover,
        &["a"],
        json!([unhealthy("a", 0, "Infrastructure")]),
    );
    let clusters = ready(&["a"]);
    assert_eq!(decide_at(&b, 9, &clusters).next_check, Some(at(10)));
    let d = decide_at(&b, 10, &clusters);
    assert_eq!(d.resets.len(), 1);
    let reset = &d.resets[0];
    assert_eq!(
        (reset.cluster.as_str(), &reset.manual, reset.pause_seconds),
        ("a", &None, 5)
    );
    assert_eq!(reset.class, Some(FailureClass::Infrastructure));
    assert_eq!(reset.reason(), RESET_FAILURE);
    assert!(reset.message.contains("reset 1 of 2"), "{}", reset.message);
    assert!(d.evictions.is_empty());
    let record = |count, at_s| InPlaceResetRecord {
        cluster_name: "a".into(),
        generation: i64::from(count),
        count,
        last_requested_at: at(at_s),
        manual_request: None,
        pause_seconds: Some(5),
    };
    // (each reset completed: the agent reports the re-created object's generation)
    b.status.as_mut().unwrap().aggregated_status[0].reset_generation = Some(2);
    b.spec.in_place_resets = vec![record(1, 10)];
    let d = decide_at(&b, 20, &clusters);
    assert!(d.resets.is_empty() && d.evictions.is_empty());
    assert_eq!(d.next_check, Some(at(25)));
    assert_eq!(decide_at(&b, 25, &clusters).resets.len(), 1);
    b.spec.in_place_resets = vec![record(2, 25)];
    assert_eq!(decide_at(&b, 39, &clusters).next_check, Some(at(40)));
    let d = decide_at(&b, 40, &clusters);
    assert!(d.resets.is_empty());
    assert_eq!(d.evictions.len(), 1);
}

#[test]
fn a_manual_reset_is_served_once() {
    let mut b = binding(json!(null), &["a"], json!([]));
    b.metadata.annotations = Some(BTreeMap::from([(
        lifeboat_api::binding::ANNOTATION_RESET_REQUEST.to_string(),
        "a/n1".to_string(),
    )]));
    let d = decide_at(&b, 1, &ready(&["a"]));
    assert_eq!(d.resets[0].manual.as_deref(), Some("a/n1"));
    assert_eq!(d.resets[0].reason(), RESET_MANUAL);
    assert!(manual_reset_pending(&b));
    apply_resets(&mut b.spec, &d.resets, &at(1));
    assert_eq!(
        b.spec.in_place_resets,
        vec![InPlaceResetRecord {
            cluster_name: "a".into(),
            generation: 1,
            count: 0,
            last_requested_at: at(1),
            manual_request: Some("a/n1".into()),
            pause_seconds: None,
        }]
    );
    assert!(!manual_reset_pending(&b));
    assert!(decide_at(&b, 2, &ready(&["a"])).resets.is_empty());
    // A new value asks again, once the first reset is done.
    b.metadata.annotations = Some(BTreeMap::from([(
        lifeboat_api::binding::ANNOTATION_RESET_REQUEST.to_string(),
        "a/n2".to_string(),
    )]));
    assert!(
        decide_at(&b, 3, &ready(&["a"])).resets.is_empty(),
        "in flight"
    );
    b.status = Some(
        serde_json::from_value(json!({"aggregatedStatus": [
            {"clusterName": "a", "applied": true, "health": "Healthy", "resetGeneration": 1}]}))
        .unwrap(),
    );
    assert_eq!(
        decide_at(&b, 3, &ready(&["a"])).resets[0].manual.as_deref(),
        Some("a/n2")
    );
    // A request naming another cluster (or none placed) asks nothing.
    b.metadata.annotations = Some(BTreeMap::from([(
        lifeboat_api::binding::ANNOTATION_RESET_REQUEST.to_string(),
        "b/n3".to_string(),
    )]));
    assert!(!manual_reset_pending(&b));
    assert!(decide_at(&b, 4, &ready(&["a"])).resets.is_empty());
}

#[test]
fn a_manual_reset_pauses_as_the_policy_says() {
    let mut b = binding(
        app(json!({"inPlaceReset": {"limit": 0, "pauseSeconds": 7}})),
        &["a"],
        json!([]),
    );
    b.metadata.annotations = Some(BTreeMap::from([(
        lifeboat_api::binding::ANNOTATION_RESET_REQUEST.to_string(),
        "a/x".to_string(),
    )]));
    let d = decide_at(&b, 1, &ready(&["a"]));
    assert_eq!(d.resets[0].pause_seconds, 7);
    let applied = apply_resets(&mut b.spec, &d.resets, &at(1));
    assert_eq!(applied[0].record.pause_seconds, Some(7));
    assert_eq!(applied[0].record.count, 0, "manual resets do not count");
}

/// The reset cycle of scenario 11 with a fake clock: a failing workload (toleration 0,
/// `inPlaceReset {limit: 2, pauseSeconds: 1}`) is reset, nothing more is decided while the
/// reset is in flight (the report is of the old object), the next failure resets again, and
/// the third moves it.
#[test]
fn a_reset_in_flight_is_not_decided_again_and_the_limit_then_moves() {
    let failover = app(json!({"decisionConditions": {"tolerationSeconds": 0},
                              "inPlaceReset": {"limit": 2, "pauseSeconds": 1}}));
    let mut b = binding(
        failover,
        &["a", "b"],
        json!([unhealthy("a", 100, "Infrastructure")]),
    );
    let clusters = ready(&["a", "b"]);
    let set_reported = |b: &mut ResourceBinding, generation: Option<i64>, health: &str| {
        let item = &mut b.status.as_mut().unwrap().aggregated_status[0];
        item.reset_generation = generation;
        item.health = serde_json::from_value(json!(health)).unwrap();
    };
    // First failure: reset 1.
    let d = decide_at(&b, 100, &clusters);
    assert!(d.evictions.is_empty());
    let applied = apply_resets(&mut b.spec, &d.resets, &at(100));
    assert_eq!(
        (applied[0].record.generation, applied[0].record.count),
        (1, 1)
    );
    assert_eq!(applied[0].record.pause_seconds, Some(1));
    // In flight: the stale Unhealthy report neither resets again nor evicts; the decision only
    // wakes for the reset's timeout (the default 600 s after the pause, from the end of the
    // written second).
    assert!(reset_in_flight(&b, "a"));
    for now in [100, 101, 500, 701] {
        assert_eq!(
            decide_at(&b, now, &clusters),
            Decision {
                next_check: Some(at(702)),
                ..Decision::default()
            },
            "at {now}"
        );
    }
    // The agent re-created it (generation 1): Unknown at first, nothing to do.
    set_reported(&mut b, Some(1), "Unknown");
    assert!(!reset_in_flight(&b, "a"));
    assert_eq!(decide_at(&b, 103, &clusters), Decision::default());
    // The new copy fails too: reset 2, once the pause after the first is over.
    set_reported(&mut b, Some(1), "Unhealthy");
    let d = decide_at(&b, 100, &clusters);
    assert!(d.resets.is_empty() && d.evictions.is_empty());
    assert_eq!(d.next_check, Some(at(101)));
    let d = decide_at(&b, 104, &clusters);
    assert!(
        d.resets[0].message.contains("reset 2 of 2"),
        "{:?}",
        d.resets
    );
    let applied = apply_resets(&mut b.spec, &d.resets, &at(104));
    assert_eq!(
        (applied[0].record.generation, applied[0].record.count),
        (2, 2)
    );
    let d = decide_at(&b, 200, &clusters);
    assert!(d.evictions.is_empty() && d.resets.is_empty(), "in flight");
    // Third failure: the limit is used up, it moves.
    set_reported(&mut b, Some(2), "Unhealthy");
    let d = decide_at(&b, 106, &clusters);
    assert!(d.resets.is_empty());
    assert_eq!(d.evictions.len(), 1);
    assert_eq!(d.evictions[0].cluster, "a");
    apply_evictions(&mut b.spec, &d.evictions, &at(106));
    assert!(
        b.spec.in_place_resets.is_empty(),
        "the record leaves with the copy"
    );
    assert_eq!(b.spec.eviction_history[0].cluster_name, "a");
}

/// A reset whose workload the cluster never deletes (a finalizer) or re-creates: after the pause
/// and `timeoutSeconds`, the placement is moved as an application failure would be, with class
/// Infrastructure whatever the class of the failure that asked for the reset.
#[test]
fn a_reset_that_never_completes_is_moved_after_its_timeout() {
    let failover = app(json!({"decisionConditions": {"tolerationSeconds": 0},
                              "inPlaceReset": {"limit": 3, "pauseSeconds": 5, "timeoutSeconds": 60},
                              "purgeMode": "Directly",
                              "blockPredecessorSeconds": 120,
                              "statePreservation": {"rules": [
                                  {"aliasLabelName": "ckpt", "jsonPath": "{.checkpoint}"}]}}));
    let mut b = binding(
        failover,
        &["a", "b"],
        json!([unhealthy("a", 100, "Unknown")]),
    );
    let clusters = ready(&["a", "b"]);
    let d = decide_at(&b, 100, &clusters);
    assert!(d.evictions.is_empty());
    assert_eq!(d.resets.len(), 1);
    // Written back with whole seconds.
    apply_resets(&mut b.spec, &d.resets, &at(100));
    // Asked in second 100, a 5 s pause, 60 s for the reset: over at 101 + 65.
    let d = decide_at(&b, 165, &clusters);
    assert!(d.evictions.is_empty() && d.resets.is_empty() && d.blocked.is_empty());
    assert_eq!(d.next_check, Some(at(166)));
    let d = decide_at(&b, 166, &clusters);
    assert!(d.resets.is_empty());
    let [e] = d.evictions.as_slice() else {
        panic!("{:?}", d.evictions)
    };
    assert_eq!(
        (e.cluster.as_str(), e.reason),
        ("a", "InPlaceResetTimedOut")
    );
    assert_eq!(e.class, FailureClass::Infrastructure);
    assert_eq!(e.purge_mode, PurgeMode::Directly);
    assert_eq!(e.grace_period_seconds, None);
    assert_eq!(e.block_seconds, Some(120));
    assert_eq!(
        e.failing_since,
        Some(MicroTime(at(99).0)),
        "since the copy was Unhealthy"
    );
    assert_eq!(e.preserved.get("ckpt").map(String::as_str), Some("ckpt-42"));
    assert!(
        e.message.contains("in-place reset 1 asked of a")
            && e.message.contains("within 60s after its 5s pause")
            && e.message.contains("generation 0 done"),
        "{}",
        e.message
    );
    assert!(
        !crate::failover::phase::is_cluster_eviction(e),
        "one workload's failure: not rate-limited with cluster evictions"
    );
    // Completed in time (the agent reports the generation), nothing times out.
    b.status.as_mut().unwrap().aggregated_status[0].reset_generation = Some(1);
    b.status.as_mut().unwrap().aggregated_status[0].health = ResourceHealth::Healthy;
    assert_eq!(decide_at(&b, 10_000, &clusters), Decision::default());
}

/// A manual reset under a policy without application failover: nothing may move the workload,
/// so a reset that never completes (the default 600 s) blocks the failover and says why.
#[test]
fn a_manual_reset_that_never_completes_without_application_failover_is_blocked() {
    let mut healthy = unhealthy("a", 0, "Infrastructure");
    healthy["health"] = json!("Healthy");
    let mut b = binding(json!(null), &["a", "b"], json!([healthy]));
    b.metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION_RESET_REQUEST.to_string(),
        "a/1".to_string(),
    )]));
    let clusters = ready(&["a", "b"]);
    let d = decide_at(&b, 10, &clusters);
    assert_eq!(d.resets.len(), 1);
    apply_resets(&mut b.spec, &d.resets, &at(10));
    assert!(
        crate::failover::phase::wants_a_look(&b),
        "to see the timeout"
    );
    let d = decide_at(&b, 610, &clusters);
    assert!(d.blocked.is_empty());
    assert_eq!(d.next_check, Some(at(611)));
    let d = decide_at(&b, 611, &clusters);
    assert!(d.evictions.is_empty());
    let [blocked] = d.blocked.as_slice() else {
        panic!("{:?}", d.blocked)
    };
    assert_eq!(blocked.reason, "InPlaceResetTimedOut");
    assert!(
        blocked.message.contains("no failover.application"),
        "{}",
        blocked.message
    );
}

#[test]
fn a_reset_in_flight_still_yields_to_cluster_failover() {
    let mut b = binding(
        app(json!({"inPlaceReset": {"limit": 2}})),
        &["a", "b"],
        json!([unhealthy("a", 0, "Infrastructure")]),
    );
    apply_resets(
        &mut b.spec,
        &[Reset {
            cluster: "a".into(),
            manual: None,
            pause_seconds: 0,
            class: None,
            message: String::new(),
        }],
        &at(0),
    );
    let mut clusters = ready(&["a", "b"]);
    clusters.get_mut("a").unwrap().not_ready_since = Some(at(10));
    let d = decide_at(&b, 1000, &clusters);
    assert_eq!(d.evictions[0].reason, "ClusterFailure");
    // A reset for a cluster the binding is not placed on is not recorded.
    let mut spec = b.spec.clone();
    let applied = apply_resets(
        &mut spec,
        &[Reset {
            cluster: "z".into(),
            manual: None,
            pause_seconds: 0,
            class: None,
            message: String::new(),
        }],
        &at(0),
    );
    assert!(applied.is_empty());
    assert_eq!(spec.in_place_resets, b.spec.in_place_resets);
}

#[test]
fn a_lost_cluster_loses_its_placements_after_the_cluster_toleration() {
    let b = binding(
        json!({"cluster": {"purgeMode": "Directly", "tolerationSeconds": 30}}),
        &["a", "b"],
        json!([unhealthy("a", 0, "Infrastructure")]),
    );
    let mut clusters = ready(&["a", "b"]);
    clusters.get_mut("a").unwrap().not_ready_since = Some(at(100));
    let d = decide_at(&b, 129, &clusters);
    assert!(d.evictions.is_empty());
    assert_eq!(d.next_check, Some(at(130)));
    let d = decide_at(&b, 130, &clusters);
    assert_eq!(d.evictions.len(), 1);
    assert_eq!(d.evictions[0].reason, "ClusterFailure");
    assert_eq!(d.evictions[0].purge_mode, PurgeMode::Directly);
    // a deleted cluster (gone from the hub) at once, whatever the policy
    let b = binding(json!(null), &["gone"], json!([]));
    let d = decide_at(&b, 0, &clusters);
    assert_eq!(d.evictions[0].reason, "ClusterDeleted");
    assert_eq!(d.evictions[0].purge_mode, PurgeMode::Gracefully);
}

#[test]
fn evictions_leave_a_task_and_a_history_record() {
    let mut b = binding(
        app(json!({})),
        &["a", "b"],
        json!([unhealthy("a", 0, "Infrastructure")]),
    );
    let d = decide_at(&b, 100, &ready(&["a", "b"]));
    let evicted = apply_evictions(&mut b.spec, &d.evictions, &at(100));
    assert_eq!(evicted, ["a"]);
    assert_eq!(b.spec.clusters.len(), 1);
    let task = &b.spec.graceful_eviction_tasks[0];
    assert_eq!(task.from_cluster, "a");
    assert_eq!(task.clusters_before_failover, ["a", "b"]);
    assert_eq!(task.creation_timestamp, Some(at(100)));
    let record = &b.spec.eviction_history[0];
    assert_eq!(record.expires_at, Some(at(700)));
    assert_eq!(record.failure_class, Some(FailureClass::Infrastructure));
    // evicting again from a cluster no longer placed there changes nothing
    assert!(apply_evictions(&mut b.spec, &d.evictions, &at(101)).is_empty());
}

fn with_task(mode: &str, extra: Value) -> ResourceBinding {
    let mut task = json!({"fromCluster": "a", "purgeMode": mode, "reason": "ApplicationFailure",
        "producer": "lifeboat-hub", "creationTimestamp": at(100).0.to_string(),
        "clustersBeforeFailover": ["a"]});
    if let (Some(t), Some(e)) = (task.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            t.insert(k.clone(), v.clone());
        }
    }
    let mut b = binding(app(json!({})), &["b"], json!([]));
    b.spec.graceful_eviction_tasks = vec![serde_json::from_value(task).unwrap()];
    b
}

fn settle_at(
    b: &ResourceBinding,
    now: i64,
    clusters: &BTreeMap<String, ClusterState>,
    confirmed: &[&str],
) -> (Vec<TaskChange>, Decision) {
    let now = at(now);
    let fits = |_: &str| true;
    let ctx = Context {
        now: &now,
        clusters,
        resets_itself: false,
        fits: &fits,
    };
    let mut decision = Decision::default();
    let confirmed = confirmed.iter().map(|s| s.to_string()).collect();
    (settle_tasks(b, &ctx, &confirmed, &mut decision), decision)
}

fn healthy_item(cluster: &str) -> Value {
    json!({"clusterName": cluster, "applied": true, "health": "Healthy"})
}

#[test]
fn gracefully_waits_for_the_new_copy_or_the_grace_period() {
    let mut b = with_task("Gracefully", json!({"gracePeriodSeconds": 60}));
    let clusters = ready(&["a", "b"]);
    let (changes, d) = settle_at(&b, 120, &clusters, &[]);
    assert!(changes.is_empty());
    assert_eq!(d.next_check, Some(at(160)));
    let (changes, _) = settle_at(&b, 160, &clusters, &[]);
    assert!(matches!(&changes[0], TaskChange::Remove { why, .. } if why.contains("grace")));
    b.status.as_mut().unwrap().aggregated_status =
        vec![serde_json::from_value(healthy_item("b")).unwrap()];
    let (changes, _) = settle_at(&b, 120, &clusters, &[]);
    assert!(matches!(&changes[0], TaskChange::Remove { why, .. } if why.contains("Healthy")));
}

#[test]
fn an_empty_placement_is_never_a_healthy_one() {
    // karmada#7455: nothing else fitted; the old copy must stay
    let mut b = with_task("Gracefully", json!({"gracePeriodSeconds": 600}));
    b.spec.clusters.clear();
    assert!(!new_placement_healthy(&b));
    let (changes, _) = settle_at(&b, 200, &ready(&["a"]), &[]);
    assert!(changes.is_empty());
}

#[test]
fn directly_creates_the_new_copy_only_after_the_old_one_is_gone() {
    let mut b = with_task("Directly", json!({}));
    let clusters = ready(&["a", "b"]);
    assert!(!may_create_in(&b.spec, "b"));
    assert!(may_create_in(&b.spec, "a"));
    let (changes, d) = settle_at(&b, 120, &clusters, &[]);
    assert!(changes.is_empty());
    assert_eq!(d.blocked[0].reason, "WaitingForPurge");
    // the agent reports the old copy gone after the eviction
    b.status.as_mut().unwrap().aggregated_status = vec![
        serde_json::from_value(json!({
        "clusterName": "a", "applied": false, "health": "Unknown",
        "observedAt": at(105).0.to_string(), "goneAt": at(105).0.to_string()}))
        .unwrap(),
    ];
    let (changes, _) = settle_at(&b, 120, &clusters, &[]);
    assert_eq!(
        changes,
        vec![TaskChange::Purged {
            cluster: "a".into(),
            evidence: PurgeEvidence::Agent,
        }]
    );
    apply_task_changes(&mut b.spec, &changes, &at(120));
    assert!(may_create_in(&b.spec, "b"));
    // a report from before the eviction proves nothing
    let mut early = with_task("Directly", json!({}));
    early.status.as_mut().unwrap().aggregated_status = vec![
        serde_json::from_value(json!({
        "clusterName": "a", "applied": false, "health": "Unknown",
        "observedAt": at(99).0.to_string(), "goneAt": at(99).0.to_string()}))
        .unwrap(),
    ];
    assert!(settle_at(&early, 120, &clusters, &[]).0.is_empty());
    // nor does a failed apply after it: the object may still run
    let mut unapplied = with_task("Directly", json!({}));
    unapplied.status.as_mut().unwrap().aggregated_status = vec![
        serde_json::from_value(json!({
        "clusterName": "a", "applied": false, "health": "Unknown",
        "appliedMessage": "admission webhook denied the update",
        "observedAt": at(105).0.to_string()}))
        .unwrap(),
    ];
    assert!(settle_at(&unapplied, 120, &clusters, &[]).0.is_empty());
}

#[test]
fn directly_on_a_lost_cluster_waits_for_evidence_never_for_time() {
    // The old copy's cluster has not been Ready since second 100: its agent may be dead, and a
    // dead agent suspends nothing (its pods keep running), so no amount of time purges it.
    let mut lost = ready(&["a", "b"]);
    lost.get_mut("a").unwrap().not_ready_since = Some(at(100));
    let b = with_task("Directly", json!({}));
    for second in [120, 1_000, 1_000_000] {
        let (changes, d) = settle_at(&b, second, &lost, &[]);
        assert!(changes.is_empty(), "at {second}: {changes:?}");
        assert_eq!(d.blocked[0].reason, "WaitingForFence");
        assert!(
            d.blocked[0]
                .message
                .contains("lifeboatctl confirm-purge ns/w a")
                && d.blocked[0].message.contains("fencing credential"),
            "{}",
            d.blocked[0].message
        );
        // nothing to wake for: the evidence changes the binding or the cluster
        assert_eq!(d.next_check, None);
    }
    // the hub's own fence reported it gone through the member's kube-apiserver
    let mut fenced = b.clone();
    fenced.status.as_mut().unwrap().aggregated_status = vec![
        serde_json::from_value(json!({
        "clusterName": "a", "applied": false, "health": "Unknown",
        "observedAt": at(130).0.to_string(), "goneAt": at(130).0.to_string(),
        "goneConfirmedBy": "Hub"}))
        .unwrap(),
    ];
    assert_eq!(
        settle_at(&fenced, 130, &lost, &[]).0,
        vec![TaskChange::Purged {
            cluster: "a".into(),
            evidence: PurgeEvidence::Hub,
        }]
    );
    // an operator confirmed it
    assert_eq!(
        settle_at(&b, 130, &lost, &["a"]).0,
        vec![TaskChange::Purged {
            cluster: "a".into(),
            evidence: PurgeEvidence::Operator,
        }]
    );
    // the Cluster being deleted on the hub: held until its agent removed the work and stopped
    let mut deleted = lost.clone();
    deleted.get_mut("a").unwrap().deleted = true;
    let (changes, d) = settle_at(&b, 130, &deleted, &[]);
    assert!(changes.is_empty());
    assert_eq!(d.blocked[0].reason, "WaitingForPurge");
    assert!(d.blocked[0].message.contains("being deleted"));
    // ... and once it is gone
    deleted.remove("a");
    assert_eq!(
        settle_at(&b, 130, &deleted, &[]).0,
        vec![TaskChange::Purged {
            cluster: "a".into(),
            evidence: PurgeEvidence::ClusterDeleted,
        }]
    );
    // a confirmation for another cluster is no evidence for this one
    assert!(settle_at(&b, 130, &lost, &["b"]).0.is_empty());
}

#[test]
fn never_keeps_the_old_copy_until_confirmed() {
    let b = with_task("Never", json!({"suppressDeletion": true}));
    let clusters = ready(&["a", "b"]);
    let (changes, d) = settle_at(&b, 100_000, &clusters, &[]);
    assert!(changes.is_empty());
    assert_eq!(d.blocked[0].reason, "WaitingForPurgeConfirmation");
    let (changes, _) = settle_at(&b, 100_000, &clusters, &["a"]);
    assert!(matches!(&changes[0], TaskChange::Remove { .. }));
}

#[test]
fn state_is_preserved_from_the_reflected_status() {
    let rules: StatePreservation = serde_json::from_value(json!({"rules": [
        {"aliasLabelName": "training.example.com/checkpoint", "jsonPath": "{.checkpoint}"},
        {"aliasLabelName": "missing", "jsonPath": "{.nothing.here}"},
        {"aliasLabelName": "bad", "jsonPath": "{.phrase}"},
        {"aliasLabelName": "step", "jsonPath": "{.progress.step}"}
    ]}))
    .unwrap();
    let item: AggregatedStatusItem = serde_json::from_value(json!({
        "clusterName": "a",
        "status": {"checkpoint": "ckpt-42", "phrase": "not a label!", "progress": {"step": 1200}}
    }))
    .unwrap();
    let labels = preserve(&rules, Some(&item));
    assert_eq!(
        labels,
        BTreeMap::from([
            (
                "training.example.com/checkpoint".to_string(),
                "ckpt-42".to_string()
            ),
            ("step".to_string(), "1200".to_string())
        ])
    );
    assert!(preserve(&rules, None).is_empty());
}

#[test]
fn the_newest_preserved_state_follows_every_later_copy() {
    let failover = app(json!({"decisionConditions": {"tolerationSeconds": 0},
        "statePreservation": {"rules": [{"aliasLabelName": "ckpt", "jsonPath": "{.checkpoint}"}]}}));
    let mut b = binding(
        failover,
        &["a", "b"],
        json!([unhealthy("a", 0, "Infrastructure")]),
    );
    let d = decide_at(&b, 1, &ready(&["a", "b"]));
    apply_evictions(&mut b.spec, &d.evictions, &at(1));
    assert_eq!(
        b.spec.eviction_history[0].clusters_before_failover,
        ["a", "b"]
    );
    // b ran before the eviction: it keeps its copy as it is
    assert!(preserved_labels(&b.spec, "b").is_empty());
    // the copy made after it, in c, carries the checkpoint
    b.spec.clusters.push(TargetCluster {
        name: "c".into(),
        replicas: 0,
    });
    let ckpt = BTreeMap::from([("ckpt".to_string(), "ckpt-42".to_string())]);
    assert_eq!(preserved_labels(&b.spec, "c"), ckpt);
    // the old copy in a (kept by a Gracefully task) is not placed: untouched
    assert!(preserved_labels(&b.spec, "a").is_empty());
    // the task settles: the record stays, and so do c's labels
    b.spec.graceful_eviction_tasks.clear();
    assert_eq!(preserved_labels(&b.spec, "c"), ckpt);
    // a later eviction without preserved state does not take them away
    b.spec.eviction_history.push(EvictionRecord {
        cluster_name: "b".into(),
        reason: "ClusterFailure".into(),
        failure_class: None,
        message: None,
        evicted_at: at(5),
        expires_at: None,
        preserved_label_state: BTreeMap::new(),
        clusters_before_failover: vec!["b".into(), "c".into()],
    });
    assert_eq!(preserved_labels(&b.spec, "c"), ckpt);
}

#[test]
fn history_keeps_the_newest_and_drops_expired_first() {
    let record = |i: i64, expires: Option<i64>| EvictionRecord {
        cluster_name: format!("c{i}"),
        reason: "ApplicationFailure".into(),
        failure_class: None,
        message: None,
        evicted_at: at(i),
        expires_at: expires.map(at),
        preserved_label_state: BTreeMap::new(),
        clusters_before_failover: Vec::new(),
    };
    let mut history: Vec<EvictionRecord> = (0..MAX_EVICTION_HISTORY as i64)
        .map(|i| record(i, None))
        .collect();
    history.insert(5, record(100, Some(50)));
    prune_history(&mut history, &at(60));
    assert_eq!(history.len(), MAX_EVICTION_HISTORY);
    assert!(history.iter().all(|r| r.cluster_name != "c100"));
    history.push(record(200, None));
    prune_history(&mut history, &at(60));
    assert_eq!(history[0].cluster_name, "c1");
    assert_eq!(history.last().unwrap().cluster_name, "c200");
}
