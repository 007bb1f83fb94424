//! What queues a template: policy, cluster and binding changes, and the bindings a failover
//! may need to look at again.

use super::*;

impl Binder {
    /// Rebuilds the policy index from the caches (after a policy event).
    pub fn refresh_policies(&self) {
        let mut all: Vec<AnyPolicy> = self
            .caches
            .policies
            .state()
            .into_iter()
            .map(|p| AnyPolicy::Namespaced((*p).clone()))
            .collect();
        all.extend(
            self.caches
                .cluster_policies
                .state()
                .into_iter()
                .map(|p| AnyPolicy::Cluster((*p).clone())),
        );
        *self.policy_index.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(all);
    }

    pub(super) fn policies(&self) -> Arc<Vec<AnyPolicy>> {
        self.policy_index
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Queues every template (a policy changed; the initial pass).
    pub fn queue_all(&self) {
        for key in self.caches.templates.keys() {
            self.queue.add(key);
        }
    }

    /// Queues the templates of one namespace (a PropagationPolicy there changed: it selects
    /// only templates of its own namespace).
    pub fn queue_namespace(&self, namespace: &str) {
        for key in self
            .caches
            .templates
            .keys()
            .into_iter()
            .filter(|k| k.namespace == namespace)
        {
            self.queue.add(key);
        }
    }

    /// A Cluster was updated: its bindings are looked at again when something a decision reads
    /// changed (not for a heartbeat that only moved `lastHeartbeatTime`). Returns whether it
    /// queued them.
    pub fn cluster_changed(&self, cluster: &Cluster) -> bool {
        let name = cluster.name_any();
        let fingerprint = decision_fingerprint(cluster);
        let previous = self
            .cluster_fingerprints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.clone(), fingerprint);
        if previous == Some(fingerprint) {
            return false;
        }
        self.queue_for_cluster_change(&name);
        true
    }

    /// A Cluster was deleted: its bindings are looked at again.
    pub fn cluster_deleted(&self, cluster: &Cluster) {
        let name = cluster.name_any();
        self.cluster_fingerprints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&name);
        self.queue_for_cluster_change(&name);
    }

    /// Queues the templates whose binding is not scheduled, is placed on `cluster`, or is
    /// being evicted from it (the clusters changed).
    pub fn queue_for_cluster_change(&self, cluster: &str) {
        for binding in self.caches.bindings.state() {
            let scheduled = binding
                .condition(CONDITION_SCHEDULED)
                .is_some_and(|c| c.status == "True");
            let placed_there = binding.spec.clusters.iter().any(|c| c.name == cluster)
                || binding
                    .spec
                    .graceful_eviction_tasks
                    .iter()
                    .any(|t| t.from_cluster == cluster);
            if (!scheduled || placed_there)
                && let Some(key) = template_key_of(&binding)
            {
                self.queue.add(key);
            }
        }
    }

    /// A binding changed (its status, mostly): its template is bound again when the failover
    /// phase may have something to decide.
    /// A binding that shows what the last pass already decided on (the echo of the binder's
    /// own spec write, or of a status write it decided on before it was written) is not looked
    /// at again: in a burst of failovers those echoes were most of the binder's passes. The
    /// binding is compared as a pass would see it, with the processor's newer items in place
    /// ([`Binder::with_newest_status`]): the echo of a spec write that overtook the status write
    /// it decided on shows the same.
    pub fn binding_changed(&self, binding: &ResourceBinding) {
        if !phase::wants_a_look(binding) {
            return;
        }
        let seen = self
            .decided
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&dispatch::work_key(binding))
            .copied();
        if seen.is_some()
            && seen
                == Some(decision_view(
                    &self.with_newest_status(Arc::new(binding.clone())),
                ))
        {
            return;
        }
        if let Some(key) = template_key_of(binding) {
            self.queue.add(key);
        }
    }

    /// A binding was deleted: its work leaves every cluster, and its template (if it still
    /// exists) is bound again.
    pub fn binding_deleted(&self, binding: &ResourceBinding) {
        let key = dispatch::work_key(binding);
        self.decided
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        let clusters = self
            .dispatched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
            .unwrap_or_default();
        for cluster in clusters {
            self.work.remove(&cluster, &key);
        }
        let purging = self
            .purging
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
            .unwrap_or_default();
        for cluster in purging {
            self.work.settle_purge(&cluster, &key);
        }
        if let Some(template) = template_key_of(binding) {
            self.queue.add(template);
        }
    }
}
