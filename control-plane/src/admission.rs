//! The hub's admission webhook: a `ResourceInterpreterCustomization` whose scripts do not
//! compile is refused at the API (create and update), naming each script's field and the Lua
//! error with its line, instead of being accepted and only logged when the hub loads it.
//!
//! Scripts are compiled, never run (compiling a Lua chunk runs none of its code), on a runtime
//! of the webhook's own so that checks never touch the status processor's states. A CEL rule
//! in the CRD could not do this: CEL cannot parse Lua. What the API schema already checks
//! (types, required fields) is not repeated.
//!
//! [`check`] and [`review`] are pure; [`serve`] is the HTTPS edge (the shared
//! [`TlsListener`](lifeboat_runtime::tls_listener::TlsListener), the certificate from
//! [`lifeboat_tls::source`]) and [`register`] applies the ValidatingWebhookConfiguration and
//! waits until the apiserver calls it.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration,
};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::{StatusCause, StatusDetails, StatusSummary};
use lifeboat_api::config::ResourceInterpreterCustomization as CustomizationObject;
use lifeboat_interpreter::{
    Operation as ScriptOperation, ResourceInterpreterCustomization, RunError, Runtime,
    RuntimeConfig, Script,
};
use lifeboat_runtime::webhook::{ClientConfigTarget, WebhookEndpoint, points_at};
use lifeboat_tls::source::{CertificateSource, Certificates};

/// Path of the validating webhook.
pub const VALIDATE_PATH: &str =
    "/validate-config-lifeboat-dev-v1alpha1-resourceinterpretercustomization";
/// Liveness path (plain `ok`).
pub const HEALTHZ_PATH: &str = "/healthz";
/// Default name of the ValidatingWebhookConfiguration (`--webhook-configuration`; the chart
/// names it after its release).
pub const CONFIGURATION: &str = "lifeboat-hub-customizations";
/// Name of the webhook (appears in the apiserver's denial messages).
pub const WEBHOOK: &str = "vcustomization.lifeboat.dev";
/// Field manager of the registration.
pub const FIELD_MANAGER: &str = "lifeboat-hub/webhook";
/// The apiserver's timeout for one call.
pub const TIMEOUT_SECONDS: i32 = 10;
/// Request bodies are limited to this (an UPDATE carries two objects of up to etcd's 1.5 MiB).
pub const MAX_REVIEW_BYTES: usize = 8 * 1024 * 1024;
/// Name of the dry-run probe.
const PROBE_NAME: &str = "lifeboat-hub-webhook-probe";

/// What the apiserver does when the webhook cannot be called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Admit unchecked: customizations can be edited while no hub runs; a script that does
    /// not compile then still shows at runtime (Event on the customization, the hub's log).
    Ignore,
    /// Refuse: no customization can be created or changed while no hub serves the webhook.
    Fail,
}

impl FailurePolicy {
    pub fn as_str(&self) -> &'static str {
        match self {
            FailurePolicy::Ignore => "Ignore",
            FailurePolicy::Fail => "Fail",
        }
    }
}

impl std::str::FromStr for FailurePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "Ignore" => Ok(FailurePolicy::Ignore),
            "Fail" => Ok(FailurePolicy::Fail),
            other => Err(format!("`{other}` is not Ignore or Fail")),
        }
    }
}

/// How to serve and register the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookOptions {
    pub bind: SocketAddr,
    pub target: ClientConfigTarget,
    pub failure_policy: FailurePolicy,
    /// The Secret (in the hub namespace) of the CA the certificate is issued from: the hub's
    /// CA, the agent API's.
    pub ca_secret: String,
    /// Name of the ValidatingWebhookConfiguration.
    pub configuration: String,
}

/// Binds the webhook (its certificate issued from the hub's CA; a failure here stops the hub),
/// serves it for the life of the process on every replica, and registers it in the
/// background: applied, then confirmed by a dry-run probe (retried until it works, logged).
pub async fn start(
    options: &WebhookOptions,
    client: &kube::Client,
    namespace: &str,
) -> Result<(), WebhookError> {
    let ca = CertificateSource::CaSecret {
        namespace: Some(namespace.to_string()),
        name: options.ca_secret.clone(),
    };
    let webhook = Webhook::bind(options, ca, client).await?;
    let endpoint = webhook.endpoint().clone();
    tracing::info!(addr = %options.bind, url = %endpoint.base_url(), "serving the customization webhook");
    tokio::spawn(webhook.serve(
        client.clone(),
        options.configuration.clone(),
        options.failure_policy,
        std::future::pending::<()>(),
    ));
    let client = client.clone();
    let policy = options.failure_policy;
    let name = options.configuration.clone();
    tokio::spawn(async move {
        let mut retry = Duration::from_secs(1);
        loop {
            match register(&client, &name, &endpoint, policy).await {
                Ok(()) => {
                    tracing::info!(configuration = %name, failure_policy = policy.as_str(), "customization webhook registered and live");
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, retry_in = ?retry, "registering the customization webhook failed");
                    tokio::time::sleep(retry).await;
                    retry = (retry * 2).min(Duration::from_secs(30));
                }
            }
        }
    });
    Ok(())
}

