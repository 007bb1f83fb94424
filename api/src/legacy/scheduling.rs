//! `spec.schedulingSpec`: `requeuing` → fault-tolerance annotations on the AppWrapper (an
//! annotation the user already set wins), `minAvailable` compared with the pods v1beta2 expects.

use std::collections::BTreeMap;

use kube::api::ObjectMeta;
use serde_json::{Map, Value};

use super::{GRACE_PERIOD_MAXIMUM_SECONDS, UNLIMITED_RETRY_LIMIT, Warning};
use crate::appwrapper::AppWrapperComponent;
use crate::appwrapper::constants::annotations;
use crate::appwrapper::podsets::effective_pod_sets;

/// A fault-tolerance annotation mapped from a legacy field.
pub(super) struct FaultToleranceAnnotation {
    key: &'static str,
    value: String,
    /// The legacy field it comes from.
    from: String,
}

fn annotation(key: &'static str, value: String, from: String) -> FaultToleranceAnnotation {
    FaultToleranceAnnotation { key, value, from }
}

/// Writes the mapped annotations; an explicit v1beta2 annotation already present wins.
pub(super) fn apply_fault_tolerance(
    metadata: &mut ObjectMeta,
    mapped: Vec<FaultToleranceAnnotation>,
    warnings: &mut Vec<Warning>,
) {
    let annotations_map = metadata.annotations.get_or_insert_with(BTreeMap::new);
    for FaultToleranceAnnotation { key, value, from } in mapped {
        match annotations_map.get(key) {
            Some(existing) if existing != &value => warnings.push(Warning {
                field: from,
                reason: format!(
                    "not applied: metadata.annotations already sets {key}={existing} (kept)"
                ),
            }),
            Some(_) => {}
            None => {
                annotations_map.insert(key.to_string(), value);
            }
        }
    }
    if annotations_map.is_empty() {
        metadata.annotations = None;
    }
}

/// `spec.schedulingSpec`: the requeuing annotations go to `out`, the rest is warned about.
pub(super) fn convert_scheduling_spec(
    value: &Value,
    warnings: &mut Vec<Warning>,
    out: &mut Vec<FaultToleranceAnnotation>,
) {
    let Some(scheduling) = map_or_warn(value, "spec.schedulingSpec", warnings) else {
        return;
    };
    for (key, value) in scheduling {
        let here = format!("spec.schedulingSpec.{key}");
        match key.as_str() {
            // Compared with the pod count in `check_min_available`.
            "minAvailable" => {}
            "requeuing" => convert_requeuing(value, warnings, out),
            "nodeSelector" => warnings.push(Warning {
                field: here,
                reason: "dropped: never implemented by MCAD; put a nodeSelector in the pod \
                         templates (or let Kueue's ResourceFlavors inject one)"
                    .into(),
            }),
            "dispatchDuration" | "dispatchingWindow" => warnings.push(Warning {
                field: here,
                reason: "dropped: never implemented by MCAD and absent from v1beta2".into(),
            }),
            _ => warnings.push(Warning {
                field: here,
                reason: "dropped: unknown legacy field with no v1beta2 equivalent".into(),
            }),
        }
    }
}

