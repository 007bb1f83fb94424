use super::*;
use crate::interpreters::Interpreters;
use k8s_openapi::jiff::Timestamp;
use lifeboat_api::binding::ResourceBindingSpec;
use lifeboat_api::protocol::{StatusReport, Work};
use lifeboat_interpreter::{Runtime, RuntimeConfig};
use serde_json::json;

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + second).unwrap())
}

#[test]
fn values_freed_in_parallel_are_all_freed_by_the_time_it_returns() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    struct Counted<'a>(&'a AtomicUsize);
    impl Drop for Counted<'_> {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    for (n, threads) in [(0, 2), (10, 2), (1000, 1), (1000, 2), (1001, 3), (5000, 8)] {
        let freed = AtomicUsize::new(0);
        free_in_parallel((0..n).map(|_| Counted(&freed)).collect(), threads);
        assert_eq!(
            freed.load(Ordering::SeqCst),
            n,
            "{n} values on {threads} threads"
        );
    }
}

#[test]
fn work_split_over_threads_comes_back_in_order_and_a_panicked_chunk_as_none() {
    let items: Vec<u32> = (0..1000).collect();
    let serial = map_in_parallel(&items, 1, |i| Some(i * 3));
    for threads in [2, 3, 8] {
        assert_eq!(map_in_parallel(&items, threads, |i| Some(i * 3)), serial);
    }
    // Too few items for a second thread: all on the calling one.
    let few: Vec<u32> = (0..40).collect();
    let caller = std::thread::current().id();
    assert!(
        map_in_parallel(&few, 2, |_| Some(std::thread::current().id()))
            .iter()
            .all(|t| *t == Some(caller))
    );
    // The second half's thread panics: its items are None, the first half is intact.
    let out = map_in_parallel(&items, 2, |i| {
        assert!(*i < 500, "a chunk's thread fails");
        Some(*i)
    });
    assert_eq!(out.len(), 1000);
    assert!(out[..500].iter().zip(0..).all(|(o, i)| *o == Some(i)));
    assert!(out[500..].iter().all(Option::is_none));
}

fn key() -> WorkKey {
    WorkKey {
        namespace: "ml".into(),
        name: "train-appwrapper".into(),
    }
}

fn interpreters() -> Interpreters {
    let builtin = Interpreters::builtin(Arc::new(Runtime::new(RuntimeConfig::default()))).unwrap();
    Interpreters::layered(builtin, &[]).0
}

fn store_with_work() -> WorkStore {
    let store = WorkStore::new("e1");
    store.upsert(
        "m1",
        Work {
            key: key(),
            binding_uid: "uid-1".into(),
            manifest: json!({}),
            ..Default::default()
        },
    );
    store
}

fn appwrapper(phase: &str, unhealthy: Option<&str>) -> serde_json::Value {
    let mut conditions = vec![
        json!({"type": "PodsReady", "status": if phase == "Running" { "True" } else { "False" },
        "reason": "x", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}),
    ];
    if let Some(msg) = unhealthy {
        conditions.push(
            json!({"type": "Unhealthy", "status": "True", "reason": "FoundFailedPods",
            "message": msg, "lastTransitionTime": "2026-01-01T00:00:00Z"}),
        );
    }
    json!({
        "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
        "metadata": {"name": "train", "namespace": "ml", "generation": 1},
        "spec": {"components": []},
        "status": {"phase": phase, "conditions": conditions}
    })
}

fn report(second: i64, observed: serde_json::Value) -> WorkStatus {
    WorkStatus {
        key: key(),
        binding_uid: "uid-1".into(),
        revision: 1,
        applied: true,
        applied_message: None,
        observed: Some(ObservedObject::from_value(&observed).unwrap()),
        observed_at: at(second),
        reset_generation: None,
        fenced: false,
        gone: false,
    }
}

fn batch(cluster: &str, items: Vec<WorkStatus>) -> StatusBatch {
    StatusBatch::from_agent(cluster.into(), StatusReport { items, full: false })
}

