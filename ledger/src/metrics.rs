//! Prometheus metrics of the ledger writer. Labels stay low-cardinality: result, kind, reason.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use super::event::EventKind;

/// Why events were not recorded (label `reason` of `lifeboat_ledger_events_dropped_total`).
pub(crate) const DROP_QUEUE_FULL: &str = "queue_full";
pub(crate) const DROP_WRITE_ERROR: &str = "write_error";
pub(crate) const DROP_CLOSED: &str = "writer_closed";

#[derive(Clone)]
pub struct LedgerMetrics {
    /// Batch writes (transactions) by result: `ok`, `error` (each failed attempt counts).
    pub writes: IntCounterVec,
    /// Time of one batch write (one transaction), successful or not.
    pub write_duration: Histogram,
    /// Events per successful batch write.
    pub batch_events: Histogram,
    /// Events accepted by the writer and not yet written.
    pub queue_depth: IntGauge,
    /// Events written, by kind.
    pub events: IntCounterVec,
    /// Events not recorded, by reason: `queue_full`, `write_error`, `writer_closed`.
    pub dropped: IntCounterVec,
    writes_ok: IntCounter,
    writes_error: IntCounter,
    events_by_kind: [IntCounter; EventKind::ALL.len()],
}

impl LedgerMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let writes = IntCounterVec::new(
            Opts::new(
                "lifeboat_ledger_writes_total",
                "Ledger batch writes (transactions), by result",
            ),
            &["result"],
        )?;
        let write_duration = Histogram::with_opts(
            HistogramOpts::new(
                "lifeboat_ledger_write_duration_seconds",
                "Time of one ledger batch write (one transaction)",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
        )?;
        let batch_events = Histogram::with_opts(
            HistogramOpts::new(
                "lifeboat_ledger_batch_events",
                "Events per successful ledger batch write",
            )
            .buckets(vec![1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0]),
        )?;
        let queue_depth = IntGauge::new(
            "lifeboat_ledger_queue_depth",
            "Ledger events accepted by the writer and not yet written",
        )?;
        let events = IntCounterVec::new(
            Opts::new(
                "lifeboat_ledger_events_total",
                "Ledger events written, by kind",
            ),
            &["kind"],
        )?;
        let dropped = IntCounterVec::new(
            Opts::new(
                "lifeboat_ledger_events_dropped_total",
                "Ledger events not recorded, by reason",
            ),
            &["reason"],
        )?;
        registry.register(Box::new(writes.clone()))?;
        registry.register(Box::new(write_duration.clone()))?;
        registry.register(Box::new(batch_events.clone()))?;
        registry.register(Box::new(queue_depth.clone()))?;
        registry.register(Box::new(events.clone()))?;
        registry.register(Box::new(dropped.clone()))?;
        // Every series exists from the start (a dashboard shows 0, not "no data").
        for reason in [DROP_QUEUE_FULL, DROP_WRITE_ERROR, DROP_CLOSED] {
            dropped.with_label_values(&[reason]);
        }
        Ok(Self {
            writes_ok: writes.with_label_values(&["ok"]),
            writes_error: writes.with_label_values(&["error"]),
            events_by_kind: EventKind::ALL.map(|kind| events.with_label_values(&[kind.as_str()])),
            writes,
            write_duration,
            batch_events,
            queue_depth,
            events,
            dropped,
        })
    }

    pub(crate) fn write_ok(&self, kinds: impl Iterator<Item = EventKind>) {
        self.writes_ok.inc();
        let mut counts = [0_u64; EventKind::ALL.len()];
        let mut total = 0;
        for kind in kinds {
            counts[kind.index()] += 1;
            total += 1;
        }
        for (counter, count) in self.events_by_kind.iter().zip(counts) {
            if count > 0 {
                counter.inc_by(count);
            }
        }
        self.batch_events.observe(f64::from(total));
    }

    pub(crate) fn write_error(&self) {
        self.writes_error.inc();
    }

    pub(crate) fn drop_events(&self, reason: &str, count: u64) {
        self.dropped.with_label_values(&[reason]).inc_by(count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Encoder;

    #[test]
    fn metrics_register_and_render() {
        let registry = Registry::new();
        let m = LedgerMetrics::new(&registry).unwrap();
        m.write_ok(
            [
                EventKind::Dispatch,
                EventKind::Dispatch,
                EventKind::Decision,
            ]
            .into_iter(),
        );
        m.write_error();
        m.drop_events(DROP_QUEUE_FULL, 2);
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        for line in [
            "lifeboat_ledger_writes_total{result=\"ok\"} 1",
            "lifeboat_ledger_writes_total{result=\"error\"} 1",
            "lifeboat_ledger_events_total{kind=\"Dispatch\"} 2",
            "lifeboat_ledger_events_total{kind=\"Decision\"} 1",
            "lifeboat_ledger_events_total{kind=\"Placement\"} 0",
            "lifeboat_ledger_events_dropped_total{reason=\"queue_full\"} 2",
            "lifeboat_ledger_events_dropped_total{reason=\"write_error\"} 0",
            "lifeboat_ledger_batch_events_sum 3",
            "lifeboat_ledger_queue_depth 0",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(LedgerMetrics::new(&registry).is_err(), "registered twice");
    }
}
