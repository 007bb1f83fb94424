//! From a binding and its template to the work each cluster's agent applies, pure.
//!
//! The manifest is the template without what belongs to the hub's copy (uid, resourceVersion,
//! managed fields, owner references, finalizers, status, `kubectl` bookkeeping, and per kind what
//! the hub's API server generated: [`crate::work::prune`]), labelled with its binding so the agent can
//! adopt it after a restart and remove it when it is no longer assigned, and annotated with the
//! template's generation. A Divided workload gets its cluster's share of the replicas through the
//! kind's ReviseReplica rule. A copy made after an eviction that preserved state carries that
//! state as labels ([`preserved_labels`]).

use std::collections::{BTreeMap, BTreeSet};

use lifeboat_api::binding::{
    ANNOTATION_BINDING_UID, ANNOTATION_TEMPLATE_GENERATION, InPlaceResetRecord, LABEL_BINDING_NAME,
    LABEL_BINDING_NAMESPACE, ResourceBinding, ResourceBindingSpec, TargetCluster,
};
use lifeboat_api::policy::{PurgeMode, ReplicaSchedulingType};
use lifeboat_api::protocol::{ResetRequest, Work, WorkKey};
use serde_json::{Map, Value};

/// Annotations that are the hub copy's own business.
const DROPPED_ANNOTATIONS: &[&str] = &["kubectl.kubernetes.io/last-applied-configuration"];

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error("the template is not an object")]
    NotAnObject,
    #[error("{kind} has no ReviseReplica rule, so its replicas cannot be divided among clusters")]
    NoReviseRule { kind: String },
    #[error("ReviseReplica failed: {0}")]
    Revise(String),
}

impl DispatchError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            DispatchError::NotAnObject => "not_an_object",
            DispatchError::NoReviseRule { .. } => "no_revise_rule",
            DispatchError::Revise(_) => "revise",
        }
    }
}

/// The key of a binding's work.
pub fn work_key(binding: &ResourceBinding) -> WorkKey {
    WorkKey {
        namespace: binding.metadata.namespace.clone().unwrap_or_default(),
        name: binding.metadata.name.clone().unwrap_or_default(),
    }
}

/// Whether the binding divides its replicas among clusters (then each cluster's manifest is
/// revised to its share).
pub fn divides_replicas(binding: &ResourceBinding) -> bool {
    !binding.spec.gang
        && binding.spec.replicas > 0
        && binding
            .spec
            .placement
            .as_ref()
            .and_then(|p| p.replica_scheduling.as_ref())
            .is_some_and(|r| r.replica_scheduling_type == ReplicaSchedulingType::Divided)
}

/// The template as the member must receive it: hub-only metadata, status and what the hub's API
/// server generated dropped, the binding's labels, its UID and the template's generation added.
/// The template itself is not changed.
pub fn base_manifest(template: &Value, binding: &ResourceBinding) -> Result<Value, DispatchError> {
    let object = template.as_object().ok_or(DispatchError::NotAnObject)?;
    let mut out = Map::new();
    for (key, value) in object {
        match key.as_str() {
            "status" | "metadata" => {}
            _ => {
                out.insert(key.clone(), value.clone());
            }
        }
    }
    let meta = object.get("metadata").and_then(Value::as_object);
    let field = |name: &str| meta.and_then(|m| m.get(name)).cloned();
    let mut metadata = Map::new();
    for name in ["name", "namespace"] {
        if let Some(v) = field(name) {
            metadata.insert(name.into(), v);
        }
    }
    let mut labels: BTreeMap<String, Value> = field("labels")
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    let (namespace, name) = binding.key();
    labels.insert(LABEL_BINDING_NAMESPACE.into(), Value::String(namespace));
    labels.insert(LABEL_BINDING_NAME.into(), Value::String(name));
    metadata.insert("labels".into(), Value::Object(labels.into_iter().collect()));
    let mut annotations: BTreeMap<String, Value> = field("annotations")
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    for dropped in DROPPED_ANNOTATIONS {
        annotations.remove(*dropped);
    }
    annotations.insert(
        ANNOTATION_BINDING_UID.into(),
        Value::String(binding.metadata.uid.clone().unwrap_or_default()),
    );
    if let Some(generation) = field("generation").and_then(|g| g.as_i64()) {
        annotations.insert(
            ANNOTATION_TEMPLATE_GENERATION.into(),
            Value::String(generation.to_string()),
        );
    }
    metadata.insert(
        "annotations".into(),
        Value::Object(annotations.into_iter().collect()),
    );
    out.insert("metadata".into(), Value::Object(metadata));
    let mut manifest = Value::Object(out);
    crate::work::prune::remove_generated(&mut manifest);
    Ok(manifest)
}

