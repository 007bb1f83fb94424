//! The one conversion from Kubernetes quantities to the scheduler's fixed-point integers.
//!
//! Every quantity is parsed once, when a snapshot or a request is built, into milli-units
//! (`1` CPU = 1000, `1Gi` = 1024³ × 1000). Arithmetic during a decision is then plain `i64`.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A quantity that cannot be used for scheduling: not a Kubernetes quantity, or too large.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a usable quantity: {reason}")]
pub struct QuantityError {
    pub text: String,
    pub reason: String,
}

/// Parses a quantity into nano-units. The only call into `lifeboat_api::quantity`: if that module
/// is renamed or reshaped, this is the line to change.
fn parse_nanos(text: &str) -> Result<i128, String> {
    lifeboat_api::quantity::Quantity::parse(text)
        .map(|q| q.nanos())
        .map_err(|e| e.reason.to_string())
}

/// The quantity in milli-units, rounded up (a request of `1n` CPU still needs a milli-CPU).
/// Negative values are returned as they are; callers decide what a negative amount means.
pub fn to_milli(quantity: &Quantity) -> Result<i64, QuantityError> {
    let fail = |reason: String| QuantityError {
        text: quantity.0.clone(),
        reason,
    };
    let nanos = parse_nanos(&quantity.0).map_err(fail)?;
    let milli = if nanos >= 0 {
        (nanos + 999_999) / 1_000_000
    } else {
        nanos / 1_000_000
    };
    i64::try_from(milli).map_err(|_| fail("too large for the scheduler".to_string()))
}

const TI: i64 = 1 << 40;
const GI: i64 = 1 << 30;
const MI: i64 = 1 << 20;

/// Milli-units of a resource, displayed the way a person reads them in a rejection reason:
/// `8`, `500m`, `16Gi`, `1Ti`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Amount<'a> {
    pub resource: &'a str,
    pub milli: i64,
}

impl std::fmt::Display for Amount<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let milli = self.milli;
        if milli == i64::MAX {
            return f.write_str("unlimited");
        }
        if milli % 1000 != 0 {
            return write!(f, "{milli}m");
        }
        let units = milli / 1000;
        let bytes = self.resource == "memory"
            || self.resource == "ephemeral-storage"
            || self.resource.starts_with("hugepages-");
        if bytes && units != 0 && units % TI == 0 {
            write!(f, "{}Ti", units / TI)
        } else if bytes && units != 0 && units % GI == 0 {
            write!(f, "{}Gi", units / GI)
        } else if bytes && units != 0 && units % MI == 0 {
            write!(f, "{}Mi", units / MI)
        } else {
            write!(f, "{units}")
        }
    }
}

/// [`Amount`] as a string.
pub fn format_milli(resource: &str, milli: i64) -> String {
    Amount { resource, milli }.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_string())
    }

    #[test]
    fn milli_units() {
        assert_eq!(to_milli(&q("1")).unwrap(), 1000);
        assert_eq!(to_milli(&q("250m")).unwrap(), 250);
        assert_eq!(to_milli(&q("1Gi")).unwrap(), GI * 1000);
        assert_eq!(to_milli(&q("8")).unwrap(), 8000);
        // finer than a milli-unit rounds up
        assert_eq!(to_milli(&q("1n")).unwrap(), 1);
        assert_eq!(to_milli(&q("-2")).unwrap(), -2000);
    }

    #[test]
    fn unusable_quantities_name_the_text() {
        let err = to_milli(&q("eight")).unwrap_err();
        assert_eq!(err.text, "eight");
        assert!(err.to_string().contains("`eight`"), "{err}");
        let err = to_milli(&q("100E")).unwrap_err();
        assert!(err.reason.contains("too large"), "{err}");
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(format_milli("cpu", 500), "500m");
        assert_eq!(format_milli("cpu", 16_000), "16");
        assert_eq!(format_milli("memory", 64 * GI * 1000), "64Gi");
        assert_eq!(format_milli("memory", 2 * TI * 1000), "2Ti");
        assert_eq!(format_milli("memory", 512 * MI * 1000), "512Mi");
        assert_eq!(format_milli("nvidia.com/gpu", 8000), "8");
    }
}
