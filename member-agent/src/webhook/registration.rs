//! Registers the webhook with the apiserver (a MutatingWebhookConfiguration and a
//! ValidatingWebhookConfiguration, applied server-side) and waits until the apiserver actually
//! calls it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use lifeboat_api::appwrapper::AppWrapper;
use lifeboat_api::appwrapper::constants::{GROUP, USER_NAME_LABEL, VERSION};
use serde_json::json;

use super::server::{MUTATE_PATH, VALIDATE_PATH};
use super::{ClientConfigTarget, WebhookEndpoint};
use crate::install::FIELD_MANAGER;

/// Name of the MutatingWebhookConfiguration.
pub const MUTATING_CONFIGURATION: &str = "lifeboat-appwrapper-mutating";
/// Name of the ValidatingWebhookConfiguration.
pub const VALIDATING_CONFIGURATION: &str = "lifeboat-appwrapper-validating";
/// Name of the defaulting webhook (appears in the apiserver's messages).
pub const MUTATING_WEBHOOK: &str = "mappwrapper.lifeboat.dev";
/// Name of the validating webhook (appears in the apiserver's denial messages).
pub const VALIDATING_WEBHOOK: &str = "vappwrapper.lifeboat.dev";
/// The apiserver's timeout for one webhook call.
pub const TIMEOUT_SECONDS: i32 = 10;

const PROBE_NAME: &str = "lifeboat-webhook-probe";
const PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// Why registration failed; names the object or what the probe last saw.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("applying {kind} {name} (server-side apply as {FIELD_MANAGER}): {source}")]
    Apply {
        kind: &'static str,
        name: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("deleting {kind} {name}: {source}")]
    Delete {
        kind: &'static str,
        name: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error(
        "the apiserver did not call the AppWrapper webhooks within {timeout:?} (dry-run probes in namespace {namespace}); last: {last}"
    )]
    NotLive {
        timeout: Duration,
        namespace: String,
        last: String,
    },
}

fn client_config(endpoint: &WebhookEndpoint, path: &str) -> WebhookClientConfig {
    let ca_bundle = Some(ByteString(endpoint.ca_bundle_pem.clone().into_bytes()));
    match &endpoint.target {
        ClientConfigTarget::Url { .. } => WebhookClientConfig {
            ca_bundle,
            url: Some(format!("{}{path}", endpoint.base_url())),
            service: None,
        },
        ClientConfigTarget::Service {
            namespace,
            name,
            port,
        } => WebhookClientConfig {
            ca_bundle,
            url: None,
            service: Some(ServiceReference {
                namespace: namespace.clone(),
                name: name.clone(),
                path: Some(path.to_string()),
                port: Some(i32::from(*port)),
            }),
        },
    }
}

fn rules(operations: &[&str]) -> Option<Vec<RuleWithOperations>> {
    Some(vec![RuleWithOperations {
        api_groups: Some(vec![GROUP.into()]),
        api_versions: Some(vec![VERSION.into()]),
        operations: Some(operations.iter().map(|s| s.to_string()).collect()),
        resources: Some(vec!["appwrappers".into()]),
        scope: Some("Namespaced".into()),
    }])
}

fn metadata(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/managed-by".to_string(),
            FIELD_MANAGER.to_string(),
        )])),
        ..Default::default()
    }
}

/// The defaulting webhook: CREATE of `workload.codeflare.dev/v1beta2 appwrappers`.
pub fn mutating_configuration(endpoint: &WebhookEndpoint) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: metadata(MUTATING_CONFIGURATION),
        webhooks: Some(vec![MutatingWebhook {
            name: MUTATING_WEBHOOK.into(),
            admission_review_versions: vec!["v1".into()],
            client_config: client_config(endpoint, MUTATE_PATH),
            failure_policy: Some("Fail".into()),
            side_effects: "None".into(),
            timeout_seconds: Some(TIMEOUT_SECONDS),
            rules: rules(&["CREATE"]),
            ..Default::default()
        }]),
    }
}

