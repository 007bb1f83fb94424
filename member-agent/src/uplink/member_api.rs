//! Whether the member's kube-apiserver answers the agent.
//!
//! With leader election the agent stops when it cannot renew its Lease in the member, so its
//! heartbeats stop and the hub's cluster lease runs out. Without it (one replica,
//! `--leader-elect=false`) nothing of the kind happens: the credential is in memory, the agent
//! keeps reaching the hub, and the hub would keep a cluster Ready in which the agent can do
//! nothing. And either way the hub would learn it late. So a probe asks the member's apiserver
//! for `/readyz` every eighth of the bound (`--member-api-timeout`, between 100 ms and 5 s);
//! once nothing has answered for the bound, a heartbeat goes at once (and each one after it)
//! saying for how long (`memberApiUnreachableSeconds`), and the hub marks the Cluster
//! `Ready=False` (`MemberAPIUnreachable`), which fails its workloads over after the policy's
//! cluster toleration. The first answer again sends a heartbeat at once too.
//! Such heartbeats do not count as contact for the fence (`fencing`): the hub counts a not-Ready
//! cluster fenced a fencing period after it left Ready, so the agent fences (as far as it can
//! with no apiserver) a fencing period after its last heartbeat sent while its apiserver
//! answered, which is earlier.
//!
//! [`SilenceClock`] is the pure part (fed instants, unit-tested); [`probe`] is the IO.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// When the member's apiserver last answered, against the bound.
#[derive(Debug, Clone)]
pub struct SilenceClock {
    timeout: Duration,
    last_answer: Instant,
}

impl SilenceClock {
    /// A clock that starts as if the apiserver had just answered (a new term is given a whole
    /// bound).
    pub fn new(timeout: Duration, now: Instant) -> Self {
        Self {
            timeout,
            last_answer: now,
        }
    }

    /// The apiserver answered at `at`.
    pub fn answered(&mut self, at: Instant) {
        if at > self.last_answer {
            self.last_answer = at;
        }
    }

    /// How long the apiserver has not answered at `now`, once that is at least the bound.
    pub fn unreachable_for(&self, now: Instant) -> Option<Duration> {
        let silent = now.saturating_duration_since(self.last_answer);
        (silent >= self.timeout).then_some(silent)
    }
}

/// How often the apiserver is probed: an eighth of the bound, between 100 ms and 5 s, so the
/// bound is crossed at most an eighth of it late.
pub fn probe_every(timeout: Duration) -> Duration {
    (timeout / 8).clamp(Duration::from_millis(100), Duration::from_secs(5))
}

/// How long one probe may take: half the bound, within the client's request deadline (a probe
/// that hangs must not hide the crossing of the bound for long).
pub fn probe_deadline(timeout: Duration, request_timeout: Duration) -> Duration {
    (timeout / 2).min(request_timeout)
}

/// Whether a `/readyz` probe's result is an answer of the apiserver: `ok`, or a refusal of this
/// call (401, 403; 404 where a proxy does not serve it) is; a server error (503: not ready,
/// e.g. its etcd is gone, or shutting down) or a connection, TLS or transport failure is not.
pub fn is_answer<T>(result: &Result<T, kube::Error>) -> bool {
    match result {
        Ok(_) => true,
        Err(kube::Error::Api(s)) => s.code < 500,
        Err(_) => false,
    }
}

/// The shared clock of one hub-mode term.
#[derive(Debug)]
pub struct MemberApi {
    clock: Mutex<SilenceClock>,
    /// Woken when the apiserver crosses the bound either way: the heartbeat goes at once.
    pub changed: Notify,
}

