//! What one step reads (the AppWrapper, the cluster, the clock) and what it decides.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use lifeboat_api::appwrapper::{AppWrapperPhase as Phase, AppWrapperSpec, AppWrapperStatus};

use crate::params::{AnnotationProblem, Params};
use crate::pods::PodSummary;

/// What the cluster holds for one component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComponentObservation {
    /// Not there: never created, or deleted (confirmed by a read from the API server).
    Absent,
    /// Exists and is not being deleted.
    Present,
    /// Exists, and its status says it failed (batch/v1 Job, PyTorchJob), with the reason.
    Failed(String),
    /// Exists with a deletion timestamp.
    Deleting,
}

/// Outcome of one create call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateResult {
    /// Created, or already existed under this AppWrapper's control; the actual name.
    Created { name: String },
    /// Retrying cannot help (invalid object, kind not installed, owned by someone else, ...).
    Fatal(String),
    /// May succeed later (API server errors, quota).
    Retryable(String),
}

/// What the reconciler observed.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    /// Parallel to `status.componentStatus`.
    pub components: Vec<ComponentObservation>,
    pub pods: PodSummary,
    /// Results of the creates made in this reconcile, by component index.
    pub create_results: Option<Vec<Option<CreateResult>>>,
}

/// Everything one step needs.
pub struct Input<'a> {
    pub spec: &'a AppWrapperSpec,
    pub status: &'a AppWrapperStatus,
    pub uid: &'a str,
    pub generation: Option<i64>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    pub has_finalizer: bool,
    pub params: &'a Params,
    pub annotation_problems: &'a [AnnotationProblem],
    pub observation: &'a Observation,
    pub now: Timestamp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FinalizerChange {
    #[default]
    None,
    Add,
    Remove,
}

/// IO the reconciler performs after writing the status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Actions {
    /// Create these components (their identity is already in the status being written).
    pub create: Vec<usize>,
    /// Delete these components with background propagation.
    pub delete: Vec<usize>,
    /// Delete every labelled pod with grace period 0.
    pub force_delete_pods: bool,
    /// Delete these components with grace period 0.
    pub force_delete: Vec<usize>,
}

impl Actions {
    pub fn is_empty(&self) -> bool {
        self.create.is_empty()
            && self.delete.is_empty()
            && !self.force_delete_pods
            && self.force_delete.is_empty()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// A Kubernetes Event to record on the AppWrapper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventNote {
    pub type_: EventType,
    pub reason: String,
    pub note: String,
}

/// The result of one step.
#[derive(Debug, Clone)]
pub struct Decision {
    pub status: AppWrapperStatus,
    pub finalizer: FinalizerChange,
    pub actions: Actions,
    pub events: Vec<EventNote>,
    /// Look again after this long (None: only when something changes).
    pub requeue_after: Option<Duration>,
    /// (from, to) when the phase changed.
    pub phase_change: Option<(Phase, Phase)>,
}