/// The validating webhook: CREATE and UPDATE of `workload.codeflare.dev/v1beta2 appwrappers`.
pub fn validating_configuration(endpoint: &WebhookEndpoint) -> ValidatingWebhookConfiguration {
    ValidatingWebhookConfiguration {
        metadata: metadata(VALIDATING_CONFIGURATION),
        webhooks: Some(vec![ValidatingWebhook {
            name: VALIDATING_WEBHOOK.into(),
            admission_review_versions: vec!["v1".into()],
            client_config: client_config(endpoint, VALIDATE_PATH),
            failure_policy: Some("Fail".into()),
            side_effects: "None".into(),
            timeout_seconds: Some(TIMEOUT_SECONDS),
            rules: rules(&["CREATE", "UPDATE"]),
            ..Default::default()
        }]),
    }
}

/// Creates or updates both webhook configurations for `endpoint`, then waits until the
/// apiserver calls them: a dry-run create of a probe AppWrapper comes back with the user label
/// (defaulting is live) and a dry-run create of an AppWrapper without pods is denied by
/// [`VALIDATING_WEBHOOK`] (validation is live). The AppWrapper CRD must be installed.
pub async fn register(
    client: &kube::Client,
    endpoint: &WebhookEndpoint,
) -> Result<(), RegisterError> {
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    mutating
        .patch(
            MUTATING_CONFIGURATION,
            &apply,
            &Patch::Apply(mutating_configuration(endpoint)),
        )
        .await
        .map_err(|source| RegisterError::Apply {
            kind: "MutatingWebhookConfiguration",
            name: MUTATING_CONFIGURATION,
            source,
        })?;
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    validating
        .patch(
            VALIDATING_CONFIGURATION,
            &apply,
            &Patch::Apply(validating_configuration(endpoint)),
        )
        .await
        .map_err(|source| RegisterError::Apply {
            kind: "ValidatingWebhookConfiguration",
            name: VALIDATING_CONFIGURATION,
            source,
        })?;
    wait_until_live(client, &endpoint.probe_namespace, endpoint.ready_timeout).await
}

/// Deletes both webhook configurations (absent ones are fine). For uninstalling and tests: an
/// agent that stops must not unregister, or AppWrappers would be admitted unchecked meanwhile.
pub async fn unregister(client: &kube::Client) -> Result<(), RegisterError> {
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    ok_if_absent(
        mutating
            .delete(MUTATING_CONFIGURATION, &DeleteParams::default())
            .await,
    )
    .map_err(|source| RegisterError::Delete {
        kind: "MutatingWebhookConfiguration",
        name: MUTATING_CONFIGURATION,
        source,
    })?;
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    ok_if_absent(
        validating
            .delete(VALIDATING_CONFIGURATION, &DeleteParams::default())
            .await,
    )
    .map_err(|source| RegisterError::Delete {
        kind: "ValidatingWebhookConfiguration",
        name: VALIDATING_CONFIGURATION,
        source,
    })
}

fn ok_if_absent<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
        Ok(_) => Ok(()),
    }
}

fn probe(components: serde_json::Value) -> Result<AppWrapper, serde_json::Error> {
    serde_json::from_value(json!({
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {"name": PROBE_NAME},
        "spec": {"components": components}
    }))
}

/// One round of probes: `Ok` when both webhooks answered as ours do.
async fn probe_once(api: &Api<AppWrapper>) -> Result<(), String> {
    let dry_run = PostParams {
        dry_run: true,
        field_manager: Some(FIELD_MANAGER.into()),
    };
    let valid = probe(json!([{"template": {"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": PROBE_NAME},
        "spec": {"containers": [{"name": "probe", "image": "probe"}]}}}]))
    .map_err(|e| e.to_string())?;
    let created = api
        .create(&dry_run, &valid)
        .await
        .map_err(|e| format!("dry-run create of a valid AppWrapper failed: {e}"))?;
    if !created
        .metadata
        .labels
        .is_some_and(|l| l.contains_key(USER_NAME_LABEL))
    {
        return Err(format!(
            "{MUTATING_WEBHOOK} not called yet: the dry-run AppWrapper has no {USER_NAME_LABEL} label"
        ));
    }
    let without_pods = probe(
        json!([{"template": {"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": PROBE_NAME}}}]),
    )
    .map_err(|e| e.to_string())?;
    match api.create(&dry_run, &without_pods).await {
        Err(kube::Error::Api(status))
            if status
                .message
                .contains(&format!("\"{VALIDATING_WEBHOOK}\" denied")) =>
        {
            Ok(())
        }
        Err(e) => Err(format!("dry-run create of an AppWrapper without pods: {e}")),
        Ok(_) => Err(format!(
            "{VALIDATING_WEBHOOK} not called yet: an AppWrapper without pods was accepted"
        )),
    }
}