impl MemberApi {
    pub fn new(timeout: Duration) -> Self {
        Self {
            clock: Mutex::new(SilenceClock::new(timeout, Instant::now())),
            changed: Notify::new(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut SilenceClock) -> T) -> T {
        f(&mut self.clock.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn timeout(&self) -> Duration {
        self.with(|c| c.timeout)
    }

    pub fn answered(&self, at: Instant) {
        self.with(|c| c.answered(at));
    }

    pub fn unreachable_for(&self, now: Instant) -> Option<Duration> {
        self.with(|c| c.unreachable_for(now))
    }
}

/// Probes the member's apiserver (`GET /readyz`) forever, each call bounded by
/// [`probe_deadline`]; wakes [`MemberApi::changed`] when the apiserver crosses the bound.
pub async fn probe(
    client: kube::Client,
    member_api: std::sync::Arc<MemberApi>,
    request_timeout: Duration,
) {
    let timeout = member_api.timeout();
    let every = probe_every(timeout);
    let deadline = probe_deadline(timeout, request_timeout);
    let mut silent = false;
    loop {
        let next = tokio::time::Instant::now() + every;
        let call = tokio::time::timeout(deadline, readyz(&client));
        match call.await {
            Ok(result) if is_answer(&result) => member_api.answered(Instant::now()),
            Ok(Err(e)) => tracing::debug!(error = %e, "the member's kube-apiserver did not answer"),
            Ok(Ok(_)) => {}
            Err(_) => tracing::debug!("the member's kube-apiserver did not answer in time"),
        }
        let now_silent = member_api.unreachable_for(Instant::now()).is_some();
        if now_silent != silent {
            silent = now_silent;
            member_api.changed.notify_one();
        }
        tokio::time::sleep_until(next).await;
    }
}

async fn readyz(client: &kube::Client) -> Result<String, kube::Error> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    client.request_text(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_counts_from_the_last_answer_and_only_past_the_bound() {
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        let mut clock = SilenceClock::new(secs(30), t0);
        assert_eq!(
            clock.unreachable_for(t0 + secs(29)),
            None,
            "a new term has a whole bound"
        );
        assert_eq!(clock.unreachable_for(t0 + secs(30)), Some(secs(30)));
        clock.answered(t0 + secs(20));
        assert_eq!(clock.unreachable_for(t0 + secs(49)), None);
        assert_eq!(clock.unreachable_for(t0 + secs(61)), Some(secs(41)));
        // an answer from a probe that started earlier does not move the clock back
        clock.answered(t0 + secs(10));
        assert_eq!(clock.unreachable_for(t0 + secs(61)), Some(secs(41)));
        // answering again: reachable at once
        clock.answered(t0 + secs(61));
        assert_eq!(clock.unreachable_for(t0 + secs(62)), None);
    }

    #[test]
    fn the_probe_runs_an_eighth_of_the_bound_apart_within_limits() {
        assert_eq!(probe_every(Duration::from_secs(60)), Duration::from_secs(5));
        assert_eq!(
            probe_every(Duration::from_secs(2)),
            Duration::from_millis(250)
        );
        assert_eq!(
            probe_every(Duration::from_millis(400)),
            Duration::from_millis(100)
        );
        assert_eq!(
            probe_deadline(Duration::from_secs(2), Duration::from_secs(10)),
            Duration::from_secs(1)
        );
        assert_eq!(
            probe_deadline(Duration::from_secs(60), Duration::from_secs(10)),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn a_refusal_is_an_answer_a_server_error_or_a_transport_failure_is_not() {
        assert!(is_answer::<()>(&Ok(())));
        let status = |code| {
            kube::Error::Api(Box::new(
                kube::core::Status::failure("x", "y").with_code(code),
            ))
        };
        assert!(is_answer::<()>(&Err(status(403))));
        assert!(is_answer::<()>(&Err(status(401))));
        assert!(is_answer::<()>(&Err(status(404))));
        // `/readyz` failing (etcd gone, shutting down) is a member that cannot act.
        assert!(!is_answer::<()>(&Err(status(503))));
        assert!(!is_answer::<()>(&Err(status(500))));
        let down = kube::Error::Service(Box::new(std::io::Error::other("connection refused")));
        assert!(!is_answer::<()>(&Err(down)));
    }
}
