//! In-memory indexes fed by watches, read by every reconcile without an API call:
//! - [`PodIndex`]: the pods carrying the AppWrapper label, by AppWrapper and by node;
//! - [`ComponentIndex`]: the wrapped objects of one kind, by namespace and name, with what their
//!   status says about failure.
//!
//! Each index is a pure state machine (`apply`/`delete`/`reset`) that returns the AppWrappers a
//! change concerns, so the watch driver can trigger their reconciles. Unit-tested directly.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodCondition,
    PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::DynamicObject;
use lifeboat_api::appwrapper::constants::APPWRAPPER_LABEL;

/// An AppWrapper, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AwKey {
    pub namespace: String,
    pub name: String,
}

impl AwKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

fn owner_of(
    labels: Option<&BTreeMap<String, String>>,
    namespace: Option<&String>,
) -> Option<AwKey> {
    let name = labels?.get(APPWRAPPER_LABEL)?;
    Some(AwKey::new(namespace?.clone(), name.clone()))
}

/// Pods with the AppWrapper label.
#[derive(Debug, Default)]
pub struct PodIndex {
    by_appwrapper: HashMap<AwKey, BTreeMap<String, Arc<Pod>>>,
    by_node: HashMap<String, BTreeSet<(AwKey, String)>>,
    synced: bool,
}

impl PodIndex {
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// Adds or updates a pod (kept in its [`slim`] form); returns the AppWrapper it belongs to,
    /// or nothing when the slim form did not change. Most pod updates touch nothing the summary
    /// reads (an annotation, the Job controller's tracking finalizer, readiness probes, IPs): in
    /// a burst of failures their reconciles would only compete for the controller's slots and
    /// the CPU the API server needs.
    pub fn apply(&mut self, pod: Pod) -> Vec<AwKey> {
        let pod = slim(pod);
        let Some(key) = owner_of(
            pod.metadata.labels.as_ref(),
            pod.metadata.namespace.as_ref(),
        ) else {
            return vec![];
        };
        let Some(name) = pod.metadata.name.clone() else {
            return vec![];
        };
        if self
            .by_appwrapper
            .get(&key)
            .and_then(|pods| pods.get(&name))
            .is_some_and(|old| **old == pod)
        {
            return vec![];
        }
        self.unlink_node(&key, &name);
        if let Some(node) = node_of(&pod) {
            self.by_node
                .entry(node)
                .or_default()
                .insert((key.clone(), name.clone()));
        }
        self.by_appwrapper
            .entry(key.clone())
            .or_default()
            .insert(name, Arc::new(pod));
        vec![key]
    }

    /// Removes a deleted pod; returns the AppWrapper it belonged to.
    pub fn delete(&mut self, pod: &Pod) -> Vec<AwKey> {
        let Some(key) = owner_of(
            pod.metadata.labels.as_ref(),
            pod.metadata.namespace.as_ref(),
        ) else {
            return vec![];
        };
        let Some(name) = pod.metadata.name.as_deref() else {
            return vec![];
        };
        self.unlink_node(&key, name);
        if let Some(pods) = self.by_appwrapper.get_mut(&key) {
            pods.remove(name);
            if pods.is_empty() {
                self.by_appwrapper.remove(&key);
            }
        }
        vec![key]
    }

    /// Replaces the contents with a full list; returns every AppWrapper before or after.
    pub fn reset(&mut self, pods: Vec<Pod>) -> Vec<AwKey> {
        let mut touched: BTreeSet<AwKey> = self.by_appwrapper.keys().cloned().collect();
        self.by_appwrapper.clear();
        self.by_node.clear();
        for pod in pods {
            touched.extend(self.apply(pod));
        }
        self.synced = true;
        touched.into_iter().collect()
    }

    fn unlink_node(&mut self, key: &AwKey, name: &str) {
        let old_node = self
            .by_appwrapper
            .get(key)
            .and_then(|pods| pods.get(name))
            .and_then(|p| node_of(p));
        if let Some(node) = old_node
            && let Some(set) = self.by_node.get_mut(&node)
        {
            set.remove(&(key.clone(), name.to_string()));
            if set.is_empty() {
                self.by_node.remove(&node);
            }
        }
    }

    /// The pods of one AppWrapper.
    pub fn pods_of(&self, key: &AwKey) -> Vec<Pod> {
        self.by_appwrapper
            .get(key)
            .map(|pods| pods.values().map(|p| (**p).clone()).collect())
            .unwrap_or_default()
    }