#[test]
fn reports_become_items_and_replays_change_nothing() {
    let work = store_with_work();
    let interp = interpreters();
    let mut state = StatusState::default();
    let none = |_: &WorkKey| None;
    let b = batch("m1", vec![report(1, appwrapper("Running", None))]);
    let p = state.process(&b, &work, none, &interp, &at(100));
    assert_eq!(p.response.accepted, 1);
    assert_eq!(p.dirty, vec![key()]);
    let item = &state.items(&key())[0];
    assert_eq!(item.health, ResourceHealth::Healthy);
    assert_eq!(item.status.as_ref().unwrap()["phase"], "Running");
    // the very same batch again: accepted, nothing dirty
    let p = state.process(&b, &work, none, &interp, &at(101));
    assert_eq!((p.response.accepted, p.dirty.len()), (1, 0));
    // an older report is refused as stale
    let old = batch(
        "m1",
        vec![report(0, appwrapper("Failed", Some("[Infrastructure] x")))],
    );
    let p = state.process(&old, &work, none, &interp, &at(102));
    assert_eq!(p.response.accepted, 0);
    assert!(p.response.rejected[0].reason.starts_with("stale"));
    assert_eq!(state.items(&key())[0].health, ResourceHealth::Healthy);
}

#[test]
fn a_binding_whose_status_lags_behind_the_processor_is_behind() {
    let work = store_with_work();
    let interp = interpreters();
    let mut state = StatusState::default();
    let mut binding: ResourceBinding = serde_json::from_value(json!({
        "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
        "metadata": {"name": "train-appwrapper", "namespace": "ml", "uid": "uid-1"},
        "spec": {
            "resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "train"},
            "clusters": [{"name": "m1"}]
        },
        "status": {"aggregatedStatus": [{
            "clusterName": "m1", "applied": true, "health": "Unhealthy",
            "failureClass": "Infrastructure", "unhealthySince": "2026-01-01T00:00:00Z"
        }]}
    }))
    .unwrap();
    // Nothing reported since the start: nothing to wait for.
    assert!(!state.ahead_of(&binding));
    let seed = Arc::new(binding.clone());
    let b = batch("m1", vec![report(1, appwrapper("Running", None))]);
    // A time within a second, as the processor's clock gives it.
    let now = Time(at(100).0 + k8s_openapi::jiff::SignedDuration::from_millis(250));
    state.process(&b, &work, |_| Some(seed.clone()), &interp, &now);
    // The processor knows it is Healthy again; the binding still says Unhealthy.
    assert!(state.ahead_of(&binding));
    // Decisions see the processor's item in place of the binding's, the others as they are.
    let mut with_another = binding.clone();
    let mut gone = with_another.status.as_ref().unwrap().aggregated_status[0].clone();
    gone.cluster_name = "m0".into();
    with_another
        .status
        .as_mut()
        .unwrap()
        .aggregated_status
        .insert(0, gone);
    let newest = state.newest_items(&with_another).expect("newer items");
    let health: Vec<(&str, ResourceHealth)> = newest
        .iter()
        .map(|i| (i.cluster_name.as_str(), i.health))
        .collect();
    assert_eq!(
        health,
        [
            ("m0", ResourceHealth::Unhealthy),
            ("m1", ResourceHealth::Healthy)
        ]
    );
    // Written, and the copy read back shows it (times to the second): caught up.
    binding.status.as_mut().unwrap().aggregated_status =
        serde_json::from_value(serde_json::to_value(state.items(&key())).unwrap()).unwrap();
    assert!(!state.ahead_of(&binding));
    assert_eq!(state.newest_items(&binding), None);
    // A cluster the status is not written for (no placement there) does not count.
    let mut moved = binding.clone();
    moved.spec.clusters[0].name = "m2".into();
    moved.status.as_mut().unwrap().aggregated_status.clear();
    assert!(!state.ahead_of(&moved));
    // Nor does a binding of another UID (deleted and created again).
    let mut other = seed.as_ref().clone();
    other.metadata.uid = Some("uid-2".into());
    assert!(!state.ahead_of(&other));
}

#[test]
fn the_agents_failure_class_reaches_the_item() {
    let work = store_with_work();
    let interp = interpreters();
    let mut state = StatusState::default();
    let b = batch(
        "m1",
        vec![report(
            1,
            appwrapper("Failed", Some("[Infrastructure] node n1 is NotReady")),
        )],
    );
    let p = state.process(&b, &work, |_| None, &interp, &at(5));
    let item = &state.items(&key())[0];
    assert_eq!(item.health, ResourceHealth::Unhealthy);
    assert_eq!(item.failure_class, Some(FailureClass::Infrastructure));
    assert_eq!(
        item.unhealthy_since,
        Some(lifeboat_api::time::stored(at(5).0))
    );
    assert_eq!(p.transitions.len(), 1);
    assert_eq!(p.transitions[0].to, ResourceHealth::Unhealthy);
}

