//! `lifeboat-runtime`: what every Lifeboat controller process needs besides its reconcilers,
//! shared by the member agent and the hub.
//!
//! - [`cache`]: a reflector store kept current by a watch (backoff, readiness, a per-event
//!   callback).
//! - [`client`]: the Kubernetes client from a kubeconfig, else inferred.
//! - [`crd`]: install or update a CustomResourceDefinition at start and wait until it is served.
//! - [`duration`]: Go `time.ParseDuration` syntax, which Kubernetes flags and AppWrapper
//!   annotations use.
//! - [`http`]: `/healthz`, `/readyz` and `/metrics`.
//! - [`kube_error`]: a failed Kubernetes API call with its context, and its metric label.
//! - [`leader`]: leader election on a `coordination.k8s.io/v1` Lease (one replica acts, the
//!   others keep their caches warm and take over when the lease lapses or is released).
//! - [`shutdown`]: a future that resolves on Ctrl-C or SIGTERM.
//! - [`queue`]: a de-duplicating work queue with delayed adds (one due time per key).
//! - [`readiness`]: whether every watch has synced its initial list (`/readyz`).
//! - [`tls_listener`]: TLS connections for axum, handshakes concurrent and bounded in time.
//! - [`watch`]: the backoff of watches: retried within a second, a `410 Expired` re-listed at once.
//! - [`webhook`]: where an apiserver calls an admission webhook and its `clientConfig`.
//! - `leader::flags` (feature `clap`): the leader-election flags of every binary.
//! - `mock` (feature `mock`): a mock `kube::Client` for unit tests of exact API calls.

pub mod cache;
pub mod client;
pub mod crd;
pub mod duration;
pub mod http;
pub mod kube_error;
pub mod leader;
#[cfg(any(test, feature = "mock"))]
pub mod mock;
pub mod queue;
pub mod readiness;
pub mod shutdown;
pub mod tls_listener;
pub mod watch;
pub mod webhook;
