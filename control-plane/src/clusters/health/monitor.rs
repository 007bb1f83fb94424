//! [`ClusterHealthMonitor`]: the IO around [`judge`]: the Cluster and Lease caches, the
//! `Ready` condition and the taints written, the Events and the transitions announced, the
//! finalizer kept.

use super::*;

/// The cluster health monitor.
pub struct ClusterHealthMonitor {
    pub(super) config: ClusterHealthConfig,
    pub(super) client: kube::Client,
    pub(super) ready_gauge: IntGaugeVec,
    pub(super) fleet_gauges: FleetGauges,
    pub(super) transitions: broadcast::Sender<ReadinessTransition>,
    pub(super) readiness: watch::Sender<BTreeMap<String, ClusterHealth>>,
    pub(super) recorder: Recorder,
}

pub(super) struct Remembered {
    pub(super) health: ClusterHealth,
    pub(super) written: Option<Instant>,
}

impl ClusterHealthMonitor {
    /// Creates the monitor and registers `lifeboat_hub_cluster_ready{cluster}`,
    /// `lifeboat_hub_cluster_gpus{cluster,state}` and `lifeboat_hub_cluster_nodes{cluster,condition}`
    /// in `registry`.
    pub fn new(
        config: ClusterHealthConfig,
        client: kube::Client,
        registry: &Registry,
    ) -> Result<ClusterHealthMonitor, prometheus::Error> {
        let ready_gauge = IntGaugeVec::new(
            Opts::new(
                "lifeboat_hub_cluster_ready",
                "Ready condition of each member cluster: 1 True, 0 False, -1 Unknown",
            ),
            &["cluster"],
        )?;
        registry.register(Box::new(ready_gauge.clone()))?;
        let fleet_gauges = FleetGauges::new(registry)?;
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "lifeboat-hub".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        Ok(ClusterHealthMonitor {
            config,
            client,
            ready_gauge,
            fleet_gauges,
            transitions: broadcast::channel(1024).0,
            readiness: watch::channel(BTreeMap::new()).0,
            recorder,
        })
    }

    /// Every transition from now on (a slow receiver loses the oldest: read
    /// [`ClusterHealthMonitor::readiness`] for the current state).
    pub fn subscribe(&self) -> broadcast::Receiver<ReadinessTransition> {
        self.transitions.subscribe()
    }

    /// The current health of every judged cluster.
    pub fn readiness(&self) -> watch::Receiver<BTreeMap<String, ClusterHealth>> {
        self.readiness.subscribe()
    }

    /// Watches Clusters and Leases and keeps the clusters' health while this hub leads, until
    /// `shutdown` completes.
    pub async fn run(
        self,
        mut leadership: watch::Receiver<LeaderState>,
        shutdown: impl Future<Output = ()>,
    ) {
        let wake = Arc::new(Notify::new());
        let mut cluster_watch = watcher::Config::default();
        if let Some(selector) = &self.config.cluster_selector {
            cluster_watch = cluster_watch.labels(selector);
        }
        let (clusters, cluster_task) = Cache::new(
            Api::<Cluster>::all(self.client.clone()),
            "Clusters (cluster health)",
        )
        .config(cluster_watch)
        .spawn({
            let wake = wake.clone();
            move |_| wake.notify_one()
        });
        let (leases, lease_task) = Cache::new(
            Api::<Lease>::namespaced(self.client.clone(), &self.config.namespace),
            "cluster Leases",
        )
        .config(watcher::Config::default().labels(CLUSTER_NAME_LABEL))
        .spawn({
            let wake = wake.clone();
            move |_| wake.notify_one()
        });
        let _abort = AbortOnDrop(vec![cluster_task, lease_task]);
        let mut removal = ClusterRemoval::new(
            self.client.clone(),
            self.config.namespace.clone(),
            self.config.lease_duration,
            self.recorder.clone(),
        );
        let mut shutdown = std::pin::pin!(shutdown);
        let mut memory: HashMap<String, Remembered> = HashMap::new();
        let mut with_fleet_gauges: BTreeSet<String> = BTreeSet::new();
        let mut leading_since: Option<Timestamp> = None;
        let mut next_wake = Instant::now();
        loop {
            let leading = leadership.borrow().is_leader;
            match (leading, leading_since) {
                (true, None) => {
                    leading_since = Some(Timestamp::now());
                    memory.clear();
                    let _ = tokio::time::timeout(Duration::from_secs(30), async {
                        let _ = clusters.wait_until_ready().await;
                        let _ = leases.wait_until_ready().await;
                    })
                    .await;
                }
                (false, Some(_)) => {
                    leading_since = None;
                    // Only the leader exports the per-cluster gauges: a former leader's would
                    // go stale, and sums over the replicas would count each cluster twice.
                    self.ready_gauge.reset();
                    self.fleet_gauges.reset();
                    with_fleet_gauges.clear();
                }
                _ => {}
            }
            if let Some(since) = leading_since {
                let soonest = self.evaluate(&clusters, &leases, since, &mut memory).await;
                let released = removal.pass(&clusters, &leases, since).await;
                let soonest = match (soonest, released) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                self.export_fleet(&clusters, &mut with_fleet_gauges);
                let period = Instant::now() + self.config.period;
                next_wake = soonest
                    .and_then(|t| Timestamp::now().duration_until(t).try_into().ok())
                    .map(|d: Duration| (Instant::now() + d + Duration::from_millis(5)).min(period))
                    .unwrap_or(period);
            }
            tokio::select! {
                _ = &mut shutdown => return,
                changed = leadership.changed() => if changed.is_err() { return },
                _ = wake.notified() => {}
                _ = tokio::time::sleep_until(next_wake), if leading_since.is_some() => {}
            }
        }
    }

