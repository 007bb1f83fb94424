//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics and
//! defaults: the holder renews every retry period and steps down when it could not renew within
//! the renew deadline; a standby takes the lease when its record has not changed for the lease
//! duration (measured on its own clock from when it first saw that record), or at once when the
//! holder released it on a graceful shutdown. Every write is conditional on the resourceVersion
//! read, so two replicas never both win.
//!
//! Because the renew deadline is shorter than the lease duration, a holder that cannot reach
//! the API server knows it is no longer leader (and stops acting) before any standby may take
//! over.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use lifeboat_runtime::leader::{LeaderElector, LeaseConfig, default_identity};
//! let config = LeaseConfig::new("lifeboat-agent", "lifeboat-system", default_identity());
//! let (elector, mut leadership) = LeaderElector::new(client, config)?;
//! let (release, released) = tokio::sync::oneshot::channel::<()>();
//! let campaign = tokio::spawn(elector.run(async move { let _ = released.await; }));
//! leadership.acquired().await; // act only now, and stop at once on `leadership.lost()`
//! let _ = release.send(());     // after the last write: hand the lease over
//! campaign.await?;
//! # Ok(()) }
//! ```

#[cfg(feature = "clap")]
pub mod flags;
mod record;

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Resource, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;

pub use record::{Decision, Observed, decide, holder, release};

/// Kubernetes' (client-go's and controller-runtime's) defaults.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);
/// A standby waits between one and `1 + JITTER` retry periods between tries, so that standbys
/// do not try in lockstep.
pub const JITTER: f64 = 0.2;

/// Which Lease, who we are, and the timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    /// Unique among the replicas: written as the Lease's `holderIdentity`.
    pub identity: String,
    /// How long a standby respects a record that does not change.
    pub lease_duration: Duration,
    /// How long the holder keeps acting without a successful renewal.
    pub renew_deadline: Duration,
    /// Time between tries (renewals by the holder, acquisitions by a standby).
    pub retry_period: Duration,
}

/// A timing or name that cannot work, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("leader election: {field}: {reason}")]
pub struct ConfigError {
    /// `name`, `namespace`, `identity`, `lease_duration`, `renew_deadline` or `retry_period`.
    pub field: &'static str,
    pub reason: String,
}

impl LeaseConfig {
    /// A configuration with Kubernetes' default timing.
    pub fn new(
        name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
        }
    }

    /// client-go's rules: lease duration > renew deadline > retry period × (1 + jitter), all
    /// positive; the lease duration in whole seconds (the Lease's unit).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |field, reason: String| Err(ConfigError { field, reason });
        for (field, value) in [
            ("name", &self.name),
            ("namespace", &self.namespace),
            ("identity", &self.identity),
        ] {
            if value.is_empty() {
                return fail(field, "must not be empty".into());
            }
        }
        if self.retry_period.is_zero() {
            return fail("retry_period", "must be greater than 0".into());
        }
        if self.lease_duration.subsec_nanos() != 0 || self.lease_duration.is_zero() {
            return fail(
                "lease_duration",
                format!(
                    "{:?} is not a positive whole number of seconds",
                    self.lease_duration
                ),
            );
        }
        if self.lease_duration <= self.renew_deadline {
            return fail(
                "lease_duration",
                format!(
                    "{:?} must be greater than the renew deadline {:?}",
                    self.lease_duration, self.renew_deadline
                ),
            );
        }
        let longest_retry = self.retry_period.mul_f64(1.0 + JITTER);
        if self.renew_deadline <= longest_retry {
            return fail(
                "renew_deadline",
                format!(
                    "{:?} must be greater than the retry period × {} ({longest_retry:?})",
                    self.renew_deadline,
                    1.0 + JITTER
                ),
            );
        }
        Ok(())
    }
}

/// `hostname_pid`: unique per process on a node, and the pod name in a pod (its hostname).
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "unknown".into());
    format!("{host}_{}", std::process::id())
}

