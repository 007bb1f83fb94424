//! Just enough of the Kubernetes resource.Quantity grammar to tell whether a request is zero,
//! whether two quantities are equal ("1" == "1000m", "1Ki" == "1024"), to add and subtract them
//! and to print them back. Values are held exactly in nano-units; anything finer is rounded up,
//! as the apiserver rounds up sub-milli values.

use serde_json::Value;

/// A parsed quantity, in nano-units (1 = 10^-9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity(i128);

/// A quantity that does not follow the grammar (or does not fit).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a Kubernetes quantity: {reason}")]
pub struct QuantityError {
    /// The input.
    pub text: String,
    /// Why it was rejected.
    pub reason: &'static str,
}

const NANO: i128 = 1_000_000_000;

impl Quantity {
    /// Parses `<sign?><digits>[.<digits>]<suffix>` with binary (Ki..Ei), decimal (n, u, m, "",
    /// k, M, G, T, P, E) or exponent (`e<int>`, `E<int>`) suffixes.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let fail = |reason| QuantityError {
            text: text.to_string(),
            reason,
        };
        let s = text.trim();
        if s.is_empty() {
            return Err(fail("empty"));
        }
        let (negative, s) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let number_end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, suffix) = s.split_at(number_end);
        let (whole, fraction) = match number.split_once('.') {
            Some((w, f)) => (w, f),
            None => (number, ""),
        };
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(fail("malformed number"));
        }
        // mantissa = whole.fraction as an integer, scale = 10^-len(fraction)
        let digits = format!("{whole}{fraction}");
        let mut mantissa: i128 = 0;
        for b in digits.bytes() {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(i128::from(b - b'0')))
                .ok_or_else(|| fail("too large"))?;
        }
        let mut exp10: i32 = -(fraction.len() as i32);
        let mut multiplier: i128 = 1;
        match suffix {
            "" => {}
            "Ki" => multiplier = 1 << 10,
            "Mi" => multiplier = 1 << 20,
            "Gi" => multiplier = 1 << 30,
            "Ti" => multiplier = 1 << 40,
            "Pi" => multiplier = 1 << 50,
            "Ei" => multiplier = 1 << 60,
            "n" => exp10 -= 9,
            "u" => exp10 -= 6,
            "m" => exp10 -= 3,
            "k" => exp10 += 3,
            "M" => exp10 += 6,
            "G" => exp10 += 9,
            "T" => exp10 += 12,
            "P" => exp10 += 15,
            "E" => exp10 += 18,
            other => {
                let Some(exp) = other.strip_prefix(['e', 'E']) else {
                    return Err(fail("unknown suffix"));
                };
                let exp: i32 = exp.parse().map_err(|_| fail("malformed exponent"))?;
                if !(-64..=64).contains(&exp) {
                    return Err(fail("exponent out of range"));
                }
                exp10 += exp;
            }
        }
        // value in nanos = mantissa * multiplier * 10^(exp10 + 9)
        let mut nanos = mantissa
            .checked_mul(multiplier)
            .ok_or_else(|| fail("too large"))?;
        let shift = exp10 + 9;
        if shift >= 0 {
            for _ in 0..shift {
                nanos = nanos.checked_mul(10).ok_or_else(|| fail("too large"))?;
            }
        } else {
            let divisor = 10i128
                .checked_pow(shift.unsigned_abs())
                .ok_or_else(|| fail("too precise"))?;
            // Round up, as the apiserver does for sub-unit precision.
            nanos = (nanos + divisor - 1) / divisor;
        }
        Ok(Quantity(if negative { -nanos } else { nanos }))
    }

    /// Parses a quantity as it appears in JSON: a string or a number (`cpu: 1`).
    pub fn from_json(value: &Value) -> Result<Self, QuantityError> {
        match value {
            Value::String(s) => Quantity::parse(s),
            Value::Number(n) => Quantity::parse(&n.to_string()),
            other => Err(QuantityError {
                text: other.to_string(),
                reason: "neither a string nor a number",
            }),
        }
    }

    /// The value in nano-units.
    pub fn nanos(self) -> i128 {
        self.0
    }

    /// True for a zero quantity.
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// The sum of two quantities (saturating).
    pub fn saturating_add(self, other: Quantity) -> Quantity {
        Quantity(self.0.saturating_add(other.0))
    }

    /// The quantity times an integer (saturating).
    pub fn saturating_mul(self, factor: i64) -> Quantity {
        Quantity(self.0.saturating_mul(i128::from(factor)))
    }

    /// The difference of two quantities (saturating).
    pub fn saturating_sub(self, other: Quantity) -> Quantity {
        Quantity(self.0.saturating_sub(other.0))
    }

    /// The zero quantity.
    pub const ZERO: Quantity = Quantity(0);

    /// A whole number of units.
    pub fn from_units(units: i64) -> Quantity {
        Quantity(i128::from(units) * NANO)
    }
}

