//! A rustls certificate resolver whose certificate can be replaced while the server runs: the
//! next handshake presents the new one, connections already open keep theirs.

use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;

use crate::{ServingCertificate, TlsError, crypto_provider};

/// Serves the current [`ServingCertificate`]; [`update`](Self::update) swaps it. Subscribers
/// ([`subscribe`](Self::subscribe)) learn of every change, e.g. to publish a new CA bundle.
pub struct ReloadingResolver {
    key: RwLock<Arc<CertifiedKey>>,
    material: watch::Sender<ServingCertificate>,
}

impl std::fmt::Debug for ReloadingResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingResolver")
            .field("current", &*self.material.borrow())
            .finish_non_exhaustive()
    }
}

impl ReloadingResolver {
    /// A resolver serving `initial` (checked: parseable, key fits the leaf).
    pub fn new(initial: ServingCertificate) -> Result<Arc<Self>, TlsError> {
        let key = initial.certified_key("serving certificate")?;
        Ok(Arc::new(Self {
            key: RwLock::new(key),
            material: watch::Sender::new(initial),
        }))
    }

    /// Serves `next` from the next handshake on. `Ok(false)` when it is what is served already;
    /// an error (naming `what`) leaves the current certificate in place.
    pub fn update(&self, next: ServingCertificate, what: &str) -> Result<bool, TlsError> {
        if *self.material.borrow() == next {
            return Ok(false);
        }
        let key = next.certified_key(what)?;
        // One writer at a time, so the key and the published material always agree.
        let mut current = self.key.write().unwrap_or_else(|e| e.into_inner());
        *current = key;
        self.material.send_replace(next);
        Ok(true)
    }

    /// What is served now.
    pub fn current(&self) -> ServingCertificate {
        self.material.borrow().clone()
    }

    /// Changes of the served material (the receiver starts at the current one, seen).
    pub fn subscribe(&self) -> watch::Receiver<ServingCertificate> {
        self.material.subscribe()
    }

    /// A rustls server configuration (ring, TLS 1.2 and 1.3, no client certificates) that asks
    /// this resolver at every handshake; `alpn` e.g. `[b"http/1.1"]`.
    pub fn server_config(
        self: &Arc<Self>,
        alpn: Vec<Vec<u8>>,
    ) -> Result<Arc<ServerConfig>, TlsError> {
        let mut config = ServerConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = alpn;
        Ok(Arc::new(config))
    }
}

impl ResolvesServerCert for ReloadingResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.key.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{ca, der, presented, serve, serving};

    #[tokio::test]
    async fn the_next_handshake_presents_the_updated_certificate() {
        let (first_ca, second_ca) = (ca("first"), ca("second"));
        let first = serving(&first_ca);
        let resolver = ReloadingResolver::new(first.clone()).unwrap();
        let mut changes = resolver.subscribe();
        let (addr, server) = serve(&resolver).await;
        assert_eq!(
            presented(addr, first_ca.cert_pem()).await.unwrap(),
            der(&first.chain_pem)
        );

        // the same material again is no change
        assert!(!resolver.update(first.clone(), "same").unwrap());
        assert!(!changes.has_changed().unwrap());

        // a certificate from another CA: served from the next handshake on
        let second = serving(&second_ca);
        assert!(resolver.update(second.clone(), "second").unwrap());
        assert!(changes.has_changed().unwrap());
        assert_eq!(
            changes.borrow_and_update().ca_bundle_pem,
            second_ca.cert_pem()
        );
        assert_eq!(
            presented(addr, second_ca.cert_pem()).await.unwrap(),
            der(&second.chain_pem)
        );
        let refused = presented(addr, first_ca.cert_pem()).await;
        assert!(refused.is_err(), "{refused:?}");

        // broken material is refused, naming the source, and the current one stays
        let broken = ServingCertificate {
            key_pem: first.key_pem.clone(),
            ..second.clone()
        };
        let err = resolver.update(broken, "rotated files").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("rotated files: the key does not fit the leaf certificate"),
            "{err}"
        );
        assert_eq!(resolver.current(), second);
        assert!(!changes.has_changed().unwrap());
        assert_eq!(
            presented(addr, second_ca.cert_pem()).await.unwrap(),
            der(&second.chain_pem)
        );
        server.abort();
    }

    #[test]
    fn unusable_initial_material_is_refused() {
        let first = serving(&ca("ca"));
        let no_bundle = ServingCertificate {
            ca_bundle_pem: String::new(),
            ..first
        };
        let err = ReloadingResolver::new(no_bundle).unwrap_err().to_string();
        assert_eq!(
            err,
            "serving certificate (CA bundle): contains no CERTIFICATE block"
        );
    }
}
