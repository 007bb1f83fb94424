//! The pure decision of a pass ([`plan`]): the failover phase over the current binding
//! ([`crate::failover::phase::step`]), then scheduling when it is due; what the written binding
//! still waits for ([`after_write`]).

use super::*;

/// `PropagationPolicy/ns/name` or `ClusterPropagationPolicy/name` (also a label value once
/// made label-safe: `ns.name` / `name`).
pub(super) fn policy_label(reference: &PolicyReference) -> String {
    let full = if reference.namespace.is_empty() {
        reference.name.clone()
    } else {
        format!("{}.{}", reference.namespace, reference.name)
    };
    // Label values are at most 63 characters.
    full.chars()
        .take(63)
        .collect::<String>()
        .trim_end_matches(['.', '-', '_'])
        .to_string()
}

/// Whether the binding must be (re)scheduled.
pub fn needs_scheduling(
    existing: Option<&ResourceBinding>,
    desired: &ResourceBindingSpec,
    clusters: &[Arc<Cluster>],
) -> bool {
    let Some(current) = existing else {
        return true;
    };
    if current.spec.clusters.is_empty() {
        return true;
    }
    let spec = &current.spec;
    if spec.placement != desired.placement
        || spec.replicas != desired.replicas
        || spec.replica_requirements != desired.replica_requirements
        || spec.components != desired.components
        || spec.gang != desired.gang
    {
        return true;
    }
    let exists = |name: &str| {
        clusters
            .iter()
            .any(|c| c.name_any() == name && c.metadata.deletion_timestamp.is_none())
    };
    if spec.clusters.iter().any(|c| !exists(&c.name)) {
        return true;
    }
    let status = current.status.clone().unwrap_or_default();
    if let Some(asked) = &spec.reschedule_triggered_at
        && status
            .last_scheduled_time
            .as_ref()
            .is_none_or(|last| last.0 < asked.0)
    {
        return true;
    }
    // Not scheduled (nothing fitted last time): try again.
    current
        .condition(CONDITION_SCHEDULED)
        .is_none_or(|c| c.status != "True")
}

/// What [`plan`] reads besides the binding.
pub struct PlanInputs<'a> {
    pub clusters: &'a [Arc<Cluster>],
    pub placer: &'a dyn Placer,
    pub cluster_evictions: &'a Mutex<EvictionRateLimiter>,
    /// The clock of the decision (timers, eviction times).
    pub now: &'a Time,
    /// The clock of the rate limit.
    pub instant: Instant,
    pub scheduling_seconds: Option<&'a prometheus::Histogram>,
}

/// The binding's spec as it should be, and what to say and when to look again.
#[derive(Debug)]
pub struct Planned {
    pub spec: ResourceBindingSpec,
    /// `None`: scheduling did not run (the `Scheduled` condition stays as it is).
    pub scheduling: Option<Result<(), Unschedulable>>,
    pub blocked: Vec<failover::Blocked>,
    /// In-place resets written into `spec`.
    pub resets: Vec<AppliedReset>,
    pub retry: Option<Duration>,
    /// The evictions written into `spec` (not those kept back because no other cluster fits).
    pub evicted: Vec<failover::Eviction>,
    /// The eviction tasks settled into `spec`.
    pub settled: Vec<failover::TaskChange>,
}

