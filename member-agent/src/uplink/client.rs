//! The HTTPS client of the hub's agent API (`lifeboat_api::protocol`): JSON calls with a
//! deadline each, and the work stream as a long-lived GET read chunk by chunk.
//!
//! Built on hyper-util's pooled client and hyper-rustls (rustls with the `ring` provider), both
//! already in the build through kube's client. HTTPS only: the hub's certificate must chain to
//! `--hub-ca-file`, or to the platform's trust store without it.
//!
//! Several hub URLs may be given: the client talks to one at a time. A connection failure moves
//! to the next URL; a `503` naming the leader in [`LEADER_HEADER`] moves to that URL at once (a
//! standby hub redirects its agents); a `503` without it moves to the next URL.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER, USER_AGENT};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use lifeboat_api::protocol::{API_PREFIX, ErrorResponse, LEADER_HEADER, MAX_BODY_BYTES, WorkEvent};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::metrics::HubMetrics;
use super::ndjson::{FrameError, LineFramer, MAX_LINE_BYTES};

/// How long a pooled connection to the hub may sit idle before the client closes it.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(20);

/// How many times one call follows a standby's leader header before giving up.
const MAX_LEADER_HOPS: usize = 3;

/// One failed call; each variant has a metric label.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    #[error("{call}: unauthorized: {message}")]
    Unauthorized { call: &'static str, message: String },
    #[error("{call}: forbidden: {message}")]
    Forbidden { call: &'static str, message: String },
    #[error("{call}: the hub at {url} is not the leader")]
    NotLeader {
        call: &'static str,
        url: String,
        retry_after: Option<Duration>,
    },
    #[error("{call}: the hub answered {code} {reason}: {message}")]
    Rejected {
        call: &'static str,
        code: u16,
        reason: String,
        message: String,
    },
    #[error("{call}: {url}: {reason}")]
    Transport {
        call: &'static str,
        url: String,
        reason: String,
    },
    #[error("{call}: {url}: no answer within {timeout:?}")]
    Timeout {
        call: &'static str,
        url: String,
        timeout: Duration,
    },
    #[error("{call}: unreadable answer: {reason}")]
    BadResponse { call: &'static str, reason: String },
}

impl CallError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            CallError::Unauthorized { .. } => "unauthorized",
            CallError::Forbidden { .. } => "forbidden",
            CallError::NotLeader { .. } => "not_leader",
            CallError::Rejected { code, .. } if *code >= 500 => "server_error",
            CallError::Rejected { .. } => "rejected",
            CallError::Transport { .. } => "transport",
            CallError::Timeout { .. } => "timeout",
            CallError::BadResponse { .. } => "bad_response",
        }
    }

    /// The credential is not (or no longer) valid: register again.
    pub fn is_unauthorized(&self) -> bool {
        matches!(self, CallError::Unauthorized { .. })
    }

    /// How long the hub asked to wait, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            CallError::NotLeader { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// Why the client cannot be built; names the flag.
#[derive(Debug, thiserror::Error)]
pub enum ClientSetupError {
    #[error("--hub-url: {0}")]
    Url(String),
    #[error("--hub-ca-file {path}: {reason}")]
    Ca { path: String, reason: String },
    #[error("no CA certificate in the platform's trust store; give --hub-ca-file")]
    NoSystemRoots,
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
}

