//! What the hub does while it leads: recover the work from the bindings, then run the binder,
//! the status processor, the cluster health monitor, the fencer and the template status, and
//! feed the ledger.

use super::*;

/// The hub's loops, from the caches to the end of the leader term (or `shutdown`).
pub(super) async fn lead(
    options: HubOptions,
    registry: Registry,
    shutdown: impl Future<Output = ()> + Send + 'static,
    client: kube::Client,
    ledger_writer: LedgerWriter,
    ledger_reader: Ledger,
) -> Result<(), HubError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |rx: watch::Receiver<bool>| async move {
        let mut rx = rx;
        let _ = rx.wait_for(|s| *s).await;
    };

    // Leadership: the Lease, mirrored into the LeaderState the agent API and monitor read.
    let (leadership, elector) = match options.leader_election.clone() {
        Some(mut lease) => {
            if lease.namespace.is_empty() {
                lease.namespace = options.agent_api.namespace.clone();
            }
            tracing::info!(lease = %lease.name, namespace = %lease.namespace, identity = %lease.identity, "leader election on");
            let (elector, leadership) = LeaderElector::new(client.clone(), lease)?;
            (leadership, Some(elector))
        }
        None => (Leadership::always(), None),
    };
    let (leader_tx, leader_rx) = watch::channel(LeaderState::standby(None));
    {
        let mut leadership = leadership.clone();
        tokio::spawn(async move {
            loop {
                leadership.acquired().await;
                leader_tx.send_replace(LeaderState::leader());
                leadership.lost().await;
                leader_tx.send_replace(LeaderState::standby(None));
            }
        });
    }
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    if let Some(elector) = elector {
        tokio::spawn(elector.run(async move {
            let _ = release_rx.await;
        }));
    }

    // Caches.
    let readiness = Readiness::new();
    let binder_slot: Arc<std::sync::OnceLock<Arc<Binder>>> = Arc::new(std::sync::OnceLock::new());
    let (binding_events_tx, binding_events_rx) = mpsc::unbounded_channel::<Arc<ResourceBinding>>();
    let aggregate_all = binding_events_tx.clone();
    let policies = {
        let slot = binder_slot.clone();
        cache(
            Api::<PropagationPolicy>::all(client.clone()),
            readiness.expect("PropagationPolicies"),
            move |event| policy_changed(&slot, event),
        )
    };
    let cluster_policies = {
        let slot = binder_slot.clone();
        cache(
            Api::<ClusterPropagationPolicy>::all(client.clone()),
            readiness.expect("ClusterPropagationPolicies"),
            move |event| policy_changed(&slot, event),
        )
    };
    let clusters = {
        let slot = binder_slot.clone();
        cache(
            Api::<Cluster>::all(client.clone()),
            readiness.expect("Clusters"),
            move |event| {
                let Some(binder) = slot.get() else { return };
                match event {
                    // A heartbeat that only moves `lastHeartbeatTime` changes no decision.
                    watcher::Event::Apply(c) => {
                        binder.cluster_changed(c);
                    }
                    watcher::Event::Delete(c) => binder.cluster_deleted(c),
                    watcher::Event::InitDone => binder.queue_all(),
                    _ => {}
                }
            },
        )
    };
    let bindings = {
        let slot = binder_slot.clone();
        let leading = leader_rx.clone();
        cache(
            Api::<ResourceBinding>::all(client.clone()),
            readiness.expect("ResourceBindings"),
            move |event| match event {
                // Only the leader writes template status (it sends every binding once when
                // it starts leading).
                watcher::Event::Apply(b) | watcher::Event::InitApply(b)
                    if leading.borrow().is_leader =>
                {
                    let _ = binding_events_tx.send(Arc::new(b.clone()));
                    // The failover phase acts on status changes (health, old copies gone).
                    if let Some(binder) = slot.get() {
                        binder.binding_changed(b);
                    }
                }
                watcher::Event::Delete(b) => {
                    if let Some(binder) = slot.get() {
                        binder.binding_deleted(b);
                    }
                }
                _ => {}
            },
        )
    };

    // Interpreters: the built-ins, with the hub's customizations layered over them and
    // replaced whenever one changes.
    let runtime = Arc::new(Runtime::new(RuntimeConfig::default()));
    let builtin =
        Interpreters::builtin(runtime).map_err(|e| HubError::Interpreters(e.to_string()))?;
    let interpreters = InterpreterHandle::new(Interpreters::layered(builtin.clone(), &[]).0);
    {
        let handle = interpreters.clone();
        let store_slot: Arc<std::sync::OnceLock<Store<ResourceInterpreterCustomization>>> =
            Arc::new(std::sync::OnceLock::new());
        let slot = store_slot.clone();
        let binder = binder_slot.clone();
        let leading = leader_rx.clone();
        let aggregate = aggregate_all.clone();
        let rejected_events = crate::interpreters::RejectedEvents::new(client.clone());
        let store = cache(
            Api::<ResourceInterpreterCustomization>::all(client.clone()),
            readiness.expect("ResourceInterpreterCustomizations"),
            move |event| {
                if matches!(event, watcher::Event::Init | watcher::Event::InitApply(_)) {
                    return;
                }
                let Some(store) = slot.get() else { return };
                let all: Vec<ResourceInterpreterCustomization> =
                    store.state().iter().map(|c| (**c).clone()).collect();
                let (layered, rejected) = Interpreters::layered(builtin.clone(), &all);
                for r in &rejected {
                    tracing::warn!(customization = %r.name, reason = %r.reason, "interpreter customization rejected");
                }
                if leading.borrow().is_leader {
                    rejected_events.post(&rejected);
                }
                handle.replace(layered);
                tracing::info!(
                    customizations = all.len(),
                    rejected = rejected.len(),
                    "interpreter customizations loaded"
                );
                // What the scripts decide (replicas, requirements, components, the templates'
                // aggregated status) is decided again now, not at the next unrelated change.
                if let Some(binder) = binder.get() {
                    binder.queue_all();
                    if leading.borrow().is_leader {
                        for binding in binder.caches.bindings.state() {
                            let _ = aggregate.send(binding);
                        }
                    }
                }
            },
        );
        let _ = store_slot.set(store);
    }

    // The work store, the status intake and processor, the agent API.
    let work = Arc::new(WorkStore::new(new_epoch()));
    // Only the leader records: the feed checks the leader state on every event.
    let ledger = LedgerFeed::new(ledger_writer, leader_rx.clone());
    let _ = work.observe(crate::work::record::observer(ledger.clone()));
    let (health_tx, health_rx) = mpsc::unbounded_channel();
    tokio::spawn(crate::status::record::health_transitions(
        ledger.clone(),
        health_rx,
        work.clone(),
    ));
    let (intake, receiver) = crate::status::intake::channel(1024);
    let processor_metrics = ProcessorMetrics::new(&registry)?;
    let (full_reports_tx, full_reports) = mpsc::unbounded_channel();
    let handoff = crate::status::handoff::Handoff::new();
    let status_view = processor::run(
        receiver,
        ProcessorDeps {
            client: client.clone(),
            bindings: bindings.clone(),
            work: work.clone(),
            interpreters: interpreters.clone(),
            metrics: processor_metrics,
            transitions: Some(health_tx),
            written: None,
            full_reports: Some(full_reports_tx),
            write_concurrency: options.status_writers.max(1),
            handoff: Some(handoff.clone()),
        },
    );
    let tls = agent_api_tls(&client, &options, stop_rx.clone()).await?;
    let api = AgentApi::new(
        options.agent_api.clone(),
        AgentApiDeps {
            client: client.clone(),
            work: work.clone(),
            intake: intake.clone(),
            leadership: leader_rx.clone(),
            registry: registry.clone(),
        },
    )?;
    // The hub's own fence (a Directly eviction's old copy on a cluster that cannot say it is
    // gone), with the fencing credentials the agents gave.
    let fencer = crate::failover::fencer::spawn(crate::failover::fencer::FencerDeps {
        credentials: api.fencing_credentials(),
        namespace: options.agent_api.namespace.clone(),
        work: work.clone(),
        intake,
        leadership: leader_rx.clone(),
        metrics: crate::failover::fencer::FencerMetrics::new(&registry)?,
    });
    let listener = tokio::net::TcpListener::bind(options.agent_api_bind)
        .await
        .map_err(|source| HubError::Listen {
            addr: options.agent_api_bind,
            source,
        })?;
    tracing::info!(addr = %options.agent_api_bind, "serving the agent API");
    tokio::spawn({
        let stop = stop_rx.clone();
        async move {
            if let Err(error) = api.serve(listener, tls, stopped(stop)).await {
                tracing::error!(%error, "agent API stopped");
            }
        }
    });

    if let Some(addr) = options.metrics_bind {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| HubError::Listen { addr, source })?;
        let app = lifeboat_runtime::http::router(registry.clone(), readiness.clone());
        tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::error!(%error, "metrics server stopped");
            }
        });
        tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    }

    // Cluster health (acts only while leading).
    let monitor =
        ClusterHealthMonitor::new(options.cluster_health.clone(), client.clone(), &registry)?;
    tokio::spawn(crate::clusters::record::cluster_transitions(
        ledger.clone(),
        monitor.subscribe(),
    ));
    let cluster_health = monitor.readiness();
    tokio::spawn(monitor.run(leader_rx.clone(), stopped(stop_rx.clone())));

    // Templates and the binder.
    let templates = Arc::new(Templates::new());
    let binder = Arc::new(
        Binder::new(
            client.clone(),
            Caches {
                templates: templates.clone(),
                policies,
                cluster_policies,
                bindings,
                clusters,
            },
            interpreters.clone(),
            Arc::new(SchedulerPlacer::new(&options.scheduler)),
            work.clone(),
            BinderMetrics::new(&registry)?,
        )
        .with_cluster_eviction_rate(options.cluster_eviction_rate)
        .with_status_view(status_view)
        .with_handoff(handoff.clone())
        .with_fencer(fencer)
        .with_recorder(FailoverRecorder::new(
            Some(ledger.clone()),
            Some(client.clone()),
            FailoverMetrics::new(&registry)?,
        )),
    );
    // Nothing is decided before this leader has recovered.
    binder.set_deciding(false);
    let _ = binder_slot.set(binder.clone());
    {
        let decider: std::sync::Weak<Binder> = Arc::downgrade(&binder);
        handoff.set_decider(decider);
    }
    let (kinds_tx, mut kinds_rx) = watch::channel(KindsSynced::default());
    {
        let queue = binder.queue.clone();
        tokio::spawn(templates::run(
            client.clone(),
            templates.clone(),
            move |key| queue.add(key),
            kinds_tx,
            stop_rx.clone(),
        ));
    }
    tokio::spawn(crate::binding::template_status::run(
        client.clone(),
        binder.caches.clone(),
        interpreters.clone(),
        binding_events_rx,
    ));

    // Leading: wait for every cache, give every binding's work back to the agents, open the
    // work streams, recover (hear from every Ready cluster), then decide.
    let phase = PhaseGauge::new(&registry)?;
    phase.set(HubPhase::Standby);
    let mut leading = leadership.clone();
    let mut stop = stop_rx.clone();
    tokio::select! {
        _ = leading.acquired() => {}
        _ = stop.wait_for(|s| *s) => return Ok(()),
    }
    phase.set(HubPhase::Recovering);
    tracing::info!("leading: recovering");
    while !(readiness.is_ready() && kinds_rx.borrow().complete()) {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = kinds_rx.changed() => {}
            _ = stop.wait_for(|s| *s) => return Ok(()),
        }
    }
    // /readyz says Recovering until the decisions start.
    let recovered = readiness.expect("recovery");
    binder.refresh_policies();
    binder.queue_all();
    let workers = tokio::spawn(binder.clone().run_workers(options.binder_workers.max(1)));
    let started = std::time::Instant::now();
    while !binder.queue.is_idle() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ready_clusters: Vec<String> = binder
        .caches
        .clusters
        .state()
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none() && c.is_ready())
        .map(|c| kube::ResourceExt::name_any(c.as_ref()))
        .collect();
    work.mark_ready();
    for binding in binder.caches.bindings.state() {
        let _ = aggregate_all.send(binding);
    }
    tracing::info!(
        templates = templates.keys().len(),
        work = work.total(),
        seconds = started.elapsed().as_secs_f64(),
        "the bindings' work is back in the store: work streams open"
    );
    let recovery = Recovery::new(ready_clusters, Instant::now(), options.recovery_timeout);
    let interrupted = tokio::select! {
        outcome = recover(recovery, full_reports, cluster_health) => {
            match outcome {
                Recovered::Complete => tracing::info!(
                    seconds = started.elapsed().as_secs_f64(),
                    "recovered: every Ready cluster re-sent its state or was lost; deciding"
                ),
                Recovered::TimedOut { waiting } => tracing::warn!(
                    seconds = started.elapsed().as_secs_f64(),
                    waiting = %waiting.join(","),
                    "recovery timed out: these clusters neither re-sent their state nor lost their lease; deciding anyway"
                ),
            }
            None
        }
        _ = leading.lost() => Some(Err(HubError::LostLeadership)),
        _ = stop.wait_for(|s| *s) => Some(Ok(())),
    };
    if let Some(result) = interrupted {
        binder.queue.close();
        let _ = workers.await;
        if result.is_ok() {
            let _ = release_tx.send(());
        }
        return result;
    }
    binder.set_deciding(true);
    binder.queue_all();
    phase.set(HubPhase::Running);
    recovered.synced();
    tokio::spawn(backfill_evictions(
        ledger_reader,
        binder.caches.bindings.clone(),
        ledger.clone(),
    ));
    let gauges = {
        let binder = binder.clone();
        tokio::spawn(async move {
            loop {
                binder.update_binding_gauges();
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        })
    };

    let result = tokio::select! {
        _ = leading.lost() => Err(HubError::LostLeadership),
        _ = stop.wait_for(|s| *s) => Ok(()),
    };
    binder.queue.close();
    let _ = workers.await;
    gauges.abort();
    // The last write is done: the Lease may go.
    let _ = release_tx.send(());
    result
}

