//! What a TLS server presents and what its clients must trust.

use std::sync::Arc;

use rustls::sign::CertifiedKey;

use crate::pem::{self, CertificateInfo};
use crate::{TlsError, crypto_provider};

/// A serving certificate chain, its key, and the CA bundle clients must trust (for a webhook:
/// the `caBundle` of its configurations).
#[derive(Clone, PartialEq, Eq)]
pub struct ServingCertificate {
    /// The certificate chain, leaf first (PEM).
    pub chain_pem: String,
    /// Its private key (PEM).
    pub key_pem: String,
    /// The CA bundle clients trust (PEM).
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

impl ServingCertificate {
    /// Checks the material and makes the key rustls signs with. `what` names the source in
    /// errors (e.g. the file names).
    pub fn certified_key(&self, what: &str) -> Result<Arc<CertifiedKey>, TlsError> {
        let chain = pem::certificates(&self.chain_pem, &format!("{what} (certificate)"))?;
        let key = pem::private_key(&self.key_pem, &format!("{what} (key)"))?;
        pem::certificates(&self.ca_bundle_pem, &format!("{what} (CA bundle)"))?;
        let certified = CertifiedKey::from_der(chain, key, &crypto_provider()).map_err(|e| {
            TlsError::pem(
                what,
                format!("the key does not fit the leaf certificate: {e}"),
            )
        })?;
        Ok(Arc::new(certified))
    }

    /// Validity and subject of the leaf certificate.
    pub fn leaf_info(&self) -> Result<CertificateInfo, TlsError> {
        pem::inspect_pem(&self.chain_pem, "serving certificate")
    }
}
