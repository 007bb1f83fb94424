//! A mock API server for unit tests of the exact requests a component makes: a `kube::Client`
//! over a `tower-test` mock service (as kube-rs's `controller-rs` does). The test reads each
//! request the code under test sends and answers it itself.

use std::time::Duration;

pub use http::Method;
use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{self, Handle, SendResponse};

/// The test's side of the mock client.
pub struct ApiServer {
    handle: Handle<Request<Body>, Response<Body>>,
    /// Cluster-wide watches (lists with a label selector) the code starts on the side; they are
    /// left unanswered so that tests see only the calls they are about.
    parked: Vec<SendResponse<Response<Body>>>,
}

/// One request, waiting for its answer.
pub struct Call {
    pub method: Method,
    /// Path and query.
    pub uri: String,
    pub content_type: Option<String>,
    /// The JSON body (`Value::Null` when there is none).
    pub body: Value,
    respond: SendResponse<Response<Body>>,
}

/// How long a test waits for a request it expects.
const WAIT: Duration = Duration::from_secs(5);

impl ApiServer {
    /// Whether no request (other than a watch) arrives within 100 ms or before the client is
    /// dropped.
    pub async fn is_idle(&mut self) -> bool {
        loop {
            match tokio::time::timeout(Duration::from_millis(100), self.handle.next_request()).await
            {
                Err(_) | Ok(None) => return true,
                Ok(Some((request, respond))) if is_watch(&request) => self.parked.push(respond),
                Ok(Some(_)) => return false,
            }
        }
    }

    /// A client whose default namespace is `default`, and its mock server.
    pub fn new() -> (kube::Client, ApiServer) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        (
            kube::Client::new(service, "default"),
            ApiServer {
                handle,
                parked: Vec::new(),
            },
        )
    }

    /// The next request; panics when none arrives within 5 s.
    pub async fn next(&mut self) -> Call {
        let (request, respond) = loop {
            let (request, respond) = tokio::time::timeout(WAIT, self.handle.next_request())
                .await
                .expect("a request in time")
                .expect("the client is alive");
            if is_watch(&request) {
                self.parked.push(respond);
                continue;
            }
            break (request, respond);
        };
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.expect("request body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("a JSON request body")
        };
        Call {
            method: parts.method,
            uri: parts
                .uri
                .path_and_query()
                .map(|p| p.to_string())
                .unwrap_or_default(),
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            body,
            respond,
        }
    }
}

/// A cluster-wide list or watch with a label selector: what the controller's watches send.
fn is_watch(request: &Request<Body>) -> bool {
    request.method() == Method::GET
        && !request.uri().path().contains("/namespaces/")
        && request
            .uri()
            .query()
            .is_some_and(|q| q.contains("labelSelector=") || q.contains("watch="))
}

impl Call {
    /// Asserts the method and the path (query excluded).
    pub fn expect(self, method: Method, path: &str) -> Self {
        let actual = self.uri.split('?').next().unwrap_or_default();
        assert_eq!(
            (&self.method, actual),
            (&method, path),
            "unexpected request {} {}",
            self.method,
            self.uri
        );
        self
    }

    /// Answers with `status` and a JSON body.
    pub fn reply(self, status: u16, body: Value) {
        let body = serde_json::to_vec(&body).expect("serializable reply");
        self.respond_with(status, "application/json", body);
    }

    /// Answers with `status` and a plain-text body (as `/readyz` and `/healthz` do).
    pub fn reply_text(self, status: u16, text: &str) {
        self.respond_with(
            status,
            "text/plain; charset=utf-8",
            text.as_bytes().to_vec(),
        );
    }

    fn respond_with(self, status: u16, content_type: &str, body: Vec<u8>) {
        let response = Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(Body::from(body))
            .expect("a valid response");
        self.respond.send_response(response);
    }

    /// Answers with a Kubernetes `Status` failure, as the API server does.
    pub fn fail(self, code: u16, reason: &str, message: &str) {
        self.reply(
            code,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "code": code, "reason": reason, "message": message}),
        );
    }
}
