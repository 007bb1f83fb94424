//! The batched ledger writer: the hub's loops hand events to a bounded queue and go on; one task
//! writes whatever has queued up since its last write in one transaction.
//!
//! Full queue: [`LedgerWriter::record`] waits up to `enqueue_timeout` for room, then drops the
//! event, counts it (`lifeboat_ledger_events_dropped_total{reason="queue_full"}`), logs an error
//! and returns [`LedgerError::QueueFull`]. The ledger is the audit timeline, not the source of
//! truth (the Kubernetes objects are): a slow or unreachable database must not stall failover,
//! and what it costs is counted and logged, never silent.
//!
//! Write errors: a batch is retried (`write_attempts`, backoff doubling from `retry_backoff`),
//! then dropped and counted (`reason="write_error"`); [`LedgerWriter::flush`] and
//! [`LedgerWriterTask::shutdown`] report it as [`LedgerError::EventsLost`]. A retry after a commit
//! whose acknowledgement was lost can record a batch twice: duplicates over losses.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::error::{SendTimeoutError, TrySendError};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::error::LedgerError;
use super::event::LedgerEvent;
use super::metrics::{DROP_CLOSED, DROP_QUEUE_FULL, DROP_WRITE_ERROR, LedgerMetrics};
use super::store::Ledger;

#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// Events the queue holds before `record` has to wait.
    pub capacity: usize,
    /// Most events written in one transaction.
    pub max_batch: usize,
    /// How long `record` waits for room in a full queue before it drops the event.
    pub enqueue_timeout: Duration,
    /// Tries per batch before it is dropped (at least 1).
    pub write_attempts: u32,
    /// Pause before the second try, doubled before each further one.
    pub retry_backoff: Duration,
}

impl Default for WriterConfig {
    fn default() -> Self {
        Self {
            capacity: 65_536,
            max_batch: 1_024,
            enqueue_timeout: Duration::from_millis(100),
            write_attempts: 3,
            retry_backoff: Duration::from_millis(100),
        }
    }
}

// Events are nearly every message: boxing them would cost an allocation each.
#[allow(clippy::large_enum_variant)]
enum Command {
    Event(LedgerEvent),
    Flush(oneshot::Sender<Result<(), LedgerError>>),
}

/// The sending side: cheap to clone, one per loop that records events.
#[derive(Clone)]
pub struct LedgerWriter {
    tx: mpsc::Sender<Command>,
    metrics: LedgerMetrics,
    capacity: usize,
    enqueue_timeout: Duration,
    drop_log: Arc<RateLimit>,
}

/// The writer task; [`LedgerWriterTask::shutdown`] stops it after writing everything queued.
/// Dropping it instead leaves the task running until every [`LedgerWriter`] is dropped.
pub struct LedgerWriterTask {
    handle: JoinHandle<Result<(), LedgerError>>,
    shutdown: oneshot::Sender<()>,
}

impl LedgerWriter {
    /// Starts the writer task on the current tokio runtime.
    pub fn spawn(
        ledger: Ledger,
        metrics: LedgerMetrics,
        config: WriterConfig,
    ) -> (LedgerWriter, LedgerWriterTask) {
        let capacity = config.capacity.max(1);
        let (tx, rx) = mpsc::channel(capacity);
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        let task = Task {
            ledger,
            metrics: metrics.clone(),
            max_batch: config.max_batch.max(1),
            write_attempts: config.write_attempts.max(1),
            retry_backoff: config.retry_backoff,
            lost: 0,
            last_error: None,
        };
        let handle = tokio::spawn(task.run(rx, shutdown_rx));
        let writer = LedgerWriter {
            tx,
            metrics,
            capacity,
            enqueue_timeout: config.enqueue_timeout,
            drop_log: Arc::new(RateLimit::new(Duration::from_secs(1))),
        };
        (
            writer,
            LedgerWriterTask {
                handle,
                shutdown: shutdown_tx,
            },
        )
    }

    /// Queues `event` for writing. Returns at once while the queue has room; when it is full,
    /// waits up to `enqueue_timeout`, then drops the event (counted, logged, `QueueFull`).
    pub async fn record(&self, event: LedgerEvent) -> Result<(), LedgerError> {
        let kind = event.kind;
        let command = match self.tx.try_send(Command::Event(event)) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Closed(_)) => return Err(self.closed()),
            Err(TrySendError::Full(command)) => command,
        };
        if self.drop_log.allow() {
            tracing::warn!(
                capacity = self.capacity,
                "ledger writer queue full: the database is not keeping up; waiting up to {:?}",
                self.enqueue_timeout
            );
        }
        match self.tx.send_timeout(command, self.enqueue_timeout).await {
            Ok(()) => Ok(()),
            Err(SendTimeoutError::Closed(_)) => Err(self.closed()),
            Err(SendTimeoutError::Timeout(_)) => Err(self.queue_full(kind)),
        }
    }

    /// Queues `event` without waiting: a full queue drops it (counted, logged, `QueueFull`).
    pub fn try_record(&self, event: LedgerEvent) -> Result<(), LedgerError> {
        let kind = event.kind;
        match self.tx.try_send(Command::Event(event)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Closed(_)) => Err(self.closed()),
            Err(TrySendError::Full(_)) => Err(self.queue_full(kind)),
        }
    }

    /// Waits until every event queued before this call is written (or dropped). Returns
    /// `EventsLost` if events were dropped after failed writes since the previous flush.
    pub async fn flush(&self) -> Result<(), LedgerError> {
        let (reply, done) = oneshot::channel();
        self.tx
            .send(Command::Flush(reply))
            .await
            .map_err(|_| LedgerError::WriterClosed)?;
        done.await.map_err(|_| LedgerError::WriterClosed)?
    }

    fn closed(&self) -> LedgerError {
        self.metrics.drop_events(DROP_CLOSED, 1);
        LedgerError::WriterClosed
    }

    fn queue_full(&self, kind: super::EventKind) -> LedgerError {
        self.metrics.drop_events(DROP_QUEUE_FULL, 1);
        let error = LedgerError::QueueFull {
            capacity: self.capacity,
            kind,
        };
        if self.drop_log.allow() {
            let dropped = self
                .metrics
                .dropped
                .with_label_values(&[DROP_QUEUE_FULL])
                .get();
            tracing::error!(dropped_so_far = dropped, "{error}");
        }
        error
    }
}