    /// The AppWrappers with a pod on `node`.
    pub fn appwrappers_on_node(&self, node: &str) -> Vec<AwKey> {
        let set: BTreeSet<AwKey> = self
            .by_node
            .get(node)
            .map(|s| s.iter().map(|(k, _)| k.clone()).collect())
            .unwrap_or_default();
        set.into_iter().collect()
    }

    pub fn len(&self) -> usize {
        self.by_appwrapper.values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_appwrapper.is_empty()
    }
}

/// The parts of a pod the agent reads (labels, deletion, node, container resources, phase,
/// scheduling and disruption conditions, terminated states). A cluster with thousands of
/// AppWrapper pods would otherwise keep their managed fields, environments, volumes and images.
pub fn slim(pod: Pod) -> Pod {
    let metadata = ObjectMeta {
        name: pod.metadata.name,
        namespace: pod.metadata.namespace,
        labels: pod.metadata.labels.map(|labels| {
            labels
                .into_iter()
                .filter(|(k, _)| k == APPWRAPPER_LABEL)
                .collect()
        }),
        deletion_timestamp: pod.metadata.deletion_timestamp,
        ..Default::default()
    };
    let spec = pod.spec.map(|spec| PodSpec {
        node_name: spec.node_name,
        containers: spec
            .containers
            .into_iter()
            .map(|c| Container {
                name: c.name,
                resources: c.resources,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    let status = pod.status.map(|status| PodStatus {
        phase: status.phase,
        reason: status.reason,
        conditions: status.conditions.map(|cs| {
            cs.into_iter()
                .filter(|c| c.type_ == "PodScheduled" || c.type_ == "DisruptionTarget")
                .map(|c| PodCondition {
                    type_: c.type_,
                    status: c.status,
                    reason: c.reason,
                    message: c.message,
                    ..Default::default()
                })
                .collect()
        }),
        container_statuses: status.container_statuses.map(|cs| {
            cs.into_iter()
                .map(|c| ContainerStatus {
                    name: c.name,
                    state: c.state.map(|state| ContainerState {
                        terminated: state.terminated.map(|t| ContainerStateTerminated {
                            exit_code: t.exit_code,
                            reason: t.reason,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect()
        }),
        ..Default::default()
    });
    Pod {
        metadata,
        spec,
        status,
    }
}

fn node_of(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty())
}

/// What the index knows about one wrapped object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentInfo {
    pub uid: String,
    pub deleting: bool,
    /// Why its status says it failed (batch/v1 Job, kubeflow PyTorchJob), if it does.
    pub failed: Option<String>,
}

/// The wrapped objects of one kind that carry the AppWrapper label.
#[derive(Debug, Default)]
pub struct ComponentIndex {
    api_version: String,
    kind: String,
    objects: HashMap<(String, String), ComponentInfo>,
    synced: bool,
}

impl ComponentIndex {
    pub fn new(api_version: &str, kind: &str) -> Self {
        Self {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            ..Default::default()
        }
    }

    pub fn is_synced(&self) -> bool {
        self.synced
    }

    fn key(obj: &DynamicObject) -> Option<(String, String)> {
        Some((obj.metadata.namespace.clone()?, obj.metadata.name.clone()?))
    }

    pub fn info(&self, obj: &DynamicObject) -> ComponentInfo {
        ComponentInfo {
            uid: obj.metadata.uid.clone().unwrap_or_default(),
            deleting: obj.metadata.deletion_timestamp.is_some(),
            failed: component_failure(&self.api_version, &self.kind, &obj.data),
        }
    }

    pub fn apply(&mut self, obj: DynamicObject) -> Vec<AwKey> {
        let Some(key) = Self::key(&obj) else {
            return vec![];
        };
        let info = self.info(&obj);
        let changed = self.objects.get(&key) != Some(&info);
        self.objects.insert(key, info);
        match owner_of(
            obj.metadata.labels.as_ref(),
            obj.metadata.namespace.as_ref(),
        ) {
            Some(aw) if changed => vec![aw],
            _ => vec![],
        }
    }

    pub fn delete(&mut self, obj: &DynamicObject) -> Vec<AwKey> {
        let Some(key) = Self::key(obj) else {
            return vec![];
        };
        self.objects.remove(&key);
        owner_of(
            obj.metadata.labels.as_ref(),
            obj.metadata.namespace.as_ref(),
        )
        .into_iter()
        .collect()
    }

    pub fn reset(&mut self, objs: Vec<DynamicObject>) -> Vec<AwKey> {
        self.objects.clear();
        let mut touched = Vec::new();
        for obj in objs {
            if let Some(aw) = owner_of(
                obj.metadata.labels.as_ref(),
                obj.metadata.namespace.as_ref(),
            ) {
                touched.push(aw);
            }
            self.apply(obj);
        }
        self.synced = true;
        touched
    }

    /// The object `namespace/name`, if the watch has seen it.
    pub fn get(&self, namespace: &str, name: &str) -> Option<&ComponentInfo> {
        self.objects.get(&(namespace.to_string(), name.to_string()))
    }
}

/// What a wrapped object's status says about failure, for the kinds whose failure is terminal
/// for their own controller: batch/v1 Job and kubeflow.org/v1 PyTorchJob (condition Failed=True).
/// KubeRay's `failed` state is transient, so Ray kinds are not interpreted (upstream PR #174).
pub fn component_failure(
    api_version: &str,
    kind: &str,
    data: &serde_json::Value,
) -> Option<String> {
    match (api_version, kind) {
        ("batch/v1", "Job") | ("kubeflow.org/v1", "PyTorchJob") => {}
        _ => return None,
    }
    data.get("status")?
        .get("conditions")?
        .as_array()?
        .iter()
        .find(|c| {
            c.get("type").and_then(|t| t.as_str()) == Some("Failed")
                && c.get("status").and_then(|s| s.as_str()) == Some("True")
        })
        .map(|c| {
            let reason = c.get("reason").and_then(|r| r.as_str()).unwrap_or("Failed");
            match c.get("message").and_then(|m| m.as_str()) {
                Some(m) if !m.is_empty() => format!("{reason}: {m}"),
                _ => reason.to_string(),
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, name: &str, aw: Option<&str>, node: &str) -> Pod {
        let mut labels = serde_json::Map::new();
        if let Some(aw) = aw {
            labels.insert(APPWRAPPER_LABEL.into(), json!(aw));
        }
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "labels": labels},
            "spec": {"nodeName": node, "containers": []}
        }))
        .unwrap()
    }

    #[test]
    fn pods_are_indexed_by_appwrapper_and_node() {
        let mut idx = PodIndex::default();
        assert_eq!(
            idx.apply(pod("ns", "a-0", Some("a"), "n1")),
            vec![AwKey::new("ns", "a")]
        );
        idx.apply(pod("ns", "a-1", Some("a"), "n2"));
        idx.apply(pod("ns", "b-0", Some("b"), "n1"));
        assert!(idx.apply(pod("ns", "stray", None, "n1")).is_empty());
        assert_eq!(idx.pods_of(&AwKey::new("ns", "a")).len(), 2);
        assert_eq!(
            idx.appwrappers_on_node("n1"),
            vec![AwKey::new("ns", "a"), AwKey::new("ns", "b")]
        );
        // A pod moving node is re-linked.
        idx.apply(pod("ns", "b-0", Some("b"), "n3"));
        assert_eq!(idx.appwrappers_on_node("n1"), vec![AwKey::new("ns", "a")]);
        assert_eq!(idx.appwrappers_on_node("n3"), vec![AwKey::new("ns", "b")]);
        assert_eq!(
            idx.delete(&pod("ns", "a-0", Some("a"), "n1")),
            vec![AwKey::new("ns", "a")]
        );
        assert!(idx.appwrappers_on_node("n1").is_empty());
        assert_eq!(idx.len(), 2);
        // Same name in another namespace is another AppWrapper.
        idx.apply(pod("other", "a-0", Some("a"), "n1"));
        assert_eq!(idx.pods_of(&AwKey::new("other", "a")).len(), 1);
        assert_eq!(idx.pods_of(&AwKey::new("ns", "a")).len(), 1);
    }

    #[test]
    fn slim_pods_keep_everything_the_summary_reads() {
        use crate::config::FaultToleranceConfig;
        use crate::node_health::NodeHealthIndex;
        use crate::params::Params;
        let full: Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "p", "labels": {APPWRAPPER_LABEL: "aw", "app": "x"},
                "annotations": {"big": "x".repeat(1000)}, "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "huge:latest",
                "env": [{"name": "A", "value": "1"}], "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Failed", "reason": "Evicted", "conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}],
                "containerStatuses": [{"name": "c", "image": "huge:latest", "imageID": "sha", "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 3, "reason": "Error", "message": "long log tail"}}}]}
        }))
        .unwrap();
        let small = slim(full.clone());
        assert!(small.metadata.managed_fields.is_none() && small.metadata.annotations.is_none());
        assert_eq!(small.metadata.labels.as_ref().unwrap().len(), 1);
        assert!(
            serde_json::to_string(&small).unwrap().len()
                < serde_json::to_string(&full).unwrap().len() / 3
        );
        let nodes = NodeHealthIndex::new(None, vec![]);
        let params = Params::defaults(&FaultToleranceConfig::default());
        assert_eq!(
            crate::pods::summarize(&[small], &nodes, &params, true),
            crate::pods::summarize(&[full], &nodes, &params, true)
        );
    }

    #[test]
    fn only_changes_the_summary_reads_trigger() {
        let mut idx = PodIndex::default();
        let key = AwKey::new("ns", "a");
        let mut p = pod("ns", "a-0", Some("a"), "n1");
        assert_eq!(idx.apply(p.clone()), vec![key.clone()]);
        // An annotation, a finalizer, a field the summary does not read: no reconcile.
        p.metadata.annotations = Some([("fail".to_string(), "1".to_string())].into());
        p.metadata.finalizers = Some(vec!["batch.kubernetes.io/job-tracking".into()]);
        p.metadata.resource_version = Some("7".into());
        assert!(idx.apply(p.clone()).is_empty());
        // The phase changes: reconcile.
        p.status = Some(PodStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        });
        assert_eq!(idx.apply(p.clone()), vec![key.clone()]);
        assert!(idx.apply(p.clone()).is_empty());
        assert_eq!(
            idx.pods_of(&key)[0]
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref()),
            Some("Failed")
        );
        // Deletion starts: reconcile.
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        assert_eq!(idx.apply(p), vec![key]);
    }

    #[test]
    fn reset_replaces_everything_and_touches_old_and_new() {
        let mut idx = PodIndex::default();
        assert!(!idx.is_synced());
        idx.apply(pod("ns", "old-0", Some("old"), "n1"));
        let touched = idx.reset(vec![pod("ns", "new-0", Some("new"), "n1")]);
        assert!(idx.is_synced());
        assert_eq!(
            touched,
            vec![AwKey::new("ns", "new"), AwKey::new("ns", "old")]
        );
        assert!(idx.pods_of(&AwKey::new("ns", "old")).is_empty());
        assert_eq!(idx.appwrappers_on_node("n1"), vec![AwKey::new("ns", "new")]);
    }

    fn job(name: &str, aw: &str, status: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"namespace": "ns", "name": name, "uid": "u1", "labels": {APPWRAPPER_LABEL: aw}},
            "status": status
        }))
        .unwrap()
    }

    #[test]
    fn components_report_failure_and_trigger_only_on_change() {
        let mut idx = ComponentIndex::new("batch/v1", "Job");
        assert_eq!(
            idx.apply(job("j", "aw", json!({"active": 1}))),
            vec![AwKey::new("ns", "aw")]
        );
        assert!(
            idx.apply(job("j", "aw", json!({"active": 1}))).is_empty(),
            "no change, no trigger"
        );
        let failed = job(
            "j",
            "aw",
            json!({"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]}),
        );
        assert_eq!(idx.apply(failed), vec![AwKey::new("ns", "aw")]);
        assert_eq!(
            idx.get("ns", "j").unwrap().failed.as_deref(),
            Some("BackoffLimitExceeded: Job has reached the specified backoff limit")
        );
        assert_eq!(
            idx.delete(&job("j", "aw", json!({}))),
            vec![AwKey::new("ns", "aw")]
        );
        assert!(idx.get("ns", "j").is_none());
    }

    #[test]
    fn only_jobs_and_pytorchjobs_are_interpreted() {
        let failed = json!({"status": {"conditions": [{"type": "Failed", "status": "True"}]}});
        assert_eq!(
            component_failure("batch/v1", "Job", &failed).as_deref(),
            Some("Failed")
        );
        assert!(component_failure("kubeflow.org/v1", "PyTorchJob", &failed).is_some());
        assert!(component_failure("ray.io/v1", "RayCluster", &failed).is_none());
        assert!(component_failure("apps/v1", "Deployment", &failed).is_none());
        let not_failed = json!({"status": {"conditions": [{"type": "Failed", "status": "False"}]}});
        assert!(component_failure("batch/v1", "Job", &not_failed).is_none());
    }
}
