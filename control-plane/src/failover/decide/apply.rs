//! Writing failover decisions into a binding's spec: resets (the cluster's reset record), the
//! state-preservation labels of an evicted copy, evictions (the placement, an eviction task and
//! a history record), settled eviction tasks.

use super::*;

/// Applies resets to the spec: the cluster's record gets the next generation, the time and
/// pause, and counts a failure reset against the limit (a manual one records its request
/// instead). Returns what was applied, with each record as it now is.
pub fn apply_resets(
    spec: &mut ResourceBindingSpec,
    resets: &[Reset],
    now: &Time,
) -> Vec<AppliedReset> {
    let mut applied = Vec::new();
    for reset in resets {
        if !spec.clusters.iter().any(|c| c.name == reset.cluster) {
            continue;
        }
        let position = match spec
            .in_place_resets
            .iter()
            .position(|r| r.cluster_name == reset.cluster)
        {
            Some(p) => p,
            None => {
                spec.in_place_resets.push(InPlaceResetRecord {
                    cluster_name: reset.cluster.clone(),
                    generation: 0,
                    count: 0,
                    last_requested_at: now.clone(),
                    manual_request: None,
                    pause_seconds: None,
                });
                spec.in_place_resets.len() - 1
            }
        };
        let record = &mut spec.in_place_resets[position];
        record.generation += 1;
        record.last_requested_at = now.clone();
        record.pause_seconds = (reset.pause_seconds > 0).then_some(reset.pause_seconds);
        match &reset.manual {
            Some(value) => record.manual_request = Some(value.clone()),
            None => record.count += 1,
        }
        applied.push(AppliedReset {
            reset: reset.clone(),
            record: record.clone(),
        });
    }
    applied
}

/// The state-preservation labels from the evicted copy's reflected status. A rule whose path
/// finds nothing is left out (Karmada fails the eviction instead, which can block a failover
/// forever on a value the job has not written yet); a value that is not a valid label value is
/// left out too.
pub fn preserve(
    rules: &StatePreservation,
    item: Option<&AggregatedStatusItem>,
) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let Some(status) = item.and_then(|i| i.status.as_ref()) else {
        return labels;
    };
    for rule in &rules.rules {
        let Some(value) = json_path_value(status, &rule.json_path) else {
            continue;
        };
        if is_label_value(&value) {
            labels.insert(rule.alias_label_name.clone(), value);
        }
    }
    labels
}

/// kubectl JSONPath (`{.a.b[0]}`, relative to the object) → the value as a string.
fn json_path_value(object: &serde_json::Value, template: &str) -> Option<String> {
    let inner = template.trim().strip_prefix('{')?.strip_suffix('}')?.trim();
    let path = if inner.starts_with('$') {
        inner.to_string()
    } else if inner.starts_with('.') || inner.starts_with('[') {
        format!("${inner}")
    } else {
        format!("$.{inner}")
    };
    let found = object.query(&path).ok()?;
    let value = found.first()?;
    match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Null => None,
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::Bool(b) => Some(b.to_string()),
        other => Some(other.to_string()),
    }
}

fn is_label_value(value: &str) -> bool {
    value.len() <= 63
        && (value.is_empty()
            || (value.starts_with(|c: char| c.is_ascii_alphanumeric())
                && value.ends_with(|c: char| c.is_ascii_alphanumeric())
                && value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))))
}

/// Applies evictions to the spec: the cluster leaves `clusters`, a task and a history record
/// are added. Returns the evicted clusters (those that were placed there).
pub fn apply_evictions(
    spec: &mut ResourceBindingSpec,
    evictions: &[Eviction],
    now: &Time,
) -> Vec<String> {
    let before: Vec<String> = spec.clusters.iter().map(|c| c.name.clone()).collect();
    let mut evicted = Vec::new();
    for eviction in evictions {
        let Some(position) = spec
            .clusters
            .iter()
            .position(|c| c.name == eviction.cluster)
        else {
            continue;
        };
        let target = spec.clusters.remove(position);
        evicted.push(eviction.cluster.clone());
        if !spec
            .graceful_eviction_tasks
            .iter()
            .any(|t| t.from_cluster == eviction.cluster)
        {
            spec.graceful_eviction_tasks.push(GracefulEvictionTask {
                from_cluster: eviction.cluster.clone(),
                purge_mode: Some(eviction.purge_mode),
                replicas: (target.replicas > 0).then_some(target.replicas),
                reason: eviction.reason.to_string(),
                message: Some(eviction.message.clone()),
                producer: EVICTION_PRODUCER.to_string(),
                grace_period_seconds: eviction.grace_period_seconds,
                suppress_deletion: (eviction.purge_mode == PurgeMode::Never).then_some(true),
                preserved_label_state: eviction.preserved.clone(),
                clusters_before_failover: before.clone(),
                creation_timestamp: Some(now.clone()),
                purged_at: None,
                failing_since: eviction.failing_since.clone(),
            });
        }
        spec.eviction_history.push(EvictionRecord {
            cluster_name: eviction.cluster.clone(),
            reason: eviction.reason.to_string(),
            failure_class: Some(eviction.class),
            message: Some(eviction.message.clone()),
            evicted_at: now.clone(),
            expires_at: eviction.block_seconds.map(|s| plus(now, i64::from(s))),
            preserved_label_state: eviction.preserved.clone(),
            clusters_before_failover: before.clone(),
        });
        spec.in_place_resets
            .retain(|r| r.cluster_name != eviction.cluster);
    }
    prune_history(&mut spec.eviction_history, now);
    evicted
}

/// Keeps at most [`MAX_EVICTION_HISTORY`] records: expired ones go first, then the oldest.
pub fn prune_history(history: &mut Vec<EvictionRecord>, now: &Time) {
    if history.len() <= MAX_EVICTION_HISTORY {
        return;
    }
    let expired = |r: &EvictionRecord| r.expires_at.as_ref().is_some_and(|t| t.0 <= now.0);
    let mut excess = history.len() - MAX_EVICTION_HISTORY;
    history.retain(|r| {
        if excess > 0 && expired(r) {
            excess -= 1;
            false
        } else {
            true
        }
    });
    if history.len() > MAX_EVICTION_HISTORY {
        let drop = history.len() - MAX_EVICTION_HISTORY;
        history.drain(..drop);
    }
}

/// Applies task changes to the spec.
pub fn apply_task_changes(spec: &mut ResourceBindingSpec, changes: &[TaskChange], now: &Time) {
    for change in changes {
        match change {
            TaskChange::Purged { cluster, .. } => {
                if let Some(task) = spec
                    .graceful_eviction_tasks
                    .iter_mut()
                    .find(|t| &t.from_cluster == cluster)
                {
                    task.purged_at = Some(now.clone());
                }
            }
            TaskChange::Remove { cluster, .. } => {
                spec.graceful_eviction_tasks
                    .retain(|t| &t.from_cluster != cluster);
            }
        }
    }
}
