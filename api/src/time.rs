//! Times a toleration counts from, kept to the microsecond (issue 20: a toleration of 1 s must
//! cost 1 s, not 1 s plus the rest of a second lost to a whole-second field).
//!
//! Such a time is stored as a Kubernetes `MicroTime` (RFC 3339 with six fraction digits),
//! rounded so that a toleration never ends early: a stored time is never earlier than the true
//! one (rounded up to the microsecond), and never falls on a whole second (a value that does is
//! moved one microsecond later). So a stored value with no fraction was written with whole
//! seconds (a Kubernetes `Time`, e.g. a condition's `lastTransitionTime`, or a field an older
//! hub wrote): the true instant lies somewhere in the second after it, and [`counted_from`]
//! counts from the end of that second.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// `t` as it is stored: rounded up to the microsecond, and off a whole second.
pub fn stored(t: Timestamp) -> MicroTime {
    let below_micro = i64::from(t.subsec_nanosecond()).rem_euclid(1_000);
    let mut up = if below_micro == 0 {
        0
    } else {
        1_000 - below_micro
    };
    let rounded = later(t, up);
    if rounded.subsec_nanosecond() == 0 {
        up += 1_000;
    }
    MicroTime(later(t, up))
}

/// When counting starts from a stored (or whole-second) time `t`: `t` itself when it has a
/// fraction; the end of its second when it has none (the true instant may be up to a second
/// later than written, and counting from the end never ends a toleration early).
pub fn counted_from(t: Timestamp) -> Timestamp {
    if t.subsec_nanosecond() != 0 {
        t
    } else {
        later(t, 1_000_000_000)
    }
}

fn later(t: Timestamp, nanos: i64) -> Timestamp {
    t.checked_add(SignedDuration::from_nanos(nanos))
        .unwrap_or(Timestamp::MAX)
}

/// Serde for a `metav1.Time` field sent to the microsecond (`#[serde(with =
/// "lifeboat_api::time::micro")]`): `Time` serialises whole seconds, which made a status report
/// changed within a second wait for the next one (its `observedAt` must increase). Reads any
/// RFC 3339 time, so a whole-second value of an older agent is still taken.
pub mod micro {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(t: &Time, serializer: S) -> Result<S::Ok, S::Error> {
        MicroTime(t.0).serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Time, D::Error> {
        Time::deserialize(deserializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    /// What the API server keeps of a stored time: its JSON form, read back.
    fn round_trip(t: &MicroTime) -> Timestamp {
        let json = serde_json::to_value(t).unwrap();
        serde_json::from_value::<MicroTime>(json).unwrap().0
    }

    #[test]
    fn a_stored_time_is_never_earlier_than_the_true_one_and_keeps_its_microseconds() {
        for text in [
            "2026-11-28T04:00:00.123456789Z",
            "2026-11-28T04:00:00.123456001Z",
            "2026-11-28T04:00:00.999999999Z",
            "2026-11-28T04:00:00.5Z",
        ] {
            let true_time = ts(text);
            let read_back = round_trip(&stored(true_time));
            assert!(read_back >= true_time, "{text}: read back {read_back}");
            assert!(
                read_back.duration_since(true_time) <= SignedDuration::from_micros(2),
                "{text}: read back {read_back}"
            );
            assert_eq!(counted_from(read_back), read_back, "{text}");
        }
        assert_eq!(
            serde_json::to_value(stored(ts("2026-11-28T04:00:00.123456789Z"))).unwrap(),
            "2026-11-28T04:00:00.123457Z"
        );
    }

    #[test]
    fn a_true_time_on_a_whole_second_is_stored_just_after_it() {
        let whole = ts("2026-11-28T04:00:01Z");
        assert_eq!(stored(whole).0, ts("2026-11-28T04:00:01.000001Z"));
        // Rounding up onto a whole second moves it off too.
        assert_eq!(
            stored(ts("2026-11-28T04:00:00.9999995Z")).0,
            ts("2026-11-28T04:00:01.000001Z")
        );
        assert_eq!(counted_from(stored(whole).0), stored(whole).0);
    }

    #[test]
    fn a_whole_second_value_counts_from_the_end_of_its_second() {
        // Written by an older hub, or a condition's lastTransitionTime: the true instant is
        // somewhere in 04:00:00.x.
        assert_eq!(
            counted_from(ts("2026-11-28T04:00:00Z")),
            ts("2026-11-28T04:00:01Z")
        );
    }

    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Report {
        #[serde(with = "super::micro")]
        at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    }

    #[test]
    fn a_report_time_goes_to_the_microsecond_and_a_whole_second_one_is_read() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let sent = Report {
            at: Time(ts("2026-11-28T04:00:00.123456Z")),
        };
        let json = serde_json::to_value(&sent).unwrap();
        assert_eq!(json["at"], "2026-11-28T04:00:00.123456Z");
        assert_eq!(serde_json::from_value::<Report>(json).unwrap(), sent);
        let older: Report = serde_json::from_str(r#"{"at": "2026-11-28T04:00:00Z"}"#).unwrap();
        assert_eq!(older.at.0, ts("2026-11-28T04:00:00Z"));
        assert!(serde_json::from_str::<Report>(r#"{"at": "yesterday"}"#).is_err());
    }
}
