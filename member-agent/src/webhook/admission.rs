//! The admission decisions, pure: AdmissionReview parsing, create-time defaulting (a JSON patch
//! of labels), create and update validation, and the denial responses. The SubjectAccessReviews
//! are IO; this module plans them ([`access_checks`]) and judges their outcomes.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::core::DynamicObject;
use kube::core::admission::{
    AdmissionRequest, AdmissionResponse, AdmissionReview, META_API_VERSION_V1, META_KIND, Operation,
};
use kube::core::response::{StatusCause, StatusDetails, StatusSummary};
use lifeboat_api::appwrapper::AppWrapper;
use lifeboat_api::appwrapper::constants::{GROUP, KIND, VERSION};
use lifeboat_api::appwrapper::labels::default_labels;
use lifeboat_api::appwrapper::podsets::GroupVersionKind;
use lifeboat_api::appwrapper::validation::{
    FieldError, FieldErrorKind, ValidationErrors, component_kinds, validate_create, validate_update,
};

/// A request the webhook cannot judge. Answered with HTTP 400 and this text, never a denial: it
/// means the caller (or the webhook registration) is wrong, not the AppWrapper.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MalformedRequest {
    #[error("the body is not a JSON AdmissionReview: {0}")]
    NotAReview(String),
    #[error(
        "expected apiVersion {META_API_VERSION_V1} kind {META_KIND}, got apiVersion `{api_version}` kind `{kind}`"
    )]
    WrongReviewVersion { api_version: String, kind: String },
    #[error("the AdmissionReview has no `request`")]
    NoRequest,
    #[error("request.kind is `{0}`: this webhook admits only {GROUP}/{VERSION} {KIND}")]
    WrongKind(String),
    #[error("request.object is missing in a {0} request")]
    MissingObject(&'static str),
    #[error("request.oldObject is missing in an UPDATE request")]
    MissingOldObject,
}

/// Parses an `admission.k8s.io/v1` AdmissionReview of an AppWrapper.
pub fn parse_review(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, MalformedRequest> {
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_slice(body).map_err(|e| MalformedRequest::NotAReview(e.to_string()))?;
    if review.types.api_version != META_API_VERSION_V1 || review.types.kind != META_KIND {
        return Err(MalformedRequest::WrongReviewVersion {
            api_version: review.types.api_version,
            kind: review.types.kind,
        });
    }
    let request: AdmissionRequest<DynamicObject> =
        review.try_into().map_err(|_| MalformedRequest::NoRequest)?;
    let kind = &request.kind;
    if kind.group != GROUP || kind.version != VERSION || kind.kind != KIND {
        return Err(MalformedRequest::WrongKind(format!(
            "{}/{} {}",
            kind.group, kind.version, kind.kind
        )));
    }
    Ok(request)
}

fn operation_name(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// The request's operation as the apiserver spells it (`CREATE`, `UPDATE`, ...).
pub fn operation_label(request: &AdmissionRequest<DynamicObject>) -> &'static str {
    operation_name(&request.operation)
}

/// Create-time defaulting (reference §4.1): the default queue label unless the user set one, and
/// the user name and UID labels from the request's user, overriding whatever the user wrote.
/// Other operations pass unchanged.
pub fn mutate(
    request: &AdmissionRequest<DynamicObject>,
    default_queue: &str,
) -> Result<AdmissionResponse, MalformedRequest> {
    if request.operation != Operation::Create {
        return Ok(AdmissionResponse::from(request));
    }
    let object = request
        .object
        .as_ref()
        .ok_or(MalformedRequest::MissingObject("CREATE"))?;
    let current = object.metadata.labels.as_ref();
    let mut labels = current.cloned().unwrap_or_default();
    default_labels(
        &mut labels,
        Some(default_queue),
        request.user_info.username.as_deref().unwrap_or_default(),
        request.user_info.uid.as_deref().unwrap_or_default(),
    );
    let patch = label_patch(current, &labels);
    let response = AdmissionResponse::from(request);
    if patch.0.is_empty() {
        return Ok(response);
    }
    Ok(match response.with_patch(patch) {
        Ok(patched) => patched,
        // Serialising a patch of strings cannot fail; if it ever did, refuse rather than admit
        // an AppWrapper without its trusted user labels.
        Err(e) => internal_denial(request, &e.to_string()),
    })
}

/// The JSON patch turning `current` labels into `desired`: one `add` of the whole map when the
/// object has no labels, otherwise one `add` (which replaces an existing value) per changed key.
pub fn label_patch(
    current: Option<&BTreeMap<String, String>>,
    desired: &BTreeMap<String, String>,
) -> Patch {
    let Some(current) = current else {
        if desired.is_empty() {
            return Patch(Vec::new());
        }
        let value = serde_json::to_value(desired).unwrap_or_default();
        return Patch(vec![PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["metadata", "labels"]),
            value,
        })]);
    };
    Patch(
        desired
            .iter()
            .filter(|(key, value)| current.get(*key) != Some(value))
            .map(|(key, value)| {
                PatchOperation::Add(AddOperation {
                    path: PointerBuf::from_tokens(["metadata", "labels", key.as_str()]),
                    value: serde_json::Value::String(value.clone()),
                })
            })
            .collect(),
    )
}