#[test]
fn a_pytorchjob_without_status_makes_an_item_the_crd_takes() {
    let work = store_with_work();
    let interp = interpreters();
    let mut state = StatusState::default();
    let job = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1}}}});
    state.process(
        &batch("m1", vec![report(1, job)]),
        &work,
        |_| None,
        &interp,
        &at(1),
    );
    let item = serde_json::to_value(&state.items(&key())[0]).unwrap();
    assert!(item.get("status").is_none(), "no status: {item}");
}

#[test]
fn work_of_another_cluster_or_binding_is_refused() {
    let work = store_with_work();
    let interp = interpreters();
    let mut state = StatusState::default();
    let p = state.process(
        &batch("m2", vec![report(1, appwrapper("Running", None))]),
        &work,
        |_| None,
        &interp,
        &at(1),
    );
    assert_eq!(p.response.accepted, 0);
    assert!(
        p.response.rejected[0]
            .reason
            .contains("not assigned to cluster m2")
    );
    let mut other_uid = report(1, appwrapper("Running", None));
    other_uid.binding_uid = "uid-old".into();
    let p = state.process(
        &batch("m1", vec![other_uid]),
        &work,
        |_| None,
        &interp,
        &at(1),
    );
    assert!(p.response.rejected[0].reason.contains("binding UID"));
    assert!(state.is_empty());
}

#[test]
fn a_withdrawn_copy_reported_gone_becomes_an_unapplied_item_with_gone_at() {
    let work = store_with_work();
    let interp = interpreters();
    let mut state = StatusState::default();
    let failed = batch(
        "m1",
        vec![report(1, appwrapper("Failed", Some("[Infrastructure] x")))],
    );
    state.process(&failed, &work, |_| None, &interp, &at(10));
    let gone = |second| WorkStatus {
        applied: false,
        observed: None,
        gone: true,
        ..report(second, json!({}))
    };
    // not withdrawn yet: refused, the item stays
    let p = state.process(
        &batch("m1", vec![gone(2)]),
        &work,
        |_| None,
        &interp,
        &at(11),
    );
    assert!(p.response.rejected[0].reason.starts_with("gone:"));
    assert_eq!(state.items(&key())[0].health, ResourceHealth::Unhealthy);
    work.withdraw_for_purge("m1", &key(), "uid-1");
    // another cluster cannot report it
    let p = state.process(
        &batch("m2", vec![gone(3)]),
        &work,
        |_| None,
        &interp,
        &at(12),
    );
    assert_eq!(p.response.accepted, 0);
    let p = state.process(
        &batch("m1", vec![gone(3)]),
        &work,
        |_| None,
        &interp,
        &at(13),
    );
    assert_eq!((p.response.accepted, p.dirty.len()), (1, 1));
    assert_eq!(p.transitions[0].to, ResourceHealth::Unknown);
    let item = &state.items(&key())[0];
    assert!(!item.applied && item.status.is_none());
    assert_eq!(item.gone_at, Some(at(13)));
    // again after a reconnect: taken, nothing changes
    let p = state.process(
        &batch("m1", vec![gone(4)]),
        &work,
        |_| None,
        &interp,
        &at(14),
    );
    assert_eq!((p.response.accepted, p.dirty.len()), (1, 0));
    assert_eq!(state.items(&key())[0].gone_at, Some(at(13)));
}

#[test]
fn a_gone_report_in_the_second_of_the_last_report_is_taken() {
    let work = store_with_work();
    let interp = interpreters();
    let mut state = StatusState::default();
    let failed = batch(
        "m1",
        vec![report(5, appwrapper("Failed", Some("[Infrastructure] x")))],
    );
    state.process(&failed, &work, |_| None, &interp, &at(10));
    work.withdraw_for_purge("m1", &key(), "uid-1");
    let gone = WorkStatus {
        applied: false,
        observed: None,
        gone: true,
        ..report(5, json!({}))
    };
    let p = state.process(&batch("m1", vec![gone]), &work, |_| None, &interp, &at(10));
    assert_eq!((p.response.accepted, p.dirty.len()), (1, 1));
    assert_eq!(state.items(&key())[0].gone_at, Some(at(10)));
}

