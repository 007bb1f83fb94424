//! Re-issuing a serving certificate from a CA before it expires. The decisions ([`renew_at`],
//! [`due`], [`next_check`]) are pure functions of the time; [`Renewer`] applies them on a timer
//! and follows a CA that changes (e.g. the Secret's, see [`crate::secret::CaSecret::watch`]).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt};

use crate::{CertificateAuthority, ReloadingResolver, TlsError, Validity};

/// Lifetime of a serving certificate issued from a CA this crate keeps (cert-manager's default).
pub const SERVING_LIFETIME: Duration = Duration::from_secs(90 * 24 * 3600);

/// The longest a renewal loop sleeps between checks, so that a suspended machine or a clock
/// jump does not let a certificate expire unnoticed.
pub const MAX_CHECK_INTERVAL: Duration = Duration::from_secs(3600);

/// A certificate is re-issued once two thirds of its lifetime have passed (cert-manager's
/// default), which leaves a third of it to retry if issuing fails.
pub fn renew_at(validity: &Validity) -> SystemTime {
    let lifetime = validity
        .not_after
        .duration_since(validity.not_before)
        .unwrap_or(Duration::ZERO);
    validity.not_before + lifetime * 2 / 3
}

/// Whether the certificate should be re-issued at `now`.
pub fn due(validity: &Validity, now: SystemTime) -> bool {
    now >= renew_at(validity)
}

/// How long to wait at `now` before checking again: until [`renew_at`], at most `max`.
pub fn next_check(validity: &Validity, now: SystemTime, max: Duration) -> Duration {
    renew_at(validity)
        .duration_since(now)
        .unwrap_or(Duration::ZERO)
        .min(max)
}

/// After a failed re-issue, wait this long before the next try.
pub const RETRY_AFTER_ERROR: Duration = Duration::from_secs(30);

/// Keeps a [`ReloadingResolver`] serving a certificate issued from a CA: re-issued when two
/// thirds of its lifetime have passed, and at once when the CA changes.
pub struct Renewer {
    ca: CertificateAuthority,
    common_name: String,
    names: Vec<String>,
    lifetime: Duration,
    validity: Validity,
    resolver: Arc<ReloadingResolver>,
}

impl Renewer {
    /// Issues the first certificate (for `names`, DNS names or IP addresses; `lifetime` e.g.
    /// [`SERVING_LIFETIME`]) and the resolver that serves it.
    pub fn start(
        ca: CertificateAuthority,
        common_name: &str,
        names: &[String],
        lifetime: Duration,
    ) -> Result<Self, TlsError> {
        let issued = ca.issue_serving(common_name, names, Validity::starting_now(lifetime))?;
        let resolver = ReloadingResolver::new(crate::ServingCertificate {
            chain_pem: issued.cert_pem,
            key_pem: issued.key_pem,
            ca_bundle_pem: ca.cert_pem().to_string(),
        })?;
        Ok(Self {
            ca,
            common_name: common_name.to_string(),
            names: names.to_vec(),
            lifetime,
            validity: issued.validity,
            resolver,
        })
    }

    /// The resolver this renewer feeds.
    pub fn resolver(&self) -> &Arc<ReloadingResolver> {
        &self.resolver
    }

    /// Validity of the certificate served now.
    pub fn validity(&self) -> Validity {
        self.validity
    }

    /// The CA issuing now.
    pub fn authority(&self) -> &CertificateAuthority {
        &self.ca
    }

    fn reissue(&mut self) -> Result<(), TlsError> {
        let issued = self.ca.issue_serving(
            &self.common_name,
            &self.names,
            Validity::starting_now(self.lifetime),
        )?;
        self.resolver.update(
            crate::ServingCertificate {
                chain_pem: issued.cert_pem,
                key_pem: issued.key_pem,
                ca_bundle_pem: self.ca.cert_pem().to_string(),
            },
            "re-issued serving certificate",
        )?;
        self.validity = issued.validity;
        Ok(())
    }

    /// Re-issues when [`due`] at `now`; `Ok(true)` when it did.
    pub fn renew_if_due(&mut self, now: SystemTime) -> Result<bool, TlsError> {
        if !due(&self.validity, now) {
            return Ok(false);
        }
        self.reissue().map(|()| true)
    }

    /// Switches to `ca` and re-issues from it, unless it is the CA in use (`Ok(false)`).
    pub fn switch_ca(&mut self, ca: CertificateAuthority) -> Result<bool, TlsError> {
        if ca.cert_pem() == self.ca.cert_pem() {
            return Ok(false);
        }
        let previous = std::mem::replace(&mut self.ca, ca);
        match self.reissue() {
            Ok(()) => Ok(true),
            Err(e) => {
                self.ca = previous;
                Err(e)
            }
        }
    }

