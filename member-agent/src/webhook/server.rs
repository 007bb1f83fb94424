//! The HTTPS side: the axum router (AdmissionReview v1 in, AdmissionReview out), the TLS
//! listener, and the admission counter.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use lifeboat_tls::ServingCertificate;
use prometheus::{Gauge, IntCounterVec, Opts, Registry};

use super::access::{AccessLimits, Authorizer, validate_create_with_access};
use super::admission::{
    MalformedRequest, Subject, Verdict, mutate, operation_label, parse_review, respond, subject,
    update_verdict,
};
use crate::config::AppWrapperConfig;

/// Path of the mutating (defaulting) webhook, as upstream.
pub const MUTATE_PATH: &str = "/mutate-workload-codeflare-dev-v1beta2-appwrapper";
/// Path of the validating webhook, as upstream.
pub const VALIDATE_PATH: &str = "/validate-workload-codeflare-dev-v1beta2-appwrapper";
/// Liveness path (plain `ok`).
pub const HEALTHZ_PATH: &str = "/healthz";

/// Request bodies are limited to this size (axum's default would be 2 MiB, too little): an
/// UPDATE review carries two objects of up to ~1.5 MiB each (etcd's limit) plus the envelope.
/// A larger body is refused with 413 before it is parsed.
pub const MAX_REVIEW_BYTES: usize = 8 * 1024 * 1024;

/// `appwrapper_admission_total{operation, allowed}`: verdicts of the validating webhook;
/// `lifeboat_agent_webhook_certificate_expiration_timestamp_seconds`: when the certificate
/// served now expires (alert on it if rotation stops).
#[derive(Clone)]
pub struct AdmissionMetrics {
    total: IntCounterVec,
    certificate_expiration: Gauge,
}

impl AdmissionMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let total = IntCounterVec::new(
            Opts::new(
                "appwrapper_admission_total",
                "AppWrapper admission verdicts of the validating webhook, by operation \
                 (CREATE, UPDATE) and verdict",
            ),
            &["operation", "allowed"],
        )?;
        registry.register(Box::new(total.clone()))?;
        let certificate_expiration = Gauge::new(
            "lifeboat_agent_webhook_certificate_expiration_timestamp_seconds",
            "When the webhook's serving certificate expires (Unix time)",
        )?;
        registry.register(Box::new(certificate_expiration.clone()))?;
        Ok(Self {
            total,
            certificate_expiration,
        })
    }

    /// Records the expiry of the certificate served now.
    pub fn certificate_served(&self, certificate: &ServingCertificate) {
        match certificate.leaf_info() {
            Ok(info) => self.certificate_expiration.set(
                info.not_after
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0),
            ),
            Err(error) => tracing::warn!(%error, "reading the served certificate's expiry"),
        }
    }

    fn record(&self, operation: &str, allowed: bool) {
        self.total
            .with_label_values(&[operation, if allowed { "true" } else { "false" }])
            .inc();
    }
}

/// What the handlers share.
pub struct WebhookState<A> {
    pub authorizer: A,
    pub config: Arc<AppWrapperConfig>,
    pub metrics: AdmissionMetrics,
    /// Bounds on the apiserver calls of the RBAC check.
    pub limits: AccessLimits,
}

/// The webhook's routes: the two admission paths (POST) and `/healthz`.
pub fn router<A: Authorizer>(state: Arc<WebhookState<A>>) -> Router {
    Router::new()
        .route(MUTATE_PATH, post(mutate_handler::<A>))
        .route(VALIDATE_PATH, post(validate_handler::<A>))
        .route(HEALTHZ_PATH, get(|| async { "ok" }))
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
        .with_state(state)
}

fn bad_request(error: MalformedRequest) -> Response {
    tracing::warn!(%error, "malformed admission request");
    (
        StatusCode::BAD_REQUEST,
        format!("malformed admission request: {error}\n"),
    )
        .into_response()
}

fn review_response(review: impl serde::Serialize) -> Response {
    axum::Json(review).into_response()
}

