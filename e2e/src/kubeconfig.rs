//! Kubeconfig files for the fleet's clusters and clients built from them.

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::error::{Error, Result};
use crate::pki::CertFiles;

/// Writes a kubeconfig with one cluster, one user (a client certificate) and one context.
pub fn write(
    path: &Path,
    cluster: &str,
    server: &str,
    ca: &Path,
    user: &CertFiles,
) -> Result<PathBuf> {
    let credentials = format!(
        "client-certificate: {}\n    client-key: {}",
        user.cert.display(),
        user.key.display()
    );
    write_one(
        path,
        cluster,
        server,
        ca,
        &format!("{cluster}-admin"),
        &credentials,
        None,
    )
}

/// Writes a kubeconfig with one cluster, one user authenticated by a bearer `token` (e.g. a
/// ServiceAccount's) and one context whose namespace is `namespace`.
pub fn write_token(
    path: &Path,
    cluster: &str,
    server: &str,
    ca: &Path,
    (user, token): (&str, &str),
    namespace: &str,
) -> Result<PathBuf> {
    let credentials = format!("token: {token}");
    write_one(
        path,
        cluster,
        server,
        ca,
        user,
        &credentials,
        Some(namespace),
    )
}

fn write_one(
    path: &Path,
    cluster: &str,
    server: &str,
    ca: &Path,
    user: &str,
    credentials: &str,
    namespace: Option<&str>,
) -> Result<PathBuf> {
    let namespace = namespace
        .map(|n| format!("\n    namespace: {n}"))
        .unwrap_or_default();
    let contents = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {cluster}
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {user}
  user:
    {credentials}
contexts:
- name: {cluster}
  context:
    cluster: {cluster}
    user: {user}{namespace}
current-context: {cluster}
",
        ca = ca.display(),
    );
    std::fs::write(path, contents).map_err(|e| Error::io(path, e))?;
    Ok(path.to_path_buf())
}

/// A client for the cluster described by a kubeconfig file.
pub async fn client(path: &Path) -> Result<kube::Client> {
    let config = config(path).await?;
    kube::Client::try_from(config)
        .map_err(|e| Error::kube(format!("client for {}", path.display()), e))
}

/// The kube-rs configuration of a kubeconfig file (for callers that tune timeouts).
pub async fn config(path: &Path) -> Result<kube::Config> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kubeconfig {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}
