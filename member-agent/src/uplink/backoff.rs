//! Exponential backoff with jitter for reconnects and retries: the n-th wait in a row is drawn
//! from [`base` × 2ⁿ / 2, `base` × 2ⁿ] (capped at `max`), so agents that lost the hub together
//! do not come back in lockstep. Pure apart from the random draw, which tests replace.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max: max.max(base),
            failures: 0,
        }
    }

    /// The wait after one more failure, with a random jitter.
    pub fn next_delay(&mut self) -> Duration {
        self.next_delay_with(random_unit())
    }

    /// The wait after one more failure; `unit` in [0, 1] picks the point in the jitter window.
    pub fn next_delay_with(&mut self, unit: f64) -> Duration {
        let ceiling = self.ceiling();
        self.failures = self.failures.saturating_add(1);
        let half = ceiling / 2;
        half + (ceiling - half).mul_f64(unit.clamp(0.0, 1.0))
    }

    /// The largest wait the next failure may get.
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.failures.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// How many failures in a row so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// A success: the next failure waits the base again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// A number in [0, 1) from the process's random hasher keys (no RNG crate needed for jitter).
pub fn random_unit() -> f64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    );
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_with_jitter_in_the_upper_half() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        assert_eq!(b.next_delay_with(1.0), Duration::from_millis(100));
        assert_eq!(b.next_delay_with(0.0), Duration::from_millis(100));
        assert_eq!(b.next_delay_with(1.0), Duration::from_millis(400));
        for _ in 0..20 {
            b.next_delay_with(0.5);
        }
        assert_eq!(b.ceiling(), Duration::from_secs(10));
        assert_eq!(b.next_delay_with(0.0), Duration::from_secs(5));
        assert_eq!(b.next_delay_with(1.0), Duration::from_secs(10));
        // Out-of-range draws are clamped, never beyond the cap.
        assert_eq!(b.next_delay_with(7.0), Duration::from_secs(10));
        assert_eq!(b.failures(), 26);
        b.reset();
        assert_eq!(b.next_delay_with(1.0), Duration::from_millis(100));
    }

    #[test]
    fn many_failures_do_not_overflow() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
        for _ in 0..1000 {
            assert!(b.next_delay() <= Duration::from_secs(300));
        }
    }

    #[test]
    fn random_units_are_in_range_and_vary() {
        let draws: Vec<f64> = (0..64).map(|_| random_unit()).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
        assert!(draws.windows(2).any(|w| w[0] != w[1]));
    }
}