/// A hub URL as the client uses it: `https://host[:port][/path]`, without a trailing slash or
/// the API prefix (paths add it).
pub fn normalize_url(text: &str) -> Result<String, String> {
    let text = text.trim();
    let uri: Uri = text
        .parse()
        .map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if uri.scheme_str() != Some("https") {
        return Err(format!("{text:?} must be an https:// URL"));
    }
    if uri.authority().is_none() {
        return Err(format!("{text:?} has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("{text:?} must not have a query"));
    }
    let trimmed = text.trim_end_matches('/');
    let trimmed = trimmed.strip_suffix(API_PREFIX).unwrap_or(trimmed);
    Ok(trimmed.trim_end_matches('/').to_string())
}

/// The TLS configuration: trust `ca_pem` (PEM certificates) or, without it, the platform's
/// trust store.
pub fn tls_config(ca_pem: Option<(&str, &[u8])>) -> Result<rustls::ClientConfig, ClientSetupError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_pem {
        Some((path, pem)) => {
            let fail = |reason: String| ClientSetupError::Ca {
                path: path.to_string(),
                reason,
            };
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| fail(format!("not PEM: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| fail(format!("not a usable CA certificate: {e}")))?;
            }
            if roots.is_empty() {
                return Err(fail("holds no certificate".into()));
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            for cert in native.certs {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(ClientSetupError::NoSystemRoots);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[derive(Debug)]
struct Endpoints {
    configured: Vec<String>,
    /// Index into `configured` of the URL in use, unless a leader header moved elsewhere.
    index: usize,
    /// The URL in use.
    current: String,
}

impl Endpoints {
    fn rotate(&mut self) {
        self.index = (self.index + 1) % self.configured.len().max(1);
        if let Some(url) = self.configured.get(self.index) {
            self.current = url.clone();
        }
    }
}

/// The hub's agent API.
pub struct HubClient {
    http: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    endpoints: Mutex<Endpoints>,
    timeout: Duration,
    metrics: HubMetrics,
}

impl std::fmt::Debug for HubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubClient")
            .field("url", &self.current_url())
            .finish_non_exhaustive()
    }
}

impl HubClient {
    /// `urls` are normalised hub URLs (at least one); `timeout` bounds every call (connect,
    /// answer, body) except the work stream's body.
    pub fn new(
        urls: Vec<String>,
        tls: rustls::ClientConfig,
        timeout: Duration,
        metrics: HubMetrics,
    ) -> Result<Self, ClientSetupError> {
        let first = urls
            .first()
            .cloned()
            .ok_or_else(|| ClientSetupError::Url("at least one hub URL is needed".into()))?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(timeout));
        http.set_nodelay(true);
        http.set_keepalive(Some(Duration::from_secs(30)));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .wrap_connector(http);
        // Idle pooled connections go before the hub's header-read timeout (30 s by default)
        // closes them: a request never races the hub closing its connection.
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .build(https);
        Ok(Self {
            http,
            endpoints: Mutex::new(Endpoints {
                configured: urls,
                index: 0,
                current: first,
            }),
            timeout,
            metrics,
        })
    }

    /// The hub URL in use.
    pub fn current_url(&self) -> String {
        self.lock().current.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Endpoints> {
        self.endpoints.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// POSTs `body` as JSON and reads the JSON answer.
    pub async fn post<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        call: &'static str,
        path: &str,
        token: &str,
        body: &Req,
    ) -> Result<Resp, CallError> {
        let result = self.post_inner(call, path, token, body).await;
        self.count(call, &result);
        result
    }

    async fn post_inner<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        call: &'static str,
        path: &str,
        token: &str,
        body: &Req,
    ) -> Result<Resp, CallError> {
        let body = serde_json::to_vec(body).map_err(|e| CallError::BadResponse {
            call,
            reason: format!("encoding the request: {e}"),
        })?;
        let (response, url) = self
            .send(call, Method::POST, path, token, Bytes::from(body))
            .await?;
        let status = response.status();
        let bytes = self.read_body(call, &url, response).await?;
        if !status.is_success() {
            return Err(failure(call, status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| CallError::BadResponse {
            call,
            reason: e.to_string(),
        })
    }

    /// Opens the work stream at `path_and_query`.
    pub async fn open_stream(
        &self,
        path_and_query: &str,
        token: &str,
        idle_timeout: Duration,
    ) -> Result<WorkStream, CallError> {
        let call = "work";
        let result = async {
            let (response, url) = self
                .send(call, Method::GET, path_and_query, token, Bytes::new())
                .await?;
            let status = response.status();
            if !status.is_success() {
                let bytes = self.read_body(call, &url, response).await?;
                return Err(failure(call, status, &bytes));
            }
            Ok(WorkStream {
                body: response.into_body(),
                framer: LineFramer::new(MAX_LINE_BYTES),
                idle_timeout,
            })
        }
        .await;
        self.count(call, &result);
        result
    }

    fn count<T>(&self, call: &'static str, result: &Result<T, CallError>) {
        let label = match result {
            Ok(_) => "ok",
            Err(e) => e.metric_label(),
        };
        self.metrics
            .requests
            .with_label_values(&[call, label])
            .inc();
    }

    async fn read_body(
        &self,
        call: &'static str,
        url: &str,
        response: Response<Incoming>,
    ) -> Result<Bytes, CallError> {
        let limited = Limited::new(response.into_body(), MAX_BODY_BYTES);
        match tokio::time::timeout(self.timeout, limited.collect()).await {
            Ok(Ok(collected)) => Ok(collected.to_bytes()),
            Ok(Err(e)) => Err(CallError::Transport {
                call,
                url: url.to_string(),
                reason: format!("reading the answer: {e}"),
            }),
            Err(_) => Err(CallError::Timeout {
                call,
                url: url.to_string(),
                timeout: self.timeout,
            }),
        }
    }

    /// Sends one request, moving between hub URLs as connection failures and standby answers
    /// say. Returns the answer (any status but 503) and the URL that gave it.
    async fn send(
        &self,
        call: &'static str,
        method: Method,
        path: &str,
        token: &str,
        body: Bytes,
    ) -> Result<(Response<Incoming>, String), CallError> {
        let configured = self.lock().configured.len();
        let mut connect_failures = 0;
        let mut hops = 0;
        loop {
            let url = self.current_url();
            let request = Request::builder()
                .method(method.clone())
                .uri(format!("{url}{path}"))
                .header(AUTHORIZATION, format!("Bearer {token}"))
                .header(CONTENT_TYPE, "application/json")
                .header(
                    ACCEPT,
                    if method == Method::GET {
                        "application/x-ndjson, application/json"
                    } else {
                        "application/json"
                    },
                )
                .header(
                    USER_AGENT,
                    concat!("lifeboat-agent/", env!("CARGO_PKG_VERSION")),
                )
                .body(Full::new(body.clone()))
                .map_err(|e| CallError::Transport {
                    call,
                    url: url.clone(),
                    reason: format!("building the request: {e}"),
                })?;
            let error = match tokio::time::timeout(self.timeout, self.http.request(request)).await {
                Ok(Ok(response)) if response.status() == StatusCode::SERVICE_UNAVAILABLE => {
                    let leader = response
                        .headers()
                        .get(LEADER_HEADER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| normalize_url(v).ok())
                        .filter(|leader| *leader != url);
                    let retry_after = response
                        .headers()
                        .get(RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(Duration::from_secs);
                    match leader {
                        Some(leader) if hops < MAX_LEADER_HOPS => {
                            hops += 1;
                            tracing::info!(from = %url, to = %leader, "the hub is a standby: following it to the leader");
                            self.lock().current = leader;
                            continue;
                        }
                        _ => {
                            self.lock().rotate();
                            return Err(CallError::NotLeader {
                                call,
                                url,
                                retry_after,
                            });
                        }
                    }
                }
                Ok(Ok(response)) => return Ok((response, url)),
                Ok(Err(e)) => CallError::Transport {
                    call,
                    url: url.clone(),
                    reason: error_chain(&e),
                },
                Err(_) => CallError::Timeout {
                    call,
                    url: url.clone(),
                    timeout: self.timeout,
                },
            };
            // Unreachable: try the next URL, each configured one once per call.
            self.lock().rotate();
            connect_failures += 1;
            if connect_failures >= configured {
                return Err(error);
            }
            tracing::debug!(%error, "trying the next hub URL");
        }
    }
}

/// The error of a non-success answer, from its Kubernetes-like Status body when it has one.
fn failure(call: &'static str, status: StatusCode, body: &[u8]) -> CallError {
    let parsed: Option<ErrorResponse> = serde_json::from_slice(body).ok();
    let message = parsed
        .as_ref()
        .map(|e| e.message.clone())
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned());
    match status {
        StatusCode::UNAUTHORIZED => CallError::Unauthorized { call, message },
        StatusCode::FORBIDDEN => CallError::Forbidden { call, message },
        _ => CallError::Rejected {
            call,
            code: status.as_u16(),
            reason: parsed
                .map(|e| e.reason)
                .unwrap_or_else(|| status.canonical_reason().unwrap_or("").to_string()),
            message,
        },
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

/// Why the work stream ended.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("no line for {0:?}")]
    Idle(Duration),
    #[error("reading the work stream: {0}")]
    Read(String),
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// An open work stream.
pub struct WorkStream {
    body: Incoming,
    framer: LineFramer,
    idle_timeout: Duration,
}

impl WorkStream {
    /// The events of the next chunk (possibly none), or `Ok(None)` when the hub ended the
    /// stream. A line cut off by the end is dropped.
    pub async fn next(&mut self) -> Result<Option<Vec<WorkEvent>>, StreamError> {
        loop {
            let frame = match tokio::time::timeout(self.idle_timeout, self.body.frame()).await {
                Err(_) => return Err(StreamError::Idle(self.idle_timeout)),
                Ok(None) => {
                    if self.framer.pending() > 0 {
                        tracing::debug!(
                            bytes = self.framer.pending(),
                            "work stream ended mid-line"
                        );
                    }
                    return Ok(None);
                }
                Ok(Some(Err(e))) => return Err(StreamError::Read(error_chain(&e))),
                Ok(Some(Ok(frame))) => frame,
            };
            if let Ok(data) = frame.into_data() {
                return Ok(Some(self.framer.push(&data)?));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_https_without_trailing_slash_or_api_prefix() {
        assert_eq!(
            normalize_url("https://hub.example:8443/").as_deref(),
            Ok("https://hub.example:8443")
        );
        assert_eq!(
            normalize_url("https://hub.example/apis/agent.lifeboat.dev/v1").as_deref(),
            Ok("https://hub.example")
        );
        assert_eq!(
            normalize_url(" https://10.0.0.1:9443/prefix ").as_deref(),
            Ok("https://10.0.0.1:9443/prefix")
        );
        for bad in [
            "http://hub.example",
            "hub.example",
            "https://",
            "https://h/?x=1",
            "",
        ] {
            assert!(normalize_url(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn endpoints_rotate_through_the_configured_urls() {
        let mut e = Endpoints {
            configured: vec!["https://a".into(), "https://b".into()],
            index: 0,
            current: "https://a".into(),
        };
        e.rotate();
        assert_eq!(e.current, "https://b");
        // After following a leader elsewhere, a failure goes back to the configured list.
        e.current = "https://leader".into();
        e.rotate();
        assert_eq!(e.current, "https://a");
    }

    #[test]
    fn failures_map_to_call_errors() {
        let body = br#"{"code":401,"reason":"Unauthorized","message":"unknown token"}"#;
        let err = failure("heartbeat", StatusCode::UNAUTHORIZED, body);
        assert!(err.is_unauthorized());
        assert_eq!(err.to_string(), "heartbeat: unauthorized: unknown token");
        let err = failure("status", StatusCode::PAYLOAD_TOO_LARGE, b"too big");
        assert_eq!(err.metric_label(), "rejected");
        assert_eq!(
            err.to_string(),
            "status: the hub answered 413 Payload Too Large: too big"
        );
        let err = failure("status", StatusCode::INTERNAL_SERVER_ERROR, b"");
        assert_eq!(err.metric_label(), "server_error");
        assert_eq!(
            failure("work", StatusCode::FORBIDDEN, b"{}").metric_label(),
            "forbidden"
        );
    }

    #[test]
    fn a_ca_file_must_hold_a_certificate() {
        let err = tls_config(Some(("ca.pem", b"nothing here"))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--hub-ca-file ca.pem: holds no certificate"
        );
        let ca = lifeboat_tls::CertificateAuthority::generate(
            "hub",
            lifeboat_tls::Validity::starting_now(std::time::Duration::from_secs(3600)),
        )
        .expect("cert");
        let pem = ca.cert_pem();
        assert!(tls_config(Some(("ca.pem", pem.as_bytes()))).is_ok());
    }
}
