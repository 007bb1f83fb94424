//! PodSets: inference for the known kinds (reference §4.3), the effective podSets of a
//! component (declared, else inferred) and the expected pod count.

use std::collections::BTreeMap;

use serde_json::Value;

use super::constants::{annotations, pod_labels};
use super::path;
use super::types::{AppWrapperComponent, AppWrapperPodSet, AppWrapperStatus};

/// `(group, version, kind)` of a wrapped object; the core group is `""`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupVersionKind {
    /// API group (`""` for core).
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind.
    pub kind: String,
}

impl GroupVersionKind {
    /// Reads `apiVersion` and `kind` of a wrapped object; `None` when either is missing, not a
    /// string, or empty.
    pub fn of(object: &Value) -> Option<Self> {
        let api_version = object.get("apiVersion")?.as_str()?;
        let kind = object.get("kind")?.as_str()?;
        if api_version.is_empty() || kind.is_empty() {
            return None;
        }
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        Some(GroupVersionKind {
            group: group.to_string(),
            version: version.to_string(),
            kind: kind.to_string(),
        })
    }

    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    fn is(&self, api_version: &str, kind: &str) -> bool {
        self.kind == kind && self.api_version() == api_version
    }
}

impl std::fmt::Display for GroupVersionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.api_version(), self.kind)
    }
}

/// True when podSets can be inferred for this kind (the eight kinds of reference §4.3).
pub fn is_inferable(gvk: &GroupVersionKind) -> bool {
    INFERABLE_KINDS
        .iter()
        .any(|(api_version, kind)| gvk.is(api_version, kind))
}

