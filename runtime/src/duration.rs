//! Go `time.ParseDuration` syntax ("90s", "1m30s", "1.5h", "300ms", "-5s"), which the upstream
//! AppWrapper annotations use, and the same for configuration values.

use std::fmt;

/// A signed duration in nanoseconds, as Go represents it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoDuration(pub i64);

impl GoDuration {
    pub fn as_std(self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.0.max(0) as u64)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("empty duration")]
    Empty,
    #[error("invalid duration {0:?}")]
    Invalid(String),
    #[error("missing unit in duration {0:?} (use ns, us, ms, s, m or h)")]
    MissingUnit(String),
    #[error("unknown unit {unit:?} in duration {input:?}")]
    UnknownUnit { unit: String, input: String },
    #[error("duration {0:?} out of range")]
    Overflow(String),
}

fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        "us" | "µs" | "μs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// Parses a Go duration string.
pub fn parse(input: &str) -> Result<GoDuration, ParseError> {
    let mut s = input;
    if s.is_empty() {
        return Err(ParseError::Empty);
    }
    let negative = s.starts_with('-');
    if let Some(rest) = s.strip_prefix('-').or_else(|| s.strip_prefix('+')) {
        s = rest;
    }
    if s == "0" {
        return Ok(GoDuration(0));
    }
    if s.is_empty() {
        return Err(ParseError::Invalid(input.to_string()));
    }
    // Sum in nanoseconds with 128-bit headroom, then range-check against i64 like Go.
    let mut total: u128 = 0;
    while !s.is_empty() {
        let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
        let (int_part, rest) = s.split_at(int_len);
        let (frac_part, rest) = match rest.strip_prefix('.') {
            Some(after) => {
                let n = after.bytes().take_while(u8::is_ascii_digit).count();
                after.split_at(n)
            }
            None => ("", rest),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(ParseError::Invalid(input.to_string()));
        }
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map(|(i, _)| i)
            .unwrap_or(rest.len());
        let (unit, rest) = rest.split_at(unit_len);
        if unit.is_empty() {
            return Err(ParseError::MissingUnit(input.to_string()));
        }
        let scale = unit_nanos(unit).ok_or_else(|| ParseError::UnknownUnit {
            unit: unit.to_string(),
            input: input.to_string(),
        })?;
        let overflow = || ParseError::Overflow(input.to_string());
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| overflow())?
        };
        let mut value = whole.checked_mul(scale).ok_or_else(overflow)?;
        if !frac_part.is_empty() {
            // Only as many fractional digits as can matter at nanosecond resolution.
            let digits = &frac_part[..frac_part.len().min(18)];
            let frac: u128 = digits.parse().map_err(|_| overflow())?;
            let denom = 10u128.pow(digits.len() as u32);
            value = value
                .checked_add(frac * scale / denom)
                .ok_or_else(overflow)?;
        }
        total = total.checked_add(value).ok_or_else(overflow)?;
        if total > i64::MAX as u128 + u128::from(negative) {
            return Err(overflow());
        }
        s = rest;
    }
    let signed = if negative {
        -(total as i128)
    } else {
        total as i128
    };
    i64::try_from(signed)
        .map(GoDuration)
        .map_err(|_| ParseError::Overflow(input.to_string()))
}

impl fmt::Display for GoDuration {
    /// Prints like Go's `Duration.String` for whole seconds and above ("1h30m0s", "90s" → "1m30s").
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut n = self.0;
        if n == 0 {
            return write!(f, "0s");
        }
        if n < 0 {
            write!(f, "-")?;
            n = n.checked_neg().unwrap_or(i64::MAX);
        }
        let (h, rem) = (n / 3_600_000_000_000, n % 3_600_000_000_000);
        let (m, rem) = (rem / 60_000_000_000, rem % 60_000_000_000);
        let secs = rem as f64 / 1e9;
        if h > 0 {
            write!(f, "{h}h{m}m")?;
        } else if m > 0 {
            write!(f, "{m}m")?;
        }
        if rem % 1_000_000_000 == 0 {
            write!(f, "{}s", rem / 1_000_000_000)
        } else {
            write!(f, "{secs}s")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(s: &str) -> i64 {
        parse(s).unwrap().0
    }

    #[test]
    fn parses_go_durations() {
        assert_eq!(ns("10s"), 10_000_000_000);
        assert_eq!(ns("5m"), 300_000_000_000);
        assert_eq!(ns("1h30m"), 5_400_000_000_000);
        assert_eq!(ns("1.5h"), 5_400_000_000_000);
        assert_eq!(ns("300ms"), 300_000_000);
        assert_eq!(ns("2us"), 2_000);
        assert_eq!(ns("2µs"), 2_000);
        assert_eq!(ns("7ns"), 7);
        assert_eq!(ns("-5s"), -5_000_000_000);
        assert_eq!(ns("+5s"), 5_000_000_000);
        assert_eq!(ns("0"), 0);
        assert_eq!(ns(".5s"), 500_000_000);
        assert_eq!(ns("1m0.25s"), 60_250_000_000);
        assert_eq!(ns("24h"), 86_400_000_000_000);
    }

    #[test]
    fn rejects_what_go_rejects() {
        assert_eq!(parse(""), Err(ParseError::Empty));
        assert!(matches!(
            parse("222badTime"),
            Err(ParseError::UnknownUnit { .. })
        ));
        assert!(matches!(parse("10"), Err(ParseError::MissingUnit(_))));
        assert!(matches!(parse("s"), Err(ParseError::Invalid(_))));
        assert!(matches!(parse("-"), Err(ParseError::Invalid(_))));
        assert!(matches!(parse("1d"), Err(ParseError::UnknownUnit { .. })));
        assert!(matches!(parse("10 s"), Err(ParseError::UnknownUnit { .. })));
        assert!(matches!(parse("3000000h"), Err(ParseError::Overflow(_))));
    }

    #[test]
    fn displays_like_go() {
        assert_eq!(GoDuration(90_000_000_000).to_string(), "1m30s");
        assert_eq!(GoDuration(5_400_000_000_000).to_string(), "1h30m0s");
        assert_eq!(GoDuration(10_000_000_000).to_string(), "10s");
        assert_eq!(GoDuration(0).to_string(), "0s");
        assert_eq!(GoDuration(-5_000_000_000).to_string(), "-5s");
    }
}
