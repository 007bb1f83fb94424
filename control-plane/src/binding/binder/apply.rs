//! The binder's writes: the binding's spec and conditions by server-side apply, the scheduler's
//! status fields, unbinding, dispatching the work into the [`WorkStore`], pruned purge
//! confirmations, fence requests, the bindings' gauges.

use super::*;

impl Binder {
    /// Applies the spec when it differs from the current binding's; returns the binding as it
    /// now is.
    pub(super) async fn apply_spec(
        &self,
        kind: &TemplateKind,
        template: &DynamicObject,
        existing: Option<&ResourceBinding>,
        name: &str,
        desired: ResourceBindingSpec,
        policy: &AnyPolicy,
    ) -> Result<Arc<ResourceBinding>, BindError> {
        let namespace = template.namespace().unwrap_or_default();
        let policy_ref = detector::policy_reference(policy);
        let labels = BTreeMap::from([(LABEL_POLICY_NAME.to_string(), policy_label(&policy_ref))]);
        let owner = OwnerReference {
            api_version: kind.api_version(),
            kind: kind.kind.to_string(),
            name: template.name_any(),
            uid: template.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(false),
        };
        if let Some(current) = existing
            && same_spec(&current.spec, &desired)
            && current.labels().get(LABEL_POLICY_NAME) == labels.get(LABEL_POLICY_NAME)
            && current
                .owner_references()
                .iter()
                .any(|o| o.uid == owner.uid)
        {
            return Ok(Arc::new(current.clone()));
        }
        let mut metadata = serde_json::json!({
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner],
        });
        if let Some(current) = existing
            && let Some(rv) = &current.metadata.resource_version
        {
            metadata["resourceVersion"] = Value::String(rv.clone());
        }
        let patch = serde_json::json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1",
            "kind": "ResourceBinding",
            "metadata": metadata,
            "spec": desired,
        });
        let api: Api<ResourceBinding> = Api::namespaced(self.client.clone(), &namespace);
        let applied = api
            .patch(
                name,
                &PatchParams::apply(SPEC_MANAGER).force(),
                &Patch::Apply(patch),
            )
            .await
            .map_err(|e| BindError::kube("apply binding spec", e))?;
        tracing::debug!(binding = name, clusters = ?applied.spec.clusters, "binding spec applied");
        Ok(Arc::new(applied))
    }

    /// Writes the `Scheduled` (when scheduling ran), `PolicyBound` and `FailoverBlocked`
    /// conditions, if changed.
    pub(super) async fn apply_status(
        &self,
        binding: &ResourceBinding,
        scheduling: Option<&Result<(), Unschedulable>>,
        policy: Option<&AnyPolicy>,
        blocked: &[failover::Blocked],
        now: &Time,
    ) -> Result<(), BindError> {
        let previous = binding
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let generation = binding.metadata.generation;
        let mut conditions = Vec::new();
        let mut rejected: Option<Vec<ClusterRejection>> = None;
        let mut scheduled_at = None;
        match scheduling {
            Some(Ok(())) => {
                conditions.push(condition(
                    CONDITION_SCHEDULED,
                    "True",
                    REASON_SUCCESS,
                    "Binding has been scheduled successfully.".into(),
                    &previous,
                    generation,
                    now,
                ));
                rejected = Some(Vec::new());
                scheduled_at = Some(now.clone());
            }
            Some(Err(u)) => {
                conditions.push(condition(
                    CONDITION_SCHEDULED,
                    "False",
                    REASON_NO_CLUSTER_FIT,
                    u.summary.clone(),
                    &previous,
                    generation,
                    now,
                ));
                rejected = Some(u.rejections.clone());
            }
            None => {
                if let Some(c) = previous.iter().find(|c| c.type_ == CONDITION_SCHEDULED) {
                    conditions.push(c.clone());
                }
            }
        }
        conditions.push(match policy {
            Some(p) => condition(
                CONDITION_POLICY_BOUND,
                "True",
                "PolicyMatched",
                format!("placed by {}", policy_label(&detector::policy_reference(p))),
                &previous,
                generation,
                now,
            ),
            None => return Ok(()),
        });
        if let Some(c) = phase::blocked_condition(blocked, &previous, generation, now) {
            conditions.push(c);
        }
        let status = binding.status.clone().unwrap_or_default();
        let unchanged = conditions.iter().all(|c| {
            previous.iter().any(|p| {
                p.type_ == c.type_
                    && p.status == c.status
                    && p.reason == c.reason
                    && p.message == c.message
                    && p.observed_generation == c.observed_generation
            })
        }) && rejected
            .as_ref()
            .is_none_or(|r| *r == status.rejected_clusters)
            && (scheduling.is_none() || status.scheduler_observed_generation == generation);
        if unchanged {
            return Ok(());
        }
        let mut body = serde_json::json!({
            "conditions": conditions,
            "schedulerObservedGeneration": generation,
        });
        let last = scheduled_at.or(status.last_scheduled_time.clone());
        if let Some(t) = last {
            body["lastScheduledTime"] =
                serde_json::to_value(t).map_err(|source| BindError::Serialization {
                    what: "lastScheduledTime",
                    source,
                })?;
        }
        body["rejectedClusters"] = serde_json::to_value(
            rejected.unwrap_or(status.rejected_clusters),
        )
        .map_err(|source| BindError::Serialization {
            what: "rejectedClusters",
            source,
        })?;
        self.patch_scheduler_status(binding, body).await
    }

    pub(super) async fn patch_scheduler_status(
        &self,
        binding: &ResourceBinding,
        status: Value,
    ) -> Result<(), BindError> {
        let (namespace, name) = binding.key();
        let patch = serde_json::json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1",
            "kind": "ResourceBinding",
            "metadata": {"name": name, "namespace": namespace},
            "status": status,
        });
        let api: Api<ResourceBinding> = Api::namespaced(self.client.clone(), &namespace);
        api.patch_status(
            &name,
            &PatchParams::apply(SCHEDULER_MANAGER).force(),
            &Patch::Apply(patch),
        )
        .await
        .map_err(|e| BindError::kube("apply binding status", e))?;
        Ok(())
    }

    /// The template no longer matches any policy: the binding keeps its placement and says
    /// why in `PolicyBound`.
    pub(super) async fn unbound(
        &self,
        binding: &ResourceBinding,
        policies: &[AnyPolicy],
    ) -> Result<(), BindError> {
        let previous = binding
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let (reason, message) = match &binding.spec.policy {
            Some(reference) if !policies.iter().any(|p| detector::is_policy(reference, p)) => (
                "PolicyDeleted",
                format!(
                    "{} was deleted; the placement is kept",
                    policy_label(reference)
                ),
            ),
            Some(reference) => (
                "PolicyNoLongerMatches",
                format!(
                    "{} no longer selects the template; the placement is kept",
                    policy_label(reference)
                ),
            ),
            None => (
                "NoPolicy",
                "no policy selects the template; the placement is kept".to_string(),
            ),
        };
        if previous
            .iter()
            .any(|c| c.type_ == CONDITION_POLICY_BOUND && c.status == "False" && c.reason == reason)
        {
            return Ok(());
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let mut conditions: Vec<Condition> = previous
            .iter()
            .filter(|c| c.type_ == CONDITION_SCHEDULED)
            .cloned()
            .collect();
        conditions.push(condition(
            CONDITION_POLICY_BOUND,
            "False",
            reason,
            message,
            &previous,
            binding.metadata.generation,
            &now,
        ));
        let status = binding.status.clone().unwrap_or_default();
        self.patch_scheduler_status(
            binding,
            serde_json::json!({
                "conditions": conditions,
                "schedulerObservedGeneration": status.scheduler_observed_generation,
                "lastScheduledTime": status.last_scheduled_time,
                "rejectedClusters": status.rejected_clusters,
            }),
        )
        .await
    }

    /// Puts the binding's work into the store for each cluster it runs on (and each cluster
    /// whose old copy an eviction keeps), and takes it off the others.
    pub(super) fn dispatch(
        &self,
        binding: &ResourceBinding,
        template: &Value,
    ) -> Result<(), BindError> {
        let key = dispatch::work_key(binding);
        let base = dispatch::base_manifest(template, binding)
            .map_err(|e| BindError::Interpret(format!("building the manifest: {e}")))?;
        let interpreters = self.interpreters.current();
        let mut wanted = BTreeSet::new();
        let kept = binding
            .spec
            .graceful_eviction_tasks
            .iter()
            .filter(|t| t.purge_mode != Some(PurgeMode::Directly))
            .map(|t| TargetCluster {
                name: t.from_cluster.clone(),
                replicas: t.replicas.unwrap_or_default(),
            });
        // A Directly eviction's new copy waits until the old one is gone (never two copies).
        let placed = binding
            .spec
            .clusters
            .iter()
            .filter(|t| failover::decide::may_create_in(&binding.spec, &t.name))
            .cloned();
        // An eviction that keeps the old copy (Gracefully, Never) keeps its work too.
        for target in placed.chain(kept) {
            if !wanted.insert(target.name.clone()) {
                continue;
            }
            let work = dispatch::work_for(binding, &base, &target, |obj, n| {
                interpreters
                    .revise_replica(obj, n)
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| BindError::Interpret(e.to_string()))?;
            if let Some(revision) = self.work.upsert(&target.name, work) {
                tracing::debug!(target: stages::TARGET, stage = stages::WORK_DISPATCHED,
                    cluster = %target.name, work = %key, revision);
            }
        }
        // A Directly eviction's old copy: withdrawn, and its agent asked to report it gone.
        let awaited: BTreeSet<String> = dispatch::awaited_purges(&binding.spec)
            .into_iter()
            .filter(|c| !wanted.contains(c))
            .collect();
        let mut dispatched = self.dispatched.lock().unwrap_or_else(|e| e.into_inner());
        let previous = dispatched
            .insert(key.clone(), wanted.clone())
            .unwrap_or_default();
        for cluster in previous.difference(&wanted) {
            if !awaited.contains(cluster) {
                self.work.remove(cluster, &key);
            }
        }
        drop(dispatched);
        let uid = binding.metadata.uid.clone().unwrap_or_default();
        for cluster in &awaited {
            if self.work.withdraw_for_purge(cluster, &key, &uid).is_some() {
                tracing::info!(binding = %key, %cluster, "old copy withdrawn: waiting for its agent to report it gone (purgeMode Directly)");
            }
        }
        let mut purging = self.purging.lock().unwrap_or_else(|e| e.into_inner());
        let before = if awaited.is_empty() {
            purging.remove(&key)
        } else {
            purging.insert(key.clone(), awaited.clone())
        }
        .unwrap_or_default();
        for cluster in before.difference(&awaited) {
            self.work.settle_purge(cluster, &key);
        }
        Ok(())
    }

    /// Drops from the binding's confirm-purge annotation the clusters that no longer have a
    /// `Never` eviction task: that purge is done, and the entry must not confirm a later
    /// eviction from the same cluster in advance. A JSON merge patch with the binding's
    /// resourceVersion (a concurrent change is a conflict, retried).
    pub(super) async fn prune_confirmations(
        &self,
        binding: &ResourceBinding,
    ) -> Result<(), BindError> {
        let Some(remaining) = phase::pruned_confirmations(binding) else {
            return Ok(());
        };
        let (namespace, name) = binding.key();
        let value = (!remaining.is_empty()).then(|| remaining.join(","));
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": binding.metadata.resource_version,
            "annotations": {api_binding::ANNOTATION_CONFIRM_PURGE: value},
        }});
        let api: Api<ResourceBinding> = Api::namespaced(self.client.clone(), &namespace);
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| BindError::kube("prune confirm-purge annotation", e))?;
        tracing::info!(binding = %format!("{namespace}/{name}"), kept = ?value, "confirmations of done purges removed from the annotation");
        Ok(())
    }

    /// Asks the fencer to delete each old copy a `Directly` eviction waits for on a cluster that
    /// cannot say it is gone (`WaitingForFence`).
    pub(super) fn ask_for_fences(&self, binding: &ResourceBinding, blocked: &[failover::Blocked]) {
        let Some(fencer) = &self.fencer else { return };
        let (namespace, name) = binding.key();
        let resource = &binding.spec.resource;
        for b in blocked
            .iter()
            .filter(|b| b.reason == api_binding::BLOCKED_WAITING_FOR_FENCE)
        {
            fencer.request(FenceRequest {
                cluster: b.cluster.clone(),
                key: WorkKey {
                    namespace: namespace.clone(),
                    name: name.clone(),
                },
                binding_uid: binding.metadata.uid.clone().unwrap_or_default(),
                api_version: resource.api_version.clone(),
                kind: resource.kind.clone(),
                namespace: (!resource.namespace.is_empty()).then(|| resource.namespace.clone()),
                name: resource.name.clone(),
            });
        }
    }

    /// Counts bindings by state for the `lifeboat_hub_bindings` gauge.
    pub fn update_binding_gauges(&self) {
        let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
        for state in [
            "Scheduled",
            "Unschedulable",
            "Applied",
            "Healthy",
            "Unhealthy",
            "Unknown",
        ] {
            counts.insert(state, 0);
        }
        let mut blocked: BTreeMap<String, i64> = api_binding::FAILOVER_BLOCKED_REASONS
            .iter()
            .map(|r| (r.to_string(), 0))
            .collect();
        for b in self.caches.bindings.state() {
            if let Some(c) = b
                .condition(api_binding::CONDITION_FAILOVER_BLOCKED)
                .filter(|c| c.status == "True")
            {
                *blocked.entry(c.reason.clone()).or_default() += 1;
            }
            let status = |t: &str| b.condition(t).map(|c| c.status.clone());
            match status(CONDITION_SCHEDULED).as_deref() {
                Some("True") => *counts.entry("Scheduled").or_default() += 1,
                Some("False") => *counts.entry("Unschedulable").or_default() += 1,
                _ => {}
            }
            if status(api_binding::CONDITION_FULLY_APPLIED).as_deref() == Some("True") {
                *counts.entry("Applied").or_default() += 1;
            }
            match status(api_binding::CONDITION_HEALTHY).as_deref() {
                Some("True") => *counts.entry("Healthy").or_default() += 1,
                Some("False") => *counts.entry("Unhealthy").or_default() += 1,
                _ => *counts.entry("Unknown").or_default() += 1,
            }
        }
        for (state, n) in counts {
            self.metrics.bindings.with_label_values(&[state]).set(n);
        }
        for (reason, n) in blocked {
            self.metrics.blocked.with_label_values(&[&reason]).set(n);
        }
    }
}

#[cfg(test)]
mod tests;
