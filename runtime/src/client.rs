//! The Kubernetes client of a Lifeboat process: from an explicit kubeconfig, else inferred
//! (in-cluster, then `~/.kube/config`).

use std::path::Path;

/// Why no client could be made. Names the kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig { path: String, reason: String },
    #[error("creating the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
}

/// A client for the cluster `kubeconfig` points at (`None`: inferred).
pub async fn from_kubeconfig(kubeconfig: Option<&Path>) -> Result<kube::Client, ClientError> {
    let config = config_from_kubeconfig(kubeconfig).await?;
    kube::Client::try_from(config).map_err(ClientError::Client)
}

/// The client configuration [`from_kubeconfig`] builds its client from (the server URL and CA
/// are in it).
pub async fn config_from_kubeconfig(
    kubeconfig: Option<&Path>,
) -> Result<kube::Config, ClientError> {
    Ok(match kubeconfig {
        Some(path) => {
            let failed = |reason: String| ClientError::Kubeconfig {
                path: path.display().to_string(),
                reason,
            };
            let kc =
                kube::config::Kubeconfig::read_from(path).map_err(|e| failed(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| failed(e.to_string()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| ClientError::Kubeconfig {
                path: "(inferred)".into(),
                reason: e.to_string(),
            })?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_kubeconfig_is_named() {
        let path = Path::new("/nonexistent/lifeboat/kubeconfig");
        match from_kubeconfig(Some(path)).await {
            Err(ClientError::Kubeconfig { path: named, .. }) => {
                assert_eq!(named, path.display().to_string())
            }
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("a client from a missing kubeconfig"),
        }
    }
}
