//! One binder pass over a template: fetch (template, policies, binding, clusters from the
//! caches) → plan ([`plan`]) → write the binding's spec → dispatch → report; the workers that run
//! the passes.

use super::*;

impl Binder {
    /// Runs `workers` reconcile loops until the queue is closed. A reconcile's report of what
    /// it wrote (the binding's conditions, Events, the ledger: [`Report`]) runs after the spec
    /// write and the dispatch, off the worker, so a burst of failovers waits on one binding
    /// write each; the key stays busy until its report is done (the next reconcile of that
    /// binding comes after it), and at most `workers` reports run at once, the others queue.
    /// (Fewer at once were tried for the bursts at the hub, BENCHMARKS.md: a binding's key stays busy
    /// until its report is done, so a new failure of a binding whose report waited was decided
    /// late.)
    pub async fn run_workers(self: Arc<Self>, workers: usize) {
        let reports = Arc::new(tokio::sync::Semaphore::new(workers.max(1)));
        let mut handles = Vec::new();
        for _ in 0..workers.max(1) {
            let binder = self.clone();
            let reports = reports.clone();
            handles.push(tokio::spawn(async move {
                while let Some(key) = binder.queue.next().await {
                    // The processor's status writes held for this decision end with it.
                    let held = binder
                        .handoff
                        .as_ref()
                        .zip(work_key_of(&key))
                        .map(|(handoff, work)| (handoff.deciding(&work), work));
                    // `clusters` is filled once the pass knows the placement.
                    let span = tracing::info_span!(
                        "bind",
                        template = %key,
                        clusters = tracing::field::Empty
                    );
                    let result = binder.reconcile(&key).instrument(span.clone()).await;
                    if let (Some(handoff), Some((seen, work))) = (&binder.handoff, &held) {
                        handoff.done(work, *seen);
                    }
                    let (outcome, report) = match result {
                        Ok(Reconciled { outcome, report }) => (Ok(outcome), report),
                        Err(e) => (Err(e), None),
                    };
                    let Some(report) = report else {
                        binder.settle(&key, outcome, &span);
                        continue;
                    };
                    // The worker goes on to the next decision at once; reports queue for a
                    // permit (a burst's spec writes come before its reports).
                    let (binder, reports) = (binder.clone(), reports.clone());
                    tokio::spawn(async move {
                        let reported = match reports.acquire_owned().await {
                            Ok(_permit) => {
                                let started = Instant::now();
                                let reported = binder.report(report).instrument(span.clone()).await;
                                binder.observe_stage("report", started.elapsed());
                                reported
                            }
                            Err(_) => Ok(()),
                        };
                        binder.settle(&key, reported.and(outcome), &span);
                    });
                }
            }));
        }
        for h in handles {
            let _ = h.await;
        }
    }

    pub(super) fn observe_stage(&self, stage: &str, took: Duration) {
        self.metrics
            .stage_seconds
            .with_label_values(&[stage])
            .observe(took.as_secs_f64());
    }

    /// Counts a reconcile, queues it again as its outcome says, and frees its key.
    pub(super) fn settle(
        &self,
        key: &TemplateKey,
        result: Result<Outcome, BindError>,
        span: &tracing::Span,
    ) {
        let label = match &result {
            Ok(_) => "ok",
            Err(e) => e.metric_label(),
        };
        self.metrics.reconciles.with_label_values(&[label]).inc();
        match result {
            Ok(Outcome::Done) => {}
            Ok(Outcome::RetryAfter(d)) => self.queue.add_after(key.clone(), d),
            Err(BindError::Conflict) => {
                self.queue.add_after(key.clone(), Duration::from_millis(50))
            }
            Err(e) => {
                span.in_scope(|| tracing::warn!(error = %e, "binding failed; retrying"));
                self.queue.add_after(key.clone(), Duration::from_secs(5));
            }
        }
        self.queue.done(key);
    }

