//! The work stream: `GET …/clusters/{c}/work?since={epoch}:{revision}` answers with NDJSON lines
//! of [`WorkEvent`]. First what the agent misses (`Reset`, every `Upsert`, `Synced` when it has
//! no usable cursor; only the changes and `Synced` when it resumes), then each later change as it
//! happens (followed by `Synced`), with a `Bookmark` line every bookmark interval so a dead
//! connection is noticed on both sides. The stream ends when the hub loses leadership or shuts
//! down; the agent reconnects with its last cursor.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use lifeboat_api::protocol::{Cursor, WorkEvent};
use tokio::sync::watch;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tracing::Instrument;

use super::auth::{CredentialIndex, TokenHash};
use super::metrics::OpenStream;
use super::{ApiError, Shared};
use crate::leadership::LeaderState;
use crate::work::store::{Changes, WorkStore};

/// Content type of the stream.
pub const NDJSON: &str = "application/x-ndjson";

/// Parses the `since` query parameter; absent means "from scratch".
pub fn parse_since(since: Option<&str>) -> Result<Option<Cursor>, ApiError> {
    match since {
        None => Ok(None),
        Some("") => Ok(None),
        Some(text) => Cursor::parse(text).map(Some).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "since: {text:?} is not a cursor of the form <epoch>:<revision> (an epoch of 1 to \
                 64 characters, an integer revision)"
            ))
        }),
    }
}

/// The lines that bring an agent from its cursor to `changes.revision`; `None` when there is
/// nothing to say (a live wake-up without a change).
pub fn catch_up_lines(epoch: &str, changes: Changes, always: bool) -> Option<Vec<WorkEvent>> {
    if !changes.reset && changes.events.is_empty() && !always {
        return None;
    }
    let mut lines = Vec::with_capacity(changes.events.len() + 2);
    if changes.reset {
        lines.push(WorkEvent::Reset {
            epoch: epoch.to_string(),
            revision: changes.revision,
        });
    }
    lines.extend(changes.events);
    lines.push(WorkEvent::Synced {
        epoch: epoch.to_string(),
        revision: changes.revision,
    });
    Some(lines)
}

/// NDJSON framing: one JSON document per line.
pub fn frame(events: &[WorkEvent]) -> Bytes {
    let mut out = Vec::with_capacity(events.len() * 256);
    for event in events {
        match serde_json::to_writer(&mut out, event) {
            Ok(()) => out.push(b'\n'),
            // Cannot happen for these types (string keys only); never send half a line.
            Err(error) => tracing::error!(%error, "work event not serialisable; skipped"),
        }
    }
    Bytes::from(out)
}

struct WorkStream {
    cluster: String,
    work: Arc<WorkStore>,
    /// The stream ends when the credential it was opened with is revoked or rotated.
    credentials: Arc<CredentialIndex>,
    token: TokenHash,
    credential_changes: watch::Receiver<u64>,
    cursor: Option<Cursor>,
    revisions: watch::Receiver<i64>,
    leadership: watch::Receiver<LeaderState>,
    shutdown: watch::Receiver<bool>,
    bookmarks: Interval,
    started: bool,
    _open: OpenStream,
}

/// Where a stream's wake-ups come from.
struct Sources {
    work: Arc<WorkStore>,
    credentials: Arc<CredentialIndex>,
    leadership: watch::Receiver<LeaderState>,
    shutdown: watch::Receiver<bool>,
    bookmark_interval: std::time::Duration,
}

impl WorkStream {
    /// Subscribes to everything that wakes the stream (before its first catch-up, so no change
    /// falls in between).
    fn open(
        cluster: String,
        token: TokenHash,
        cursor: Option<Cursor>,
        sources: Sources,
        open_streams: &prometheus::IntGauge,
    ) -> WorkStream {
        let period = sources.bookmark_interval;
        let mut bookmarks = tokio::time::interval_at(Instant::now() + period, period);
        bookmarks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        WorkStream {
            revisions: sources.work.subscribe(&cluster),
            credential_changes: sources.credentials.subscribe(),
            cluster,
            work: sources.work,
            credentials: sources.credentials,
            token,
            cursor,
            leadership: sources.leadership,
            shutdown: sources.shutdown,
            bookmarks,
            started: false,
            _open: OpenStream::new(open_streams),
        }
    }

