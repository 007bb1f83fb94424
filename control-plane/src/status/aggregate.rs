//! Pure status aggregation: one agent report of one work, interpreted (health, reflected status),
//! becomes the binding's `aggregatedStatus` item for that cluster; the items and the placement
//! give the binding's `FullyApplied` and `Healthy` conditions and its one-line [`summary`].
//!
//! The failover timers live in the item, so a hub restart neither resets nor skips them:
//! `unhealthySince` is set by the first Unhealthy report and cleared only by a Healthy one; an
//! Unknown report (agent restart, status gap, interpreter error) leaves it as it is
//! (karmada#7431 resets it). Times are the hub's clock when it took the report, so an agent's
//! clock skew cannot shorten a toleration.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use lifeboat_api::binding::{
    AggregatedStatusItem, BindingSummary, CONDITION_FULLY_APPLIED, CONDITION_HEALTHY,
    GoneConfirmedBy, ResourceHealth, TargetCluster,
};
use lifeboat_api::health::FailureClass;
use lifeboat_api::protocol::WorkStatus;

/// How the interpreter judged an observed object.
#[derive(Debug, Clone, PartialEq)]
pub enum HealthVerdict {
    /// The kind has no InterpretHealth rule: treated as Healthy, as Karmada does.
    NoRule,
    /// The rule's answer.
    Judged {
        health: ResourceHealth,
        reason: Option<String>,
        class: Option<FailureClass>,
    },
    /// The rule failed (error, limit): Unknown, with why.
    Failed(String),
}

/// One interpreted report.
#[derive(Debug, Clone)]
pub struct Observation<'a> {
    pub cluster: &'a str,
    pub report: &'a WorkStatus,
    /// Health of the observed object (ignored when the report has no object).
    pub verdict: HealthVerdict,
    /// ReflectStatus of the observed object.
    pub reflected: Option<serde_json::Value>,
}

/// The new item for the cluster and whether anything a reader cares about changed (the report
/// time alone is not a change: the binding is not rewritten for it).
#[derive(Debug, Clone, PartialEq)]
pub struct ItemUpdate {
    pub item: AggregatedStatusItem,
    pub changed: bool,
    /// `Some((from, to))` when the health changed.
    pub health_transition: Option<(ResourceHealth, ResourceHealth)>,
}

/// How an item's `healthReason` starts when its health is Unknown because the interpreter
/// failed (the rest names the customization, the operation and the error); the `Healthy`
/// condition then says `InterpreterError`.
pub const INTERPRETER_FAILED: &str = "health interpretation failed: ";

/// Reason of the `Healthy` condition while a placement's health is Unknown because its
/// interpreter fails.
pub const REASON_INTERPRETER_ERROR: &str = "InterpreterError";