async fn mutate_handler<A: Authorizer>(
    State(state): State<Arc<WebhookState<A>>>,
    body: Bytes,
) -> Response {
    let request = match parse_review(&body) {
        Ok(request) => request,
        Err(e) => return bad_request(e),
    };
    match mutate(&request, &state.config.default_queue_name) {
        Ok(response) => review_response(response.into_review()),
        Err(e) => bad_request(e),
    }
}

async fn validate_handler<A: Authorizer>(
    State(state): State<Arc<WebhookState<A>>>,
    body: Bytes,
) -> Response {
    let request = match parse_review(&body) {
        Ok(request) => request,
        Err(e) => return bad_request(e),
    };
    let verdict = match subject(&request) {
        Err(Err(malformed)) => return bad_request(malformed),
        Err(Ok(undecodable)) => undecodable,
        Ok(Subject::Create(aw)) => {
            validate_create_with_access(
                &request,
                &aw,
                state.config.user_rbac_admission_check,
                &state.authorizer,
                &state.limits,
            )
            .await
        }
        Ok(Subject::Update { old, new }) => update_verdict(&old, &new),
        Ok(Subject::Other) => Verdict::default(),
    };
    let operation = operation_label(&request);
    state.metrics.record(operation, verdict.allowed());
    let response = respond(&request, &verdict);
    if !response.allowed {
        tracing::info!(
            operation,
            namespace = request.namespace.as_deref().unwrap_or_default(),
            name = %request.name,
            user = request.user_info.username.as_deref().unwrap_or_default(),
            reason = %response.result.message,
            "AppWrapper rejected"
        );
    }
    review_response(response.into_review())
}