/// The work for one target cluster. `revise` applies the kind's ReviseReplica rule
/// (`Ok(None)`: the kind has none).
pub fn work_for(
    binding: &ResourceBinding,
    base: &Value,
    target: &TargetCluster,
    revise: impl FnOnce(&Value, i64) -> Result<Option<Value>, String>,
) -> Result<Work, DispatchError> {
    let mut manifest = if divides_replicas(binding) {
        match revise(base, i64::from(target.replicas)).map_err(DispatchError::Revise)? {
            Some(revised) => revised,
            None => {
                return Err(DispatchError::NoReviseRule {
                    kind: binding.spec.resource.kind.clone(),
                });
            }
        }
    } else {
        base.clone()
    };
    add_labels(&mut manifest, preserved_labels(&binding.spec, &target.name));
    Ok(Work {
        key: work_key(binding),
        binding_uid: binding.metadata.uid.clone().unwrap_or_default(),
        revision: 0,
        manifest,
        purge_mode: purge_mode(binding),
        reset: reset_request(binding, &target.name),
    })
}

/// The latest in-place reset asked of `cluster` (the agent acts on a generation above the one
/// it completed for the object; a completed one only keeps the object's annotation).
pub fn reset_request(binding: &ResourceBinding, cluster: &str) -> Option<ResetRequest> {
    InPlaceResetRecord::of(&binding.spec.in_place_resets, cluster).map(|r| ResetRequest {
        generation: r.generation,
        pause_seconds: r.pause_seconds.unwrap_or(0),
    })
}

/// Sets `labels` on the manifest (a preserved label wins over the template's of the same name).
fn add_labels(manifest: &mut Value, labels: BTreeMap<String, String>) {
    if labels.is_empty() {
        return;
    }
    let Some(metadata) = manifest
        .as_object_mut()
        .map(|o| {
            o.entry("metadata")
                .or_insert_with(|| Value::Object(Map::new()))
        })
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let entry = metadata
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    if let Some(map) = entry.as_object_mut() {
        for (name, value) in labels {
            map.insert(name, Value::String(value));
        }
    }
}

/// The clusters whose old copy the hub waits to hear is gone before it creates the new one:
/// those of `Directly` eviction tasks not purged yet. Their work is withdrawn and their agent
/// asked to report the copy gone.
pub fn awaited_purges(spec: &ResourceBindingSpec) -> BTreeSet<String> {
    spec.graceful_eviction_tasks
        .iter()
        .filter(|t| t.purge_mode == Some(PurgeMode::Directly) && t.purged_at.is_none())
        .map(|t| t.from_cluster.clone())
        .collect()
}