/// `spec.schedulingSpec.requeuing` → fault-tolerance annotations.
fn convert_requeuing(
    value: &Value,
    warnings: &mut Vec<Warning>,
    out: &mut Vec<FaultToleranceAnnotation>,
) {
    let Some(requeuing) = map_or_warn(value, "spec.schedulingSpec.requeuing", warnings) else {
        return;
    };
    for (key, value) in requeuing {
        let here = format!("spec.schedulingSpec.requeuing.{key}");
        let Some(n) = value.as_i64() else {
            warnings.push(Warning {
                field: here,
                reason: format!("dropped: {value} is not an integer"),
            });
            continue;
        };
        // A duration in seconds: negative ones are dropped, long ones will be clipped.
        let seconds = |warnings: &mut Vec<Warning>, here: &str| {
            if n < 0 {
                warnings.push(Warning {
                    field: here.to_string(),
                    reason: format!("dropped: negative duration {n}"),
                });
                return None;
            }
            if n > GRACE_PERIOD_MAXIMUM_SECONDS {
                warnings.push(Warning {
                    field: here.to_string(),
                    reason: format!(
                        "{n}s exceeds the controller's GracePeriodMaximum and will be clipped to \
                         24h"
                    ),
                });
            }
            Some(format!("{n}s"))
        };
        match key.as_str() {
            "timeInSeconds" => {
                if let Some(duration) = seconds(warnings, &here) {
                    out.push(annotation(
                        annotations::ADMISSION_GRACE_PERIOD,
                        duration.clone(),
                        here.clone(),
                    ));
                    out.push(annotation(annotations::WARMUP_GRACE_PERIOD, duration, here));
                }
            }
            "pauseTimeInSeconds" => {
                if let Some(duration) = seconds(warnings, &here) {
                    out.push(annotation(annotations::RETRY_PAUSE_PERIOD, duration, here));
                }
            }
            "forceDeletionTimeInSeconds" => {
                if n <= 0 {
                    warnings.push(Warning {
                        field: here.clone(),
                        reason: format!(
                            "{n} disabled forced deletion in MCAD; v1beta2 always force-deletes \
                             eventually, so it maps to the longest grace the controller honours \
                             (24h)"
                        ),
                    });
                    out.push(annotation(
                        annotations::FORCEFUL_DELETION_GRACE_PERIOD,
                        "24h".into(),
                        here,
                    ));
                } else if let Some(duration) = seconds(warnings, &here) {
                    out.push(annotation(
                        annotations::FORCEFUL_DELETION_GRACE_PERIOD,
                        duration,
                        here,
                    ));
                }
            }
            "maxNumRequeuings" => {
                if n <= 0 {
                    warnings.push(Warning {
                        field: here.clone(),
                        reason: format!(
                            "{n} meant unlimited requeuing in MCAD; mapped to retryLimit \
                             {UNLIMITED_RETRY_LIMIT} (set a real limit, e.g. 3, and consider \
                             terminalExitCodes so application bugs do not retry for ever)"
                        ),
                    });
                    out.push(annotation(
                        annotations::RETRY_LIMIT,
                        UNLIMITED_RETRY_LIMIT.to_string(),
                        here,
                    ));
                } else {
                    let limit = i32::try_from(n).unwrap_or(UNLIMITED_RETRY_LIMIT);
                    out.push(annotation(
                        annotations::RETRY_LIMIT,
                        limit.to_string(),
                        here,
                    ));
                }
            }
            "initialTimeInSeconds" | "maxTimeInSeconds" | "growthType" | "numRequeuings" => {
                warnings.push(Warning {
                    field: here,
                    reason: "dropped: accepted but never implemented by MCAD (no backoff growth \
                             in v1beta2 either)"
                        .into(),
                })
            }
            _ => warnings.push(Warning {
                field: here,
                reason: "dropped: unknown legacy field with no v1beta2 equivalent".into(),
            }),
        }
    }
}

/// MCAD watched for at least `minAvailable` running or succeeded pods; v1beta2 expects every pod
/// of every podSet. Warn when that changes what counts as healthy.
pub(super) fn check_min_available(
    spec: &Map<String, Value>,
    components: &[AppWrapperComponent],
    warnings: &mut Vec<Warning>,
) {
    let Some(min) = spec
        .get("schedulingSpec")
        .and_then(|s| s.get("minAvailable"))
    else {
        return;
    };
    let field = "spec.schedulingSpec.minAvailable".to_string();
    let Some(min) = min.as_i64() else {
        warnings.push(Warning {
            field,
            reason: format!("dropped: {min} is not an integer"),
        });
        return;
    };
    let pods: i64 = components
        .iter()
        .map(|c| crate::appwrapper::podsets::expected_pod_count(&effective_pod_sets(c)))
        .sum();
    let reason = if min < 0 {
        format!(
            "{min} turned off pod monitoring and cleanup in MCAD; v1beta2 always monitors all \
             {pods} pods and resets or fails the AppWrapper when they are unhealthy"
        )
    } else if min == 0 {
        format!(
            "0 made MCAD check for a single pod only; v1beta2 expects all {pods} pods Running or \
             Succeeded"
        )
    } else if min < pods {
        format!(
            "MCAD tolerated down to {min} running pods; v1beta2 expects all {pods} pods Running \
             or Succeeded (after the warmup grace) and resets otherwise"
        )
    } else if min > pods {
        format!(
            "{min} is more than the {pods} pods the templates create, so MCAD would have \
             requeued for ever; v1beta2 expects exactly {pods}"
        )
    } else {
        return;
    };
    warnings.push(Warning { field, reason });
}

