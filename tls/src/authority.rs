//! A certificate authority: generated here or read from PEM, and what it issues (serving
//! certificates for DNS names and IP addresses, client certificates whose CN and O Kubernetes
//! reads as user and group). Pure: no IO.

use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::pem::{self, CertificateInfo, display_time};
use crate::{ServingCertificate, TlsError};

/// Lifetime of a generated CA: long enough to outlive any fleet or agent installation; its
/// serving certificates are short-lived and re-issued instead.
pub const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Certificates start this long before they are made, so a peer whose clock is a little behind
/// does not reject them as not yet valid.
pub const BACKDATE: Duration = Duration::from_secs(3600);

/// When a certificate is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl Validity {
    /// From `now` minus [`BACKDATE`] until `now + lifetime`.
    pub fn from(now: SystemTime, lifetime: Duration) -> Self {
        Validity {
            not_before: now.checked_sub(BACKDATE).unwrap_or(now),
            not_after: now + lifetime,
        }
    }

    /// [`Validity::from`] the current time.
    pub fn starting_now(lifetime: Duration) -> Self {
        Self::from(SystemTime::now(), lifetime)
    }

    fn apply(&self, params: &mut CertificateParams) {
        params.not_before = time::OffsetDateTime::from(self.not_before);
        params.not_after = time::OffsetDateTime::from(self.not_after);
    }
}

/// A certificate and its private key, as PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedCertificate {
    pub cert_pem: String,
    pub key_pem: String,
    pub validity: Validity,
}

impl std::fmt::Debug for IssuedCertificate {
    // Never print the private key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCertificate")
            .field("cert_pem", &self.cert_pem)
            .field("validity", &self.validity)
            .finish_non_exhaustive()
    }
}

/// A key pair that is not a certificate (e.g. the key that signs service-account tokens).
#[derive(Clone, PartialEq, Eq)]
pub struct KeyPairPem {
    /// PKCS#8 PEM.
    pub private_pem: String,
    /// SubjectPublicKeyInfo PEM.
    pub public_pem: String,
}

impl std::fmt::Debug for KeyPairPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPairPem")
            .field("public_pem", &self.public_pem)
            .finish_non_exhaustive()
    }
}

/// A new ECDSA P-256 key pair, the algorithm of every key made here.
pub fn generate_key_pair() -> Result<KeyPairPem, TlsError> {
    let key = KeyPair::generate()?;
    Ok(KeyPairPem {
        private_pem: key.serialize_pem(),
        public_pem: key.public_key_pem(),
    })
}

/// A CA able to issue certificates.
pub struct CertificateAuthority {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
    info: CertificateInfo,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("subject", &self.info.subject)
            .field("not_after", &display_time(self.info.not_after))
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// A new self-signed CA (ECDSA P-256) named `common_name`. It signs only end-entity
    /// certificates (path length 0).
    pub fn generate(common_name: &str, validity: Validity) -> Result<Self, TlsError> {
        let key = KeyPair::generate()?;
        let mut params = named(common_name, Vec::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity.apply(&mut params);
        let cert = params.self_signed(&key)?;
        let key_pem = key.serialize_pem();
        Self::from_pem(&cert.pem(), &key_pem, "generated CA")
    }

    /// A CA from its certificate (the first CERTIFICATE block) and private key. Refused, naming
    /// `what`, unless the certificate is a CA, the key is its key, and it has not expired.
    pub fn from_pem(cert_pem: &str, key_pem: &str, what: &str) -> Result<Self, TlsError> {
        let cert = pem::certificates(cert_pem, what)?.remove(0);
        let key_der = pem::private_key(key_pem, what)?;
        // rustls checks that the key belongs to the certificate.
        rustls::sign::CertifiedKey::from_der(
            vec![cert.clone()],
            key_der,
            &crate::crypto_provider(),
        )
        .map_err(|e| TlsError::pem(what, format!("the key does not fit the certificate: {e}")))?;
        let info = pem::inspect(&cert, what)?;
        if !info.is_ca {
            return Err(TlsError::pem(
                what,
                format!("{} is not a CA certificate", info.subject),
            ));
        }
        if info.not_after <= SystemTime::now() {
            return Err(TlsError::pem(
                what,
                format!(
                    "the CA certificate expired on {}",
                    display_time(info.not_after)
                ),
            ));
        }
        let key = KeyPair::from_pem(key_pem)
            .map_err(|e| TlsError::pem(what, format!("unsupported CA key: {e}")))?;
        let issuer = Issuer::from_ca_cert_der(&cert, key)
            .map_err(|e| TlsError::pem(what, format!("cannot sign with this CA: {e}")))?;
        Ok(Self {
            cert_pem: first_certificate_block(cert_pem),
            key_pem: key_pem.to_string(),
            issuer,
            info,
        })
    }

    /// The CA certificate (PEM): what clients trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key (PEM).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Validity, subject and CA flag of the CA certificate.
    pub fn info(&self) -> &CertificateInfo {
        &self.info
    }

    /// A serving certificate (ServerAuth) for `names`: DNS names or IP addresses, at least one.
    pub fn issue_serving(
        &self,
        common_name: &str,
        names: &[String],
        validity: Validity,
    ) -> Result<IssuedCertificate, TlsError> {
        if names.is_empty() {
            return Err(TlsError::NoNames);
        }
        if let Some(bad) = names.iter().find(|name| {
            name.parse::<std::net::IpAddr>().is_err()
                && rustls::pki_types::DnsName::try_from(name.as_str()).is_err()
        }) {
            return Err(TlsError::InvalidName(bad.clone()));
        }
        let mut params = named(common_name, names.to_vec())?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params, validity)
    }

