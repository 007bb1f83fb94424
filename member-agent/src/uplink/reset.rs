//! In-place resets, the pure part: when the hub asks for one (a work whose
//! `reset.generation` is above the generation completed for its object), the agent deletes the
//! object, waits until it is really gone, waits `pauseSeconds` more and applies the manifest
//! again: a new object, with a new UID. The generation it was re-created for is kept on the
//! object itself ([`ANNOTATION_RESET_GENERATION`]) and carried by every later apply, so a
//! restarted agent reads what is done from the object and never repeats a done reset nor makes
//! a second copy; the status report takes it from the reported object.
//!
//! [`step`] decides from the request, what the agent remembers ([`ResetState`]), the live
//! object ([`Live`]) and the clock; the applier does the IO.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lifeboat_api::binding::ANNOTATION_RESET_GENERATION;
use lifeboat_api::protocol::ResetRequest;
use serde_json::{Map, Value};

/// How often the object of a reset is looked at while it is being deleted.
pub const GONE_POLL: Duration = Duration::from_millis(500);

/// The reset annotation of an object is not a generation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {ANNOTATION_RESET_GENERATION}={value:?}: {reason}")]
pub struct BadAnnotation {
    pub value: String,
    pub reason: &'static str,
}

/// The reset generation an object was re-created for (`None`: never reset).
pub fn completed_generation(
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<i64>, BadAnnotation> {
    let Some(value) = annotations.and_then(|a| a.get(ANNOTATION_RESET_GENERATION)) else {
        return Ok(None);
    };
    let bad = |reason| BadAnnotation {
        value: value.clone(),
        reason,
    };
    match value.trim().parse::<i64>() {
        Ok(g) if g > 0 => Ok(Some(g)),
        Ok(_) => Err(bad("must be a positive integer")),
        Err(_) => Err(bad("is not an integer")),
    }
}

/// The generation to report for an observed (trimmed) object: its annotation, if valid.
pub fn reported_generation(observed: &Value) -> Option<i64> {
    let value = observed
        .get("metadata")?
        .get("annotations")?
        .get(ANNOTATION_RESET_GENERATION)?
        .as_str()?;
    value.trim().parse::<i64>().ok().filter(|g| *g > 0)
}

/// Sets the reset annotation on a manifest about to be applied (its `metadata` is an object:
/// `prepare` made sure).
pub fn annotate(body: &mut Value, generation: i64) {
    let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let annotations = meta
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if !annotations.is_object() {
        *annotations = Value::Object(Map::new());
    }
    if let Some(map) = annotations.as_object_mut() {
        map.insert(
            ANNOTATION_RESET_GENERATION.into(),
            Value::String(generation.to_string()),
        );
    }
}

/// The work's object as a reset finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Live {
    Absent,
    Present {
        /// Being deleted (a deletion timestamp).
        deleting: bool,
        /// Its reset annotation.
        completed: Option<i64>,
    },
}

/// What the agent remembers of one work's resets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResetState {
    /// The generation completed for the work's object, as far as this process knows (`None`:
    /// not known yet, or never reset).
    pub completed: Option<i64>,
    /// The reset in progress found its object gone at this instant (the pause counts from
    /// here), for this generation.
    gone: Option<(i64, Instant)>,
}

impl ResetState {
    /// The annotation every apply carries (so that a server-side apply keeps it).
    pub fn annotation(&self) -> Option<i64> {
        self.completed.filter(|g| *g > 0)
    }

    /// The object was re-created for `generation`.
    pub fn done(&mut self, generation: i64) {
        self.completed = Some(self.completed.unwrap_or(0).max(generation));
        self.gone = None;
    }
}

/// Whether `request` may ask for a reset this process does not know to be done: then the live
/// object is read and [`step`] decides.
pub fn needs_live(request: Option<&ResetRequest>, state: &ResetState) -> bool {
    request.is_some_and(|r| r.generation > state.completed.unwrap_or(0))
}

/// The next thing to do for a work with a reset request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing to reset: apply, with the completed generation's annotation if any.
    Apply { annotate: Option<i64> },
    /// Delete the object (the reset's first step).
    Delete,
    /// The object is being deleted: look again after [`GONE_POLL`].
    WaitGone,
    /// The object is gone: the pause goes on for this long.
    Pause(Duration),
    /// Apply again, annotated with this generation: the reset is then done.
    Recreate { generation: i64 },
}