/// The object of a request as an AppWrapper. A validating webhook sees objects that already
/// passed the CRD schema, so this fails only on a broken apiserver or registration.
pub fn decode_appwrapper(object: &DynamicObject, which: &str) -> Result<AppWrapper, FieldError> {
    serde_json::to_value(object)
        .and_then(serde_json::from_value)
        .map_err(|e| FieldError {
            field: which.to_string(),
            kind: FieldErrorKind::Invalid,
            reason: format!("cannot be read as a {GROUP}/{VERSION} {KIND}: {e}"),
        })
}

/// At most this many components in one AppWrapper; more is rejected before any other check,
/// so one request cannot make the webhook do unbounded work. Upstream caps only the pod specs
/// (8, Kueue's podSet limit) and leaves the other components (Services, ConfigMaps, Secrets,
/// ...) unbounded; the upstream samples have 1 component each and the legacy MCAD samples at
/// most 3 items. 32 leaves room for the 8 pod specs and 24 other objects.
pub const MAX_COMPONENTS: usize = 32;

/// The component cap, Kubernetes style (`field.TooMany`): `spec.components: Too many: N: must
/// have at most M items`. Only for CREATE: the components are immutable, and an UPDATE (e.g.
/// the controller removing its finalizer) must never be blocked by a later, lower cap.
pub fn component_count_error(aw: &AppWrapper) -> Option<FieldError> {
    let count = aw.spec.components.len();
    (count > MAX_COMPONENTS).then(|| FieldError {
        field: "spec.components".into(),
        kind: FieldErrorKind::Invalid,
        reason: format!("Too many: {count}: must have at most {MAX_COMPONENTS} items"),
    })
}

/// One SubjectAccessReview to send: may the user create objects of `gvk`? `components` are the
/// indexes of every component of that kind (each is named if the answer is no).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessCheck {
    pub gvk: GroupVersionKind,
    pub components: Vec<usize>,
}

/// One SubjectAccessReview per distinct wrapped (group, version, kind), in component order.
pub fn access_checks(aw: &AppWrapper) -> Vec<AccessCheck> {
    let mut checks: Vec<AccessCheck> = Vec::new();
    for kind in component_kinds(&aw.spec) {
        match checks.iter_mut().find(|c| c.gvk == kind.gvk) {
            Some(check) => check.components.push(kind.index),
            None => checks.push(AccessCheck {
                gvk: kind.gvk,
                components: vec![kind.index],
            }),
        }
    }
    checks
}

/// Whether `gvk` is spelled so that an apiserver could serve it: group a DNS subdomain (or empty
/// for core), version a DNS label, kind a DNS label once lowercased (the rules a CRD's names
/// obey). Anything else is rejected without asking discovery, whose URL it would become.
pub fn servable(gvk: &GroupVersionKind) -> bool {
    fn label(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    }
    let group_ok =
        gvk.group.is_empty() || (gvk.group.len() <= 253 && gvk.group.split('.').all(label));
    let kind_ok = gvk.kind.starts_with(|c: char| c.is_ascii_alphabetic())
        && label(&gvk.kind.to_ascii_lowercase());
    group_ok && label(&gvk.version) && kind_ok
}

