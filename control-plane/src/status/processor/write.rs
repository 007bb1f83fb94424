//! Writing the bindings' status: the dirty bindings' items by server-side apply on the status
//! subresource, only when they differ from what is written, retried a few times.

use super::*;

/// A failed status write is tried again after this long, this many times (the items stay in
/// the processor's state; without a retry the binding would show them only after the next
/// change, and the binder would wait for them).
pub(super) const WRITE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);
pub(super) const WRITE_TRIES: u32 = 5;

/// Writes the status of dirty bindings, each at most `write_concurrency` at once; a binding
/// that becomes dirty again while being written is written again after.
pub(super) async fn write_dirty(
    mut rx: mpsc::UnboundedReceiver<WorkKey>,
    again: mpsc::UnboundedSender<WorkKey>,
    state: SharedState,
    deps: ProcessorDeps,
) {
    let ProcessorDeps {
        client,
        bindings,
        metrics,
        written,
        write_concurrency,
        handoff,
        ..
    } = deps;
    let semaphore = Arc::new(tokio::sync::Semaphore::new(write_concurrency.max(1)));
    let pending: Arc<Mutex<HashSet<WorkKey>>> = Arc::new(Mutex::new(HashSet::new()));
    // Failed writes in a row per binding (cleared by a write that works).
    let failures: Arc<Mutex<HashMap<WorkKey, u32>>> = Arc::new(Mutex::new(HashMap::new()));
    while let Some(key) = rx.recv().await {
        if !pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone())
        {
            continue;
        }
        let (client, bindings, state, pending, metrics, written, failures, again) = (
            client.clone(),
            bindings.clone(),
            state.clone(),
            pending.clone(),
            metrics.clone(),
            written.clone(),
            failures.clone(),
            again.clone(),
        );
        let (semaphore, handoff) = (semaphore.clone(), handoff.clone());
        tokio::spawn(async move {
            // After the binder's decision on these items (its spec write must not race this
            // one), and without a writer's permit meanwhile: a held write blocks no other.
            if let Some(handoff) = &handoff {
                handoff
                    .wait(&key, crate::status::handoff::HOLD_AT_MOST)
                    .await;
            }
            let Ok(permit) = semaphore.acquire_owned().await else {
                return;
            };
            // Taken off the pending set before reading the state: a change that lands during
            // the write marks the binding dirty again.
            pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
            let result = write_status(&client, &bindings, &state, &key).await;
            let label = match &result {
                Ok(true) => "written",
                Ok(false) => "unchanged",
                Err(_) => "error",
            };
            metrics.status_writes.with_label_values(&[label]).inc();
            let tries = {
                let mut failures = failures.lock().unwrap_or_else(|e| e.into_inner());
                if result.is_ok() {
                    failures.remove(&key);
                    0
                } else {
                    let tries = failures.entry(key.clone()).or_default();
                    *tries += 1;
                    *tries
                }
            };
            drop(permit);
            match result {
                Ok(true) => {
                    if let Some(tx) = &written {
                        let _ = tx.send(key);
                    }
                }
                Ok(false) => {}
                Err(e) if tries < WRITE_TRIES => {
                    tracing::warn!(binding = %key, error = %e, tries, "writing binding status failed; trying again");
                    tokio::time::sleep(WRITE_RETRY * tries).await;
                    let _ = again.send(key);
                }
                Err(e) => {
                    failures
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&key);
                    tracing::warn!(binding = %key, error = %e, tries, "writing binding status failed; giving up until its next report");
                }
            }
        });
    }
}

/// Applies the binding's items and conditions if they differ from what the binding has.
/// `Ok(false)`: nothing to write (or the binding is gone).
pub async fn write_status(
    client: &kube::Client,
    bindings: &Store<ResourceBinding>,
    state: &SharedState,
    key: &WorkKey,
) -> Result<bool, kube::Error> {
    let Some(binding) = bindings.get(&ObjectRef::new(&key.name).within(&key.namespace)) else {
        return Ok(false);
    };
    let uid = binding.metadata.uid.clone().unwrap_or_default();
    let items = {
        let guard = state.lock().unwrap_or_else(|e| e.into_inner());
        if guard.uid(key) != Some(uid.as_str()) {
            return Ok(false);
        }
        guard.items(key)
    };
    let (patch, changed) =
        status_patch(&binding, items, &Time(k8s_openapi::jiff::Timestamp::now()));
    if !changed {
        return Ok(false);
    }
    let api: Api<ResourceBinding> = Api::namespaced(client.clone(), &key.namespace);
    api.patch_status(
        &key.name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(patch),
    )
    .await?;
    Ok(true)
}

/// Equal once written: the API keeps times to the second, the processor's state to the
/// microsecond, so items are compared in their written (JSON) form.
pub(super) fn same_as_written(a: &[AggregatedStatusItem], b: &[AggregatedStatusItem]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x == y || serde_json::to_value(x).ok() == serde_json::to_value(y).ok())
}

/// The clusters whose items a binding's status carries: those it is placed on or being evicted
/// from (old copies still report under Gracefully and Never).
pub(super) fn written_for(binding: &ResourceBinding) -> HashSet<&str> {
    binding
        .spec
        .clusters
        .iter()
        .map(|c| c.name.as_str())
        .chain(
            binding
                .spec
                .graceful_eviction_tasks
                .iter()
                .map(|t| t.from_cluster.as_str()),
        )
        .collect()
}

/// The status patch for a binding: the items of the clusters it is placed on or being evicted
/// from (old copies still report under Gracefully and Never), and the two conditions; and
/// whether it differs from the binding's current status.
pub fn status_patch(
    binding: &ResourceBinding,
    items: Vec<AggregatedStatusItem>,
    now: &Time,
) -> (serde_json::Value, bool) {
    let wanted = written_for(binding);
    let items: Vec<AggregatedStatusItem> = items
        .into_iter()
        .filter(|i| wanted.contains(i.cluster_name.as_str()))
        .collect();
    let previous = binding
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let conditions = status::conditions(
        &binding.spec.clusters,
        &items,
        previous,
        binding.metadata.generation,
        now,
    );
    let current_items = binding
        .status
        .as_ref()
        .map(|s| s.aggregated_status.as_slice())
        .unwrap_or_default();
    let same_conditions = conditions.iter().all(|c| {
        previous.iter().any(|p| {
            p.type_ == c.type_
                && p.status == c.status
                && p.reason == c.reason
                && p.message == c.message
                && p.observed_generation == c.observed_generation
        })
    });
    let summary = status::summary(&binding.spec.clusters, &items);
    let same_summary = binding.status.as_ref().and_then(|s| s.summary.as_ref()) == Some(&summary);
    let changed = !same_as_written(current_items, &items) || !same_conditions || !same_summary;
    let patch = serde_json::json!({
        "apiVersion": "work.lifeboat.dev/v1alpha1",
        "kind": "ResourceBinding",
        "metadata": {"name": binding.metadata.name, "namespace": binding.metadata.namespace},
        "status": {"aggregatedStatus": items, "conditions": conditions, "summary": summary},
    });
    (patch, changed)
}