/// Waits until `recovery` is over: full reports and lost clusters come in, the deadline passes.
pub(super) async fn recover(
    mut recovery: Recovery,
    mut full_reports: mpsc::UnboundedReceiver<String>,
    mut cluster_health: watch::Receiver<std::collections::BTreeMap<String, ClusterHealth>>,
) -> Recovered {
    loop {
        for (cluster, health) in cluster_health.borrow_and_update().iter() {
            if *health != ClusterHealth::Ready {
                recovery.lost(cluster);
            }
        }
        if let Some(outcome) = recovery.outcome(Instant::now()) {
            return outcome;
        }
        tracing::debug!(waiting = %recovery.waiting().join(","), "recovering");
        tokio::select! {
            Some(cluster) = full_reports.recv() => {
                tracing::info!(%cluster, "recovery: the cluster re-sent its full state");
                recovery.full_report(&cluster);
            }
            Ok(()) = cluster_health.changed() => {}
            _ = tokio::time::sleep_until(recovery.deadline().into()) => {}
        }
    }
}

/// Most ledger events of one binding read back to find its missing evictions.
pub(super) const BACKFILL_HISTORY_LIMIT: u32 = 10_000;

/// Records the evictions in the bindings' history that the ledger lacks (a hub killed between
/// writing an eviction and writing its ledger event), so the timeline stays whole across a crash.
pub(super) async fn backfill_evictions(
    reader: Ledger,
    bindings: Store<ResourceBinding>,
    feed: LedgerFeed,
) {
    let mut added = 0usize;
    for binding in bindings.state() {
        if binding.spec.eviction_history.is_empty() {
            continue;
        }
        let (namespace, name) = binding.key();
        let recorded = match reader
            .history_of_binding(&namespace, &name, BACKFILL_HISTORY_LIMIT)
            .await
        {
            Ok(recorded) => recorded,
            Err(error) => {
                tracing::warn!(%error, binding = %format!("{namespace}/{name}"), "reading the ledger to backfill evictions failed");
                continue;
            }
        };
        for event in crate::failover::record::missing_evictions(&binding, &recorded) {
            feed.record(event).await;
            added += 1;
        }
    }
    if added > 0 {
        tracing::warn!(
            evictions = added,
            "the ledger lacked evictions recorded in the bindings (a hub stopped before writing them): added"
        );
    }
}