    /// Sets the fleet gauges of every Cluster in the cache from its status, and removes those of
    /// Clusters deleted (or being deleted) since the last pass.
    pub(super) fn export_fleet(&self, clusters: &Store<Cluster>, exported: &mut BTreeSet<String>) {
        let mut present = BTreeSet::new();
        for cluster in clusters.state() {
            if cluster.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let name = cluster.name_any();
            self.fleet_gauges
                .set(&name, FleetGaugeValues::of(cluster.status.as_ref()));
            present.insert(name);
        }
        for gone in exported.difference(&present) {
            self.fleet_gauges.remove(gone);
        }
        *exported = present;
    }

    /// Judges every cluster, writes what differs; returns the soonest lease expiry.
    pub(super) async fn evaluate(
        &self,
        clusters: &Store<Cluster>,
        leases: &Store<Lease>,
        leading_since: Timestamp,
        memory: &mut HashMap<String, Remembered>,
    ) -> Option<Timestamp> {
        let now = Timestamp::now();
        let mut soonest: Option<Timestamp> = None;
        let mut present = BTreeMap::new();
        for cluster in clusters.state() {
            let name = cluster.name_any();
            if cluster.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let lease =
                leases.get(&ObjectRef::new(&lease_name(&name)).within(&self.config.namespace));
            let Some(verdict) = judge(&cluster, lease.as_deref(), now, leading_since, &self.config)
            else {
                continue;
            };
            if let Some(expires) = verdict.expires {
                soonest = Some(soonest.map_or(expires, |s| s.min(expires)));
            }
            present.insert(name.clone(), verdict.health);
            let shown = Shown::of(&cluster);
            let remembered = memory.get(&name);
            let known = remembered.map(|r| r.health).or_else(|| shown.health());
            if shown.matches(verdict.health) {
                memory.insert(
                    name,
                    Remembered {
                        health: verdict.health,
                        written: None,
                    },
                );
                continue;
            }
            if remembered.is_some_and(|r| {
                r.health == verdict.health && r.written.is_some_and(|w| w.elapsed() < WRITE_SETTLE)
            }) {
                continue; // written; the cache has not caught up yet
            }
            // Instrumented, not entered: an entered span must not live across an await.
            let span = tracing::info_span!("cluster_health", cluster = %name);
            let written = self
                .write(&cluster, &verdict, &shown, now)
                .instrument(span.clone())
                .await;
            match written {
                Ok(()) => {
                    memory.insert(
                        name.clone(),
                        Remembered {
                            health: verdict.health,
                            written: Some(Instant::now()),
                        },
                    );
                    if known != Some(verdict.health) {
                        self.announce(&cluster, known, &verdict, now)
                            .instrument(span)
                            .await;
                    }
                }
                Err(error) => span.in_scope(|| {
                    tracing::warn!(%error, health = ?verdict.health, "writing the cluster's health failed; retrying")
                }),
            }
        }
        // Gauges and the snapshot follow the clusters that exist.
        let previous = self.readiness.borrow().clone();
        for gone in previous.keys().filter(|c| !present.contains_key(*c)) {
            let _ = self.ready_gauge.remove_label_values(&[gone]);
            memory.remove(gone);
        }
        for (cluster, health) in &present {
            self.ready_gauge
                .with_label_values(&[cluster])
                .set(health.metric_value());
        }
        if previous != present {
            self.readiness.send_replace(present);
        }
        soonest
    }