    /// A client certificate (ClientAuth): Kubernetes reads `common_name` as the user name and
    /// `organization` as a group. (One O attribute: the certificate library keeps one value per
    /// attribute type.)
    pub fn issue_client(
        &self,
        common_name: &str,
        organization: Option<&str>,
        validity: Validity,
    ) -> Result<IssuedCertificate, TlsError> {
        let mut params = named(common_name, Vec::new())?;
        if let Some(organization) = organization {
            params
                .distinguished_name
                .push(DnType::OrganizationName, organization);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params, validity)
    }

    /// [`issue_serving`](Self::issue_serving) with this CA as the bundle clients trust.
    pub fn serving_certificate(
        &self,
        common_name: &str,
        names: &[String],
        validity: Validity,
    ) -> Result<ServingCertificate, TlsError> {
        let issued = self.issue_serving(common_name, names, validity)?;
        Ok(ServingCertificate {
            chain_pem: issued.cert_pem,
            key_pem: issued.key_pem,
            ca_bundle_pem: self.cert_pem.clone(),
        })
    }

    fn issue(
        &self,
        mut params: CertificateParams,
        validity: Validity,
    ) -> Result<IssuedCertificate, TlsError> {
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.use_authority_key_identifier_extension = true;
        // Never outlive the CA: clients would reject the chain then anyway.
        let validity = Validity {
            not_after: validity.not_after.min(self.info.not_after),
            ..validity
        };
        validity.apply(&mut params);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            validity: Validity {
                // as encoded: whole seconds
                not_before: truncate(validity.not_before),
                not_after: truncate(validity.not_after),
            },
        })
    }
}

/// Parameters with subject `CN=common_name` (only) and these subject alternative names.
fn named(common_name: &str, names: Vec<String>) -> Result<CertificateParams, TlsError> {
    let mut params = CertificateParams::new(names)?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    Ok(params)
}

fn truncate(t: SystemTime) -> SystemTime {
    let since = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    SystemTime::UNIX_EPOCH + Duration::from_secs(since.as_secs())
}

