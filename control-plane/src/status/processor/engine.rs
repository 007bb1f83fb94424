//! The processor's thread: the [`Engine`] that folds batches in with their interpretations done
//! on the lanes' threads, [`run`] that drives it from the intake, and where the results go
//! ([`Outputs`]) and are counted ([`ProcessorMetrics`]).

use super::*;

impl ProcessorMetrics {
    pub fn new(registry: &prometheus::Registry) -> Result<ProcessorMetrics, prometheus::Error> {
        let items = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_status_items_processed_total",
                "Status items reported by agents, by result (accepted, rejected)",
            ),
            &["result"],
        )?;
        let batch_seconds = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "lifeboat_hub_status_batch_duration_seconds",
                "Time to interpret and fold one batch of status reports",
            )
            .buckets(vec![
                0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
            ]),
        )?;
        let status_writes = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_binding_status_writes_total",
                "Binding status writes by result",
            ),
            &["result"],
        )?;
        let health_transitions = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_health_transitions_total",
                "Per-cluster health changes of bindings, by new health",
            ),
            &["health"],
        )?;
        let interpreter_seconds = prometheus::CounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_interpreter_seconds_total",
                "Seconds spent interpreting agents' reports, by customization ((builtin) for the \
                 built-in interpreters) and operation",
            ),
            &["customization", "operation"],
        )?;
        let interpreter_evaluations = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_interpreter_evaluations_total",
                "Script evaluations on agents' reports, by customization, operation and result \
                 (ok, error, timeout: stopped by the wall clock or the instruction budget)",
            ),
            &["customization", "operation", "result"],
        )?;
        let deferred = prometheus::IntCounter::new(
            "lifeboat_hub_interpretations_deferred_total",
            "Status items whose interpretation was slow or waited in a slow lane, folded in \
             after their batch",
        )?;
        let reinterpretations = prometheus::IntCounter::new(
            "lifeboat_hub_reinterpretations_total",
            "Last observed objects interpreted again because their kind's customizations changed",
        )?;
        let events_dropped = prometheus::IntCounter::new(
            "lifeboat_hub_interpreter_events_dropped_total",
            "InterpreterError Events not posted for the rate limit",
        )?;
        registry.register(Box::new(items.clone()))?;
        registry.register(Box::new(batch_seconds.clone()))?;
        registry.register(Box::new(status_writes.clone()))?;
        registry.register(Box::new(health_transitions.clone()))?;
        registry.register(Box::new(interpreter_seconds.clone()))?;
        registry.register(Box::new(interpreter_evaluations.clone()))?;
        registry.register(Box::new(deferred.clone()))?;
        registry.register(Box::new(reinterpretations.clone()))?;
        registry.register(Box::new(events_dropped.clone()))?;
        Ok(ProcessorMetrics {
            items,
            batch_seconds,
            status_writes,
            health_transitions,
            interpreter_seconds,
            interpreter_evaluations,
            deferred,
            reinterpretations,
            events_dropped,
        })
    }
}

impl Engine {
    pub fn new(
        state: SharedState,
        pool: Arc<Pool>,
        known: Arc<Interpreters>,
        slow_after: Duration,
    ) -> Engine {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Engine {
            state,
            pool,
            done_tx,
            done_rx,
            batches: 0,
            known,
            slow_after,
            epoch: Instant::now(),
        }
    }

