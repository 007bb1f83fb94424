//! What the agent reports of each work, pure: the latest state per work (apply result and the
//! observed object), which works changed since they were last reported, and the batches.
//!
//! Only the latest state of a work is kept, so a hub that is away costs no growing buffer: when
//! it is back, each changed work is sent once. `observedAt` is a microsecond (times here are
//! microseconds since the epoch) and strictly increases per work (the hub refuses an older
//! report and ignores an equal one as a replay): a work reported in the current microsecond
//! waits for the next. (It was a whole second, the wire format of `metav1.Time`, which held a
//! failure changed within the second of the work's last report back by up to a second.)
//!
//! A work withdrawn with a request to confirm its copy gone (a `Directly` eviction) is kept as a
//! purge until the hub answered its gone report: the report is sent once the applier saw the
//! object gone, again when a batch carrying it fails or after a snapshot (reconnect, new hub
//! term), and dropped once a hub answered it (taken or refused). A gone report may say the
//! time of the work's last report: it is the work's last word, which the hub takes even then
//! (taking it twice changes nothing).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use lifeboat_api::protocol::{ObservedObject, StatusReport, WorkKey, WorkStatus};
use serde_json::{Map, Value};

use super::reset;
use super::work::ObjectId;

/// How long a full report waits for the works of a snapshot to be applied first (µs).
pub const FULL_REPORT_WAIT_MICROS: i64 = 10_000_000;

/// Annotations never reported (large, and of no use to interpreters).
const DROPPED_ANNOTATIONS: &[&str] = &["kubectl.kubernetes.io/last-applied-configuration"];

/// The object as reported: metadata trimmed to what interpreters read, `spec` and `status`
/// (never other top-level fields: a Secret's `data` stays in the member).
pub fn trim_observed(object: &Value, api_version: &str, kind: &str) -> Value {
    let mut out = Map::new();
    out.insert("apiVersion".into(), Value::String(api_version.into()));
    out.insert("kind".into(), Value::String(kind.into()));
    let mut metadata = Map::new();
    if let Some(meta) = object.get("metadata").and_then(Value::as_object) {
        for field in ["name", "namespace", "uid", "generation", "labels"] {
            if let Some(v) = meta.get(field) {
                metadata.insert(field.into(), v.clone());
            }
        }
        if let Some(Value::Object(annotations)) = meta.get("annotations") {
            let kept: Map<String, Value> = annotations
                .iter()
                .filter(|(k, _)| !DROPPED_ANNOTATIONS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !kept.is_empty() {
                metadata.insert("annotations".into(), Value::Object(kept));
            }
        }
    }
    out.insert("metadata".into(), Value::Object(metadata));
    for field in ["spec", "status"] {
        if let Some(v) = object.get(field) {
            out.insert(field.into(), v.clone());
        }
    }
    Value::Object(out)
}

#[derive(Debug, Clone)]
struct Entry {
    binding_uid: String,
    revision: i64,
    /// The latest revision has not been applied (nor failed) yet: nothing to report.
    pending: bool,
    applied: bool,
    applied_message: Option<String>,
    /// The object the last successful apply made.
    target: Option<ObjectId>,
    /// The time of the last report sent (µs).
    last_sent: Option<i64>,
}

/// A withdrawn work whose copy the hub waits to hear is gone.
#[derive(Debug, Clone)]
struct Purge {
    binding_uid: String,
    /// The applier saw the object gone: the gone report is due.
    gone: bool,
    /// The time of the last report sent of this work (µs): the gone report must not be earlier.
    last_sent: Option<i64>,
    /// How many times the hub asked (a new ask after a report was taken for sending asks again).
    asked: u64,
}

/// One batch taken for sending.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub report: StatusReport,
    /// The time every item's `observedAt` says (µs).
    pub at: i64,
    /// The purges whose gone report the batch carries, with the ask each answers.
    pub purges: Vec<(WorkKey, u64)>,
}

