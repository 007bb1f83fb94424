//! Kubernetes resource quantities (`resource.Quantity`): the one implementation Lifeboat uses
//! (the Lua `kube` helpers and result comparisons in `lifeboat-interpreter`, legacy AppWrapper
//! conversion, Autopilot resource checks).
//!
//! A value is kept exactly as `mantissa * 10^exponent` (binary suffixes are folded into the
//! mantissa), so `"1Gi" + "512Mi"` and `"1" == "1000m"` are exact. The grammar is Kubernetes'
//! `resource.ParseQuantity`: `<sign?><digits>[.<digits>]<suffix>` with binary (`Ki`..`Ei`),
//! decimal (`n`, `u`, `m`, none, `k`, `M`, `G`, `T`, `P`, `E`) or exponent (`e3`, `E-2`)
//! suffixes, nothing around it (surrounding spaces are an error, as in Kubernetes). Like
//! Kubernetes, anything finer than nano units is rounded away from zero to `1n`.

use std::cmp::Ordering;
use std::fmt;

use serde_json::Value;

/// How a quantity prints, taken from the suffix it was written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantityFormat {
    /// `Ki`, `Mi`, `Gi`, ...
    BinarySI,
    /// `m`, `k`, `M`, `G`, ... or no suffix.
    DecimalSI,
    /// `1e3`, `5E-3`.
    DecimalExponent,
}

/// An exact Kubernetes quantity. Equality and ordering compare values ("1" == "1000m"), not
/// the way the quantity was written.
#[derive(Debug, Clone, Copy)]
pub struct Quantity {
    mantissa: i128,
    exponent: i32,
    format: QuantityFormat,
}

/// A quantity that does not follow the grammar (or does not fit).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a Kubernetes quantity: {reason}")]
pub struct QuantityError {
    /// The input.
    pub text: String,
    /// Why it was rejected.
    pub reason: &'static str,
}

const NANO_EXPONENT: i32 = -9;

impl Quantity {
    /// Zero, printed as `0`.
    pub const ZERO: Quantity = Quantity {
        mantissa: 0,
        exponent: 0,
        format: QuantityFormat::DecimalSI,
    };

