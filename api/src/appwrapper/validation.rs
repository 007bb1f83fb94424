//! Admission rules (reference §4.2 and §4.4) as pure functions. The SubjectAccessReview per
//! wrapped kind is IO and stays with the webhook: [`component_kinds`] lists what to review.
//!
//! Errors are aggregated; each names the field (Kubernetes field-path syntax, e.g.
//! `spec.components[1].podSets[0].path`) and the reason.

use std::collections::BTreeMap;

use serde_json::Value;

use super::constants::{API_VERSION, KIND, USER_ID_LABEL, USER_NAME_LABEL};
use super::podsets::{GroupVersionKind, infer_pod_sets};
use super::podspec::pod_spec_at;
use super::types::{AppWrapper, AppWrapperPodSet, AppWrapperSpec};

/// At most this many pod specs in one AppWrapper (Kueue's podSet limit).
pub const MAX_POD_SPECS: usize = 8;

/// What kind of rule a field broke (the Kubernetes `field.ErrorType` it maps to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// The value is malformed or inconsistent.
    Invalid,
    /// The value is well-formed but not allowed (nesting, other namespaces, immutability).
    Forbidden,
    /// A required value is missing.
    Required,
}

/// One rejected field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    /// Field path, e.g. `spec.components[0].podSets[1].path`.
    pub field: String,
    /// Invalid, Forbidden or Required.
    pub kind: FieldErrorKind,
    /// Why.
    pub reason: String,
}

impl FieldError {
    fn new(kind: FieldErrorKind, field: impl Into<String>, reason: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            kind,
            reason: reason.into(),
        }
    }
}

/// Every rejected field of one admission request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ValidationErrors(pub Vec<FieldError>);

impl ValidationErrors {
    fn into_result(self) -> Result<(), ValidationErrors> {
        if self.0.is_empty() { Ok(()) } else { Err(self) }
    }
}

/// One wrapped kind to authorise with a SubjectAccessReview (verb `create` in the AppWrapper's
/// namespace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentKind {
    /// Index in `spec.components`.
    pub index: usize,
    /// The template's group, version and kind.
    pub gvk: GroupVersionKind,
}

/// The `(group, version, kind)` of every component whose template names one, for the webhook's
/// SubjectAccessReviews. Templates without `apiVersion`/`kind` are skipped here and rejected by
/// [`validate_create`].
pub fn component_kinds(spec: &AppWrapperSpec) -> Vec<ComponentKind> {
    spec.components
        .iter()
        .enumerate()
        .filter_map(|(index, c)| {
            GroupVersionKind::of(&c.template).map(|gvk| ComponentKind { index, gvk })
        })
        .collect()
}