/// The latest state of every work, and what is left to report.
#[derive(Debug, Default)]
pub struct StatusBook {
    works: BTreeMap<WorkKey, Entry>,
    /// Objects seen by the watches (trimmed), with the work their labels name.
    objects: HashMap<ObjectId, (WorkKey, Value)>,
    /// Target object → its work.
    by_target: HashMap<ObjectId, WorkKey>,
    dirty: BTreeSet<WorkKey>,
    /// A full report is due (after a snapshot), asked for at this time (µs).
    full_since: Option<i64>,
    /// Nothing is reported at this time (µs) or before: an earlier process (or term) of the
    /// agent may have reported then, and the hub ignores a report whose `observedAt` equals
    /// the last one it took.
    floor: Option<i64>,
    /// Withdrawn works whose copy the hub waits to hear is gone.
    purges: BTreeMap<WorkKey, Purge>,
    /// Purges whose gone report is due.
    gone_due: BTreeSet<WorkKey>,
}

impl StatusBook {
    /// The book of a term that starts at `now` (µs): its first report is later than any
    /// report of an earlier term.
    pub fn starting_at(now: i64) -> Self {
        Self {
            floor: Some(now),
            ..Self::default()
        }
    }

    /// A new revision of a work arrived (to be applied).
    pub fn assign(&mut self, key: &WorkKey, binding_uid: &str, revision: i64) {
        // Wanted here again: no longer a copy to report gone.
        self.purges.remove(key);
        self.gone_due.remove(key);
        let entry = self.works.entry(key.clone()).or_insert_with(|| Entry {
            binding_uid: binding_uid.to_string(),
            revision,
            pending: true,
            applied: false,
            applied_message: None,
            target: None,
            last_sent: None,
        });
        entry.binding_uid = binding_uid.to_string();
        entry.revision = revision;
        entry.pending = true;
    }

    /// The result of applying `revision` of a work (`Ok(object)` or `Err(message)`); a result
    /// for an older revision is ignored.
    pub fn applied(&mut self, key: &WorkKey, revision: i64, result: Result<ObjectId, String>) {
        let Some(entry) = self.works.get_mut(key) else {
            return;
        };
        if entry.revision != revision {
            return;
        }
        entry.pending = false;
        match result {
            Ok(target) => {
                entry.applied = true;
                entry.applied_message = None;
                if entry.target.as_ref() != Some(&target) {
                    if let Some(old) = entry.target.take() {
                        self.by_target.remove(&old);
                    }
                    self.by_target.insert(target.clone(), key.clone());
                    entry.target = Some(target);
                }
            }
            Err(message) => {
                entry.applied = false;
                entry.applied_message = Some(message);
            }
        }
        self.dirty.insert(key.clone());
    }

    /// The work is no longer assigned: nothing more is reported of it.
    pub fn remove(&mut self, key: &WorkKey) {
        if let Some(entry) = self.works.remove(key)
            && let Some(target) = entry.target
        {
            self.by_target.remove(&target);
        }
        self.dirty.remove(key);
    }

    /// The work is no longer assigned; with `confirm` (the binding UID) the hub waits to hear
    /// that its copy is gone ([`StatusBook::gone`] once it is).
    pub fn withdraw(&mut self, key: &WorkKey, confirm: Option<&str>) {
        let last_sent = self.works.get(key).and_then(|e| e.last_sent);
        self.remove(key);
        let Some(binding_uid) = confirm else {
            return;
        };
        self.gone_due.remove(key);
        let purge = self.purges.entry(key.clone()).or_insert_with(|| Purge {
            binding_uid: binding_uid.to_string(),
            gone: false,
            last_sent: None,
            asked: 0,
        });
        if purge.binding_uid != binding_uid {
            purge.binding_uid = binding_uid.to_string();
            purge.last_sent = None;
        }
        // Asked (again): the applier confirms the absence anew.
        purge.gone = false;
        purge.asked += 1;
        purge.last_sent = purge.last_sent.max(last_sent);
    }