    pub fn state(&self) -> &SharedState {
        &self.state
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, StatusState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Folds `batch` in. Its items that need interpreting are jobs in their kind's lane; the
    /// batch waits for them, except for a job that has run `slow_after` or waits in a lane that
    /// is not trusted: that item is folded in when its interpretation comes. Interpretations of
    /// earlier batches that come meanwhile are folded in too.
    pub async fn batch(
        &mut self,
        batch: Arc<StatusBatch>,
        work: &WorkStore,
        binding: impl Fn(&WorkKey) -> Option<Arc<ResourceBinding>>,
        interpreters: &Arc<Interpreters>,
        now: &Time,
    ) -> Processed {
        let prints = fingerprints(&batch, interpreters);
        let misses = self.lock().misses(&batch, &prints);
        let id = self.batches;
        self.batches += 1;
        let mut waiting: HashMap<usize, (LaneKey, Arc<AtomicU64>)> = HashMap::new();
        for (i, print) in misses {
            let Some(observed) = batch.report.items.get(i).and_then(|r| r.observed.as_ref()) else {
                continue;
            };
            let lane = lane_of(observed);
            // When the job started (nanoseconds after the epoch, plus one); 0: not yet.
            let started = Arc::new(AtomicU64::new(0));
            let (batch, interpreters, tx, epoch) = (
                batch.clone(),
                interpreters.clone(),
                self.done_tx.clone(),
                self.epoch,
            );
            let job_started = started.clone();
            let vouched = !interpreters.customizes(&lane);
            self.pool
                .submit(lane.clone(), Priority::Live, vouched, move || {
                    job_started.store(nanos_since(epoch) + 1, AtomicOrdering::Relaxed);
                    let Some(item) = batch.report.items.get(i) else {
                        return;
                    };
                    let Some(observed) = &item.observed else {
                        return;
                    };
                    let fresh = Fresh::new(Interpreted::run(observed, print, &interpreters));
                    let _ = tx.send(Done {
                        batch: Some(id),
                        index: i,
                        late: Late {
                            key: item.key.clone(),
                            binding_uid: item.binding_uid.clone(),
                            cluster: batch.cluster.clone(),
                            fresh,
                        },
                    });
                });
            waiting.insert(i, (lane, started));
        }
        let mut fresh = HashMap::new();
        let mut late = Vec::new();
        let mut deferred = HashSet::new();
        let slow_nanos = self.slow_after.as_nanos() as u64;
        // Stuck jobs are looked for now and then, not at every result (a batch has hundreds).
        let check_every = self.slow_after / 4;
        let mut next_check = Instant::now() + check_every;
        while !waiting.is_empty() {
            tokio::select! {
                done = self.done_rx.recv() => match done {
                    Some(done) if done.batch == Some(id) && waiting.remove(&done.index).is_some() => {
                        fresh.insert(done.index, done.late.fresh);
                    }
                    Some(done) => late.push(done),
                    None => break,
                },
                _ = tokio::time::sleep_until(next_check.into()) => {}
            }
            if Instant::now() < next_check {
                continue;
            }
            next_check = Instant::now() + check_every;
            let now_nanos = nanos_since(self.epoch) + 1;
            let pool = &self.pool;
            let mut slow_lanes: HashMap<LaneKey, bool> = HashMap::new();
            waiting.retain(|i, (lane, started)| {
                let started = started.load(AtomicOrdering::Relaxed);
                let stuck = if started == 0 {
                    *slow_lanes
                        .entry(lane.clone())
                        .or_insert_with(|| pool.is_slow(lane))
                } else {
                    now_nanos.saturating_sub(started) >= slow_nanos
                };
                if stuck {
                    deferred.insert(*i);
                }
                !stuck
            });
        }
        let mut state = self.lock();
        let mut processed = state.fold(
            &batch,
            work,
            binding,
            interpreters,
            &prints,
            fresh,
            &deferred,
            now,
        );
        processed.deferred = deferred.len();
        processed.late = late.len();
        processed.reevaluated = late.iter().filter(|d| d.batch.is_none()).count();
        for done in late {
            state.fold_late(done.late, now, &mut processed);
        }
        processed
    }

    /// Folds in `first` and every other interpretation that has come.
    pub fn late(&mut self, first: Done, now: &Time) -> Processed {
        let mut processed = Processed::default();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = Some(first);
        while let Some(done) = next {
            processed.late += 1;
            processed.reevaluated += usize::from(done.batch.is_none());
            state.fold_late(done.late, now, &mut processed);
            next = self.done_rx.try_recv().ok();
        }
        processed.dirty.sort();
        processed
    }

    /// The customizations changed to `current`: the last object of every binding and cluster
    /// whose kind's customizations changed is interpreted again, in the background (after the
    /// live reports of every lane). Returns how many.
    pub fn interpreters_changed(&mut self, current: Arc<Interpreters>) -> usize {
        let changed: HashSet<LaneKey> = current
            .changed_kinds(&self.known)
            .iter()
            .map(lane_of_kind)
            .collect();
        for lane in &changed {
            self.pool.forget(lane);
        }
        let jobs = self
            .lock()
            .reinterpretations(self.known.generation(), &current, &changed);
        let count = jobs.len();
        for job in jobs {
            let (interpreters, tx) = (current.clone(), self.done_tx.clone());
            let lane = job.lane.clone();
            let vouched = !current.customizes(&lane);
            self.pool
                .submit(lane, Priority::Background, vouched, move || {
                    let fresh =
                        Fresh::new(Interpreted::run(&job.observed, job.print, &interpreters));
                    let _ = tx.send(Done {
                        batch: None,
                        index: 0,
                        late: Late {
                            key: job.key,
                            binding_uid: job.binding_uid,
                            cluster: job.cluster,
                            fresh,
                        },
                    });
                });
        }
        self.known = current;
        count
    }

    /// The next interpretation that comes (for [`Engine::late`]).
    pub async fn next_done(&mut self) -> Option<Done> {
        self.done_rx.recv().await
    }
}

pub(super) fn nanos_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1)
}

