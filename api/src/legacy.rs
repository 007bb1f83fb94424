//! Conversion of legacy AppWrappers (`mcad.ibm.com/v1beta1` and MCAD v2's
//! `workload.codeflare.dev/v1beta1`, both with `spec.resources.GenericItems`) to
//! `workload.codeflare.dev/v1beta2` (seed 004, reference §8).
//!
//! What maps, and how:
//! - `GenericItems[i].generictemplate` → `spec.components[i].template`, with MCAD's placeholder
//!   labels (`appwrapper.mcad.ibm.com`, `appwrapper.mcad.ibm.com/namespace`) removed from every
//!   `labels` map: MCAD rewrote them to count pods; v1beta2 injects its own label.
//! - `custompodresources` → podSets. For the eight kinds whose podSets v1beta2 infers, nothing is
//!   declared (inference is exact) and the custompodresources are only compared with the
//!   template: a different pod count or per-pod request is a warning, because MCAD dispatched by
//!   custompodresources while v1beta2 and Kueue use the template. For any other kind the pod
//!   templates are found the way MCAD itself found them (a map whose `spec.containers` is a
//!   list; the search does not descend into a template) and declared as podSets; replicas come
//!   from the custompodresources entry at the same position, or their sum when there is one
//!   template, else 1 with a warning.
//! - `schedulingSpec.requeuing` → fault-tolerance annotations on the AppWrapper:
//!   - `timeInSeconds` (how long after dispatch MCAD waited before requiring `minAvailable`
//!     running pods) → both `admissionGracePeriodDuration` and `warmupGracePeriodDuration`:
//!     MCAD checked existence and readiness at the same moment, and setting only the warmup
//!     would let v1beta2's 1-minute admission grace reset earlier than MCAD did;
//!   - `pauseTimeInSeconds` → `retryPausePeriodDuration`;
//!   - `forceDeletionTimeInSeconds` > 0 → `forcefulDeletionGracePeriodDuration`; ≤ 0 (MCAD:
//!     never force) has no v1beta2 equivalent, so it maps to the 24h GracePeriodMaximum, the
//!     longest the controller honours, with a warning;
//!   - `maxNumRequeuings` > 0 → `retryLimit`; ≤ 0 means unlimited in MCAD and maps to
//!     [`UNLIMITED_RETRY_LIMIT`] with a warning.
//!
//!   Fields absent from the input are not filled with MCAD's CRD defaults (270 s, 90 s, 570 s,
//!   unlimited): the v1beta2 operator defaults apply instead. An annotation the user already set
//!   wins over the mapped value (with a warning).
//! - Metadata keeps name, generateName, namespace, labels and annotations; status is dropped.
//!
//! Everything else is dropped with a warning naming the field and the reason.

use std::collections::BTreeMap;

use kube::api::ObjectMeta;
use serde_json::{Map, Value};

use crate::appwrapper::constants::{self, annotations};
use crate::appwrapper::podsets::{GroupVersionKind, effective_pod_sets, infer_pod_sets};
use crate::appwrapper::validation::validate_create;
use crate::appwrapper::{AppWrapper, AppWrapperComponent, AppWrapperPodSet, AppWrapperSpec};
use crate::quantity::Quantity;

/// The legacy `apiVersion`s this module converts.
pub const LEGACY_API_VERSIONS: [&str; 2] =
    ["mcad.ibm.com/v1beta1", "workload.codeflare.dev/v1beta1"];

/// MCAD's placeholder label, rewritten by MCAD to the AppWrapper name on every pod template.
pub const PLACEHOLDER_LABEL: &str = "appwrapper.mcad.ibm.com";
/// MCAD's namespace label, added next to the placeholder.
pub const PLACEHOLDER_NAMESPACE_LABEL: &str = "appwrapper.mcad.ibm.com/namespace";

/// `retryLimit` written for MCAD's "unlimited" (`maxNumRequeuings` ≤ 0): the largest value the
/// controller's 32-bit retry counter can be compared with, so the limit is never reached.
pub const UNLIMITED_RETRY_LIMIT: i32 = i32::MAX;

/// The v1beta2 controller clips every duration annotation to this (GracePeriodMaximum).
pub const GRACE_PERIOD_MAXIMUM_SECONDS: i64 = 24 * 60 * 60;

/// A setting that was dropped or changed meaning, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// Legacy field path, e.g. `spec.schedulingSpec.requeuing.maxNumRequeuings`.
    pub field: String,
    /// What happened to it and why.
    pub reason: String,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

/// One reason a document cannot be converted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldProblem {
    /// Legacy field path.
    pub field: String,
    /// Why.
    pub reason: String,
}

/// A document that cannot be converted into an AppWrapper the API would accept.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ConvertError(pub Vec<FieldProblem>);

impl ConvertError {
    fn one(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConvertError(vec![FieldProblem {
            field: field.into(),
            reason: reason.into(),
        }])
    }
}

/// The converted AppWrapper and what could not be carried over.
#[derive(Clone, Debug, PartialEq)]
pub struct Conversion {
    /// The v1beta2 AppWrapper (no status).
    pub appwrapper: AppWrapper,
    /// Dropped or re-interpreted settings.
    pub warnings: Vec<Warning>,
}

