//! The seam between the agent API and the status processor: the API hands each authenticated
//! batch of status reports over a bounded channel and waits for the per-item verdict (taken, or
//! rejected with why: not assigned to this cluster, another binding UID, stale).

use lifeboat_api::binding::GoneConfirmedBy;
use lifeboat_api::protocol::{StatusReport, StatusResponse};
use tokio::sync::{mpsc, oneshot};

/// One authenticated batch: the cluster is the one the agent's credential names.
#[derive(Debug, Clone)]
pub struct StatusBatch {
    pub cluster: String,
    pub report: StatusReport,
    /// Who stands behind the batch's gone reports: the cluster's agent, or the hub's own fence
    /// ([`crate::failover::fencer`]), which saw the copy gone through the member's kube-apiserver.
    pub gone_confirmed_by: GoneConfirmedBy,
}

impl StatusBatch {
    /// A batch from the cluster's agent.
    pub fn from_agent(cluster: String, report: StatusReport) -> StatusBatch {
        StatusBatch {
            cluster,
            report,
            gone_confirmed_by: GoneConfirmedBy::Agent,
        }
    }
}

/// A batch waiting for its verdict.
#[derive(Debug)]
pub struct Submission {
    pub batch: StatusBatch,
    pub reply: oneshot::Sender<StatusResponse>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IntakeError {
    /// The processor is not running (shutting down, or this hub is not the leader).
    #[error("the status processor is not running")]
    Closed,
}

/// The sending half, held by the agent API.
#[derive(Debug, Clone)]
pub struct StatusIntake {
    tx: mpsc::Sender<Submission>,
}

/// The receiving half, held by the status processor.
#[derive(Debug)]
pub struct StatusReceiver {
    rx: mpsc::Receiver<Submission>,
}

/// A bounded intake: a full channel makes agents wait (backpressure), it never drops reports.
pub fn channel(capacity: usize) -> (StatusIntake, StatusReceiver) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    (StatusIntake { tx }, StatusReceiver { rx })
}

impl StatusIntake {
    /// Hands `batch` to the processor and waits for its verdict.
    pub async fn submit(&self, batch: StatusBatch) -> Result<StatusResponse, IntakeError> {
        let (reply, verdict) = oneshot::channel();
        self.tx
            .send(Submission { batch, reply })
            .await
            .map_err(|_| IntakeError::Closed)?;
        verdict.await.map_err(|_| IntakeError::Closed)
    }
}

impl StatusReceiver {
    /// The next batch, or `None` once every sender is gone.
    pub async fn recv(&mut self) -> Option<Submission> {
        self.rx.recv().await
    }

    /// The next batch, blocking the calling thread (for a processor on its own thread).
    pub fn blocking_recv(&mut self) -> Option<Submission> {
        self.rx.blocking_recv()
    }

    /// A batch already waiting, without blocking.
    pub fn try_recv(&mut self) -> Option<Submission> {
        self.rx.try_recv().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_batch_gets_the_processors_verdict() {
        let (intake, mut rx) = channel(4);
        let processor = tokio::spawn(async move {
            let sub = rx.recv().await.unwrap();
            let accepted = sub.batch.report.items.len() + 1;
            let _ = sub.reply.send(StatusResponse {
                accepted,
                rejected: vec![],
            });
        });
        let verdict = intake
            .submit(StatusBatch::from_agent(
                "m1".into(),
                StatusReport::default(),
            ))
            .await
            .unwrap();
        assert_eq!(verdict.accepted, 1);
        processor.await.unwrap();
        // the processor is gone: submissions fail instead of hanging
        let err = intake
            .submit(StatusBatch::from_agent(
                "m1".into(),
                StatusReport::default(),
            ))
            .await
            .unwrap_err();
        assert_eq!(err, IntakeError::Closed);
    }
}
