//! Errors of the local fleet. Each names the step that failed and, where there is one, the fix.

use std::path::{Path, PathBuf};

use lifeboat_runtime::kube_error::KubeError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("generating certificates: {0}")]
    Pki(#[from] lifeboat_tls::TlsError),
    #[error(
        "Kubernetes binary {name} not found in {dir}; build them with `e2e/k8s/build.sh` (or `make k8s-bins`), or set LIFEBOAT_K8S_BIN_DIR"
    )]
    MissingBinary { name: String, dir: PathBuf },
    #[error(
        "Lifeboat binary {name} not found in {dir}; build it with `cargo build -p lifeboat-hub -p lifeboat-agent`, or set LIFEBOAT_BIN_DIR"
    )]
    MissingLifeboatBinary { name: String, dir: PathBuf },
    #[error("running e2e/k8s/build.sh --print-dir: {0}")]
    BinDir(String),
    #[error(
        "{component} of cluster {cluster} failed to start: {reason}\n--- last lines of {log} ---\n{tail}"
    )]
    ComponentStart {
        cluster: String,
        component: String,
        reason: String,
        log: PathBuf,
        tail: String,
    },
    #[error("cluster {cluster} not ready after {seconds}s: {waiting_for}")]
    NotReady {
        cluster: String,
        seconds: u64,
        waiting_for: String,
    },
    #[error("no free loopback port: {0}")]
    Port(std::io::Error),
    #[error("kubernetes API call ({context}): {0}", context = .0.context())]
    Kube(#[source] KubeError),
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig { path: PathBuf, reason: String },
    #[error("fleet state {path}: {reason}")]
    State { path: PathBuf, reason: String },
    #[error("no cluster named {0} in the fleet")]
    UnknownCluster(String),
    #[error("{0}")]
    Invalid(String),
    #[error("timed out after {seconds}s waiting for {what}")]
    Timeout { what: String, seconds: u64 },
    #[error("signal to process {pid}: {source}")]
    Signal {
        pid: i32,
        #[source]
        source: nix::Error,
    },
}

impl Error {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube(KubeError::new(context.into(), source))
    }
}
