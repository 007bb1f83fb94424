//! Reading PEM certificates and keys, and what a certificate says about itself (validity, CA
//! flag). Pure: the callers read the bytes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::TlsError;

/// Every CERTIFICATE block of `pem`, in order; at least one. `what` names the source in errors.
pub fn certificates(pem: &str, what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::pem(what, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError::pem(what, "contains no CERTIFICATE block"));
    }
    Ok(certs)
}

/// The first private key of `pem` (PKCS#8, SEC1 or PKCS#1).
pub fn private_key(pem: &str, what: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| TlsError::pem(what, format!("contains no usable private key: {e}")))
}

/// What a certificate says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateInfo {
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// BasicConstraints CA flag.
    pub is_ca: bool,
    /// The subject, as `CN=...` text.
    pub subject: String,
}

/// Parses one DER certificate.
pub fn inspect(der: &CertificateDer<'_>, what: &str) -> Result<CertificateInfo, TlsError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
        .map_err(|e| TlsError::pem(what, format!("not an X.509 certificate: {e}")))?;
    let validity = cert.validity();
    Ok(CertificateInfo {
        not_before: from_unix(validity.not_before.timestamp()),
        not_after: from_unix(validity.not_after.timestamp()),
        is_ca: cert.is_ca(),
        subject: cert.subject().to_string(),
    })
}

/// [`inspect`] of the first certificate in `pem`.
pub fn inspect_pem(pem: &str, what: &str) -> Result<CertificateInfo, TlsError> {
    inspect(&certificates(pem, what)?[0], what)
}

fn from_unix(seconds: i64) -> SystemTime {
    match u64::try_from(seconds) {
        Ok(after) => UNIX_EPOCH + Duration::from_secs(after),
        Err(_) => UNIX_EPOCH - Duration::from_secs(seconds.unsigned_abs()),
    }
}

/// A time as RFC 3339-like UTC text for messages (`2026-05-03 10:00:00.0 +00:00:00`).
pub fn display_time(t: SystemTime) -> String {
    time::OffsetDateTime::from(t).to_string()
}