    /// Writes the condition and the taint. Unhealthy: taint first (the scheduler reads it),
    /// then the condition; healthy: condition first, then the taint goes.
    pub(super) async fn write(
        &self,
        cluster: &Cluster,
        verdict: &Verdict,
        shown: &Shown,
        now: Timestamp,
    ) -> Result<(), kube::Error> {
        let name = cluster.name_any();
        let api: Api<Cluster> = Api::all(self.client.clone());
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let condition = ready_condition(verdict, shown, cluster.metadata.generation, now);
        let mut fields = serde_json::json!({"conditions": [condition]});
        if let Some(since) = not_ready_since(verdict, shown, now) {
            // Left out once Ready: server-side apply then removes it.
            fields["notReadySince"] = serde_json::json!(since);
        }
        let status = serde_json::json!({
            "apiVersion": Cluster::api_version(&()),
            "kind": Cluster::kind(&()),
            "metadata": {"name": name},
            "status": fields,
        });
        if let Some(key) = verdict.health.taint_key() {
            // Applying only this one removes the other taint of this manager, if it was set.
            let taint = Taint {
                key: key.to_string(),
                effect: TAINT_EFFECT.to_string(),
                value: None,
                time_added: shown
                    .taint
                    .as_ref()
                    .filter(|t| t.key == key)
                    .and_then(|t| t.time_added.clone())
                    .or(Some(Time(now))),
            };
            let spec = serde_json::json!({
                "apiVersion": Cluster::api_version(&()),
                "kind": Cluster::kind(&()),
                "metadata": {"name": name},
                "spec": {"taints": [taint]},
            });
            api.patch(&name, &params, &Patch::Apply(&spec)).await?;
            api.patch_status(&name, &params, &Patch::Apply(&status))
                .await?;
        } else {
            let mut after = api
                .patch_status(&name, &params, &Patch::Apply(&status))
                .await?;
            // Removed with a guarded JSON patch rather than by applying without it: applying a
            // spec that ends up empty would drop the (required) spec, and a taint someone else
            // added must go as well (this monitor is the authority on it).
            while let Some((index, key)) = after
                .spec
                .taints
                .iter()
                .enumerate()
                .find(|(_, t)| is_monitor_taint(t))
                .map(|(i, t)| (i, t.key.clone()))
            {
                let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
                    {"op": "test", "path": format!("/spec/taints/{index}/key"), "value": key},
                    {"op": "test", "path": format!("/spec/taints/{index}/effect"), "value": TAINT_EFFECT},
                    {"op": "remove", "path": format!("/spec/taints/{index}")},
                ]))
                .map_err(kube::Error::SerdeError)?;
                after = api
                    .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
                    .await?;
            }
        }
        Ok(())
    }

    pub(super) async fn announce(
        &self,
        cluster: &Cluster,
        from: Option<ClusterHealth>,
        verdict: &Verdict,
        now: Timestamp,
    ) {
        let name = cluster.name_any();
        let (type_, reason) = match verdict.health {
            ClusterHealth::Ready => (EventType::Normal, EVENT_READY),
            ClusterHealth::MemberApiUnreachable => (EventType::Warning, EVENT_NOT_READY),
            _ => (EventType::Warning, EVENT_UNREACHABLE),
        };
        if verdict.health == ClusterHealth::Ready {
            tracing::info!(from = ?from, "cluster ready");
        } else {
            tracing::warn!(from = ?from, to = ?verdict.health, message = %verdict.message, "cluster not ready");
        }
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(truncate(&verdict.message, 1000)),
            action: "MonitorLease".into(),
            secondary: None,
        };
        post_event(&self.recorder, cluster, event).await;
        let _ = self.transitions.send(ReadinessTransition {
            cluster: name,
            from,
            to: verdict.health,
            message: verdict.message.clone(),
            at: Time(now),
        });
    }
}

pub(super) fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

pub(super) struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}
