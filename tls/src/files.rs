//! Serving material from PEM files (e.g. a cert-manager Secret mounted into the pod), reloaded
//! when their content changes. Content is compared, not modification times: a mounted Secret is
//! swapped through a symlink, and a rewrite within the same second must count too.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::{ReloadingResolver, ServingCertificate, TlsError};

/// How often [`FileReloader::run`] reads the files. The kubelet updates a mounted Secret within
/// about a minute; cert-manager renews well before expiry, so a few seconds is plenty.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(5);

/// The files of a serving certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PemFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The CA bundle clients must trust; without it the certificate file is the bundle (right
    /// for a self-signed certificate).
    pub ca: Option<PathBuf>,
}

impl PemFiles {
    /// Reads and checks the files (parseable, the key fits the leaf), naming the file at fault.
    pub async fn load(&self) -> Result<ServingCertificate, TlsError> {
        let loaded = ServingCertificate {
            chain_pem: read(&self.cert).await?,
            key_pem: read(&self.key).await?,
            ca_bundle_pem: read(self.ca.as_deref().unwrap_or(&self.cert)).await?,
        };
        crate::pem::certificates(&loaded.chain_pem, &self.cert.display().to_string())?;
        crate::pem::private_key(&loaded.key_pem, &self.key.display().to_string())?;
        if let Some(ca) = &self.ca {
            crate::pem::certificates(&loaded.ca_bundle_pem, &ca.display().to_string())?;
        }
        loaded.certified_key(&self.describe())?;
        Ok(loaded)
    }

    fn describe(&self) -> String {
        format!("{} with {}", self.cert.display(), self.key.display())
    }
}

async fn read(path: &Path) -> Result<String, TlsError> {
    tokio::fs::read_to_string(path)
        .await
        .map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })
}

/// Feeds a resolver from [`PemFiles`] whenever their content changes.
pub struct FileReloader {
    files: PemFiles,
    resolver: Arc<ReloadingResolver>,
    last_error: Option<String>,
}

impl FileReloader {
    pub fn new(files: PemFiles, resolver: Arc<ReloadingResolver>) -> Self {
        Self {
            files,
            resolver,
            last_error: None,
        }
    }

    /// Reads the files once; `Ok(true)` when the resolver now serves new material. On an error
    /// (a half-written rotation, a missing file) the resolver keeps what it served.
    pub async fn reload(&mut self) -> Result<bool, TlsError> {
        let loaded = self.files.load().await?;
        self.resolver.update(loaded, &self.files.describe())
    }

    /// Reloads every `every` until `shutdown` completes. Changes are logged, and each distinct
    /// error once (it is retried at the next tick).
    pub async fn run(mut self, every: Duration, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = ticks.tick() => {}
            }
            match self.reload().await {
                Ok(true) => {
                    self.last_error = None;
                    tracing::info!(cert = %self.files.cert.display(), "serving certificate reloaded from its files");
                }
                Ok(false) => self.last_error = None,
                Err(error) => {
                    let text = error.to_string();
                    if self.last_error.as_deref() != Some(text.as_str()) {
                        tracing::warn!(%error, "serving certificate files not reloaded; still serving the previous certificate");
                        self.last_error = Some(text);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CertificateAuthority;
    use crate::test_support::{ca, der, presented, serve, serving};

    /// A temporary directory with the files of a serving certificate from a new CA.
    struct Written {
        dir: PathBuf,
        files: PemFiles,
        ca: CertificateAuthority,
        first: ServingCertificate,
    }

    impl Drop for Written {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn written(name: &str, with_ca_file: bool) -> Written {
        let dir = std::env::temp_dir().join(format!("lifeboat-tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = PemFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            ca: with_ca_file.then(|| dir.join("ca.crt")),
        };
        let ca = ca(name);
        let first = serving(&ca);
        write(&files, &first);
        Written {
            dir,
            files,
            ca,
            first,
        }
    }

    fn write(files: &PemFiles, serving: &ServingCertificate) {
        std::fs::write(&files.cert, &serving.chain_pem).unwrap();
        std::fs::write(&files.key, &serving.key_pem).unwrap();
        if let Some(ca) = &files.ca {
            std::fs::write(ca, &serving.ca_bundle_pem).unwrap();
        }
    }

    #[tokio::test]
    async fn rewritten_files_are_served_at_the_next_handshake() {
        let w = written("reload", true);
        let resolver = ReloadingResolver::new(w.files.load().await.unwrap()).unwrap();
        let (addr, server) = serve(&resolver).await;
        let mut reloader = FileReloader::new(w.files.clone(), resolver.clone());
        assert!(!reloader.reload().await.unwrap(), "nothing changed yet");
        assert_eq!(
            presented(addr, w.ca.cert_pem()).await.unwrap(),
            der(&w.first.chain_pem)
        );

        // cert-manager renews: new key and certificate, same CA
        let renewed = serving(&w.ca);
        write(&w.files, &renewed);
        assert!(reloader.reload().await.unwrap());
        assert_eq!(
            presented(addr, w.ca.cert_pem()).await.unwrap(),
            der(&renewed.chain_pem)
        );

        // half-way through a rotation the key does not fit: the renewed certificate stays
        std::fs::write(&w.files.key, &w.first.key_pem).unwrap();
        let err = reloader.reload().await.unwrap_err().to_string();
        assert!(
            err.contains("the key does not fit the leaf certificate"),
            "{err}"
        );
        assert_eq!(
            presented(addr, w.ca.cert_pem()).await.unwrap(),
            der(&renewed.chain_pem)
        );
        std::fs::remove_file(&w.files.key).unwrap();
        let err = reloader.reload().await.unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("reading {}", w.files.key.display())),
            "{err}"
        );
        assert_eq!(resolver.current(), renewed);
        server.abort();
    }

    #[tokio::test]
    async fn without_a_ca_file_the_certificate_is_the_bundle() {
        let w = written("self-signed", false);
        let loaded = w.files.load().await.unwrap();
        assert_eq!(loaded.ca_bundle_pem, loaded.chain_pem);
        // a key file where the certificate should be is named
        let swapped = PemFiles {
            cert: w.files.key.clone(),
            ..w.files.clone()
        };
        let err = swapped.load().await.unwrap_err().to_string();
        assert!(
            err.contains("tls.key") && err.contains("no CERTIFICATE"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn the_loop_stops_at_shutdown() {
        let w = written("loop", false);
        let resolver = ReloadingResolver::new(w.files.load().await.unwrap()).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(FileReloader::new(w.files.clone(), resolver).run(
            Duration::from_secs(3600),
            async {
                let _ = stopped.await;
            },
        ));
        tokio::task::yield_now().await;
        assert!(!task.is_finished());
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap();
    }
}