/// `lifeboat_hub_phase{phase}`: 1 for what this process is doing (Standby, Recovering,
/// Running), 0 for the others.
pub(super) struct PhaseGauge(prometheus::IntGaugeVec);

impl PhaseGauge {
    pub(super) fn new(registry: &Registry) -> Result<PhaseGauge, prometheus::Error> {
        let gauge = prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_phase",
                "1 for what this hub process is doing: Standby (another leads), Recovering (leading, waiting for the agents' full state; nothing is decided), Running",
            ),
            &["phase"],
        )?;
        registry.register(Box::new(gauge.clone()))?;
        Ok(PhaseGauge(gauge))
    }

    pub(super) fn set(&self, now: HubPhase) {
        for phase in HubPhase::ALL {
            self.0
                .with_label_values(&[phase.as_str()])
                .set(i64::from(phase == now));
        }
        tracing::info!(phase = now.as_str(), "hub phase");
    }
}

/// A policy changed: rebuild the index and bind again the templates it may select or have
/// selected (a PropagationPolicy: those of its namespace; a ClusterPropagationPolicy: all).
pub(super) fn policy_changed<K: kube::Resource>(
    slot: &std::sync::OnceLock<Arc<Binder>>,
    event: &watcher::Event<K>,
) {
    let Some(binder) = slot.get() else { return };
    match event {
        watcher::Event::Apply(policy) | watcher::Event::Delete(policy) => {
            binder.refresh_policies();
            match policy.meta().namespace.as_deref() {
                Some(namespace) => binder.queue_namespace(namespace),
                None => binder.queue_all(),
            }
        }
        watcher::Event::InitDone => {
            binder.refresh_policies();
            binder.queue_all();
        }
        _ => {}
    }
}