/// What is wrong with a customization: `field: reason` for each script that does not compile
/// (empty: admit). The object comes as the API stores it.
pub fn check(object: &serde_json::Value, runtime: &Runtime) -> Vec<String> {
    let customization: ResourceInterpreterCustomization =
        match serde_json::from_value(object.clone()) {
            Ok(c) => c,
            Err(e) => return vec![format!("spec: {e}")],
        };
    if let Err(e) = customization.validate() {
        return vec![e.to_string()];
    }
    let name = &customization.metadata.name;
    let mut problems = Vec::new();
    for operation in customization.spec.customizations.operations() {
        let source = customization
            .spec
            .customizations
            .script(operation)
            .unwrap_or_default();
        let script = Script::new(
            format!("{name}/{}", operation.customization_field()),
            source,
        );
        if let Err(error) = runtime.check_compiles(&script) {
            let message = match error {
                RunError::Compile(message) => message,
                other => other.to_string(),
            };
            problems.push(format!(
                "{}: the {} script does not compile: {message}",
                script_field(operation),
                operation
            ));
        }
    }
    problems
}

/// `spec.customizations.<field>.luaScript`.
pub fn script_field(operation: ScriptOperation) -> String {
    format!(
        "spec.customizations.{}.luaScript",
        operation.customization_field()
    )
}

/// Why a request is not a review this webhook can answer (a 400).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MalformedRequest {
    #[error("the body is not a JSON AdmissionReview: {0}")]
    NotAReview(String),
    #[error("the AdmissionReview has no `request`")]
    NoRequest,
    #[error("this webhook reviews ResourceInterpreterCustomizations, not {0}")]
    WrongKind(String),
}

/// The answer to an `admission.k8s.io/v1` AdmissionReview body.
pub fn review(
    body: &[u8],
    runtime: &Runtime,
) -> Result<AdmissionReview<DynamicObject>, MalformedRequest> {
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_slice(body).map_err(|e| MalformedRequest::NotAReview(e.to_string()))?;
    let request: AdmissionRequest<DynamicObject> =
        review.try_into().map_err(|_| MalformedRequest::NoRequest)?;
    let kind = &request.kind;
    if kind.group != lifeboat_api::config::GROUP || kind.kind != "ResourceInterpreterCustomization"
    {
        return Err(MalformedRequest::WrongKind(format!(
            "{}/{} {}",
            kind.group, kind.version, kind.kind
        )));
    }
    let response = AdmissionResponse::from(&request);
    let object = match (&request.operation, &request.object) {
        (Operation::Create | Operation::Update, Some(object)) => object,
        _ => return Ok(response.into_review()),
    };
    let value =
        serde_json::to_value(object).map_err(|e| MalformedRequest::NotAReview(e.to_string()))?;
    let problems = check(&value, runtime);
    if problems.is_empty() {
        return Ok(response.into_review());
    }
    let name = object.metadata.name.clone().unwrap_or_default();
    tracing::info!(customization = %name, problems = %problems.join("; "), "ResourceInterpreterCustomization refused");
    let mut denied = response.deny(format!(
        "ResourceInterpreterCustomization {name}: {}",
        problems.join("; ")
    ));
    denied.result.status = Some(StatusSummary::Failure);
    denied.result.code = 422;
    denied.result.reason = "Invalid".into();
    denied.result.details = Some(StatusDetails {
        name,
        group: lifeboat_api::config::GROUP.into(),
        kind: "resourceinterpretercustomizations".into(),
        uid: String::new(),
        retry_after_seconds: 0,
        causes: problems
            .iter()
            .map(|p| {
                let (field, message) = p.split_once(": ").unwrap_or(("spec", p.as_str()));
                StatusCause {
                    reason: "FieldValueInvalid".into(),
                    message: message.into(),
                    field: field.into(),
                }
            })
            .collect(),
    });
    Ok(denied.into_review())
}

