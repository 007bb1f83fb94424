//! Per-AppWrapper fault-tolerance parameters: the operator defaults, overridden by the
//! AppWrapper's annotations, every duration clipped to [0, GracePeriodMaximum]. A malformed
//! annotation keeps the default and is reported (condition message and Event), never fatal.

use std::collections::BTreeMap;
use std::time::Duration;

use lifeboat_api::appwrapper::constants::annotations as ann;

use crate::config::FaultToleranceConfig;
use crate::duration;

/// The effective parameters for one AppWrapper.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub admission_grace: Duration,
    pub warmup_grace: Duration,
    pub failure_grace: Duration,
    pub retry_pause: Duration,
    pub retry_limit: i32,
    pub forceful_deletion_grace: Duration,
    pub deletion_on_failure_grace: Duration,
    pub success_ttl: Duration,
    pub terminal_exit_codes: Vec<i32>,
    pub retryable_exit_codes: Vec<i32>,
}

/// An annotation that could not be used as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationProblem {
    pub annotation: &'static str,
    pub value: String,
    pub reason: String,
}

impl std::fmt::Display for AnnotationProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "annotation {}={:?}: {}",
            self.annotation, self.value, self.reason
        )
    }
}

impl Params {
    /// Defaults only (what an unannotated AppWrapper gets).
    pub fn defaults(config: &FaultToleranceConfig) -> Self {
        let max = config.grace_period_maximum;
        Self {
            admission_grace: config.admission_grace_period.min(max),
            warmup_grace: config.warmup_grace_period.min(max),
            failure_grace: config.failure_grace_period.min(max),
            retry_pause: config.retry_pause_period.min(max),
            retry_limit: config.retry_limit,
            forceful_deletion_grace: config.forceful_deletion_grace_period.min(max),
            deletion_on_failure_grace: Duration::ZERO,
            success_ttl: config.success_ttl,
            terminal_exit_codes: Vec::new(),
            retryable_exit_codes: Vec::new(),
        }
    }