    fn catch_up(&mut self, always: bool) -> Option<Bytes> {
        self.revisions.borrow_and_update();
        let changes = self.work.changes_since(&self.cluster, self.cursor.as_ref());
        let epoch = self.work.epoch().to_string();
        let revision = changes.revision;
        let lines = catch_up_lines(&epoch, changes, always)?;
        self.cursor = Some(Cursor { epoch, revision });
        Some(frame(&lines))
    }

    fn credential_is_live(&self) -> bool {
        self.credentials.cluster_of(&self.token).as_deref() == Some(self.cluster.as_str())
    }

    async fn next_chunk(&mut self) -> Option<Bytes> {
        if !self.started {
            // A snapshot of a store the binder has not filled yet would tell the agent to
            // delete its work: wait until the first pass over every template is done.
            if !self.work.is_ready() {
                tokio::select! {
                    _ = self.work.wait_ready() => {}
                    _ = self.shutdown.wait_for(|stop| *stop) => return None,
                    _ = self.leadership.wait_for(|l| !l.is_leader) => return None,
                }
            }
            self.started = true;
            // Revoked between authentication and the subscription above: nothing to send.
            if !self.credential_is_live() {
                return None;
            }
            return self.catch_up(true);
        }
        loop {
            if *self.shutdown.borrow() || !self.leadership.borrow().is_leader {
                return None;
            }
            tokio::select! {
                changed = self.shutdown.changed() => if changed.is_err() { return None },
                changed = self.leadership.changed() => if changed.is_err() { return None },
                changed = self.credential_changes.changed() => {
                    if changed.is_err() || !self.credential_is_live() {
                        tracing::info!(cluster = %self.cluster, "credential revoked: closing the work stream");
                        return None;
                    }
                }
                changed = self.revisions.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                    if let Some(chunk) = self.catch_up(false) {
                        self.bookmarks.reset();
                        return Some(chunk);
                    }
                }
                _ = self.bookmarks.tick() => return Some(frame(&[WorkEvent::Bookmark])),
            }
        }
    }
}

