//! [`StatusState`]: a batch's reports checked against the assigned work, interpreted (or taken
//! from the cache) and folded into each binding's items, IO-free.

use super::*;

impl StatusState {
    /// Folds a batch in. `binding` finds the binding of a key (the processor seeds a binding it
    /// has not seen yet from the binding's own status, so timers survive a hub restart).
    /// [`run`] does the same in steps, interpreting outside the state's lock.
    pub fn process(
        &mut self,
        batch: &StatusBatch,
        work: &WorkStore,
        binding: impl Fn(&WorkKey) -> Option<Arc<ResourceBinding>>,
        interpreters: &Interpreters,
        now: &Time,
    ) -> Processed {
        let prints = fingerprints(batch, interpreters);
        let misses = self.misses(batch, &prints);
        let fresh = interpret_items(batch, &misses, interpreters, interpret_threads());
        self.fold(
            batch,
            work,
            binding,
            interpreters,
            &prints,
            fresh,
            &HashSet::new(),
            now,
        )
    }

    /// The items of `batch` (index and fingerprint) whose observed object is not the one last
    /// interpreted for that binding and cluster, nor one whose interpretation is on its way
    /// (`prints` from [`fingerprints`]).
    pub fn misses(
        &self,
        batch: &StatusBatch,
        prints: &[Option<Fingerprint>],
    ) -> Vec<(usize, Fingerprint)> {
        batch
            .report
            .items
            .iter()
            .zip(prints)
            .enumerate()
            .filter_map(|(i, (report, print))| {
                let print = (*print)?;
                let tracked = self
                    .bindings
                    .get(&report.key)
                    .filter(|t| t.uid == report.binding_uid);
                let known = tracked.is_some_and(|t| {
                    t.interpreted
                        .get(&batch.cluster)
                        .is_some_and(|c| c.fingerprint == print)
                        || t.pending.get(&batch.cluster) == Some(&print)
                });
                (!known).then_some((i, print))
            })
            .collect()
    }

    /// Folds a batch in, in order, with `fresh` interpretations of (some of) its items by index;
    /// an item with neither a fresh nor a cached interpretation is interpreted here, except the
    /// `deferred` ones (their interpretation is on its way: [`StatusState::fold_late`]).
    #[allow(clippy::too_many_arguments)]
    pub fn fold(
        &mut self,
        batch: &StatusBatch,
        work: &WorkStore,
        binding: impl Fn(&WorkKey) -> Option<Arc<ResourceBinding>>,
        interpreters: &Interpreters,
        prints: &[Option<Fingerprint>],
        mut fresh: HashMap<usize, Fresh>,
        deferred: &HashSet<usize>,
        now: &Time,
    ) -> Processed {
        let mut processed = Processed::default();
        let mut dirty = HashSet::new();
        for (i, report) in batch.report.items.iter().enumerate() {
            let interpretation = Interpretation {
                print: prints.get(i).copied().flatten(),
                fresh: fresh.remove(&i),
                deferred: deferred.contains(&i),
                interpreters,
            };
            match self.take(
                &batch.cluster,
                batch.gone_confirmed_by,
                report,
                work,
                &binding,
                interpretation,
                now,
                &mut processed,
            ) {
                Ok(update) => {
                    processed.response.accepted += 1;
                    if let Some(transition) = update {
                        dirty.insert(report.key.clone());
                        if let Some(t) = transition {
                            processed.transitions.push(t);
                        }
                    }
                }
                Err(reason) => processed.response.rejected.push(RejectedItem {
                    key: report.key.clone(),
                    reason,
                }),
            }
        }
        processed.dirty = dirty.into_iter().collect();
        processed.dirty.sort();
        processed
    }