/// Decides the next step of `request` from what is remembered, the live object and the clock;
/// updates `state` with what `live` shows.
pub fn step(request: &ResetRequest, state: &mut ResetState, live: &Live, now: Instant) -> Step {
    if let Live::Present {
        completed: Some(g), ..
    } = live
    {
        state.completed = Some(state.completed.unwrap_or(0).max(*g));
    }
    if request.generation <= state.completed.unwrap_or(0) {
        state.gone = None;
        return Step::Apply {
            annotate: state.annotation(),
        };
    }
    match live {
        Live::Present {
            deleting: false, ..
        } => {
            state.gone = None;
            Step::Delete
        }
        Live::Present { deleting: true, .. } => Step::WaitGone,
        Live::Absent => {
            let since = match state.gone {
                Some((generation, at)) if generation == request.generation => at,
                _ => {
                    state.gone = Some((request.generation, now));
                    now
                }
            };
            let pause = Duration::from_secs(u64::try_from(request.pause_seconds).unwrap_or(0));
            let paused = now.saturating_duration_since(since);
            if paused >= pause {
                Step::Recreate {
                    generation: request.generation,
                }
            } else {
                Step::Pause(pause - paused)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(generation: i64, pause_seconds: i32) -> ResetRequest {
        ResetRequest {
            generation,
            pause_seconds,
        }
    }

    fn present(completed: Option<i64>) -> Live {
        Live::Present {
            deleting: false,
            completed,
        }
    }

    #[test]
    fn a_reset_deletes_waits_until_gone_pauses_then_recreates() {
        let t0 = Instant::now();
        let mut state = ResetState::default();
        let asked = request(1, 2);
        assert!(needs_live(Some(&asked), &state));
        assert_eq!(step(&asked, &mut state, &present(None), t0), Step::Delete);
        let deleting = Live::Present {
            deleting: true,
            completed: None,
        };
        assert_eq!(step(&asked, &mut state, &deleting, t0), Step::WaitGone);
        // Gone at t0+1: the pause counts from then, whatever wakes the work meanwhile.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(
            step(&asked, &mut state, &Live::Absent, t1),
            Step::Pause(Duration::from_secs(2))
        );
        assert_eq!(
            step(
                &asked,
                &mut state,
                &Live::Absent,
                t1 + Duration::from_millis(1500)
            ),
            Step::Pause(Duration::from_millis(500))
        );
        assert_eq!(
            step(
                &asked,
                &mut state,
                &Live::Absent,
                t1 + Duration::from_secs(2)
            ),
            Step::Recreate { generation: 1 }
        );
        state.done(1);
        assert!(!needs_live(Some(&asked), &state));
        assert_eq!(state.annotation(), Some(1));
    }

    #[test]
    fn a_done_reset_is_read_from_the_object_and_never_repeated() {
        // A restarted agent knows nothing; the object says generation 2 is done.
        let mut state = ResetState::default();
        let t = Instant::now();
        assert_eq!(
            step(&request(2, 0), &mut state, &present(Some(2)), t),
            Step::Apply { annotate: Some(2) }
        );
        assert!(!needs_live(Some(&request(2, 0)), &state));
        // A later generation resets again.
        assert!(needs_live(Some(&request(3, 0)), &state));
        assert_eq!(
            step(&request(3, 0), &mut state, &present(Some(2)), t),
            Step::Delete
        );
        // Without a request, nothing is read and nothing reset.
        assert!(!needs_live(None, &ResetState::default()));
        assert_eq!(ResetState::default().annotation(), None);
    }

    #[test]
    fn an_agent_restarted_after_the_delete_recreates_once_after_the_pause() {
        let t = Instant::now();
        let mut state = ResetState::default();
        assert_eq!(
            step(&request(1, 0), &mut state, &Live::Absent, t),
            Step::Recreate { generation: 1 }
        );
        let mut state = ResetState::default();
        assert_eq!(
            step(&request(1, 5), &mut state, &Live::Absent, t),
            Step::Pause(Duration::from_secs(5))
        );
        // The object came back before the pause was over (someone else made it): it goes
        // again, and the pause starts over once it is gone.
        assert_eq!(
            step(
                &request(1, 5),
                &mut state,
                &present(None),
                t + Duration::from_secs(1)
            ),
            Step::Delete
        );
        assert_eq!(
            step(
                &request(1, 5),
                &mut state,
                &Live::Absent,
                t + Duration::from_secs(4)
            ),
            Step::Pause(Duration::from_secs(5))
        );
        // A negative pause is none.
        assert_eq!(
            step(
                &request(2, -3),
                &mut ResetState::default(),
                &Live::Absent,
                t
            ),
            Step::Recreate { generation: 2 }
        );
    }

    #[test]
    fn the_annotation_is_read_written_and_reported() {
        let annotations =
            |v: &str| BTreeMap::from([(ANNOTATION_RESET_GENERATION.into(), v.into())]);
        assert_eq!(completed_generation(None), Ok(None));
        assert_eq!(completed_generation(Some(&BTreeMap::new())), Ok(None));
        assert_eq!(completed_generation(Some(&annotations("3"))), Ok(Some(3)));
        let err = completed_generation(Some(&annotations("three"))).unwrap_err();
        assert!(
            err.to_string().contains(ANNOTATION_RESET_GENERATION),
            "{err}"
        );
        assert!(err.to_string().contains("three"), "{err}");
        assert!(completed_generation(Some(&annotations("0"))).is_err());

        let mut body = json!({"metadata": {"name": "x", "annotations": {"keep": "me"}}});
        annotate(&mut body, 4);
        assert_eq!(
            body["metadata"]["annotations"],
            json!({"keep": "me", ANNOTATION_RESET_GENERATION: "4"})
        );
        let mut bare = json!({"metadata": {"name": "x", "annotations": null}});
        annotate(&mut bare, 1);
        assert_eq!(reported_generation(&bare), Some(1));
        assert_eq!(reported_generation(&body), Some(4));
        assert_eq!(reported_generation(&json!({"metadata": {}})), None);
        let mut bad = body.clone();
        bad["metadata"]["annotations"][ANNOTATION_RESET_GENERATION] = json!("x");
        assert_eq!(reported_generation(&bad), None);
    }
}