impl LedgerWriterTask {
    /// Stops accepting events, writes everything already queued, and waits for the task.
    /// Returns `EventsLost` if events were dropped after failed writes since the last flush.
    pub async fn shutdown(self) -> Result<(), LedgerError> {
        // The task may already have ended (every sender dropped): nothing to signal then.
        let _ = self.shutdown.send(());
        self.handle
            .await
            .map_err(|e| LedgerError::WriterFailed(e.to_string()))?
    }
}

struct Task {
    ledger: Ledger,
    metrics: LedgerMetrics,
    max_batch: usize,
    write_attempts: u32,
    retry_backoff: Duration,
    /// Events dropped after failed writes since the last flush or shutdown report.
    lost: u64,
    last_error: Option<String>,
}

impl Task {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Command>,
        mut shutdown: oneshot::Receiver<()>,
    ) -> Result<(), LedgerError> {
        let mut commands = Vec::with_capacity(self.max_batch);
        let mut events = Vec::with_capacity(self.max_batch);
        let mut flushes = Vec::new();
        let mut shutdown_pending = true;
        loop {
            let received = tokio::select! {
                signal = &mut shutdown, if shutdown_pending => {
                    shutdown_pending = false;
                    if signal.is_ok() {
                        // No new events; what is queued is still received below.
                        rx.close();
                    }
                    continue;
                }
                n = rx.recv_many(&mut commands, self.max_batch) => n,
            };
            if received == 0 {
                break; // closed and drained
            }
            self.metrics.queue_depth.set(rx.len() as i64);
            for command in commands.drain(..) {
                match command {
                    Command::Event(event) => events.push(event),
                    Command::Flush(reply) => flushes.push(reply),
                }
            }
            if !events.is_empty() {
                self.write(&events).await;
                events.clear();
            }
            for reply in flushes.drain(..) {
                // The flusher may have given up waiting; nobody to tell then.
                let _ = reply.send(self.report());
            }
        }
        self.metrics.queue_depth.set(0);
        self.report()
    }

    async fn write(&mut self, events: &[LedgerEvent]) {
        let mut backoff = self.retry_backoff;
        for attempt in 1..=self.write_attempts {
            let started = Instant::now();
            let result = self.ledger.append(events).await;
            self.metrics
                .write_duration
                .observe(started.elapsed().as_secs_f64());
            match result {
                Ok(()) => {
                    self.metrics.write_ok(events.iter().map(|e| e.kind));
                    return;
                }
                Err(error) => {
                    self.metrics.write_error();
                    if attempt < self.write_attempts {
                        tracing::warn!(
                            attempt,
                            attempts = self.write_attempts,
                            events = events.len(),
                            "ledger write failed, retrying in {backoff:?}: {error}"
                        );
                        tokio::time::sleep(backoff).await;
                        backoff = backoff.saturating_mul(2);
                    } else {
                        tracing::error!(
                            attempts = self.write_attempts,
                            events = events.len(),
                            "ledger write failed, events dropped: {error}"
                        );
                        let count = events.len() as u64;
                        self.metrics.drop_events(DROP_WRITE_ERROR, count);
                        self.lost += count;
                        self.last_error = Some(error.to_string());
                    }
                }
            }
        }
    }

    /// What was lost since the last report, and a fresh start.
    fn report(&mut self) -> Result<(), LedgerError> {
        if self.lost == 0 {
            return Ok(());
        }
        let lost = std::mem::take(&mut self.lost);
        let last_error = self.last_error.take().unwrap_or_default();
        Err(LedgerError::EventsLost { lost, last_error })
    }
}

/// Lets one log line through per `interval` (a full queue would otherwise log once per event).
struct RateLimit {
    origin: Instant,
    interval_ms: u64,
    /// Milliseconds after `origin` when the next line may go out.
    next_ms: AtomicU64,
}

impl RateLimit {
    fn new(interval: Duration) -> Self {
        Self {
            origin: Instant::now(),
            interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
            next_ms: AtomicU64::new(0),
        }
    }

    fn allow(&self) -> bool {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_ms.load(Ordering::Relaxed);
        now >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now.saturating_add(self.interval_ms),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limit_lets_one_line_through_per_interval() {
        let limit = RateLimit::new(Duration::from_secs(3600));
        assert!(limit.allow());
        assert!(!limit.allow());
        assert!(!limit.allow());
        let open = RateLimit::new(Duration::ZERO);
        assert!(open.allow());
        assert!(open.allow());
    }
}