/// The quantity in a canonical form that parses back to the same value: whole units as an
/// integer, or with the largest binary suffix that divides them exactly from `Mi` up (memory);
/// fractions with the coarsest decimal suffix that is exact (`m`, `u`, `n`).
impl std::fmt::Display for Quantity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nanos = self.0;
        if nanos % NANO != 0 {
            for (divisor, suffix) in [(1_000_000, "m"), (1_000, "u"), (1, "n")] {
                if nanos % divisor == 0 {
                    return write!(f, "{}{suffix}", nanos / divisor);
                }
            }
        }
        let units = nanos / NANO;
        if units.abs() >= 1 << 20 {
            for (shift, suffix) in [
                (60, "Ei"),
                (50, "Pi"),
                (40, "Ti"),
                (30, "Gi"),
                (20, "Mi"),
                (10, "Ki"),
            ] {
                let unit = 1i128 << shift;
                if units % unit == 0 {
                    return write!(f, "{}{suffix}", units / unit);
                }
            }
        }
        write!(f, "{units}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn equal_values_in_different_notations() {
        assert_eq!(q("1"), q("1000m"));
        assert_eq!(q("1Ki"), q("1024"));
        assert_eq!(q("1.5"), q("1500m"));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("1000G"), q("1T"));
        assert_eq!(q("10Mi"), Quantity::from_units(10 * 1024 * 1024));
        assert_eq!(q(".5"), q("500m"));
        assert_eq!(q("-1"), Quantity::from_units(-1));
        assert_eq!(
            Quantity::from_json(&serde_json::json!(8)).unwrap(),
            Quantity::from_units(8)
        );
    }

    #[test]
    fn zero_and_rounding() {
        assert!(q("0").is_zero());
        assert!(q("0m").is_zero());
        assert!(q("0Gi").is_zero());
        assert!(!q("1n").is_zero());
        // finer than a nano-unit rounds up, so it is not zero
        assert!(!q("1e-12").is_zero());
    }

    #[test]
    fn display_is_canonical_and_parses_back() {
        for (text, shown) in [
            ("8", "8"),
            ("1000m", "1"),
            ("1500m", "1500m"),
            ("1024Gi", "1Ti"),
            ("1536Mi", "1536Mi"),
            ("2Ti", "2Ti"),
            ("110", "110"),
            ("1k", "1000"),
            ("1Ki", "1024"),
            ("0", "0"),
            ("1u", "1u"),
            ("-250m", "-250m"),
            ("1e-9", "1n"),
        ] {
            assert_eq!(q(text).to_string(), shown, "{text}");
            assert_eq!(q(shown), q(text), "{shown} parses back");
        }
        assert_eq!(q("8").saturating_sub(q("3")), q("5"));
        assert_eq!(q("1").saturating_sub(q("1500m")).to_string(), "-500m");
    }

    #[test]
    fn rejects_malformed() {
        for bad in ["", "abc", "1.2.3", "1Zi", "1e", "1ee3", ".", "1e999"] {
            assert!(Quantity::parse(bad).is_err(), "{bad} was accepted");
        }
        assert!(Quantity::from_json(&serde_json::json!(true)).is_err());
    }
}
