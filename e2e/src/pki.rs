//! Certificates and keys for the local fleet: one CA signs every serving and client certificate,
//! and one key signs service-account tokens. Everything is written as PEM files into the state dir.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use crate::error::{Error, Result};

/// Paths of a certificate and its private key.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The fleet's certificate authority, able to issue more certificates.
pub struct Pki {
    dir: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
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
        let ca_key = KeyPair::generate().map_err(Error::pki)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(Error::pki)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "lifeboat-fleet-ca");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key_file = dir.join("ca.key");
        write_private(&ca_key_file, &ca_key.serialize_pem())?;
        let ca = CertifiedIssuer::self_signed(params, ca_key).map_err(Error::pki)?;
        let ca_cert = dir.join("ca.crt");
        write_private(&ca_cert, &ca.pem())?;

        let sa_key = KeyPair::generate().map_err(Error::pki)?;
        let service_account_key = dir.join("service-account.key");
        write_private(&service_account_key, &sa_key.serialize_pem())?;
        let service_account_pub = dir.join("service-account.pub");
        write_private(&service_account_pub, &sa_key.public_key_pem())?;

        Ok(Self {
            dir: dir.to_path_buf(),
            ca,
            ca_cert,
            ca_key: ca_key_file,
            service_account_key,
            service_account_pub,
        })
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
        let mut params = CertificateParams::new(sans).map_err(Error::pki)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(name, params)
    }

    /// Issues a client certificate: `user` becomes the Kubernetes user name, `groups` its groups.
    pub fn client_cert(&self, file_name: &str, user: &str, groups: &[&str]) -> Result<CertFiles> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(Error::pki)?;
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(file_name, params)
    }

    fn issue(&self, file_name: &str, params: CertificateParams) -> Result<CertFiles> {
        let key = KeyPair::generate().map_err(Error::pki)?;
        let cert = params.signed_by(&key, &self.ca).map_err(Error::pki)?;
        let files = CertFiles {
            cert: self.dir.join(format!("{file_name}.crt")),
            key: self.dir.join(format!("{file_name}.key")),
        };
        write_private(&files.cert, &cert.pem())?;
        write_private(&files.key, &key.serialize_pem())?;
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
