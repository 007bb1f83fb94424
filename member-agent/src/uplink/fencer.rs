//! The fencing credential this agent gives the hub ([`lifeboat_api::fencing`]): a token of the
//! member's ServiceAccount `lifeboat-fencer`, which may only delete, and only what Lifeboat
//! placed, so that the hub can make sure a `Directly` workload no longer runs here when this
//! agent cannot say so (dead, or cut off from the hub).
//!
//! The agent makes (server-side apply, field manager `lifeboat`) in its member:
//! - the ServiceAccount and a `kubernetes.io/service-account-token` Secret the member's token
//!   controller fills with its token (long-lived on purpose: the hub needs it precisely when the
//!   agent is gone; deleting the Secret revokes it);
//! - the ClusterRole `lifeboat-fencer` (`delete` on every resource, when absent: the agent chart
//!   makes it with `delete` on exactly the kinds the agent may place), bound only by a
//!   RoleBinding in each namespace the hub's work goes to ([`FencerBinding`], made with the
//!   namespace), so it grants nothing cluster-scoped, an admission policy least of all;
//! - the ValidatingAdmissionPolicy `lifeboat-fencer.lifeboat.dev` (and its binding), which
//!   refuses that ServiceAccount the deletion of any object without the binding label the agent
//!   puts on what it applies.
//!
//! The credential (server, CA, token) is published on a watch channel; the heartbeat sends it
//! whenever the hub's answer shows the hub holds another one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, RoleBinding};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use lifeboat_api::binding::{FIELD_MANAGER, LABEL_BINDING_NAME};
use lifeboat_api::fencing::{ADMISSION_POLICY, CLUSTER_ROLE, SERVICE_ACCOUNT, TOKEN_SECRET};
use lifeboat_api::protocol::FencingCredential;
use serde_json::json;
use tokio::sync::watch;

use super::backoff::Backoff;
use super::namespaces::{CREATED_BY, CREATED_BY_LABEL, Namespaces};

/// Where the hub reaches this member's kube-apiserver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencingTarget {
    /// `https://...` as the hub sees it.
    pub server: String,
    /// PEM CA bundle of that server (empty: the hub's trust store).
    pub certificate_authority: String,
    /// The namespace of the ServiceAccount and its token Secret.
    pub namespace: String,
}

/// The RoleBinding that lets the fencing ServiceAccount (of `namespace`) delete in one namespace
/// of the hub's work: made with the namespace ([`super::namespaces::Namespaces`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencerBinding {
    pub service_account_namespace: String,
}

impl FencerBinding {
    /// The RoleBinding in `namespace`.
    pub fn role_binding(&self, namespace: &str) -> RoleBinding {
        serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": CLUSTER_ROLE, "namespace": namespace,
                         "labels": {CREATED_BY_LABEL: CREATED_BY}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT,
                          "namespace": self.service_account_namespace}]
        }))
        .unwrap_or_default()
    }

    /// Applies the RoleBinding in `namespace`.
    pub async fn apply(&self, client: &kube::Client, namespace: &str) -> Result<(), kube::Error> {
        Api::<RoleBinding>::namespaced(client.clone(), namespace)
            .patch(
                CLUSTER_ROLE,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&self.role_binding(namespace)),
            )
            .await
            .map(|_| ())
    }
}

/// The fencing ServiceAccount's user name in `namespace`.
pub fn service_account_user(namespace: &str) -> String {
    format!("system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}")
}

/// The ValidatingAdmissionPolicy: the fencing ServiceAccount may delete only objects labelled
/// as Lifeboat's (RBAC already gives it nothing but `delete`).
pub fn admission_policy(namespace: &str) -> serde_json::Value {
    let user = service_account_user(namespace);
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": ADMISSION_POLICY, "labels": {CREATED_BY_LABEL: CREATED_BY}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/*"],
                "operations": ["CREATE", "UPDATE", "DELETE", "CONNECT"]
            }]},
            "matchConditions": [{
                "name": "lifeboat-fencer",
                "expression": format!("request.userInfo.username == '{user}'")
            }],
            "validations": [{
                "expression": format!(
                    "request.operation == 'DELETE' && oldObject != null && has(oldObject.metadata.labels) && '{LABEL_BINDING_NAME}' in oldObject.metadata.labels"
                ),
                "message": format!(
                    "the Lifeboat fencer may only delete objects Lifeboat placed (labelled {LABEL_BINDING_NAME})"
                ),
                "reason": "Forbidden"
            }]
        }
    })
}

