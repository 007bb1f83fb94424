//! Preparing a component's object for creation (reference §2.8): namespace, the AppWrapper
//! label, the controller owner reference, and per podSet the Kueue PodSetInfo injection (steps
//! 1–7) and the Autopilot anti-affinities (step 8). Pure: the caller creates the result.
//!
//! Every [`CreateError`] is fatal in upstream's sense (the AppWrapper goes to Failed without a
//! retry): retrying the same template cannot succeed.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Map, Value};

use super::autopilot::{AutopilotConfig, inject_anti_affinities};
use super::constants::APPWRAPPER_LABEL;
use super::path::{self, PathError, json_type};
use super::types::{AppWrapperPodSet, AppWrapperPodSetInfo};

/// What the controller knows when it creates a component.
#[derive(Clone, Debug, Default)]
pub struct CreateContext<'a> {
    /// The AppWrapper's name (the value of the AppWrapper label).
    pub appwrapper_name: &'a str,
    /// The AppWrapper's namespace; the object is created there.
    pub appwrapper_namespace: &'a str,
    /// The operator's `schedulerName`, set on pod templates that have none (`None` or empty:
    /// leave them alone).
    pub scheduler_name: Option<&'a str>,
    /// Autopilot configuration; anti-affinities are injected when it is present and enabled.
    pub autopilot: Option<&'a AutopilotConfig>,
    /// The AppWrapper as controller owner (`Resource::controller_owner_ref`), if known.
    pub owner: Option<OwnerReference>,
}

/// A component object ready to be created, plus non-fatal problems to log.
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedComponent {
    /// The object to create.
    pub object: Value,
    /// Anti-affinity injection problems (upstream only logs these).
    pub warnings: Vec<String>,
}

/// A fatal problem preparing a component.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CreateError {
    #[error("the template is {found}, not a Kubernetes object")]
    NotAnObject { found: &'static str },
    #[error("the template's namespace `{found}` differs from the AppWrapper's `{expected}`")]
    OtherNamespace { found: String, expected: String },
    #[error(transparent)]
    Path(#[from] PathError),
    #[error("`{field}` is {found}, not {expected}")]
    WrongType {
        field: String,
        found: &'static str,
        expected: &'static str,
    },
    #[error(
        "conflict updating {what} at `{field}`: key `{key}` is `{existing}` in the template but \
         `{injected}` is to be injected"
    )]
    Conflict {
        what: &'static str,
        field: String,
        key: String,
        existing: String,
        injected: String,
    },
    #[error("the template is already controlled by {kind} `{name}`")]
    AlreadyControlled { kind: String, name: String },
}

/// Builds the object to create for one component from its `template`, its effective podSets
/// (`status.componentStatus[i].podSets`) and the Kueue `podSetInfos` (paired by index; missing
/// entries inject nothing but the AppWrapper label).
pub fn prepare_component(
    template: &Value,
    pod_sets: &[AppWrapperPodSet],
    pod_set_infos: &[AppWrapperPodSetInfo],
    ctx: &CreateContext<'_>,
) -> Result<PreparedComponent, CreateError> {
    let mut object = template.clone();
    let Value::Object(root) = &mut object else {
        return Err(CreateError::NotAnObject {
            found: json_type(template),
        });
    };
    let metadata = object_child(root, "metadata", "template")?;
    match metadata.get("namespace") {
        None | Some(Value::Null) => {}
        Some(Value::String(ns)) if ns.is_empty() => {}
        Some(Value::String(ns)) if ns == ctx.appwrapper_namespace => {}
        Some(Value::String(ns)) => {
            return Err(CreateError::OtherNamespace {
                found: ns.clone(),
                expected: ctx.appwrapper_namespace.to_string(),
            });
        }
        Some(other) => {
            return Err(CreateError::WrongType {
                field: "template.metadata.namespace".into(),
                found: json_type(other),
                expected: "a string",
            });
        }
    }
    metadata.insert(
        "namespace".into(),
        Value::String(ctx.appwrapper_namespace.to_string()),
    );
    // The AppWrapper label on the object itself; an existing value wins (upstream merges with
    // the template's labels first).
    object_child(metadata, "labels", "template.metadata")?
        .entry(APPWRAPPER_LABEL.to_string())
        .or_insert_with(|| Value::String(ctx.appwrapper_name.to_string()));
    if let Some(owner) = &ctx.owner {
        set_controller_owner(metadata, owner)?;
    }

    let empty = AppWrapperPodSetInfo::default();
    let mut warnings = Vec::new();
    for (idx, pod_set) in pod_sets.iter().enumerate() {
        let info = pod_set_infos.get(idx).unwrap_or(&empty);
        let pod_template = path::get_mut(&mut object, &pod_set.path)?;
        inject_pod_set_info(
            pod_template,
            &pod_set.path,
            info,
            ctx.appwrapper_name,
            ctx.scheduler_name,
        )?;
        if let Some(autopilot) = ctx.autopilot
            && let Some(spec) = pod_template.get_mut("spec")
            && let Err(err) = inject_anti_affinities(spec, autopilot)
        {
            warnings.push(format!("podSet `{}`: {err}", pod_set.path));
        }
    }
    Ok(PreparedComponent { object, warnings })
}

