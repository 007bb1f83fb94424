//! How to build a fleet, and where its binaries and state live.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The Kubernetes binaries a fleet runs.
pub const BINARIES: [&str; 5] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
];

/// How to build a fleet.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetConfig {
    pub state_dir: PathBuf,
    pub members: usize,
    pub nodes_per_member: usize,
    pub gpus_per_node: u32,
    /// Where the Kubernetes binaries are; `None` asks `e2e/k8s/build.sh --print-dir`.
    pub bin_dir: Option<PathBuf>,
    /// How long `up` waits for every cluster to become ready.
    pub ready_timeout: Duration,
    /// Also run Lifeboat (hub replicas and an agent per member) as processes.
    #[serde(default)]
    pub lifeboat: Option<super::lifeboat::LifeboatConfig>,
}

impl FleetConfig {
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        Self {
            state_dir: state_dir.into(),
            members: 3,
            nodes_per_member: 4,
            gpus_per_node: 8,
            bin_dir: None,
            ready_timeout: Duration::from_secs(180),
            lifeboat: None,
        }
    }

    pub(super) fn validate(&self) -> Result<()> {
        if self.members == 0 || self.members > 16 {
            return Err(Error::Invalid(format!(
                "--members must be between 1 and 16, got {}",
                self.members
            )));
        }
        if self.nodes_per_member == 0 || self.nodes_per_member > 500 {
            return Err(Error::Invalid(format!(
                "--nodes-per-member must be between 1 and 500, got {}",
                self.nodes_per_member
            )));
        }
        if self.gpus_per_node > 64 {
            return Err(Error::Invalid(format!(
                "--gpus-per-node must be at most 64, got {}",
                self.gpus_per_node
            )));
        }
        if let Some(lifeboat) = &self.lifeboat {
            lifeboat.validate()?;
        }
        Ok(())
    }

    /// The directory of the Kubernetes binaries, checked to hold every one of [`BINARIES`].
    pub(super) fn binaries(&self) -> Result<PathBuf> {
        let bin_dir = match &self.bin_dir {
            Some(dir) => dir.clone(),
            None => resolve_bin_dir()?,
        };
        for name in BINARIES {
            if !bin_dir.join(name).is_file() {
                return Err(Error::MissingBinary {
                    name: name.to_string(),
                    dir: bin_dir,
                });
            }
        }
        Ok(bin_dir)
    }
}

/// Default state directory: `<workspace>/target/fleet`.
pub fn default_state_dir() -> PathBuf {
    workspace_root().join("target").join("fleet")
}

/// The workspace root (where `e2e/k8s/build.sh` lives).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Asks `e2e/k8s/build.sh --print-dir` where the binaries live (honours LIFEBOAT_K8S_BIN_DIR).
pub fn resolve_bin_dir() -> Result<PathBuf> {
    if let Ok(dir) = std::env::var("LIFEBOAT_K8S_BIN_DIR")
        && !dir.is_empty()
    {
        return Ok(PathBuf::from(dir));
    }
    let script = workspace_root().join("e2e/k8s/build.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg("--print-dir")
        .output()
        .map_err(|e| Error::BinDir(format!("{}: {e}", script.display())))?;
    if !out.status.success() {
        return Err(Error::BinDir(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_rejects_nonsense_sizes() {
        let mut config = FleetConfig::new("/tmp/x");
        config.members = 0;
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--members")
        );
        config.members = 3;
        config.nodes_per_member = 0;
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--nodes-per-member")
        );
        config.nodes_per_member = 4;
        config.gpus_per_node = 1000;
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--gpus-per-node")
        );
    }

    #[test]
    fn a_missing_binary_is_named_with_the_fix() {
        let mut config = FleetConfig::new("/tmp/x");
        config.bin_dir = Some(std::env::temp_dir().join("lifeboat-no-binaries-here"));
        let text = config.binaries().unwrap_err().to_string();
        assert!(
            text.contains("etcd") && text.contains("e2e/k8s/build.sh"),
            "{text}"
        );
    }
}