#[test]
fn timers_survive_a_restart_through_the_bindings_status() {
    let work = store_with_work();
    let interp = interpreters();
    let mut binding = ResourceBinding::new("train-appwrapper", ResourceBindingSpec::default());
    binding.metadata.namespace = Some("ml".into());
    binding.metadata.uid = Some("uid-1".into());
    binding.status = Some(
        serde_json::from_value(json!({"aggregatedStatus": [{
            "clusterName": "m1", "applied": true, "health": "Unhealthy",
            "failureClass": "Capacity", "unhealthySince": "2027-01-15T08:00:00Z"
        }]}))
        .unwrap(),
    );
    let binding = Arc::new(binding);
    let mut state = StatusState::default();
    // after the restart the agent reports Unknown (its own restart): the timer stays
    let unknown = appwrapper("Resuming", None);
    let b = batch("m1", vec![report(1, unknown)]);
    state.process(&b, &work, |_| Some(binding.clone()), &interp, &at(500));
    let item = &state.items(&key())[0];
    assert_eq!(
        item.unhealthy_since.as_ref().unwrap().0.to_string(),
        "2027-01-15T08:00:00Z"
    );
}

#[test]
fn the_patch_keeps_placed_and_evicting_clusters_only() {
    let mut binding: ResourceBinding = serde_json::from_value(json!({
        "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
        "metadata": {"name": "b", "namespace": "ml", "generation": 2},
        "spec": {"resource": {"apiVersion": "v1", "kind": "Pod", "name": "p"},
                 "clusters": [{"name": "m2"}],
                 "gracefulEvictionTasks": [{"fromCluster": "m1", "reason": "ApplicationFailure", "producer": "hub"}]}
    }))
    .unwrap();
    let item = |c: &str, h| AggregatedStatusItem {
        cluster_name: c.into(),
        applied: true,
        health: h,
        ..Default::default()
    };
    let items = vec![
        item("m1", ResourceHealth::Unhealthy),
        item("m2", ResourceHealth::Healthy),
        item("m3", ResourceHealth::Healthy),
    ];
    let (patch, changed) = status_patch(&binding, items.clone(), &at(1));
    assert!(changed);
    let clusters: Vec<&str> = patch["status"]["aggregatedStatus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["clusterName"].as_str().unwrap())
        .collect();
    assert_eq!(clusters, ["m1", "m2"]);
    assert_eq!(patch["status"]["conditions"][1]["status"], "True");
    // once the binding carries that status, the same items are no change
    binding.status = Some(serde_json::from_value(patch["status"].clone()).unwrap());
    let (_, changed) = status_patch(&binding, items, &at(2));
    assert!(!changed);
}

fn appwrapper_customization(script: &str) -> Interpreters {
    let builtin = Interpreters::builtin(Arc::new(Runtime::new(RuntimeConfig::default()))).unwrap();
    let object: lifeboat_api::config::ResourceInterpreterCustomization =
        serde_json::from_value(json!({
            "apiVersion": "config.lifeboat.dev/v1alpha1",
            "kind": "ResourceInterpreterCustomization",
            "metadata": {"name": "appwrapper-health"},
            "spec": {
                "target": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper"},
                "customizations": {"healthInterpretation": {"luaScript": script}}
            }
        }))
        .unwrap();
    let (layered, rejected) = Interpreters::layered(builtin, &[object]);
    assert!(rejected.is_empty(), "{rejected:?}");
    layered
}

fn misses(state: &StatusState, b: &StatusBatch, interp: &Interpreters) -> usize {
    state.misses(b, &fingerprints(b, interp)).len()
}

#[test]
fn an_unchanged_object_is_not_interpreted_again_and_a_changed_one_is() {
    let work = store_with_work();
    let interp = interpreters();
    let mut state = StatusState::default();
    let running = batch("m1", vec![report(1, appwrapper("Running", None))]);
    assert_eq!(misses(&state, &running, &interp), 1);
    state.process(&running, &work, |_| None, &interp, &at(10));
    // a newer report of the same object: served from the cache, nothing changes
    let again = batch("m1", vec![report(2, appwrapper("Running", None))]);
    assert_eq!(misses(&state, &again, &interp), 0);
    let p = state.process(&again, &work, |_| None, &interp, &at(11));
    assert_eq!((p.response.accepted, p.dirty.len()), (1, 0));
    assert!(p.transitions.is_empty());
    assert_eq!(state.items(&key())[0].health, ResourceHealth::Healthy);
    // the object changed: interpreted again, with its new verdict and reflected status
    let failed = batch(
        "m1",
        vec![report(
            3,
            appwrapper("Failed", Some("[Infrastructure] node n1 is NotReady")),
        )],
    );
    assert_eq!(misses(&state, &failed, &interp), 1);
    let p = state.process(&failed, &work, |_| None, &interp, &at(12));
    assert_eq!(p.transitions.len(), 1);
    let item = &state.items(&key())[0];
    assert_eq!(item.health, ResourceHealth::Unhealthy);
    assert_eq!(item.status.as_ref().unwrap()["phase"], "Failed");
    // what it replaced goes back to the caller to free: the item's old status and the old
    // interpretation's reflected status, both the Running one
    assert_eq!(p.displaced.len(), 2);
    assert!(p.displaced.iter().all(|v| v["phase"] == "Running"));
    // and back to the first object: interpreted again (the cache holds the last one only)
    let back = batch("m1", vec![report(4, appwrapper("Running", None))]);
    assert_eq!(misses(&state, &back, &interp), 1);
    let p = state.process(&back, &work, |_| None, &interp, &at(13));
    assert_eq!(p.transitions[0].to, ResourceHealth::Healthy);
    // a report without an object forgets the interpretation
    let mut gone = report(5, appwrapper("Running", None));
    gone.observed = None;
    state.process(&batch("m1", vec![gone]), &work, |_| None, &interp, &at(14));
    let back = batch("m1", vec![report(6, appwrapper("Running", None))]);
    assert_eq!(misses(&state, &back, &interp), 1);
}

#[test]
fn changed_customizations_invalidate_the_cache() {
    let work = store_with_work();
    let builtin = interpreters();
    let mut state = StatusState::default();
    let b = |second| batch("m1", vec![report(second, appwrapper("Running", None))]);
    state.process(&b(1), &work, |_| None, &builtin, &at(10));
    assert_eq!(state.items(&key())[0].health, ResourceHealth::Healthy);
    // the same object under a customization that judges it unhealthy
    let never = appwrapper_customization(
        "function InterpretHealth(obj) return {healthy = false, reason = 'customized'} end",
    );
    assert_eq!(misses(&state, &b(2), &never), 1);
    let p = state.process(&b(2), &work, |_| None, &never, &at(11));
    assert_eq!(p.transitions.len(), 1);
    let item = &state.items(&key())[0];
    assert_eq!(item.health, ResourceHealth::Unhealthy);
    assert_eq!(item.health_reason.as_deref(), Some("customized"));
    // the same scripts layered again are another generation: interpreted again
    let relayered = appwrapper_customization(
        "function InterpretHealth(obj) return {healthy = false, reason = 'customized'} end",
    );
    assert_ne!(never.generation(), relayered.generation());
    assert_eq!(misses(&state, &b(3), &relayered), 1);
}

#[test]
fn a_failing_customization_gives_unknown_every_time_and_blocks_no_other_item() {
    let work = store_with_work();
    let other = WorkKey {
        namespace: "ml".into(),
        name: "other".into(),
    };
    work.upsert(
        "m1",
        Work {
            key: other.clone(),
            binding_uid: "uid-2".into(),
            manifest: json!({}),
            ..Default::default()
        },
    );
    let interp = appwrapper_customization("function InterpretHealth(obj) error('boom') end");
    let pod = |second| WorkStatus {
        key: other.clone(),
        binding_uid: "uid-2".into(),
        ..report(
            second,
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                   "status": {"phase": "Succeeded"}}),
        )
    };
    let mut state = StatusState::default();
    for (second, dirty) in [(1, 2), (2, 0)] {
        let b = batch(
            "m1",
            vec![report(second, appwrapper("Running", None)), pod(second)],
        );
        let p = state.process(&b, &work, |_| None, &interp, &at(10 + second));
        assert_eq!(p.response.accepted, 2);
        assert_eq!(p.dirty.len(), dirty, "report {second}");
        let item = &state.items(&key())[0];
        assert_eq!(item.health, ResourceHealth::Unknown);
        let reason = item.health_reason.as_deref().unwrap();
        assert!(
            reason.starts_with("health interpretation failed"),
            "{reason}"
        );
        assert!(reason.contains("boom"), "{reason}");
        assert_eq!(state.items(&other)[0].health, ResourceHealth::Healthy);
    }
}