/// The SubjectAccessReview for one check: verb `create` of `resource` (the plural discovery
/// found) in the AppWrapper's namespace, as the requesting user (name, UID, groups and extra
/// copied from the request).
pub fn access_review(
    check: &AccessCheck,
    resource: &str,
    namespace: &str,
    user: &UserInfo,
) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_string()),
                verb: Some("create".into()),
                group: Some(check.gvk.group.clone()),
                version: Some(check.gvk.version.clone()),
                resource: Some(resource.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// What the apiserver answered to one [`AccessCheck`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessOutcome {
    Allowed,
    /// Not allowed to create `resource` (the plural discovery found).
    Denied {
        resource: String,
    },
    /// Discovery does not serve the kind (or it is not spelled so that it could be served):
    /// the controller could never create it.
    NotServed,
    /// The check could not be made (discovery or the SubjectAccessReview failed or timed out).
    Failed(String),
}

/// The verdict of the validating webhook before it becomes a response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    pub errors: Vec<FieldError>,
    /// Some check could not be made (reported as an internal error, as upstream does).
    pub internal: bool,
}

impl Verdict {
    pub fn allowed(&self) -> bool {
        self.errors.is_empty()
    }
}

fn display_resource(gvk: &GroupVersionKind, plural: &str) -> String {
    if gvk.group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{}", gvk.group)
    }
}

/// Create validation (reference §4.2): the component cap (alone: nothing else is judged
/// beyond it), the structural rules, then the access reviews' outcomes, one error per component
/// the user may not create or whose kind is not served.
pub fn create_verdict(
    aw: &AppWrapper,
    namespace: &str,
    user: &UserInfo,
    outcomes: &[(AccessCheck, AccessOutcome)],
) -> Verdict {
    if let Some(too_many) = component_count_error(aw) {
        return Verdict {
            errors: vec![too_many],
            internal: false,
        };
    }
    let mut verdict = Verdict::default();
    if let Err(ValidationErrors(errors)) = validate_create(&aw.spec, namespace) {
        verdict.errors = errors;
    }
    let user_name = user.username.as_deref().unwrap_or_default();
    for (check, outcome) in outcomes {
        let (kind, reason) = match outcome {
            AccessOutcome::Allowed => continue,
            AccessOutcome::Denied { resource } => (
                FieldErrorKind::Forbidden,
                format!(
                    "User {user_name} is not authorized to create {} in {namespace}",
                    display_resource(&check.gvk, resource)
                ),
            ),
            AccessOutcome::NotServed => {
                for index in &check.components {
                    verdict.errors.push(FieldError {
                        field: format!("spec.components[{index}].template.kind"),
                        kind: FieldErrorKind::Invalid,
                        reason: format!(
                            "no kind \"{}\" is served in version \"{}\" by this cluster",
                            check.gvk.kind,
                            check.gvk.api_version()
                        ),
                    });
                }
                continue;
            }
            AccessOutcome::Failed(error) => {
                verdict.internal = true;
                (
                    FieldErrorKind::Forbidden,
                    format!(
                        "could not check whether User {user_name} may create {} in {namespace}: {error}",
                        check.gvk
                    ),
                )
            }
        };
        for index in &check.components {
            verdict.errors.push(FieldError {
                field: format!("spec.components[{index}].template"),
                kind,
                reason: reason.clone(),
            });
        }
    }
    verdict
}

/// Update validation (reference §4.4).
pub fn update_verdict(old: &AppWrapper, new: &AppWrapper) -> Verdict {
    Verdict {
        errors: validate_update(old, new)
            .err()
            .map(|e| e.0)
            .unwrap_or_default(),
        internal: false,
    }
}

/// The namespace an AppWrapper lives in: the request's, else the object's.
pub fn request_namespace(request: &AdmissionRequest<DynamicObject>, aw: &AppWrapper) -> String {
    request
        .namespace
        .clone()
        .filter(|ns| !ns.is_empty())
        .or_else(|| aw.metadata.namespace.clone())
        .unwrap_or_default()
}