/// The webhook's routes.
pub fn router(runtime: Arc<Runtime>) -> Router {
    Router::new()
        .route(VALIDATE_PATH, post(validate))
        .route(HEALTHZ_PATH, get(|| async { "ok" }))
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
        .with_state(runtime)
}

async fn validate(State(runtime): State<Arc<Runtime>>, body: Bytes) -> Response {
    // Compiling is CPU work: off the executor's threads.
    let answer = tokio::task::spawn_blocking(move || review(&body, &runtime)).await;
    match answer {
        Ok(Ok(review)) => axum::Json(review).into_response(),
        Ok(Err(error)) => {
            tracing::warn!(%error, "malformed admission request");
            (
                StatusCode::BAD_REQUEST,
                format!("malformed admission request: {error}\n"),
            )
                .into_response()
        }
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reviewing the request failed: {error}\n"),
        )
            .into_response(),
    }
}

/// Why the webhook could not start or register.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("the webhook's serving certificate: {0}")]
    Certificate(#[from] lifeboat_tls::source::CertificateError),
    #[error("the webhook's TLS configuration: {0}")]
    Tls(#[from] lifeboat_tls::TlsError),
    #[error("binding the webhook server to {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("applying ValidatingWebhookConfiguration {name}: {source}")]
    Apply {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "the apiserver did not call the customization webhook within {timeout:?}; last: {last}"
    )]
    NotLive { timeout: Duration, last: String },
}

/// A bound webhook server, not yet serving.
pub struct Webhook {
    listener: lifeboat_runtime::tls_listener::TlsListener,
    certificates: Certificates,
    endpoint: WebhookEndpoint,
}

impl Webhook {
    /// Issues the serving certificate from the CA in `ca` (the hub's CA Secret) for the
    /// target's names and binds the port.
    pub async fn bind(
        options: &WebhookOptions,
        ca: CertificateSource,
        client: &kube::Client,
    ) -> Result<Webhook, WebhookError> {
        let certificates = Certificates::prepare(
            &ca,
            &options.target.certificate_names(),
            client,
            "lifeboat-hub-ca",
            "lifeboat-hub",
        )
        .await?;
        let acceptor = tokio_rustls::TlsAcceptor::from(
            certificates
                .resolver()
                .server_config(vec![b"http/1.1".to_vec()])?,
        );
        let tcp = tokio::net::TcpListener::bind(options.bind)
            .await
            .map_err(|source| WebhookError::Bind {
                addr: options.bind,
                source,
            })?;
        let local = tcp.local_addr().map_err(|source| WebhookError::Bind {
            addr: options.bind,
            source,
        })?;
        let target = match &options.target {
            ClientConfigTarget::Url { host, port } => ClientConfigTarget::Url {
                host: host.clone(),
                port: Some(port.unwrap_or(local.port())),
            },
            other => other.clone(),
        };
        let endpoint = WebhookEndpoint {
            target,
            ca_bundle_pem: certificates.resolver().current().ca_bundle_pem,
            probe_namespace: String::new(),
            ready_timeout: Duration::from_secs(60),
        };
        Ok(Webhook {
            listener: lifeboat_runtime::tls_listener::TlsListener::new(
                tcp,
                acceptor,
                "customization webhook",
            ),
            certificates,
            endpoint,
        })
    }

    pub fn endpoint(&self) -> &WebhookEndpoint {
        &self.endpoint
    }

    /// Serves until `shutdown`, keeping the certificate current and the registration's CA
    /// bundle with it (when the registration points at this webhook).
    pub async fn serve(
        self,
        client: kube::Client,
        name: String,
        failure_policy: FailurePolicy,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) {
        use futures::FutureExt;
        let shutdown = shutdown.boxed().shared();
        let runtime = Arc::new(Runtime::new(RuntimeConfig {
            pool_size: 2,
            ..Default::default()
        }));
        let mut changes = self.certificates.resolver().subscribe();
        let mut endpoint = self.endpoint.clone();
        let follow = {
            let shutdown = shutdown.clone();
            async move {
                let mut shutdown = std::pin::pin!(shutdown);
                loop {
                    tokio::select! {
                        _ = &mut shutdown => return,
                        changed = changes.changed() => {
                            if changed.is_err() {
                                return;
                            }
                            let bundle = changes.borrow_and_update().ca_bundle_pem.clone();
                            if bundle == endpoint.ca_bundle_pem {
                                continue;
                            }
                            endpoint.ca_bundle_pem = bundle;
                            match update_ca_bundle(&client, &name, &endpoint, failure_policy).await {
                                Ok(true) => tracing::info!("customization webhook: the registration has the new CA bundle"),
                                Ok(false) => {}
                                Err(error) => tracing::warn!(%error, "customization webhook: updating the CA bundle failed"),
                            }
                        }
                    }
                }
            }
        };
        let serving =
            axum::serve(self.listener, router(runtime)).with_graceful_shutdown(shutdown.clone());
        tokio::join!(
            async {
                if let Err(error) = serving.await {
                    tracing::error!(%error, "customization webhook stopped");
                }
            },
            self.certificates.keep_current(shutdown.clone()),
            follow,
        );
    }
}