#[test]
fn interpreting_on_several_threads_gives_the_same_results_in_order() {
    let interp = interpreters();
    let items: Vec<WorkStatus> = (0..100)
        .map(|i| {
            let unhealthy = (i % 3 == 0).then_some("[Capacity] preempted");
            report(
                i,
                appwrapper(if i % 2 == 0 { "Running" } else { "Failed" }, unhealthy),
            )
        })
        .collect();
    let b = batch("m1", items);
    let prints = fingerprints(&b, &interp);
    let all: Vec<(usize, Fingerprint)> = prints
        .iter()
        .enumerate()
        .map(|(i, p)| (i, p.unwrap()))
        .collect();
    let one = interpret_items(&b, &all, &interp, 1);
    let three = interpret_items(&b, &all, &interp, 3);
    assert_eq!(one.len(), 100);
    // the same results (what they cost differs from run to run)
    let without_costs = |m: &HashMap<usize, Fresh>| -> HashMap<usize, Fresh> {
        m.iter()
            .map(|(i, f)| {
                let mut f = f.clone();
                f.interpreted.costs.clear();
                (*i, f)
            })
            .collect()
    };
    assert_eq!(without_costs(&one), without_costs(&three));
    assert!(
        one.values()
            .all(|f| f.item_status == f.interpreted.reflected)
    );
    assert!(
        matches!(
            &one[&3].interpreted.verdict,
            HealthVerdict::Judged {
                health: ResourceHealth::Unhealthy,
                class: Some(FailureClass::Capacity),
                ..
            }
        ),
        "{:?}",
        one[&3].interpreted.verdict
    );
    assert!(matches!(
        &one[&2].interpreted.verdict,
        HealthVerdict::Judged {
            health: ResourceHealth::Healthy,
            ..
        }
    ));
}

