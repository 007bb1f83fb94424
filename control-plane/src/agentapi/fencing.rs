//! The clusters' fencing credentials ([`lifeboat_api::fencing`]): an agent sends its own with a
//! heartbeat when the hub's answer shows the hub holds another (or none); the hub keeps it in
//! the Secret `cluster-<name>-fencing`, owned by the Cluster (so it goes with it), and only the
//! fencer ([`crate::failover::fencer`]) reads it.

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use lifeboat_api::cluster::Cluster;
use lifeboat_api::fencing::{
    CREDENTIAL_SECRET_TYPE, KEY_CA, KEY_DIGEST, KEY_SERVER, KEY_TOKEN, credential_secret_name,
};
use lifeboat_api::protocol::FencingCredential;

use super::{ApiError, Shared};

/// Bounds of what an agent may send (a token of a ServiceAccount is ~1 KiB, a CA bundle a few).
const MAX_TOKEN_BYTES: usize = 16 * 1024;
const MAX_CA_BYTES: usize = 256 * 1024;

/// Checks a credential an agent sent; the error names the field and why.
pub fn validate(credential: &FencingCredential) -> Result<(), String> {
    let server = credential.server.trim();
    let Some(rest) = server.strip_prefix("https://") else {
        return Err(format!(
            "fencingCredential.server: must be an https:// URL of the member's kube-apiserver, got {server:?}"
        ));
    };
    if rest.is_empty() || rest.starts_with('/') || server.chars().any(char::is_whitespace) {
        return Err(format!(
            "fencingCredential.server: must name a host, got {server:?}"
        ));
    }
    if credential.token.trim().is_empty() {
        return Err("fencingCredential.token: must not be empty".into());
    }
    if credential.token.len() > MAX_TOKEN_BYTES {
        return Err(format!(
            "fencingCredential.token: longer than {MAX_TOKEN_BYTES} bytes"
        ));
    }
    if credential.certificate_authority.len() > MAX_CA_BYTES {
        return Err(format!(
            "fencingCredential.certificateAuthority: longer than {MAX_CA_BYTES} bytes"
        ));
    }
    if !credential.certificate_authority.is_empty()
        && !credential
            .certificate_authority
            .contains("-----BEGIN CERTIFICATE-----")
    {
        return Err(
            "fencingCredential.certificateAuthority: must be PEM certificates (-----BEGIN CERTIFICATE-----)".into(),
        );
    }
    Ok(())
}

impl Shared {
    /// The digest of the fencing credential the hub holds for `cluster`.
    pub(crate) fn fencing_digest(&self, cluster: &str) -> Option<String> {
        let secret = self.fencing.get(
            &ObjectRef::new(&credential_secret_name(cluster)).within(&self.config.namespace),
        )?;
        secret
            .data
            .as_ref()?
            .get(KEY_DIGEST)
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
    }

    /// Keeps `credential` for `cluster` (server-side apply: created or replaced in one call).
    pub(crate) async fn store_fencing_credential(
        &self,
        cluster: &Cluster,
        credential: &FencingCredential,
    ) -> Result<(), ApiError> {
        validate(credential).map_err(ApiError::BadRequest)?;
        let name = cluster.name_any();
        let data = BTreeMap::from([
            (
                KEY_SERVER.to_string(),
                credential.server.trim().as_bytes().to_vec(),
            ),
            (
                KEY_CA.to_string(),
                credential.certificate_authority.as_bytes().to_vec(),
            ),
            (KEY_TOKEN.to_string(), credential.token.as_bytes().to_vec()),
            (KEY_DIGEST.to_string(), credential.digest().into_bytes()),
        ]);
        self.apply_cluster_secret(
            cluster,
            &credential_secret_name(&name),
            CREDENTIAL_SECRET_TYPE,
            data,
        )
        .await?;
        tracing::info!(cluster = %name, server = %credential.server, "fencing credential stored");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credential(server: &str, ca: &str, token: &str) -> FencingCredential {
        FencingCredential {
            server: server.into(),
            certificate_authority: ca.into(),
            token: token.into(),
        }
    }

    #[test]
    fn a_credential_names_what_is_wrong_with_it() {
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        assert_eq!(
            validate(&credential("https://10.0.0.1:6443", pem, "t")),
            Ok(())
        );
        assert_eq!(validate(&credential("https://m1.example", "", "t")), Ok(()));
        for (bad, field) in [
            (
                credential("http://10.0.0.1", pem, "t"),
                "fencingCredential.server",
            ),
            (credential("https://", pem, "t"), "fencingCredential.server"),
            (
                credential("https://a b", pem, "t"),
                "fencingCredential.server",
            ),
            (
                credential("https://m1", pem, " "),
                "fencingCredential.token",
            ),
            (
                credential("https://m1", pem, &"x".repeat(MAX_TOKEN_BYTES + 1)),
                "fencingCredential.token",
            ),
            (
                credential("https://m1", "not pem", "t"),
                "fencingCredential.certificateAuthority",
            ),
        ] {
            let error = validate(&bad).unwrap_err();
            assert!(error.starts_with(field), "{error}");
        }
    }

    #[test]
    fn the_digest_changes_with_every_field_and_hides_the_token() {
        let a = credential("https://m1", "", "secret-token");
        let digest = a.digest();
        assert_eq!(digest.len(), 64);
        assert!(!digest.contains("secret"));
        assert_ne!(
            credential("https://m2", "", "secret-token").digest(),
            digest
        );
        assert_ne!(credential("https://m1", "", "other").digest(), digest);
        // fields are length-prefixed: moving bytes between them changes the digest
        assert_ne!(
            credential("https://m1", "x", "secret-token").digest(),
            credential("https://m1x", "", "secret-token").digest()
        );
        assert!(!format!("{a:?}").contains("secret-token"));
    }
}
