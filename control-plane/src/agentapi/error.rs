//! Refusals of the agent API: each becomes a [`ErrorResponse`] JSON body with its HTTP code.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use lifeboat_api::protocol::{ErrorResponse, LEADER_HEADER};

/// Seconds an agent waits before retrying a 503.
pub const RETRY_AFTER_SECONDS: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// No credential, an unknown, revoked or expired one, or its cluster is gone.
    #[error("{0}")]
    Unauthorized(String),
    /// A valid credential used for something it does not cover.
    #[error("{0}")]
    Forbidden(String),
    /// A malformed request: the message names the field and why.
    #[error("{0}")]
    BadRequest(String),
    #[error("the request body exceeds the limit of {limit} bytes")]
    TooLarge { limit: usize },
    /// The request conflicts with the state of the hub (e.g. the Cluster is being deleted).
    #[error("{0}")]
    Conflict(String),
    /// This hub is a standby.
    #[error("this hub is not the leader{}", leader.as_deref().map(|l| format!("; the leader is {l}")).unwrap_or_default())]
    NotLeader { leader: Option<String> },
    /// A transient failure (the apiserver, the status processor, caches still loading).
    #[error("{0}")]
    Unavailable(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::NotLeader { .. } | ApiError::Unavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    /// The CamelCase reason of the body.
    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::Unauthorized(_) => "Unauthorized",
            ApiError::Forbidden(_) => "Forbidden",
            ApiError::BadRequest(_) => "BadRequest",
            ApiError::TooLarge { .. } => "RequestEntityTooLarge",
            ApiError::Conflict(_) => "Conflict",
            ApiError::NotLeader { .. } => "NotLeader",
            ApiError::Unavailable(_) => "ServiceUnavailable",
        }
    }

    pub fn body(&self) -> ErrorResponse {
        ErrorResponse {
            code: self.status().as_u16(),
            reason: self.reason().to_string(),
            message: self.to_string(),
        }
    }

    pub(crate) fn from_kube(what: &str, error: kube::Error) -> ApiError {
        ApiError::Unavailable(format!("{what}: {error}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), axum::Json(self.body())).into_response();
        if self.status() == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        if let ApiError::NotLeader {
            leader: Some(leader),
        } = &self
            && let Ok(value) = HeaderValue::from_str(leader)
        {
            response.headers_mut().insert(LEADER_HEADER, value);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_names_the_leader_and_asks_for_a_retry() {
        let response = ApiError::NotLeader {
            leader: Some("https://hub-0.lifeboat-system:8443".into()),
        }
        .into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        assert_eq!(
            response.headers()[LEADER_HEADER],
            "https://hub-0.lifeboat-system:8443"
        );
        let unknown = ApiError::NotLeader { leader: None }.into_response();
        assert!(unknown.headers().get(LEADER_HEADER).is_none());
    }

    #[test]
    fn refusals_carry_code_and_reason() {
        let body = ApiError::TooLarge { limit: 10 }.body();
        assert_eq!(
            (body.code, body.reason.as_str()),
            (413, "RequestEntityTooLarge")
        );
        assert!(body.message.contains("10 bytes"));
        assert_eq!(ApiError::Forbidden("x".into()).body().code, 403);
        assert_eq!(ApiError::Unauthorized("x".into()).body().code, 401);
    }
}