/// The admission response for a verdict. A denial carries one message naming every field and
/// reason (what kubectl prints), plus one status cause per field. Its code is 500 when a check
/// could not be made, 403 when every error is Forbidden, else 422 (Invalid).
pub fn respond(request: &AdmissionRequest<DynamicObject>, verdict: &Verdict) -> AdmissionResponse {
    if verdict.allowed() {
        return AdmissionResponse::from(request);
    }
    let message = ValidationErrors(verdict.errors.clone()).to_string();
    let (code, reason) = if verdict.internal {
        (500, "InternalError")
    } else if verdict
        .errors
        .iter()
        .all(|e| e.kind == FieldErrorKind::Forbidden)
    {
        (403, "Forbidden")
    } else {
        (422, "Invalid")
    };
    let mut response = AdmissionResponse::from(request).deny(message);
    response.result.status = Some(StatusSummary::Failure);
    response.result.code = code;
    response.result.reason = reason.into();
    response.result.details = Some(StatusDetails {
        name: request.name.clone(),
        group: GROUP.into(),
        kind: KIND.into(),
        uid: String::new(),
        causes: verdict
            .errors
            .iter()
            .map(|e| StatusCause {
                reason: match e.kind {
                    FieldErrorKind::Invalid => "FieldValueInvalid",
                    FieldErrorKind::Forbidden => "FieldValueForbidden",
                    FieldErrorKind::Required => "FieldValueRequired",
                }
                .into(),
                message: e.reason.clone(),
                field: e.field.clone(),
            })
            .collect(),
        retry_after_seconds: 0,
    });
    response
}

fn internal_denial(request: &AdmissionRequest<DynamicObject>, error: &str) -> AdmissionResponse {
    let mut response = AdmissionResponse::from(request).deny(format!("internal error: {error}"));
    response.result.status = Some(StatusSummary::Failure);
    response.result.code = 500;
    response.result.reason = "InternalError".into();
    response
}

/// The objects a validation needs, checked for presence.
pub enum Subject {
    Create(Box<AppWrapper>),
    Update {
        old: Box<AppWrapper>,
        new: Box<AppWrapper>,
    },
    /// DELETE and CONNECT are not validated.
    Other,
}