/// A customization for `target` (apiVersion, kind) with this InterpretHealth, over the
/// built-ins of `runtime`.
fn customized(
    runtime: Arc<Runtime>,
    name: &str,
    target: (&str, &str),
    script: &str,
) -> Interpreters {
    let builtin = Interpreters::builtin(runtime).unwrap();
    let object: lifeboat_api::config::ResourceInterpreterCustomization =
        serde_json::from_value(json!({
            "apiVersion": "config.lifeboat.dev/v1alpha1",
            "kind": "ResourceInterpreterCustomization",
            "metadata": {"name": name},
            "spec": {
                "target": {"apiVersion": target.0, "kind": target.1},
                "customizations": {"healthInterpretation": {"luaScript": script}}
            }
        }))
        .unwrap();
    let (layered, rejected) = Interpreters::layered(builtin, &[object]);
    assert!(rejected.is_empty(), "{rejected:?}");
    layered
}

fn shared(state: StatusState) -> SharedState {
    Arc::new(Mutex::new(state))
}

fn work_for(store: &WorkStore, name: &str) -> WorkKey {
    let key = WorkKey {
        namespace: "ml".into(),
        name: name.into(),
    };
    store.upsert(
        "m1",
        Work {
            key: key.clone(),
            binding_uid: format!("uid-{name}"),
            manifest: json!({}),
            ..Default::default()
        },
    );
    key
}

fn report_of(key: &WorkKey, second: i64, observed: serde_json::Value) -> WorkStatus {
    WorkStatus {
        key: key.clone(),
        binding_uid: format!("uid-{}", key.name),
        ..report(second, observed)
    }
}

