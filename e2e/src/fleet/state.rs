//! The fleet's state file (`<state-dir>/fleet.json`): everything `up` started, enough for
//! `status`, `down` and fault injection from another process, and for cleaning up a stale fleet.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::STOP_GRACE;
use super::config::FleetConfig;
use crate::error::{Error, Result};
use crate::nodes;
use crate::process::ProcessRecord;

const STATE_FILE: &str = "fleet.json";

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Hub,
    Member,
}

/// A component's health endpoint, probed without credentials.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HealthEndpoint {
    pub component: String,
    pub url: String,
}

/// One cluster of the fleet, as recorded in the state file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterRecord {
    pub name: String,
    pub role: Role,
    /// Empty until its kube-apiserver listens.
    pub api_url: String,
    pub kubeconfig: PathBuf,
    pub region: Option<String>,
    pub zone: Option<String>,
    pub nodes: Vec<String>,
    pub processes: Vec<ProcessRecord>,
    pub health: Vec<HealthEndpoint>,
}

impl ClusterRecord {
    pub(super) fn process_mut(&mut self, component: &str) -> Option<&mut ProcessRecord> {
        self.processes.iter_mut().find(|p| p.component == component)
    }

    /// Records a (re)started process, replacing an earlier record of the same component.
    pub(super) fn put_process(&mut self, record: ProcessRecord) {
        match self.process_mut(&record.component) {
            Some(existing) => *existing = record,
            None => self.processes.push(record),
        }
    }

    /// A cluster about to be started: its nodes (members), region and zone, nothing running.
    pub(super) fn planned(
        cluster_dir: &Path,
        name: String,
        role: Role,
        nodes_per_member: usize,
    ) -> Self {
        let mut record = ClusterRecord {
            kubeconfig: cluster_dir.join("admin.kubeconfig"),
            api_url: String::new(),
            region: None,
            zone: None,
            nodes: Vec::new(),
            processes: Vec::new(),
            health: Vec::new(),
            name,
            role,
        };
        if role == Role::Member {
            let (region, zone) = nodes::member_topology(record.member_index());
            record.region = Some(region);
            record.zone = Some(zone);
            record.nodes = (0..nodes_per_member)
                .map(|i| nodes::node_name(&record.name, i))
                .collect();
        }
        record
    }

    /// The member's index (`member-3` → 3); 0 for the hub.
    pub fn member_index(&self) -> usize {
        self.name
            .strip_prefix("member-")
            .and_then(|i| i.parse().ok())
            .unwrap_or(0)
    }
}

/// Everything `up` left behind, enough for `status` and `down` from another process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetState {
    pub config: FleetConfig,
    pub bin_dir: PathBuf,
    /// Empty until etcd listens.
    pub etcd_url: String,
    pub etcd: ProcessRecord,
    pub clusters: Vec<ClusterRecord>,
    /// Lifeboat's hubs and agents, once started (`fleet up --lifeboat`).
    #[serde(default)]
    pub lifeboat: Option<super::lifeboat::LifeboatState>,
}

impl FleetState {
    pub(super) fn cluster_mut(&mut self, name: &str) -> Result<&mut ClusterRecord> {
        self.clusters
            .iter_mut()
            .find(|c| c.name == name)
            .ok_or_else(|| Error::UnknownCluster(name.to_string()))
    }
}

fn state_file(dir: &Path) -> PathBuf {
    dir.join(STATE_FILE)
}

/// Writes the state file atomically (a temporary file renamed over it).
pub(super) fn save_state(state: &FleetState) -> Result<()> {
    let path = state_file(&state.config.state_dir);
    let json = serde_json::to_vec_pretty(state).map_err(|e| Error::State {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, json).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))
}

/// Reads the state file `up` wrote.
pub fn load_state(dir: &Path) -> Result<FleetState> {
    let path = state_file(dir);
    let bytes = std::fs::read(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::State {
            path: path.clone(),
            reason: "no fleet here (run `fleet up` first)".into(),
        },
        _ => Error::io(&path, e),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| Error::State {
        path,
        reason: e.to_string(),
    })
}