/// The policy's binding (every namespace; the policy's own match condition names the user).
pub fn admission_policy_binding() -> serde_json::Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": ADMISSION_POLICY, "labels": {CREATED_BY_LABEL: CREATED_BY}},
        "spec": {"policyName": ADMISSION_POLICY, "validationActions": ["Deny"]}
    })
}

/// The ClusterRole: `delete` on every resource. Bound only per namespace (a RoleBinding grants
/// a ClusterRole's rules in its own namespace alone).
pub fn cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: kube::api::ObjectMeta {
            name: Some(CLUSTER_ROLE.into()),
            labels: Some(BTreeMap::from([(
                CREATED_BY_LABEL.to_string(),
                CREATED_BY.to_string(),
            )])),
            ..Default::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["*".into()]),
            resources: Some(vec!["*".into()]),
            verbs: vec!["delete".into()],
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// Why the credential cannot be made (yet).
#[derive(Debug, thiserror::Error)]
pub enum FencerError {
    #[error("applying {what}: {source}")]
    Apply {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("the member's token controller has not filled Secret {namespace}/{TOKEN_SECRET} yet")]
    TokenPending { namespace: String },
}

fn apply_failed(what: &'static str) -> impl FnOnce(kube::Error) -> FencerError {
    move |source| FencerError::Apply { what, source }
}

/// Makes the objects and reads the token once: the credential, or why not yet.
pub async fn make(
    client: &kube::Client,
    target: &FencingTarget,
    namespaces: &Namespaces,
) -> Result<FencingCredential, FencerError> {
    let ns = &target.namespace;
    namespaces
        .ensure(ns)
        .await
        .map_err(apply_failed("the fencing ServiceAccount's namespace"))?;
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let labels = json!({CREATED_BY_LABEL: CREATED_BY});
    let account = json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": SERVICE_ACCOUNT, "namespace": ns, "labels": labels}});
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .patch(SERVICE_ACCOUNT, &apply, &Patch::Apply(&account))
        .await
        .map_err(apply_failed("the fencing ServiceAccount"))?;
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
        "metadata": {"name": TOKEN_SECRET, "namespace": ns, "labels": labels,
                     "annotations": {"kubernetes.io/service-account.name": SERVICE_ACCOUNT}}});
    let secrets = Api::<Secret>::namespaced(client.clone(), ns);
    let token_secret = secrets
        .patch(TOKEN_SECRET, &apply, &Patch::Apply(&secret))
        .await
        .map_err(apply_failed("the fencing token Secret"))?;
    // Created when absent, never changed: an installer that made it (the agent chart, with
    // `delete` on exactly the kinds the agent may place) keeps its narrower rules.
    let roles = Api::<ClusterRole>::all(client.clone());
    if roles
        .get_opt(CLUSTER_ROLE)
        .await
        .map_err(apply_failed("the fencing ClusterRole"))?
        .is_none()
    {
        match roles.create(&PostParams::default(), &cluster_role()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(source) => {
                return Err(FencerError::Apply {
                    what: "the fencing ClusterRole",
                    source,
                });
            }
        }
    }
    let policies = dynamic(
        client,
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
    );
    policies
        .patch(
            ADMISSION_POLICY,
            &apply,
            &Patch::Apply(&admission_policy(ns)),
        )
        .await
        .map_err(apply_failed("the fencing ValidatingAdmissionPolicy"))?;
    let bindings = dynamic(
        client,
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
    );
    bindings
        .patch(
            ADMISSION_POLICY,
            &apply,
            &Patch::Apply(&admission_policy_binding()),
        )
        .await
        .map_err(apply_failed("the fencing ValidatingAdmissionPolicyBinding"))?;
    let token = token_of(&token_secret).ok_or_else(|| FencerError::TokenPending {
        namespace: ns.clone(),
    })?;
    Ok(FencingCredential {
        server: target.server.clone(),
        certificate_authority: target.certificate_authority.clone(),
        token,
    })
}