/// The webhook's TLS listener (shared with the hub's HTTPS servers).
pub use lifeboat_runtime::tls_listener::TlsListener;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhook::access::tests::FakeAuthorizer;
    use crate::webhook::admission::tests::{
        LIMITED_UID, appwrapper, deployment_component, pod_component, review_body,
    };
    use axum::body::Body;
    use axum::http::Request;
    use serde_json::{Value, json};
    use tower::ServiceExt;

    fn app(allowed: &[&str]) -> (Router, Registry) {
        let registry = Registry::new();
        let state = Arc::new(WebhookState {
            authorizer: FakeAuthorizer::new(allowed),
            config: Arc::new(AppWrapperConfig {
                default_queue_name: "system-default-queue".into(),
                ..Default::default()
            }),
            metrics: AdmissionMetrics::register(&registry).unwrap(),
            limits: Default::default(),
        });
        (router(state), registry)
    }

    async fn call(app: &Router, path: &str, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
        let response = app
            .clone()
            .oneshot(
                Request::post(path)
                    .header("content-type", "application/json")
                    .body(Body::from(body))
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, bytes.to_vec())
    }

    fn counter(registry: &Registry, operation: &str, allowed: &str) -> u64 {
        registry
            .gather()
            .iter()
            .filter(|f| f.name() == "appwrapper_admission_total")
            .flat_map(|f| f.get_metric().to_vec())
            .filter(|m| {
                let labels: Vec<_> = m
                    .get_label()
                    .iter()
                    .map(|l| (l.name().to_string(), l.value().to_string()))
                    .collect();
                labels.contains(&("operation".into(), operation.into()))
                    && labels.contains(&("allowed".into(), allowed.into()))
            })
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }

    #[tokio::test]
    async fn mutating_path_returns_a_patched_review() {
        let (app, _) = app(&["pods"]);
        let object = appwrapper(json!({}), vec![pod_component("p")]);
        let (status, body) = call(&app, MUTATE_PATH, review_body("CREATE", object, None)).await;
        assert_eq!(status, StatusCode::OK);
        let review: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(review["kind"], "AdmissionReview");
        assert_eq!(review["response"]["uid"], "req-1");
        assert_eq!(review["response"]["allowed"], true);
        assert_eq!(review["response"]["patchType"], "JSONPatch");
        // kube serialises the patch bytes as a JSON array of numbers, which the apiserver's
        // decoder reads into its []byte just like base64.
        let bytes: Vec<u8> = serde_json::from_value(review["response"]["patch"].clone()).unwrap();
        let patch: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(patch[0]["op"], "add");
        assert_eq!(
            patch[0]["path"],
            "/metadata/labels/kueue.x-k8s.io~1queue-name"
        );
        assert_eq!(patch[0]["value"], "system-default-queue");
    }

    #[tokio::test]
    async fn validating_path_denies_with_fields_and_counts_verdicts() {
        let (app, registry) = app(&["pods"]);
        let ok = appwrapper(json!({}), vec![pod_component("p")]);
        let (status, body) = call(&app, VALIDATE_PATH, review_body("CREATE", ok, None)).await;
        assert_eq!(status, StatusCode::OK);
        let review: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(review["response"]["allowed"], true);

        let denied = appwrapper(json!({}), vec![deployment_component(1)]);
        let (status, body) = call(&app, VALIDATE_PATH, review_body("CREATE", denied, None)).await;
        assert_eq!(status, StatusCode::OK);
        let review: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(review["response"]["allowed"], false);
        assert_eq!(review["response"]["status"]["code"], 403);
        assert_eq!(
            review["response"]["status"]["message"],
            "spec.components[0].template: User limited-user is not authorized to create \
             deployments.apps in team"
        );
        assert_eq!(
            review["response"]["status"]["details"]["causes"][0]["field"],
            "spec.components[0].template"
        );

        let old = appwrapper(
            json!({"workload.codeflare.dev/userid": LIMITED_UID}),
            vec![],
        );
        let mut new = old.clone();
        new["metadata"]["labels"]["workload.codeflare.dev/userid"] = json!("x");
        let (_, body) = call(&app, VALIDATE_PATH, review_body("UPDATE", new, Some(old))).await;
        let review: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            review["response"]["status"]["message"],
            "metadata.labels[workload.codeflare.dev/userid]: attempt to change immutable field"
        );

        assert_eq!(counter(&registry, "CREATE", "true"), 1);
        assert_eq!(counter(&registry, "CREATE", "false"), 1);
        assert_eq!(counter(&registry, "UPDATE", "false"), 1);
    }

    #[tokio::test]
    async fn malformed_requests_get_400_with_the_reason() {
        let (app, registry) = app(&[]);
        for path in [MUTATE_PATH, VALIDATE_PATH] {
            let (status, body) = call(&app, path, b"{not json".to_vec()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST);
            let text = String::from_utf8(body).unwrap();
            assert!(
                text.starts_with(
                    "malformed admission request: the body is not a JSON AdmissionReview"
                ),
                "{text}"
            );

            let no_request =
                json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
            let (status, body) = call(&app, path, serde_json::to_vec(&no_request).unwrap()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert!(
                String::from_utf8(body)
                    .unwrap()
                    .contains("has no `request`")
            );

            let (status, body) = call(&app, path, review_body("CREATE", Value::Null, None)).await;
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert!(
                String::from_utf8(body)
                    .unwrap()
                    .contains("request.object is missing")
            );
        }
        // no verdict was counted for requests that were not judged
        assert!(
            registry
                .gather()
                .iter()
                .filter(|f| f.name() == "appwrapper_admission_total")
                .all(|f| f.get_metric().is_empty())
        );

        let response = app
            .clone()
            .oneshot(Request::get(VALIDATE_PATH).body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
        let huge = vec![b' '; MAX_REVIEW_BYTES + 1];
        let (status, _) = call(&app, VALIDATE_PATH, huge).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[tokio::test]
    async fn healthz_answers_ok() {
        let (app, _) = app(&[]);
        let response = app
            .clone()
            .oneshot(Request::get(HEALTHZ_PATH).body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = axum::body::to_bytes(response.into_body(), 16)
            .await
            .unwrap();
        assert_eq!(&body[..], b"ok");
    }

    #[test]
    fn the_counter_cannot_be_registered_twice() {
        let registry = Registry::new();
        AdmissionMetrics::register(&registry).unwrap();
        assert!(AdmissionMetrics::register(&registry).is_err());
    }
}