#[tokio::test]
async fn an_unrelated_binding_is_decided_while_a_hostile_customization_runs() {
    // The hostile script spins until the wall clock stops it (2 s here).
    let runtime = Arc::new(Runtime::new(RuntimeConfig {
        limits: lifeboat_interpreter::Limits {
            wall_clock: Duration::from_secs(2),
            instructions: u64::MAX / 2,
            ..Default::default()
        },
        ..Default::default()
    }));
    let interp = Arc::new(customized(
        runtime,
        "spin",
        ("example.com/v1", "Widget"),
        "function InterpretHealth(obj) while true do end end",
    ));
    let work = store_with_work();
    let hostile: Vec<WorkKey> = (0..3)
        .map(|i| work_for(&work, &format!("widget-{i}")))
        .collect();
    let widget =
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}});
    let pool = Arc::new(Pool::new(2, crate::interpreters::lanes::SLOW_AFTER));
    let mut engine = Engine::new(
        shared(StatusState::default()),
        pool.clone(),
        interp.clone(),
        crate::interpreters::lanes::SLOW_AFTER,
    );
    let widgets = Arc::new(batch(
        "m1",
        hostile
            .iter()
            .map(|k| report_of(k, 1, widget.clone()))
            .collect(),
    ));
    let p = engine
        .batch(widgets, &work, |_| None, &interp, &at(1))
        .await;
    // taken, their interpretations left to come
    assert_eq!((p.response.accepted, p.deferred), (3, 3));
    assert!(engine.state().lock().unwrap().items(&hostile[0]).is_empty());
    // the AppWrapper's report is decided now, while a hostile evaluation runs
    let aw = Arc::new(batch("m1", vec![report(1, appwrapper("Running", None))]));
    let p = engine.batch(aw, &work, |_| None, &interp, &at(1)).await;
    assert_eq!((p.response.accepted, p.deferred, p.dirty.len()), (1, 0, 1));
    assert_eq!(
        engine.state().lock().unwrap().items(&key())[0].health,
        ResourceHealth::Healthy
    );
    assert_eq!(pool.running("example.com/v1/Widget"), 1);
    // the hostile evaluation ends at its limit: its item says so, with the customization
    let done = tokio::time::timeout(Duration::from_secs(30), engine.next_done())
        .await
        .unwrap()
        .unwrap();
    let p = engine.late(done, &at(3));
    assert!(!p.dirty.is_empty());
    assert_eq!(p.failures[0].failure.customization, "spin");
    assert!(p.costs.iter().any(|c| c.customization == "spin"
        && c.operation == Operation::InterpretHealth
        && c.outcome == Outcome::Timeout));
    let state = engine.state().lock().unwrap();
    let item = p.dirty.iter().flat_map(|k| state.items(k)).next().unwrap();
    assert_eq!(item.health, ResourceHealth::Unknown);
    let reason = item.health_reason.unwrap();
    assert!(
        reason.starts_with(status::INTERPRETER_FAILED)
            && reason.contains("customization spin failed in InterpretHealth")
            && reason.contains("limit wall_clock"),
        "{reason}"
    );
}

#[tokio::test]
async fn a_change_of_customizations_reinterprets_the_kinds_it_changes_without_a_report() {
    let runtime = Arc::new(Runtime::new(RuntimeConfig::default()));
    let plain =
        Arc::new(Interpreters::layered(Interpreters::builtin(runtime.clone()).unwrap(), &[]).0);
    let work = store_with_work();
    let pod_key = work_for(&work, "pod");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                     "status": {"phase": "Running"}});
    let mut engine = Engine::new(
        shared(StatusState::default()),
        Arc::new(Pool::new(2, crate::interpreters::lanes::SLOW_AFTER)),
        plain.clone(),
        crate::interpreters::lanes::SLOW_AFTER,
    );
    let b = Arc::new(batch(
        "m1",
        vec![
            report(1, appwrapper("Running", None)),
            report_of(&pod_key, 1, pod.clone()),
        ],
    ));
    engine.batch(b, &work, |_| None, &plain, &at(1)).await;
    assert_eq!(
        engine.state().lock().unwrap().items(&key())[0].health,
        ResourceHealth::Healthy
    );
    // a customization of AppWrappers that raises: only the AppWrapper is interpreted again
    let broken = Arc::new(customized(
        runtime,
        "broken",
        ("workload.codeflare.dev/v1beta2", "AppWrapper"),
        "function InterpretHealth(obj)\n  error('no health here')\nend",
    ));
    assert_eq!(engine.interpreters_changed(broken.clone()), 1);
    let done = tokio::time::timeout(Duration::from_secs(30), engine.next_done())
        .await
        .unwrap()
        .unwrap();
    let p = engine.late(done, &at(2));
    assert_eq!(p.dirty, vec![key()]);
    assert_eq!(p.failures.len(), 1);
    let notice = &p.failures[0];
    assert_eq!((notice.key.clone(), notice.cluster.as_str()), (key(), "m1"));
    assert_eq!(notice.failure.customization, "broken");
    assert!(
        notice.failure.message.contains(
            "customization broken failed in InterpretHealth (spec.customizations.healthInterpretation.luaScript)"
        ) && notice.failure.message.contains(":2: no health here"),
        "{}",
        notice.failure.message
    );
    let item = engine.state().lock().unwrap().items(&key())[0].clone();
    assert_eq!(item.health, ResourceHealth::Unknown);
    let binding: ResourceBinding = serde_json::from_value(json!({
        "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
        "metadata": {"name": "train-appwrapper", "namespace": "ml", "generation": 1},
        "spec": {"resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "train"},
                 "clusters": [{"name": "m1"}]}
    }))
    .unwrap();
    let (patch, _) = status_patch(&binding, vec![item], &at(2));
    let healthy = &patch["status"]["conditions"][1];
    assert_eq!(healthy["reason"], status::REASON_INTERPRETER_ERROR);
    assert!(
        healthy["message"]
            .as_str()
            .unwrap()
            .contains("customization broken failed in InterpretHealth"),
        "{healthy}"
    );
    // the Pod kept its interpretation: the same report again is no miss under the new
    // layering, and the AppWrapper's is not either (already re-interpreted)
    let again = batch(
        "m1",
        vec![
            report(3, appwrapper("Running", None)),
            report_of(&pod_key, 3, pod),
        ],
    );
    let state = engine.state().lock().unwrap();
    assert!(
        state
            .misses(&again, &fingerprints(&again, &broken))
            .is_empty()
    );
}