/// The kinds whose podSets are inferred, as `(apiVersion, kind)`.
pub const INFERABLE_KINDS: [(&str, &str); 8] = [
    ("v1", "Pod"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"),
    ("batch/v1", "Job"),
    ("jobset.x-k8s.io/v1alpha2", "JobSet"),
    ("kubeflow.org/v1", "PyTorchJob"),
    ("ray.io/v1", "RayCluster"),
    ("ray.io/v1", "RayJob"),
];

/// Infers the podSets of a wrapped object (`template` is the component's `template`): upstream's
/// `InferPodSets`, rule for rule. Unknown kinds (and non-objects) infer nothing. Integer fields
/// that are missing or not integers take their defaults, as upstream.
pub fn infer_pod_sets(template: &Value) -> Vec<AppWrapperPodSet> {
    let Some(gvk) = GroupVersionKind::of(template) else {
        return Vec::new();
    };
    let api_version = gvk.api_version();
    match (api_version.as_str(), gvk.kind.as_str()) {
        ("v1", "Pod") => vec![pod_set("template", 1, BTreeMap::new())],
        ("apps/v1", "Deployment") | ("apps/v1", "StatefulSet") => {
            let replicas = int_at(template, "template.spec.replicas").unwrap_or(1);
            vec![pod_set("template.spec.template", replicas, BTreeMap::new())]
        }
        ("batch/v1", "Job") => {
            let replicas = job_pod_count(template, "template.spec");
            vec![pod_set(
                "template.spec.template",
                replicas,
                tas(&[(
                    annotations::TAS_POD_INDEX_LABEL,
                    pod_labels::JOB_COMPLETION_INDEX,
                )]),
            )]
        }
        ("jobset.x-k8s.io/v1alpha2", "JobSet") => infer_jobset(template),
        ("kubeflow.org/v1", "PyTorchJob") => infer_pytorch_job(template),
        ("ray.io/v1", "RayCluster") => infer_ray_cluster(template, "template.spec."),
        ("ray.io/v1", "RayJob") => infer_ray_cluster(template, "template.spec.rayClusterSpec."),
        _ => Vec::new(),
    }
}

/// The podSets the controller uses for a component: the declared ones, else the inferred ones.
pub fn effective_pod_sets(component: &AppWrapperComponent) -> Vec<AppWrapperPodSet> {
    if component.declared_pod_sets.is_empty() {
        infer_pod_sets(&component.template)
    } else {
        component.declared_pod_sets.clone()
    }
}

/// The number of pods a set of podSets yields: the sum of replicas (absent = 1). A negative
/// replica count contributes nothing rather than cancelling other podSets.
pub fn expected_pod_count(pod_sets: &[AppWrapperPodSet]) -> i64 {
    pod_sets
        .iter()
        .map(|ps| i64::from(ps.replicas_or_default().max(0)))
        .sum()
}

/// The expected pod count of a deployed AppWrapper: over the podSets cached in
/// `status.componentStatus` (upstream `ExpectedPodCount`), so later spec edits cannot change it.
pub fn expected_pod_count_of_status(status: &AppWrapperStatus) -> i64 {
    status
        .component_status
        .iter()
        .map(|cs| expected_pod_count(&cs.pod_sets))
        .sum()
}

fn pod_set(path: &str, replicas: i32, annotations: BTreeMap<String, String>) -> AppWrapperPodSet {
    AppWrapperPodSet {
        replicas: Some(replicas),
        path: path.to_string(),
        annotations,
    }
}

fn tas(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The integer at `path`, if it resolves to an integer that fits an i32.
fn int_at(template: &Value, path: &str) -> Option<i32> {
    path::get(template, path)
        .ok()?
        .as_i64()
        .and_then(|n| i32::try_from(n).ok())
}

fn exists(template: &Value, path: &str) -> bool {
    path::get(template, path).is_ok()
}

/// min(parallelism (default 1), completions if set), for a batch/v1 JobSpec at `spec_path`.
fn job_pod_count(template: &Value, spec_path: &str) -> i32 {
    let mut replicas = int_at(template, &format!("{spec_path}.parallelism")).unwrap_or(1);
    if let Some(completions) = int_at(template, &format!("{spec_path}.completions"))
        && completions < replicas
    {
        replicas = completions;
    }
    replicas
}

fn infer_jobset(template: &Value) -> Vec<AppWrapperPodSet> {
    let Ok(Value::Array(jobs)) = path::get(template, "template.spec.replicatedJobs") else {
        return Vec::new();
    };
    let mut pod_sets = Vec::new();
    for i in 0..jobs.len() {
        let prefix = format!("template.spec.replicatedJobs[{i}].");
        if !exists(template, &format!("{prefix}template")) {
            continue;
        }
        let pods_per_job = job_pod_count(template, &format!("{prefix}template.spec"));
        let job_replicas = int_at(template, &format!("{prefix}replicas")).unwrap_or(1);
        pod_sets.push(pod_set(
            &format!("{prefix}template.spec.template"),
            job_replicas.saturating_mul(pods_per_job),
            tas(&[
                (
                    annotations::TAS_POD_INDEX_LABEL,
                    pod_labels::JOB_COMPLETION_INDEX,
                ),
                (
                    annotations::TAS_SUB_GROUP_INDEX_LABEL,
                    pod_labels::JOBSET_JOB_INDEX,
                ),
                (annotations::TAS_SUB_GROUP_COUNT, &job_replicas.to_string()),
            ]),
        ));
    }
    pod_sets
}

fn infer_pytorch_job(template: &Value) -> Vec<AppWrapperPodSet> {
    let mut pod_sets = Vec::new();
    for replica_type in ["Master", "Worker"] {
        let prefix = format!("template.spec.pytorchReplicaSpecs.{replica_type}");
        if !exists(template, &format!("{prefix}.template")) {
            continue;
        }
        let replicas = int_at(template, &format!("{prefix}.replicas")).unwrap_or(1);
        pod_sets.push(pod_set(
            &format!("{prefix}.template"),
            replicas,
            tas(&[(
                annotations::TAS_POD_INDEX_LABEL,
                pod_labels::KUBEFLOW_REPLICA_INDEX,
            )]),
        ));
    }
    pod_sets
}

/// RayCluster spec at `prefix` (`template.spec.` or `template.spec.rayClusterSpec.`): the head
/// with one replica, then every worker group with `replicas` (min/max replicas and numOfHosts
/// are ignored, as upstream).
fn infer_ray_cluster(template: &Value, prefix: &str) -> Vec<AppWrapperPodSet> {
    let mut pod_sets = Vec::new();
    let head = format!("{prefix}headGroupSpec.template");
    if exists(template, &head) {
        pod_sets.push(pod_set(&head, 1, BTreeMap::new()));
    }
    if let Ok(Value::Array(groups)) = path::get(template, &format!("{prefix}workerGroupSpecs")) {
        for i in 0..groups.len() {
            let group = format!("{prefix}workerGroupSpecs[{i}]");
            if !exists(template, &format!("{group}.template")) {
                continue;
            }
            let replicas = int_at(template, &format!("{group}.replicas")).unwrap_or(1);
            pod_sets.push(pod_set(
                &format!("{group}.template"),
                replicas,
                BTreeMap::new(),
            ));
        }
    }
    pod_sets
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn summary(template: Value) -> Vec<(String, i32)> {
        infer_pod_sets(&template)
            .into_iter()
            .map(|ps| (ps.path.clone(), ps.replicas_or_default()))
            .collect()
    }

    fn pod_template() -> Value {
        json!({"spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    }

    #[test]
    fn pod() {
        let t = json!({"apiVersion": "v1", "kind": "Pod", "spec": {"containers": []}});
        assert_eq!(summary(t), vec![("template".into(), 1)]);
    }

    #[test]
    fn deployment_and_statefulset_replicas_default_to_one() {
        for kind in ["Deployment", "StatefulSet"] {
            let t = json!({"apiVersion": "apps/v1", "kind": kind,
                "spec": {"replicas": 4, "template": pod_template()}});
            assert_eq!(summary(t), vec![("template.spec.template".into(), 4)]);
            let t = json!({"apiVersion": "apps/v1", "kind": kind,
                "spec": {"template": pod_template()}});
            assert_eq!(summary(t), vec![("template.spec.template".into(), 1)]);
        }
    }

    #[test]
    fn job_is_min_of_parallelism_and_completions() {
        let job = |spec: Value| json!({"apiVersion": "batch/v1", "kind": "Job", "spec": spec});
        let cases = [
            (json!({"template": pod_template()}), 1),
            (json!({"parallelism": 2, "completions": 4}), 2),
            (json!({"parallelism": 8, "completions": 4}), 4),
            (json!({"parallelism": 3}), 3),
            (json!({"completions": 5}), 1),
            (json!({"completions": 0, "parallelism": 2}), 0),
            // not an integer: default, as upstream's GetReplicas
            (json!({"parallelism": "2"}), 1),
        ];
        for (spec, expected) in cases {
            let pod_sets = infer_pod_sets(&job(spec.clone()));
            assert_eq!(pod_sets.len(), 1);
            assert_eq!(pod_sets[0].path, "template.spec.template");
            assert_eq!(pod_sets[0].replicas, Some(expected), "{spec}");
            assert_eq!(
                pod_sets[0].annotations[annotations::TAS_POD_INDEX_LABEL],
                pod_labels::JOB_COMPLETION_INDEX
            );
        }
    }

    #[test]
    fn jobset_multiplies_job_replicas_and_pods_per_job() {
        let t = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "spec": {
        "replicatedJobs": [
            {"name": "workers", "replicas": 2, "template": {"spec": {
                "parallelism": 2, "completions": 2, "template": pod_template()}}},
            {"name": "no-template"},
            {"name": "driver", "template": {"spec": {"template": pod_template()}}}
        ]}});
        let pod_sets = infer_pod_sets(&t);
        assert_eq!(pod_sets.len(), 2);
        assert_eq!(
            pod_sets[0].path,
            "template.spec.replicatedJobs[0].template.spec.template"
        );
        assert_eq!(pod_sets[0].replicas, Some(4));
        assert_eq!(
            pod_sets[0].annotations[annotations::TAS_SUB_GROUP_COUNT],
            "2"
        );
        assert_eq!(
            pod_sets[0].annotations[annotations::TAS_SUB_GROUP_INDEX_LABEL],
            pod_labels::JOBSET_JOB_INDEX
        );
        assert_eq!(
            pod_sets[1].path,
            "template.spec.replicatedJobs[2].template.spec.template"
        );
        assert_eq!(pod_sets[1].replicas, Some(1));
        assert_eq!(
            pod_sets[1].annotations[annotations::TAS_SUB_GROUP_COUNT],
            "1"
        );
    }

    #[test]
    fn pytorch_master_then_worker() {
        let t = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": {
        "pytorchReplicaSpecs": {
            "Worker": {"replicas": 4, "template": pod_template()},
            "Master": {"template": pod_template()}
        }}});
        assert_eq!(
            summary(t),
            vec![
                (
                    "template.spec.pytorchReplicaSpecs.Master.template".into(),
                    1
                ),
                (
                    "template.spec.pytorchReplicaSpecs.Worker.template".into(),
                    4
                ),
            ]
        );
        let worker_only = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": {
            "pytorchReplicaSpecs": {"Worker": {"replicas": 2, "template": pod_template()}}}});
        let pod_sets = infer_pod_sets(&worker_only);
        assert_eq!(pod_sets.len(), 1);
        assert_eq!(
            pod_sets[0].annotations[annotations::TAS_POD_INDEX_LABEL],
            pod_labels::KUBEFLOW_REPLICA_INDEX
        );
    }

    #[test]
    fn ray_cluster_and_ray_job() {
        let cluster_spec = json!({
        "headGroupSpec": {"template": pod_template()},
        "workerGroupSpecs": [
            {"replicas": 7, "minReplicas": 1, "maxReplicas": 10, "numOfHosts": 2,
             "template": pod_template()},
            {"template": pod_template()}
        ]});
        let cluster = json!({"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "spec": cluster_spec.clone()});
        assert_eq!(
            summary(cluster),
            vec![
                ("template.spec.headGroupSpec.template".into(), 1),
                ("template.spec.workerGroupSpecs[0].template".into(), 7),
                ("template.spec.workerGroupSpecs[1].template".into(), 1),
            ]
        );
        let job = json!({"apiVersion": "ray.io/v1", "kind": "RayJob",
            "spec": {"rayClusterSpec": cluster_spec}});
        assert_eq!(
            summary(job),
            vec![
                (
                    "template.spec.rayClusterSpec.headGroupSpec.template".into(),
                    1
                ),
                (
                    "template.spec.rayClusterSpec.workerGroupSpecs[0].template".into(),
                    7
                ),
                (
                    "template.spec.rayClusterSpec.workerGroupSpecs[1].template".into(),
                    1
                ),
            ]
        );
    }

    #[test]
    fn other_kinds_and_versions_infer_nothing() {
        for t in [
            json!({"apiVersion": "v1", "kind": "Service", "spec": {}}),
            json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet"}),
            json!({"apiVersion": "batch/v1beta1", "kind": "Job"}),
            json!({"apiVersion": "kubeflow.org/v2", "kind": "PyTorchJob"}),
            json!({"kind": "Pod"}),
            json!("not an object"),
        ] {
            assert!(infer_pod_sets(&t).is_empty(), "{t}");
        }
    }

    #[test]
    fn effective_prefers_declared_and_counts_pods() {
        let mut component = AppWrapperComponent {
            annotations: BTreeMap::new(),
            declared_pod_sets: Vec::new(),
            pod_set_infos: Vec::new(),
            template: json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "spec": {"replicas": 3, "template": pod_template()}}),
        };
        assert_eq!(expected_pod_count(&effective_pod_sets(&component)), 3);
        component.declared_pod_sets = vec![
            AppWrapperPodSet {
                replicas: None,
                path: "template.spec.template".into(),
                annotations: BTreeMap::new(),
            },
            AppWrapperPodSet {
                replicas: Some(5),
                path: "template.x".into(),
                annotations: BTreeMap::new(),
            },
            AppWrapperPodSet {
                replicas: Some(-2),
                path: "template.y".into(),
                annotations: BTreeMap::new(),
            },
        ];
        assert_eq!(effective_pod_sets(&component).len(), 3);
        assert_eq!(expected_pod_count(&effective_pod_sets(&component)), 6);
    }

    #[test]
    fn gvk_parsing() {
        let gvk =
            GroupVersionKind::of(&json!({"apiVersion": "apps/v1", "kind": "Deployment"})).unwrap();
        assert_eq!((gvk.group.as_str(), gvk.version.as_str()), ("apps", "v1"));
        let core = GroupVersionKind::of(&json!({"apiVersion": "v1", "kind": "Pod"})).unwrap();
        assert_eq!(core.group, "");
        assert_eq!(core.api_version(), "v1");
        assert!(is_inferable(&core));
        assert!(GroupVersionKind::of(&json!({"apiVersion": "", "kind": "Pod"})).is_none());
        assert!(GroupVersionKind::of(&json!({"apiVersion": "v1", "kind": 3})).is_none());
    }
}