/// Steps 1–7 of reference §2.8 on one pod template (the value at a podSet path):
/// metadata created if missing; PodSetInfo annotations merged; PodSetInfo labels plus the
/// AppWrapper label merged; nodeSelector merged (a key with a different existing value is a
/// fatal conflict in all three); tolerations appended; scheduling gates appended unless a gate of
/// that name exists; `schedulerName` set when empty.
pub fn inject_pod_set_info(
    pod_template: &mut Value,
    path: &str,
    info: &AppWrapperPodSetInfo,
    appwrapper_name: &str,
    scheduler_name: Option<&str>,
) -> Result<(), CreateError> {
    let found = json_type(pod_template);
    let Value::Object(pod_template) = pod_template else {
        return Err(CreateError::WrongType {
            field: path.to_string(),
            found,
            expected: "a PodTemplateSpec map",
        });
    };
    let meta_field = format!("{path}.metadata");
    let metadata = object_child(pod_template, "metadata", path)?;
    if !info.annotations.is_empty() {
        merge_strings(metadata, "annotations", &meta_field, &info.annotations)?;
    }
    let mut labels = info.labels.clone();
    labels
        .entry(APPWRAPPER_LABEL.to_string())
        .or_insert_with(|| appwrapper_name.to_string());
    merge_strings(metadata, "labels", &meta_field, &labels)?;

    let spec_field = format!("{path}.spec");
    let spec = object_child(pod_template, "spec", path)?;
    if !info.node_selector.is_empty() {
        merge_strings(spec, "nodeSelector", &spec_field, &info.node_selector)?;
    }
    if !info.tolerations.is_empty() {
        let tolerations = array_child(spec, "tolerations", &spec_field)?;
        for toleration in &info.tolerations {
            tolerations.push(serde_json::to_value(toleration).unwrap_or(Value::Null));
        }
    }
    if !info.scheduling_gates.is_empty() {
        let gates = array_child(spec, "schedulingGates", &spec_field)?;
        for gate in &info.scheduling_gates {
            let exists = gates
                .iter()
                .any(|g| g.get("name").and_then(Value::as_str) == Some(gate.name.as_str()));
            if !exists {
                gates.push(serde_json::json!({"name": gate.name}));
            }
        }
    }
    if let Some(scheduler) = scheduler_name.filter(|s| !s.is_empty()) {
        let current = spec.get("schedulerName").and_then(Value::as_str);
        if current.is_none_or(str::is_empty) {
            spec.insert("schedulerName".into(), Value::String(scheduler.to_string()));
        }
    }
    Ok(())
}