/// Create validation (reference §4.2, without the SubjectAccessReview): decodable templates, no
/// nested AppWrappers, objects only in `namespace` (the AppWrapper's), declared podSet paths that
/// name a PodSpec, declared podSets consistent with the inferred ones, no duplicate paths, and
/// 1..=8 pod specs in total.
pub fn validate_create(spec: &AppWrapperSpec, namespace: &str) -> Result<(), ValidationErrors> {
    let mut errors = Vec::new();
    let mut pod_spec_count = 0usize;
    for (idx, component) in spec.components.iter().enumerate() {
        let comp = format!("spec.components[{idx}]");
        let template = &component.template;
        let Some(gvk) = check_template(template, &comp, &mut errors) else {
            // Still count declared podSets so a single bad template does not also report
            // "no podspecs".
            pod_spec_count += component.declared_pod_sets.len();
            continue;
        };
        if gvk.api_version() == API_VERSION && gvk.kind == KIND {
            errors.push(FieldError::new(
                FieldErrorKind::Forbidden,
                format!("{comp}.template"),
                "Nested AppWrappers are forbidden",
            ));
        }
        match template.pointer("/metadata/namespace") {
            None | Some(Value::Null) => {}
            Some(Value::String(ns)) if ns.is_empty() || ns == namespace => {}
            Some(Value::String(ns)) => errors.push(FieldError::new(
                FieldErrorKind::Forbidden,
                format!("{comp}.template.metadata.namespace"),
                format!(
                    "AppWrappers cannot create objects in other namespaces: `{ns}` is not the \
                     AppWrapper's namespace `{namespace}`"
                ),
            )),
            Some(_) => errors.push(FieldError::new(
                FieldErrorKind::Invalid,
                format!("{comp}.template.metadata.namespace"),
                "must be a string",
            )),
        }

        for (ps_idx, pod_set) in component.declared_pod_sets.iter().enumerate() {
            let field = format!("{comp}.podSets[{ps_idx}].path");
            if pod_set.path.is_empty() {
                errors.push(FieldError::new(
                    FieldErrorKind::Required,
                    field,
                    "podspec must specify path",
                ));
            } else if let Err(err) = pod_spec_at(template, &pod_set.path) {
                errors.push(FieldError::new(
                    FieldErrorKind::Invalid,
                    field,
                    format!("path does not refer to a v1.PodSpecTemplate: {err}"),
                ));
            }
        }

        let inferred = infer_pod_sets(template);
        for pod_set in &inferred {
            // Declared paths were checked above; report each bad path once.
            if component
                .declared_pod_sets
                .iter()
                .any(|declared| declared.path == pod_set.path)
            {
                continue;
            }
            if let Err(err) = pod_spec_at(template, &pod_set.path) {
                errors.push(FieldError::new(
                    FieldErrorKind::Invalid,
                    format!("{comp}.template"),
                    format!("error inferring PodSets for {gvk}: {err}"),
                ));
            }
        }
        check_declared_against_inferred(
            &component.declared_pod_sets,
            &inferred,
            &comp,
            &mut errors,
        );
        pod_spec_count += component.declared_pod_sets.len().max(inferred.len());
    }
    if pod_spec_count == 0 {
        errors.push(FieldError::new(
            FieldErrorKind::Invalid,
            "spec.components",
            "components contains no podspecs",
        ));
    } else if pod_spec_count > MAX_POD_SPECS {
        errors.push(FieldError::new(
            FieldErrorKind::Invalid,
            "spec.components",
            format!(
                "components contains {pod_spec_count} podspecs; at most {MAX_POD_SPECS} are allowed"
            ),
        ));
    }
    ValidationErrors(errors).into_result()
}

/// The template must be an object with non-empty string `apiVersion` and `kind`.
fn check_template(
    template: &Value,
    comp: &str,
    errors: &mut Vec<FieldError>,
) -> Option<GroupVersionKind> {
    let field = format!("{comp}.template");
    if !template.is_object() {
        errors.push(FieldError::new(
            FieldErrorKind::Invalid,
            field,
            "failed to decode as JSON: the template must be a Kubernetes object (a map)",
        ));
        return None;
    }
    let gvk = GroupVersionKind::of(template);
    if gvk.is_none() {
        errors.push(FieldError::new(
            FieldErrorKind::Invalid,
            field,
            "failed to decode as JSON: the template must have a non-empty string `apiVersion` \
             and `kind`",
        ));
    }
    gvk
}

