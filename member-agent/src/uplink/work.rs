//! The work stream's state and the decisions taken on it, pure: the cursor to resume from, the
//! snapshot being collected after a `Reset`, the object a manifest names, and which labelled
//! objects a completed snapshot leaves without a work (to delete).

use std::collections::{BTreeMap, BTreeSet};

use lifeboat_api::binding::{ANNOTATION_BINDING_UID, LABEL_BINDING_NAME, LABEL_BINDING_NAMESPACE};
use lifeboat_api::protocol::{Cursor, Work, WorkEvent, WorkKey};
use serde_json::{Map, Value};

/// The object a manifest names, version-independent (one object is served under every version
/// of its group).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId {
    pub group: String,
    pub kind: String,
    /// `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    pub name: String,
}

impl std::fmt::Display for ObjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            String::new()
        } else {
            format!(".{}", self.group)
        };
        match &self.namespace {
            Some(ns) => write!(f, "{}{group} {ns}/{}", self.kind, self.name),
            None => write!(f, "{}{group} {}", self.kind, self.name),
        }
    }
}

/// The group of an `apiVersion` (`apps/v1` → `apps`, `v1` → ``).
pub fn group_of(api_version: &str) -> &str {
    api_version
        .split_once('/')
        .map(|(g, _)| g)
        .unwrap_or_default()
}

/// A manifest that cannot be applied; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("manifest of {key}: {field}: {reason}")]
pub struct ManifestError {
    pub key: WorkKey,
    pub field: &'static str,
    pub reason: String,
}

/// A manifest ready for server-side apply: the binding's labels and UID annotation set (the hub
/// sets them; the agent makes sure, since adoption and removal find objects by them).
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    pub api_version: String,
    pub kind: String,
    /// The manifest's namespace, else the work's (dropped for cluster-scoped kinds).
    pub namespace: String,
    pub name: String,
    pub body: Value,
}

impl Prepared {
    pub fn id(&self, namespaced: bool) -> ObjectId {
        ObjectId {
            group: group_of(&self.api_version).to_string(),
            kind: self.kind.clone(),
            namespace: namespaced.then(|| self.namespace.clone()),
            name: self.name.clone(),
        }
    }
}

pub fn prepare(work: &Work) -> Result<Prepared, ManifestError> {
    let fail = |field, reason: &str| ManifestError {
        key: work.key.clone(),
        field,
        reason: reason.to_string(),
    };
    let object = work
        .manifest
        .as_object()
        .ok_or_else(|| fail("manifest", "is not an object"))?;
    let text = |field: &'static str, value: Option<&Value>| -> Result<String, ManifestError> {
        match value {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(Value::String(_)) | None => Err(fail(field, "is required")),
            Some(_) => Err(fail(field, "must be a string")),
        }
    };
    let api_version = text("apiVersion", object.get("apiVersion"))?;
    let kind = text("kind", object.get("kind"))?;
    let metadata = match object.get("metadata") {
        Some(Value::Object(m)) => m,
        _ => return Err(fail("metadata", "must be an object")),
    };
    let name = text("metadata.name", metadata.get("name"))?;
    let namespace = match metadata.get("namespace") {
        None | Some(Value::Null) => work.key.namespace.clone(),
        value => text("metadata.namespace", value)?,
    };
    let mut body = work.manifest.clone();
    let meta = body
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| fail("metadata", "must be an object"))?;
    set_entry(meta, "labels", LABEL_BINDING_NAMESPACE, &work.key.namespace)
        .map_err(|r| fail("metadata.labels", r))?;
    set_entry(meta, "labels", LABEL_BINDING_NAME, &work.key.name)
        .map_err(|r| fail("metadata.labels", r))?;
    set_entry(
        meta,
        "annotations",
        ANNOTATION_BINDING_UID,
        &work.binding_uid,
    )
    .map_err(|r| fail("metadata.annotations", r))?;
    // Server-generated fields a manifest must not carry into an apply.
    for field in [
        "uid",
        "resourceVersion",
        "managedFields",
        "creationTimestamp",
    ] {
        meta.remove(field);
    }
    if let Some(o) = body.as_object_mut() {
        o.remove("status");
    }
    Ok(Prepared {
        api_version,
        kind,
        namespace,
        name,
        body,
    })
}