/// Makes `owner` the controller of the object (controller=true, blockOwnerDeletion=true). A
/// different controller already named in the template is an error, as `SetControllerReference`.
fn set_controller_owner(
    metadata: &mut Map<String, Value>,
    owner: &OwnerReference,
) -> Result<(), CreateError> {
    let mut owner = owner.clone();
    owner.controller = Some(true);
    owner.block_owner_deletion = Some(true);
    let owner_value = serde_json::to_value(&owner).unwrap_or(Value::Null);
    let refs = array_child(metadata, "ownerReferences", "template.metadata")?;
    for existing in refs.iter_mut() {
        let same = existing.get("uid").and_then(Value::as_str) == Some(owner.uid.as_str());
        let is_controller = existing.get("controller").and_then(Value::as_bool) == Some(true);
        if same {
            *existing = owner_value;
            return Ok(());
        }
        if is_controller {
            let field = |k: &str| {
                existing
                    .get(k)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            return Err(CreateError::AlreadyControlled {
                kind: field("kind"),
                name: field("name"),
            });
        }
    }
    refs.push(owner_value);
    Ok(())
}

/// Merges string pairs into `parent[key]`, keeping existing keys; a key whose existing value
/// differs is a conflict.
fn merge_strings(
    parent: &mut Map<String, Value>,
    key: &'static str,
    parent_field: &str,
    additions: &BTreeMap<String, String>,
) -> Result<(), CreateError> {
    let field = format!("{parent_field}.{key}");
    let target = object_child(parent, key, parent_field)?;
    for (k, v) in additions {
        match target.get(k) {
            None | Some(Value::Null) => {
                target.insert(k.clone(), Value::String(v.clone()));
            }
            Some(Value::String(existing)) if existing == v => {}
            Some(existing) => {
                return Err(CreateError::Conflict {
                    what: key,
                    field,
                    key: k.clone(),
                    existing: existing
                        .as_str()
                        .map_or_else(|| existing.to_string(), String::from),
                    injected: v.clone(),
                });
            }
        }
    }
    Ok(())
}

fn object_child<'v>(
    parent: &'v mut Map<String, Value>,
    key: &str,
    parent_field: &str,
) -> Result<&'v mut Map<String, Value>, CreateError> {
    let slot = parent.entry(key.to_string()).or_insert(Value::Null);
    if slot.is_null() {
        *slot = Value::Object(Map::new());
    }
    match slot {
        Value::Object(map) => Ok(map),
        other => Err(CreateError::WrongType {
            field: format!("{parent_field}.{key}"),
            found: json_type(other),
            expected: "a map",
        }),
    }
}

