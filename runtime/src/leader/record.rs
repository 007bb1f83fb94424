//! The election's decisions on the Lease record, pure: what to write given what was read, when
//! it was first seen with this content (a local monotonic instant, so clock skew between
//! replicas does not matter, as in client-go), and now.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

/// The holder named by a record, if any (an empty identity means released).
pub fn holder(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// What to do with the Lease.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// There is no Lease: create it, held by us.
    Create(LeaseSpec),
    /// Write this record (conditional on the resourceVersion read): take a free or expired
    /// lease, or renew ours.
    Write(LeaseSpec),
    /// Another replica holds a valid lease; as far as we can tell it lapses in `remaining`.
    HeldBy { holder: String, remaining: Duration },
}

/// The record as last read and since when (local clock) it has had this content.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    pub spec: Option<LeaseSpec>,
    pub since: Instant,
}

impl Observed {
    /// Folds a fresh read into the observation: a record that changed (a renewal, a new holder)
    /// restarts the clock; an unchanged one keeps it.
    pub fn update(previous: Option<Observed>, spec: Option<LeaseSpec>, now: Instant) -> Observed {
        match previous {
            Some(p) if p.spec == spec => p,
            _ => Observed { spec, since: now },
        }
    }
}

/// The election step of client-go's `tryAcquireOrRenew`: a lease held by someone else is
/// respected until its duration has passed since we first saw its current record; otherwise we
/// write ourselves as holder (keeping the acquire time and transition count when renewing,
/// counting one more transition when taking over).
pub fn decide(
    observed: &Observed,
    identity: &str,
    lease_duration: Duration,
    now: Instant,
    wall_now: Timestamp,
) -> Decision {
    let ours = LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(whole_seconds(lease_duration)),
        acquire_time: Some(MicroTime(wall_now)),
        renew_time: Some(MicroTime(wall_now)),
        lease_transitions: Some(0),
        ..Default::default()
    };
    let Some(current) = &observed.spec else {
        return Decision::Create(ours);
    };
    match holder(current) {
        Some(h) if h == identity => Decision::Write(LeaseSpec {
            acquire_time: current.acquire_time.clone().or(ours.acquire_time),
            lease_transitions: current.lease_transitions.or(Some(0)),
            ..ours
        }),
        Some(other) => {
            let duration = current
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(lease_duration, Duration::from_secs);
            let expires = observed.since + duration;
            if expires > now {
                Decision::HeldBy {
                    holder: other.to_string(),
                    remaining: expires - now,
                }
            } else {
                Decision::Write(take_over(current, ours))
            }
        }
        None => Decision::Write(take_over(current, ours)),
    }
}

fn take_over(current: &LeaseSpec, ours: LeaseSpec) -> LeaseSpec {
    LeaseSpec {
        lease_transitions: Some(current.lease_transitions.unwrap_or(0).saturating_add(1)),
        ..ours
    }
}

/// The record that hands the lease back (client-go's `release`): no holder, a one-second
/// duration, so that a standby takes it at its next try. `None` when it is not ours to release.
pub fn release(current: &LeaseSpec, identity: &str, wall_now: Timestamp) -> Option<LeaseSpec> {
    (holder(current) == Some(identity)).then(|| LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: Some(MicroTime(wall_now)),
        renew_time: Some(MicroTime(wall_now)),
        lease_transitions: current.lease_transitions,
        ..Default::default()
    })
}

fn whole_seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "agent-a";
    const D: Duration = Duration::from_secs(15);

    fn wall(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).expect("a valid timestamp")
    }

    fn held_by(holder: &str, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(MicroTime(wall(-100))),
            renew_time: Some(MicroTime(wall(-1))),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    #[test]
    fn an_absent_lease_is_created_held_by_us() {
        let t0 = Instant::now();
        let observed = Observed::update(None, None, t0);
        match decide(&observed, ME, D, t0, wall(0)) {
            Decision::Create(spec) => {
                assert_eq!(holder(&spec), Some(ME));
                assert_eq!(spec.lease_duration_seconds, Some(15));
                assert_eq!(spec.lease_transitions, Some(0));
                assert_eq!(spec.renew_time, Some(MicroTime(wall(0))));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn another_holder_is_respected_for_the_lease_duration_since_its_record_was_first_seen() {
        let t0 = Instant::now();
        let observed = Observed::update(None, Some(held_by("agent-b", 3)), t0);
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(
            decide(&observed, ME, D, at(5), wall(5)),
            Decision::HeldBy {
                holder: "agent-b".into(),
                remaining: Duration::from_secs(10)
            }
        );
        // The same record read again does not restart the clock...
        let observed = Observed::update(Some(observed), Some(held_by("agent-b", 3)), at(14));
        assert!(matches!(
            decide(&observed, ME, D, at(14), wall(14)),
            Decision::HeldBy { .. }
        ));
        // ...and once the duration has passed without a renewal, we take over: one more
        // transition, a new acquire time.
        match decide(&observed, ME, D, at(15), wall(15)) {
            Decision::Write(spec) => {
                assert_eq!(holder(&spec), Some(ME));
                assert_eq!(spec.lease_transitions, Some(4));
                assert_eq!(spec.acquire_time, Some(MicroTime(wall(15))));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_renewal_by_the_holder_restarts_the_wait_whatever_the_clocks_say() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let observed = Observed::update(None, Some(held_by("agent-b", 0)), t0);
        let mut renewed = held_by("agent-b", 0);
        // The holder's clock may be far behind ours: only the change matters.
        renewed.renew_time = Some(MicroTime(wall(-3600)));
        let observed = Observed::update(Some(observed), Some(renewed), at(10));
        assert_eq!(observed.since, at(10));
        assert_eq!(
            decide(&observed, ME, D, at(20), wall(20)),
            Decision::HeldBy {
                holder: "agent-b".into(),
                remaining: Duration::from_secs(5)
            }
        );
    }

    #[test]
    fn the_holder_renews_keeping_acquire_time_and_transitions() {
        let t0 = Instant::now();
        let observed = Observed::update(None, Some(held_by(ME, 7)), t0);
        match decide(&observed, ME, D, t0, wall(0)) {
            Decision::Write(spec) => {
                assert_eq!(holder(&spec), Some(ME));
                assert_eq!(spec.lease_transitions, Some(7));
                assert_eq!(spec.acquire_time, Some(MicroTime(wall(-100))));
                assert_eq!(spec.renew_time, Some(MicroTime(wall(0))));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        let t0 = Instant::now();
        let released = release(&held_by("agent-b", 2), "agent-b", wall(0)).expect("theirs");
        assert_eq!(holder(&released), None);
        assert_eq!(released.lease_duration_seconds, Some(1));
        assert_eq!(released.lease_transitions, Some(2));
        let observed = Observed::update(None, Some(released), t0);
        match decide(&observed, ME, D, t0, wall(0)) {
            Decision::Write(spec) => {
                assert_eq!(holder(&spec), Some(ME));
                assert_eq!(spec.lease_transitions, Some(3));
            }
            other => panic!("{other:?}"),
        }
        // An empty identity is no holder either.
        let mut empty = held_by("", 0);
        empty.lease_duration_seconds = Some(3600);
        let observed = Observed::update(None, Some(empty), t0);
        assert!(matches!(
            decide(&observed, ME, D, t0, wall(0)),
            Decision::Write(_)
        ));
    }

    #[test]
    fn only_the_holder_releases() {
        assert!(release(&held_by("agent-b", 0), ME, wall(0)).is_none());
        assert!(release(&LeaseSpec::default(), ME, wall(0)).is_none());
    }
}