async fn wait_until_live(
    client: &kube::Client,
    namespace: &str,
    timeout: Duration,
) -> Result<(), RegisterError> {
    let api: Api<AppWrapper> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + timeout;
    loop {
        let last = match probe_once(&api).await {
            Ok(()) => return Ok(()),
            Err(last) => last,
        };
        if Instant::now() >= deadline {
            return Err(RegisterError::NotLive {
                timeout,
                namespace: namespace.to_string(),
                last,
            });
        }
        tracing::debug!(%last, "waiting for the AppWrapper webhooks to be called");
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(target: ClientConfigTarget) -> WebhookEndpoint {
        WebhookEndpoint {
            target,
            ca_bundle_pem: "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n".into(),
            probe_namespace: "default".into(),
            ready_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn url_configurations_as_upstream_with_our_names() {
        let ep = endpoint(ClientConfigTarget::Url {
            host: "127.0.0.1".into(),
            port: Some(9443),
        });
        let m = mutating_configuration(&ep);
        assert_eq!(m.metadata.name.as_deref(), Some(MUTATING_CONFIGURATION));
        let hook = &m.webhooks.as_ref().unwrap()[0];
        assert_eq!(hook.name, MUTATING_WEBHOOK);
        assert_eq!(
            hook.client_config.url.as_deref(),
            Some("https://127.0.0.1:9443/mutate-workload-codeflare-dev-v1beta2-appwrapper")
        );
        assert!(hook.client_config.service.is_none());
        assert_eq!(
            hook.client_config.ca_bundle.as_ref().unwrap().0,
            ep.ca_bundle_pem.as_bytes()
        );
        assert_eq!(hook.failure_policy.as_deref(), Some("Fail"));
        assert_eq!(hook.side_effects, "None");
        assert_eq!(hook.admission_review_versions, vec!["v1"]);
        assert_eq!(hook.timeout_seconds, Some(10));
        let rule = &hook.rules.as_ref().unwrap()[0];
        assert_eq!(rule.operations, Some(vec!["CREATE".to_string()]));
        assert_eq!(
            rule.api_groups,
            Some(vec!["workload.codeflare.dev".to_string()])
        );
        assert_eq!(rule.api_versions, Some(vec!["v1beta2".to_string()]));
        assert_eq!(rule.resources, Some(vec!["appwrappers".to_string()]));

        let v = validating_configuration(&ep);
        assert_eq!(v.metadata.name.as_deref(), Some(VALIDATING_CONFIGURATION));
        let hook = &v.webhooks.as_ref().unwrap()[0];
        assert_eq!(hook.name, VALIDATING_WEBHOOK);
        assert_eq!(
            hook.client_config.url.as_deref(),
            Some("https://127.0.0.1:9443/validate-workload-codeflare-dev-v1beta2-appwrapper")
        );
        assert_eq!(
            hook.rules.as_ref().unwrap()[0].operations,
            Some(vec!["CREATE".to_string(), "UPDATE".to_string()])
        );
        assert_eq!(hook.failure_policy.as_deref(), Some("Fail"));
        assert_eq!(hook.timeout_seconds, Some(10));
    }

    #[test]
    fn service_configurations_reference_the_service() {
        let ep = endpoint(ClientConfigTarget::Service {
            namespace: "lifeboat-system".into(),
            name: "lifeboat-agent-webhook".into(),
            port: 443,
        });
        let v = validating_configuration(&ep);
        let config = &v.webhooks.as_ref().unwrap()[0].client_config;
        assert!(config.url.is_none());
        let service = config.service.as_ref().unwrap();
        assert_eq!(service.namespace, "lifeboat-system");
        assert_eq!(service.name, "lifeboat-agent-webhook");
        assert_eq!(service.port, Some(443));
        assert_eq!(service.path.as_deref(), Some(VALIDATE_PATH));
    }

    #[test]
    fn probes_are_valid_appwrappers() {
        assert!(probe(json!([])).is_ok());
    }
}