    /// Folds in an interpretation that came after its report was taken (a deferred item, or a
    /// re-evaluation after the customizations changed), if it is still the one awaited for
    /// that binding and cluster; the cluster's item is made from the last report as if it came
    /// now.
    pub fn fold_late(&mut self, late: Late, now: &Time, out: &mut Processed) {
        let Some(tracked) = self
            .bindings
            .get_mut(&late.key)
            .filter(|t| t.uid == late.binding_uid)
        else {
            out.costs.extend(late.fresh.interpreted.costs);
            return;
        };
        out.costs
            .extend(late.fresh.interpreted.costs.iter().cloned());
        let print = late.fresh.interpreted.fingerprint;
        if tracked.pending.get(&late.cluster) != Some(&print) {
            return; // a newer report, or a newer layering, made another one
        }
        let Some(report) = tracked.observed.remove(&late.cluster) else {
            return;
        };
        tracked.pending.remove(&late.cluster);
        let Fresh {
            interpreted,
            item_status,
        } = late.fresh;
        notice_failures(&mut out.failures, &report, &late.cluster, &interpreted);
        let verdict = interpreted.verdict.clone();
        if let Some(old) = tracked
            .interpreted
            .insert(late.cluster.clone(), interpreted)
        {
            out.displaced.extend(old.reflected);
        }
        let update = status::next_item(
            tracked.items.get(&late.cluster),
            Observation {
                cluster: &late.cluster,
                report: &report,
                verdict,
                reflected: item_status,
            },
            now,
        );
        let changed = tracked.record(&late.cluster, &report, update, now, &mut out.displaced);
        tracked.observed.insert(late.cluster.clone(), report);
        if let Some(transition) = changed {
            if !out.dirty.contains(&late.key) {
                out.dirty.push(late.key.clone());
            }
            out.transitions.extend(transition);
        }
    }

    /// After the customizations changed from generation `previous` to `current`: the cached
    /// interpretations of kinds not in `changed` hold under `current` too (their fingerprints
    /// take its generation); the last objects of the kinds in `changed` are to be interpreted
    /// again, now (returned, and awaited as pending).
    pub fn reinterpretations(
        &mut self,
        previous: u64,
        current: &Interpreters,
        changed: &HashSet<LaneKey>,
    ) -> Vec<Reinterpretation> {
        let mut jobs = Vec::new();
        for (key, tracked) in &mut self.bindings {
            for (cluster, report) in &tracked.observed {
                let Some(observed) = &report.observed else {
                    continue;
                };
                let entry = tracked.interpreted.get_mut(cluster);
                let kind = entry
                    .as_ref()
                    .and_then(|e| e.kind.clone())
                    .unwrap_or_else(|| lane_of(observed));
                if !changed.contains(&kind) {
                    if let Some(entry) = entry
                        && entry.fingerprint.generation == previous
                    {
                        entry.fingerprint.generation = current.generation();
                    }
                    continue;
                }
                let print = Fingerprint::of(observed, current);
                tracked.pending.insert(cluster.clone(), print);
                jobs.push(Reinterpretation {
                    key: key.clone(),
                    binding_uid: tracked.uid.clone(),
                    cluster: cluster.clone(),
                    observed: observed.clone(),
                    print,
                    lane: kind,
                });
            }
        }
        jobs
    }