/// Longest `healthReason` / `appliedMessage` kept (Kubernetes condition messages are capped at
/// 32 KiB; these are much shorter in practice and the binding carries one per cluster).
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// Folds one report into the cluster's item. `now` is the hub's clock. The reflected status
/// moves into the item.
pub fn next_item(
    previous: Option<&AggregatedStatusItem>,
    observation: Observation<'_>,
    now: &Time,
) -> ItemUpdate {
    let report = observation.report;
    let (health, reason, class) = if !report.applied {
        (
            ResourceHealth::Unknown,
            Some("not applied in the cluster".to_string()),
            None,
        )
    } else if report.observed.is_none() {
        (
            ResourceHealth::Unknown,
            Some("the object does not exist in the cluster".to_string()),
            None,
        )
    } else {
        match &observation.verdict {
            HealthVerdict::NoRule => (ResourceHealth::Healthy, None, None),
            HealthVerdict::Judged {
                health,
                reason,
                class,
            } => {
                let class = match health {
                    ResourceHealth::Unhealthy => Some(class.unwrap_or(FailureClass::Unknown)),
                    _ => None,
                };
                (*health, reason.clone(), class)
            }
            HealthVerdict::Failed(why) => (
                ResourceHealth::Unknown,
                Some(format!("{INTERPRETER_FAILED}{why}")),
                None,
            ),
        }
    };
    let mut item = AggregatedStatusItem {
        cluster_name: observation.cluster.to_string(),
        applied: report.applied,
        applied_message: report.applied_message.as_deref().map(truncate),
        health,
        health_reason: reason.as_deref().map(truncate),
        failure_class: class,
        // Only an object with something in it: the CRD's `status` is an object, and an empty
        // one (the ReflectStatus of a PyTorchJob no operator has seen yet) comes back from a
        // server-side apply as null, which the CRD refuses, failing the whole status write.
        status: if report.applied {
            observation
                .reflected
                .filter(|v| v.as_object().is_some_and(|o| !o.is_empty()))
        } else {
            None
        },
        observed_at: Some(now.clone()),
        first_observed_at: previous.and_then(|p| p.first_observed_at.clone()),
        last_healthy_time: previous.and_then(|p| p.last_healthy_time.clone()),
        unhealthy_since: previous.and_then(|p| p.unhealthy_since.clone()),
        observed_revision: Some(report.revision),
        // The reset generation belongs to the object reported; a report without one (the
        // object is being re-created) leaves the last known.
        reset_generation: if report.observed.is_some() {
            report.reset_generation
        } else {
            previous.and_then(|p| p.reset_generation)
        },
        gone_at: None,
        gone_confirmed_by: None,
    };
    if item.applied && report.observed.is_some() && item.first_observed_at.is_none() {
        item.first_observed_at = Some(now.clone());
    }
    match health {
        ResourceHealth::Healthy => {
            item.unhealthy_since = None;
            item.last_healthy_time = Some(now.clone());
        }
        ResourceHealth::Unhealthy => {
            if item.unhealthy_since.is_none() {
                // To the microsecond and never earlier than now: the toleration counts from here.
                item.unhealthy_since = Some(lifeboat_api::time::stored(now.0));
            }
        }
        ResourceHealth::Unknown => {}
    }
    let previous_health = previous.map(|p| p.health);
    let changed = match previous {
        None => true,
        Some(p) => !same_except_times(p, &item),
    };
    if !changed && let Some(p) = previous {
        // Keep the recorded times of an unchanged item: the binding is not rewritten for them.
        item.observed_at = p.observed_at.clone();
        item.last_healthy_time = p.last_healthy_time.clone();
        item.observed_revision = p.observed_revision;
    }
    let health_transition = match previous_health {
        Some(from) if from != health => Some((from, health)),
        None => Some((ResourceHealth::Unknown, health)).filter(|(a, b)| a != b),
        _ => None,
    };
    ItemUpdate {
        item,
        changed,
        health_transition,
    }
}

/// Equal in everything but the report times (observedAt, lastHealthyTime of a still-Healthy
/// item) and the revision.
fn same_except_times(a: &AggregatedStatusItem, b: &AggregatedStatusItem) -> bool {
    a.cluster_name == b.cluster_name
        && a.applied == b.applied
        && a.applied_message == b.applied_message
        && a.health == b.health
        && a.health_reason == b.health_reason
        && a.failure_class == b.failure_class
        && a.status == b.status
        && a.first_observed_at == b.first_observed_at
        && a.unhealthy_since == b.unhealthy_since
        && a.reset_generation == b.reset_generation
        && a.observed_revision.is_some() == b.observed_revision.is_some()
        && a.gone_at.is_some() == b.gone_at.is_some()
}

/// `healthReason` of a copy reported gone.
pub const REASON_GONE: &str = "the copy was deleted from the cluster (the work was withdrawn)";

/// The cluster's item once its agent (or the hub's own fence) reported the withdrawn copy gone:
/// not applied, no status, `goneAt` now, and who confirmed it. The copy's timers go with it (a later copy in that cluster starts afresh). A
/// repeated gone report (after a reconnect or a hub restart) changes nothing and keeps the
/// first `goneAt`.
pub fn gone_item(
    previous: Option<&AggregatedStatusItem>,
    cluster: &str,
    by: GoneConfirmedBy,
    now: &Time,
) -> ItemUpdate {
    if let Some(p) = previous.filter(|p| p.gone_at.is_some() && !p.applied) {
        return ItemUpdate {
            item: p.clone(),
            changed: false,
            health_transition: None,
        };
    }
    let item = AggregatedStatusItem {
        cluster_name: cluster.to_string(),
        applied: false,
        applied_message: None,
        health: ResourceHealth::Unknown,
        health_reason: Some(REASON_GONE.to_string()),
        failure_class: None,
        status: None,
        observed_at: Some(now.clone()),
        first_observed_at: None,
        last_healthy_time: None,
        unhealthy_since: None,
        observed_revision: None,
        reset_generation: None,
        gone_at: Some(now.clone()),
        gone_confirmed_by: Some(by),
    };
    let health_transition = match previous.map(|p| p.health) {
        Some(from) if from != ResourceHealth::Unknown => Some((from, ResourceHealth::Unknown)),
        _ => None,
    };
    ItemUpdate {
        item,
        changed: true,
        health_transition,
    }
}

