//! Running the interpreters on one observed object: health, reflected status, the failures
//! and what they cost, the lane of its kind.

use super::*;

impl Fingerprint {
    /// The fingerprint of `observed` under `interpreters`.
    pub fn of(observed: &ObservedObject, interpreters: &Interpreters) -> Fingerprint {
        // Two independently seeded hashers, shared by every thread of the process.
        static SEEDS: OnceLock<(
            foldhash::quality::RandomState,
            foldhash::quality::RandomState,
        )> = OnceLock::new();
        let (s1, s2) = SEEDS.get_or_init(Default::default);
        let text = observed.json().as_bytes();
        Fingerprint {
            generation: interpreters.generation(),
            object: (u128::from(s1.hash_one(text)) << 64) | u128::from(s2.hash_one(text)),
        }
    }
}

impl Interpreted {
    /// Runs InterpretHealth and ReflectStatus on `observed` (whose fingerprint is `fingerprint`).
    /// The object is parsed here, on the interpreting thread, and freed there.
    pub fn run(
        observed: &ObservedObject,
        fingerprint: Fingerprint,
        interpreters: &Interpreters,
    ) -> Interpreted {
        match observed.to_value() {
            Ok(object) => {
                let mut interpreted = interpret(interpreters, &object);
                interpreted.fingerprint = fingerprint;
                interpreted
            }
            // The API took it as JSON, so this is not expected; the item says why if it happens.
            Err(e) => Interpreted {
                fingerprint,
                verdict: HealthVerdict::Failed(format!(
                    "the observed object cannot be parsed: {e}"
                )),
                reflected: None,
                kind: None,
                failures: Vec::new(),
                costs: Vec::new(),
            },
        }
    }
}

/// Health and reflected status of an observed object. A kind without a ReflectStatus rule
/// reflects its whole `status`, as Karmada's fallback does. The fingerprint is the caller's to
/// set.
pub(super) fn interpret(interpreters: &Interpreters, observed: &serde_json::Value) -> Interpreted {
    let mut failures = Vec::new();
    let mut costs = Vec::new();
    let health = interpreters.evaluate_health(observed);
    costs.push(cost_of(&health, Operation::InterpretHealth));
    let verdict = match health.result {
        Ok(None) => HealthVerdict::NoRule,
        Ok(Some(health)) => HealthVerdict::Judged {
            health: match health.state {
                HealthState::Healthy => ResourceHealth::Healthy,
                HealthState::Unhealthy => ResourceHealth::Unhealthy,
                HealthState::Unknown => ResourceHealth::Unknown,
            },
            reason: health.reason,
            class: health.class,
        },
        Err(failure) => {
            let verdict = HealthVerdict::Failed(failure.message.clone());
            failures.push(failure);
            verdict
        }
    };
    let status = interpreters.evaluate_status(observed);
    costs.push(cost_of(&status, Operation::InterpretStatus));
    let reflected = match status.result {
        Ok(Some(status)) => Some(status),
        Ok(None) => observed.get("status").cloned(),
        Err(failure) => {
            tracing::debug!(error = %failure.message, "ReflectStatus failed; reflecting nothing");
            failures.push(failure);
            None
        }
    };
    Interpreted {
        fingerprint: Fingerprint {
            generation: interpreters.generation(),
            object: 0,
        },
        verdict,
        reflected,
        kind: kind_of_value(observed),
        failures,
        costs,
    }
}

/// What an operation cost, for the metrics.
pub(super) fn cost_of<T>(evaluated: &Evaluated<T>, operation: Operation) -> Cost {
    let outcome = match &evaluated.result {
        Ok(_) => Outcome::Ok,
        Err(f) if matches!(f.limit, Some(Limit::WallClock | Limit::Instructions)) => {
            Outcome::Timeout
        }
        Err(_) => Outcome::Error,
    };
    Cost {
        customization: evaluated.customization.clone(),
        operation,
        seconds: evaluated.seconds,
        outcome,
    }
}

/// `apiVersion/kind` of an object.
pub(super) fn kind_of_value(object: &serde_json::Value) -> Option<LaneKey> {
    let field = |name: &str| object.get(name).and_then(serde_json::Value::as_str);
    Some(Arc::from(format!(
        "{}/{}",
        field("apiVersion")?,
        field("kind")?
    )))
}

/// The lane of an observed object: its kind, read from the text without building the object.
pub(super) fn lane_of(observed: &ObservedObject) -> LaneKey {
    #[derive(serde::Deserialize)]
    struct Kinded<'a> {
        #[serde(rename = "apiVersion", borrow, default)]
        api_version: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow, default)]
        kind: Option<std::borrow::Cow<'a, str>>,
    }
    match serde_json::from_str::<Kinded<'_>>(observed.json()) {
        Ok(k) => Arc::from(format!(
            "{}/{}",
            k.api_version.as_deref().unwrap_or(""),
            k.kind.as_deref().unwrap_or("")
        )),
        Err(_) => Arc::from("/"),
    }
}

pub(super) fn lane_of_kind(kind: &Kind) -> LaneKey {
    Arc::from(format!("{}/{}", kind.0, kind.1))
}
