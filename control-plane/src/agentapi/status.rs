//! Batched status reports. Each item must be work assigned to the calling cluster (same binding
//! UID) in the [`crate::work::store::WorkStore`], or, for a gone report, work withdrawn from that
//! cluster whose purge the hub awaits (same binding UID); others are rejected with why while the
//! rest are taken. A report the API already took for that work (same `observedAt`) is not handed on again
//! (a retried or replayed request changes nothing); an older one is rejected as stale. The status
//! processor applies the same rule per binding and cluster, so it also holds after a leader
//! change, when this cache starts empty.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Request, State};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use lifeboat_api::protocol::{
    MAX_STATUS_ITEMS, RejectedItem, StatusReport, StatusResponse, WorkKey, WorkStatus,
};
use lifeboat_api::stages;
use tracing::Instrument;

use super::{ApiError, Shared, json_body};
use crate::status::intake::{IntakeError, StatusBatch};
use crate::status::processor::check_assignment;
use crate::work::store::WorkStore;

/// The last report taken per work of one cluster: (binding UID, observedAt).
pub(crate) type TakenReports = HashMap<WorkKey, (String, Time)>;

/// How a batch splits before it goes to the processor.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Screened {
    /// Items for the processor.
    pub forward: Vec<WorkStatus>,
    /// Items refused here.
    pub rejected: Vec<RejectedItem>,
    /// Items the API already took (same report again).
    pub duplicates: usize,
}

/// Splits `items` of `cluster`: not assigned / another binding UID / a gone report for a purge
/// not awaited / stale → rejected, the same report again → duplicate, the rest forwarded. Entries of `taken` for work no longer assigned
/// are dropped.
pub(crate) fn screen(
    cluster: &str,
    items: Vec<WorkStatus>,
    work: &WorkStore,
    taken: &mut TakenReports,
) -> Screened {
    let mut screened = Screened::default();
    for item in items {
        if let Err(reason) = check_assignment(cluster, &item, work) {
            if work.get(cluster, &item.key).is_none() {
                taken.remove(&item.key);
            }
            screened.rejected.push(RejectedItem {
                reason,
                key: item.key,
            });
            continue;
        }
        if let Some((uid, last)) = taken.get(&item.key)
            && *uid == item.binding_uid
        {
            if item.observed_at.0 < last.0 {
                screened.rejected.push(RejectedItem {
                    reason: format!(
                        "stale: observed at {} but a report observed at {} was already taken",
                        item.observed_at.0, last.0
                    ),
                    key: item.key,
                });
                continue;
            }
            // A gone report is the copy's last word: taken even in the second of the last
            // report (the processor takes it twice without a change).
            if item.observed_at.0 == last.0 && !item.gone {
                screened.duplicates += 1;
                continue;
            }
        }
        screened.forward.push(item);
    }
    screened
}

/// What is remembered of a forwarded item (the item itself goes to the processor).
pub(crate) struct Mark {
    key: WorkKey,
    binding_uid: String,
    observed_at: Time,
}

impl Mark {
    pub fn of(item: &WorkStatus) -> Mark {
        Mark {
            key: item.key.clone(),
            binding_uid: item.binding_uid.clone(),
            observed_at: item.observed_at.clone(),
        }
    }
}

/// Records the items the processor took (those not in `rejected`).
pub(crate) fn remember(taken: &mut TakenReports, forwarded: Vec<Mark>, rejected: &[RejectedItem]) {
    let refused: HashSet<&WorkKey> = rejected.iter().map(|r| &r.key).collect();
    for mark in forwarded.into_iter().filter(|m| !refused.contains(&m.key)) {
        let newer = taken
            .get(&mark.key)
            .is_none_or(|(uid, last)| *uid != mark.binding_uid || mark.observed_at.0 > last.0);
        if newer {
            taken.insert(mark.key, (mark.binding_uid, mark.observed_at));
        }
    }
}