/// The map at `field`; anything else but null is dropped with a warning.
fn map_or_warn<'v>(
    value: &'v Value,
    field: &str,
    warnings: &mut Vec<Warning>,
) -> Option<&'v Map<String, Value>> {
    match value {
        Value::Object(map) => Some(map),
        Value::Null => None,
        _ => {
            warnings.push(Warning {
                field: field.into(),
                reason: "dropped: not a map".into(),
            });
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legacy::convert;
    use crate::legacy::test_support::*;
    use serde_json::json;

    #[test]
    fn requeuing_maps_to_annotations() {
        let out = convert(&legacy(json!({
            "schedulingSpec": {"minAvailable": 1, "requeuing": {
                "timeInSeconds": 300, "pauseTimeInSeconds": 60,
                "forceDeletionTimeInSeconds": 120, "maxNumRequeuings": 5,
                "growthType": "exponential"}},
            "resources": {"GenericItems": [{"generictemplate": pod("p")}]}})))
        .unwrap();
        let a = annotations(&out);
        assert_eq!(a[annotations::ADMISSION_GRACE_PERIOD], "300s");
        assert_eq!(a[annotations::WARMUP_GRACE_PERIOD], "300s");
        assert_eq!(a[annotations::RETRY_PAUSE_PERIOD], "60s");
        assert_eq!(a[annotations::FORCEFUL_DELETION_GRACE_PERIOD], "120s");
        assert_eq!(a[annotations::RETRY_LIMIT], "5");
        assert!(warned(&out, "spec.schedulingSpec.requeuing.growthType"));
        assert!(
            !warned(&out, "spec.schedulingSpec.minAvailable"),
            "1 pod, minAvailable 1"
        );
        // the placeholder is gone, other labels stay
        let labels = &out.appwrapper.spec.components[0].template["metadata"]["labels"];
        assert_eq!(labels, &json!({"keep": "me"}));
    }

    #[test]
    fn unlimited_and_disabled_settings_are_mapped_and_warned() {
        let out = convert(&legacy(json!({
            "schedulingSpec": {"requeuing": {"forceDeletionTimeInSeconds": 0,
                "maxNumRequeuings": 0, "timeInSeconds": 200000}},
            "resources": {"GenericItems": [{"generictemplate": pod("p")}]}})))
        .unwrap();
        let a = annotations(&out);
        assert_eq!(
            a[annotations::RETRY_LIMIT],
            UNLIMITED_RETRY_LIMIT.to_string()
        );
        assert_eq!(a[annotations::FORCEFUL_DELETION_GRACE_PERIOD], "24h");
        for f in [
            "spec.schedulingSpec.requeuing.maxNumRequeuings",
            "spec.schedulingSpec.requeuing.forceDeletionTimeInSeconds",
            "spec.schedulingSpec.requeuing.timeInSeconds",
        ] {
            assert!(warned(&out, f), "{f}: {:?}", out.warnings);
        }
    }

    #[test]
    fn explicit_v1beta2_annotations_win() {
        let mut doc = legacy(json!({
            "schedulingSpec": {"requeuing": {"maxNumRequeuings": 5}},
            "resources": {"GenericItems": [{"generictemplate": pod("p")}]}}));
        doc["metadata"]["annotations"] = json!({annotations::RETRY_LIMIT: "2"});
        let out = convert(&doc).unwrap();
        assert_eq!(annotations(&out)[annotations::RETRY_LIMIT], "2");
        assert!(warned(
            &out,
            "spec.schedulingSpec.requeuing.maxNumRequeuings"
        ));
    }
}