/// The purge mode of the workload's cluster failover, which tells the agent whether to fence
/// it on a partition: a partition is a cluster failover on the hub's side, and only a `Directly`
/// cluster failover waits for the fence before it creates the new copy. (The application
/// failover's purge mode does not matter here: its cluster is reachable and confirms the purge.)
pub fn purge_mode(binding: &ResourceBinding) -> Option<PurgeMode> {
    let failover = binding.spec.failover.as_ref()?;
    failover.cluster.as_ref().map(|c| c.purge_mode())
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
mod tests {
    use super::*;
    use serde_json::json;

    fn binding(spec: serde_json::Value) -> ResourceBinding {
        let mut b = ResourceBinding::new(
            "web-deployment",
            serde_json::from_value::<ResourceBindingSpec>(spec).unwrap(),
        );
        b.metadata.namespace = Some("shop".into());
        b.metadata.uid = Some("rb-uid".into());
        b
    }

    fn template() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "uid": "t-uid", "resourceVersion": "9",
                         "generation": 3, "creationTimestamp": "2026-01-01T00:00:00Z",
                         "managedFields": [{"manager": "kubectl"}], "finalizers": ["x"],
                         "ownerReferences": [{"kind": "Foo"}],
                         "labels": {"app": "web"},
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "keep": "me"}},
            "spec": {"replicas": 6, "template": {"spec": {"containers": [{"name": "c"}]}}},
            "status": {"replicas": 6}
        })
    }

    #[test]
    fn the_manifest_loses_hub_metadata_and_gains_its_binding() {
        let b = binding(
            json!({"resource": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}}),
        );
        let m = base_manifest(&template(), &b).unwrap();
        assert_eq!(
            m,
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "shop",
                    "labels": {"app": "web", "work.lifeboat.dev/binding-name": "web-deployment",
                               "work.lifeboat.dev/binding-namespace": "shop"},
                    "annotations": {"keep": "me", "work.lifeboat.dev/binding-uid": "rb-uid",
                                    "resourcetemplate.lifeboat.dev/generation": "3"}},
                "spec": {"replicas": 6, "template": {"spec": {"containers": [{"name": "c"}]}}}
            })
        );
        assert!(base_manifest(&json!([1]), &b).is_err());
    }

    #[test]
    fn a_job_reaches_the_member_without_what_the_hubs_api_server_generated() {
        let b = binding(
            json!({"resource": {"apiVersion": "batch/v1", "kind": "Job", "name": "train"}}),
        );
        let template = json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "shop", "uid": "hub-uid", "generation": 1},
            "spec": {
                "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "hub-uid"}},
                "template": {"metadata": {"labels": {"app": "train",
                    "controller-uid": "hub-uid", "batch.kubernetes.io/controller-uid": "hub-uid",
                    "job-name": "train", "batch.kubernetes.io/job-name": "train"}},
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "c"}]}}
            },
            "status": {"active": 1}
        });
        let before = template.clone();
        let m = base_manifest(&template, &b).unwrap();
        assert_eq!(m["spec"].get("selector"), None);
        assert_eq!(
            m["spec"]["template"]["metadata"]["labels"],
            json!({"app": "train"})
        );
        assert_eq!(
            m["metadata"]["annotations"]["resourcetemplate.lifeboat.dev/generation"],
            "1"
        );
        assert_eq!(template, before, "the hub's template is left as it is");
    }

    #[test]
    fn divided_replicas_are_revised_per_cluster() {
        let b = binding(json!({
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "replicas": 6,
            "placement": {"replicaScheduling": {"replicaSchedulingType": "Divided"}},
            "failover": {
                "application": {"purgeMode": "Gracefully"},
                "cluster": {"purgeMode": "Directly"}
            }
        }));
        let base = base_manifest(&template(), &b).unwrap();
        let target = TargetCluster {
            name: "m1".into(),
            replicas: 2,
        };
        let work = work_for(&b, &base, &target, |obj, n| {
            let mut obj = obj.clone();
            obj["spec"]["replicas"] = json!(n);
            Ok(Some(obj))
        })
        .unwrap();
        assert_eq!(work.manifest["spec"]["replicas"], 2);
        assert_eq!(
            work.purge_mode,
            Some(PurgeMode::Directly),
            "the cluster failover's purge mode decides the fence"
        );
        assert_eq!(work.key.to_string(), "shop/web-deployment");
        let mut application_only = b.clone();
        application_only.spec.failover = Some(
            serde_json::from_value(json!({"application": {"purgeMode": "Directly"}})).unwrap(),
        );
        assert_eq!(purge_mode(&application_only), None);
        let err = work_for(&b, &base, &target, |_, _| Ok(None)).unwrap_err();
        assert_eq!(err.metric_label(), "no_revise_rule");
    }

    #[test]
    fn the_copy_made_after_an_eviction_carries_the_preserved_state_as_labels() {
        let mut b = binding(json!({
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "clusters": [{"name": "m2"}, {"name": "m3"}],
            "gracefulEvictionTasks": [{"fromCluster": "m1", "purgeMode": "Gracefully",
                "reason": "ApplicationFailure", "producer": "lifeboat-hub",
                "preservedLabelState": {"training.example.com/checkpoint": "step-1200"},
                "clustersBeforeFailover": ["m1", "m3"]}],
            "evictionHistory": [{"clusterName": "m1", "reason": "ApplicationFailure",
                "evictedAt": "2026-11-23T10:00:00Z",
                "preservedLabelState": {"training.example.com/checkpoint": "step-1200", "app": "resumed"},
                "clustersBeforeFailover": ["m1", "m3"]}]
        }));
        let base = base_manifest(&template(), &b).unwrap();
        let target = |name: &str| TargetCluster {
            name: name.into(),
            replicas: 0,
        };
        let labels = |work: &Work| work.manifest["metadata"]["labels"].clone();
        let never = |_: &Value, _| -> Result<Option<Value>, String> { panic!("not revised") };
        // m2 is new since the eviction: the checkpoint goes with it (over the template's label)
        let new_copy = work_for(&b, &base, &target("m2"), never).unwrap();
        assert_eq!(
            labels(&new_copy),
            json!({"app": "resumed", "training.example.com/checkpoint": "step-1200",
                   "work.lifeboat.dev/binding-name": "web-deployment",
                   "work.lifeboat.dev/binding-namespace": "shop"})
        );
        // m3 ran before the eviction, m1 is the old copy the task keeps: unchanged
        for cluster in ["m3", "m1"] {
            let kept = work_for(&b, &base, &target(cluster), never).unwrap();
            assert_eq!(kept.manifest, base, "{cluster}");
        }
        // the task settles, the record stays: the new copy keeps its labels (no update)
        b.spec.graceful_eviction_tasks.clear();
        assert_eq!(
            work_for(&b, &base, &target("m2"), never).unwrap().manifest,
            new_copy.manifest
        );
        // no state preserved: the manifest is the template's
        b.spec.eviction_history[0].preserved_label_state.clear();
        assert_eq!(
            work_for(&b, &base, &target("m2"), never).unwrap().manifest,
            base
        );
    }

    #[test]
    fn only_directly_tasks_not_purged_yet_await_the_old_copy_gone() {
        let b = binding(json!({
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "clusters": [{"name": "m4"}],
            "gracefulEvictionTasks": [
                {"fromCluster": "m1", "purgeMode": "Directly", "reason": "ApplicationFailure", "producer": "hub"},
                {"fromCluster": "m2", "purgeMode": "Directly", "reason": "ClusterFailure", "producer": "hub",
                 "purgedAt": "2026-11-23T10:00:00Z"},
                {"fromCluster": "m3", "purgeMode": "Never", "reason": "ApplicationFailure", "producer": "hub"},
                {"fromCluster": "m5", "purgeMode": "Gracefully", "reason": "ApplicationFailure", "producer": "hub"}
            ]
        }));
        assert_eq!(awaited_purges(&b.spec), BTreeSet::from(["m1".to_string()]));
    }

    #[test]
    fn duplicated_and_gang_workloads_keep_their_replicas() {
        let b = binding(json!({
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "replicas": 6,
            "placement": {"replicaScheduling": {"replicaSchedulingType": "Duplicated"}}
        }));
        let base = base_manifest(&template(), &b).unwrap();
        let target = TargetCluster {
            name: "m1".into(),
            replicas: 6,
        };
        let work = work_for(&b, &base, &target, |_, _| panic!("not revised")).unwrap();
        assert_eq!(work.manifest["spec"]["replicas"], 6);
        assert_eq!(work.purge_mode, None);
        assert_eq!(work.reset, None);
        let mut gang = b.clone();
        gang.spec.gang = true;
        gang.spec.placement = Some(
            serde_json::from_value(
                json!({"replicaScheduling": {"replicaSchedulingType": "Divided"}}),
            )
            .unwrap(),
        );
        assert!(!divides_replicas(&gang));
    }

    #[test]
    fn the_work_carries_its_clusters_latest_reset() {
        let mut b = binding(json!({
            "resource": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "web"},
            "clusters": [{"name": "m1"}, {"name": "m2"}],
            "inPlaceResets": [{"clusterName": "m1", "generation": 3, "count": 2,
                               "lastRequestedAt": "2026-01-01T00:00:00Z", "pauseSeconds": 30}]
        }));
        let base = base_manifest(&template(), &b).unwrap();
        let for_cluster = |b: &ResourceBinding, name: &str| {
            let target = TargetCluster {
                name: name.into(),
                replicas: 0,
            };
            work_for(b, &base, &target, |_, _| Ok(None)).unwrap().reset
        };
        assert_eq!(
            for_cluster(&b, "m1"),
            Some(ResetRequest {
                generation: 3,
                pause_seconds: 30
            })
        );
        assert_eq!(for_cluster(&b, "m2"), None);
        b.spec.in_place_resets[0].pause_seconds = None;
        assert_eq!(for_cluster(&b, "m1").map(|r| r.pause_seconds), Some(0));
    }
}