    /// The applier saw the copy of a purge gone (deleted and no longer served): its gone
    /// report is due. Ignored for a purge of another binding or none.
    pub fn gone(&mut self, key: &WorkKey, binding_uid: &str) {
        if let Some(purge) = self
            .purges
            .get_mut(key)
            .filter(|p| p.binding_uid == binding_uid)
        {
            purge.gone = true;
            self.gone_due.insert(key.clone());
        }
    }

    /// Purges waiting for their gone report to be answered.
    pub fn purges(&self) -> usize {
        self.purges.len()
    }

    /// A watch saw an object with binding labels change (`Some`) or go (`None`).
    pub fn observe(&mut self, id: ObjectId, seen: Option<(WorkKey, Value)>) {
        let changed = match &seen {
            Some(new) => self.objects.get(&id) != Some(new),
            None => self.objects.contains_key(&id),
        };
        if !changed {
            return;
        }
        match seen {
            Some(new) => {
                self.objects.insert(id.clone(), new);
            }
            None => {
                self.objects.remove(&id);
            }
        }
        if let Some(key) = self.by_target.get(&id) {
            self.dirty.insert(key.clone());
        }
    }

    /// A watch listed every object of one kind again: those of that kind not listed are gone.
    pub fn relist(&mut self, group: &str, kind: &str, objects: Vec<(ObjectId, WorkKey, Value)>) {
        let listed: BTreeSet<ObjectId> = objects.iter().map(|(id, _, _)| id.clone()).collect();
        let gone: Vec<ObjectId> = self
            .objects
            .keys()
            .filter(|id| id.group == group && id.kind == kind && !listed.contains(*id))
            .cloned()
            .collect();
        for id in gone {
            self.observe(id, None);
        }
        for (id, key, value) in objects {
            self.observe(id, Some((key, value)));
        }
    }

    /// After a snapshot: report every work again, the first batch marked full.
    pub fn request_full(&mut self, now: i64) {
        self.dirty.extend(self.works.keys().cloned());
        // Gone reports no hub answered yet go again (the hub may be a new term).
        self.gone_due.extend(
            self.purges
                .iter()
                .filter(|(_, p)| p.gone)
                .map(|(k, _)| k.clone()),
        );
        self.full_since = Some(now);
    }

    /// How many works (and gone copies) wait to be reported.
    pub fn backlog(&self) -> usize {
        self.dirty.len() + self.gone_due.len()
    }

    pub fn len(&self) -> usize {
        self.works.len()
    }

    pub fn is_empty(&self) -> bool {
        self.works.is_empty()
    }