/// Parses a (multi-document) YAML stream. Empty documents are skipped.
pub fn parse_documents(text: &str) -> Result<Vec<Value>, serde_saphyr::Error> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// Converts one legacy AppWrapper document. A v1beta2 document is passed through (validated,
/// with a warning).
pub fn convert(doc: &Value) -> Result<Conversion, ConvertError> {
    let Value::Object(root) = doc else {
        return Err(ConvertError::one(
            "(document)",
            "not a YAML map: expected an AppWrapper",
        ));
    };
    let api_version = root.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = root.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != constants::KIND {
        return Err(ConvertError::one(
            "kind",
            format!("`{kind}` is not AppWrapper"),
        ));
    }
    let mut warnings = Vec::new();
    if api_version == constants::API_VERSION {
        let appwrapper: AppWrapper = serde_json::from_value(doc.clone()).map_err(|e| {
            ConvertError::one("(document)", format!("invalid v1beta2 AppWrapper: {e}"))
        })?;
        warnings.push(Warning {
            field: "apiVersion".into(),
            reason: "already workload.codeflare.dev/v1beta2; copied unchanged".into(),
        });
        return finish(appwrapper, warnings, &[]);
    }
    if !LEGACY_API_VERSIONS.contains(&api_version) {
        return Err(ConvertError::one(
            "apiVersion",
            format!(
                "`{api_version}` is not a legacy AppWrapper version (expected one of {})",
                LEGACY_API_VERSIONS.join(", ")
            ),
        ));
    }

    let metadata = convert_metadata(root.get("metadata"), &mut warnings)?;
    if root
        .get("status")
        .is_some_and(|s| !s.is_null() && s != &Value::Object(Map::new()))
    {
        warnings.push(Warning {
            field: "status".into(),
            reason: "dropped: the v1beta2 controller computes its own status".into(),
        });
    }
    let Some(Value::Object(spec)) = root.get("spec") else {
        return Err(ConvertError::one("spec", "missing or not a map"));
    };

    let mut components = Vec::new();
    let mut problems = Vec::new();
    let mut fault_tolerance: Vec<(&'static str, String, String)> = Vec::new();
    for (key, value) in spec {
        match key.as_str() {
            "resources" => {
                components = convert_resources(value, &mut warnings, &mut problems);
            }
            "schedulingSpec" => {
                convert_scheduling_spec(value, &mut warnings, &mut fault_tolerance);
            }
            "priority" | "priorityslope" | "priorityClassName" => warnings.push(Warning {
                field: format!("spec.{key}"),
                reason: "dropped: v1beta2 AppWrappers have no priority; use a Kueue \
                         WorkloadPriorityClass (label kueue.x-k8s.io/priority-class) instead"
                    .into(),
            }),
            "service" | "selector" => warnings.push(Warning {
                field: format!("spec.{key}"),
                reason: "dropped: not implemented by MCAD and absent from v1beta2".into(),
            }),
            other => warnings.push(Warning {
                field: format!("spec.{other}"),
                reason: "dropped: unknown legacy field with no v1beta2 equivalent".into(),
            }),
        }
    }
    if !spec.contains_key("resources") {
        problems.push(FieldProblem {
            field: "spec.resources.GenericItems".into(),
            reason: "missing: a v1beta2 AppWrapper must wrap 1 to 8 pod specs".into(),
        });
    }
    if !problems.is_empty() {
        return Err(ConvertError(problems));
    }

    // Fault-tolerance annotations; an explicit v1beta2 annotation already present wins.
    let mut metadata = metadata;
    let annotations_map = metadata.annotations.get_or_insert_with(BTreeMap::new);
    for (key, value, from) in fault_tolerance {
        match annotations_map.get(key) {
            Some(existing) if existing != &value => warnings.push(Warning {
                field: from,
                reason: format!(
                    "not applied: metadata.annotations already sets {key}={existing} (kept)"
                ),
            }),
            Some(_) => {}
            None => {
                annotations_map.insert(key.to_string(), value);
            }
        }
    }
    if annotations_map.is_empty() {
        metadata.annotations = None;
    }

    check_min_available(spec, &components, &mut warnings);
    let namespace_hint: Vec<String> = components
        .iter()
        .filter_map(|c| c.template.pointer("/metadata/namespace"))
        .filter_map(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let appwrapper = AppWrapper {
        metadata,
        spec: AppWrapperSpec {
            components,
            suspend: false,
            managed_by: None,
        },
        status: None,
    };
    finish(appwrapper, warnings, &namespace_hint)
}

/// Validates the result as the webhook would, so the output is something the API accepts.
fn finish(
    appwrapper: AppWrapper,
    mut warnings: Vec<Warning>,
    template_namespaces: &[String],
) -> Result<Conversion, ConvertError> {
    let namespace = match (&appwrapper.metadata.namespace, template_namespaces.first()) {
        (Some(ns), _) => ns.clone(),
        (None, Some(template_ns)) => {
            warnings.push(Warning {
                field: "metadata.namespace".into(),
                reason: format!(
                    "not set, but the wrapped objects name namespace `{template_ns}`: apply the \
                     AppWrapper there (v1beta2 creates objects only in its own namespace)"
                ),
            });
            template_ns.clone()
        }
        (None, None) => "default".to_string(),
    };
    validate_create(&appwrapper.spec, &namespace).map_err(|errors| {
        ConvertError(
            errors
                .0
                .into_iter()
                .map(|e| FieldProblem {
                    field: legacy_field(&e.field),
                    reason: format!("the converted AppWrapper would be rejected: {}", e.reason),
                })
                .collect(),
        )
    })?;
    Ok(Conversion {
        appwrapper,
        warnings,
    })
}

/// Maps a v1beta2 field path back to the legacy input where possible.
fn legacy_field(field: &str) -> String {
    let Some(rest) = field.strip_prefix("spec.components") else {
        return field.to_string();
    };
    if rest.is_empty() {
        return "spec.resources.GenericItems".into();
    }
    let Some((index, tail)) = rest.strip_prefix('[').and_then(|r| r.split_once(']')) else {
        return field.to_string();
    };
    let item = format!("spec.resources.GenericItems[{index}]");
    if let Some(t) = tail.strip_prefix(".template") {
        format!("{item}.generictemplate{t}")
    } else {
        format!("{item} (converted {})", tail.trim_start_matches('.'))
    }
}

fn convert_metadata(
    metadata: Option<&Value>,
    warnings: &mut Vec<Warning>,
) -> Result<ObjectMeta, ConvertError> {
    let mut out = ObjectMeta::default();
    let Some(metadata) = metadata.filter(|m| !m.is_null()) else {
        return Err(ConvertError::one(
            "metadata",
            "missing: an AppWrapper needs a name",
        ));
    };
    let Value::Object(metadata) = metadata else {
        return Err(ConvertError::one("metadata", "not a map"));
    };
    let string = |key: &str| -> Result<Option<String>, ConvertError> {
        match metadata.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ConvertError::one(format!("metadata.{key}"), "not a string")),
        }
    };
    let string_map = |key: &str| -> Result<Option<BTreeMap<String, String>>, ConvertError> {
        match metadata.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(map)) => map
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k.clone(), s.clone())),
                    _ => Err(ConvertError::one(
                        format!("metadata.{key}[{k}]"),
                        "not a string",
                    )),
                })
                .collect::<Result<BTreeMap<_, _>, _>>()
                .map(Some),
            Some(_) => Err(ConvertError::one(format!("metadata.{key}"), "not a map")),
        }
    };
    out.name = string("name")?;
    out.generate_name = string("generateName")?;
    out.namespace = string("namespace")?;
    out.labels = string_map("labels")?.filter(|m| !m.is_empty());
    out.annotations = string_map("annotations")?;
    if out.name.is_none() && out.generate_name.is_none() {
        return Err(ConvertError::one(
            "metadata.name",
            "missing: an AppWrapper needs a name or generateName",
        ));
    }
    // kubectl's record of the legacy object would confuse the next `kubectl apply`.
    if let Some(annotations) = &mut out.annotations {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    for (key, reason) in [
        (
            "finalizers",
            "dropped: MCAD's finalizers would block deletion under the v1beta2 controller",
        ),
        (
            "ownerReferences",
            "dropped: owner references name objects of the legacy deployment",
        ),
    ] {
        if metadata
            .get(key)
            .is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty()))
        {
            warnings.push(Warning {
                field: format!("metadata.{key}"),
                reason: reason.into(),
            });
        }
    }
    Ok(out)
}

