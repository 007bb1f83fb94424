//! Waiting for a condition on a real cluster, with a deadline and the last reason on timeout.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How often conditions are polled.
pub const POLL: Duration = Duration::from_millis(100);

/// Polls `check` until it returns `Ok(value)`. `Err(reason)` means "not yet"; the last reason is
/// part of the timeout error so a failing test says what it saw.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(value) => return Ok(value),
            Err(reason) => reason,
        };
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: format!("{what} (last seen: {last})"),
                seconds: timeout.as_secs(),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn returns_once_the_check_passes() {
        let calls = AtomicU32::new(0);
        let value = until("third call", Duration::from_secs(5), || async {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            if n >= 2 {
                Ok(n)
            } else {
                Err(format!("call {n}"))
            }
        })
        .await
        .unwrap();
        assert_eq!(value, 2);
    }

    #[tokio::test]
    async fn times_out_with_the_last_reason() {
        let err = until("never", Duration::from_millis(250), || async {
            Err::<(), _>("still pending".to_string())
        })
        .await
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("never"), "{text}");
        assert!(text.contains("still pending"), "{text}");
    }
}