/// Stops the processes of a fleet an earlier run left in `dir` and removes the dir.
/// Returns how many processes were stopped.
pub fn cleanup_stale(dir: &Path) -> Result<usize> {
    let mut stopped = 0;
    if let Ok(mut state) = load_state(dir) {
        for cluster in state.clusters.iter_mut().rev() {
            for record in cluster.processes.iter_mut().rev() {
                if record.is_running() {
                    record.stop(None, STOP_GRACE)?;
                    stopped += 1;
                }
            }
        }
        if state.etcd.is_running() {
            state.etcd.stop(None, STOP_GRACE)?;
            stopped += 1;
        }
    }
    if dir.exists() {
        remove_dir(dir)?;
    }
    if stopped > 0 {
        tracing::info!(dir = %dir.display(), stopped, "cleaned up a stale fleet");
    }
    Ok(stopped)
}

pub(super) fn remove_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(dir, e)),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn sleeper(dir: &Path, name: &str) -> ProcessRecord {
        let log = dir.join(format!("{name}.log"));
        ProcessRecord {
            component: name.into(),
            program: "/bin/sh".into(),
            args: vec!["-c".into(), format!("sleep 60; echo {}", log.display())],
            log,
            pid: 0,
            ports: vec![],
        }
    }

    #[test]
    fn up_cleans_up_a_stale_fleet() {
        let dir = std::env::temp_dir().join(format!("lifeboat-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut etcd = sleeper(&dir, "etcd");
        let mut apiserver = sleeper(&dir, "kube-apiserver");
        // Detached children, as an earlier `fleet up` would have left them.
        let mut c1 = etcd.spawn().unwrap();
        let mut c2 = apiserver.spawn().unwrap();
        let state = FleetState {
            config: FleetConfig::new(&dir),
            bin_dir: "/nonexistent".into(),
            etcd_url: "http://127.0.0.1:1".into(),
            etcd: etcd.clone(),
            clusters: vec![ClusterRecord {
                name: "hub".into(),
                role: Role::Hub,
                api_url: "https://127.0.0.1:1".into(),
                kubeconfig: dir.join("hub.kubeconfig"),
                region: None,
                zone: None,
                nodes: vec![],
                processes: vec![apiserver.clone()],
                health: vec![],
            }],
            lifeboat: None,
        };
        save_state(&state).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(etcd.is_running() && apiserver.is_running());

        assert_eq!(cleanup_stale(&dir).unwrap(), 2);
        assert!(!dir.exists());
        // Both were stopped (reap them: they are this test's children).
        assert!(c1.wait().is_ok() && c2.wait().is_ok());
        assert!(!etcd.is_running() && !apiserver.is_running());
        // Nothing left: a second cleanup is a no-op.
        assert_eq!(cleanup_stale(&dir).unwrap(), 0);
    }

    #[test]
    fn planned_members_get_nodes_and_a_region_the_hub_neither() {
        let member =
            ClusterRecord::planned(Path::new("/s/member-2"), "member-2".into(), Role::Member, 3);
        assert_eq!(member.member_index(), 2);
        assert_eq!(
            member.nodes,
            ["member-2-gpu-0", "member-2-gpu-1", "member-2-gpu-2"]
        );
        assert!(member.region.is_some() && member.zone.is_some());
        assert_eq!(member.kubeconfig, Path::new("/s/member-2/admin.kubeconfig"));
        assert!(member.processes.is_empty() && member.api_url.is_empty());
        let hub = ClusterRecord::planned(Path::new("/s/hub"), "hub".into(), Role::Hub, 3);
        assert_eq!(hub.member_index(), 0);
        assert!(hub.nodes.is_empty() && hub.region.is_none());
    }
}