    /// Reports a pass whose spec is written and dispatched: the binding's conditions, fences
    /// asked for, confirmations pruned, and the ledger, Events and metrics.
    pub(super) async fn report(&self, report: Report) -> Result<(), BindError> {
        let Report {
            binding,
            before,
            scheduling,
            policy,
            blocked,
            resets,
            evicted,
            settled,
            template,
            now,
        } = report;
        // The fence first: it is what a Directly failover waits for, the conditions are not.
        self.ask_for_fences(&binding, &blocked);
        self.apply_status(&binding, scheduling.as_ref(), Some(&policy), &blocked, &now)
            .await?;
        self.prune_confirmations(&binding).await?;
        if let Some(recorder) = &self.recorder {
            recorder
                .record(PassRecord {
                    before: before.as_deref(),
                    after: &binding,
                    evicted: &evicted,
                    resets: &resets,
                    settled: &settled,
                    blocked: &blocked,
                    template,
                    now: &now,
                })
                .await;
        }
        Ok(())
    }

    /// Decides and applies one template's binding: the spec written and the work dispatched;
    /// the report of the pass is left to the caller ([`Binder::report`]).
    pub async fn reconcile(&self, key: &TemplateKey) -> Result<Reconciled, BindError> {
        let Some(kind) = key.template_kind() else {
            return Ok(Outcome::Done.into());
        };
        let binding_name = api_binding::binding_name(&key.name, kind.kind);
        let existing = self
            .caches
            .binding(&key.namespace, &binding_name)
            .map(|b| self.with_newest_status(b));
        let Some(template) = self.caches.templates.get(key) else {
            // Gone: the garbage collector deletes the binding (it is owned by the template),
            // and the binding's deletion takes the work off the members.
            self.forget_template(key);
            return Ok(Outcome::Done.into());
        };
        if template.metadata.deletion_timestamp.is_some() {
            self.forget_template(key);
            return Ok(Outcome::Done.into());
        }
        let started = Instant::now();
        let read = self.read_template(key, &template)?;
        let template_json = &*read.json;
        let mut template_time = started.elapsed();
        if !self.is_deciding() {
            // Recovering: the agents get their work back as the bindings say; nothing is
            // decided on a status that may predate the restart.
            if let Some(binding) = &existing {
                self.dispatch(binding, template_json)?;
            }
            return Ok(Outcome::Done.into());
        }
        let labels = template.labels().clone();
        let meta = TemplateMeta {
            api_version: &kind.api_version(),
            kind: kind.kind,
            namespace: &key.namespace,
            name: &key.name,
            labels: &labels,
        };
        let policies = self.policies();
        let chosen = detector::select_policy(policies.iter(), &meta);
        let Some(policy) = chosen else {
            if let Some(binding) = existing {
                self.unbound(&binding, &policies).await?;
                self.dispatch(&binding, template_json)?;
            }
            return Ok(Outcome::Done.into());
        };
        let started = Instant::now();
        let replicas = self.replicas_of(&read)?;
        template_time += started.elapsed();
        self.observe_stage("template", template_time);
        let started = Instant::now();
        let uid = template.metadata.uid.clone().unwrap_or_default();
        let mut desired = detector::binding_spec(kind, &meta, &uid, "", policy, replicas);
        // (Fields the failover phase owns are carried over from the current binding.)
        if let Some(current) = &existing {
            desired.clusters = current.spec.clusters.clone();
            desired.graceful_eviction_tasks = current.spec.graceful_eviction_tasks.clone();
            desired.eviction_history = current.spec.eviction_history.clone();
            desired.in_place_resets = current.spec.in_place_resets.clone();
            desired.reschedule_triggered_at = current.spec.reschedule_triggered_at.clone();
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let clusters = self.caches.clusters.state();
        let mut candidate = ResourceBinding::new(&binding_name, desired);
        candidate.metadata.namespace = Some(key.namespace.clone());
        let inputs = PlanInputs {
            clusters: &clusters,
            placer: self.placer.as_ref(),
            cluster_evictions: &self.cluster_evictions,
            now: &now,
            instant: Instant::now(),
            scheduling_seconds: Some(&self.metrics.scheduling_seconds),
        };
        let planned = plan(existing.as_deref(), candidate, &inputs);
        let Planned {
            spec: desired,
            scheduling,
            mut blocked,
            resets,
            mut retry,
            evicted,
            settled,
        } = planned;
        self.observe_stage("decide", started.elapsed());
        let started = Instant::now();
        let binding = self
            .apply_spec(
                kind,
                &template,
                existing.as_deref(),
                &binding_name,
                desired,
                policy,
            )
            .await?;
        self.observe_stage("spec_write", started.elapsed());
        if let Some(seen) = &existing {
            // What this pass decided on, at the generation it wrote.
            let mut view = (**seen).clone();
            view.metadata.generation = binding.metadata.generation;
            self.decided
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(dispatch::work_key(&binding), decision_view(&view));
        }
        let placed: Vec<&str> = binding
            .spec
            .clusters
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        tracing::Span::current().record("clusters", tracing::field::display(placed.join(",")));
        for eviction in &evicted {
            tracing::debug!(target: stages::TARGET, stage = stages::EVICTION_WRITTEN,
                cluster = %eviction.cluster, work = %dispatch::work_key(&binding), reason = eviction.reason);
        }
        // The spec (placement, eviction) is written: dispatch before the status write, which
        // only reports the pass (conditions) and is not an input of the work.
        let started = Instant::now();
        self.dispatch(&binding, template_json)?;
        self.observe_stage("dispatch", started.elapsed());
        // What the written binding waits for is decided on it, here (the echo of this write is
        // not looked at again, nor is the template's status echo): a Directly eviction's block
        // (reported, and its fence asked for, by this pass), an in-place reset's deadline (the
        // pass that writes a reset must wake at its timeout). Should the written binding have
        // more to decide, one more pass follows at once.
        let mut again = false;
        let wrote =
            existing.as_ref().map(|e| e.metadata.generation) != Some(binding.metadata.generation);
        if wrote {
            match after_write(&self.with_newest_status(binding.clone()), &inputs) {
                Some(after) => {
                    blocked.retain(|b| b.reason == phase::REASON_NO_OTHER_CLUSTER);
                    blocked.extend(after.blocked);
                    retry = match (retry, after.look_again) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                None => again = true,
            }
        }
        Ok(Reconciled {
            outcome: match retry {
                _ if again => Outcome::RetryAfter(Duration::ZERO),
                Some(after) => Outcome::RetryAfter(after),
                None => Outcome::Done,
            },
            report: Some(Report {
                binding,
                before: existing,
                scheduling,
                policy: policy.clone(),
                blocked,
                resets,
                evicted,
                settled,
                template: self.caches.templates.object_ref(key),
                now,
            }),
        })
    }

    /// The template serialised, from the last pass's read while its resourceVersion and the
    /// interpreters are unchanged.
    pub(super) fn read_template(
        &self,
        key: &TemplateKey,
        template: &DynamicObject,
    ) -> Result<Arc<TemplateRead>, BindError> {
        let interpreters = self.interpreters.current();
        let resource_version = template.metadata.resource_version.clone();
        let cached = self
            .template_reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned();
        if let Some(read) = cached
            && Some(&read.resource_version) == resource_version.as_ref()
            && Arc::ptr_eq(&read.interpreters, &interpreters)
        {
            return Ok(read);
        }
        let json = serde_json::to_value(template).map_err(|source| BindError::Serialization {
            what: "template",
            source,
        })?;
        let read = Arc::new(TemplateRead {
            resource_version: resource_version.clone().unwrap_or_default(),
            interpreters,
            json: Arc::new(json),
            replicas: Mutex::new(None),
        });
        let mut reads = self
            .template_reads
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match resource_version {
            Some(_) => reads.insert(key.clone(), read.clone()),
            None => reads.remove(key),
        };
        Ok(read)
    }

    pub(super) fn forget_template(&self, key: &TemplateKey) {
        self.template_reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// What the replica scripts say of the template read, run once per read.
    pub(super) fn replicas_of(&self, read: &TemplateRead) -> Result<Replicas, BindError> {
        let mut cached = read.replicas.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(replicas) = &*cached {
            return Ok(replicas.clone());
        }
        let replicas = replicas(&read.interpreters, &read.json)?;
        *cached = Some(replicas.clone());
        Ok(replicas)
    }
}

/// What the interpreter's replica scripts say of a template.
pub(super) fn replicas(
    interpreters: &crate::interpreters::Interpreters,
    template: &Value,
) -> Result<Replicas, BindError> {
    let mut replicas = Replicas::default();
    if let Some(r) = interpreters
        .get_replicas(template)
        .map_err(|e| BindError::Interpret(e.to_string()))?
    {
        replicas.replicas = r.replica;
        if let Some(requires) = r.requires {
            replicas.requirements = Some(convert(&requires, "replica requirements")?);
        }
    }
    if let Some(Some(components)) = interpreters
        .get_components(template)
        .map_err(|e| BindError::Interpret(e.to_string()))?
    {
        replicas.components = convert(&components, "components")?;
    }
    Ok(replicas)
}
