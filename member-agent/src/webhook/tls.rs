//! The webhook's serving certificate: generated at start (a self-signed CA, and a serving
//! certificate it signs for the names the apiserver dials), or loaded from PEM files (e.g. a
//! cert-manager secret mounted in the pod).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A serving certificate and the CA bundle the apiserver must trust to call us.
#[derive(Clone)]
pub struct ServingCertificate {
    /// The certificate chain, leaf first (PEM).
    pub chain_pem: String,
    /// Its private key (PEM).
    pub key_pem: String,
    /// What goes into the webhook configurations' `caBundle` (PEM).
    pub ca_bundle_pem: String,
}

impl std::fmt::Debug for ServingCertificate {
    // Never print the private key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCertificate")
            .field("chain_pem", &self.chain_pem)
            .field("ca_bundle_pem", &self.ca_bundle_pem)
            .finish_non_exhaustive()
    }
}

/// Why a serving certificate could not be made or used; names the file or the step.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generating the webhook certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("the webhook certificate needs at least one host name or IP address")]
    NoNames,
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("the webhook certificate and key do not make a TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Generates a CA and a serving certificate (rcgen's default validity, which outlives any agent)
/// for `names` (DNS names or IP addresses) signed by it.
pub fn generate(names: &[String]) -> Result<ServingCertificate, TlsError> {
    if names.is_empty() {
        return Err(TlsError::NoNames);
    }
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "lifeboat-agent-webhook-ca");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key)?;

    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec())?;
    params
        .distinguished_name
        .push(DnType::CommonName, names[0].as_str());
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &ca)?;
    Ok(ServingCertificate {
        chain_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        ca_bundle_pem: ca.pem(),
    })
}

/// Loads a serving certificate (chain) and key from PEM files. The CA bundle is `ca` when
/// given, else the certificate file itself (right for a self-signed certificate).
pub fn load(cert: &Path, key: &Path, ca: Option<&Path>) -> Result<ServingCertificate, TlsError> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    let loaded = ServingCertificate {
        chain_pem: read(cert)?,
        key_pem: read(key)?,
        ca_bundle_pem: read(ca.unwrap_or(cert))?,
    };
    // Fail at start, naming the file, rather than at the first handshake.
    certificates(&loaded.chain_pem, cert)?;
    certificates(&loaded.ca_bundle_pem, ca.unwrap_or(cert))?;
    private_key(&loaded.key_pem, key)?;
    Ok(loaded)
}

fn certificates(pem: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_path_buf(),
            reason: format!("not a PEM certificate file: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_path_buf(),
            reason: "contains no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

fn private_key(pem: &str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| TlsError::Pem {
        path: path.to_path_buf(),
        reason: format!("contains no usable private key: {e}"),
    })
}

/// The rustls server configuration (ring provider, HTTP/1.1) for a serving certificate.
pub fn server_config(cert: &ServingCertificate) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = certificates(&cert.chain_pem, Path::new("<serving certificate>"))?;
    let key = private_key(&cert.key_pem, Path::new("<serving key>"))?;
    // An explicit provider: the process may link more than one, and then the implicit default
    // would panic.
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_certificates_make_a_server_config() {
        let cert = generate(&["127.0.0.1".into(), "agent.ns.svc".into()]).unwrap();
        assert!(cert.chain_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(
            cert.ca_bundle_pem
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
        assert_ne!(cert.chain_pem, cert.ca_bundle_pem);
        assert!(!format!("{cert:?}").contains("PRIVATE KEY"));
        server_config(&cert).unwrap();
        assert!(matches!(generate(&[]), Err(TlsError::NoNames)));
    }

    #[test]
    fn files_load_and_bad_files_are_named() {
        let dir = std::env::temp_dir().join(format!("lifeboat-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = generate(&["localhost".into()]).unwrap();
        let (crt, key, ca) = (dir.join("tls.crt"), dir.join("tls.key"), dir.join("ca.crt"));
        std::fs::write(&crt, &cert.chain_pem).unwrap();
        std::fs::write(&key, &cert.key_pem).unwrap();
        std::fs::write(&ca, &cert.ca_bundle_pem).unwrap();

        let loaded = load(&crt, &key, Some(&ca)).unwrap();
        assert_eq!(loaded.ca_bundle_pem, cert.ca_bundle_pem);
        server_config(&loaded).unwrap();
        // without a CA file the certificate itself is the bundle
        assert_eq!(
            load(&crt, &key, None).unwrap().ca_bundle_pem,
            cert.chain_pem
        );

        let err = load(&key, &key, None).unwrap_err().to_string();
        assert!(
            err.contains("tls.key") && err.contains("no CERTIFICATE"),
            "{err}"
        );
        let err = load(&crt, &crt, None).unwrap_err().to_string();
        assert!(
            err.contains("tls.crt") && err.contains("private key"),
            "{err}"
        );
        let missing = dir.join("missing.pem");
        let err = load(&missing, &key, None).unwrap_err().to_string();
        assert!(err.contains("missing.pem"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