/// Whether this replica leads, as the elector last found out. Cloning shares it.
#[derive(Debug, Clone)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
    /// For [`Leadership::always`]: keeps the channel open, so it never reads as lost.
    _always: Option<Arc<watch::Sender<bool>>>,
}

impl Leadership {
    /// Leadership without election (a single replica): always leading.
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        Self {
            rx,
            _always: Some(Arc::new(tx)),
        }
    }

    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves once this replica leads (at once if it does). Never, once the elector is gone.
    pub async fn acquired(&mut self) {
        if self.rx.wait_for(|leading| *leading).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves once this replica no longer leads (at once if it does not), or the elector is
    /// gone: without an elector renewing, nobody may act on the lease.
    pub async fn lost(&mut self) {
        let _ = self.rx.wait_for(|leading| !*leading).await;
    }
}

/// Why one try failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("reading Lease {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing Lease {namespace}/{name}: {source}")]
    Write {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("no answer from the API server within {0:?}")]
    Timeout(Duration),
}

/// What a successful try found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Leading,
    Following { holder: String },
}

/// Campaigns for the lease; see the module documentation.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    state: watch::Sender<bool>,
    recorder: Recorder,
    observed: Option<Observed>,
}

impl LeaderElector {
    /// An elector for `config` (validated) and the [`Leadership`] it publishes; nothing happens
    /// until [`LeaderElector::run`].
    pub fn new(
        client: kube::Client,
        config: LeaseConfig,
    ) -> Result<(Self, Leadership), ConfigError> {
        config.validate()?;
        let (state, rx) = watch::channel(false);
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "lifeboat-leader-election".into(),
                instance: Some(config.identity.clone()),
            },
        );
        let elector = Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            state,
            recorder,
            observed: None,
        };
        Ok((elector, Leadership { rx, _always: None }))
    }

    /// Tries to acquire, then renews, until `release` resolves; then steps down and hands the
    /// lease back if it holds it. Call `release` only after the last write made as leader.
    /// Dropping this future (a crash) leaves the lease to lapse.
    pub async fn run(mut self, release: impl Future<Output = ()>) {
        let mut release = std::pin::pin!(release);
        let LeaseConfig {
            renew_deadline,
            retry_period,
            ..
        } = self.config;
        // While leading: the start of the last successful renewal.
        let mut renewed: Option<Instant> = None;
        loop {
            let started = Instant::now();
            let bound = renewed.map_or(renew_deadline, |r| {
                (r + renew_deadline).saturating_duration_since(started)
            });
            let attempt = tokio::time::timeout(bound, self.try_acquire_or_renew());
            let result = tokio::select! {
                biased;
                () = &mut release => break,
                result = attempt => result.unwrap_or(Err(LeaseError::Timeout(bound))),
            };
            match result {
                Ok(Outcome::Leading) => {
                    if renewed.is_none() {
                        self.became_leader().await;
                    }
                    renewed = Some(started);
                }
                Ok(Outcome::Following { holder }) => {
                    if renewed.take().is_some() {
                        tracing::warn!(lease = %self.config.name, %holder, "the lease was taken over; stepping down");
                        self.state.send_replace(false);
                    } else {
                        tracing::debug!(lease = %self.config.name, %holder, "standing by");
                    }
                }
                Err(e) => {
                    tracing::warn!(lease = %self.config.name, error = %e, "leader election try failed");
                    if let Some(r) = renewed
                        && Instant::now() >= r + renew_deadline
                    {
                        tracing::warn!(lease = %self.config.name, ?renew_deadline, "could not renew the lease within the renew deadline; stepping down");
                        renewed = None;
                        self.state.send_replace(false);
                    }
                }
            }
            let wait = match renewed {
                // Never sleep past the deadline: at it, the next try decides (a zero timeout).
                Some(r) => {
                    retry_period.min((r + renew_deadline).saturating_duration_since(Instant::now()))
                }
                None => jittered(retry_period),
            };
            tokio::select! {
                biased;
                () = &mut release => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
        self.state.send_replace(false);
        match tokio::time::timeout(renew_deadline, self.release()).await {
            Ok(Ok(true)) => tracing::info!(lease = %self.config.name, "released the lease"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.config.name, error = %e, "could not release the lease; it lapses after its duration")
            }
            Err(_) => {
                tracing::warn!(lease = %self.config.name, "no answer when releasing the lease; it lapses after its duration")
            }
        }
    }

    async fn became_leader(&self) {
        tracing::info!(lease = %self.config.name, identity = %self.config.identity, "became leader");
        self.state.send_replace(true);
        // As client-go: an Event on the Lease (best effort).
        let reference = Lease {
            metadata: ObjectMeta {
                name: Some(self.config.name.clone()),
                namespace: Some(self.config.namespace.clone()),
                ..Default::default()
            },
            ..Default::default()
        }
        .object_ref(&());
        let event = Event {
            type_: EventType::Normal,
            reason: "LeaderElection".into(),
            note: Some(format!("{} became leader", self.config.identity)),
            action: "Acquire".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            tracing::debug!(error = %e, "could not record the leader election Event");
        }
    }

    async fn read(&self) -> Result<Option<Lease>, LeaseError> {
        self.api
            .get_opt(&self.config.name)
            .await
            .map_err(|source| LeaseError::Read {
                namespace: self.config.namespace.clone(),
                name: self.config.name.clone(),
                source,
            })
    }

    fn write_error(&self, source: kube::Error) -> LeaseError {
        LeaseError::Write {
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            source,
        }
    }

    /// One election step: read, decide, write (conditionally). A lost write race (409) is a
    /// failed try, as in client-go: the next read shows who won.
    async fn try_acquire_or_renew(&mut self) -> Result<Outcome, LeaseError> {
        let lease = self.read().await?;
        let now = Instant::now();
        let observed = Observed::update(
            self.observed.take(),
            lease.as_ref().and_then(|l| l.spec.clone()),
            now.into_std(),
        );
        let decision = decide(
            &observed,
            &self.config.identity,
            self.config.lease_duration,
            now.into_std(),
            Timestamp::now(),
        );
        self.observed = Some(observed);
        let written = match decision {
            Decision::HeldBy { holder, .. } => return Ok(Outcome::Following { holder }),
            Decision::Create(spec) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        namespace: Some(self.config.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Decision::Write(spec) => {
                let mut lease = lease.unwrap_or_default();
                lease.spec = Some(spec);
                // `replace` sends the resourceVersion read: a concurrent write makes it a 409.
                self.api
                    .replace(&self.config.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match written {
            Ok(lease) => {
                self.observed = Some(Observed {
                    spec: lease.spec,
                    since: Instant::now().into_std(),
                });
                Ok(Outcome::Leading)
            }
            Err(e) => Err(self.write_error(e)),
        }
    }

    /// Hands the lease back if we hold it; whether we did.
    async fn release(&self) -> Result<bool, LeaseError> {
        let Some(mut lease) = self.read().await? else {
            return Ok(false);
        };
        let Some(spec) = lease
            .spec
            .as_ref()
            .and_then(|s| release(s, &self.config.identity, Timestamp::now()))
        else {
            return Ok(false);
        };
        lease.spec = Some(spec);
        let name = lease.name_any();
        self.api
            .replace(&name, &PostParams::default(), &lease)
            .await
            .map(|_| true)
            .map_err(|e| self.write_error(e))
    }
}

/// `period` stretched by a random factor in `[1, 1 + JITTER]`.
fn jittered(period: Duration) -> Duration {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0);
    let unit = (hasher.finish() % 1_000_001) as f64 / 1_000_000.0;
    period.mul_f64(1.0 + JITTER * unit)
}

#[cfg(test)]
mod tests;