fn convert_resources(
    resources: &Value,
    warnings: &mut Vec<Warning>,
    problems: &mut Vec<FieldProblem>,
) -> Vec<AppWrapperComponent> {
    let Value::Object(resources) = resources else {
        problems.push(FieldProblem {
            field: "spec.resources".into(),
            reason: "not a map".into(),
        });
        return Vec::new();
    };
    for (key, value) in resources {
        match key.as_str() {
            "GenericItems" => {}
            "Items" if value.as_array().is_none_or(Vec::is_empty) => {}
            "Items" => problems.push(FieldProblem {
                field: "spec.resources.Items".into(),
                reason: "MCAD v1's deprecated Items list cannot be converted: move each template \
                         to GenericItems[].generictemplate"
                    .into(),
            }),
            other => warnings.push(Warning {
                field: format!("spec.resources.{other}"),
                reason: "dropped: unknown legacy field with no v1beta2 equivalent".into(),
            }),
        }
    }
    let items = match resources.get("GenericItems") {
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(Value::Array(_)) | None | Some(Value::Null) => {
            problems.push(FieldProblem {
                field: "spec.resources.GenericItems".into(),
                reason: "empty: a v1beta2 AppWrapper must wrap 1 to 8 pod specs".into(),
            });
            return Vec::new();
        }
        Some(_) => {
            problems.push(FieldProblem {
                field: "spec.resources.GenericItems".into(),
                reason: "not a list".into(),
            });
            return Vec::new();
        }
    };
    let mut components = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let field = format!("spec.resources.GenericItems[{i}]");
        match convert_item(item, &field, warnings) {
            Ok(component) => components.push(component),
            Err(problem) => problems.push(problem),
        }
    }
    components
}

/// One `custompodresources` entry.
struct CustomPodResources {
    replicas: i64,
    requests: BTreeMap<String, Value>,
}

