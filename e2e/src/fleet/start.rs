//! Starting one component, the same way for every one: pick its ports, spawn it, wait until the
//! process itself listens on every port, then until its readiness probe passes. A component that
//! exits because a port was taken between the pick and its bind (`address already in use` in
//! its log) is started again on new ports; any other exit fails with the tail of its log.

use std::time::{Duration, Instant};

use super::Fleet;
use super::components::{Component, Ports};
use super::probes;
use crate::error::{Error, Result};
use crate::ports;
use crate::process::ProcessRecord;
use crate::wait;

/// What a component logs when one of its ports is taken (Go's `EADDRINUSE` text).
pub const ADDRESS_IN_USE: &str = "address already in use";

/// Start attempts of one component before a taken port fails the start.
pub const START_ATTEMPTS: usize = 5;

/// Between attempts on fixed ports (a restart), to give the port's holder time to let go.
const FIXED_PORT_RETRY: Duration = Duration::from_millis(500);

/// How one start attempt ended.
enum Attempt {
    Listening,
    /// It exited with this status.
    Exited(String),
}

impl Fleet {
    /// Starts `component`, records it in the state file, and returns once it is ready.
    pub(super) async fn start(
        &self,
        component: &Component,
        deadline: Instant,
    ) -> Result<ProcessRecord> {
        let mut attempt = 0;
        let record = loop {
            attempt += 1;
            let ports = match &component.ports {
                Ports::Fresh(n) => ports::free_ports(*n)?,
                Ports::Fixed(ports) if ports.is_empty() => {
                    return Err(Error::Invalid(format!(
                        "{}: no port recorded, cannot restart it (start the fleet again)",
                        component.describe()
                    )));
                }
                Ports::Fixed(ports) => ports.clone(),
            };
            let mut record = component.record(&ports);
            let log_start = record.log_len();
            let child = record.spawn()?;
            self.put_process(&component.cluster, record.clone(), child)?;
            match self.until_listening(component, &record, deadline).await? {
                Attempt::Listening => break record,
                Attempt::Exited(status) => {
                    let port_taken = port_taken(&record.log_since(log_start));
                    if port_taken && attempt < START_ATTEMPTS {
                        tracing::warn!(
                            component = %component.describe(),
                            ?ports,
                            attempt,
                            "a port was taken before the component bound it; starting it again"
                        );
                        self.stop_process(&component.cluster, &component.name)?;
                        if matches!(component.ports, Ports::Fixed(_)) {
                            tokio::time::sleep(FIXED_PORT_RETRY).await;
                        }
                        continue;
                    }
                    let reason = if port_taken {
                        format!("{status}; {ADDRESS_IN_USE} on {attempt} attempts")
                    } else {
                        status
                    };
                    return Err(exit_error(&component.cluster, &record, reason));
                }
            }
        };
        let what = component.describe();
        let names = [component.name.as_str()];
        let ready =
            probes::until_ready(&what, component.ready, record.ports[0], remaining(deadline));
        tokio::select! {
            result = ready => result.map_err(|e| self.not_ready(component, &record, e))?,
            (_, status) = self.exited(&component.cluster, &names) => {
                return Err(exit_error(&component.cluster, &record, status));
            }
        }
        Ok(record)
    }

    /// Waits until the process itself listens on each of its ports, or exits.
    async fn until_listening(
        &self,
        component: &Component,
        record: &ProcessRecord,
        deadline: Instant,
    ) -> Result<Attempt> {
        let what = format!("{} listening on {:?}", component.describe(), record.ports);
        let names = [component.name.as_str()];
        let listening = wait::until(&what, remaining(deadline), || async {
            if record
                .ports
                .iter()
                .all(|port| ports::is_listening(record.pid, *port))
            {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        });
        tokio::select! {
            result = listening => {
                result.map_err(|e| self.not_ready(component, record, e))?;
                Ok(Attempt::Listening)
            }
            (_, status) = self.exited(&component.cluster, &names) => {
                Ok(Attempt::Exited(status))
            }
        }
    }

    /// Resolves when one of `components` of `cluster` is no longer running: its name and why.
    pub(super) async fn exited(&self, cluster: &str, components: &[&str]) -> (String, String) {
        loop {
            for component in components {
                if let Some(status) = self.exit_status(cluster, component) {
                    return (component.to_string(), status);
                }
            }
            tokio::time::sleep(wait::POLL).await;
        }
    }

    /// A timeout, with the last lines of the component's log.
    fn not_ready(&self, component: &Component, record: &ProcessRecord, e: Error) -> Error {
        Error::NotReady {
            cluster: cluster_label(&component.cluster),
            seconds: self.snapshot().config.ready_timeout.as_secs(),
            waiting_for: format!(
                "{e}\n--- last lines of {} ---\n{}",
                record.log.display(),
                record.log_tail(20)
            ),
        }
    }
}

/// A component that exited: why, and the last lines of its log.
pub(super) fn exit_error(cluster: &str, record: &ProcessRecord, reason: String) -> Error {
    Error::ComponentStart {
        cluster: cluster_label(cluster),
        component: record.component.clone(),
        reason,
        log: record.log.clone(),
        tail: record.log_tail(30),
    }
}

/// The cluster a component belongs to, for errors: etcd belongs to the whole fleet.
fn cluster_label(cluster: &str) -> String {
    if cluster.is_empty() {
        "fleet".into()
    } else {
        cluster.to_string()
    }
}

/// True when a component's output says one of its ports was taken.
fn port_taken(log: &str) -> bool {
    // Go says `address already in use`, Rust's io::Error `Address already in use`.
    log.to_ascii_lowercase().contains(ADDRESS_IN_USE)
}

/// Time left until `deadline`.
pub(super) fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taken_ports_are_recognised_in_the_logs_of_each_component() {
        // What etcd and kube-apiserver print when their port is taken, and Go's bare error.
        for log in [
            r#"{"level":"fatal","msg":"discovery failed","error":"listen tcp 127.0.0.1:53097: bind: address already in use"}"#,
            r#"E1123 11:22:32.809537 run.go:72] "command failed" err="failed to create listener: failed to listen on 127.0.0.1:37907: listen tcp 127.0.0.1:37907: bind: address already in use""#,
            "listen tcp 127.0.0.1:41000: bind: address already in use",
            // lifeboat-hub and lifeboat-agent (Rust).
            "Error: listening on 127.0.0.1:41000: Address already in use (os error 98)",
        ] {
            assert!(port_taken(log), "{log}");
        }
        assert!(!port_taken(
            r#"E1123 run.go:72] "command failed" err="no stages found""#
        ));
    }

    #[test]
    fn remaining_time_never_goes_negative() {
        assert_eq!(remaining(Instant::now()), Duration::ZERO);
        assert!(remaining(Instant::now() + Duration::from_secs(60)) > Duration::from_secs(59));
    }
}