/// Runs the processor until the intake closes: a thread folds batches in (with the
/// interpretations done on the lanes' threads), a task writes the dirty bindings, another posts
/// the interpreter failures as Events. Returns the shared state (for tests and the template
/// aggregation).
pub fn run(mut intake: StatusReceiver, deps: ProcessorDeps) -> SharedState {
    let state: SharedState = Arc::new(Mutex::new(StatusState::default()));
    let (dirty_tx, dirty_rx) = mpsc::unbounded_channel::<WorkKey>();
    let (notices_tx, notices_rx) = mpsc::unbounded_channel::<FailureNotice>();
    let again = dirty_tx.clone();
    let bindings = deps.bindings.clone();
    let work = deps.work.clone();
    let interpreters = deps.interpreters.clone();
    let metrics = deps.metrics.clone();
    let outputs = Outputs {
        metrics: deps.metrics.clone(),
        transitions: deps.transitions.clone(),
        dirty: dirty_tx,
        notices: notices_tx,
        handoff: deps.handoff.clone(),
    };
    let full_reports = deps.full_reports.clone();
    let threads = interpret_threads();
    let mut engine = Engine::new(
        state.clone(),
        Arc::new(Pool::new(threads, crate::interpreters::lanes::SLOW_AFTER)),
        interpreters.current(),
        crate::interpreters::lanes::SLOW_AFTER,
    );
    let spawned = std::thread::Builder::new()
        .name("status-processor".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the status processor's runtime");
                    return;
                }
            };
            runtime.block_on(async move {
                let mut changes = interpreters.subscribe();
                loop {
                    // Reports first: a burst of re-evaluations never holds them back.
                    let wake = tokio::select! {
                        biased;
                        submission = intake.recv() => Wake::Batch(submission),
                        Some(done) = engine.next_done() => Wake::Done(Box::new(done)),
                        Ok(()) = changes.changed() => Wake::Changed,
                    };
                    let now = Time(k8s_openapi::jiff::Timestamp::now());
                    match wake {
                        Wake::Batch(None) => return,
                        Wake::Batch(Some(submission)) => {
                            let started = Instant::now();
                            let current = interpreters.current();
                            let batch = Arc::new(submission.batch);
                            let mut processed = engine
                                .batch(
                                    batch.clone(),
                                    &work,
                                    |key| {
                                        bindings.get(&ObjectRef::new(&key.name).within(&key.namespace))
                                    },
                                    &current,
                                    &now,
                                )
                                .await;
                            metrics
                                .items
                                .with_label_values(&["accepted"])
                                .inc_by(processed.response.accepted as u64);
                            metrics
                                .items
                                .with_label_values(&["rejected"])
                                .inc_by(processed.response.rejected.len() as u64);
                            metrics
                                .batch_seconds
                                .observe(started.elapsed().as_secs_f64());
                            let response = std::mem::take(&mut processed.response);
                            let displaced = outputs.publish(&mut processed);
                            if batch.report.full
                                && let Some(tx) = &full_reports
                            {
                                let _ = tx.send(batch.cluster.clone());
                            }
                            let _ = submission.reply.send(response);
                            free_in_parallel(displaced, threads);
                        }
                        Wake::Done(done) => {
                            let mut processed = engine.late(*done, &now);
                            let displaced = outputs.publish(&mut processed);
                            free_in_parallel(displaced, threads);
                        }
                        Wake::Changed => {
                            let current = interpreters.current();
                            let generation = current.generation();
                            let count = engine.interpreters_changed(current);
                            metrics.reinterpretations.inc_by(count as u64);
                            tracing::info!(
                                generation,
                                objects = count,
                                "customizations changed: re-interpreting the last objects of the kinds they changed"
                            );
                        }
                    }
                }
            });
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the status processor thread");
    }
    tokio::spawn(
        crate::interpreters::events::run(
            deps.client.clone(),
            notices_rx,
            deps.metrics.events_dropped.clone(),
        )
        .in_current_span(),
    );
    tokio::spawn(write_dirty(dirty_rx, again, state.clone(), deps).in_current_span());
    state
}

impl Outputs {
    /// Hands on the transitions, dirty bindings, failures and costs of `processed`; returns
    /// what it displaced, to free.
    pub(super) fn publish(&self, processed: &mut Processed) -> Vec<serde_json::Value> {
        let metrics = &self.metrics;
        metrics.deferred.inc_by(processed.deferred as u64);
        for cost in processed.costs.drain(..) {
            let labels = [cost.customization.as_str(), cost.operation.name()];
            metrics
                .interpreter_seconds
                .with_label_values(&labels)
                .inc_by(cost.seconds);
            metrics
                .interpreter_evaluations
                .with_label_values(&[labels[0], labels[1], cost.outcome.as_str()])
                .inc();
        }
        for t in processed.transitions.drain(..) {
            tracing::debug!(target: stages::TARGET, stage = stages::HEALTH_DECIDED,
                cluster = %t.cluster, work = %t.key, health = t.to.as_str());
            metrics
                .health_transitions
                .with_label_values(&[t.to.as_str()])
                .inc();
            if let Some(tx) = &self.transitions {
                let _ = tx.send(t);
            }
        }
        for key in processed.dirty.drain(..) {
            // The binder first (it decides on these items now), then the write.
            if let Some(handoff) = &self.handoff {
                handoff.status_changed(&key);
            }
            let _ = self.dirty.send(key);
        }
        for notice in processed.failures.drain(..) {
            let _ = self.notices.send(notice);
        }
        std::mem::take(&mut processed.displaced)
    }
}
