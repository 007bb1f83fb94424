//! Registers the webhook with the apiserver (a MutatingWebhookConfiguration and a
//! ValidatingWebhookConfiguration, applied server-side) and waits until the apiserver actually
//! calls it.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use lifeboat_api::appwrapper::AppWrapper;
use lifeboat_api::appwrapper::constants::{GROUP, USER_NAME_LABEL, VERSION};
use lifeboat_runtime::webhook::points_at;
use lifeboat_tls::ServingCertificate;
use serde_json::json;

use super::WebhookEndpoint;
use super::server::{AdmissionMetrics, MUTATE_PATH, VALIDATE_PATH};
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
    #[error("reading {kind} {name}: {source}")]
    Get {
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
    endpoint.client_config(path)
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
    apply_configurations(client, endpoint).await?;
    wait_until_live(client, &endpoint.probe_namespace, endpoint.ready_timeout).await
}

/// Creates or updates both webhook configurations for `endpoint` (server-side apply; replicas
/// with the same endpoint and CA apply the same content).
pub async fn apply_configurations(
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
    Ok(())
}

/// Retries of a failed re-registration back off up to this.
const MAX_RETRY: Duration = Duration::from_secs(30);

/// Applies the configurations with `endpoint`'s CA bundle if they point at `endpoint` (the
/// webhook this process serves); configurations that send the apiserver elsewhere (another
/// agent, or none registered) are left alone. `Ok(true)` when applied.
pub async fn update_ca_bundle(
    client: &kube::Client,
    endpoint: &WebhookEndpoint,
) -> Result<bool, RegisterError> {
    let get_error = |kind, name| move |source| RegisterError::Get { kind, name, source };
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get_opt(MUTATING_CONFIGURATION)
        .await
        .map_err(get_error(
            "MutatingWebhookConfiguration",
            MUTATING_CONFIGURATION,
        ))?;
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get_opt(VALIDATING_CONFIGURATION)
        .await
        .map_err(get_error(
            "ValidatingWebhookConfiguration",
            VALIDATING_CONFIGURATION,
        ))?;
    let ours_mutating = client_config(endpoint, MUTATE_PATH);
    let ours_validating = client_config(endpoint, VALIDATE_PATH);
    let ours = mutating
        .iter()
        .flat_map(|c| c.webhooks.iter().flatten())
        .any(|w| points_at(&w.client_config, &ours_mutating))
        || validating
            .iter()
            .flat_map(|c| c.webhooks.iter().flatten())
            .any(|w| points_at(&w.client_config, &ours_validating));
    if ours {
        apply_configurations(client, endpoint).await?;
    }
    Ok(ours)
}