    /// The parameters for an AppWrapper with these annotations, and the problems found.
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
        config: &FaultToleranceConfig,
    ) -> (Self, Vec<AnnotationProblem>) {
        let mut params = Self::defaults(config);
        let mut problems = Vec::new();
        let max = config.grace_period_maximum;
        let mut duration_of = |key: &'static str, target: &mut Duration| {
            let Some(value) = annotations.get(key) else {
                return;
            };
            match duration::parse(value) {
                Ok(d) => {
                    let clipped = if d.0 < 0 {
                        problems.push(AnnotationProblem {
                            annotation: key,
                            value: value.clone(),
                            reason: "negative; using 0s".into(),
                        });
                        Duration::ZERO
                    } else {
                        d.as_std()
                    };
                    if clipped > max {
                        problems.push(AnnotationProblem {
                            annotation: key,
                            value: value.clone(),
                            reason: format!(
                                "exceeds the grace period maximum; using {}",
                                duration::GoDuration(max.as_nanos() as i64)
                            ),
                        });
                    }
                    *target = clipped.min(max);
                }
                Err(e) => problems.push(AnnotationProblem {
                    annotation: key,
                    value: value.clone(),
                    reason: format!("{e}; using the default"),
                }),
            }
        };
        duration_of(ann::ADMISSION_GRACE_PERIOD, &mut params.admission_grace);
        duration_of(ann::WARMUP_GRACE_PERIOD, &mut params.warmup_grace);
        duration_of(ann::FAILURE_GRACE_PERIOD, &mut params.failure_grace);
        duration_of(ann::RETRY_PAUSE_PERIOD, &mut params.retry_pause);
        duration_of(
            ann::FORCEFUL_DELETION_GRACE_PERIOD,
            &mut params.forceful_deletion_grace,
        );
        duration_of(
            ann::DELETION_ON_FAILURE_GRACE_PERIOD,
            &mut params.deletion_on_failure_grace,
        );
        // The success TTL is not clipped to the maximum: the annotation can only shorten the
        // operator's TTL (upstream rule: used when 0 < d < the configured TTL).
        if let Some(value) = annotations.get(ann::SUCCESS_TTL) {
            match duration::parse(value) {
                Ok(d) if d.0 > 0 && d.as_std() < config.success_ttl => {
                    params.success_ttl = d.as_std()
                }
                Ok(_) => problems.push(AnnotationProblem {
                    annotation: ann::SUCCESS_TTL,
                    value: value.clone(),
                    reason: "can only shorten the operator's success TTL; using the default".into(),
                }),
                Err(e) => problems.push(AnnotationProblem {
                    annotation: ann::SUCCESS_TTL,
                    value: value.clone(),
                    reason: format!("{e}; using the default"),
                }),
            }
        }
        if let Some(value) = annotations.get(ann::RETRY_LIMIT) {
            match value.trim().parse::<i32>() {
                Ok(n) => params.retry_limit = n,
                Err(e) => problems.push(AnnotationProblem {
                    annotation: ann::RETRY_LIMIT,
                    value: value.clone(),
                    reason: format!("not an integer ({e}); using the default"),
                }),
            }
        }
        for (key, target) in [
            (ann::TERMINAL_EXIT_CODES, &mut params.terminal_exit_codes),
            (ann::RETRYABLE_EXIT_CODES, &mut params.retryable_exit_codes),
        ] {
            if let Some(value) = annotations.get(key) {
                let (codes, bad) = parse_exit_codes(value);
                *target = codes;
                if !bad.is_empty() {
                    problems.push(AnnotationProblem {
                        annotation: key,
                        value: value.clone(),
                        reason: format!(
                            "ignored entries that are not integers: {}",
                            bad.join(", ")
                        ),
                    });
                }
            }
        }
        (params, problems)
    }

    /// Upstream's terminal-failure rule for one non-zero exit code.
    pub fn is_terminal_exit_code(&self, code: i32) -> bool {
        if code == 0 {
            return false;
        }
        if !self.terminal_exit_codes.is_empty() && self.terminal_exit_codes.contains(&code) {
            return true;
        }
        !self.retryable_exit_codes.is_empty() && !self.retryable_exit_codes.contains(&code)
    }
}

