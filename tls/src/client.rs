//! The client side: a rustls configuration that trusts a CA bundle, and what certificate a
//! server presents (for probes, rotation checks and tests).

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::pki_types::{CertificateDer, ServerName};

use crate::{TlsError, crypto_provider, pem};

/// A client configuration (ring, TLS 1.2 and 1.3, no client certificate) trusting only the
/// certificates in `ca_bundle_pem`.
pub fn trusting(ca_bundle_pem: &str) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in pem::certificates(ca_bundle_pem, "CA bundle")? {
        roots
            .add(cert)
            .map_err(|e| TlsError::pem("CA bundle", e.to_string()))?;
    }
    Ok(Arc::new(
        ClientConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    ))
}

/// Why a probe handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    Config(#[from] TlsError),
    #[error("`{0}` is not a server name")]
    Name(String),
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS handshake with {addr}: {source}")]
    Handshake {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} presented no certificate")]
    NoCertificate(SocketAddr),
}

/// Connects to `addr`, verifies it as `server_name` against `ca_bundle_pem`, and returns the
/// leaf certificate it presented.
pub async fn presented_certificate(
    addr: SocketAddr,
    server_name: &str,
    ca_bundle_pem: &str,
) -> Result<CertificateDer<'static>, ProbeError> {
    let config = trusting(ca_bundle_pem)?;
    let name = ServerName::try_from(server_name.to_string())
        .map_err(|_| ProbeError::Name(server_name.to_string()))?;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|source| ProbeError::Connect { addr, source })?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|source| ProbeError::Handshake { addr, source })?;
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|leaf| leaf.clone().into_owned())
        .ok_or(ProbeError::NoCertificate(addr))
}