    /// `Ok(None)`: taken, nothing changed; `Ok(Some(t))`: changed, with a health transition
    /// if any; `Err(why)`: refused. What it replaces goes to `displaced`.
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    pub(super) fn take(
        &mut self,
        cluster: &str,
        gone_confirmed_by: GoneConfirmedBy,
        report: &WorkStatus,
        work: &WorkStore,
        binding: &impl Fn(&WorkKey) -> Option<Arc<ResourceBinding>>,
        interpretation: Interpretation<'_>,
        now: &Time,
        out: &mut Processed,
    ) -> Result<Option<Option<HealthTransition>>, String> {
        let displaced = &mut out.displaced;
        check_assignment(cluster, report, work)?;
        if self
            .bindings
            .get(&report.key)
            .is_none_or(|t| t.uid != report.binding_uid)
        {
            let mut tracked = Tracked {
                uid: report.binding_uid.clone(),
                ..Default::default()
            };
            if let Some(b) = binding(&report.key)
                && b.metadata.uid.as_deref() == Some(report.binding_uid.as_str())
                && let Some(status) = &b.status
            {
                for item in &status.aggregated_status {
                    tracked
                        .items
                        .insert(item.cluster_name.clone(), item.clone());
                }
            }
            self.bindings.insert(report.key.clone(), tracked);
        }
        let Some(tracked) = self.bindings.get_mut(&report.key) else {
            return Err("internal: binding not tracked".into());
        };
        if let Some(last) = tracked.last_report.get(cluster) {
            if report.observed_at.0 < last.0 {
                return Err(format!(
                    "stale: observed at {} but a report observed at {} was already taken",
                    report.observed_at.0, last.0
                ));
            }
            // The same report again (a retried or replayed request): nothing new. A gone
            // report is the copy's last word, taken even in the second of the last report (an
            // agent sees a copy gone a few tenths of a second after its last status, and a
            // `Directly` failover waits for it); taken twice, it changes nothing.
            if report.observed_at.0 == last.0 && !report.gone {
                return Ok(None);
            }
        }
        if report.gone {
            tracked.interpreted.remove(cluster);
            tracked.observed.remove(cluster);
            tracked.pending.remove(cluster);
            let update =
                status::gone_item(tracked.items.get(cluster), cluster, gone_confirmed_by, now);
            return Ok(tracked.record(cluster, report, update, now, displaced));
        }
        let (verdict, reflected) = match &report.observed {
            Some(observed) => {
                let interpreters = interpretation.interpreters;
                let print = interpretation
                    .print
                    .unwrap_or_else(|| Fingerprint::of(observed, interpreters));
                remember(&mut tracked.observed, cluster, report);
                match tracked.interpreted.get(cluster) {
                    Some(cached) if cached.fingerprint == print => {
                        tracked.pending.remove(cluster);
                        (cached.verdict.clone(), cached.reflected.clone())
                    }
                    _ if interpretation.deferred
                        || (interpretation.fresh.is_none()
                            && tracked.pending.get(cluster) == Some(&print)) =>
                    {
                        // Its interpretation is on its way: the item waits for it.
                        tracked.pending.insert(cluster.to_string(), print);
                        tracked
                            .last_report
                            .insert(cluster.to_string(), report.observed_at.clone());
                        return Ok(None);
                    }
                    _ => {
                        tracked.pending.remove(cluster);
                        let fresh = interpretation
                            .fresh
                            .filter(|f| f.interpreted.fingerprint == print)
                            .unwrap_or_else(|| {
                                Fresh::new(Interpreted::run(observed, print, interpreters))
                            });
                        notice_failures(&mut out.failures, report, cluster, &fresh.interpreted);
                        out.costs.extend(fresh.interpreted.costs.iter().cloned());
                        let verdict = fresh.interpreted.verdict.clone();
                        if let Some(old) = tracked
                            .interpreted
                            .insert(cluster.to_string(), fresh.interpreted)
                        {
                            displaced.extend(old.reflected);
                        }
                        (verdict, fresh.item_status)
                    }
                }
            }
            None => {
                tracked.interpreted.remove(cluster);
                tracked.observed.remove(cluster);
                tracked.pending.remove(cluster);
                (HealthVerdict::NoRule, None)
            }
        };
        let update = status::next_item(
            tracked.items.get(cluster),
            Observation {
                cluster,
                report,
                verdict,
                reflected,
            },
            now,
        );
        Ok(tracked.record(cluster, report, update, now, displaced))
    }