/// Follows the served certificate until `shutdown`: records its expiry in the metrics and, when
/// its CA bundle changes, gives the configurations that point at this webhook the new bundle
/// ([`update_ca_bundle`], retried with backoff until it succeeds or the bundle changes again),
/// so the apiserver keeps trusting the webhook after a CA rotation.
pub async fn follow_certificate(
    client: kube::Client,
    mut endpoint: WebhookEndpoint,
    mut changes: tokio::sync::watch::Receiver<ServingCertificate>,
    metrics: AdmissionMetrics,
    shutdown: impl Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut retry = None::<Duration>;
    loop {
        let wait = async {
            match retry {
                Some(after) => tokio::time::sleep(after).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut shutdown => return,
            changed = changes.changed() => {
                if changed.is_err() {
                    return; // the certificate keeper is gone: nothing will change any more
                }
                let current = changes.borrow_and_update().clone();
                metrics.certificate_served(&current);
                if current.ca_bundle_pem == endpoint.ca_bundle_pem {
                    continue;
                }
                endpoint.ca_bundle_pem = current.ca_bundle_pem;
                retry = Some(Duration::ZERO);
            }
            _ = wait => {}
        }
        if let Some(after) = retry {
            match update_ca_bundle(&client, &endpoint).await {
                Ok(applied) => {
                    retry = None;
                    if applied {
                        tracing::info!("webhook configurations updated with the new CA bundle");
                    } else {
                        tracing::info!(
                            "the webhook configurations point elsewhere; CA bundle left to their owner"
                        );
                    }
                }
                Err(error) => {
                    let next = (after * 2).clamp(Duration::from_secs(1), MAX_RETRY);
                    tracing::warn!(%error, retry_in = ?next, "updating the webhook configurations' CA bundle failed");
                    retry = Some(next);
                }
            }
        }
    }
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
    use crate::webhook::ClientConfigTarget;
    use k8s_openapi::ByteString;

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

    /// A fake apiserver holding both configurations as registered for `registered`; it
    /// answers GETs with them and sends every PATCH (path, body) to `patches`.
    fn admission_apiserver(
        registered: &WebhookEndpoint,
        patches: tokio::sync::mpsc::UnboundedSender<(String, String)>,
    ) -> kube::Client {
        let mutating = serde_json::to_vec(&mutating_configuration(registered)).unwrap();
        let validating = serde_json::to_vec(&validating_configuration(registered)).unwrap();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let (mutating, validating, patches) =
                (mutating.clone(), validating.clone(), patches.clone());
            async move {
                let path = request.uri().path().to_string();
                let method = request.method().clone();
                let body = request.into_body().collect_bytes().await?.to_vec();
                let answer = if method == http::Method::PATCH {
                    let _ = patches.send((path, String::from_utf8_lossy(&body).into_owned()));
                    body
                } else if path.ends_with(MUTATING_CONFIGURATION) {
                    mutating
                } else {
                    validating
                };
                Ok::<_, kube::Error>(http::Response::new(kube::client::Body::from(answer)))
            }
        });
        kube::Client::new(service, "default")
    }

    fn url_endpoint(port: u16, ca: &str) -> WebhookEndpoint {
        WebhookEndpoint {
            ca_bundle_pem: ca.into(),
            ..endpoint(ClientConfigTarget::Url {
                host: "127.0.0.1".into(),
                port: Some(port),
            })
        }
    }

    #[tokio::test]
    async fn a_new_ca_bundle_is_applied_only_to_configurations_that_point_at_us() {
        let (tx, mut patches) = tokio::sync::mpsc::unbounded_channel();
        let client = admission_apiserver(&url_endpoint(9443, "old"), tx);

        // another agent's configurations are left alone
        assert!(
            !update_ca_bundle(&client, &url_endpoint(9444, "new"))
                .await
                .unwrap()
        );
        assert!(patches.try_recv().is_err());

        // ours get the new bundle, both of them
        assert!(
            update_ca_bundle(&client, &url_endpoint(9443, "new"))
                .await
                .unwrap()
        );
        let mut patched = Vec::new();
        while let Ok((path, body)) = patches.try_recv() {
            let object: serde_json::Value = serde_json::from_str(&body).unwrap();
            let bundle = &object["webhooks"][0]["clientConfig"]["caBundle"];
            // "new", base64
            assert_eq!(bundle, "bmV3", "{path}");
            patched.push(path.rsplit('/').next().unwrap_or_default().to_string());
        }
        assert_eq!(
            patched,
            vec![MUTATING_CONFIGURATION, VALIDATING_CONFIGURATION]
        );
    }

    #[tokio::test]
    async fn a_ca_change_of_the_served_certificate_is_registered() {
        use lifeboat_tls::{CertificateAuthority, ReloadingResolver, Validity};
        let issue = |name: &str| {
            let ca = CertificateAuthority::generate(
                name,
                Validity::starting_now(Duration::from_secs(3600)),
            )
            .unwrap();
            ca.serving_certificate(
                "127.0.0.1",
                &["127.0.0.1".into()],
                Validity::starting_now(Duration::from_secs(600)),
            )
            .unwrap()
        };
        let first = issue("first");
        let resolver = ReloadingResolver::new(first.clone()).unwrap();
        let registered = url_endpoint(9443, &first.ca_bundle_pem);
        let (tx, mut patches) = tokio::sync::mpsc::unbounded_channel();
        let client = admission_apiserver(&registered, tx);
        let registry = prometheus::Registry::new();
        let metrics = AdmissionMetrics::register(&registry).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let following = tokio::spawn(follow_certificate(
            client,
            registered,
            resolver.subscribe(),
            metrics,
            async {
                let _ = stopped.await;
            },
        ));

        // a renewal from the same CA changes no configuration
        let renewed = lifeboat_tls::ServingCertificate {
            ca_bundle_pem: first.ca_bundle_pem.clone(),
            ..issue("first-again")
        };
        resolver.update(renewed, "renewal").unwrap();
        // a new CA does
        let second = issue("second");
        resolver.update(second.clone(), "new CA").unwrap();
        let (path, body) = tokio::time::timeout(Duration::from_secs(10), patches.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(path.ends_with(MUTATING_CONFIGURATION), "{path}");
        let object: serde_json::Value = serde_json::from_str(&body).unwrap();
        let bundle: ByteString =
            serde_json::from_value(object["webhooks"][0]["clientConfig"]["caBundle"].clone())
                .unwrap();
        assert_eq!(bundle.0, second.ca_bundle_pem.as_bytes());
        let (path, _) = patches.recv().await.unwrap();
        assert!(path.ends_with(VALIDATING_CONFIGURATION), "{path}");
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), following)
            .await
            .unwrap()
            .unwrap();
        // exactly one re-registration: the renewal from the same CA made none
        assert!(patches.try_recv().is_err());
        let expiry = registry
            .gather()
            .into_iter()
            .find(|f| f.name() == "lifeboat_agent_webhook_certificate_expiration_timestamp_seconds")
            .map(|f| f.get_metric()[0].get_gauge().get_value())
            .unwrap_or_default();
        let not_after = second.leaf_info().unwrap().not_after;
        assert_eq!(
            expiry,
            not_after
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs_f64()
        );
    }
}