fn convert_item(
    item: &Value,
    field: &str,
    warnings: &mut Vec<Warning>,
) -> Result<AppWrapperComponent, FieldProblem> {
    let problem = |f: String, reason: String| FieldProblem { field: f, reason };
    let Value::Object(item) = item else {
        return Err(problem(field.to_string(), "not a map".into()));
    };
    let template_field = format!("{field}.generictemplate");
    let mut template = match item.get("generictemplate") {
        Some(Value::Object(t)) if !t.is_empty() => Value::Object(t.clone()),
        Some(Value::Object(_)) | None | Some(Value::Null) => {
            return Err(problem(template_field, "missing or empty".into()));
        }
        Some(Value::String(s)) if s.is_empty() => {
            return Err(problem(template_field, "empty".into()));
        }
        Some(_) => {
            return Err(problem(
                template_field,
                "not a Kubernetes object (map)".into(),
            ));
        }
    };
    let Some(gvk) = GroupVersionKind::of(&template) else {
        return Err(problem(
            template_field,
            "the wrapped object needs a non-empty `apiVersion` and `kind`".into(),
        ));
    };
    strip_placeholder_labels(&mut template, &template_field, warnings);

    let mut custom = Vec::new();
    for (key, value) in item {
        let here = format!("{field}.{key}");
        match key.as_str() {
            "generictemplate" => {}
            "custompodresources" => custom = parse_custom_pod_resources(value, &here)?,
            "completionstatus" => warnings.push(Warning {
                field: here,
                reason: format!(
                    "dropped: v1beta2 decides completion from the pods (all Succeeded) and, for \
                     batch/v1 Job and PyTorchJob, the Failed condition; MCAD's keyword match \
                     `{}` has no equivalent",
                    value.as_str().unwrap_or_default()
                ),
            }),
            "replicas" | "minavailable" | "allocated" | "priority" | "priorityslope" => warnings
                .push(Warning {
                    field: here,
                    reason: "dropped: accepted but never implemented by MCAD".into(),
                }),
            _ => warnings.push(Warning {
                field: here,
                reason: "dropped: unknown legacy field with no v1beta2 equivalent".into(),
            }),
        }
    }

    let inferred = infer_pod_sets(&template);
    let declared = if inferred.is_empty() {
        declare_pod_sets(&template, &gvk, &custom, field, warnings)
    } else {
        Vec::new()
    };
    let component = AppWrapperComponent {
        annotations: BTreeMap::new(),
        declared_pod_sets: declared,
        pod_set_infos: Vec::new(),
        template,
    };
    compare_custom_pod_resources(&component, &custom, field, warnings);
    Ok(component)
}

fn parse_custom_pod_resources(
    value: &Value,
    field: &str,
) -> Result<Vec<CustomPodResources>, FieldProblem> {
    let problem = |f: String, reason: &str| FieldProblem {
        field: f,
        reason: reason.to_string(),
    };
    let items = match value {
        Value::Null => return Ok(Vec::new()),
        Value::Array(items) => items,
        _ => return Err(problem(field.to_string(), "not a list")),
    };
    items
        .iter()
        .enumerate()
        .map(|(j, entry)| {
            let here = format!("{field}[{j}]");
            let Value::Object(entry) = entry else {
                return Err(problem(here, "not a map"));
            };
            let replicas = match entry.get("replicas") {
                Some(v) => v
                    .as_i64()
                    .ok_or_else(|| problem(format!("{here}.replicas"), "not an integer"))?,
                None => return Err(problem(format!("{here}.replicas"), "missing (required)")),
            };
            let requests = match entry.get("requests") {
                Some(Value::Object(r)) => r.clone().into_iter().collect(),
                None | Some(Value::Null) => BTreeMap::new(),
                Some(_) => return Err(problem(format!("{here}.requests"), "not a map")),
            };
            Ok(CustomPodResources { replicas, requests })
        })
        .collect()
}