    /// Takes up to `max` changed works reportable at `now` (µs; applied or failed, not
    /// reported at this time yet). `None` when there is nothing to send. The works taken
    /// count as reported; [`StatusBook::failed`] puts them back.
    pub fn take(&mut self, now: i64, max: usize) -> Option<Batch> {
        if self.floor.is_some_and(|floor| now <= floor) {
            return None;
        }
        let full = match self.full_since {
            Some(since) => {
                let waiting = self.works.values().any(|e| e.pending);
                if waiting && now - since < FULL_REPORT_WAIT_MICROS {
                    // Let the snapshot's applies finish so the full report covers them.
                    return None;
                }
                // A full report carries every work; one already reported at this time would
                // be left out (its `observedAt` must increase), so the report waits.
                if self
                    .works
                    .values()
                    .any(|e| !e.pending && e.last_sent.is_some_and(|s| s >= now))
                {
                    return None;
                }
                true
            }
            None => false,
        };
        let keys: Vec<WorkKey> = self
            .dirty
            .iter()
            .filter(|k| {
                self.works
                    .get(*k)
                    .is_some_and(|e| !e.pending && e.last_sent.is_none_or(|s| s < now))
            })
            .take(max.max(1))
            .cloned()
            .collect();
        let room = max.max(1).saturating_sub(keys.len());
        let gone: Vec<WorkKey> = self
            .gone_due
            .iter()
            .filter(|k| {
                self.purges
                    .get(*k)
                    .is_some_and(|p| p.gone && p.last_sent.is_none_or(|s| s <= now))
            })
            .take(room)
            .cloned()
            .collect();
        if keys.is_empty() && gone.is_empty() && !full {
            return None;
        }
        let observed_at = Time(Timestamp::from_microsecond(now).unwrap_or(Timestamp::UNIX_EPOCH));
        let mut items = Vec::with_capacity(keys.len() + gone.len());
        let mut purges = Vec::with_capacity(gone.len());
        for key in gone {
            self.gone_due.remove(&key);
            let Some(purge) = self.purges.get_mut(&key) else {
                continue;
            };
            purge.last_sent = Some(now);
            purges.push((key.clone(), purge.asked));
            items.push(WorkStatus {
                key,
                binding_uid: purge.binding_uid.clone(),
                revision: 0,
                applied: false,
                applied_message: None,
                observed: None,
                observed_at: observed_at.clone(),
                reset_generation: None,
                fenced: false,
                gone: true,
            });
        }
        for key in keys {
            self.dirty.remove(&key);
            let Some(entry) = self.works.get_mut(&key) else {
                continue;
            };
            entry.last_sent = Some(now);
            let object = entry
                .target
                .as_ref()
                .and_then(|t| self.objects.get(t))
                .filter(|(owner, _)| *owner == key)
                .map(|(_, v)| v);
            items.push(WorkStatus {
                key,
                binding_uid: entry.binding_uid.clone(),
                revision: entry.revision,
                applied: entry.applied,
                applied_message: entry.applied_message.clone(),
                // The generation the reported object was re-created for: the report says so
                // of the very object it carries (a stale one says its own).
                reset_generation: object.and_then(reset::reported_generation),
                // (A JSON value always has a JSON text.)
                observed: object.and_then(|v| ObservedObject::from_value(v).ok()),
                observed_at: observed_at.clone(),
                fenced: false,
                gone: false,
            });
        }
        self.full_since = None;
        Some(Batch {
            report: StatusReport { items, full },
            at: now,
            purges,
        })
    }

    /// A hub answered the batch: its gone reports are done with (taken, or refused: that hub
    /// does not wait for them), unless the hub asked again since the batch was taken.
    pub fn answered(&mut self, batch: &Batch) {
        for (key, asked) in &batch.purges {
            if self.purges.get(key).is_some_and(|p| p.asked == *asked) {
                self.purges.remove(key);
                self.gone_due.remove(key);
            }
        }
    }