fn set_entry(
    meta: &mut Map<String, Value>,
    map: &str,
    key: &str,
    value: &str,
) -> Result<(), &'static str> {
    let entry = meta
        .entry(map.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if entry.is_null() {
        *entry = Value::Object(Map::new());
    }
    let entries = entry.as_object_mut().ok_or("must be an object")?;
    entries.insert(key.to_string(), Value::String(value.to_string()));
    Ok(())
}

/// The work an object belongs to, from its binding labels.
pub fn key_of(labels: &BTreeMap<String, String>) -> Option<WorkKey> {
    Some(WorkKey {
        namespace: labels.get(LABEL_BINDING_NAMESPACE)?.clone(),
        name: labels.get(LABEL_BINDING_NAME)?.clone(),
    })
}

/// What to do after one event of the stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Create or update this work.
    Apply(Box<Work>),
    /// This work is no longer assigned: remove its object. With `confirm` (the binding UID), the
    /// hub waits for the copy to be reported gone once it no longer exists.
    Remove {
        key: WorkKey,
        confirm: Option<String>,
    },
    /// A snapshot is complete: `keys` is everything assigned; every other work goes.
    SnapshotComplete { keys: BTreeSet<WorkKey> },
    /// Nothing to do (a bookmark, the start of a snapshot, caught up).
    Nothing,
}

/// The stream broke the protocol; the agent reconnects without a cursor (a full snapshot).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("work stream protocol: {0}")]
pub struct ProtocolError(pub String);

/// Where the agent is in the hub's work stream.
#[derive(Debug, Default, Clone)]
pub struct StreamState {
    /// The last consistent point: resume from here.
    cursor: Option<Cursor>,
    /// A snapshot being received: its epoch and the keys so far.
    snapshot: Option<(String, BTreeSet<WorkKey>)>,
}

impl StreamState {
    /// The cursor to send as `since` (none: the hub sends a full snapshot).
    pub fn cursor(&self) -> Option<&Cursor> {
        self.cursor.as_ref()
    }

    /// A snapshot is being received.
    pub fn in_snapshot(&self) -> bool {
        self.snapshot.is_some()
    }

    /// The connection ended: a partial snapshot is dropped (the cursor still points before it,
    /// so the hub sends it again).
    pub fn interrupted(&mut self) {
        self.snapshot = None;
    }

    /// Forget the cursor (after a protocol error): the next connection gets a full snapshot.
    pub fn forget(&mut self) {
        self.cursor = None;
        self.snapshot = None;
    }

    pub fn on_event(&mut self, event: WorkEvent) -> Result<Step, ProtocolError> {
        match event {
            WorkEvent::Reset { epoch, .. } => {
                if epoch.is_empty() {
                    return Err(ProtocolError("Reset without an epoch".into()));
                }
                self.snapshot = Some((epoch, BTreeSet::new()));
                Ok(Step::Nothing)
            }
            WorkEvent::Upsert { work } => {
                match &mut self.snapshot {
                    Some((_, keys)) => {
                        keys.insert(work.key.clone());
                    }
                    None => self.advance(work.revision),
                }
                Ok(Step::Apply(work))
            }
            WorkEvent::Delete {
                key,
                revision,
                binding_uid,
                confirm_gone,
            } => {
                if confirm_gone && binding_uid.is_empty() {
                    return Err(ProtocolError(format!(
                        "Delete of {key} asks to confirm the copy gone without a binding UID"
                    )));
                }
                match &mut self.snapshot {
                    Some((_, keys)) => {
                        keys.remove(&key);
                    }
                    None => self.advance(revision),
                }
                Ok(Step::Remove {
                    key,
                    confirm: confirm_gone.then_some(binding_uid),
                })
            }
            WorkEvent::Synced { epoch, revision } => match self.snapshot.take() {
                Some((snapshot_epoch, keys)) => {
                    if snapshot_epoch != epoch {
                        self.cursor = None;
                        return Err(ProtocolError(format!(
                            "snapshot of epoch {snapshot_epoch} ended by Synced of epoch {epoch}"
                        )));
                    }
                    self.cursor = Some(Cursor { epoch, revision });
                    Ok(Step::SnapshotComplete { keys })
                }
                None => match &mut self.cursor {
                    Some(cursor) if cursor.epoch == epoch => {
                        cursor.revision = cursor.revision.max(revision);
                        Ok(Step::Nothing)
                    }
                    _ => {
                        self.cursor = None;
                        Err(ProtocolError(format!(
                            "Synced of epoch {epoch} without a snapshot of that epoch"
                        )))
                    }
                },
            },
            WorkEvent::Bookmark => Ok(Step::Nothing),
        }
    }