/// Comma-separated integers. Unlike upstream, whitespace around entries is allowed ("3, 10"
/// means 3 and 10); entries that are not integers are returned separately.
pub fn parse_exit_codes(value: &str) -> (Vec<i32>, Vec<String>) {
    let mut codes = Vec::new();
    let mut bad = Vec::new();
    for token in value.split(',') {
        let token = token.trim();
        if token.is_empty() {
            continue;
        }
        match token.parse::<i32>() {
            Ok(n) => codes.push(n),
            Err(_) => bad.push(token.to_string()),
        }
    }
    (codes, bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn unannotated_appwrappers_use_defaults() {
        let config = FaultToleranceConfig::default();
        let (p, problems) = Params::from_annotations(&BTreeMap::new(), &config);
        assert!(problems.is_empty());
        assert_eq!(p.admission_grace, config.admission_grace_period);
        assert_eq!(p.warmup_grace, config.warmup_grace_period);
        assert_eq!(p.failure_grace, config.failure_grace_period);
        assert_eq!(p.retry_pause, config.retry_pause_period);
        assert_eq!(p.retry_limit, config.retry_limit);
        assert_eq!(
            p.forceful_deletion_grace,
            config.forceful_deletion_grace_period
        );
        assert_eq!(p.deletion_on_failure_grace, Duration::ZERO);
        assert_eq!(p.success_ttl, config.success_ttl);
    }

    #[test]
    fn valid_annotations_override_defaults() {
        let config = FaultToleranceConfig::default();
        let ten = "10s";
        let (p, problems) = Params::from_annotations(
            &annotations(&[
                (ann::ADMISSION_GRACE_PERIOD, ten),
                (ann::WARMUP_GRACE_PERIOD, ten),
                (ann::FAILURE_GRACE_PERIOD, ten),
                (ann::RETRY_PAUSE_PERIOD, ten),
                (ann::FORCEFUL_DELETION_GRACE_PERIOD, ten),
                (ann::DELETION_ON_FAILURE_GRACE_PERIOD, ten),
                (ann::SUCCESS_TTL, ten),
                (ann::RETRY_LIMIT, "101"),
            ]),
            &config,
        );
        assert!(problems.is_empty(), "{problems:?}");
        let d = Duration::from_secs(10);
        assert_eq!(
            [
                p.admission_grace,
                p.warmup_grace,
                p.failure_grace,
                p.retry_pause,
                p.forceful_deletion_grace,
                p.deletion_on_failure_grace,
                p.success_ttl
            ],
            [d; 7]
        );
        assert_eq!(p.retry_limit, 101);
    }

    #[test]
    fn malformed_annotations_use_defaults_and_are_reported() {
        let config = FaultToleranceConfig::default();
        let (p, problems) = Params::from_annotations(
            &annotations(&[
                (ann::FAILURE_GRACE_PERIOD, "222badTime"),
                (ann::RETRY_LIMIT, "abc"),
                (ann::DELETION_ON_FAILURE_GRACE_PERIOD, "soon"),
            ]),
            &config,
        );
        assert_eq!(p.failure_grace, config.failure_grace_period);
        assert_eq!(p.retry_limit, config.retry_limit);
        assert_eq!(p.deletion_on_failure_grace, Duration::ZERO);
        assert_eq!(problems.len(), 3);
        assert!(
            problems
                .iter()
                .any(|pr| pr.annotation == ann::RETRY_LIMIT && pr.value == "abc")
        );
        let text = problems[0].to_string();
        assert!(text.contains("222badTime") || text.contains("abc") || text.contains("soon"));
    }

    #[test]
    fn out_of_bounds_annotations_are_clipped() {
        let config = FaultToleranceConfig::default();
        let twice = "48h";
        let (p, problems) = Params::from_annotations(
            &annotations(&[
                (ann::ADMISSION_GRACE_PERIOD, "-10s"),
                (ann::RETRY_PAUSE_PERIOD, "-1m"),
                (ann::WARMUP_GRACE_PERIOD, twice),
                (ann::FAILURE_GRACE_PERIOD, twice),
                (ann::FORCEFUL_DELETION_GRACE_PERIOD, twice),
                (ann::DELETION_ON_FAILURE_GRACE_PERIOD, twice),
                (ann::SUCCESS_TTL, "168h10s"),
            ]),
            &config,
        );
        assert_eq!(p.admission_grace, Duration::ZERO);
        assert_eq!(p.retry_pause, Duration::ZERO);
        let day = Duration::from_secs(86400);
        assert_eq!(p.warmup_grace, day);
        assert_eq!(p.failure_grace, day);
        assert_eq!(p.forceful_deletion_grace, day);
        assert_eq!(p.deletion_on_failure_grace, day);
        // The TTL annotation can only shorten: config + 10s gives the config value.
        assert_eq!(p.success_ttl, config.success_ttl);
        assert!(problems.len() >= 6);
    }

    #[test]
    fn exit_codes_parse_and_classify() {
        assert_eq!(
            parse_exit_codes("3,10,abc,42"),
            (vec![3, 10, 42], vec!["abc".into()])
        );
        assert_eq!(parse_exit_codes("x,10,20").0, vec![10, 20]);
        assert_eq!(parse_exit_codes("3, 10").0, vec![3, 10]);
        let config = FaultToleranceConfig::default();
        let (p, _) =
            Params::from_annotations(&annotations(&[(ann::TERMINAL_EXIT_CODES, "3,10")]), &config);
        assert!(p.is_terminal_exit_code(3));
        assert!(!p.is_terminal_exit_code(1));
        assert!(!p.is_terminal_exit_code(0));
        let (p, _) =
            Params::from_annotations(&annotations(&[(ann::RETRYABLE_EXIT_CODES, "1,2")]), &config);
        assert!(!p.is_terminal_exit_code(1));
        assert!(p.is_terminal_exit_code(3));
        let (p, _) = Params::from_annotations(&BTreeMap::new(), &config);
        assert!(
            !p.is_terminal_exit_code(3),
            "without annotations nothing is terminal"
        );
    }
}