/// The first CERTIFICATE block of `pem` (already parsed, so it exists), as text: a bundle given
/// for the CA is cut to the CA certificate itself.
fn first_certificate_block(pem: &str) -> String {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    match pem.find(BEGIN).and_then(|start| {
        pem[start..]
            .find(END)
            .map(|end| &pem[start..start + end + END.len()])
    }) {
        Some(block) => format!("{block}\n"),
        None => pem.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pem::inspect_pem;

    const HOUR: Duration = Duration::from_secs(3600);

    fn ca() -> CertificateAuthority {
        CertificateAuthority::generate("test-ca", Validity::starting_now(HOUR * 24)).unwrap()
    }

    #[test]
    fn a_generated_ca_is_a_ca_and_reads_back_from_its_pem() {
        let ca = ca();
        assert!(ca.info().is_ca);
        assert_eq!(ca.info().subject, "CN=test-ca");
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(!format!("{ca:?}").contains("PRIVATE KEY"));
        let again = CertificateAuthority::from_pem(ca.cert_pem(), ca.key_pem(), "test").unwrap();
        assert_eq!(again.cert_pem(), ca.cert_pem());
        // a bundle is cut to its first certificate, the CA itself
        let bundle = format!("{}{}", ca.cert_pem(), super::tests::ca().cert_pem());
        let cut = CertificateAuthority::from_pem(&bundle, ca.key_pem(), "test").unwrap();
        assert_eq!(cut.cert_pem(), ca.cert_pem());
    }

    #[test]
    fn issued_certificates_carry_names_usage_and_validity() {
        let ca = ca();
        let validity = Validity::starting_now(HOUR);
        let serving = ca
            .issue_serving(
                "webhook",
                &["127.0.0.1".into(), "agent.ns.svc".into()],
                validity,
            )
            .unwrap();
        let info = inspect_pem(&serving.cert_pem, "serving").unwrap();
        assert!(!info.is_ca);
        assert_eq!(info.subject, "CN=webhook");
        assert_eq!(info.not_after, serving.validity.not_after);
        assert_eq!(info.not_before, serving.validity.not_before);
        let lifetime = info.not_after.duration_since(info.not_before).unwrap();
        assert_eq!(lifetime, HOUR + BACKDATE);
        assert!(!format!("{serving:?}").contains("PRIVATE KEY"));

        let client = ca
            .issue_client("lifeboat-admin", Some("system:masters"), validity)
            .unwrap();
        let info = inspect_pem(&client.cert_pem, "client").unwrap();
        assert_eq!(info.subject, "CN=lifeboat-admin, O=system:masters");

        assert!(matches!(
            ca.issue_serving("x", &[], validity),
            Err(TlsError::NoNames)
        ));
        assert_eq!(
            ca.issue_serving("x", &["bad name!".into()], validity)
                .unwrap_err()
                .to_string(),
            "`bad name!` is neither a DNS name nor an IP address"
        );
    }

    #[test]
    fn certificates_never_outlive_their_ca() {
        let short = CertificateAuthority::generate("short", Validity::starting_now(HOUR)).unwrap();
        let issued = short
            .issue_serving("x", &["x".into()], Validity::starting_now(HOUR * 100))
            .unwrap();
        assert!(issued.validity.not_after <= short.info().not_after);
    }

    #[test]
    fn unusable_cas_are_refused_naming_the_source() {
        let ca = ca();
        let other = super::tests::ca();
        let err = CertificateAuthority::from_pem(ca.cert_pem(), other.key_pem(), "Secret a/b")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("Secret a/b: the key does not fit the certificate"),
            "{err}"
        );

        let leaf = ca
            .issue_serving("leaf", &["leaf".into()], Validity::starting_now(HOUR))
            .unwrap();
        let err = CertificateAuthority::from_pem(&leaf.cert_pem, &leaf.key_pem, "leaf.pem")
            .unwrap_err()
            .to_string();
        assert_eq!(err, "leaf.pem: CN=leaf is not a CA certificate");

        let past = SystemTime::now() - HOUR * 48;
        let expired =
            CertificateAuthority::generate("old", Validity::from(past, HOUR)).unwrap_err();
        assert!(
            expired
                .to_string()
                .contains("the CA certificate expired on"),
            "{expired}"
        );

        let err = CertificateAuthority::from_pem("garbage", ca.key_pem(), "ca.crt")
            .unwrap_err()
            .to_string();
        assert_eq!(err, "ca.crt: contains no CERTIFICATE block");
        let err = CertificateAuthority::from_pem(ca.cert_pem(), "garbage", "ca.key")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("ca.key: contains no usable private key"),
            "{err}"
        );
    }
}
