//! Names shared with the upstream AppWrapper operator (reference §1.3). Every string here is part
//! of the wire contract with Kueue, kubectl users and existing YAML: change none of them.

/// API group of the AppWrapper.
pub const GROUP: &str = "workload.codeflare.dev";
/// The served and stored version.
pub const VERSION: &str = "v1beta2";
/// `apiVersion` of a v1beta2 AppWrapper.
pub const API_VERSION: &str = "workload.codeflare.dev/v1beta2";
/// Kind name (same in every legacy group).
pub const KIND: &str = "AppWrapper";

/// Value of `spec.managedBy` that this controller answers to (an unset `managedBy` means the same).
pub const CONTROLLER_NAME: &str = "workload.codeflare.dev/appwrapper-controller";
/// `spec.managedBy` set by Kueue MultiKueue on the manager cluster's copy.
pub const MULTIKUEUE_CONTROLLER_NAME: &str = "kueue.x-k8s.io/multikueue";

/// Label put on every wrapped object and injected into every pod template; its value is the
/// AppWrapper name. Pods are counted by this label.
pub const APPWRAPPER_LABEL: &str = "workload.codeflare.dev/appwrapper";
/// Finalizer the controller adds before it deploys anything.
pub const FINALIZER: &str = "workload.codeflare.dev/finalizer";

/// Label set by the webhook from the admission request's user name (sanitised).
pub const USER_NAME_LABEL: &str = "workload.codeflare.dev/user";
/// Label set by the webhook from the admission request's user UID (sanitised).
pub const USER_ID_LABEL: &str = "workload.codeflare.dev/userid";
/// Kueue's queue label; the webhook sets it to the default queue when the user did not.
pub const QUEUE_NAME_LABEL: &str = "kueue.x-k8s.io/queue-name";

/// Prefix of every per-AppWrapper annotation. Note the dot between `dev` and `appwrapper`: the
/// annotation domain differs from the label domain.
pub const ANNOTATION_PREFIX: &str = "workload.codeflare.dev.appwrapper/";

/// Fault-tolerance annotations read from the AppWrapper's own `metadata.annotations`.
pub mod annotations {
    /// How long non-fatal create errors are retried, and how long until all pods must exist.
    pub const ADMISSION_GRACE_PERIOD: &str =
        "workload.codeflare.dev.appwrapper/admissionGracePeriodDuration";
    /// How long until every pod is Running or Succeeded once all of them exist.
    pub const WARMUP_GRACE_PERIOD: &str =
        "workload.codeflare.dev.appwrapper/warmupGracePeriodDuration";
    /// How long failed pods are tolerated before a reset.
    pub const FAILURE_GRACE_PERIOD: &str =
        "workload.codeflare.dev.appwrapper/failureGracePeriodDuration";
    /// Pause between a reset's deletion and the re-creation (quota stays reserved).
    pub const RETRY_PAUSE_PERIOD: &str =
        "workload.codeflare.dev.appwrapper/retryPausePeriodDuration";
    /// How many resets before the AppWrapper is Failed (an integer).
    pub const RETRY_LIMIT: &str = "workload.codeflare.dev.appwrapper/retryLimit";
    /// How long after a normal delete the remaining pods and resources are deleted with grace 0.
    pub const FORCEFUL_DELETION_GRACE_PERIOD: &str =
        "workload.codeflare.dev.appwrapper/forcefulDeletionGracePeriodDuration";
    /// How long a Failed AppWrapper keeps its resources (for debugging) before deleting them.
    pub const DELETION_ON_FAILURE_GRACE_PERIOD: &str =
        "workload.codeflare.dev.appwrapper/deletionOnFailureGracePeriodDuration";
    /// How long a Succeeded AppWrapper keeps its resources (can only shorten the operator value).
    pub const SUCCESS_TTL: &str = "workload.codeflare.dev.appwrapper/successTTLDuration";
    /// Comma-separated exit codes that make a failure terminal (no retry).
    pub const TERMINAL_EXIT_CODES: &str = "workload.codeflare.dev.appwrapper/terminalExitCodes";
    /// Comma-separated exit codes that may be retried; any other non-zero code is terminal.
    pub const RETRYABLE_EXIT_CODES: &str = "workload.codeflare.dev.appwrapper/retryableExitCodes";

    /// Topology-aware-scheduling hint on an inferred podSet: the pod label holding the pod index.
    pub const TAS_POD_INDEX_LABEL: &str = "workload.codeflare.dev.appwrapper/tas-pod-index-label";
    /// Topology-aware-scheduling hint: the pod label holding the sub-group (replicated job) index.
    pub const TAS_SUB_GROUP_INDEX_LABEL: &str =
        "workload.codeflare.dev.appwrapper/tas-sub-group-index-label";
    /// Topology-aware-scheduling hint: the number of sub-groups.
    pub const TAS_SUB_GROUP_COUNT: &str = "workload.codeflare.dev.appwrapper/tas-sub-group-count";

