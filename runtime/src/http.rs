//! The operational endpoints every Lifeboat process serves: `/healthz` (the process serves),
//! `/readyz` (every watch has synced its initial list: 503 naming those that have not) and
//! `/metrics` (Prometheus text).

use std::sync::Arc;

use axum::http::StatusCode;
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};

use crate::readiness::Readiness;

/// The router of `/healthz`, `/readyz` and `/metrics`.
pub fn router(registry: Registry, readiness: Readiness) -> axum::Router {
    let registry = Arc::new(registry);
    axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let pending = readiness.pending();
                async move {
                    if pending.is_empty() {
                        (StatusCode::OK, "ok".to_string())
                    } else {
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("watches not synced yet: {}", pending.join(", ")),
                        )
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move {
                    let mut out = Vec::new();
                    let _ = TextEncoder::new().encode(&registry.gather(), &mut out);
                    String::from_utf8(out).unwrap_or_default()
                }
            }),
        )
}