fn array_child<'v>(
    parent: &'v mut Map<String, Value>,
    key: &str,
    parent_field: &str,
) -> Result<&'v mut Vec<Value>, CreateError> {
    let slot = parent.entry(key.to_string()).or_insert(Value::Null);
    if slot.is_null() {
        *slot = Value::Array(Vec::new());
    }
    match slot {
        Value::Array(items) => Ok(items),
        other => Err(CreateError::WrongType {
            field: format!("{parent_field}.{key}"),
            found: json_type(other),
            expected: "an array",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::appwrapper::autopilot::{GPU_HEALTH_LABEL, effects};
    use k8s_openapi::api::core::v1::{PodSchedulingGate, Taint, Toleration};
    use serde_json::json;

    /// The `advanceToResuming` configuration of upstream's controller suite: the default
    /// Autopilot taints plus `extra=test` NoExecute and `extra2=test2` PreferNoSchedule on GPUs.
    fn test_autopilot() -> AutopilotConfig {
        let mut cfg = AutopilotConfig::default();
        let gpu = cfg
            .resource_taints
            .get_mut("nvidia.com/gpu")
            .expect("default GPU taints");
        gpu.push(Taint {
            key: "extra".into(),
            value: Some("test".into()),
            effect: effects::NO_EXECUTE.into(),
            time_added: None,
        });
        gpu.push(Taint {
            key: "extra2".into(),
            value: Some("test2".into()),
            effect: effects::PREFER_NO_SCHEDULE.into(),
            time_added: None,
        });
        cfg
    }

    /// The marker PodSetInfo applied to every pod in upstream's suite.
    fn marker_info() -> AppWrapperPodSetInfo {
        AppWrapperPodSetInfo {
            annotations: BTreeMap::from([("test2".into(), "test2".into())]),
            labels: BTreeMap::from([("testkey1".into(), "value1".into())]),
            node_selector: BTreeMap::from([("nodeName".into(), "myNode".into())]),
            tolerations: vec![Toleration {
                key: Some("aKey".into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            }],
            scheduling_gates: vec![PodSchedulingGate {
                name: "aGate".into(),
            }],
        }
    }

    /// upstream fixture `pod(milliCPU, gpus, declarePodSets)`
    fn pod(gpus: i64) -> Value {
        let mut resources = json!({"requests": {"cpu": "100m"}, "limits": {"cpu": "100m"}});
        if gpus > 0 {
            resources["requests"]["nvidia.com/gpu"] = json!(gpus);
            resources["limits"]["nvidia.com/gpu"] = json!(gpus);
        }
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "busybox", "image": "quay.io/project-codeflare/busybox:1.36",
                "command": ["sh", "-c", "sleep 10"], "resources": resources}]}})
    }

    /// upstream fixture `complexPodYaml()`
    fn complex_pod() -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cp",
            "labels": {"myComplexLabel": "myComplexValue"},
            "annotations": {"myComplexAnnotation": "myComplexValue"}},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"myComplexSelector": "myComplexValue"},
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "NotIn",
                         "values": ["badHost1"]}]}]}}},
                "schedulingGates": [{"name": "myComplexGate"}],
                "tolerations": [{"key": "myComplexKey", "value": "myComplexValue",
                    "operator": "Equal", "effect": "NoSchedule"}],
                "containers": [{"name": "busybox", "image": "busybox",
                    "resources": {"requests": {"nvidia.com/gpu": 1},
                                  "limits": {"nvidia.com/gpu": 1}}}]}})
    }

    fn pod_sets() -> Vec<AppWrapperPodSet> {
        vec![AppWrapperPodSet {
            replicas: Some(1),
            path: "template".into(),
            annotations: BTreeMap::new(),
        }]
    }

    fn prepare(template: Value, autopilot: &AutopilotConfig) -> Value {
        let ctx = CreateContext {
            appwrapper_name: "aw",
            appwrapper_namespace: "default",
            scheduler_name: None,
            autopilot: Some(autopilot),
            owner: None,
        };
        let prepared = prepare_component(&template, &pod_sets(), &[marker_info()], &ctx).unwrap();
        assert!(prepared.warnings.is_empty(), "{:?}", prepared.warnings);
        prepared.object
    }

    fn assert_markers(pod: &Value) {
        assert_eq!(pod["metadata"]["labels"][APPWRAPPER_LABEL], "aw");
        assert_eq!(pod["metadata"]["labels"]["testkey1"], "value1");
        assert_eq!(pod["metadata"]["annotations"]["test2"], "test2");
        assert_eq!(pod["spec"]["nodeSelector"]["nodeName"], "myNode");
        let tolerations = pod["spec"]["tolerations"].as_array().unwrap();
        assert!(
            tolerations
                .contains(&json!({"key": "aKey", "operator": "Exists", "effect": "NoSchedule"}))
        );
        let gates = pod["spec"]["schedulingGates"].as_array().unwrap();
        assert!(gates.contains(&json!({"name": "aGate"})));
    }

    fn injected_required() -> Vec<Value> {
        vec![
            json!({"key": GPU_HEALTH_LABEL, "operator": "NotIn", "values": ["TESTING", "EVICT"]}),
            json!({"key": "extra", "operator": "NotIn", "values": ["test"]}),
        ]
    }

    fn injected_preferred() -> Value {
        json!([{"weight": 50, "preference": {"matchExpressions": [
            {"key": GPU_HEALTH_LABEL, "operator": "NotIn", "values": ["WARN"]},
            {"key": "extra2", "operator": "NotIn", "values": ["test2"]}]}}])
    }

    /// Upstream controller case 5: "Validating PodSet Injection invariants on minimal pods".
    #[test]
    fn injection_invariants_on_minimal_pods() {
        let cfg = test_autopilot();
        let gpu_pod = prepare(pod(1), &cfg);
        assert_markers(&gpu_pod);
        let node_affinity = &gpu_pod["spec"]["affinity"]["nodeAffinity"];
        let terms =
            node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                .as_array()
                .unwrap();
        assert_eq!(terms.len(), 1, "exactly one required term");
        assert_eq!(
            terms[0]["matchExpressions"].as_array().unwrap(),
            &injected_required()
        );
        assert_eq!(
            node_affinity["preferredDuringSchedulingIgnoredDuringExecution"],
            injected_preferred()
        );

        let cpu_pod = prepare(pod(0), &cfg);
        assert_markers(&cpu_pod);
        assert!(
            cpu_pod["spec"].get("affinity").is_none(),
            "affinity stays nil"
        );
    }

    /// Upstream controller case 6: "Validating PodSet Injection invariants on complex pods".
    #[test]
    fn injection_invariants_on_complex_pods() {
        let pod = prepare(complex_pod(), &test_autopilot());
        assert_markers(&pod);
        assert_eq!(
            pod["metadata"]["labels"]["myComplexLabel"],
            "myComplexValue"
        );
        assert_eq!(
            pod["metadata"]["annotations"]["myComplexAnnotation"],
            "myComplexValue"
        );
        assert_eq!(
            pod["spec"]["nodeSelector"]["myComplexSelector"],
            "myComplexValue"
        );
        assert!(
            pod["spec"]["tolerations"]
                .as_array()
                .unwrap()
                .contains(&json!({"key": "myComplexKey", "value": "myComplexValue",
                    "operator": "Equal", "effect": "NoSchedule"}))
        );
        assert_eq!(
            pod["spec"]["schedulingGates"],
            json!([{"name": "myComplexGate"}, {"name": "aGate"}])
        );
        let node_affinity = &pod["spec"]["affinity"]["nodeAffinity"];
        let terms =
            node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                .as_array()
                .unwrap();
        assert_eq!(terms.len(), 1, "still a single term");
        let mut expected = vec![json!({"key": "kubernetes.io/hostname", "operator": "NotIn",
            "values": ["badHost1"]})];
        expected.extend(injected_required());
        assert_eq!(terms[0]["matchExpressions"].as_array().unwrap(), &expected);
        assert_eq!(
            node_affinity["preferredDuringSchedulingIgnoredDuringExecution"],
            injected_preferred()
        );
    }

    #[test]
    fn every_required_term_gets_the_expressions() {
        let mut template = pod(1);
        template["spec"]["affinity"] = json!({"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}
        ]}}});
        let pod = prepare(template, &AutopilotConfig::default());
        let terms = pod["spec"]["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            .as_array()
            .unwrap();
        assert_eq!(terms.len(), 2);
        for term in terms {
            assert!(
                term["matchExpressions"]
                    .as_array()
                    .unwrap()
                    .contains(&json!({"key": GPU_HEALTH_LABEL, "operator": "NotIn",
                    "values": ["TESTING", "EVICT"]}))
            );
        }
        assert_eq!(terms[1]["matchFields"][0]["key"], "metadata.name");
    }

    #[test]
    fn namespace_labels_scheduler_and_owner() {
        let owner = OwnerReference {
            api_version: "workload.codeflare.dev/v1beta2".into(),
            kind: "AppWrapper".into(),
            name: "aw".into(),
            uid: "uid-1".into(),
            ..Default::default()
        };
        let ctx = CreateContext {
            appwrapper_name: "aw",
            appwrapper_namespace: "team",
            scheduler_name: Some("my-scheduler"),
            autopilot: None,
            owner: Some(owner),
        };
        let job = json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "j", "labels": {APPWRAPPER_LABEL: "keep-me"}},
            "spec": {"template": {"spec": {"schedulerName": "", "containers": []}}}});
        let job_pod_sets = vec![AppWrapperPodSet {
            replicas: Some(1),
            path: "template.spec.template".into(),
            annotations: BTreeMap::new(),
        }];
        let out = prepare_component(&job, &job_pod_sets, &[], &ctx)
            .unwrap()
            .object;
        assert_eq!(out["metadata"]["namespace"], "team");
        assert_eq!(out["metadata"]["labels"][APPWRAPPER_LABEL], "keep-me");
        let owner_refs = out["metadata"]["ownerReferences"].as_array().unwrap();
        assert_eq!(owner_refs.len(), 1);
        assert_eq!(owner_refs[0]["controller"], true);
        assert_eq!(owner_refs[0]["blockOwnerDeletion"], true);
        let pod_template = &out["spec"]["template"];
        assert_eq!(pod_template["metadata"]["labels"][APPWRAPPER_LABEL], "aw");
        assert_eq!(pod_template["spec"]["schedulerName"], "my-scheduler");

        // an explicit scheduler is kept
        let mut own = job.clone();
        own["spec"]["template"]["spec"]["schedulerName"] = json!("theirs");
        let out = prepare_component(&own, &job_pod_sets, &[], &ctx)
            .unwrap()
            .object;
        assert_eq!(out["spec"]["template"]["spec"]["schedulerName"], "theirs");

        // another namespace is fatal
        let mut other = job.clone();
        other["metadata"]["namespace"] = json!("elsewhere");
        assert!(matches!(
            prepare_component(&other, &job_pod_sets, &[], &ctx),
            Err(CreateError::OtherNamespace { .. })
        ));

        // another controller is fatal
        let mut owned = job;
        owned["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
            "kind": "ReplicaSet", "name": "rs", "uid": "other", "controller": true}]);
        assert_eq!(
            prepare_component(&owned, &job_pod_sets, &[], &ctx).unwrap_err(),
            CreateError::AlreadyControlled {
                kind: "ReplicaSet".into(),
                name: "rs".into()
            }
        );
    }

    #[test]
    fn conflicts_are_fatal_and_named() {
        let ctx = CreateContext {
            appwrapper_name: "aw",
            appwrapper_namespace: "default",
            ..Default::default()
        };
        let mut template = pod(0);
        template["metadata"]["labels"] = json!({"testkey1": "other"});
        let err = prepare_component(&template, &pod_sets(), &[marker_info()], &ctx).unwrap_err();
        assert_eq!(
            err.to_string(),
            "conflict updating labels at `template.metadata.labels`: key `testkey1` is `other` in \
             the template but `value1` is to be injected"
        );
        let mut template = pod(0);
        template["spec"]["nodeSelector"] = json!({"nodeName": "elsewhere"});
        assert!(matches!(
            prepare_component(&template, &pod_sets(), &[marker_info()], &ctx),
            Err(CreateError::Conflict {
                what: "nodeSelector",
                ..
            })
        ));
        let mut template = pod(0);
        template["metadata"]["annotations"] = json!({"test2": "x"});
        assert!(matches!(
            prepare_component(&template, &pod_sets(), &[marker_info()], &ctx),
            Err(CreateError::Conflict {
                what: "annotations",
                ..
            })
        ));
        // the same value is no conflict, and a present gate is not duplicated
        let mut template = pod(0);
        template["metadata"]["labels"] = json!({"testkey1": "value1"});
        template["spec"]["schedulingGates"] = json!([{"name": "aGate"}]);
        let out = prepare_component(&template, &pod_sets(), &[marker_info()], &ctx)
            .unwrap()
            .object;
        assert_eq!(out["spec"]["schedulingGates"], json!([{"name": "aGate"}]));
        // a bad path is fatal
        let bad = vec![AppWrapperPodSet {
            replicas: None,
            path: "template.spec.nothing".into(),
            annotations: BTreeMap::new(),
        }];
        assert!(matches!(
            prepare_component(&pod(0), &bad, &[], &ctx),
            Err(CreateError::Path(_))
        ));
    }

    #[test]
    fn autopilot_problems_are_warnings() {
        let mut template = pod(1);
        template["spec"]["affinity"] = json!("nonsense");
        let ctx = CreateContext {
            appwrapper_name: "aw",
            appwrapper_namespace: "default",
            autopilot: Some(&AutopilotConfig::default()),
            ..Default::default()
        };
        let prepared = prepare_component(&template, &pod_sets(), &[], &ctx).unwrap();
        assert_eq!(prepared.warnings.len(), 1);
        assert!(prepared.warnings[0].contains("spec.affinity"));
    }
}