fn truncate(text: &str) -> String {
    if text.len() <= MAX_MESSAGE_BYTES {
        return text.to_string();
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The binding's one-line summary: the placement, and the failure class of each Unhealthy
/// placement (`cluster=Class`; `Unknown` when the interpreter gave none).
pub fn summary(clusters: &[TargetCluster], items: &[AggregatedStatusItem]) -> BindingSummary {
    let placed: Vec<&str> = clusters.iter().map(|c| c.name.as_str()).collect();
    let failures: Vec<String> = items
        .iter()
        .filter(|i| {
            i.health == ResourceHealth::Unhealthy && placed.contains(&i.cluster_name.as_str())
        })
        .map(|i| {
            format!(
                "{}={}",
                i.cluster_name,
                i.failure_class.unwrap_or(FailureClass::Unknown)
            )
        })
        .collect();
    BindingSummary {
        clusters: placed.join(","),
        failures: failures.join(","),
    }
}

/// The binding's `FullyApplied` and `Healthy` conditions from its placement and items.
/// `generation` is the binding's; `now` stamps a condition whose status changed (a condition
/// whose status stays keeps its transition time, per Kubernetes conventions).
pub fn conditions(
    clusters: &[TargetCluster],
    items: &[AggregatedStatusItem],
    previous: &[Condition],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let item = |name: &str| items.iter().find(|i| i.cluster_name == name);
    let (applied_status, applied_reason, applied_message) = if clusters.is_empty() {
        (
            "False",
            "NotScheduled",
            "the binding is not placed on any cluster".to_string(),
        )
    } else {
        let missing: Vec<&str> = clusters
            .iter()
            .filter(|c| !item(&c.name).is_some_and(|i| i.applied))
            .map(|c| c.name.as_str())
            .collect();
        if missing.is_empty() {
            (
                "True",
                "FullyAppliedSuccess",
                "all works are applied successfully".to_string(),
            )
        } else {
            (
                "False",
                "FullyAppliedFailed",
                format!("not applied yet in: {}", missing.join(", ")),
            )
        }
    };
    let (healthy_status, healthy_reason, healthy_message) = if clusters.is_empty() {
        (
            "Unknown",
            "NotScheduled",
            "the binding is not placed on any cluster".to_string(),
        )
    } else {
        let unhealthy: Vec<String> = clusters
            .iter()
            .filter_map(|c| item(&c.name))
            .filter(|i| i.health == ResourceHealth::Unhealthy)
            .map(|i| match &i.health_reason {
                Some(r) => format!("{}: {r}", i.cluster_name),
                None => i.cluster_name.clone(),
            })
            .collect();
        let unknown: Vec<&str> = clusters
            .iter()
            .filter(|c| item(&c.name).is_none_or(|i| i.health == ResourceHealth::Unknown))
            .map(|c| c.name.as_str())
            .collect();
        let failing: Vec<String> = clusters
            .iter()
            .filter_map(|c| item(&c.name))
            .filter(|i| i.health == ResourceHealth::Unknown)
            .filter_map(|i| {
                let reason = i.health_reason.as_deref()?;
                reason
                    .strip_prefix(INTERPRETER_FAILED)
                    .map(|why| format!("{}: {why}", i.cluster_name))
            })
            .collect();
        if !unhealthy.is_empty() {
            ("False", "Unhealthy", truncate(&unhealthy.join("; ")))
        } else if !failing.is_empty() {
            (
                "Unknown",
                REASON_INTERPRETER_ERROR,
                truncate(&format!(
                    "health interpretation failed in {}",
                    failing.join("; ")
                )),
            )
        } else if !unknown.is_empty() {
            (
                "Unknown",
                "HealthUnknown",
                format!("health not known yet in: {}", unknown.join(", ")),
            )
        } else {
            ("True", "Healthy", "healthy in every cluster".to_string())
        }
    };
    vec![
        condition(
            CONDITION_FULLY_APPLIED,
            applied_status,
            applied_reason,
            applied_message,
            previous,
            generation,
            now,
        ),
        condition(
            CONDITION_HEALTHY,
            healthy_status,
            healthy_reason,
            healthy_message,
            previous,
            generation,
            now,
        ),
    ]
}

/// A condition, keeping the previous transition time when the status did not change.
pub fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    previous: &[Condition],
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use lifeboat_api::protocol::{ObservedObject, WorkKey};
    use lifeboat_api::time::stored;
    use serde_json::{Value, json};

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(1_800_000_000 + second).unwrap())
    }

    fn report(applied: bool, observed: bool) -> WorkStatus {
        WorkStatus {
            key: WorkKey {
                namespace: "ml".into(),
                name: "train-appwrapper".into(),
            },
            binding_uid: "u".into(),
            revision: 3,
            applied,
            applied_message: None,
            observed: observed.then(|| {
                ObservedObject::from_value(&json!({"status": {"phase": "Running"}})).unwrap()
            }),
            observed_at: at(0),
            reset_generation: None,
            fenced: false,
            gone: false,
        }
    }

    #[test]
    fn the_summary_lists_the_placement_and_its_failures() {
        let placed = |names: &[&str]| -> Vec<TargetCluster> {
            names
                .iter()
                .map(|n| TargetCluster {
                    name: n.to_string(),
                    replicas: 0,
                })
                .collect()
        };
        let item = |cluster: &str, health, class| AggregatedStatusItem {
            cluster_name: cluster.into(),
            health,
            failure_class: class,
            ..Default::default()
        };
        let items = [
            item(
                "a",
                ResourceHealth::Unhealthy,
                Some(FailureClass::Infrastructure),
            ),
            item("b", ResourceHealth::Healthy, None),
            item("c", ResourceHealth::Unhealthy, None),
            // an old copy still reporting (Gracefully): not in the placement
            item("d", ResourceHealth::Unhealthy, Some(FailureClass::Capacity)),
        ];
        assert_eq!(
            summary(&placed(&["a", "b", "c"]), &items),
            BindingSummary {
                clusters: "a,b,c".into(),
                failures: "a=Infrastructure,c=Unknown".into(),
            }
        );
        assert_eq!(summary(&placed(&[]), &items), BindingSummary::default());
    }

    fn judged(health: ResourceHealth, class: Option<FailureClass>) -> HealthVerdict {
        HealthVerdict::Judged {
            health,
            reason: Some(format!("{health:?}")),
            class,
        }
    }

    fn step(
        prev: Option<&AggregatedStatusItem>,
        verdict: HealthVerdict,
        second: i64,
    ) -> ItemUpdate {
        let r = report(true, true);
        next_item(
            prev,
            Observation {
                cluster: "m1",
                report: &r,
                verdict,
                reflected: Some(json!({"phase": "Running"})),
            },
            &at(second),
        )
    }

    #[test]
    fn unknown_does_not_reset_the_unhealthy_timer_only_healthy_does() {
        let first = step(None, judged(ResourceHealth::Unhealthy, None), 10);
        assert_eq!(first.item.unhealthy_since, Some(stored(at(10).0)));
        assert_eq!(first.item.failure_class, Some(FailureClass::Unknown));
        assert_eq!(
            first.health_transition,
            Some((ResourceHealth::Unknown, ResourceHealth::Unhealthy))
        );
        let unknown = step(Some(&first.item), HealthVerdict::Failed("boom".into()), 20);
        assert_eq!(unknown.item.health, ResourceHealth::Unknown);
        assert_eq!(unknown.item.unhealthy_since, Some(stored(at(10).0)));
        let again = step(
            Some(&unknown.item),
            judged(
                ResourceHealth::Unhealthy,
                Some(FailureClass::Infrastructure),
            ),
            30,
        );
        assert_eq!(again.item.unhealthy_since, Some(stored(at(10).0)));
        assert_eq!(again.item.failure_class, Some(FailureClass::Infrastructure));
        let healthy = step(Some(&again.item), judged(ResourceHealth::Healthy, None), 40);
        assert_eq!(healthy.item.unhealthy_since, None);
        assert_eq!(healthy.item.last_healthy_time, Some(at(40)));
        assert_eq!(healthy.item.failure_class, None);
        assert_eq!(healthy.item.first_observed_at, Some(at(10)));
    }

    #[test]
    fn a_repeated_report_is_not_a_change() {
        let first = step(None, judged(ResourceHealth::Healthy, None), 10);
        assert!(first.changed);
        let same = step(Some(&first.item), judged(ResourceHealth::Healthy, None), 20);
        assert!(!same.changed);
        assert_eq!(same.health_transition, None);
        // the recorded times stay as they were
        assert_eq!(same.item.observed_at, Some(at(10)));
        assert_eq!(same.item.last_healthy_time, Some(at(10)));
        let other = step(
            Some(&first.item),
            judged(ResourceHealth::Unhealthy, None),
            30,
        );
        assert!(other.changed);
    }

    #[test]
    fn missing_rule_is_healthy_and_unapplied_is_unknown() {
        let healthy = step(None, HealthVerdict::NoRule, 1);
        assert_eq!(healthy.item.health, ResourceHealth::Healthy);
        let r = report(false, false);
        let unapplied = next_item(
            Some(&healthy.item),
            Observation {
                cluster: "m1",
                report: &r,
                verdict: HealthVerdict::NoRule,
                reflected: None,
            },
            &at(2),
        );
        assert_eq!(unapplied.item.health, ResourceHealth::Unknown);
        assert!(unapplied.item.status.is_none());
        let r = report(true, false);
        let gone = next_item(
            None,
            Observation {
                cluster: "m1",
                report: &r,
                verdict: HealthVerdict::NoRule,
                reflected: None,
            },
            &at(3),
        );
        assert_eq!(gone.item.health, ResourceHealth::Unknown);
        assert_eq!(gone.item.first_observed_at, None);
    }

    #[test]
    fn a_reflected_status_that_is_no_object_or_empty_is_left_out() {
        let r = report(true, true);
        let observe = |reflected| {
            next_item(
                None,
                Observation {
                    cluster: "m1",
                    report: &r,
                    verdict: HealthVerdict::NoRule,
                    reflected,
                },
                &at(1),
            )
            .item
            .status
        };
        assert_eq!(observe(Some(Value::Null)), None);
        assert_eq!(observe(Some(json!([]))), None);
        assert_eq!(observe(Some(json!({}))), None);
        assert_eq!(observe(Some(json!({"a": 1}))), Some(json!({"a": 1})));
    }

    #[test]
    fn the_reset_generation_follows_the_reported_object() {
        let observe = |prev: Option<&AggregatedStatusItem>, generation, observed, second| {
            let mut r = report(true, observed);
            r.reset_generation = generation;
            next_item(
                prev,
                Observation {
                    cluster: "m1",
                    report: &r,
                    verdict: judged(ResourceHealth::Healthy, None),
                    reflected: None,
                },
                &at(second),
            )
        };
        let first = observe(None, Some(1), true, 1);
        assert_eq!(first.item.reset_generation, Some(1));
        let reset = observe(Some(&first.item), Some(2), true, 2);
        assert_eq!(reset.item.reset_generation, Some(2));
        assert!(reset.changed, "a new reset generation is written");
        // The object is gone while the agent re-creates it: the last known generation stays.
        let gone = observe(Some(&reset.item), None, false, 3);
        assert_eq!(gone.item.reset_generation, Some(2));
        // An object without the annotation was never reset.
        let fresh = observe(Some(&gone.item), None, true, 4);
        assert_eq!(fresh.item.reset_generation, None);
    }

    #[test]
    fn a_gone_copy_leaves_an_unapplied_item_with_its_time_once() {
        let failed = step(None, judged(ResourceHealth::Unhealthy, None), 10);
        let gone = gone_item(Some(&failed.item), "m1", GoneConfirmedBy::Hub, &at(20));
        assert!(gone.changed);
        assert_eq!(gone.item.gone_confirmed_by, Some(GoneConfirmedBy::Hub));
        assert_eq!(
            gone.health_transition,
            Some((ResourceHealth::Unhealthy, ResourceHealth::Unknown))
        );
        let item = &gone.item;
        assert!(!item.applied && item.status.is_none());
        assert_eq!(
            (item.gone_at.clone(), item.observed_at.clone()),
            (Some(at(20)), Some(at(20)))
        );
        assert_eq!(item.health_reason.as_deref(), Some(REASON_GONE));
        // the failed copy's timers do not outlive it
        assert_eq!(
            (item.unhealthy_since.clone(), item.first_observed_at.clone()),
            (None, None)
        );
        // reported again: no change, the first time stays
        let again = gone_item(Some(&gone.item), "m1", GoneConfirmedBy::Agent, &at(30));
        assert!(!again.changed && again.health_transition.is_none());
        assert_eq!(again.item.gone_at, Some(at(20)));
        assert_eq!(again.item.gone_confirmed_by, Some(GoneConfirmedBy::Hub));
        // a later copy reports: the item is that copy's, not gone any more
        let back = step(Some(&gone.item), judged(ResourceHealth::Healthy, None), 40);
        assert!(back.changed && back.item.applied);
        assert_eq!(
            (back.item.gone_at, back.item.gone_confirmed_by),
            (None, None)
        );
        // nothing known before: gone from the start
        assert!(
            gone_item(None, "m1", GoneConfirmedBy::Agent, &at(5))
                .health_transition
                .is_none()
        );
    }

    #[test]
    fn long_reasons_are_truncated() {
        let long = "x".repeat(5000);
        let update = step(
            None,
            HealthVerdict::Judged {
                health: ResourceHealth::Unhealthy,
                reason: Some(long),
                class: None,
            },
            1,
        );
        assert!(update.item.health_reason.unwrap().len() <= MAX_MESSAGE_BYTES + 3);
    }

    fn item(cluster: &str, applied: bool, health: ResourceHealth) -> AggregatedStatusItem {
        AggregatedStatusItem {
            cluster_name: cluster.into(),
            applied,
            health,
            ..Default::default()
        }
    }

    fn target(name: &str) -> TargetCluster {
        TargetCluster {
            name: name.into(),
            replicas: 0,
        }
    }

    #[test]
    fn conditions_follow_the_placement() {
        let clusters = [target("a"), target("b")];
        let items = [
            item("a", true, ResourceHealth::Healthy),
            item("b", false, ResourceHealth::Unknown),
            // an item of a cluster no longer in the placement is ignored
            item("c", true, ResourceHealth::Unhealthy),
        ];
        let c = conditions(&clusters, &items, &[], Some(2), &at(5));
        assert_eq!(
            (c[0].type_.as_str(), c[0].status.as_str()),
            ("FullyApplied", "False")
        );
        assert!(c[0].message.contains('b'));
        assert_eq!(
            (c[1].type_.as_str(), c[1].status.as_str()),
            ("Healthy", "Unknown")
        );
        let items = [
            item("a", true, ResourceHealth::Healthy),
            item("b", true, ResourceHealth::Healthy),
        ];
        let c2 = conditions(&clusters, &items, &c, Some(2), &at(9));
        assert_eq!(c2[0].status, "True");
        assert_eq!(c2[1].status, "True");
        assert_eq!(c2[1].last_transition_time, at(9));
        // unchanged status keeps its transition time
        let c3 = conditions(&clusters, &items, &c2, Some(3), &at(20));
        assert_eq!(c3[1].last_transition_time, at(9));
        assert_eq!(c3[1].observed_generation, Some(3));
        let items = [
            item("a", true, ResourceHealth::Unhealthy),
            item("b", true, ResourceHealth::Healthy),
        ];
        let c4 = conditions(&clusters, &items, &c3, Some(3), &at(30));
        assert_eq!(c4[1].status, "False");
        let none = conditions(&[], &[], &[], None, &at(1));
        assert_eq!(none[0].reason, "NotScheduled");
    }

    #[test]
    fn a_failing_interpreter_names_itself_in_the_healthy_condition() {
        let clusters = [target("a"), target("b")];
        let failed = step(
            None,
            HealthVerdict::Failed("customization broken failed in InterpretHealth: boom".into()),
            1,
        )
        .item;
        let failed = AggregatedStatusItem {
            cluster_name: "b".into(),
            ..failed
        };
        let items = [item("a", true, ResourceHealth::Healthy), failed];
        let c = conditions(&clusters, &items, &[], Some(1), &at(5));
        assert_eq!(
            (c[1].status.as_str(), c[1].reason.as_str()),
            ("Unknown", REASON_INTERPRETER_ERROR)
        );
        assert_eq!(
            c[1].message,
            "health interpretation failed in b: customization broken failed in InterpretHealth: boom"
        );
        // an Unhealthy placement still comes first
        let items = [item("a", true, ResourceHealth::Unhealthy), items[1].clone()];
        let c = conditions(&clusters, &items, &[], Some(1), &at(5));
        assert_eq!(c[1].reason, "Unhealthy");
    }
}
