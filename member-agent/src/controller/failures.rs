//! Failed reconciles: per-object exponential backoff for repeated errors (conflicts excepted:
//! they retry at once) and the Warning Event that tells the user, at most once in a while per
//! object. The bookkeeping is pure (the clock is a parameter); `report` does the IO.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::{Event, EventType};
use lifeboat_api::appwrapper::AppWrapper;
use lifeboat_runtime::kube_error::KubeError;

use super::apply::truncate;
use super::{Context, Error};
use crate::index::AwKey;

/// First retry after a failed reconcile; doubled at each further failure in a row.
pub const BACKOFF_BASE: Duration = Duration::from_secs(1);
/// The longest wait between retries of a failing object.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5 * 60);
/// Retry after a conflict: somebody (often this controller) wrote the object since it was read.
pub const CONFLICT_RETRY: Duration = Duration::from_millis(50);
/// The same error is reported again as an Event after this long.
pub const EVENT_REPEAT: Duration = Duration::from_secs(5 * 60);
/// A different error is reported no sooner than this after the previous Event.
pub const EVENT_MIN_GAP: Duration = Duration::from_secs(30);
/// The Events API's limit on a note.
pub const EVENT_NOTE_MAX: usize = 1024;
/// Reason of the Warning Event of a failed reconcile.
pub const REASON: &str = "ReconcileError";

/// Wait before the retry that follows `failures` failures in a row (`failures >= 1`):
/// `BACKOFF_BASE` doubled each time, capped at `BACKOFF_MAX`.
pub fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(31);
    BACKOFF_BASE
        .checked_mul(1u32 << doublings)
        .map_or(BACKOFF_MAX, |d| d.min(BACKOFF_MAX))
}

/// An error and its sources joined by ": ", each said once (a source already at the end of the
/// text is skipped), with Kubernetes API errors as "message (reason, code)".
pub fn error_chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = describe(error);
    let mut source = error.source();
    while let Some(e) = source {
        let part = describe(e);
        if !part.is_empty() && !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = e.source();
    }
    text
}

fn describe(error: &(dyn StdError + 'static)) -> String {
    // Sources are often boxed: `Box<E>` is an error of its own type. A `KubeError` stands for
    // the `kube::Error` it holds.
    let kube_error = error
        .downcast_ref::<kube::Error>()
        .or_else(|| error.downcast_ref::<Box<kube::Error>>().map(|b| b.as_ref()))
        .or_else(|| error.downcast_ref::<KubeError>().map(KubeError::kube));
    let status = match kube_error {
        Some(kube::Error::Api(status)) => Some(status.as_ref()),
        _ => error.downcast_ref::<kube::core::Status>().or_else(|| {
            error
                .downcast_ref::<Box<kube::core::Status>>()
                .map(|b| b.as_ref())
        }),
    };
    match status {
        Some(s) if s.message.is_empty() => format!("{} ({})", s.reason, s.code),
        Some(s) => format!("{} ({}, {})", s.message, s.reason, s.code),
        None => error.to_string(),
    }
}

/// One object's run of failed reconciles.
#[derive(Debug, Clone)]
struct Streak {
    failures: u32,
    last_failure: Instant,
    /// When the last Event was published and what it said.
    last_event: Option<(Instant, String)>,
}

/// What a failure means for the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Failures in a row, this one included.
    pub failures: u32,
    /// When to try again.
    pub retry_after: Duration,
    /// Whether to publish a Warning Event now.
    pub publish: bool,
}

/// Streaks of failed reconciles, by object. Success ends a streak; conflicts are not counted.
#[derive(Debug, Default)]
pub struct Failures {
    streaks: Mutex<HashMap<AwKey, Streak>>,
}

