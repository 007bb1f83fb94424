//! How a watch comes back after an error: soon.
//!
//! kube-runtime's `default_backoff` (client-go's reflector parameters) waits 0.8 s, doubling up
//! to 30 s, and resets only after a success. A member's kube-apiserver that restarts refuses
//! connections for a few seconds, so the waits grow to tens of seconds; the first watch after it
//! is back then fails with `410 Expired` (its resourceVersion is older than the new watch cache)
//! and earned one more long wait before the re-list: on the fleet the agent's watches stayed idle
//! about 50 s after a member's apiserver restart (issue 20). Each Lifeboat process watches its
//! own cluster with a handful of watches, so retrying that cluster often costs little.
//!
//! [`WatchBackoff`] is the pure rule: after an error, wait [`MIN_DELAY`], doubling up to
//! [`MAX_DELAY`]; after a `410 Gone`/`Expired` none at all (the watcher re-lists, waiting only
//! delays it), unless the error before was one too. Any event resets it. [`backoff`] applies it
//! to a watcher stream, as `WatchStreamExt::default_backoff` does for kube-runtime's.

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::watcher;

/// The first wait after an error.
pub const MIN_DELAY: Duration = Duration::from_millis(100);
/// The longest wait: a watch resumes at most this long after its server is back (a `410`
/// answered then re-lists at once).
pub const MAX_DELAY: Duration = Duration::from_secs(1);

/// The waits between a watch's errors (see the module).
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
    last_was_expired: bool,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self {
            next: MIN_DELAY,
            last_was_expired: false,
        }
    }
}

impl WatchBackoff {
    /// How long to wait after `error` before the watch tries again.
    pub fn after(&mut self, error: &watcher::Error) -> Duration {
        let expired = is_expired(error);
        let again = std::mem::replace(&mut self.last_was_expired, expired);
        if expired && !again {
            return Duration::ZERO;
        }
        let wait = self.next;
        self.next = (self.next * 2).min(MAX_DELAY);
        wait
    }

    /// The watch delivered an event: the next error starts over.
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

/// Whether the server said the watch's resourceVersion is too old (`410 Gone`, reason
/// `Expired` or `Gone`): the watcher has dropped it and re-lists on its next step.
pub fn is_expired(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::WatchError(status) => status.code == 410,
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 410,
        _ => false,
    }
}

/// `stream` (a `kube::runtime::watcher`) paused after each error as [`WatchBackoff`] says.
/// The error is still yielded (callers log it) before the pause.
pub fn backoff<S, K>(stream: S) -> impl Stream<Item = Result<K, watcher::Error>> + Send
where
    S: Stream<Item = Result<K, watcher::Error>> + Send,
    K: Send,
{
    futures::stream::unfold(
        (Box::pin(stream), WatchBackoff::default(), Duration::ZERO),
        |(mut stream, mut backoff, pause)| async move {
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            let item = stream.next().await?;
            let pause = match &item {
                Ok(_) => {
                    backoff.reset();
                    Duration::ZERO
                }
                Err(e) => backoff.after(e),
            };
            Some((item, (stream, backoff, pause)))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn refused() -> watcher::Error {
        watcher::Error::WatchFailed(kube::Error::Service(Box::new(std::io::Error::other(
            "connection refused",
        ))))
    }

    fn expired() -> watcher::Error {
        watcher::Error::WatchError(Box::new(
            Status::failure("too old resource version: 12 (345)", "Expired").with_code(410),
        ))
    }

    #[test]
    fn waits_double_from_a_tenth_of_a_second_up_to_one_second() {
        let mut b = WatchBackoff::default();
        let waits: Vec<u64> = (0..7)
            .map(|_| b.after(&refused()).as_millis() as u64)
            .collect();
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000, 1000]);
        b.reset();
        assert_eq!(b.after(&refused()), MIN_DELAY);
    }

    #[test]
    fn an_expired_watch_relists_at_once_after_any_number_of_refusals() {
        // The apiserver restarting: refused for a while, then its first answer is a 410.
        let mut b = WatchBackoff::default();
        for _ in 0..20 {
            b.after(&refused());
        }
        assert_eq!(b.after(&expired()), Duration::ZERO);
        // A second 410 in a row is not answered with a tight loop.
        assert_eq!(b.after(&expired()), MAX_DELAY);
    }

    #[test]
    fn only_410_counts_as_expired() {
        assert!(is_expired(&expired()));
        assert!(!is_expired(&refused()));
        let forbidden = watcher::Error::InitialListFailed(kube::Error::Api(
            Status::failure("forbidden", "Forbidden")
                .with_code(403)
                .boxed(),
        ));
        assert!(!is_expired(&forbidden));
        let gone_at_list = watcher::Error::InitialListFailed(kube::Error::Api(
            Status::failure("gone", "Expired").with_code(410).boxed(),
        ));
        assert!(is_expired(&gone_at_list));
    }

    #[tokio::test(start_paused = true)]
    async fn the_stream_pauses_after_an_error_and_not_after_an_expiry() {
        let items: Vec<Result<u32, watcher::Error>> =
            vec![Err(refused()), Err(refused()), Err(expired()), Ok(1)];
        let start = tokio::time::Instant::now();
        let out: Vec<_> = backoff(futures::stream::iter(items))
            .map(|i| (i.is_ok(), start.elapsed().as_millis()))
            .collect()
            .await;
        // 100 ms after the first refusal, 200 ms after the second, none after the 410.
        assert_eq!(out, [(false, 0), (false, 100), (false, 300), (true, 300)]);
    }
}