/// Reads the AppWrapper(s) a validation request is about. `Err(Ok(verdict))` is a decode
/// failure to deny; `Err(Err(..))` a malformed request.
pub fn subject(
    request: &AdmissionRequest<DynamicObject>,
) -> Result<Subject, Result<Verdict, MalformedRequest>> {
    let deny = |e: FieldError| {
        Err(Ok(Verdict {
            errors: vec![e],
            internal: false,
        }))
    };
    match request.operation {
        Operation::Create | Operation::Update => {
            let op = operation_name(&request.operation);
            let object = request
                .object
                .as_ref()
                .ok_or(Err(MalformedRequest::MissingObject(op)))?;
            let new = match decode_appwrapper(object, "object") {
                Ok(aw) => aw,
                Err(e) => return deny(e),
            };
            if request.operation == Operation::Create {
                return Ok(Subject::Create(Box::new(new)));
            }
            let old_object = request
                .old_object
                .as_ref()
                .ok_or(Err(MalformedRequest::MissingOldObject))?;
            match decode_appwrapper(old_object, "oldObject") {
                Ok(old) => Ok(Subject::Update {
                    old: Box::new(old),
                    new: Box::new(new),
                }),
                Err(e) => deny(e),
            }
        }
        Operation::Delete | Operation::Connect => Ok(Subject::Other),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use lifeboat_api::appwrapper::constants::{QUEUE_NAME_LABEL, USER_ID_LABEL, USER_NAME_LABEL};
    use serde_json::{Value, json};

    pub const LIMITED_UID: &str = "8da0fcfe-6d7f-4f44-b433-d91d22cc1b8c";

    pub fn pod_component(name: &str) -> Value {
        json!({"template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox",
            "command": ["sh", "-c", "sleep 10"], "resources": {"requests": {"cpu": "100m"}}}]}}})
    }

    pub fn deployment_component(replicas: i32) -> Value {
        json!({"template": {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d"}, "spec": {"replicas": replicas,
            "selector": {"matchLabels": {"app": "d"}}, "template": {"metadata": {"labels":
            {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}})
    }

    pub fn appwrapper(labels: Value, components: Vec<Value>) -> Value {
        json!({"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": {"name": "aw", "namespace": "team", "labels": labels},
            "spec": {"components": components}})
    }

    pub fn review_body(operation: &str, object: Value, old: Option<Value>) -> Vec<u8> {
        let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "req-1",
                "kind": {"group": "workload.codeflare.dev", "version": "v1beta2", "kind": "AppWrapper"},
                "resource": {"group": "workload.codeflare.dev", "version": "v1beta2", "resource": "appwrappers"},
                "name": "aw", "namespace": "team", "operation": operation,
                "userInfo": {"username": "limited-user", "uid": LIMITED_UID,
                    "groups": ["system:authenticated"], "extra": {"xyzzy": ["plugh"]}},
                "object": object, "oldObject": old, "dryRun": false}});
        serde_json::to_vec(&body).unwrap_or_default()
    }

    fn request(operation: &str, object: Value) -> AdmissionRequest<DynamicObject> {
        parse_review(&review_body(operation, object, None)).unwrap()
    }

    fn patched_labels(object: &Value, response: &AdmissionResponse) -> Value {
        let patch: Patch = serde_json::from_slice(response.patch.as_deref().unwrap()).unwrap();
        let mut doc = object.clone();
        json_patch::patch(&mut doc, &patch.0).unwrap();
        doc["metadata"]["labels"].clone()
    }

    #[test]
    fn defaulting_sets_queue_and_trusted_user_labels() {
        // no labels at all: one add of the whole map
        let mut object = appwrapper(json!(null), vec![pod_component("p")]);
        object["metadata"].as_object_mut().unwrap().remove("labels");
        let response = mutate(&request("CREATE", object.clone()), "system-default-queue").unwrap();
        assert!(response.allowed);
        let patch: Value = serde_json::from_slice(response.patch.as_deref().unwrap()).unwrap();
        assert_eq!(
            patch,
            json!([{"op": "add", "path": "/metadata/labels", "value": {
                QUEUE_NAME_LABEL: "system-default-queue",
                USER_NAME_LABEL: "limited-user",
                USER_ID_LABEL: LIMITED_UID}}])
        );
        assert_eq!(
            serde_json::to_value(response.into_review()).unwrap()["response"]["patchType"],
            "JSONPatch"
        );

        // user-provided queue wins; pre-set user labels are overridden; other labels kept
        let object = appwrapper(
            json!({QUEUE_NAME_LABEL: "user-provided-queue", USER_NAME_LABEL: "bad",
                USER_ID_LABEL: "bad", "team": "a"}),
            vec![pod_component("p")],
        );
        let response = mutate(&request("CREATE", object.clone()), "system-default-queue").unwrap();
        let patch: Value = serde_json::from_slice(response.patch.as_deref().unwrap()).unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "add", "path": "/metadata/labels/workload.codeflare.dev~1user", "value": "limited-user"},
                {"op": "add", "path": "/metadata/labels/workload.codeflare.dev~1userid", "value": LIMITED_UID},
            ])
        );
        assert_eq!(
            patched_labels(&object, &response),
            json!({QUEUE_NAME_LABEL: "user-provided-queue", USER_NAME_LABEL: "limited-user",
                USER_ID_LABEL: LIMITED_UID, "team": "a"})
        );
    }

    #[test]
    fn defaulting_without_a_default_queue_and_on_update() {
        let object = appwrapper(json!({}), vec![pod_component("p")]);
        let response = mutate(&request("CREATE", object.clone()), "").unwrap();
        assert_eq!(
            patched_labels(&object, &response),
            json!({USER_NAME_LABEL: "limited-user", USER_ID_LABEL: LIMITED_UID})
        );
        // already right: no patch at all
        let done = appwrapper(
            json!({USER_NAME_LABEL: "limited-user", USER_ID_LABEL: LIMITED_UID}),
            vec![],
        );
        let response = mutate(&request("CREATE", done), "").unwrap();
        assert!(response.allowed && response.patch.is_none());
        // UPDATE is not mutated (the labels are immutable instead)
        let body = review_body("UPDATE", object.clone(), Some(object));
        let response = mutate(&parse_review(&body).unwrap(), "q").unwrap();
        assert!(response.allowed && response.patch.is_none());
    }

    #[test]
    fn user_names_are_sanitised_in_labels() {
        let object = appwrapper(json!({}), vec![]);
        let mut body: Value =
            serde_json::from_slice(&review_body("CREATE", object.clone(), None)).unwrap();
        body["request"]["userInfo"] = json!({"username": "system:serviceaccount:ns:sa"});
        let req = parse_review(&serde_json::to_vec(&body).unwrap()).unwrap();
        let response = mutate(&req, "").unwrap();
        assert_eq!(
            patched_labels(&object, &response),
            json!({USER_NAME_LABEL: "system_serviceaccount_ns_sa", USER_ID_LABEL: ""})
        );
    }

    #[test]
    fn malformed_reviews_are_named() {
        assert!(matches!(
            parse_review(b"not json"),
            Err(MalformedRequest::NotAReview(_))
        ));
        let v1beta1 = json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"});
        assert_eq!(
            parse_review(&serde_json::to_vec(&v1beta1).unwrap()).unwrap_err(),
            MalformedRequest::WrongReviewVersion {
                api_version: "admission.k8s.io/v1beta1".into(),
                kind: "AdmissionReview".into()
            }
        );
        let no_request = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
        assert_eq!(
            parse_review(&serde_json::to_vec(&no_request).unwrap()).unwrap_err(),
            MalformedRequest::NoRequest
        );
        let mut pod: Value =
            serde_json::from_slice(&review_body("CREATE", json!({}), None)).unwrap();
        pod["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
        let err = parse_review(&serde_json::to_vec(&pod).unwrap()).unwrap_err();
        assert_eq!(err, MalformedRequest::WrongKind("/v1 Pod".into()));
        assert!(
            err.to_string()
                .contains("admits only workload.codeflare.dev/v1beta2 AppWrapper")
        );

        let no_object = review_body("CREATE", Value::Null, None);
        let req = parse_review(&no_object).unwrap();
        assert_eq!(
            mutate(&req, "").unwrap_err(),
            MalformedRequest::MissingObject("CREATE")
        );
        assert!(matches!(
            subject(&req),
            Err(Err(MalformedRequest::MissingObject("CREATE")))
        ));
        let object = appwrapper(json!({}), vec![pod_component("p")]);
        let req = parse_review(&review_body("UPDATE", object, None)).unwrap();
        assert!(matches!(
            subject(&req),
            Err(Err(MalformedRequest::MissingOldObject))
        ));
    }

    fn limited_user() -> UserInfo {
        UserInfo {
            username: Some("limited-user".into()),
            uid: Some(LIMITED_UID.into()),
            groups: Some(vec!["system:authenticated".into()]),
            extra: Some(BTreeMap::from([("xyzzy".into(), vec!["plugh".into()])])),
        }
    }

    fn decode(object: Value) -> AppWrapper {
        serde_json::from_value(object).unwrap()
    }

    #[test]
    fn one_access_review_per_distinct_kind_as_the_requesting_user() {
        let aw = decode(appwrapper(
            json!({}),
            vec![
                pod_component("a"),
                deployment_component(1),
                pod_component("b"),
            ],
        ));
        let checks = access_checks(&aw);
        assert_eq!(checks.len(), 2);
        assert_eq!(checks[0].gvk.kind, "Pod");
        assert_eq!(checks[0].components, vec![0, 2]);
        assert_eq!(checks[1].gvk.group, "apps");
        assert_eq!(checks[1].components, vec![1]);

        let sar = access_review(&checks[1], "deployments", "team", &limited_user());
        let spec = sar.spec;
        assert_eq!(spec.user.as_deref(), Some("limited-user"));
        assert_eq!(spec.uid.as_deref(), Some(LIMITED_UID));
        assert_eq!(spec.groups, Some(vec!["system:authenticated".to_string()]));
        assert_eq!(spec.extra, limited_user().extra);
        let attrs = spec.resource_attributes.unwrap();
        assert_eq!(attrs.verb.as_deref(), Some("create"));
        assert_eq!(attrs.group.as_deref(), Some("apps"));
        assert_eq!(attrs.version.as_deref(), Some("v1"));
        assert_eq!(attrs.resource.as_deref(), Some("deployments"));
        assert_eq!(attrs.namespace.as_deref(), Some("team"));
    }

    #[test]
    fn denied_kinds_name_every_component_of_that_kind() {
        let aw = decode(appwrapper(
            json!({}),
            vec![
                pod_component("a"),
                deployment_component(1),
                deployment_component(2),
            ],
        ));
        let checks = access_checks(&aw);
        let outcomes = vec![
            (checks[0].clone(), AccessOutcome::Allowed),
            (
                checks[1].clone(),
                AccessOutcome::Denied {
                    resource: "deployments".into(),
                },
            ),
        ];
        // deployment names collide ("d") but that is the apiserver's business, not admission's
        let verdict = create_verdict(&aw, "team", &limited_user(), &outcomes);
        assert!(!verdict.internal);
        let fields: Vec<_> = verdict.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            vec!["spec.components[1].template", "spec.components[2].template"]
        );
        assert_eq!(
            verdict.errors[0].reason,
            "User limited-user is not authorized to create deployments.apps in team"
        );

        let req = request("CREATE", appwrapper(json!({}), vec![]));
        let response = respond(&req, &verdict);
        assert!(!response.allowed);
        assert_eq!(response.result.code, 403);
        assert_eq!(response.result.reason, "Forbidden");
        assert_eq!(
            response.result.message,
            "spec.components[1].template: User limited-user is not authorized to create \
             deployments.apps in team; spec.components[2].template: User limited-user is not \
             authorized to create deployments.apps in team"
        );
        let details = response.result.details.unwrap();
        assert_eq!(details.kind, "AppWrapper");
        assert_eq!(details.name, "aw");
        assert_eq!(details.causes.len(), 2);
        assert_eq!(details.causes[0].field, "spec.components[1].template");
        assert_eq!(details.causes[0].reason, "FieldValueForbidden");
    }

    #[test]
    fn unknown_kinds_and_failed_reviews() {
        let mut lws = pod_component("x");
        lws["template"]["apiVersion"] = json!("example.com/v1");
        lws["template"]["kind"] = json!("Thing");
        lws["podSets"] = json!([{"path": "template"}]);
        let aw = decode(appwrapper(json!({}), vec![lws, pod_component("p")]));
        let checks = access_checks(&aw);
        let outcomes = vec![
            (checks[0].clone(), AccessOutcome::NotServed),
            (
                checks[1].clone(),
                AccessOutcome::Failed("connection refused".into()),
            ),
        ];
        let verdict = create_verdict(&aw, "team", &limited_user(), &outcomes);
        assert!(verdict.internal);
        assert_eq!(verdict.errors[0].field, "spec.components[0].template.kind");
        assert_eq!(
            verdict.errors[0].reason,
            "no kind \"Thing\" is served in version \"example.com/v1\" by this cluster"
        );
        assert_eq!(verdict.errors[1].field, "spec.components[1].template");
        assert!(verdict.errors[1].reason.contains("connection refused"));
        let req = request("CREATE", appwrapper(json!({}), vec![]));
        let response = respond(&req, &verdict);
        assert_eq!(response.result.code, 500);
        assert_eq!(response.result.reason, "InternalError");
    }

    #[test]
    fn too_many_components_are_rejected_alone_and_only_on_create() {
        let many = |n: usize| {
            decode(appwrapper(
                json!({}),
                (0..n).map(|i| pod_component(&format!("p{i}"))).collect(),
            ))
        };
        assert_eq!(component_count_error(&many(MAX_COMPONENTS)), None);
        let aw = many(MAX_COMPONENTS + 1);
        let error = component_count_error(&aw).unwrap();
        assert_eq!(
            error.to_string(),
            "spec.components: Too many: 33: must have at most 32 items"
        );
        // alone: the 33 pod specs (> 8) are not judged, nor any access outcome
        let outcomes: Vec<_> = access_checks(&aw)
            .into_iter()
            .map(|c| (c, AccessOutcome::Failed("must not be looked at".into())))
            .collect();
        let verdict = create_verdict(&aw, "team", &limited_user(), &outcomes);
        assert_eq!(verdict.errors, vec![error]);
        assert!(!verdict.internal);
        let response = respond(&request("CREATE", appwrapper(json!({}), vec![])), &verdict);
        assert_eq!(response.result.code, 422);
        assert_eq!(
            response.result.details.unwrap().causes[0].field,
            "spec.components"
        );
        // updates are judged by immutability only (the components cannot change anyway)
        assert!(update_verdict(&aw, &aw).allowed());
    }

    #[test]
    fn only_well_spelled_kinds_go_to_discovery() {
        let gvk = |api_version: &str, kind: &str| {
            GroupVersionKind::of(&json!({"apiVersion": api_version, "kind": kind})).unwrap()
        };
        for (api_version, kind) in [
            ("v1", "Pod"),
            ("apps/v1", "Deployment"),
            ("kubeflow.org/v1", "PyTorchJob"),
            ("jobset.x-k8s.io/v1alpha2", "JobSet"),
        ] {
            assert!(servable(&gvk(api_version, kind)), "{api_version} {kind}");
        }
        for (api_version, kind) in [
            ("v1/../../api/v1", "Secret"),
            ("example.com/v1/x", "Thing"),
            ("Example.com/v1", "Thing"),
            ("example.com/", "Thing"),
            ("example..com/v1", "Thing"),
            ("-example.com/v1", "Thing"),
            ("example.com/V1", "Thing"),
            ("example.com/v1", "Thing!"),
            ("example.com/v1", "9Thing"),
            ("example.com/v1", "Thing-"),
            ("v1?watch=true", "Pod"),
        ] {
            assert!(!servable(&gvk(api_version, kind)), "{api_version} {kind}");
        }
        assert!(!servable(&gvk("v1", &"P".repeat(64))));
        assert!(!servable(&gvk(&format!("{}/v1", "a.".repeat(127)), "Pod")));
    }

    #[test]
    fn structural_and_access_errors_aggregate_in_one_invalid_response() {
        let mut bad_path = deployment_component(1);
        bad_path["podSets"] = json!([{"path": "template.spec.missing"}]);
        let aw = decode(appwrapper(json!({}), vec![bad_path]));
        let checks = access_checks(&aw);
        let outcomes = vec![(
            checks[0].clone(),
            AccessOutcome::Denied {
                resource: "deployments".into(),
            },
        )];
        let verdict = create_verdict(&aw, "team", &limited_user(), &outcomes);
        let req = request("CREATE", appwrapper(json!({}), vec![]));
        let response = respond(&req, &verdict);
        assert_eq!(response.result.code, 422);
        assert_eq!(response.result.reason, "Invalid");
        let message = &response.result.message;
        assert!(
            message.contains(
                "spec.components[0].podSets[0].path: path does not refer to a v1.PodSpecTemplate"
            ),
            "{message}"
        );
        assert!(
            message.contains(
                "spec.components[0].template: User limited-user is not authorized to create deployments.apps in team"
            ),
            "{message}"
        );
    }

    #[test]
    fn well_formed_creates_are_allowed_without_a_patch() {
        let aw = decode(appwrapper(json!({}), vec![pod_component("p")]));
        let outcomes: Vec<_> = access_checks(&aw)
            .into_iter()
            .map(|c| (c, AccessOutcome::Allowed))
            .collect();
        let verdict = create_verdict(&aw, "team", &limited_user(), &outcomes);
        assert!(verdict.allowed(), "{verdict:?}");
        let req = request("CREATE", appwrapper(json!({}), vec![]));
        let response = respond(&req, &verdict);
        assert!(response.allowed);
        assert!(response.patch.is_none());
        assert_eq!(response.uid, "req-1");
    }

    #[test]
    fn updates_judge_immutability() {
        let old = appwrapper(
            json!({USER_NAME_LABEL: "limited-user"}),
            vec![pod_component("p")],
        );
        let mut new = old.clone();
        new["spec"]["suspend"] = json!(true);
        let req = parse_review(&review_body("UPDATE", new.clone(), Some(old.clone()))).unwrap();
        let Ok(Subject::Update { old: o, new: n }) = subject(&req) else {
            panic!("not an update subject")
        };
        assert!(update_verdict(&o, &n).allowed());

        new["metadata"]["labels"][USER_NAME_LABEL] = json!("mallory");
        new["spec"]["components"][0]["template"]["spec"]["restartPolicy"] = json!("Always");
        let req = parse_review(&review_body("UPDATE", new, Some(old))).unwrap();
        let Ok(Subject::Update { old: o, new: n }) = subject(&req) else {
            panic!("not an update subject")
        };
        let verdict = update_verdict(&o, &n);
        let response = respond(&req, &verdict);
        assert_eq!(response.result.code, 403);
        assert_eq!(
            response.result.message,
            "spec.components[0].template: attempt to change immutable field; \
             metadata.labels[workload.codeflare.dev/user]: attempt to change immutable field"
        );
    }

    #[test]
    fn undecodable_objects_are_denied_naming_the_object() {
        let mut object = appwrapper(json!({}), vec![]);
        object["spec"]["components"] = json!("nope");
        let req = request("CREATE", object);
        let Err(Ok(verdict)) = subject(&req) else {
            panic!("expected a denial")
        };
        assert_eq!(verdict.errors[0].field, "object");
        assert!(verdict.errors[0].reason.contains("cannot be read as a"));
        assert!(matches!(
            subject(&request("DELETE", Value::Null)),
            Ok(Subject::Other)
        ));
    }
}