/// The status write's exact request, against a mock client: the binding's items and
/// conditions by server-side apply on the status subresource, field manager
/// `lifeboat-hub/status`, forced; an unchanged status sends nothing.
#[tokio::test]
async fn the_status_is_applied_forced_as_lifeboat_hub_status_and_only_when_it_changed() {
    use lifeboat_runtime::mock::{ApiServer, Method};
    let work = store_with_work();
    let interp = interpreters();
    let mut state = StatusState::default();
    let b = batch("m1", vec![report(1, appwrapper("Running", None))]);
    state.process(&b, &work, |_: &WorkKey| None, &interp, &at(100));
    let state = shared(state);
    let binding: ResourceBinding = serde_json::from_value(json!({
        "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
        "metadata": {"name": "train-appwrapper", "namespace": "ml", "uid": "uid-1",
            "resourceVersion": "5", "generation": 1},
        "spec": {"resource": {"apiVersion": "workload.codeflare.dev/v1beta2",
            "kind": "AppWrapper", "namespace": "ml", "name": "train"},
            "clusters": [{"name": "m1"}]}
    }))
    .unwrap();
    let (bindings, mut writer) = kube::runtime::reflector::store::<ResourceBinding>();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(binding.clone()));
    let (client, mut server) = ApiServer::new();
    let key = key();
    let write = write_status(&client, &bindings, &state, &key);
    let answer = async {
        let call = server.next().await.expect(
            Method::PATCH,
            "/apis/work.lifeboat.dev/v1alpha1/namespaces/ml/resourcebindings/train-appwrapper/status",
        );
        assert_eq!(
            call.uri.split_once('?').map(|(_, q)| q),
            Some("&force=true&fieldManager=lifeboat-hub%2Fstatus")
        );
        assert_eq!(
            call.content_type.as_deref(),
            Some("application/apply-patch+yaml")
        );
        let body = &call.body;
        assert_eq!(
            (&body["apiVersion"], &body["kind"], &body["metadata"]),
            (
                &json!("work.lifeboat.dev/v1alpha1"),
                &json!("ResourceBinding"),
                &json!({"name": "train-appwrapper", "namespace": "ml"})
            )
        );
        assert!(
            body.get("spec").is_none(),
            "the status write carries no spec"
        );
        let mut fields: Vec<&String> = body["status"].as_object().unwrap().keys().collect();
        fields.sort();
        assert_eq!(fields, ["aggregatedStatus", "conditions", "summary"]);
        let items = body["status"]["aggregatedStatus"].as_array().unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(
            (&items[0]["clusterName"], &items[0]["health"]),
            (&json!("m1"), &json!("Healthy"))
        );
        assert_eq!(items[0]["status"]["phase"], "Running");
        let types: Vec<&str> = body["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["FullyApplied", "Healthy"]);
        let mut stored = binding.clone();
        stored.status = Some(serde_json::from_value(body["status"].clone()).unwrap());
        call.reply(200, serde_json::to_value(&stored).unwrap());
        stored
    };
    let (written, stored) = tokio::join!(write, answer);
    assert!(written.expect("the status is written"), "a write was made");
    // Once the cache holds what was written, there is nothing to write.
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(stored));
    let again = write_status(&client, &bindings, &state, &key)
        .await
        .expect("nothing to write");
    assert!(!again, "an unchanged status is not written");
    assert!(server.is_idle().await, "no request for an unchanged status");
}