/// The registration: CREATE and UPDATE of ResourceInterpreterCustomizations.
pub fn configuration(
    name: &str,
    endpoint: &WebhookEndpoint,
    failure_policy: FailurePolicy,
) -> ValidatingWebhookConfiguration {
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "lifeboat-hub".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        webhooks: Some(vec![ValidatingWebhook {
            name: WEBHOOK.into(),
            admission_review_versions: vec!["v1".into()],
            client_config: endpoint.client_config(VALIDATE_PATH),
            failure_policy: Some(failure_policy.as_str().into()),
            side_effects: "None".into(),
            timeout_seconds: Some(TIMEOUT_SECONDS),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![lifeboat_api::config::GROUP.into()]),
                api_versions: Some(vec![lifeboat_api::config::VERSION.into()]),
                operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                resources: Some(vec!["resourceinterpretercustomizations".into()]),
                scope: Some("Cluster".into()),
            }]),
            ..Default::default()
        }]),
    }
}

/// Applies the registration for `endpoint`, then waits until the apiserver calls the webhook:
/// a dry-run create of a customization whose script does not compile is denied by it.
pub async fn register(
    client: &kube::Client,
    name: &str,
    endpoint: &WebhookEndpoint,
    failure_policy: FailurePolicy,
) -> Result<(), WebhookError> {
    apply(client, name, endpoint, failure_policy).await?;
    let api: Api<CustomizationObject> = Api::all(client.clone());
    let probe: CustomizationObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "config.lifeboat.dev/v1alpha1",
        "kind": "ResourceInterpreterCustomization",
        "metadata": {"name": PROBE_NAME},
        "spec": {
            "target": {"apiVersion": "lifeboat.dev/v1", "kind": "WebhookProbe"},
            "customizations": {"healthInterpretation": {"luaScript": "function InterpretHealth(obj) return ( end"}}
        }
    }))
    .map_err(|e| WebhookError::NotLive {
        timeout: Duration::ZERO,
        last: e.to_string(),
    })?;
    let dry_run = PostParams {
        dry_run: true,
        field_manager: Some(FIELD_MANAGER.into()),
    };
    let deadline = Instant::now() + endpoint.ready_timeout;
    loop {
        let last = match api.create(&dry_run, &probe).await {
            Err(kube::Error::Api(status))
                if status.message.contains(&format!("\"{WEBHOOK}\" denied")) =>
            {
                return Ok(());
            }
            Err(e) => e.to_string(),
            Ok(_) => "a customization that does not compile was admitted".to_string(),
        };
        if Instant::now() > deadline {
            return Err(WebhookError::NotLive {
                timeout: endpoint.ready_timeout,
                last,
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn apply(
    client: &kube::Client,
    name: &str,
    endpoint: &WebhookEndpoint,
    failure_policy: FailurePolicy,
) -> Result<(), WebhookError> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(configuration(name, endpoint, failure_policy)),
    )
    .await
    .map_err(|source| WebhookError::Apply {
        name: name.to_string(),
        source,
    })?;
    Ok(())
}

/// Re-applies the registration with `endpoint`'s CA bundle if it points at this webhook (a
/// registration that sends the apiserver elsewhere is another replica's or the chart's).
async fn update_ca_bundle(
    client: &kube::Client,
    name: &str,
    endpoint: &WebhookEndpoint,
    failure_policy: FailurePolicy,
) -> Result<bool, WebhookError> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let registered = api
        .get_opt(name)
        .await
        .map_err(|source| WebhookError::Apply {
            name: name.to_string(),
            source,
        })?;
    let ours = endpoint.client_config(VALIDATE_PATH);
    let points_here = registered
        .iter()
        .flat_map(|c| c.webhooks.iter().flatten())
        .any(|w| points_at(&w.client_config, &ours));
    if points_here {
        apply(client, name, endpoint, failure_policy).await?;
    }
    Ok(points_here)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn runtime() -> Runtime {
        Runtime::new(RuntimeConfig::default())
    }

    fn customization(customizations: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "config.lifeboat.dev/v1alpha1",
            "kind": "ResourceInterpreterCustomization",
            "metadata": {"name": "widgets"},
            "spec": {"target": {"apiVersion": "example.com/v1", "kind": "Widget"},
                     "customizations": customizations}
        })
    }

    #[test]
    fn every_script_that_does_not_compile_is_named_with_its_line() {
        let object = customization(json!({
            "healthInterpretation": {"luaScript": "function InterpretHealth(obj)\n  return (\nend"},
            "statusReflection": {"luaScript": "function ReflectStatus(obj) return obj.status end"},
            "replicaResource": {"luaScript": "function GetReplicas(obj)\n\n  local = 1\nend"},
        }));
        let problems = check(&object, &runtime());
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].starts_with(
                "spec.customizations.replicaResource.luaScript: the InterpretReplica script does not compile: widgets/replicaResource:3:"
            ) || problems[1].starts_with(
                "spec.customizations.replicaResource.luaScript: the InterpretReplica script does not compile: widgets/replicaResource:3:"
            ),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("spec.customizations.healthInterpretation.luaScript: the InterpretHealth script does not compile: widgets/healthInterpretation:3:")),
            "{problems:?}"
        );
        // scripts are compiled, never run: a script that would loop at run time is admitted
        let looping = customization(json!({
            "healthInterpretation": {"luaScript": "while true do end\nfunction InterpretHealth(obj) return true end"}
        }));
        assert!(check(&looping, &runtime()).is_empty());
    }

    fn review_body(operation: &str, object: serde_json::Value) -> Vec<u8> {
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u1",
                "kind": {"group": "config.lifeboat.dev", "version": "v1alpha1", "kind": "ResourceInterpreterCustomization"},
                "resource": {"group": "config.lifeboat.dev", "version": "v1alpha1", "resource": "resourceinterpretercustomizations"},
                "name": "widgets",
                "operation": operation,
                "userInfo": {"username": "u"},
                "object": object,
                "oldObject": null,
                "dryRun": false
            }
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn reviews_deny_with_the_fields_and_allow_good_scripts() {
        let bad = customization(json!({
            "healthInterpretation": {"luaScript": "function InterpretHealth(obj) return ( end"}
        }));
        let answer =
            serde_json::to_value(review(&review_body("CREATE", bad), &runtime()).unwrap()).unwrap();
        let response = &answer["response"];
        assert_eq!(response["allowed"], false);
        assert_eq!(response["uid"], "u1");
        let message = response["status"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("ResourceInterpreterCustomization widgets: spec.customizations.healthInterpretation.luaScript: the InterpretHealth script does not compile: widgets/healthInterpretation:1:"),
            "{message}"
        );
        assert_eq!(
            response["status"]["details"]["causes"][0]["field"],
            "spec.customizations.healthInterpretation.luaScript"
        );
        let good = customization(json!({
            "healthInterpretation": {"luaScript": "function InterpretHealth(obj) return true end"}
        }));
        let answer =
            serde_json::to_value(review(&review_body("UPDATE", good), &runtime()).unwrap())
                .unwrap();
        assert_eq!(answer["response"]["allowed"], true);
        assert!(matches!(
            review(b"{oops", &runtime()),
            Err(MalformedRequest::NotAReview(_))
        ));
    }

    #[test]
    fn the_registration_covers_create_and_update_with_the_policy() {
        let endpoint = WebhookEndpoint {
            target: ClientConfigTarget::Url {
                host: "127.0.0.1".into(),
                port: Some(9444),
            },
            ca_bundle_pem: "CA".into(),
            probe_namespace: String::new(),
            ready_timeout: Duration::from_secs(1),
        };
        let config = configuration(CONFIGURATION, &endpoint, FailurePolicy::Ignore);
        let webhook = &config.webhooks.unwrap()[0];
        assert_eq!(webhook.failure_policy.as_deref(), Some("Ignore"));
        assert_eq!(
            webhook.client_config.url.as_deref(),
            Some(&*format!("https://127.0.0.1:9444{VALIDATE_PATH}"))
        );
        let rule = &webhook.rules.as_ref().unwrap()[0];
        assert_eq!(
            rule.operations.as_ref().unwrap(),
            &vec!["CREATE".to_string(), "UPDATE".to_string()]
        );
        assert_eq!("Fail".parse::<FailurePolicy>(), Ok(FailurePolicy::Fail));
        assert!("fail".parse::<FailurePolicy>().is_err());
    }
}