/// Pod templates of a kind v1beta2 cannot infer, found as MCAD found them: maps whose
/// `spec.containers` is a list. Paths use the podSet grammar; keys that cannot be written in it
/// (containing `.` or `[`) are skipped.
fn find_pod_templates(value: &Value, path: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if map
                .get("spec")
                .and_then(|s| s.get("containers"))
                .is_some_and(Value::is_array)
            {
                out.push(path.to_string());
                return;
            }
            for (key, child) in map {
                // The wrapped object's own metadata and status hold no pod templates.
                if path == "template" && (key == "metadata" || key == "status") {
                    continue;
                }
                if key.is_empty() || key.contains(['.', '[', ']']) {
                    continue;
                }
                find_pod_templates(child, &format!("{path}.{key}"), out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                find_pod_templates(child, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn declare_pod_sets(
    template: &Value,
    gvk: &GroupVersionKind,
    custom: &[CustomPodResources],
    field: &str,
    warnings: &mut Vec<Warning>,
) -> Vec<AppWrapperPodSet> {
    let mut paths = Vec::new();
    find_pod_templates(template, "template", &mut paths);
    if paths.is_empty() {
        if !custom.is_empty() {
            warnings.push(Warning {
                field: format!("{field}.custompodresources"),
                reason: format!(
                    "dropped: no pod template found in the {gvk}, so no podSet can be declared \
                     and v1beta2 will not count its pods"
                ),
            });
        }
        return Vec::new();
    }
    let to_i32 = |n: i64| i32::try_from(n.max(0)).unwrap_or(i32::MAX);
    let replicas: Vec<i32> = if custom.len() == paths.len() {
        custom.iter().map(|c| to_i32(c.replicas)).collect()
    } else if paths.len() == 1 && !custom.is_empty() {
        vec![to_i32(custom.iter().map(|c| c.replicas).sum())]
    } else {
        warnings.push(Warning {
            field: format!("{field}.custompodresources"),
            reason: format!(
                "{} entries for {} pod templates in the {gvk} ({}): declared each podSet with 1 \
                 replica; check spec.components[].podSets[].replicas",
                custom.len(),
                paths.len(),
                paths.join(", ")
            ),
        });
        vec![1; paths.len()]
    };
    paths
        .into_iter()
        .zip(replicas)
        .map(|(path, replicas)| AppWrapperPodSet {
            replicas: Some(replicas),
            path,
            annotations: BTreeMap::new(),
        })
        .collect()
}

/// Warns when `custompodresources` (what MCAD dispatched by) disagree with the template (what
/// v1beta2 and Kueue use): the pod count, and the per-pod requests when entries pair up with
/// podSets one to one.
fn compare_custom_pod_resources(
    component: &AppWrapperComponent,
    custom: &[CustomPodResources],
    field: &str,
    warnings: &mut Vec<Warning>,
) {
    if custom.is_empty() {
        return;
    }
    let field = format!("{field}.custompodresources");
    let pod_sets = effective_pod_sets(component);
    let template_pods: i64 = pod_sets
        .iter()
        .map(|p| i64::from(p.replicas_or_default().max(0)))
        .sum();
    let custom_pods: i64 = custom.iter().map(|c| c.replicas).sum();
    if !pod_sets.is_empty() && template_pods != custom_pods {
        warnings.push(Warning {
            field: field.clone(),
            reason: format!(
                "declare {custom_pods} pods in total but the template yields {template_pods}; v1beta2 \
                 expects and counts {template_pods}"
            ),
        });
    }
    if custom.len() != pod_sets.len() {
        if !pod_sets.is_empty() {
            warnings.push(Warning {
                field: field.clone(),
                reason: format!(
                    "{} entries for {} podSets: requests not compared with the template",
                    custom.len(),
                    pod_sets.len()
                ),
            });
        }
        return;
    }
    for (j, (entry, pod_set)) in custom.iter().zip(&pod_sets).enumerate() {
        let Ok(spec) = crate::appwrapper::path::get(&component.template, &pod_set.path)
            .map(|t| t.get("spec").cloned().unwrap_or(Value::Null))
        else {
            continue;
        };
        for (resource, quantity) in &entry.requests {
            let wanted = Quantity::from_json(quantity);
            let have = container_requests(&spec, resource);
            let same = match (&wanted, &have) {
                (Ok(w), Some(h)) => w == h,
                (Ok(w), None) => w.is_zero(),
                (Err(_), _) => false,
            };
            if !same {
                let have_text = have.map_or_else(
                    || "nothing".to_string(),
                    |_| describe_requests(&spec, resource),
                );
                warnings.push(Warning {
                    field: format!("{field}[{j}].requests[{resource}]"),
                    reason: format!(
                        "{quantity} per pod does not match the template, whose containers \
                         request {have_text}; MCAD dispatched by custompodresources, v1beta2 and \
                         Kueue use the template"
                    ),
                });
            }
        }
    }
}

/// Sum of the regular containers' requests for `resource` (None when no container requests it
/// or a value does not parse).
fn container_requests(pod_spec: &Value, resource: &str) -> Option<Quantity> {
    let containers = pod_spec.get("containers")?.as_array()?;
    let mut total: Option<Quantity> = None;
    for container in containers {
        if let Some(q) = container
            .pointer("/resources/requests")
            .and_then(|r| r.get(resource))
        {
            let q = Quantity::from_json(q).ok()?;
            total = Some(total.unwrap_or(Quantity::ZERO).saturating_add(q));
        }
    }
    total
}

fn describe_requests(pod_spec: &Value, resource: &str) -> String {
    let values: Vec<String> = pod_spec
        .get("containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| {
            c.pointer("/resources/requests")
                .and_then(|r| r.get(resource))
        })
        .map(|v| v.as_str().map_or_else(|| v.to_string(), String::from))
        .collect();
    values.join(" + ")
}

/// Removes MCAD's placeholder labels from every `labels` map; warns when a selector still
/// matches on them (v1beta2 pods do not carry them, so such a selector would match nothing).
fn strip_placeholder_labels(value: &mut Value, path: &str, warnings: &mut Vec<Warning>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                let here = format!("{path}.{key}");
                if let Value::Object(inner) = child {
                    if key == "labels" {
                        inner.remove(PLACEHOLDER_LABEL);
                        inner.remove(PLACEHOLDER_NAMESPACE_LABEL);
                    } else if key == "matchLabels"
                        && (inner.contains_key(PLACEHOLDER_LABEL)
                            || inner.contains_key(PLACEHOLDER_NAMESPACE_LABEL))
                    {
                        warnings.push(Warning {
                            field: here.clone(),
                            reason: format!(
                                "selects on MCAD's `{PLACEHOLDER_LABEL}` label, which v1beta2 \
                                 pods do not carry: edit the selector and its pod template"
                            ),
                        });
                    }
                }
                strip_placeholder_labels(child, &here, warnings);
            }
            // Leave no `labels: {}` behind where the placeholder was the only label.
            if map
                .get("labels")
                .is_some_and(|l| l.as_object().is_some_and(Map::is_empty))
            {
                map.remove("labels");
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter_mut().enumerate() {
                strip_placeholder_labels(child, &format!("{path}[{i}]"), warnings);
            }
        }
        _ => {}
    }
}

fn convert_scheduling_spec(
    value: &Value,
    warnings: &mut Vec<Warning>,
    out: &mut Vec<(&'static str, String, String)>,
) {
    let Value::Object(scheduling) = value else {
        if !value.is_null() {
            warnings.push(Warning {
                field: "spec.schedulingSpec".into(),
                reason: "dropped: not a map".into(),
            });
        }
        return;
    };
    for (key, value) in scheduling {
        let here = format!("spec.schedulingSpec.{key}");
        match key.as_str() {
            // Compared with the pod count in `check_min_available`.
            "minAvailable" => {}
            "requeuing" => convert_requeuing(value, warnings, out),
            "nodeSelector" => warnings.push(Warning {
                field: here,
                reason: "dropped: never implemented by MCAD; put a nodeSelector in the pod \
                         templates (or let Kueue's ResourceFlavors inject one)"
                    .into(),
            }),
            "dispatchDuration" | "dispatchingWindow" => warnings.push(Warning {
                field: here,
                reason: "dropped: never implemented by MCAD and absent from v1beta2".into(),
            }),
            _ => warnings.push(Warning {
                field: here,
                reason: "dropped: unknown legacy field with no v1beta2 equivalent".into(),
            }),
        }
    }
}

fn convert_requeuing(
    value: &Value,
    warnings: &mut Vec<Warning>,
    out: &mut Vec<(&'static str, String, String)>,
) {
    let Value::Object(requeuing) = value else {
        if !value.is_null() {
            warnings.push(Warning {
                field: "spec.schedulingSpec.requeuing".into(),
                reason: "dropped: not a map".into(),
            });
        }
        return;
    };
    for (key, value) in requeuing {
        let here = format!("spec.schedulingSpec.requeuing.{key}");
        let Some(n) = value.as_i64() else {
            warnings.push(Warning {
                field: here,
                reason: format!("dropped: {value} is not an integer"),
            });
            continue;
        };
        let clipped = |warnings: &mut Vec<Warning>, here: &str| {
            if n > GRACE_PERIOD_MAXIMUM_SECONDS {
                warnings.push(Warning {
                    field: here.to_string(),
                    reason: format!(
                        "{n}s exceeds the controller's GracePeriodMaximum and will be clipped to \
                         24h"
                    ),
                });
            }
        };
        match key.as_str() {
            "timeInSeconds" => {
                if n < 0 {
                    warnings.push(Warning {
                        field: here,
                        reason: format!("dropped: negative duration {n}"),
                    });
                    continue;
                }
                clipped(warnings, &here);
                out.push((
                    annotations::ADMISSION_GRACE_PERIOD,
                    format!("{n}s"),
                    here.clone(),
                ));
                out.push((annotations::WARMUP_GRACE_PERIOD, format!("{n}s"), here));
            }
            "pauseTimeInSeconds" => {
                if n < 0 {
                    warnings.push(Warning {
                        field: here,
                        reason: format!("dropped: negative duration {n}"),
                    });
                    continue;
                }
                clipped(warnings, &here);
                out.push((annotations::RETRY_PAUSE_PERIOD, format!("{n}s"), here));
            }
            "forceDeletionTimeInSeconds" => {
                if n <= 0 {
                    warnings.push(Warning {
                        field: here.clone(),
                        reason: format!(
                            "{n} disabled forced deletion in MCAD; v1beta2 always force-deletes \
                             eventually, so it maps to the longest grace the controller honours \
                             (24h)"
                        ),
                    });
                    out.push((
                        annotations::FORCEFUL_DELETION_GRACE_PERIOD,
                        "24h".into(),
                        here,
                    ));
                } else {
                    clipped(warnings, &here);
                    out.push((
                        annotations::FORCEFUL_DELETION_GRACE_PERIOD,
                        format!("{n}s"),
                        here,
                    ));
                }
            }
            "maxNumRequeuings" => {
                if n <= 0 {
                    warnings.push(Warning {
                        field: here.clone(),
                        reason: format!(
                            "{n} meant unlimited requeuing in MCAD; mapped to retryLimit \
                             {UNLIMITED_RETRY_LIMIT} (set a real limit, e.g. 3, and consider \
                             terminalExitCodes so application bugs do not retry for ever)"
                        ),
                    });
                    out.push((
                        annotations::RETRY_LIMIT,
                        UNLIMITED_RETRY_LIMIT.to_string(),
                        here,
                    ));
                } else {
                    let limit = i32::try_from(n).unwrap_or(UNLIMITED_RETRY_LIMIT);
                    out.push((annotations::RETRY_LIMIT, limit.to_string(), here));
                }
            }
            "initialTimeInSeconds" | "maxTimeInSeconds" | "growthType" | "numRequeuings" => {
                warnings.push(Warning {
                    field: here,
                    reason: "dropped: accepted but never implemented by MCAD (no backoff growth \
                             in v1beta2 either)"
                        .into(),
                })
            }
            _ => warnings.push(Warning {
                field: here,
                reason: "dropped: unknown legacy field with no v1beta2 equivalent".into(),
            }),
        }
    }
}

/// MCAD watched for at least `minAvailable` running or succeeded pods; v1beta2 expects every pod
/// of every podSet. Warn when that changes what counts as healthy.
fn check_min_available(
    spec: &Map<String, Value>,
    components: &[AppWrapperComponent],
    warnings: &mut Vec<Warning>,
) {
    let Some(min) = spec
        .get("schedulingSpec")
        .and_then(|s| s.get("minAvailable"))
    else {
        return;
    };
    let field = "spec.schedulingSpec.minAvailable".to_string();
    let Some(min) = min.as_i64() else {
        warnings.push(Warning {
            field,
            reason: format!("dropped: {min} is not an integer"),
        });
        return;
    };
    let pods: i64 = components
        .iter()
        .map(|c| crate::appwrapper::podsets::expected_pod_count(&effective_pod_sets(c)))
        .sum();
    let reason = if min < 0 {
        format!(
            "{min} turned off pod monitoring and cleanup in MCAD; v1beta2 always monitors all \
             {pods} pods and resets or fails the AppWrapper when they are unhealthy"
        )
    } else if min == 0 {
        format!(
            "0 made MCAD check for a single pod only; v1beta2 expects all {pods} pods Running or \
             Succeeded"
        )
    } else if min < pods {
        format!(
            "MCAD tolerated down to {min} running pods; v1beta2 expects all {pods} pods Running \
             or Succeeded (after the warmup grace) and resets otherwise"
        )
    } else if min > pods {
        format!(
            "{min} is more than the {pods} pods the templates create, so MCAD would have \
             requeued for ever; v1beta2 expects exactly {pods}"
        )
    } else {
        return;
    };
    warnings.push(Warning { field, reason });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn legacy(spec: Value) -> Value {
        json!({"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": "aw", "namespace": "ns"}, "spec": spec})
    }

    fn pod(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name,
            "labels": {"appwrapper.mcad.ibm.com": "placeholder", "keep": "me"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox",
                "resources": {"requests": {"cpu": "500m"}}}]}})
    }

    fn warned(conversion: &Conversion, field: &str) -> bool {
        conversion.warnings.iter().any(|w| w.field == field)
    }

    fn annotations(conversion: &Conversion) -> BTreeMap<String, String> {
        conversion
            .appwrapper
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
    }

    #[test]
    fn requeuing_maps_to_annotations() {
        let out = convert(&legacy(json!({
            "schedulingSpec": {"minAvailable": 1, "requeuing": {
                "timeInSeconds": 300, "pauseTimeInSeconds": 60,
                "forceDeletionTimeInSeconds": 120, "maxNumRequeuings": 5,
                "growthType": "exponential"}},
            "resources": {"GenericItems": [{"generictemplate": pod("p")}]}})))
        .unwrap();
        let a = annotations(&out);
        assert_eq!(a[annotations::ADMISSION_GRACE_PERIOD], "300s");
        assert_eq!(a[annotations::WARMUP_GRACE_PERIOD], "300s");
        assert_eq!(a[annotations::RETRY_PAUSE_PERIOD], "60s");
        assert_eq!(a[annotations::FORCEFUL_DELETION_GRACE_PERIOD], "120s");
        assert_eq!(a[annotations::RETRY_LIMIT], "5");
        assert!(warned(&out, "spec.schedulingSpec.requeuing.growthType"));
        assert!(
            !warned(&out, "spec.schedulingSpec.minAvailable"),
            "1 pod, minAvailable 1"
        );
        // the placeholder is gone, other labels stay
        let labels = &out.appwrapper.spec.components[0].template["metadata"]["labels"];
        assert_eq!(labels, &json!({"keep": "me"}));
    }

    #[test]
    fn unlimited_and_disabled_settings_are_mapped_and_warned() {
        let out = convert(&legacy(json!({
            "schedulingSpec": {"requeuing": {"forceDeletionTimeInSeconds": 0,
                "maxNumRequeuings": 0, "timeInSeconds": 200000}},
            "resources": {"GenericItems": [{"generictemplate": pod("p")}]}})))
        .unwrap();
        let a = annotations(&out);
        assert_eq!(
            a[annotations::RETRY_LIMIT],
            UNLIMITED_RETRY_LIMIT.to_string()
        );
        assert_eq!(a[annotations::FORCEFUL_DELETION_GRACE_PERIOD], "24h");
        for f in [
            "spec.schedulingSpec.requeuing.maxNumRequeuings",
            "spec.schedulingSpec.requeuing.forceDeletionTimeInSeconds",
            "spec.schedulingSpec.requeuing.timeInSeconds",
        ] {
            assert!(warned(&out, f), "{f}: {:?}", out.warnings);
        }
    }

    #[test]
    fn explicit_v1beta2_annotations_win() {
        let mut doc = legacy(json!({
            "schedulingSpec": {"requeuing": {"maxNumRequeuings": 5}},
            "resources": {"GenericItems": [{"generictemplate": pod("p")}]}}));
        doc["metadata"]["annotations"] = json!({annotations::RETRY_LIMIT: "2"});
        let out = convert(&doc).unwrap();
        assert_eq!(annotations(&out)[annotations::RETRY_LIMIT], "2");
        assert!(warned(
            &out,
            "spec.schedulingSpec.requeuing.maxNumRequeuings"
        ));
    }

    #[test]
    fn unknown_kinds_get_declared_podsets() {
        let lws = json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "l"}, "spec": {"replicas": 2, "leaderWorkerTemplate": {
                "leaderTemplate": {"metadata": {"labels": {"appwrapper.mcad.ibm.com": "x"}},
                    "spec": {"containers": [{"name": "l", "resources": {"requests": {"cpu": 1}}}]}},
                "workerTemplate": {"spec": {"containers": [{"name": "w",
                    "resources": {"requests": {"cpu": 2}}}]}}}}});
        let out = convert(&legacy(json!({"resources": {"GenericItems": [{
            "generictemplate": lws,
            "custompodresources": [
                {"replicas": 2, "requests": {"cpu": 1}},
                {"replicas": 4, "requests": {"cpu": "2000m"}}]}]}})))
        .unwrap();
        let pod_sets = &out.appwrapper.spec.components[0].declared_pod_sets;
        let got: Vec<_> = pod_sets
            .iter()
            .map(|p| (p.path.as_str(), p.replicas))
            .collect();
        assert_eq!(
            got,
            vec![
                ("template.spec.leaderWorkerTemplate.leaderTemplate", Some(2)),
                ("template.spec.leaderWorkerTemplate.workerTemplate", Some(4)),
            ]
        );
        assert!(out.warnings.is_empty(), "{:?}", out.warnings);
        let leader = &out.appwrapper.spec.components[0].template["spec"]["leaderWorkerTemplate"]["leaderTemplate"];
        assert!(leader["metadata"].get("labels").is_none());
    }

    #[test]
    fn custom_pod_resources_that_disagree_are_warned() {
        let out = convert(&legacy(json!({"resources": {"GenericItems": [{
            "generictemplate": pod("p"),
            "custompodresources": [{"replicas": 3, "requests": {"cpu": "500m",
                "nvidia.com/gpu": 8}}]}]}})))
        .unwrap();
        let fields: Vec<_> = out.warnings.iter().map(|w| w.field.as_str()).collect();
        assert_eq!(
            fields,
            vec![
                "spec.resources.GenericItems[0].custompodresources",
                "spec.resources.GenericItems[0].custompodresources[0].requests[nvidia.com/gpu]",
            ]
        );
        // podSets are inferred for a Pod, not declared
        assert!(
            out.appwrapper.spec.components[0]
                .declared_pod_sets
                .is_empty()
        );
    }

    #[test]
    fn invalid_input_names_the_field() {
        let err = convert(&legacy(json!({"resources": {"GenericItems": []}}))).unwrap_err();
        assert_eq!(err.0[0].field, "spec.resources.GenericItems");
        let err = convert(&legacy(json!({"resources": {"GenericItems": [
            {"generictemplate": ""}]}})))
        .unwrap_err();
        assert_eq!(
            err.0[0].field,
            "spec.resources.GenericItems[0].generictemplate"
        );
        let err = convert(&legacy(json!({"resources": {"GenericItems": [
            {"generictemplate": {"metadata": {"name": "x"}}}]}})))
        .unwrap_err();
        assert!(err.0[0].reason.contains("apiVersion"));
        let err = convert(&legacy(json!({"resources": {"GenericItems": [
            {"generictemplate": pod("p"), "custompodresources": [{"requests": {}}]}]}})))
        .unwrap_err();
        assert_eq!(
            err.0[0].field,
            "spec.resources.GenericItems[0].custompodresources[0].replicas"
        );
        // a template in another namespace would be rejected by the API
        let mut other = pod("p");
        other["metadata"]["namespace"] = json!("elsewhere");
        let err = convert(&legacy(json!({"resources": {"GenericItems": [
            {"generictemplate": other}]}})))
        .unwrap_err();
        assert_eq!(
            err.0[0].field,
            "spec.resources.GenericItems[0].generictemplate.metadata.namespace"
        );
        let mut wrong = legacy(json!({}));
        wrong["apiVersion"] = json!("apps/v1");
        assert_eq!(convert(&wrong).unwrap_err().0[0].field, "apiVersion");
        let mut wrong = legacy(json!({}));
        wrong["kind"] = json!("Deployment");
        assert_eq!(convert(&wrong).unwrap_err().0[0].field, "kind");
        let mut nameless =
            legacy(json!({"resources": {"GenericItems": [{"generictemplate": pod("p")}]}}));
        nameless["metadata"] = json!({"namespace": "ns"});
        assert_eq!(convert(&nameless).unwrap_err().0[0].field, "metadata.name");
    }

    #[test]
    fn selectors_on_the_placeholder_are_warned() {
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d"}, "spec": {"replicas": 1,
                "selector": {"matchLabels": {"appwrapper.mcad.ibm.com": "placeholder", "app": "d"}},
                "template": {"metadata": {"labels": {"appwrapper.mcad.ibm.com": "placeholder",
                    "app": "d"}}, "spec": {"containers": [{"name": "c"}]}}}});
        let out = convert(&legacy(json!({"resources": {"GenericItems": [
            {"generictemplate": deployment}]}})))
        .unwrap();
        assert!(warned(
            &out,
            "spec.resources.GenericItems[0].generictemplate.spec.selector.matchLabels"
        ));
        let t = &out.appwrapper.spec.components[0].template;
        assert_eq!(
            t["spec"]["template"]["metadata"]["labels"],
            json!({"app": "d"})
        );
    }

    #[test]
    fn legacy_field_paths() {
        assert_eq!(
            legacy_field("spec.components"),
            "spec.resources.GenericItems"
        );
        assert_eq!(
            legacy_field("spec.components[2].template.metadata.namespace"),
            "spec.resources.GenericItems[2].generictemplate.metadata.namespace"
        );
        assert_eq!(
            legacy_field("spec.components[1].podSets[0].path"),
            "spec.resources.GenericItems[1] (converted podSets[0].path)"
        );
        assert_eq!(legacy_field("metadata.name"), "metadata.name");
    }

    #[test]
    fn v1beta2_documents_pass_through_validated() {
        let v1beta2 = json!({"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": {"name": "aw"}, "spec": {"components": [{"template": pod("p")}]}});
        let out = convert(&v1beta2).unwrap();
        assert_eq!(serde_json::to_value(&out.appwrapper).unwrap(), v1beta2);
        assert!(warned(&out, "apiVersion"));
        let mut invalid = v1beta2;
        invalid["spec"]["components"][0]["template"]["metadata"]["namespace"] = json!("x");
        invalid["metadata"]["namespace"] = json!("y");
        assert!(convert(&invalid).is_err());
    }

    #[test]
    fn multi_document_parsing_skips_empty_documents() {
        let docs = parse_documents("a: 1\n---\n---\nb: 2\n").unwrap();
        assert_eq!(docs, vec![json!({"a": 1}), json!({"b": 2})]);
        assert!(parse_documents("a: [1\n").is_err());
    }
}
