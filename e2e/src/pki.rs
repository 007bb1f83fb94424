//! Certificates and keys for the local fleet: one CA signs every serving and client certificate,
//! and one key signs service-account tokens. Everything is written as PEM files into the state dir.
//! The certificates themselves are made by `lifeboat-tls`, the project's one CA helper.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lifeboat_tls::authority::CA_LIFETIME;
use lifeboat_tls::{CertificateAuthority, IssuedCertificate, Validity, generate_key_pair};

use crate::error::{Error, Result};

/// Lifetime of the fleet's serving and client certificates: a fleet is recreated (with a new
/// CA) at every `fleet up`, so a year outlives any of them.
pub const CERT_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// Paths of a certificate and its private key.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The fleet's certificate authority, able to issue more certificates.
pub struct Pki {
    dir: PathBuf,
    ca: CertificateAuthority,
    pub ca_cert: PathBuf,
    /// The CA's private key (kube-controller-manager signs CSRs with it).
    pub ca_key: PathBuf,
    /// Signing key for service-account tokens (ECDSA P-256, PKCS#8 PEM).
    pub service_account_key: PathBuf,
    /// Its public half, with which kube-apiserver verifies the tokens.
    pub service_account_pub: PathBuf,
}

impl Pki {
    /// Creates a new CA and service-account key under `dir`.
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let ca = CertificateAuthority::generate(
            "lifeboat-fleet-ca",
            Validity::starting_now(CA_LIFETIME),
        )?;
        let ca_key = dir.join("ca.key");
        write_private(&ca_key, ca.key_pem())?;
        let ca_cert = dir.join("ca.crt");
        write_private(&ca_cert, ca.cert_pem())?;

        let sa_key = generate_key_pair()?;
        let service_account_key = dir.join("service-account.key");
        write_private(&service_account_key, &sa_key.private_pem)?;
        let service_account_pub = dir.join("service-account.pub");
        write_private(&service_account_pub, &sa_key.public_pem)?;

        Ok(Self {
            dir: dir.to_path_buf(),
            ca,
            ca_cert,
            ca_key,
            service_account_key,
            service_account_pub,
        })
    }

    /// The CA (to issue more certificates in memory, e.g. for a webhook under test).
    pub fn authority(&self) -> &CertificateAuthority {
        &self.ca
    }

    /// Issues a TLS serving certificate for loopback, valid for the given extra DNS names.
    pub fn serving_cert(&self, name: &str, extra_dns: &[&str]) -> Result<CertFiles> {
        let mut sans = vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
            "10.0.0.1".to_string(),
        ];
        sans.extend(extra_dns.iter().map(|s| s.to_string()));
        let issued = self
            .ca
            .issue_serving(name, &sans, Validity::starting_now(CERT_LIFETIME))?;
        self.write(name, &issued)
    }

    /// Issues a client certificate: `user` becomes the Kubernetes user name, `groups` its group
    /// (at most one: the certificate carries one O attribute).
    pub fn client_cert(&self, file_name: &str, user: &str, groups: &[&str]) -> Result<CertFiles> {
        let group = match groups {
            [] => None,
            [group] => Some(*group),
            more => {
                return Err(Error::Invalid(format!(
                    "client certificate {file_name} for {user}: at most one group, got {more:?}"
                )));
            }
        };
        let issued = self
            .ca
            .issue_client(user, group, Validity::starting_now(CERT_LIFETIME))?;
        self.write(file_name, &issued)
    }

    fn write(&self, file_name: &str, issued: &IssuedCertificate) -> Result<CertFiles> {
        let files = CertFiles {
            cert: self.dir.join(format!("{file_name}.crt")),
            key: self.dir.join(format!("{file_name}.key")),
        };
        write_private(&files.cert, &issued.cert_pem)?;
        write_private(&files.key, &issued.key_pem)?;
        Ok(files)
    }
}

fn write_private(path: &Path, contents: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    file.write_all(contents.as_bytes())
        .map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleet_ca_issues_serving_and_client_certificates() {
        let dir = std::env::temp_dir().join(format!("lifeboat-pki-test-{}", std::process::id()));
        let pki = Pki::create(&dir).unwrap();
        let ca_pem = std::fs::read_to_string(&pki.ca_cert).unwrap();
        let ca_key = std::fs::read_to_string(&pki.ca_key).unwrap();
        // the files make the same CA again (kube-controller-manager signs with them)
        CertificateAuthority::from_pem(&ca_pem, &ca_key, "ca files").unwrap();

        let serving = pki
            .serving_cert("kube-apiserver", &["extra.local"])
            .unwrap();
        let info =
            lifeboat_tls::pem::inspect_pem(&std::fs::read_to_string(&serving.cert).unwrap(), "x")
                .unwrap();
        assert_eq!(info.subject, "CN=kube-apiserver");
        assert!(!info.is_ca);

        let admin = pki
            .client_cert("admin", "lifeboat-admin", &["system:masters"])
            .unwrap();
        let info =
            lifeboat_tls::pem::inspect_pem(&std::fs::read_to_string(&admin.cert).unwrap(), "x")
                .unwrap();
        assert_eq!(info.subject, "CN=lifeboat-admin, O=system:masters");
        let err = pki
            .client_cert("two", "u", &["a", "b"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("at most one group"), "{err}");
        let sa = std::fs::read_to_string(&pki.service_account_pub).unwrap();
        assert!(sa.starts_with("-----BEGIN PUBLIC KEY-----"), "{sa}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