/// Upstream `ValidatePodSets`, with every problem reported (not only the first).
fn check_declared_against_inferred(
    declared: &[AppWrapperPodSet],
    inferred: &[AppWrapperPodSet],
    comp: &str,
    errors: &mut Vec<FieldError>,
) {
    if declared.is_empty() {
        return;
    }
    let mut by_path: BTreeMap<&str, (usize, &AppWrapperPodSet)> = BTreeMap::new();
    for (idx, pod_set) in declared.iter().enumerate() {
        if let Some((first, _)) = by_path.get(pod_set.path.as_str()) {
            errors.push(FieldError::new(
                FieldErrorKind::Invalid,
                format!("{comp}.podSets[{idx}].path"),
                format!(
                    "multiple podSets with path `{}` (also podSets[{first}])",
                    pod_set.path
                ),
            ));
        } else {
            by_path.insert(pod_set.path.as_str(), (idx, pod_set));
        }
    }
    if inferred.is_empty() {
        return;
    }
    if inferred.len() != declared.len() {
        errors.push(FieldError::new(
            FieldErrorKind::Invalid,
            format!("{comp}.podSets"),
            format!(
                "{} podSets are declared but inference computed {} ({})",
                declared.len(),
                inferred.len(),
                describe(inferred)
            ),
        ));
        return;
    }
    for pod_set in inferred {
        match by_path.get(pod_set.path.as_str()) {
            None => errors.push(FieldError::new(
                FieldErrorKind::Invalid,
                format!("{comp}.podSets"),
                format!("the podSet with path `{}` is missing", pod_set.path),
            )),
            Some((idx, declared)) => {
                if declared.replicas_or_default() != pod_set.replicas_or_default() {
                    errors.push(FieldError::new(
                        FieldErrorKind::Invalid,
                        format!("{comp}.podSets[{idx}].replicas"),
                        format!(
                            "mismatched replica count for podSet `{}`: declared {}, inferred {}",
                            pod_set.path,
                            declared.replicas_or_default(),
                            pod_set.replicas_or_default()
                        ),
                    ));
                }
            }
        }
    }
}