    fn advance(&mut self, revision: i64) {
        if let Some(cursor) = &mut self.cursor {
            cursor.revision = cursor.revision.max(revision);
        }
    }
}

/// An object carrying binding labels, as a sweep found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labelled {
    pub id: ObjectId,
    pub key: WorkKey,
}

/// After a complete snapshot: the labelled objects to delete. `assigned` maps each work of the
/// snapshot to the object its manifest names (`None` when the manifest could not be read: its
/// objects are kept). An object goes when its work is not assigned, or when its work now names
/// another object (the manifest was renamed while the agent was away).
pub fn orphans(
    assigned: &BTreeMap<WorkKey, Option<ObjectId>>,
    found: &[Labelled],
) -> Vec<ObjectId> {
    let mut out: Vec<ObjectId> = found
        .iter()
        .filter(|o| match assigned.get(&o.key) {
            None => true,
            Some(None) => false,
            Some(Some(id)) => *id != o.id,
        })
        .map(|o| o.id.clone())
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(name: &str) -> WorkKey {
        WorkKey {
            namespace: "ml".into(),
            name: name.into(),
        }
    }

    fn work(name: &str, revision: i64) -> Work {
        Work {
            key: key(name),
            binding_uid: format!("uid-{name}"),
            revision,
            manifest: json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "labels": {"app": name}}, "spec": {"replicas": 1}}),
            purge_mode: None,
            reset: None,
        }
    }

    fn upsert(name: &str, revision: i64) -> WorkEvent {
        WorkEvent::Upsert {
            work: Box::new(work(name, revision)),
        }
    }

    fn cursor(epoch: &str, revision: i64) -> Option<Cursor> {
        Some(Cursor {
            epoch: epoch.into(),
            revision,
        })
    }

    #[test]
    fn a_snapshot_commits_its_cursor_only_when_synced() {
        let mut s = StreamState::default();
        assert_eq!(s.cursor(), None);
        let reset = WorkEvent::Reset {
            epoch: "e1".into(),
            revision: 7,
        };
        assert_eq!(s.on_event(reset.clone()), Ok(Step::Nothing));
        assert!(matches!(s.on_event(upsert("a", 3)), Ok(Step::Apply(_))));
        assert!(matches!(s.on_event(upsert("b", 7)), Ok(Step::Apply(_))));
        // Item revisions inside a snapshot do not move the cursor.
        assert_eq!(s.cursor(), None);
        let done = s
            .on_event(WorkEvent::Synced {
                epoch: "e1".into(),
                revision: 7,
            })
            .expect("synced");
        assert_eq!(
            done,
            Step::SnapshotComplete {
                keys: [key("a"), key("b")].into()
            }
        );
        assert_eq!(s.cursor(), cursor("e1", 7).as_ref());
        // Live changes move it, in order; bookmarks do not.
        s.on_event(upsert("c", 8)).expect("upsert");
        assert_eq!(
            s.on_event(WorkEvent::Delete {
                key: key("a"),
                revision: 9,
                binding_uid: "uid-a".into(),
                confirm_gone: false,
            }),
            Ok(Step::Remove {
                key: key("a"),
                confirm: None
            })
        );
        assert_eq!(s.on_event(WorkEvent::Bookmark), Ok(Step::Nothing));
        assert_eq!(s.cursor(), cursor("e1", 9).as_ref());
        // A broken connection mid-snapshot keeps the last commit.
        s.on_event(reset).expect("reset");
        s.on_event(upsert("z", 1)).expect("upsert");
        assert!(s.in_snapshot());
        s.interrupted();
        assert!(!s.in_snapshot());
        assert_eq!(s.cursor(), cursor("e1", 9).as_ref());
    }

    #[test]
    fn a_resumed_stream_ends_with_synced_of_the_same_epoch() {
        let mut s = StreamState::default();
        s.on_event(WorkEvent::Reset {
            epoch: "e1".into(),
            revision: 0,
        })
        .expect("reset");
        s.on_event(WorkEvent::Synced {
            epoch: "e1".into(),
            revision: 2,
        })
        .expect("synced");
        assert_eq!(
            s.on_event(WorkEvent::Synced {
                epoch: "e1".into(),
                revision: 5
            }),
            Ok(Step::Nothing)
        );
        assert_eq!(s.cursor(), cursor("e1", 5).as_ref());
        // Another epoch without a Reset: the cursor cannot be trusted any more.
        let err = s
            .on_event(WorkEvent::Synced {
                epoch: "e2".into(),
                revision: 1,
            })
            .unwrap_err();
        assert!(err.0.contains("e2"), "{err}");
        assert_eq!(s.cursor(), None);
        // A snapshot closed by another epoch's Synced is refused too.
        s.on_event(WorkEvent::Reset {
            epoch: "e3".into(),
            revision: 0,
        })
        .expect("reset");
        assert!(
            s.on_event(WorkEvent::Synced {
                epoch: "e4".into(),
                revision: 0
            })
            .is_err()
        );
        assert_eq!(s.cursor(), None);
        assert!(
            s.on_event(WorkEvent::Reset {
                epoch: String::new(),
                revision: 0
            })
            .is_err()
        );
    }

    #[test]
    fn a_delete_inside_a_snapshot_drops_the_key() {
        let mut s = StreamState::default();
        s.on_event(WorkEvent::Reset {
            epoch: "e1".into(),
            revision: 0,
        })
        .expect("reset");
        s.on_event(upsert("a", 1)).expect("upsert");
        s.on_event(WorkEvent::Delete {
            key: key("a"),
            revision: 2,
            binding_uid: String::new(),
            confirm_gone: false,
        })
        .expect("delete");
        // A purge the hub waits for (after the full set): the agent confirms the copy gone.
        assert_eq!(
            s.on_event(WorkEvent::Delete {
                key: key("b"),
                revision: 1,
                binding_uid: "uid-b".into(),
                confirm_gone: true,
            }),
            Ok(Step::Remove {
                key: key("b"),
                confirm: Some("uid-b".into())
            })
        );
        let done = s
            .on_event(WorkEvent::Synced {
                epoch: "e1".into(),
                revision: 2,
            })
            .expect("synced");
        assert_eq!(
            done,
            Step::SnapshotComplete {
                keys: BTreeSet::new()
            }
        );
        // A confirmation cannot name no binding.
        let err = s
            .on_event(WorkEvent::Delete {
                key: key("c"),
                revision: 3,
                binding_uid: String::new(),
                confirm_gone: true,
            })
            .unwrap_err();
        assert!(err.0.contains("ml/c"), "{err}");
    }

    #[test]
    fn preparing_labels_the_manifest_and_names_bad_fields() {
        let p = prepare(&work("web", 1)).expect("prepared");
        assert_eq!(
            (
                p.api_version.as_str(),
                p.kind.as_str(),
                p.namespace.as_str(),
                p.name.as_str()
            ),
            ("apps/v1", "Deployment", "ml", "web")
        );
        assert_eq!(
            p.body["metadata"]["labels"],
            json!({"app": "web", "work.lifeboat.dev/binding-namespace": "ml",
                   "work.lifeboat.dev/binding-name": "web"})
        );
        assert_eq!(
            p.body["metadata"]["annotations"]["work.lifeboat.dev/binding-uid"],
            "uid-web"
        );
        assert_eq!(
            p.id(true).to_string(),
            "Deployment.apps ml/web",
            "namespaced id"
        );
        assert_eq!(p.id(false).namespace, None);

        let mut w = work("web", 1);
        w.manifest["metadata"]["namespace"] = json!("other");
        w.manifest["metadata"]["uid"] = json!("stale");
        w.manifest["metadata"]["labels"] = Value::Null;
        w.manifest["status"] = json!({"replicas": 3});
        let p = prepare(&w).expect("prepared");
        assert_eq!(p.namespace, "other");
        assert!(p.body["metadata"].get("uid").is_none());
        assert!(p.body.get("status").is_none());
        assert_eq!(
            p.body["metadata"]["labels"]["work.lifeboat.dev/binding-name"],
            "web"
        );

        for (patch, field) in [
            (json!({"kind": null}), "kind"),
            (json!({"apiVersion": 3}), "apiVersion"),
            (json!({"metadata": {"name": ""}}), "metadata.name"),
            (json!({"metadata": "x"}), "metadata"),
            (json!({"metadata": {"labels": "x"}}), "metadata.labels"),
        ] {
            let mut w = work("web", 1);
            for (k, v) in patch.as_object().expect("object") {
                if k == "metadata" && v.is_object() {
                    for (mk, mv) in v.as_object().expect("object") {
                        w.manifest["metadata"][mk] = mv.clone();
                    }
                } else if v.is_null() {
                    w.manifest.as_object_mut().expect("object").remove(k);
                } else {
                    w.manifest[k] = v.clone();
                }
            }
            let err = prepare(&w).unwrap_err();
            assert_eq!(err.field, field, "{err}");
            assert!(err.to_string().starts_with("manifest of ml/web: "), "{err}");
        }
        let mut w = work("web", 1);
        w.manifest = json!([1]);
        assert_eq!(prepare(&w).unwrap_err().field, "manifest");
    }

    fn id(kind: &str, name: &str) -> ObjectId {
        ObjectId {
            group: "apps".into(),
            kind: kind.into(),
            namespace: Some("ml".into()),
            name: name.into(),
        }
    }

    #[test]
    fn a_snapshot_deletes_unassigned_and_renamed_objects_only() {
        let assigned: BTreeMap<WorkKey, Option<ObjectId>> = [
            (key("kept"), Some(id("Deployment", "kept"))),
            (key("renamed"), Some(id("Deployment", "renamed-v2"))),
            (key("unreadable"), None),
        ]
        .into();
        let found = vec![
            Labelled {
                id: id("Deployment", "kept"),
                key: key("kept"),
            },
            Labelled {
                id: id("Deployment", "renamed"),
                key: key("renamed"),
            },
            Labelled {
                id: id("Deployment", "renamed-v2"),
                key: key("renamed"),
            },
            Labelled {
                id: id("StatefulSet", "whatever"),
                key: key("unreadable"),
            },
            Labelled {
                id: id("Deployment", "gone"),
                key: key("gone"),
            },
        ];
        assert_eq!(
            orphans(&assigned, &found),
            vec![id("Deployment", "gone"), id("Deployment", "renamed")]
        );
        // An empty snapshot removes everything labelled.
        assert_eq!(orphans(&BTreeMap::new(), &found).len(), 5);
        assert_eq!(
            key_of(
                &[
                    (LABEL_BINDING_NAMESPACE.to_string(), "ml".to_string()),
                    (LABEL_BINDING_NAME.to_string(), "x".to_string())
                ]
                .into()
            ),
            Some(key("x"))
        );
        assert_eq!(key_of(&BTreeMap::new()), None);
    }
}