impl Failures {
    /// Records a failure with the text the Event would carry.
    pub fn failed(&self, key: &AwKey, note: &str, now: Instant) -> Failure {
        let mut streaks = self.streaks.lock().unwrap_or_else(|e| e.into_inner());
        // Objects that stopped failing without a success (deleted) are forgotten: a failing
        // object fails again within BACKOFF_MAX.
        streaks.retain(|_, s| now.saturating_duration_since(s.last_failure) < 2 * BACKOFF_MAX);
        let streak = streaks.entry(key.clone()).or_insert(Streak {
            failures: 0,
            last_failure: now,
            last_event: None,
        });
        streak.failures = streak.failures.saturating_add(1);
        streak.last_failure = now;
        let publish = match &streak.last_event {
            None => true,
            Some((at, said)) => {
                let since = now.saturating_duration_since(*at);
                since >= EVENT_REPEAT || (said != note && since >= EVENT_MIN_GAP)
            }
        };
        if publish {
            streak.last_event = Some((now, note.to_string()));
        }
        Failure {
            failures: streak.failures,
            retry_after: backoff(streak.failures),
            publish,
        }
    }

    /// A reconcile succeeded: the next failure starts a new streak.
    pub fn succeeded(&self, key: &AwKey) {
        self.streaks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// When to retry the object after its latest failure.
    pub fn retry_after(&self, key: &AwKey) -> Duration {
        self.streaks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .map_or(BACKOFF_BASE, |s| backoff(s.failures))
    }
}

/// Records the outcome of a reconcile; a failure other than a conflict is counted and, when due,
/// published as a Warning Event on the AppWrapper (best effort: a lost Event is logged).
pub async fn record(
    aw: &AppWrapper,
    result: &Result<kube::runtime::controller::Action, Error>,
    ctx: &Context,
) {
    let key = AwKey::new(
        aw.meta().namespace.clone().unwrap_or_default(),
        aw.meta().name.clone().unwrap_or_default(),
    );
    let error = match result {
        Ok(_) => return ctx.failures.succeeded(&key),
        Err(Error::Conflict) => return,
        Err(e) => e,
    };
    let note = truncate(&error_chain(error), EVENT_NOTE_MAX);
    let failure = ctx.failures.failed(&key, &note, Instant::now());
    tracing::warn!(error = %note, failures = failure.failures, retry_in = ?failure.retry_after, "reconcile failed");
    if !failure.publish {
        return;
    }
    let reference: ObjectReference = aw.object_ref(&());
    let event = Event {
        type_: EventType::Warning,
        reason: REASON.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &reference).await {
        tracing::warn!(error = %e, "could not record the reconcile error as an Event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_one_second_to_five_minutes() {
        let secs: Vec<u64> = (1..=11).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
        // A first failure (and a nonsensical zero) wait the base.
        assert_eq!(backoff(0), BACKOFF_BASE);
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("middle: {0}")]
    struct Inner(#[source] std::io::Error);

    #[test]
    fn the_chain_says_each_cause_once() {
        let e = Outer(Inner(std::io::Error::other("disk full")));
        // The middle error repeats its source in its own text; the source is not said twice.
        assert_eq!(error_chain(&e), "outer: middle: disk full");

        let status = kube::core::Status::failure(
            "the object has been modified; please apply your changes to the latest version",
            "Conflict",
        )
        .with_code(409);
        let kube_error = Error::Kube(KubeError::new(
            "write status",
            kube::Error::Api(status.boxed()),
        ));
        assert_eq!(
            error_chain(&kube_error),
            "kubernetes API (write status): the object has been modified; please apply your \
             changes to the latest version (Conflict, 409)"
        );
        let bare = kube::Error::Api(
            kube::core::Status::failure("", "Timeout")
                .with_code(504)
                .boxed(),
        );
        assert_eq!(error_chain(&bare), "Timeout (504)");
    }

    #[test]
    fn long_notes_are_cut_to_the_events_limit_on_a_character_boundary() {
        let long = "é".repeat(EVENT_NOTE_MAX);
        let note = truncate(&long, EVENT_NOTE_MAX);
        assert!(note.len() <= EVENT_NOTE_MAX && note.len() >= EVENT_NOTE_MAX - 1);
        assert!(long.starts_with(&note));
    }

    #[test]
    fn a_streak_backs_off_and_publishes_sparingly_until_success() {
        let failures = Failures::default();
        let key = AwKey::new("ns", "aw");
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let first = failures.failed(&key, "boom", at(0));
        assert_eq!(
            first,
            Failure {
                failures: 1,
                retry_after: Duration::from_secs(1),
                publish: true
            }
        );
        // The same error soon after: counted, backed off, not published again.
        let second = failures.failed(&key, "boom", at(1));
        assert_eq!(
            (second.failures, second.retry_after, second.publish),
            (2, Duration::from_secs(2), false)
        );
        assert_eq!(failures.retry_after(&key), Duration::from_secs(2));
        // A different error within the minimum gap waits; after it, it is published.
        assert!(!failures.failed(&key, "other", at(10)).publish);
        assert!(failures.failed(&key, "other", at(31)).publish);
        // The same error is repeated only after EVENT_REPEAT.
        assert!(!failures.failed(&key, "other", at(31 + 299)).publish);
        assert!(failures.failed(&key, "other", at(31 + 300)).publish);
        // Success ends the streak: the next failure starts over and is published.
        failures.succeeded(&key);
        assert_eq!(failures.retry_after(&key), BACKOFF_BASE);
        let again = failures.failed(&key, "other", at(340));
        assert_eq!((again.failures, again.publish), (1, true));
        // Other objects have their own streaks.
        let other = AwKey::new("ns", "other");
        assert_eq!(failures.failed(&other, "boom", at(341)).failures, 1);
    }

    #[test]
    fn streaks_of_objects_that_stopped_failing_are_forgotten() {
        let failures = Failures::default();
        let gone = AwKey::new("ns", "deleted");
        let t0 = Instant::now();
        failures.failed(&gone, "boom", t0);
        failures.failed(&gone, "boom", t0 + Duration::from_secs(1));
        let later = t0 + 2 * BACKOFF_MAX + Duration::from_secs(1);
        failures.failed(&AwKey::new("ns", "live"), "boom", later);
        assert_eq!(failures.retry_after(&gone), BACKOFF_BASE);
    }

    #[tokio::test]
    async fn a_failed_reconcile_is_published_once_as_a_warning_event_and_conflicts_are_not() {
        use crate::controller::mock::{ApiServer, Method, context};
        use kube::runtime::controller::Action;
        use serde_json::json;

        let (client, mut server) = ApiServer::new();
        let ctx = context(client);
        let aw: AppWrapper = serde_json::from_value(json!({
            "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": {"name": "train", "namespace": "team", "uid": "uid-1"},
            "spec": {"components": []}}))
        .expect("an AppWrapper");
        let failed: Result<Action, Error> = Err(Error::Kube(KubeError::new(
            "list pods of train",
            kube::Error::Api(
                kube::core::Status::failure("etcdserver: request timed out", "InternalError")
                    .with_code(500)
                    .boxed(),
            ),
        )));
        let first = record(&aw, &failed, &ctx);
        let server_side = async {
            let call = server.next().await.expect(
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/team/events",
            );
            assert_eq!(call.body["type"], json!("Warning"));
            assert_eq!(call.body["reason"], json!(REASON));
            assert_eq!(
                call.body["note"],
                json!(
                    "kubernetes API (list pods of train): etcdserver: request timed out (InternalError, 500)"
                )
            );
            assert_eq!(call.body["regarding"]["name"], json!("train"));
            let reply = call.body.clone();
            call.reply(201, reply);
        };
        tokio::join!(first, server_side);
        // The same failure again at once: backed off further, no second Event.
        record(&aw, &failed, &ctx).await;
        let conflict: Result<Action, Error> = Err(Error::Conflict);
        record(&aw, &conflict, &ctx).await;
        let key = AwKey::new("team", "train");
        assert_eq!(ctx.failures.retry_after(&key), Duration::from_secs(2));
        record(&aw, &Ok(Action::await_change()), &ctx).await;
        assert_eq!(ctx.failures.retry_after(&key), BACKOFF_BASE);
        drop(ctx);
        assert!(server.is_idle().await);
    }
}