fn describe(pod_sets: &[AppWrapperPodSet]) -> String {
    pod_sets
        .iter()
        .map(|ps| format!("{} x{}", ps.path, ps.replicas_or_default()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Update validation (reference §4.4, deep immutability): the number of components, each
/// template (as JSON), the declared podSets' count, paths and replicas (absent = 1), the user
/// name and UID labels and `spec.managedBy` cannot change. `suspend`, `podSetInfos`, annotations
/// and other labels can.
pub fn validate_update(old: &AppWrapper, new: &AppWrapper) -> Result<(), ValidationErrors> {
    const IMMUTABLE: &str = "attempt to change immutable field";
    let forbid = |field: String| FieldError::new(FieldErrorKind::Forbidden, field, IMMUTABLE);
    let mut errors = Vec::new();
    let (old_spec, new_spec) = (&old.spec, &new.spec);
    if old_spec.components.len() != new_spec.components.len() {
        // The per-component comparison would be meaningless.
        errors.push(FieldError::new(
            FieldErrorKind::Forbidden,
            "spec.components",
            format!(
                "{IMMUTABLE}: the number of components changed from {} to {}",
                old_spec.components.len(),
                new_spec.components.len()
            ),
        ));
        return ValidationErrors(errors).into_result();
    }
    for (idx, (old_c, new_c)) in old_spec
        .components
        .iter()
        .zip(&new_spec.components)
        .enumerate()
    {
        let comp = format!("spec.components[{idx}]");
        if old_c.template != new_c.template {
            errors.push(forbid(format!("{comp}.template")));
        }
        if old_c.declared_pod_sets.len() != new_c.declared_pod_sets.len() {
            errors.push(forbid(format!("{comp}.podSets")));
            continue;
        }
        for (ps_idx, (old_ps, new_ps)) in old_c
            .declared_pod_sets
            .iter()
            .zip(&new_c.declared_pod_sets)
            .enumerate()
        {
            if old_ps.replicas_or_default() != new_ps.replicas_or_default() {
                errors.push(forbid(format!("{comp}.podSets[{ps_idx}].replicas")));
            }
            if old_ps.path != new_ps.path {
                errors.push(forbid(format!("{comp}.podSets[{ps_idx}].path")));
            }
        }
    }
    for label in [USER_NAME_LABEL, USER_ID_LABEL] {
        if old.metadata.labels.as_ref().and_then(|l| l.get(label))
            != new.metadata.labels.as_ref().and_then(|l| l.get(label))
        {
            errors.push(forbid(format!("metadata.labels[{label}]")));
        }
    }
    if old_spec.managed_by != new_spec.managed_by {
        errors.push(forbid("spec.managedBy".to_string()));
    }
    ValidationErrors(errors).into_result()
}

#[cfg(test)]
mod tests {
    //! The structural and update cases of upstream's webhook suite (reference §6.2).
    use super::*;
    use crate::appwrapper::types::AppWrapperComponent;
    use kube::api::ObjectMeta;
    use serde_json::json;

    fn pod_spec(cpu: &str) -> Value {
        json!({"restartPolicy": "Never", "containers": [{"name": "busybox",
            "image": "quay.io/project-codeflare/busybox:1.36", "command": ["sh", "-c", "sleep 10"],
            "resources": {"requests": {"cpu": cpu}}}]})
    }

    fn pod_template() -> Value {
        json!({"spec": pod_spec("100m")})
    }

    fn declared(path: &str, replicas: Option<i32>) -> AppWrapperPodSet {
        AppWrapperPodSet {
            replicas,
            path: path.into(),
            annotations: BTreeMap::new(),
        }
    }

    fn component(template: Value, pod_sets: Vec<AppWrapperPodSet>) -> AppWrapperComponent {
        AppWrapperComponent {
            annotations: BTreeMap::new(),
            declared_pod_sets: pod_sets,
            pod_set_infos: Vec::new(),
            template,
        }
    }

    fn pod() -> AppWrapperComponent {
        component(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                "spec": pod_spec("100m")}),
            vec![declared("template", None)],
        )
    }

    fn pod_for_inference() -> AppWrapperComponent {
        component(pod().template, vec![])
    }

    fn namespaced_pod(ns: &str) -> AppWrapperComponent {
        let mut c = pod();
        c.template["metadata"]["namespace"] = json!(ns);
        c
    }

    fn service() -> AppWrapperComponent {
        component(
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
                "spec": {"selector": {"app": "x"}, "ports": [{"port": 80}]}}),
            vec![],
        )
    }

    fn deployment_template(replicas: i32) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "d"}},
                "template": {"metadata": {"labels": {"app": "d"}}, "spec": pod_spec("100m")}}})
    }

    fn deployment(replicas: i32) -> AppWrapperComponent {
        component(
            deployment_template(replicas),
            vec![declared("template.spec.template", Some(replicas))],
        )
    }

    fn ray_cluster(workers: i32) -> AppWrapperComponent {
        component(
            json!({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "r"},
                "spec": {"headGroupSpec": {"template": pod_template()},
                    "workerGroupSpecs": [{"replicas": workers, "template": pod_template()}]}}),
            vec![
                declared("template.spec.headGroupSpec.template", Some(1)),
                declared("template.spec.workerGroupSpecs[0].template", Some(workers)),
            ],
        )
    }

    fn job_set(replicas: i32) -> AppWrapperComponent {
        let job = |name: &str, r: i32| {
            json!({"name": name, "replicas": r, "template": {"spec": {
                "parallelism": 1, "completions": 1, "template": pod_template()}}})
        };
        component(
            json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                "metadata": {"name": "js"},
                "spec": {"replicatedJobs": [job("driver", 1), job("workers", replicas)]}}),
            vec![
                declared(
                    "template.spec.replicatedJobs[0].template.spec.template",
                    None,
                ),
                declared(
                    "template.spec.replicatedJobs[1].template.spec.template",
                    Some(replicas),
                ),
            ],
        )
    }

    fn job_for_inference(parallelism: i32, completions: i32) -> AppWrapperComponent {
        component(
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
                "spec": {"parallelism": parallelism, "completions": completions,
                    "template": pod_template()}}),
            vec![],
        )
    }

    fn spec(components: Vec<AppWrapperComponent>) -> AppWrapperSpec {
        AppWrapperSpec {
            components,
            suspend: false,
            managed_by: None,
        }
    }

    fn create(components: Vec<AppWrapperComponent>) -> Result<(), ValidationErrors> {
        validate_create(&spec(components), "default")
    }

    fn fields(result: Result<(), ValidationErrors>) -> Vec<String> {
        match result {
            Ok(()) => panic!("expected a rejection"),
            Err(errors) => errors.0.into_iter().map(|e| e.field).collect(),
        }
    }

    #[test]
    fn well_formed_appwrappers_are_accepted() {
        for components in [
            vec![pod()],
            vec![deployment(1)],
            vec![namespaced_pod("default")],
            vec![ray_cluster(1)],
            vec![job_set(1)],
            vec![pod(), service(), deployment(3)],
        ] {
            create(components).unwrap();
        }
    }

    #[test]
    fn podsets_are_inferred_for_known_kinds() {
        // (a) five podSets
        create(vec![
            pod(),
            component(deployment_template(2), vec![]),
            pod_for_inference(),
            job_for_inference(2, 4),
            job_for_inference(8, 4),
        ])
        .unwrap();
        // (b) six podSets
        let pytorch = component(
            json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "t"},
                "spec": {"pytorchReplicaSpecs": {
                    "Master": {"replicas": 1, "template": pod_template()},
                    "Worker": {"replicas": 4, "template": pod_template()}}}}),
            vec![],
        );
        let mut ray = ray_cluster(7);
        ray.declared_pod_sets.clear();
        let ray_job = component(
            json!({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rj"},
                "spec": {"rayClusterSpec": {"headGroupSpec": {"template": pod_template()}}}}),
            vec![],
        );
        create(vec![pytorch, ray, ray_job]).unwrap();
    }

    #[test]
    fn at_least_one_and_at_most_eight_podspecs() {
        assert_eq!(fields(create(vec![])), vec!["spec.components"]);
        assert_eq!(fields(create(vec![service()])), vec!["spec.components"]);
        create(vec![pod(); 8]).unwrap();
        let err = create(vec![pod(); 9]).unwrap_err();
        assert_eq!(err.0.len(), 1);
        assert_eq!(
            err.0[0].reason,
            "components contains 9 podspecs; at most 8 are allowed"
        );
    }

    #[test]
    fn paths_must_name_a_pod_spec() {
        for path in [
            "template.spec.missing",
            "template.spec.template.metadata",
            "template.spec",
        ] {
            let mut d = deployment(1);
            d.declared_pod_sets[0].path = path.into();
            let errors = create(vec![d]).unwrap_err().0;
            assert!(
                errors
                    .iter()
                    .any(|e| e.field == "spec.components[0].podSets[0].path"
                        && e.reason
                            .starts_with("path does not refer to a v1.PodSpecTemplate")),
                "{path}: {errors:?}"
            );
        }
        let mut d = deployment(1);
        d.declared_pod_sets[0].path = String::new();
        let errors = create(vec![d]).unwrap_err().0;
        assert_eq!(errors[0].field, "spec.components[0].podSets[0].path");
        assert_eq!(errors[0].kind, FieldErrorKind::Required);
    }

    #[test]
    fn array_and_map_path_elements() {
        let bad_paths = [
            "template.spec.replicatedJobs.template.spec.template",
            "template.spec.replicatedJobs",
            "template.spec.replicatedJobs[0].template[0].spec.template",
            "template.spec.replicatedJobs[10].template.spec.template",
            "template.spec.replicatedJobs[-1].template.spec.template",
            "template.spec.replicatedJobs[a10].template.spec.template",
            "template.spec.replicatedJobs[1",
            "template.spec.replicatedJobs[1]].template.spec.template",
        ];
        for path in bad_paths {
            let mut js = job_set(1);
            js.declared_pod_sets[0].path = path.into();
            let errors = create(vec![js]).unwrap_err().0;
            let path_error = errors
                .iter()
                .find(|e| e.field == "spec.components[0].podSets[0].path")
                .unwrap_or_else(|| panic!("{path}: {errors:?}"));
            assert!(path_error.reason.contains(path), "{path}: {path_error}");
        }
    }

    #[test]
    fn other_namespaces_and_nesting_are_forbidden() {
        let errors = create(vec![namespaced_pod("test")]).unwrap_err().0;
        assert_eq!(errors.len(), 1);
        assert_eq!(
            errors[0].field,
            "spec.components[0].template.metadata.namespace"
        );
        assert_eq!(errors[0].kind, FieldErrorKind::Forbidden);

        let nested = component(
            json!({"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
                "metadata": {"name": "inner"}, "spec": {"components": []}}),
            vec![],
        );
        let errors = create(vec![pod(), nested]).unwrap_err().0;
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].field, "spec.components[1].template");
        assert_eq!(errors[0].reason, "Nested AppWrappers are forbidden");
    }

    #[test]
    fn declared_podsets_must_match_inference() {
        // count
        let mut d = deployment(2);
        d.declared_pod_sets
            .push(declared("template.spec.template", Some(2)));
        let errors = create(vec![d]).unwrap_err().0;
        let got: Vec<_> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            got,
            vec![
                "spec.components[0].podSets[1].path",
                "spec.components[0].podSets"
            ]
        );
        assert!(errors[0].reason.contains("multiple podSets"));
        // replicas
        let mut d = deployment(2);
        d.declared_pod_sets[0].replicas = Some(12);
        let errors = create(vec![d]).unwrap_err().0;
        assert_eq!(errors[0].field, "spec.components[0].podSets[0].replicas");
        assert!(errors[0].reason.contains("declared 12, inferred 2"));
        // absent replicas mean 1
        let mut d = deployment(1);
        d.declared_pod_sets[0].replicas = None;
        create(vec![d]).unwrap();
        // a declared podSet at a path inference does not know
        let mut js = job_set(1);
        js.declared_pod_sets[1].path =
            "template.spec.replicatedJobs[0].template.spec.template".into();
        let got = fields(create(vec![js]));
        assert!(got.contains(&"spec.components[0].podSets[1].path".to_string()));
        assert!(got.contains(&"spec.components[0].podSets".to_string()));
    }

    #[test]
    fn unknown_kinds_need_only_valid_declared_paths() {
        let lws = component(
            json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                "metadata": {"name": "l"}, "spec": {"replicas": 2, "leaderWorkerTemplate": {
                    "leaderTemplate": pod_template(), "size": 3, "workerTemplate": pod_template()}}}),
            vec![
                declared("template.spec.leaderWorkerTemplate.leaderTemplate", Some(2)),
                declared("template.spec.leaderWorkerTemplate.workerTemplate", Some(3)),
            ],
        );
        create(vec![lws]).unwrap();
    }

    #[test]
    fn undecodable_templates_and_errors_aggregate() {
        let errors = create(vec![
            component(json!("not a map"), vec![]),
            component(json!({"kind": "Pod"}), vec![]),
            namespaced_pod("other"),
        ])
        .unwrap_err()
        .0;
        let got: Vec<_> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            got,
            vec![
                "spec.components[0].template",
                "spec.components[1].template",
                "spec.components[2].template.metadata.namespace"
            ]
        );
        let display = ValidationErrors(errors).to_string();
        assert!(display.contains("; spec.components[1].template: failed to decode as JSON"));
    }

    #[test]
    fn inferred_paths_are_checked_too() {
        let mut d = component(deployment_template(1), vec![]);
        d.template["spec"]["template"]["spec"]["containerz"] = json!([]);
        let errors = create(vec![d]).unwrap_err().0;
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].field, "spec.components[0].template");
        assert!(errors[0].reason.contains("unknown field `containerz`"));
    }

    #[test]
    fn component_kinds_for_access_reviews() {
        let kinds = component_kinds(&spec(vec![
            pod(),
            component(json!({"kind": "Broken"}), vec![]),
            deployment(1),
        ]));
        let got: Vec<_> = kinds
            .iter()
            .map(|k| {
                (
                    k.index,
                    k.gvk.group.as_str(),
                    k.gvk.version.as_str(),
                    k.gvk.kind.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![(0, "", "v1", "Pod"), (2, "apps", "v1", "Deployment")]
        );
    }

    fn appwrapper(components: Vec<AppWrapperComponent>) -> AppWrapper {
        AppWrapper {
            metadata: ObjectMeta {
                name: Some("aw".into()),
                namespace: Some("default".into()),
                labels: Some(BTreeMap::from([
                    (USER_NAME_LABEL.to_string(), "alice".to_string()),
                    (USER_ID_LABEL.to_string(), "1".to_string()),
                ])),
                ..Default::default()
            },
            spec: spec(components),
            status: None,
        }
    }

    #[test]
    fn non_sensitive_updates_are_allowed() {
        let old = appwrapper(vec![pod(), deployment(4)]);
        let mut new = old.clone();
        new.spec.suspend = true;
        new.spec.components[1].pod_set_infos = vec![Default::default()];
        new.spec.components[1]
            .annotations
            .insert("a".into(), "b".into());
        new.spec.components[1].declared_pod_sets[0]
            .annotations
            .insert("c".into(), "d".into());
        new.metadata.annotations = Some(BTreeMap::from([(
            crate::appwrapper::constants::annotations::RETRY_LIMIT.to_string(),
            "5".to_string(),
        )]));
        new.metadata
            .labels
            .get_or_insert_default()
            .insert("team".into(), "x".into());
        validate_update(&old, &new).unwrap();
    }

    #[test]
    fn sensitive_updates_are_rejected() {
        let old = appwrapper(vec![pod(), deployment(4)]);
        let update = |f: &dyn Fn(&mut AppWrapper)| {
            let mut new = old.clone();
            f(&mut new);
            fields(validate_update(&old, &new))
        };
        assert_eq!(
            update(&|aw| aw.spec.components.swap(0, 1)),
            vec![
                "spec.components[0].template",
                "spec.components[0].podSets[0].replicas",
                "spec.components[0].podSets[0].path",
                "spec.components[1].template",
                "spec.components[1].podSets[0].replicas",
                "spec.components[1].podSets[0].path",
            ]
        );
        assert_eq!(
            update(&|aw| aw.spec.components.push(pod())),
            vec!["spec.components"]
        );
        assert_eq!(
            update(&|aw| {
                let dup = aw.spec.components[1].declared_pod_sets[0].clone();
                aw.spec.components[1].declared_pod_sets.push(dup);
            }),
            vec!["spec.components[1].podSets"]
        );
        assert_eq!(
            update(&|aw| aw.spec.components[1].declared_pod_sets[0].path = "bad".into()),
            vec!["spec.components[1].podSets[0].path"]
        );
        assert_eq!(
            update(&|aw| aw.spec.components[1].declared_pod_sets[0].replicas = Some(12)),
            vec!["spec.components[1].podSets[0].replicas"]
        );
        assert_eq!(
            update(&|aw| aw.spec.components[0].template["spec"]["restartPolicy"] = json!("Always")),
            vec!["spec.components[0].template"]
        );
        assert_eq!(
            update(&|aw| {
                aw.metadata
                    .labels
                    .get_or_insert_default()
                    .insert(USER_NAME_LABEL.into(), "mallory".into());
                aw.metadata
                    .labels
                    .get_or_insert_default()
                    .remove(USER_ID_LABEL);
            }),
            vec![
                "metadata.labels[workload.codeflare.dev/user]",
                "metadata.labels[workload.codeflare.dev/userid]"
            ]
        );
        assert_eq!(
            update(&|aw| aw.spec.managed_by = Some("kueue.x-k8s.io/multikueue".into())),
            vec!["spec.managedBy"]
        );
        // None -> Some(1) on replicas is no change (absent means 1)
        let old1 = appwrapper(vec![pod()]);
        let mut new1 = old1.clone();
        new1.spec.components[0].declared_pod_sets[0].replicas = Some(1);
        validate_update(&old1, &new1).unwrap();
    }
}