    /// A batch did not reach the hub: its works are reported again (their latest state, at a
    /// later time), and a full report is asked for again if it was one.
    pub fn failed(&mut self, batch: &Batch) {
        for item in &batch.report.items {
            if self.works.contains_key(&item.key) {
                self.dirty.insert(item.key.clone());
            }
        }
        for (key, _) in &batch.purges {
            if self.purges.get(key).is_some_and(|p| p.gone) {
                self.gone_due.insert(key.clone());
            }
        }
        if batch.report.full && self.full_since.is_none() {
            self.full_since = Some(batch.at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The observed object of a report, parsed.
    fn parsed(item: &WorkStatus) -> Option<Value> {
        item.observed.as_ref().map(|o| o.to_value().unwrap())
    }

    fn key(name: &str) -> WorkKey {
        WorkKey {
            namespace: "ml".into(),
            name: name.into(),
        }
    }

    fn id(name: &str) -> ObjectId {
        ObjectId {
            group: "apps".into(),
            kind: "Deployment".into(),
            namespace: Some("ml".into()),
            name: name.into(),
        }
    }

    fn seen(name: &str, ready: i64) -> Option<(WorkKey, Value)> {
        Some((key(name), json!({"status": {"readyReplicas": ready}})))
    }

    fn names(batch: &Batch) -> Vec<String> {
        batch
            .report
            .items
            .iter()
            .map(|i| i.key.name.clone())
            .collect()
    }

    #[test]
    fn nothing_is_reported_before_the_apply_result() {
        let mut book = StatusBook::default();
        book.assign(&key("a"), "uid-a", 1);
        book.observe(id("a"), seen("a", 0));
        assert_eq!(book.take(100, 500), None);
        book.applied(&key("a"), 1, Ok(id("a")));
        let batch = book.take(100, 500).expect("a batch");
        let item = &batch.report.items[0];
        assert!(item.applied && !batch.report.full);
        assert_eq!(item.revision, 1);
        assert_eq!(item.binding_uid, "uid-a");
        assert_eq!(parsed(item), Some(json!({"status": {"readyReplicas": 0}})));
        assert_eq!(item.observed_at.0.as_microsecond(), 100);
        assert_eq!(book.take(100, 500), None, "nothing changed");
    }

    #[test]
    fn observed_at_strictly_increases_per_work() {
        let mut book = StatusBook::default();
        book.assign(&key("a"), "u", 1);
        book.applied(&key("a"), 1, Ok(id("a")));
        assert!(book.take(100, 500).is_some());
        // A change in the same microsecond waits for the next one; only the latest state goes.
        book.observe(id("a"), seen("a", 1));
        book.observe(id("a"), seen("a", 2));
        assert_eq!(book.take(100, 500), None);
        let batch = book.take(101, 500).expect("next microsecond");
        assert_eq!(batch.report.items.len(), 1);
        assert_eq!(
            parsed(&batch.report.items[0]),
            Some(json!({"status": {"readyReplicas": 2}}))
        );
        assert_eq!(batch.report.items[0].observed_at.0.as_microsecond(), 101);
        // An unchanged observation marks nothing.
        book.observe(id("a"), seen("a", 2));
        assert_eq!(book.backlog(), 0);
    }

    #[test]
    fn a_failed_batch_is_resent_later_with_the_latest_state() {
        let mut book = StatusBook::default();
        for name in ["a", "b", "c"] {
            book.assign(&key(name), "u", 1);
            book.applied(&key(name), 1, Ok(id(name)));
        }
        let first = book.take(100, 2).expect("batch");
        assert_eq!(names(&first), ["a", "b"]);
        book.failed(&first);
        book.observe(id("a"), seen("a", 5));
        // c was never sent: it goes now; a and b wait for the next microsecond.
        assert_eq!(names(&book.take(100, 500).expect("c")), ["c"]);
        let again = book.take(101, 500).expect("resent");
        assert_eq!(names(&again), ["a", "b"]);
        assert_eq!(
            parsed(&again.report.items[0]),
            Some(json!({"status": {"readyReplicas": 5}}))
        );
    }

    #[test]
    fn apply_failures_are_reported_and_stale_results_ignored() {
        let mut book = StatusBook::default();
        book.assign(&key("a"), "u", 2);
        book.applied(&key("a"), 1, Ok(id("a")));
        assert_eq!(book.take(100, 500), None, "revision 1 is not the latest");
        book.applied(&key("a"), 2, Err("admission webhook denied".into()));
        let item = book.take(100, 500).expect("batch").report.items[0].clone();
        assert!(!item.applied);
        assert_eq!(
            item.applied_message.as_deref(),
            Some("admission webhook denied")
        );
        assert_eq!(item.observed, None);
    }

    #[test]
    fn a_full_report_waits_for_the_snapshot_applies_up_to_a_limit() {
        let mut book = StatusBook::default();
        book.assign(&key("a"), "u", 1);
        book.applied(&key("a"), 1, Ok(id("a")));
        book.assign(&key("b"), "u", 1);
        book.request_full(100);
        assert_eq!(book.take(101, 500), None, "b is still being applied");
        book.applied(&key("b"), 1, Ok(id("b")));
        let batch = book.take(102, 500).expect("full");
        assert!(batch.report.full);
        assert_eq!(names(&batch), ["a", "b"]);
        // The next one is not full.
        book.observe(id("a"), seen("a", 1));
        assert!(!book.take(103, 500).expect("delta").report.full);
        // A work whose apply never finishes does not hold the full report forever.
        book.assign(&key("c"), "u", 1);
        book.request_full(200);
        assert_eq!(book.take(205, 500), None);
        let batch = book
            .take(200 + FULL_REPORT_WAIT_MICROS, 500)
            .expect("full anyway");
        assert!(batch.report.full);
        assert_eq!(names(&batch), ["a", "b"]);
        // A failed full report is full again.
        book.failed(&batch);
        assert!(
            book.take(200 + 2 * FULL_REPORT_WAIT_MICROS, 500)
                .expect("again")
                .report
                .full
        );
    }

    #[test]
    fn a_full_report_waits_for_works_reported_at_the_same_time() {
        let mut book = StatusBook::default();
        book.assign(&key("a"), "uid-a", 1);
        book.applied(&key("a"), 1, Ok(id("a")));
        assert_eq!(names(&book.take(100, 500).expect("delta")), ["a"]);
        book.request_full(100);
        assert_eq!(book.take(100, 500), None, "a was reported at 100 already");
        let batch = book.take(101, 500).expect("full");
        assert!(batch.report.full);
        assert_eq!(names(&batch), ["a"]);
    }

    #[test]
    fn a_new_term_reports_after_its_start() {
        let mut book = StatusBook::starting_at(100);
        book.assign(&key("a"), "uid-a", 1);
        book.applied(&key("a"), 1, Ok(id("a")));
        assert_eq!(
            book.take(100, 500),
            None,
            "an earlier term may have reported at 100"
        );
        let batch = book.take(101, 500).expect("a batch");
        assert_eq!(names(&batch), ["a"]);
        assert_eq!(batch.at, 101);
    }

    #[test]
    fn an_empty_snapshot_still_sends_a_full_report() {
        let mut book = StatusBook::default();
        book.request_full(100);
        let batch = book.take(100, 500).expect("full");
        assert!(batch.report.full && batch.report.items.is_empty());
        assert_eq!(book.take(101, 500), None);
    }

    #[test]
    fn objects_of_another_work_or_gone_are_not_reported() {
        let mut book = StatusBook::default();
        book.assign(&key("a"), "u", 1);
        book.applied(&key("a"), 1, Ok(id("a")));
        // Another binding's labels on the object the work names: not ours to report.
        book.observe(id("a"), seen("x", 1));
        let item = book.take(100, 500).expect("batch").report.items[0].clone();
        assert_eq!(item.observed, None);
        book.observe(id("a"), seen("a", 1));
        assert!(
            book.take(101, 500).expect("batch").report.items[0]
                .observed
                .is_some()
        );
        // The object was deleted: a relist without it reports it gone.
        book.relist("apps", "Deployment", vec![]);
        let item = book.take(102, 500).expect("batch").report.items[0].clone();
        assert_eq!(item.observed, None);
        book.remove(&key("a"));
        book.observe(id("a"), seen("a", 3));
        assert_eq!(book.take(103, 500), None);
        assert!(book.is_empty());
    }

    fn gone_items(batch: &Batch) -> Vec<String> {
        batch
            .report
            .items
            .iter()
            .filter(|i| i.gone)
            .map(|i| format!("{}:{}", i.key.name, i.binding_uid))
            .collect()
    }

    #[test]
    fn a_withdrawn_copy_is_reported_gone_once_seen_gone_even_at_the_time_of_its_last_report() {
        let mut book = StatusBook::default();
        book.assign(&key("a"), "uid-a", 1);
        book.applied(&key("a"), 1, Ok(id("a")));
        assert!(book.take(100, 500).is_some());
        book.withdraw(&key("a"), Some("uid-a"));
        assert_eq!(book.take(100, 500), None, "not seen gone yet");
        // another binding's copy of that name is not this purge
        book.gone(&key("a"), "uid-other");
        assert_eq!(book.take(100, 500), None);
        book.gone(&key("a"), "uid-a");
        assert_eq!(book.backlog(), 1);
        // a was reported at 100: the gone report need not wait (the hub takes a gone report
        // of the time of the last report)
        let batch = book.take(100, 500).expect("gone report");
        assert_eq!(gone_items(&batch), ["a:uid-a"]);
        let item = &batch.report.items[0];
        assert!(!item.applied && item.observed.is_none());
        assert_eq!(item.observed_at.0.as_microsecond(), 100);
        // sent, not answered: kept, not sent again on its own
        assert_eq!(book.take(102, 500), None);
        assert_eq!(book.purges(), 1);
        book.answered(&batch);
        assert_eq!(book.purges(), 0);
        // a plain withdrawal is not reported at all
        book.assign(&key("b"), "uid-b", 1);
        book.applied(&key("b"), 1, Ok(id("b")));
        book.take(103, 500);
        book.withdraw(&key("b"), None);
        book.gone(&key("b"), "uid-b");
        assert_eq!(book.take(104, 500), None);
        assert!(book.is_empty());
    }

    #[test]
    fn an_unanswered_gone_report_goes_again_after_a_failure_or_a_snapshot() {
        let mut book = StatusBook::default();
        // after a restart the agent does not know the work: the purge alone is enough
        book.withdraw(&key("a"), Some("uid-a"));
        book.gone(&key("a"), "uid-a");
        let first = book.take(100, 500).expect("gone report");
        book.failed(&first);
        let again = book.take(101, 500).expect("after the failure");
        assert_eq!(gone_items(&again), ["a:uid-a"]);
        // the hub restarted meanwhile: its snapshot asks again; the answer of the old hub does
        // not settle the new ask
        book.withdraw(&key("a"), Some("uid-a"));
        book.answered(&again);
        assert_eq!(book.purges(), 1);
        assert_eq!(book.take(102, 500), None, "to be confirmed gone again");
        book.gone(&key("a"), "uid-a");
        let third = book.take(102, 500).expect("the new ask answered");
        // no answer (the connection broke), then a snapshot: it goes once more
        book.request_full(103);
        let full = book.take(103, 500).expect("full");
        assert!(full.report.full);
        assert_eq!(gone_items(&full), ["a:uid-a"]);
        book.answered(&third);
        book.answered(&full);
        assert_eq!(book.purges(), 0);
        // assigned here again before the report: no longer gone
        book.withdraw(&key("c"), Some("uid-c"));
        book.gone(&key("c"), "uid-c");
        book.assign(&key("c"), "uid-c", 2);
        assert_eq!(book.purges(), 0);
        assert_eq!(book.backlog(), 0);
    }

    #[test]
    fn the_reset_generation_is_the_reported_objects() {
        let annotated = |generation: &str| {
            Some((
                key("a"),
                json!({"metadata": {"annotations": {
                    lifeboat_api::binding::ANNOTATION_RESET_GENERATION: generation}}}),
            ))
        };
        let mut book = StatusBook::default();
        book.assign(&key("a"), "u", 1);
        book.observe(id("a"), seen("a", 1));
        book.applied(&key("a"), 1, Ok(id("a")));
        let item = book.take(100, 500).expect("batch").report.items[0].clone();
        assert_eq!(item.reset_generation, None, "never reset");
        // Re-created for generation 2: reported with the new object.
        book.observe(id("a"), annotated("2"));
        let item = book.take(101, 500).expect("batch").report.items[0].clone();
        assert_eq!(item.reset_generation, Some(2));
        // Gone (mid-reset): no object, no generation.
        book.observe(id("a"), None);
        let item = book.take(102, 500).expect("batch").report.items[0].clone();
        assert_eq!((item.observed, item.reset_generation), (None, None));
    }

    #[test]
    fn trimming_keeps_what_interpreters_read() {
        let object = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "ml", "uid": "u1", "generation": 2,
                "resourceVersion": "9", "managedFields": [{"manager": "lifeboat"}],
                "labels": {"app": "web"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "keep": "me"}},
            "spec": {"replicas": 1}, "status": {"readyReplicas": 1}, "data": {"secret": "x"}
        });
        assert_eq!(
            trim_observed(&object, "apps/v1", "Deployment"),
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "ml", "uid": "u1", "generation": 2,
                    "labels": {"app": "web"}, "annotations": {"keep": "me"}},
                "spec": {"replicas": 1}, "status": {"readyReplicas": 1}
            })
        );
    }
}