pub(super) async fn status(
    State(shared): State<Arc<Shared>>,
    Path(cluster): Path<String>,
    request: Request,
) -> Result<Json<StatusResponse>, ApiError> {
    let span = tracing::info_span!("status", cluster = %cluster, items = tracing::field::Empty);
    async move {
        let caller = shared
            .authenticate_active(request.headers(), &cluster)
            .await?;
        let report: StatusReport =
            json_body(request, "status report", shared.config.body_limit).await?;
        tracing::Span::current().record("items", report.items.len());
        if tracing::enabled!(target: stages::TARGET, tracing::Level::DEBUG) {
            for item in &report.items {
                tracing::debug!(target: stages::TARGET, stage = stages::REPORT_RECEIVED,
                    cluster = %cluster, work = %item.key);
            }
        }
        if report.items.len() > MAX_STATUS_ITEMS {
            return Err(ApiError::BadRequest(format!(
                "items: {} status items in one report, at most {MAX_STATUS_ITEMS} are allowed",
                report.items.len()
            )));
        }
        let full = report.full;
        let screened = {
            let mut all = shared.last_taken.lock().unwrap_or_else(|e| e.into_inner());
            let taken = all.entry(caller.cluster.clone()).or_default();
            if full {
                // A full report: forget what is no longer assigned (keeps the cache bounded).
                taken.retain(|key, _| shared.work.get(&caller.cluster, key).is_some());
            }
            screen(&caller.cluster, report.items, &shared.work, taken)
        };
        let mut response = StatusResponse {
            accepted: screened.duplicates,
            rejected: screened.rejected,
        };
        if !screened.forward.is_empty() || full {
            let marks: Vec<Mark> = screened.forward.iter().map(Mark::of).collect();
            let verdict = shared
                .intake
                .submit(StatusBatch::from_agent(
                    caller.cluster.clone(),
                    StatusReport {
                        items: screened.forward,
                        full,
                    },
                ))
                .await
                .map_err(|IntakeError::Closed| {
                    ApiError::Unavailable("the status processor is not running".into())
                })?;
            {
                let mut all = shared.last_taken.lock().unwrap_or_else(|e| e.into_inner());
                let taken = all.entry(caller.cluster.clone()).or_default();
                remember(taken, marks, &verdict.rejected);
            }
            response.accepted += verdict.accepted;
            response.rejected.extend(verdict.rejected);
        }
        let items = &shared.metrics.status_items;
        items
            .with_label_values(&["accepted"])
            .inc_by((response.accepted - screened.duplicates) as u64);
        items
            .with_label_values(&["duplicate"])
            .inc_by(screened.duplicates as u64);
        items
            .with_label_values(&["rejected"])
            .inc_by(response.rejected.len() as u64);
        if !response.rejected.is_empty() {
            tracing::debug!(
                rejected = response.rejected.len(),
                first = %response.rejected[0].reason,
                "status items rejected"
            );
        }
        Ok(Json(response))
    }
    .instrument(span)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use lifeboat_api::protocol::{ObservedObject, Work};
    use serde_json::json;

    fn key(name: &str) -> WorkKey {
        WorkKey {
            namespace: "ml".into(),
            name: name.into(),
        }
    }

    fn item(name: &str, uid: &str, second: i64) -> WorkStatus {
        WorkStatus {
            key: key(name),
            binding_uid: uid.into(),
            revision: 1,
            applied: true,
            applied_message: None,
            observed: Some(ObservedObject::from_value(&json!({"status": {}})).unwrap()),
            observed_at: Time(Timestamp::from_second(1_780_000_000 + second).unwrap()),
            reset_generation: None,
            fenced: false,
            gone: false,
        }
    }

    fn store() -> WorkStore {
        let store = WorkStore::new("e1");
        for name in ["a", "b"] {
            store.upsert(
                "m1",
                Work {
                    key: key(name),
                    binding_uid: format!("uid-{name}"),
                    manifest: json!({"kind": "Job"}),
                    ..Default::default()
                },
            );
        }
        store
    }

    #[test]
    fn items_for_other_work_are_rejected_and_the_rest_taken() {
        let work = store();
        let mut taken = TakenReports::new();
        let screened = screen(
            "m1",
            vec![
                item("a", "uid-a", 1),
                item("c", "uid-c", 1),
                item("b", "uid-old", 1),
            ],
            &work,
            &mut taken,
        );
        assert_eq!(screened.forward, vec![item("a", "uid-a", 1)]);
        let reasons: Vec<&str> = screened
            .rejected
            .iter()
            .map(|r| r.reason.as_str())
            .collect();
        assert_eq!(
            reasons,
            [
                "ml/c is not assigned to cluster m1",
                "binding UID uid-old is not the one assigned to cluster m1 (uid-b)"
            ]
        );
        // another cluster's work is not this cluster's
        let screened = screen("m2", vec![item("a", "uid-a", 1)], &work, &mut taken);
        assert!(screened.forward.is_empty() && screened.rejected.len() == 1);
    }

    #[test]
    fn a_gone_report_in_the_second_of_the_last_report_is_forwarded() {
        let work = store();
        let mut taken = TakenReports::new();
        let failed = item("a", "uid-a", 1);
        let screened = screen("m1", vec![failed.clone()], &work, &mut taken);
        remember(&mut taken, vec![Mark::of(&failed)], &screened.rejected);
        work.withdraw_for_purge("m1", &key("a"), "uid-a");
        let gone = WorkStatus {
            applied: false,
            observed: None,
            gone: true,
            ..item("a", "uid-a", 1)
        };
        let screened = screen("m1", vec![gone.clone()], &work, &mut taken);
        assert_eq!((screened.forward, screened.duplicates), (vec![gone], 0));
    }

    #[test]
    fn a_gone_report_is_taken_only_for_an_awaited_purge_of_that_cluster_and_binding() {
        let work = store();
        work.withdraw_for_purge("m1", &key("a"), "uid-a");
        let gone = |name: &str, uid: &str, second| WorkStatus {
            applied: false,
            observed: None,
            gone: true,
            ..item(name, uid, second)
        };
        let mut taken = TakenReports::new();
        let screened = screen(
            "m1",
            vec![
                gone("a", "uid-a", 1),
                gone("a", "uid-forged", 1),
                // b is assigned, not withdrawn: a gone report of it is refused
                gone("b", "uid-b", 1),
                // a's copy report: a is no longer assigned
                item("a", "uid-a", 2),
            ],
            &work,
            &mut taken,
        );
        assert_eq!(screened.forward, vec![gone("a", "uid-a", 1)]);
        let reasons: Vec<&str> = screened
            .rejected
            .iter()
            .map(|r| r.reason.as_str())
            .collect();
        assert_eq!(
            reasons,
            [
                "gone: binding UID uid-forged is not the one withdrawn from cluster m1 (uid-a)",
                "gone: ml/b was not withdrawn from cluster m1 awaiting its purge",
                "ml/a is not assigned to cluster m1",
            ]
        );
        // another cluster cannot report m1's copy gone
        let other = screen("m2", vec![gone("a", "uid-a", 3)], &work, &mut taken);
        assert!(other.forward.is_empty());
        assert_eq!(
            other.rejected[0].reason,
            "gone: ml/a was not withdrawn from cluster m2 awaiting its purge"
        );
        // once the purge is settled, a late gone report is refused
        work.settle_purge("m1", &key("a"));
        let late = screen("m1", vec![gone("a", "uid-a", 4)], &work, &mut taken);
        assert!(late.forward.is_empty() && late.rejected.len() == 1);
    }

    #[test]
    fn the_same_report_again_is_taken_once_and_older_ones_are_stale() {
        let work = store();
        let mut taken = TakenReports::new();
        let batch = vec![item("a", "uid-a", 5), item("b", "uid-b", 5)];
        let first = screen("m1", batch.clone(), &work, &mut taken);
        assert_eq!(first.forward.len(), 2);
        // the processor refused b: it is not remembered, so a retry of b goes through again
        remember(
            &mut taken,
            first.forward.iter().map(Mark::of).collect(),
            &[RejectedItem {
                key: key("b"),
                reason: "x".into(),
            }],
        );
        let again = screen("m1", batch, &work, &mut taken);
        assert_eq!(again.duplicates, 1);
        assert_eq!(again.forward, vec![item("b", "uid-b", 5)]);
        let older = screen("m1", vec![item("a", "uid-a", 4)], &work, &mut taken);
        assert!(older.rejected[0].reason.starts_with("stale"));
        let newer = screen("m1", vec![item("a", "uid-a", 6)], &work, &mut taken);
        assert_eq!(newer.forward.len(), 1);
        // work removed from the cluster: its entry goes
        work.remove("m1", &key("a"));
        screen("m1", vec![item("a", "uid-a", 7)], &work, &mut taken);
        assert!(!taken.contains_key(&key("a")));
    }
}