    /// Every fault-tolerance annotation, in the order of the seed's parameter table.
    pub const FAULT_TOLERANCE: [&str; 10] = [
        ADMISSION_GRACE_PERIOD,
        WARMUP_GRACE_PERIOD,
        FAILURE_GRACE_PERIOD,
        RETRY_PAUSE_PERIOD,
        RETRY_LIMIT,
        DELETION_ON_FAILURE_GRACE_PERIOD,
        FORCEFUL_DELETION_GRACE_PERIOD,
        SUCCESS_TTL,
        TERMINAL_EXIT_CODES,
        RETRYABLE_EXIT_CODES,
    ];
}

/// Pod labels that the inferred TAS hints point at (set by the wrapped kinds' own controllers).
pub mod pod_labels {
    /// batch/v1 Job completion index (`batchv1.JobCompletionIndexAnnotation`).
    pub const JOB_COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
    /// JobSet replicated-job index.
    pub const JOBSET_JOB_INDEX: &str = "jobset.sigs.k8s.io/job-index";
    /// Kubeflow training-operator replica index.
    pub const KUBEFLOW_REPLICA_INDEX: &str = "training.kubeflow.org/replica-index";
}

/// Condition types on the AppWrapper (and, for `ResourcesDeployed`, on each component status).
pub mod condition_types {
    /// True while the AppWrapper holds quota (Resuming, Running, Resetting, Suspending).
    pub const QUOTA_RESERVED: &str = "QuotaReserved";
    /// True while any wrapped resource or labelled pod may exist.
    pub const RESOURCES_DEPLOYED: &str = "ResourcesDeployed";
    /// True when enough pods are Running or Succeeded.
    pub const PODS_READY: &str = "PodsReady";
    /// True when the workload was found unhealthy; its transition time anchors the grace periods.
    pub const UNHEALTHY: &str = "Unhealthy";
    /// True while a deletion is in progress; its transition time anchors forceful deletion.
    pub const DELETING_RESOURCES: &str = "DeletingResources";
    /// All condition types, in upstream order.
    pub const ALL: [&str; 5] = [
        QUOTA_RESERVED,
        RESOURCES_DEPLOYED,
        PODS_READY,
        UNHEALTHY,
        DELETING_RESOURCES,
    ];
}

/// Condition reasons used by upstream (reference §1.2). Phase names double as reasons.
pub mod reasons {
    /// Phase-named reasons.
    pub const SUSPENDED: &str = "Suspended";
    /// Phase-named reason.
    pub const RESUMING: &str = "Resuming";
    /// Phase-named reason.
    pub const RUNNING: &str = "Running";
    /// Phase-named reason.
    pub const RESETTING: &str = "Resetting";
    /// Phase-named reason.
    pub const SUSPENDING: &str = "Suspending";
    /// Phase-named reason.
    pub const SUCCEEDED: &str = "Succeeded";
    /// Phase-named reason.
    pub const FAILED: &str = "Failed";
    /// Phase-named reason.
    pub const TERMINATING: &str = "Terminating";

    /// PodsReady True.
    pub const SUFFICIENT_PODS_READY: &str = "SufficientPodsReady";
    /// PodsReady False, and Unhealthy True after the admission/warmup grace.
    pub const INSUFFICIENT_PODS_READY: &str = "InsufficientPodsReady";

    /// Unhealthy True: a non-fatal create error outlived the admission grace, or a fatal one.
    pub const CREATE_FAILED: &str = "CreateFailed";
    /// Unhealthy True: a wrapped resource disappeared (straight to Failed).
    pub const MISSING_COMPONENT: &str = "MissingComponent";
    /// Unhealthy True: a wrapped Job or PyTorchJob reports Failed.
    pub const FAILED_COMPONENT: &str = "FailedComponent";
    /// Unhealthy True: failed pods (set without a message so the transition time is kept).
    pub const FOUND_FAILED_PODS: &str = "FoundFailedPods";
    /// Unhealthy True: a running pod uses a resource that Autopilot flagged NoExecute on its node.
    pub const AUTOPILOT_NO_EXECUTE: &str = "AutopilotNoExecute";
    /// Unhealthy False.
    pub const FOUND_NO_FAILED_PODS: &str = "FoundNoFailedPods";

    /// DeletingResources True.
    pub const DELETION_INITIATED: &str = "DeletionInitiated";
    /// DeletingResources False: every wrapped resource and labelled pod is gone.
    pub const DELETION_COMPLETE: &str = "DeletionComplete";
    /// DeletingResources False: a Failed AppWrapper waits its DeletionOnFailureGracePeriod.
    pub const DELETION_PAUSED: &str = "DeletionPaused";

    /// Component ResourcesDeployed Unknown: identity recorded before the create call.
    pub const COMPONENT_CREATION_INITIATED: &str = "ComponentCreationInitiated";
    /// Component ResourcesDeployed True.
    pub const COMPONENT_CREATED_SUCCESSFULLY: &str = "ComponentCreatedSuccessfully";
    /// Component ResourcesDeployed False: the create call failed.
    pub const COMPONENT_CREATION_ERRORED: &str = "ComponentCreationErrored";
    /// Component ResourcesDeployed False: the object is gone. The misspelling is upstream's and
    /// is kept so that tools matching on it keep working.
    pub const COMPONENT_DELETED: &str = "CompononetDeleted";
}