pub(super) async fn work(
    State(shared): State<Arc<Shared>>,
    Path(cluster): Path<String>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let caller = shared.authenticate_active(&headers, &cluster).await?;
    let Query(query) =
        query.map_err(|e| ApiError::BadRequest(format!("query: {}", e.body_text())))?;
    let cursor = parse_since(query.get("since").map(String::as_str))?;
    tracing::info!(
        cluster = %caller.cluster,
        since = %cursor.as_ref().map(|c| c.to_string()).unwrap_or_default(),
        "work stream opened"
    );
    let span = tracing::info_span!("work_stream", cluster = %caller.cluster);
    let stream = WorkStream::open(
        caller.cluster,
        caller.token,
        cursor,
        Sources {
            work: shared.work.clone(),
            credentials: shared.credentials.clone(),
            leadership: shared.leadership.clone(),
            shutdown: shared.shutdown.subscribe(),
            bookmark_interval: shared.config.bookmark_interval,
        },
        &shared.metrics.work_streams,
    );
    let body = futures::stream::unfold(stream, move |mut stream| {
        let span = span.clone();
        async move {
            let chunk = stream.next_chunk().instrument(span).await?;
            Some((Ok::<_, Infallible>(chunk), stream))
        }
    });
    let mut response = Body::from_stream(body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(NDJSON));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lifeboat_api::protocol::{Work, WorkKey};
    use serde_json::json;

    fn work(name: &str) -> Work {
        Work {
            key: WorkKey {
                namespace: "ml".into(),
                name: name.into(),
            },
            binding_uid: format!("uid-{name}"),
            manifest: json!({"kind": "Job"}),
            ..Default::default()
        }
    }

    fn parse(bytes: &Bytes) -> Vec<WorkEvent> {
        let text = std::str::from_utf8(bytes).unwrap();
        assert!(text.ends_with('\n'));
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn since_is_a_cursor_or_absent() {
        assert_eq!(parse_since(None).unwrap(), None);
        assert_eq!(
            parse_since(Some("e1:7")).unwrap(),
            Some(Cursor {
                epoch: "e1".into(),
                revision: 7
            })
        );
        for bad in ["7", "e1:", ":7", "e1:x", &format!("{}:1", "e".repeat(65))] {
            match parse_since(Some(bad)) {
                Err(ApiError::BadRequest(m)) => assert!(m.starts_with("since:"), "{m}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_new_agent_gets_reset_the_full_set_and_synced_one_per_line() {
        let store = WorkStore::new("e1");
        store.upsert("m1", work("a"));
        store.upsert("m1", work("b"));
        let lines = catch_up_lines("e1", store.changes_since("m1", None), true).unwrap();
        let events = parse(&frame(&lines));
        assert_eq!(events.len(), 4);
        assert_eq!(
            events[0],
            WorkEvent::Reset {
                epoch: "e1".into(),
                revision: 2
            }
        );
        assert!(matches!(&events[1], WorkEvent::Upsert { work } if work.key.name == "a"));
        assert_eq!(
            events[3],
            WorkEvent::Synced {
                epoch: "e1".into(),
                revision: 2
            }
        );
    }

    #[test]
    fn a_caught_up_agent_is_told_so_once_and_then_only_of_changes() {
        let store = WorkStore::new("e1");
        store.upsert("m1", work("a"));
        let cursor = Cursor {
            epoch: "e1".into(),
            revision: 1,
        };
        // at connect time: just Synced
        let lines = catch_up_lines("e1", store.changes_since("m1", Some(&cursor)), true).unwrap();
        assert_eq!(
            lines,
            vec![WorkEvent::Synced {
                epoch: "e1".into(),
                revision: 1
            }]
        );
        // a live wake-up without change: nothing
        assert!(catch_up_lines("e1", store.changes_since("m1", Some(&cursor)), false).is_none());
    }

    #[tokio::test]
    async fn the_stream_follows_changes_with_bookmarks_and_ends_with_leadership() {
        let store = Arc::new(WorkStore::new("e1"));
        store.upsert("m1", work("a"));
        store.mark_ready();
        let (leader_tx, leadership) = watch::channel(LeaderState::leader());
        let (_shutdown_tx, shutdown) = watch::channel(false);
        let gauge = prometheus::IntGauge::new("g", "g").unwrap();
        let period = std::time::Duration::from_millis(50);
        let credentials = Arc::new(CredentialIndex::default());
        credentials.apply(kube::runtime::watcher::Event::Apply(credential("m1", "t")));
        let mut stream = WorkStream::open(
            "m1".into(),
            TokenHash::of("t"),
            Some(Cursor {
                epoch: "old-epoch".into(),
                revision: 9,
            }),
            Sources {
                work: store.clone(),
                credentials,
                leadership,
                shutdown,
                bookmark_interval: period,
            },
            &gauge,
        );
        assert_eq!(gauge.get(), 1);
        // another epoch: Reset
        let first = parse(&stream.next_chunk().await.unwrap());
        assert!(matches!(first[0], WorkEvent::Reset { .. }));
        store.upsert("m1", work("b"));
        let live = parse(&stream.next_chunk().await.unwrap());
        assert!(matches!(&live[0], WorkEvent::Upsert { work } if work.key.name == "b"));
        assert_eq!(
            live[1],
            WorkEvent::Synced {
                epoch: "e1".into(),
                revision: 2
            }
        );
        // nothing happens: a bookmark
        assert_eq!(
            parse(&stream.next_chunk().await.unwrap()),
            vec![WorkEvent::Bookmark]
        );
        leader_tx.send_replace(LeaderState::standby(None));
        assert!(stream.next_chunk().await.is_none());
        drop(stream);
        assert_eq!(gauge.get(), 0);
    }

    fn credential(cluster: &str, token: &str) -> k8s_openapi::api::core::v1::Secret {
        use super::super::auth::credential_secret_name;
        use lifeboat_api::cluster::CLUSTER_NAME_LABEL;
        use lifeboat_api::credentials::CREDENTIAL_HASH_KEY;
        k8s_openapi::api::core::v1::Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(credential_secret_name(cluster)),
                labels: Some([(CLUSTER_NAME_LABEL.to_string(), cluster.to_string())].into()),
                ..Default::default()
            },
            data: Some(
                [(
                    CREDENTIAL_HASH_KEY.to_string(),
                    k8s_openapi::ByteString(TokenHash::of(token).to_hex().into_bytes()),
                )]
                .into(),
            ),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn no_snapshot_is_sent_before_the_binders_first_pass() {
        // An empty store at hub start is not "no work": a Reset from it would make the agent
        // delete everything it runs.
        let store = Arc::new(WorkStore::new("e1"));
        let (_leader_tx, leadership) = watch::channel(LeaderState::leader());
        let (_shutdown_tx, shutdown) = watch::channel(false);
        let gauge = prometheus::IntGauge::new("g", "g").unwrap();
        let credentials = Arc::new(CredentialIndex::default());
        credentials.apply(kube::runtime::watcher::Event::Apply(credential("m1", "t")));
        let mut stream = WorkStream::open(
            "m1".into(),
            TokenHash::of("t"),
            None,
            Sources {
                work: store.clone(),
                credentials,
                leadership,
                shutdown,
                bookmark_interval: std::time::Duration::from_secs(60),
            },
            &gauge,
        );
        let early =
            tokio::time::timeout(std::time::Duration::from_millis(100), stream.next_chunk()).await;
        assert!(
            early.is_err(),
            "nothing before the store is ready: {early:?}"
        );
        store.upsert("m1", work("a"));
        store.mark_ready();
        let first = parse(&stream.next_chunk().await.unwrap());
        assert!(matches!(first[0], WorkEvent::Reset { .. }));
        assert!(matches!(&first[1], WorkEvent::Upsert { work } if work.key.name == "a"));
    }

    #[tokio::test]
    async fn the_stream_ends_when_its_credential_is_rotated() {
        let store = Arc::new(WorkStore::new("e1"));
        store.mark_ready();
        let (_leader_tx, leadership) = watch::channel(LeaderState::leader());
        let (_shutdown_tx, shutdown) = watch::channel(false);
        let gauge = prometheus::IntGauge::new("g", "g").unwrap();
        let credentials = Arc::new(CredentialIndex::default());
        credentials.apply(kube::runtime::watcher::Event::Apply(credential(
            "m1", "old",
        )));
        let mut stream = WorkStream::open(
            "m1".into(),
            TokenHash::of("old"),
            None,
            Sources {
                work: store.clone(),
                credentials: credentials.clone(),
                leadership,
                shutdown,
                bookmark_interval: std::time::Duration::from_secs(60),
            },
            &gauge,
        );
        assert!(stream.next_chunk().await.is_some());
        // another cluster's credential changing does not matter
        credentials.apply(kube::runtime::watcher::Event::Apply(credential("m2", "x")));
        store.upsert("m1", work("a"));
        assert!(stream.next_chunk().await.is_some());
        // re-registration rotates m1's token: the stream opened with the old one ends
        credentials.apply(kube::runtime::watcher::Event::Apply(credential(
            "m1", "new",
        )));
        assert!(stream.next_chunk().await.is_none());
    }
}