/// Decides one binding's spec: the failover phase over the current binding (evictions and
/// settled eviction tasks, written into the candidate's spec), then scheduling when it is due.
/// An eviction for which no other cluster fits is not made: the copy stays and `blocked` says
/// why (karmada#7455 purges the only copy). Pure apart from the rate limiter's state.
pub fn plan(
    existing: Option<&ResourceBinding>,
    mut candidate: ResourceBinding,
    inputs: &PlanInputs<'_>,
) -> Planned {
    let step = match existing {
        Some(current) => {
            let fits = |name: &str| fits_alone(current, name, inputs);
            phase::step(
                current,
                &mut candidate.spec,
                &failover_inputs(inputs, &fits),
            )
        }
        None => phase::Step::default(),
    };
    let mut blocked = step.blocked;
    let mut retry = step.look_again;
    let mut evicted = Vec::new();
    let mut scheduling: Option<Result<(), Unschedulable>> = None;
    let schedule =
        !step.evicted.is_empty() || needs_scheduling(existing, &candidate.spec, inputs.clusters);
    if schedule {
        let started = Instant::now();
        let placed = inputs.placer.place(&candidate, inputs.clusters, inputs.now);
        if let Some(h) = inputs.scheduling_seconds {
            h.observe(started.elapsed().as_secs_f64());
        }
        match placed {
            Ok(targets) => {
                for eviction in &step.evicted {
                    tracing::info!(
                        cluster = %eviction.cluster,
                        reason = eviction.reason,
                        class = ?eviction.class,
                        purge_mode = ?eviction.purge_mode,
                        to = ?targets.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
                        message = %eviction.message,
                        "evicted"
                    );
                }
                candidate.spec.clusters = targets;
                // A cluster left for any reason takes its reset record with it: a later copy
                // there is a new object, never reset.
                let placed = &candidate.spec.clusters;
                candidate
                    .spec
                    .in_place_resets
                    .retain(|r| placed.iter().any(|c| c.name == r.cluster_name));
                scheduling = Some(Ok(()));
                evicted = step.evicted;
            }
            Err(unschedulable) => match step.without_evictions {
                Some(kept) => {
                    // Scheduled keeps describing the placement the binding keeps.
                    for cluster in step.evicted.iter().map(|e| &e.cluster) {
                        blocked.push(failover::Blocked {
                            cluster: cluster.clone(),
                            reason: phase::REASON_NO_OTHER_CLUSTER,
                            message: format!(
                                "the workload should leave {cluster}, but no other cluster fits ({}); its copy there is kept",
                                unschedulable.summary
                            ),
                        });
                    }
                    candidate.spec = kept;
                    retry = Some(
                        retry.map_or(NO_OTHER_CLUSTER_RETRY, |r| r.min(NO_OTHER_CLUSTER_RETRY)),
                    );
                }
                // Keep the current placement when nothing fits: a copy is never removed for
                // lack of a better place (karmada#7455).
                None => {
                    scheduling = Some(Err(unschedulable));
                    retry = Some(retry.map_or(UNSCHEDULABLE_RETRY, |r| r.min(UNSCHEDULABLE_RETRY)));
                }
            },
        }
    }
    Planned {
        spec: candidate.spec,
        scheduling,
        blocked,
        resets: step.resets,
        retry,
        evicted,
        settled: step.settled,
    }
}

/// What the failover decision says of the binding as a pass wrote it
/// ([`phase::after_write`]).
pub(super) fn after_write(
    written: &ResourceBinding,
    inputs: &PlanInputs<'_>,
) -> Option<phase::AfterWrite> {
    let fits = |name: &str| fits_alone(written, name, inputs);
    phase::after_write(written, &failover_inputs(inputs, &fits))
}

/// Whether `binding`'s workload fits in cluster `name` alone (the failover decision moves an
/// AppWrapper for a node notice only when it does not).
pub(super) fn fits_alone(binding: &ResourceBinding, name: &str, inputs: &PlanInputs<'_>) -> bool {
    let one: Vec<Arc<Cluster>> = inputs
        .clusters
        .iter()
        .filter(|c| c.name_any() == name)
        .cloned()
        .collect();
    inputs.placer.place(binding, &one, inputs.now).is_ok()
}

/// The failover phase's view of `inputs`, for decisions over `binding`.
pub(super) fn failover_inputs<'a>(
    inputs: &'a PlanInputs<'a>,
    fits: &'a dyn Fn(&str) -> bool,
) -> phase::Inputs<'a> {
    phase::Inputs {
        clusters: inputs.clusters,
        fits,
        cluster_evictions: inputs.cluster_evictions,
        now: inputs.now,
        instant: inputs.instant,
    }
}

/// Equal in every field the binder decides.
pub(super) fn same_spec(a: &ResourceBindingSpec, b: &ResourceBindingSpec) -> bool {
    a.resource.api_version == b.resource.api_version
        && a.resource.kind == b.resource.kind
        && a.resource.name == b.resource.name
        && a.resource.uid == b.resource.uid
        && a.replicas == b.replicas
        && a.replica_requirements == b.replica_requirements
        && a.components == b.components
        && a.gang == b.gang
        && a.placement == b.placement
        && a.failover == b.failover
        && a.policy == b.policy
        && a.clusters == b.clusters
        && a.graceful_eviction_tasks == b.graceful_eviction_tasks
        && a.eviction_history == b.eviction_history
        && a.in_place_resets == b.in_place_resets
}

/// Converts an interpreter result to the API type of the same JSON shape.
pub(super) fn convert<T: serde::Serialize, U: serde::de::DeserializeOwned>(
    value: &T,
    what: &'static str,
) -> Result<U, BindError> {
    let json =
        serde_json::to_value(value).map_err(|source| BindError::Serialization { what, source })?;
    serde_json::from_value(json).map_err(|source| BindError::Serialization { what, source })
}
