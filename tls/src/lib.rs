//! The one home for Lifeboat's certificates: generate a CA, issue serving certificates (DNS
//! names, IP addresses) and client certificates (CN, O) from it, read PEM material, serve it
//! through a rustls [`ResolvesServerCert`](rustls::server::ResolvesServerCert) that can be
//! swapped while the server runs, and keep a CA in a Kubernetes Secret so that replicas and
//! restarts share it.
//!
//! Pure parts ([`authority`], [`pem`], [`renewal`]) do no IO; [`files`] reads files and
//! [`secret`] is the Kubernetes edge.
//!
//! ```
//! use lifeboat_tls::{CertificateAuthority, ReloadingResolver, Validity};
//! use std::time::Duration;
//! let ca = CertificateAuthority::generate("example-ca", Validity::starting_now(Duration::from_secs(3600)))?;
//! let serving = ca.serving_certificate("127.0.0.1", &["127.0.0.1".into()], Validity::starting_now(Duration::from_secs(600)))?;
//! let resolver = ReloadingResolver::new(serving)?;
//! let config = resolver.server_config(vec![b"http/1.1".to_vec()])?; // for a tokio_rustls::TlsAcceptor
//! // later: resolver.update(new_serving)? and the next handshake presents the new certificate
//! # let _ = config;
//! # Ok::<(), lifeboat_tls::TlsError>(())
//! ```

pub mod authority;
pub mod client;
pub mod files;
pub mod pem;
pub mod renewal;
pub mod resolver;
pub mod secret;
mod serving;
pub mod source;

pub use authority::{
    CertificateAuthority, IssuedCertificate, KeyPairPem, Validity, generate_key_pair,
};
pub use files::{FileReloader, PemFiles};
pub use pem::CertificateInfo;
pub use renewal::Renewer;
pub use resolver::ReloadingResolver;
pub use serving::ServingCertificate;

use std::path::PathBuf;

/// Why certificate material could not be made, read or used. Names the file, Secret or step.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("a serving certificate needs at least one DNS name or IP address")]
    NoNames,
    #[error("`{0}` is neither a DNS name nor an IP address")]
    InvalidName(String),
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `what` names where the PEM came from: a file, or a Secret and its key.
    #[error("{what}: {reason}")]
    Pem { what: String, reason: String },
    #[error("the certificate and key do not make a TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

impl TlsError {
    pub(crate) fn pem(what: &str, reason: impl Into<String>) -> Self {
        TlsError::Pem {
            what: what.to_string(),
            reason: reason.into(),
        }
    }
}

/// The crypto provider of every configuration made here: ring, the one provider in the build
/// (explicit, because with more than one linked the implicit default panics).
pub fn crypto_provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}

#[cfg(test)]
pub(crate) mod test_support {
    //! A TLS server on a free loopback port and a client that reports what the server presented.

    use std::net::SocketAddr;
    use std::sync::Arc;

    use crate::ReloadingResolver;

    /// Serves TLS handshakes with `resolver` until the returned task is aborted.
    pub async fn serve(
        resolver: &Arc<ReloadingResolver>,
    ) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let config = resolver.server_config(vec![b"http/1.1".to_vec()]).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // the handshake is all the test looks at
                    let _ = acceptor.accept(tcp).await;
                });
            }
        });
        (addr, task)
    }

    /// Connects trusting only `ca_pem` and returns the leaf certificate the server presented.
    pub async fn presented(addr: SocketAddr, ca_pem: &str) -> Result<Vec<u8>, String> {
        crate::client::presented_certificate(addr, "127.0.0.1", ca_pem)
            .await
            .map(|leaf| leaf.as_ref().to_vec())
            .map_err(|e| e.to_string())
    }

    /// A CA valid for a day.
    pub fn ca(name: &str) -> crate::CertificateAuthority {
        crate::CertificateAuthority::generate(
            name,
            crate::Validity::starting_now(std::time::Duration::from_secs(24 * 3600)),
        )
        .unwrap()
    }

    /// A serving certificate for 127.0.0.1 from `ca`, valid for ten minutes.
    pub fn serving(ca: &crate::CertificateAuthority) -> crate::ServingCertificate {
        ca.serving_certificate(
            "127.0.0.1",
            &["127.0.0.1".into()],
            crate::Validity::starting_now(std::time::Duration::from_secs(600)),
        )
        .unwrap()
    }

    /// DER of the first certificate in `pem`.
    pub fn der(pem: &str) -> Vec<u8> {
        crate::pem::certificates(pem, "test").unwrap()[0]
            .as_ref()
            .to_vec()
    }
}
