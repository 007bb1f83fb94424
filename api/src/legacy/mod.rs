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
//!
//! One file per concern: `metadata`, `resources` (GenericItems → components, placeholder labels),
//! `podsets` (custompodresources), `scheduling` (requeuing → annotations, minAvailable).

use serde_json::{Map, Value};

use crate::appwrapper::constants;
use crate::appwrapper::validation::validate_create;
use crate::appwrapper::{AppWrapper, AppWrapperSpec};

mod metadata;
mod podsets;
mod resources;
mod scheduling;
#[cfg(test)]
mod test_support;

use metadata::convert_metadata;
use resources::convert_resources;
use scheduling::{
    FaultToleranceAnnotation, apply_fault_tolerance, check_min_available, convert_scheduling_spec,
};

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
    pub(super) fn one(field: impl Into<String>, reason: impl Into<String>) -> Self {
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
    let mut fault_tolerance: Vec<FaultToleranceAnnotation> = Vec::new();
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

    let mut metadata = metadata;
    apply_fault_tolerance(&mut metadata, fault_tolerance, &mut warnings);

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

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use serde_json::json;

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