    /// Parses `123`, `1.5`, `100m`, `2Gi`, `1e3`, `-5k`, `.5` (Kubernetes' `ParseQuantity`).
    pub fn parse(text: &str) -> Result<Quantity, QuantityError> {
        let err = |reason| QuantityError {
            text: text.to_string(),
            reason,
        };
        if text.is_empty() {
            return Err(err("empty"));
        }
        let bytes = text.as_bytes();
        let mut pos = 0;
        let mut negative = false;
        if bytes[0] == b'+' || bytes[0] == b'-' {
            negative = bytes[0] == b'-';
            pos = 1;
        }
        let int_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        let int_digits = &text[int_start..pos];
        let mut frac_digits = "";
        if pos < bytes.len() && bytes[pos] == b'.' {
            pos += 1;
            let frac_start = pos;
            while pos < bytes.len() && bytes[pos].is_ascii_digit() {
                pos += 1;
            }
            frac_digits = &text[frac_start..pos];
        }
        if int_digits.is_empty() && frac_digits.is_empty() {
            return Err(err("no digits"));
        }
        let suffix = &text[pos..];
        let (format, exponent10, binary_shift) =
            parse_suffix(suffix).ok_or_else(|| err("unknown suffix"))?;

        let mut mantissa: i128 = 0;
        for digit in int_digits.bytes().chain(frac_digits.bytes()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(i128::from(digit - b'0')))
                .ok_or_else(|| err("too many digits"))?;
        }
        let frac_len = i32::try_from(frac_digits.len()).map_err(|_| err("too many digits"))?;
        let mut exponent = exponent10 - frac_len;
        if binary_shift > 0 {
            mantissa = mantissa
                .checked_mul(1i128 << binary_shift)
                .ok_or_else(|| err("value too large"))?;
        }
        if negative {
            mantissa = -mantissa;
        }
        // Finer than nano: round away from zero to nano precision, like Kubernetes.
        if exponent < NANO_EXPONENT {
            let shift = u32::try_from(NANO_EXPONENT - exponent)
                .map_err(|_| err("exponent out of range"))?;
            mantissa = match 10i128.checked_pow(shift) {
                Some(divisor) => round_away(mantissa, divisor),
                // Smaller than 10^-38 of a unit: one nano-unit of the same sign.
                None => mantissa.signum(),
            };
            exponent = NANO_EXPONENT;
        }
        let mut quantity = Quantity {
            mantissa,
            exponent,
            format,
        };
        quantity.normalize();
        if format == QuantityFormat::BinarySI && quantity.mantissa != 0 && quantity.abs_below_one()
        {
            quantity.format = QuantityFormat::DecimalSI;
        }
        Ok(quantity)
    }

    /// Parses a quantity as it appears in JSON: a string, or a bare number (`cpu: 1`), which
    /// Kubernetes accepts too.
    pub fn from_json(value: &Value) -> Result<Quantity, QuantityError> {
        match value {
            Value::String(s) => Quantity::parse(s),
            Value::Number(n) => Quantity::parse(&n.to_string()),
            other => Err(QuantityError {
                text: other.to_string(),
                reason: "neither a string nor a number",
            }),
        }
    }

    /// A quantity of whole units (`NewQuantity`).
    pub fn new(units: i64, format: QuantityFormat) -> Quantity {
        let mut q = Quantity {
            mantissa: i128::from(units),
            exponent: 0,
            format,
        };
        q.normalize();
        q
    }

    /// A quantity of thousandths (`NewMilliQuantity`).
    pub fn new_milli(millis: i64, format: QuantityFormat) -> Quantity {
        let mut q = Quantity {
            mantissa: i128::from(millis),
            exponent: -3,
            format,
        };
        q.normalize();
        q
    }

    /// A whole number of units, printed in decimal SI.
    pub fn from_units(units: i64) -> Quantity {
        Quantity::new(units, QuantityFormat::DecimalSI)
    }

    pub fn format(&self) -> QuantityFormat {
        self.format
    }

    pub fn is_zero(&self) -> bool {
        self.mantissa == 0
    }

    pub fn is_negative(&self) -> bool {
        self.mantissa < 0
    }

    /// The value in nano-units (computed quantities finer than that rounded away from zero),
    /// saturating at the bounds of `i128`.
    pub fn nanos(&self) -> i128 {
        self.scaled_round_up(NANO_EXPONENT)
    }

    /// Exact sum; the result keeps the format of `self`, or of `other` when `self` is zero
    /// (Kubernetes `Quantity.Add`). `None` when the exact sum does not fit.
    pub fn checked_add(&self, other: &Quantity) -> Option<Quantity> {
        let format = if self.mantissa == 0 {
            other.format
        } else {
            self.format
        };
        let exponent = self.exponent.min(other.exponent);
        let a = scale_to(self.mantissa, self.exponent, exponent)?;
        let b = scale_to(other.mantissa, other.exponent, exponent)?;
        let mut q = Quantity {
            mantissa: a.checked_add(b)?,
            exponent,
            format,
        };
        q.normalize();
        Some(q)
    }

    /// The sum; when the exact sum does not fit, the operand of larger magnitude (the other
    /// is below its precision) or the largest representable value of the sum's sign.
    pub fn saturating_add(self, other: Quantity) -> Quantity {
        if let Some(sum) = self.checked_add(&other) {
            return sum;
        }
        let exponent = self.exponent.max(other.exponent);
        let a = scale_to(self.mantissa, self.exponent, exponent);
        let b = scale_to(other.mantissa, other.exponent, exponent);
        match (a, b) {
            (Some(a), Some(b)) => {
                let mut q = Quantity {
                    mantissa: a.saturating_add(b),
                    exponent,
                    format: self.format,
                };
                q.normalize();
                q
            }
            _ if self.cmp_abs(&other) == Ordering::Less => other,
            _ => self,
        }
    }

    /// The difference (`self + (-other)`, saturating as [`Quantity::saturating_add`]).
    pub fn saturating_sub(self, other: Quantity) -> Quantity {
        let negated = Quantity {
            mantissa: other.mantissa.saturating_neg(),
            ..other
        };
        self.saturating_add(negated)
    }

    /// The quantity times an integer, saturating at the largest representable value.
    pub fn saturating_mul(self, factor: i64) -> Quantity {
        let mut q = Quantity {
            mantissa: self.mantissa.saturating_mul(i128::from(factor)),
            ..self
        };
        q.normalize();
        q
    }

    /// Whole units, rounded up (`Quantity.Value`).
    pub fn value(&self) -> i64 {
        self.scaled_ceil(0)
    }

    /// Thousandths, rounded up (`Quantity.MilliValue`).
    pub fn milli_value(&self) -> i64 {
        self.scaled_ceil(-3)
    }

    /// An approximate float (`AsApproximateFloat64`).
    pub fn as_f64(&self) -> f64 {
        (self.mantissa as f64) * 10f64.powi(self.exponent)
    }

    fn scaled_ceil(&self, target_exponent: i32) -> i64 {
        let value = self.scaled_round_up(target_exponent);
        i64::try_from(value).unwrap_or(if value < 0 { i64::MIN } else { i64::MAX })
    }

    /// The value in units of `10^target_exponent`, rounded away from zero (Kubernetes'
    /// RoundUp), saturating at the bounds of `i128`.
    fn scaled_round_up(&self, target_exponent: i32) -> i128 {
        if self.exponent >= target_exponent {
            return scale_to(self.mantissa, self.exponent, target_exponent)
                .unwrap_or(saturated(self.mantissa));
        }
        let shift = u32::try_from(target_exponent - self.exponent).unwrap_or(u32::MAX);
        match 10i128.checked_pow(shift) {
            Some(divisor) => round_away(self.mantissa, divisor),
            None => self.mantissa.signum(),
        }
    }

    fn abs_below_one(&self) -> bool {
        self.cmp_abs(&Quantity::from_units(1)) == Ordering::Less
    }

    /// Compares magnitudes.
    fn cmp_abs(&self, other: &Quantity) -> Ordering {
        let abs = |q: &Quantity| Quantity {
            mantissa: q.mantissa.saturating_abs(),
            ..*q
        };
        abs(self).cmp_value(&abs(other))
    }

    /// Removes trailing decimal zeros from the mantissa so equal values compare structurally.
    fn normalize(&mut self) {
        if self.mantissa == 0 {
            self.exponent = 0;
            return;
        }
        while self.mantissa % 10 == 0 {
            self.mantissa /= 10;
            self.exponent += 1;
        }
    }

    /// Compares values, ignoring formats.
    pub fn cmp_value(&self, other: &Quantity) -> Ordering {
        let exponent = self.exponent.min(other.exponent);
        match (
            scale_to(self.mantissa, self.exponent, exponent),
            scale_to(other.mantissa, other.exponent, exponent),
        ) {
            (Some(a), Some(b)) => a.cmp(&b),
            // Only reachable for absurd exponents: fall back to floats.
            _ => self.as_f64().total_cmp(&other.as_f64()),
        }
    }

    /// The canonical string (`Quantity.String()` for a computed quantity).
    pub fn canonical(&self) -> String {
        if self.mantissa == 0 {
            return "0".to_string();
        }
        let mut format = self.format;
        if format == QuantityFormat::BinarySI
            && (self.exponent < 0 || self.cmp_abs(&Quantity::from_units(1024)) == Ordering::Less)
        {
            format = QuantityFormat::DecimalSI;
        }
        if format == QuantityFormat::BinarySI
            && let Some(mut value) = scale_to(self.mantissa, self.exponent, 0)
        {
            // Integral and at least 1024 in magnitude here.
            let mut power = 0;
            while power < 6 && value % 1024 == 0 {
                value /= 1024;
                power += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][power];
            return format!("{value}{suffix}");
        }
        let mut mantissa = self.mantissa;
        let mut exponent = self.exponent;
        // Exponent down to a multiple of three.
        let rem = exponent.rem_euclid(3);
        if let Some(scaled) = 10i128
            .checked_pow(rem.unsigned_abs())
            .and_then(|f| mantissa.checked_mul(f))
        {
            mantissa = scaled;
            exponent -= rem;
        }
        if format == QuantityFormat::DecimalExponent || exponent.rem_euclid(3) != 0 {
            if exponent == 0 {
                return format!("{mantissa}");
            }
            return format!("{mantissa}e{exponent}");
        }
        let suffix = match exponent {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            0 => "",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            _ => return format!("{mantissa}e{exponent}"),
        };
        format!("{mantissa}{suffix}")
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.cmp_value(other) == Ordering::Equal
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.cmp_value(other)
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

/// `mantissa / divisor`, rounded away from zero.
fn round_away(mantissa: i128, divisor: i128) -> i128 {
    let quotient = mantissa / divisor;
    match (mantissa % divisor).signum() {
        1 => quotient + 1,
        -1 => quotient - 1,
        _ => quotient,
    }
}

fn saturated(sign_of: i128) -> i128 {
    if sign_of < 0 { i128::MIN } else { i128::MAX }
}

fn scale_to(mantissa: i128, from: i32, to: i32) -> Option<i128> {
    if from == to {
        return Some(mantissa);
    }
    if from > to {
        let shift = u32::try_from(from.checked_sub(to)?).ok()?;
        mantissa.checked_mul(10i128.checked_pow(shift)?)
    } else {
        let shift = u32::try_from(to.checked_sub(from)?).ok()?;
        Some(match 10i128.checked_pow(shift) {
            Some(divisor) => mantissa / divisor,
            None => 0,
        })
    }
}

/// Returns (format, decimal exponent, binary shift).
fn parse_suffix(suffix: &str) -> Option<(QuantityFormat, i32, u32)> {
    use QuantityFormat::*;
    Some(match suffix {
        "" => (DecimalSI, 0, 0),
        "n" => (DecimalSI, -9, 0),
        "u" => (DecimalSI, -6, 0),
        "m" => (DecimalSI, -3, 0),
        "k" => (DecimalSI, 3, 0),
        "M" => (DecimalSI, 6, 0),
        "G" => (DecimalSI, 9, 0),
        "T" => (DecimalSI, 12, 0),
        "P" => (DecimalSI, 15, 0),
        "E" => (DecimalSI, 18, 0),
        "Ki" => (BinarySI, 0, 10),
        "Mi" => (BinarySI, 0, 20),
        "Gi" => (BinarySI, 0, 30),
        "Ti" => (BinarySI, 0, 40),
        "Pi" => (BinarySI, 0, 50),
        "Ei" => (BinarySI, 0, 60),
        _ => {
            let rest = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))?;
            let digits = rest.strip_prefix(['+', '-']).unwrap_or(rest);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 4
            {
                return None;
            }
            (DecimalExponent, rest.parse().ok()?, 0)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn subtraction_is_exact_across_suffixes() {
        let q = |t: &str| Quantity::parse(t).unwrap();
        assert_eq!(q("8").saturating_sub(q("3")), q("5"));
        assert_eq!(q("1Gi").saturating_sub(q("512Mi")), q("512Mi"));
        assert_eq!(q("1").saturating_sub(q("1500m")), q("-500m"));
    }

    #[test]
    fn canonical_forms_match_kubernetes() {
        for (input, canonical) in [
            ("1", "1"),
            ("1000m", "1"),
            ("1.5", "1500m"),
            ("0.5", "500m"),
            ("2048m", "2048m"),
            ("1Gi", "1Gi"),
            ("1024Mi", "1Gi"),
            ("1536Mi", "1536Mi"),
            ("1000", "1k"),
            ("1e3", "1e3"),
            ("1.5Gi", "1536Mi"),
            ("100Mi", "100Mi"),
            ("0", "0"),
            ("0m", "0"),
            ("512", "512"),
            ("12e2", "1200"),
            ("-5k", "-5k"),
            (".5", "500m"),
            ("+2", "2"),
            ("5.", "5"),
            ("0.0000000001", "1n"),
            ("-0.0000000001", "-1n"),
        ] {
            assert_eq!(q(input).canonical(), canonical, "canonical of {input}");
        }
    }

    #[test]
    fn rejects_what_kubernetes_rejects() {
        for bad in [
            "", "abc", "1K", "1.2.3", "Mi", "1 Gi", "--1", "1e", "1Zi", "1ee3", ".", "1e99999",
        ] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?} should not parse");
        }
        // resource.ParseQuantity does not trim: surrounding spaces are an error.
        for spaced in [" 1", "1 ", " 1Gi ", "\t500m", "1\n"] {
            let err = Quantity::parse(spaced).unwrap_err();
            assert_eq!(err.text, spaced);
            assert!(
                err.to_string().contains("not a Kubernetes quantity"),
                "{err}"
            );
        }
        assert!(Quantity::from_json(&serde_json::json!(true)).is_err());
        assert!(Quantity::from_json(&serde_json::json!(" 2")).is_err());
    }

    #[test]
    fn addition_is_exact_and_keeps_first_format() {
        let sum = q("1Gi").checked_add(&q("512Mi")).unwrap();
        assert_eq!(sum.canonical(), "1536Mi");
        let sum = Quantity::ZERO
            .checked_add(&q("250m"))
            .unwrap()
            .checked_add(&q("1"))
            .unwrap();
        assert_eq!(sum.canonical(), "1250m");
        let sum = q("100Mi").checked_add(&q("1G")).unwrap();
        assert_eq!(sum.canonical(), "1104857600");
        assert_eq!(q("1").saturating_add(q("500m")), q("1.5"));
        // Too far apart to add exactly: the tiny operand is below the big one's precision.
        assert_eq!(q("1e30").saturating_add(q("1n")), q("1e30"));
        assert_eq!(q("3").saturating_mul(4), q("12"));
    }

    #[test]
    fn value_milli_value_and_nanos_round_up() {
        assert_eq!(q("1500m").value(), 2);
        assert_eq!(q("1Ki").value(), 1024);
        assert_eq!(q("0.1m").milli_value(), 1);
        assert_eq!(q("2").milli_value(), 2000);
        assert_eq!(q("500m").as_f64(), 0.5);
        assert_eq!(q("1").nanos(), 1_000_000_000);
        assert_eq!(q("1e-12").nanos(), 1);
        assert!(!q("1e-12").is_zero());
        assert_eq!(q("-1.5n").nanos(), -2);
    }

    #[test]
    fn equality_and_order_ignore_representation() {
        assert_eq!(q("1"), q("1000m"));
        assert_eq!(q("1Ki"), q("1024"));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("1000G"), q("1T"));
        assert_eq!(q("10Mi"), Quantity::from_units(10 * 1024 * 1024));
        assert_eq!(q("-1"), Quantity::from_units(-1));
        assert_ne!(q("1k"), q("1Ki"));
        assert!(q("1k") < q("1Ki"));
        assert!(q("0Gi").is_zero() && q("0m").is_zero());
        assert_eq!(Quantity::from_json(&serde_json::json!(8)).unwrap(), q("8"));
        assert_eq!(
            Quantity::from_json(&serde_json::json!(0.5)).unwrap(),
            q("500m")
        );
        assert_eq!(
            Quantity::new(3, QuantityFormat::BinarySI).canonical(),
            "3",
            "below 1024 a binary quantity prints in decimal"
        );
        assert_eq!(
            Quantity::new_milli(1500, QuantityFormat::DecimalSI).canonical(),
            "1500m"
        );
    }
}