fn dynamic(client: &kube::Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
        plural,
    );
    Api::all_with(client.clone(), &resource)
}

fn token_of(secret: &Secret) -> Option<String> {
    let ByteString(bytes) = secret.data.as_ref()?.get("token")?;
    String::from_utf8(bytes.clone())
        .ok()
        .filter(|t| !t.is_empty())
}

/// Makes the credential (retrying until it can) and publishes it; keeps it fresh every
/// `refresh` (a deleted token Secret is made again, and its new token sent).
pub async fn provide(
    client: kube::Client,
    target: FencingTarget,
    namespaces: Arc<Namespaces>,
    published: watch::Sender<Option<FencingCredential>>,
    refresh: Duration,
) {
    let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(10));
    loop {
        match make(&client, &target, &namespaces).await {
            Ok(credential) => {
                backoff.reset();
                let changed = published.send_if_modified(|current| {
                    if current.as_ref() == Some(&credential) {
                        false
                    } else {
                        *current = Some(credential.clone());
                        true
                    }
                });
                if changed {
                    tracing::info!(server = %target.server, "fencing credential ready: the hub may delete what it placed here when this agent cannot");
                }
                tokio::time::sleep(refresh).await;
            }
            Err(error) => {
                let wait = backoff.next_delay();
                match error {
                    FencerError::TokenPending { .. } => {
                        tracing::debug!(%error, retry_in = ?wait, "fencing credential not ready")
                    }
                    FencerError::Apply { .. } => {
                        tracing::warn!(%error, retry_in = ?wait, "cannot make the fencing credential")
                    }
                }
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// A DER certificate as PEM.
pub fn pem_of_der(der: &[u8]) -> String {
    use base64::Engine;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in text.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_lets_the_fencer_delete_only_what_lifeboat_placed() {
        let policy = admission_policy("lifeboat-system");
        let spec = &policy["spec"];
        assert_eq!(spec["failurePolicy"], "Fail");
        assert_eq!(
            spec["matchConditions"][0]["expression"],
            "request.userInfo.username == 'system:serviceaccount:lifeboat-system:lifeboat-fencer'"
        );
        let rule = spec["validations"][0]["expression"].as_str().unwrap();
        assert!(rule.contains("request.operation == 'DELETE'"));
        assert!(rule.contains("'work.lifeboat.dev/binding-name' in oldObject.metadata.labels"));
        assert_eq!(
            admission_policy_binding()["spec"]["policyName"],
            ADMISSION_POLICY
        );
    }

    #[test]
    fn the_role_grants_delete_alone_and_is_bound_per_namespace() {
        let role = cluster_role();
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].verbs, vec!["delete".to_string()]);
        let binding = FencerBinding {
            service_account_namespace: "lifeboat-system".into(),
        }
        .role_binding("team-a");
        assert_eq!(binding.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(binding.role_ref.kind, "ClusterRole");
        assert_eq!(binding.role_ref.name, CLUSTER_ROLE);
        let subject = &binding.subjects.unwrap()[0];
        assert_eq!(
            (subject.name.as_str(), subject.namespace.as_deref()),
            (SERVICE_ACCOUNT, Some("lifeboat-system"))
        );
    }

    #[test]
    fn a_der_certificate_becomes_pem_lines_of_64() {
        let pem = pem_of_der(&[0u8; 100]);
        let lines: Vec<&str> = pem.lines().collect();
        assert_eq!(lines[0], "-----BEGIN CERTIFICATE-----");
        assert_eq!(lines.last(), Some(&"-----END CERTIFICATE-----"));
        assert_eq!(lines[1].len(), 64);
        assert_eq!(lines.len(), 5); // 136 base64 characters: 64 + 64 + 8
    }
}