    /// Renews on time and follows `ca_updates` (each item the CA now in force, or why it could
    /// not be read) until `shutdown` completes. Errors are logged and retried.
    pub async fn run<E: std::fmt::Display>(
        mut self,
        ca_updates: impl Stream<Item = Result<CertificateAuthority, E>>,
        shutdown: impl Future<Output = ()>,
    ) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut ca_updates = std::pin::pin!(ca_updates.fuse());
        let mut retry_after = Duration::ZERO;
        loop {
            let wait =
                next_check(&self.validity, SystemTime::now(), MAX_CHECK_INTERVAL).max(retry_after);
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(wait) => match self.renew_if_due(SystemTime::now()) {
                    Ok(renewed) => {
                        retry_after = Duration::ZERO;
                        if renewed {
                            tracing::info!(names = ?self.names, "serving certificate re-issued before expiry");
                        }
                    }
                    Err(error) => {
                        retry_after = RETRY_AFTER_ERROR;
                        tracing::warn!(%error, "re-issuing the serving certificate failed; retrying");
                    }
                },
                Some(update) = ca_updates.next() => match update.map(|ca| self.switch_ca(ca)) {
                    Ok(Ok(true)) => tracing::info!(ca = %self.ca.info().subject, "the CA changed; serving certificate re-issued from it"),
                    Ok(Ok(false)) => {}
                    Ok(Err(error)) => tracing::warn!(%error, "re-issuing from the changed CA failed; keeping the current certificate"),
                    Err(error) => tracing::warn!(%error, "reading the CA failed; keeping the current certificate"),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::ca;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    fn validity(start: SystemTime, days: u32) -> Validity {
        Validity {
            not_before: start,
            not_after: start + DAY * days,
        }
    }

    #[test]
    fn renewal_is_due_after_two_thirds_of_the_lifetime() {
        let start = SystemTime::UNIX_EPOCH + DAY * 20_000;
        let v = validity(start, 90);
        assert_eq!(renew_at(&v), start + DAY * 60);
        assert!(!due(&v, start));
        assert!(!due(&v, start + DAY * 60 - Duration::from_secs(1)));
        assert!(due(&v, start + DAY * 60));
        assert!(due(&v, start + DAY * 200));
    }

    #[test]
    fn checks_wait_until_renewal_but_never_longer_than_the_maximum() {
        let start = SystemTime::UNIX_EPOCH + DAY * 20_000;
        let v = validity(start, 90);
        assert_eq!(
            next_check(&v, start, MAX_CHECK_INTERVAL),
            MAX_CHECK_INTERVAL
        );
        let almost = start + DAY * 60 - Duration::from_secs(30);
        assert_eq!(
            next_check(&v, almost, MAX_CHECK_INTERVAL),
            Duration::from_secs(30)
        );
        assert_eq!(
            next_check(&v, start + DAY * 61, MAX_CHECK_INTERVAL),
            Duration::ZERO
        );
        // a certificate whose validity is upside down is due at once
        let broken = Validity {
            not_before: start,
            not_after: start - DAY,
        };
        assert!(due(&broken, start));
    }

    #[test]
    fn the_renewer_reissues_when_due_and_when_the_ca_changes() {
        let names = vec!["127.0.0.1".to_string()];
        let mut renewer = Renewer::start(ca("first"), "webhook", &names, DAY).unwrap();
        let resolver = renewer.resolver().clone();
        let first = resolver.current();
        let validity = renewer.validity();
        assert_eq!(first.ca_bundle_pem, renewer.authority().cert_pem());

        assert!(!renewer.renew_if_due(validity.not_before).unwrap());
        assert_eq!(resolver.current(), first);
        assert!(renewer.renew_if_due(renew_at(&validity)).unwrap());
        let renewed = resolver.current();
        assert_ne!(renewed.chain_pem, first.chain_pem);
        assert_eq!(renewed.ca_bundle_pem, first.ca_bundle_pem);

        // the same CA again changes nothing; another CA re-issues and changes the bundle
        let same = CertificateAuthority::from_pem(
            renewer.authority().cert_pem(),
            renewer.authority().key_pem(),
            "same",
        )
        .unwrap();
        assert!(!renewer.switch_ca(same).unwrap());
        assert_eq!(resolver.current(), renewed);
        let second = ca("second");
        let second_pem = second.cert_pem().to_string();
        assert!(renewer.switch_ca(second).unwrap());
        assert_eq!(resolver.current().ca_bundle_pem, second_pem);
        assert_eq!(
            crate::pem::inspect_pem(&resolver.current().chain_pem, "leaf")
                .unwrap()
                .subject,
            "CN=webhook"
        );
    }

    #[tokio::test]
    async fn the_renewer_follows_ca_updates_until_shutdown() {
        let names = vec!["127.0.0.1".to_string()];
        let renewer = Renewer::start(ca("first"), "webhook", &names, DAY).unwrap();
        let resolver = renewer.resolver().clone();
        let mut changes = resolver.subscribe();
        let (updates, updates_rx) =
            futures::channel::mpsc::unbounded::<Result<CertificateAuthority, String>>();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(renewer.run(updates_rx, async {
            let _ = stopped.await;
        }));
        // an error is logged and changes nothing
        updates
            .unbounded_send(Err("Secret unreadable".into()))
            .unwrap();
        let second = ca("second");
        let second_pem = second.cert_pem().to_string();
        updates.unbounded_send(Ok(second)).unwrap();
        tokio::time::timeout(Duration::from_secs(10), changes.changed())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(changes.borrow().ca_bundle_pem, second_pem);
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap();
    }
}