    /// The items of a binding, by cluster name.
    pub fn items(&self, key: &WorkKey) -> Vec<AggregatedStatusItem> {
        self.bindings
            .get(key)
            .map(|t| t.items.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether this state holds per-cluster items of `binding` that the binding's status (as
    /// the caller's copy shows it) does not have yet: a write on its way, or a write the
    /// caller's cache has not seen. Only the clusters the status is written for count.
    pub fn ahead_of(&self, binding: &ResourceBinding) -> bool {
        let key = crate::work::dispatch::work_key(binding);
        let Some(tracked) = self
            .bindings
            .get(&key)
            .filter(|t| Some(t.uid.as_str()) == binding.metadata.uid.as_deref())
        else {
            return false;
        };
        let current = binding
            .status
            .as_ref()
            .map(|s| s.aggregated_status.as_slice())
            .unwrap_or_default();
        written_for(binding).into_iter().any(|cluster| {
            tracked.items.get(cluster).is_some_and(|mine| {
                current
                    .iter()
                    .find(|i| i.cluster_name == cluster)
                    .is_none_or(|theirs| {
                        !same_as_written(std::slice::from_ref(theirs), std::slice::from_ref(mine))
                    })
            })
        })
    }

    /// The per-cluster items of `binding` as decisions must see them: the binding's own, with
    /// this state's newer ones in their place (`None`: the binding shows them all already).
    /// The binder decides on these at once ([`crate::status::handoff`]) instead of waiting for the
    /// status write to come back through the binding watch.
    pub fn newest_items(&self, binding: &ResourceBinding) -> Option<Vec<AggregatedStatusItem>> {
        if !self.ahead_of(binding) {
            return None;
        }
        let tracked = self
            .bindings
            .get(&crate::work::dispatch::work_key(binding))?;
        let mut items: Vec<AggregatedStatusItem> = binding
            .status
            .as_ref()
            .map(|s| s.aggregated_status.clone())
            .unwrap_or_default();
        for cluster in written_for(binding) {
            let Some(mine) = tracked.items.get(cluster) else {
                continue;
            };
            match items.iter_mut().find(|i| i.cluster_name == cluster) {
                Some(theirs) => *theirs = mine.clone(),
                None => items.push(mine.clone()),
            }
        }
        Some(items)
    }

    /// Whether an interpretation of `key` in some cluster is on its way.
    pub fn pending(&self, key: &WorkKey) -> bool {
        self.bindings
            .get(key)
            .is_some_and(|t| !t.pending.is_empty())
    }

    /// The UID the state of `key` belongs to.
    pub fn uid(&self, key: &WorkKey) -> Option<&str> {
        self.bindings.get(key).map(|t| t.uid.as_str())
    }

    /// Drops a binding (deleted, or re-created with another UID).
    pub fn forget(&mut self, key: &WorkKey) {
        self.bindings.remove(key);
    }

    /// How many bindings are tracked.
    pub fn len(&self) -> usize {
        self.bindings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bindings.is_empty()
    }
}

/// Whether `report` may be taken from `cluster`: a copy's report needs its work assigned to the
/// cluster under the same binding UID; a gone report needs the hub to await that copy's purge
/// there (the work withdrawn from that cluster, under that binding UID). `Err` says why not.
pub fn check_assignment(
    cluster: &str,
    report: &WorkStatus,
    work: &WorkStore,
) -> Result<(), String> {
    if report.gone {
        let awaited = work.awaited_purge(cluster, &report.key).ok_or_else(|| {
            format!(
                "gone: {} was not withdrawn from cluster {cluster} awaiting its purge",
                report.key
            )
        })?;
        if awaited != report.binding_uid {
            return Err(format!(
                "gone: binding UID {} is not the one withdrawn from cluster {cluster} ({awaited})",
                report.binding_uid
            ));
        }
        return Ok(());
    }
    let assigned = work
        .get(cluster, &report.key)
        .ok_or_else(|| format!("{} is not assigned to cluster {cluster}", report.key))?;
    if assigned.binding_uid != report.binding_uid {
        return Err(format!(
            "binding UID {} is not the one assigned to cluster {cluster} ({})",
            report.binding_uid, assigned.binding_uid
        ));
    }
    Ok(())
}

/// The fingerprints of a batch's observed objects, by index (`None`: no object). One thread:
/// hashing the objects' text costs less than starting another.
pub fn fingerprints(batch: &StatusBatch, interpreters: &Interpreters) -> Vec<Option<Fingerprint>> {
    batch
        .report
        .items
        .iter()
        .map(|r| {
            r.observed
                .as_ref()
                .map(|o| Fingerprint::of(o, interpreters))
        })
        .collect()
}

/// Keeps `report` as the cluster's last report with an object: its object is copied only when
/// it is not the one kept already (most reports repeat it).
pub(super) fn remember(
    observed: &mut HashMap<String, WorkStatus>,
    cluster: &str,
    report: &WorkStatus,
) {
    match observed.get_mut(cluster) {
        Some(kept)
            if kept.observed.as_ref().map(ObservedObject::json)
                == report.observed.as_ref().map(ObservedObject::json) =>
        {
            kept.revision = report.revision;
            kept.applied = report.applied;
            kept.applied_message.clone_from(&report.applied_message);
            kept.observed_at = report.observed_at.clone();
            kept.reset_generation = report.reset_generation;
            kept.fenced = report.fenced;
        }
        _ => {
            observed.insert(cluster.to_string(), report.clone());
        }
    }
}

/// The failures of a fresh interpretation, for the binding's Events.
pub(super) fn notice_failures(
    out: &mut Vec<FailureNotice>,
    report: &WorkStatus,
    cluster: &str,
    interpreted: &Interpreted,
) {
    out.extend(interpreted.failures.iter().map(|failure| FailureNotice {
        key: report.key.clone(),
        binding_uid: report.binding_uid.clone(),
        cluster: cluster.to_string(),
        failure: failure.clone(),
    }));
}
