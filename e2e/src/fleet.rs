//! The local fleet: one hub and N member control planes on loopback, sharing one etcd (each
//! cluster under its own `--etcd-prefix`), with kwok playing the members' GPU nodes and pods.
//!
//! `Fleet::up` returns once every cluster is ready. The fleet is torn down when the `Fleet` is
//! dropped (also on panic), unless it was detached for the `fleet` command, whose `down` stops it
//! from the state file. Every process runs in its own process group with its log in the state dir.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::kubeconfig;
use crate::nodes::{self, NodeShape};
use crate::pki::{CertFiles, Pki};
use crate::process::{self, ProcessRecord};

/// The kwok stages of the fleet (how fake nodes and pods behave).
pub const KWOK_STAGES: &str = include_str!("../kwok/stages.yaml");

const STATE_FILE: &str = "fleet.json";
const HUB: &str = "hub";
const STOP_GRACE: Duration = Duration::from_secs(5);

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
        }
    }

    fn validate(&self) -> Result<()> {
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
        Ok(())
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
    pub api_url: String,
    pub kubeconfig: PathBuf,
    pub region: Option<String>,
    pub zone: Option<String>,
    pub nodes: Vec<String>,
    pub processes: Vec<ProcessRecord>,
    pub health: Vec<HealthEndpoint>,
}

impl ClusterRecord {
    fn process_mut(&mut self, component: &str) -> Option<&mut ProcessRecord> {
        self.processes.iter_mut().find(|p| p.component == component)
    }
}

/// Everything `up` left behind, enough for `status` and `down` from another process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetState {
    pub config: FleetConfig,
    pub bin_dir: PathBuf,
    pub etcd_url: String,
    pub etcd: ProcessRecord,
    pub clusters: Vec<ClusterRecord>,
}

/// Readiness of one cluster, as `fleet status` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    pub name: String,
    pub role: Role,
    pub api_url: String,
    pub kubeconfig: PathBuf,
    pub region: Option<String>,
    pub zone: Option<String>,
    pub nodes: usize,
    pub nodes_ready: usize,
    pub ready: bool,
    /// Why the cluster is not ready (empty when ready).
    pub reason: String,
}

/// A running fleet.
pub struct Fleet {
    state: Mutex<FleetState>,
    children: Mutex<HashMap<String, Child>>,
    teardown_on_drop: AtomicBool,
    keep_state_dir: AtomicBool,
}

fn child_key(cluster: &str, component: &str) -> String {
    format!("{cluster}/{component}")
}

impl Fleet {
    /// Starts a fleet and waits until every cluster is ready. A stale fleet left in the same
    /// state dir by an earlier run is stopped and removed first.
    pub async fn up(config: FleetConfig) -> Result<Fleet> {
        config.validate()?;
        cleanup_stale(&config.state_dir)?;
        let bin_dir = match &config.bin_dir {
            Some(dir) => dir.clone(),
            None => resolve_bin_dir()?,
        };
        for name in [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        ] {
            if !bin_dir.join(name).is_file() {
                return Err(Error::MissingBinary {
                    name: name.to_string(),
                    dir: bin_dir,
                });
            }
        }
        let dir = &config.state_dir;
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let dir = dir.canonicalize().map_err(|e| Error::io(dir, e))?;
        let started = Instant::now();

        let pki = Pki::create(&dir.join("pki"))?;
        let serving = pki.serving_cert("kube-apiserver", &[])?;
        let admin = pki.client_cert("admin", "lifeboat-admin", &["system:masters"])?;
        let kcm = pki.client_cert(
            "kube-controller-manager",
            "system:kube-controller-manager",
            &[],
        )?;
        let scheduler = pki.client_cert("kube-scheduler", "system:kube-scheduler", &[])?;
        let kwok = pki.client_cert("kwok", "kwok-controller", &["system:masters"])?;
        let kwok_config = dir.join("kwok-stages.yaml");
        std::fs::write(&kwok_config, KWOK_STAGES).map_err(|e| Error::io(&kwok_config, e))?;

        let etcd_dir = dir.join("etcd");
        std::fs::create_dir_all(&etcd_dir).map_err(|e| Error::io(&etcd_dir, e))?;
        let (etcd_port, peer_port) = (process::free_port()?, process::free_port()?);
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let etcd = ProcessRecord {
            component: "etcd".into(),
            program: bin_dir.join("etcd"),
            args: vec![
                "--name=lifeboat-fleet".into(),
                format!("--data-dir={}", etcd_dir.join("data").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=lifeboat-fleet=http://127.0.0.1:{peer_port}"),
                // A throwaway test bed: durability across host crashes is not needed, speed is.
                "--unsafe-no-fsync".into(),
                "--quota-backend-bytes=4294967296".into(),
                "--log-level=warn".into(),
            ],
            log: etcd_dir.join("etcd.log"),
            pid: 0,
        };

        let mut clusters = Vec::with_capacity(config.members + 1);
        let names = std::iter::once((HUB.to_string(), Role::Hub, 0))
            .chain((1..=config.members).map(|i| (format!("member-{i}"), Role::Member, i)));
        for (name, role, index) in names {
            let cluster_dir = dir.join(&name);
            std::fs::create_dir_all(&cluster_dir).map_err(|e| Error::io(&cluster_dir, e))?;
            let api_port = process::free_port()?;
            let api_url = format!("https://127.0.0.1:{api_port}");
            let kc = |file: &str, user: &CertFiles| {
                kubeconfig::write(&cluster_dir.join(file), &name, &api_url, &pki.ca_cert, user)
            };
            let admin_kc = kc("admin.kubeconfig", &admin)?;
            let kcm_kc = kc("kube-controller-manager.kubeconfig", &kcm)?;
            let mut processes = vec![apiserver_process(
                &bin_dir,
                &cluster_dir,
                &name,
                api_port,
                &etcd_url,
                &pki,
                &serving,
            )];
            let mut health = Vec::new();
            let kcm_port = process::free_port()?;
            processes.push(controller_manager_process(
                &bin_dir,
                &cluster_dir,
                &kcm_kc,
                kcm_port,
                &pki,
                index,
            ));
            health.push(HealthEndpoint {
                component: "kube-controller-manager".into(),
                url: format!("https://127.0.0.1:{kcm_port}"),
            });
            let (mut region, mut zone, mut node_names) = (None, None, Vec::new());
            if role == Role::Member {
                let scheduler_kc = kc("kube-scheduler.kubeconfig", &scheduler)?;
                let kwok_kc = kc("kwok.kubeconfig", &kwok)?;
                let scheduler_port = process::free_port()?;
                processes.push(ProcessRecord {
                    component: "kube-scheduler".into(),
                    program: bin_dir.join("kube-scheduler"),
                    args: vec![
                        format!("--kubeconfig={}", scheduler_kc.display()),
                        format!("--authentication-kubeconfig={}", scheduler_kc.display()),
                        format!("--authorization-kubeconfig={}", scheduler_kc.display()),
                        "--bind-address=127.0.0.1".into(),
                        format!("--secure-port={scheduler_port}"),
                        format!(
                            "--cert-dir={}",
                            cluster_dir.join("scheduler-certs").display()
                        ),
                        "--leader-elect=false".into(),
                    ],
                    log: cluster_dir.join("kube-scheduler.log"),
                    pid: 0,
                });
                health.push(HealthEndpoint {
                    component: "kube-scheduler".into(),
                    url: format!("https://127.0.0.1:{scheduler_port}"),
                });
                let kwok_port = process::free_port()?;
                processes.push(ProcessRecord {
                    component: "kwok".into(),
                    program: bin_dir.join("kwok"),
                    args: vec![
                        format!("--kubeconfig={}", kwok_kc.display()),
                        format!("--config={}", kwok_config.display()),
                        "--manage-all-nodes=false".into(),
                        format!(
                            "--manage-nodes-with-annotation-selector={}=fake",
                            nodes::KWOK_NODE_ANNOTATION
                        ),
                        "--node-lease-duration-seconds=40".into(),
                        format!("--cidr=10.{}.0.0/16", 100 + index),
                        format!("--server-address=127.0.0.1:{kwok_port}"),
                        format!("--node-ip=10.{}.255.1", 100 + index),
                    ],
                    log: cluster_dir.join("kwok.log"),
                    pid: 0,
                });
                health.push(HealthEndpoint {
                    component: "kwok".into(),
                    url: format!("http://127.0.0.1:{kwok_port}"),
                });
                let (r, z) = nodes::member_topology(index);
                region = Some(r);
                zone = Some(z);
                node_names = (0..config.nodes_per_member)
                    .map(|i| nodes::node_name(&name, i))
                    .collect();
            }
            clusters.push(ClusterRecord {
                name,
                role,
                api_url,
                kubeconfig: admin_kc,
                region,
                zone,
                nodes: node_names,
                processes,
                health,
            });
        }

        let fleet = Fleet {
            state: Mutex::new(FleetState {
                config: config.clone(),
                bin_dir,
                etcd_url,
                etcd,
                clusters,
            }),
            children: Mutex::new(HashMap::new()),
            teardown_on_drop: AtomicBool::new(true),
            keep_state_dir: AtomicBool::new(false),
        };
        // From here on, dropping `fleet` (error or panic) stops whatever was started.
        fleet.start_etcd().await?;
        let cluster_names: Vec<String> = fleet.cluster_names();
        for name in &cluster_names {
            fleet.spawn_component(name, "kube-apiserver")?;
        }
        fleet.save()?;
        let deadline = started + config.ready_timeout;
        try_join_all(
            cluster_names
                .iter()
                .map(|n| fleet.wait_apiserver(n, deadline)),
        )
        .await?;
        for name in &cluster_names {
            for component in ["kube-controller-manager", "kube-scheduler", "kwok"] {
                if fleet.has_component(name, component) {
                    fleet.spawn_component(name, component)?;
                }
            }
        }
        fleet.save()?;
        let shape = NodeShape::gpu_node(config.gpus_per_node);
        try_join_all(
            cluster_names
                .iter()
                .map(|n| fleet.finish_cluster(n, shape, deadline)),
        )
        .await?;
        tracing::info!(seconds = started.elapsed().as_secs_f64(), "fleet ready");
        Ok(fleet)
    }

    /// Loads a fleet started by another process (for `status`, `down`, fault injection). It is
    /// not torn down when dropped.
    pub fn load(state_dir: &Path) -> Result<Fleet> {
        let state = load_state(state_dir)?;
        Ok(Fleet {
            state: Mutex::new(state),
            children: Mutex::new(HashMap::new()),
            teardown_on_drop: AtomicBool::new(false),
            keep_state_dir: AtomicBool::new(false),
        })
    }

    /// Leaves the fleet running after this process exits (`fleet up`).
    pub fn detach(self) -> FleetState {
        self.teardown_on_drop.store(false, Ordering::SeqCst);
        // The children are reparented to init when we exit; nothing to wait for.
        self.children_lock().clear();
        self.snapshot()
    }

    /// Keeps the state dir (logs, certificates) when the fleet is torn down, for debugging.
    pub fn keep_state_dir(&self, keep: bool) {
        self.keep_state_dir.store(keep, Ordering::SeqCst);
    }

    /// Stops a fleet this process started (unless detached): every process, then the state dir
    /// unless it is to be kept. Idempotent; `Drop` calls it too.
    pub fn teardown(&self) {
        if !self.teardown_on_drop.swap(false, Ordering::SeqCst) {
            return;
        }
        self.stop_all();
        let dir = self.state_lock().config.state_dir.clone();
        if self.keep_state_dir.load(Ordering::SeqCst) {
            eprintln!("fleet stopped; logs kept in {}", dir.display());
        } else if let Err(e) = remove_dir(&dir) {
            eprintln!("fleet stopped; could not remove {}: {e}", dir.display());
        }
    }

    /// Stops every process and removes the state dir.
    pub fn down(self) -> Result<()> {
        self.teardown_on_drop.store(false, Ordering::SeqCst);
        self.stop_all();
        let dir = self.snapshot().config.state_dir;
        if !self.keep_state_dir.load(Ordering::SeqCst) {
            remove_dir(&dir)?;
        }
        Ok(())
    }

    /// A copy of the fleet's state.
    pub fn snapshot(&self) -> FleetState {
        self.state_lock().clone()
    }

    pub fn state_dir(&self) -> PathBuf {
        self.state_lock().config.state_dir.clone()
    }

    pub fn cluster_names(&self) -> Vec<String> {
        self.state_lock()
            .clusters
            .iter()
            .map(|c| c.name.clone())
            .collect()
    }

    /// Names of the member clusters.
    pub fn member_names(&self) -> Vec<String> {
        self.state_lock()
            .clusters
            .iter()
            .filter(|c| c.role == Role::Member)
            .map(|c| c.name.clone())
            .collect()
    }

    pub fn cluster(&self, name: &str) -> Result<ClusterRecord> {
        self.state_lock()
            .clusters
            .iter()
            .find(|c| c.name == name)
            .cloned()
            .ok_or_else(|| Error::UnknownCluster(name.to_string()))
    }

    pub fn kubeconfig(&self, cluster: &str) -> Result<PathBuf> {
        Ok(self.cluster(cluster)?.kubeconfig)
    }

    /// An admin client for a cluster.
    pub async fn client(&self, cluster: &str) -> Result<kube::Client> {
        kubeconfig::client(&self.kubeconfig(cluster)?).await
    }

    /// Readiness of every cluster.
    pub async fn status(&self) -> Vec<ClusterStatus> {
        let clusters = self.snapshot().clusters;
        futures::future::join_all(clusters.iter().map(cluster_status)).await
    }

    /// Pids of every running fleet process (for memory measurements).
    pub fn pids(&self) -> Vec<(String, i32)> {
        let state = self.state_lock();
        std::iter::once(("etcd".to_string(), state.etcd.pid))
            .chain(state.clusters.iter().flat_map(|c| {
                c.processes
                    .iter()
                    .map(move |p| (format!("{}/{}", c.name, p.component), p.pid))
            }))
            .filter(|(_, pid)| *pid > 0)
            .collect()
    }

    /// Stops a cluster's kube-apiserver: the cluster refuses connections until it is started
    /// again. Its data stays in etcd.
    pub fn stop_apiserver(&self, cluster: &str) -> Result<()> {
        self.stop_component(cluster, "kube-apiserver")?;
        self.save()
    }

    /// Starts a stopped kube-apiserver again on the same port and waits until it is ready.
    pub async fn start_apiserver(&self, cluster: &str) -> Result<()> {
        let running = self
            .cluster(cluster)?
            .processes
            .iter()
            .any(|p| p.component == "kube-apiserver" && p.is_running());
        if !running {
            self.spawn_component(cluster, "kube-apiserver")?;
            self.save()?;
        }
        let timeout = self.snapshot().config.ready_timeout;
        self.wait_apiserver(cluster, Instant::now() + timeout).await
    }

    async fn start_etcd(&self) -> Result<()> {
        let (mut record, url) = {
            let state = self.state_lock();
            (state.etcd.clone(), state.etcd_url.clone())
        };
        let child = record.spawn()?;
        self.children_lock().insert(child_key("", "etcd"), child);
        self.state_lock().etcd = record.clone();
        self.save()?;
        let timeout = self.snapshot().config.ready_timeout;
        let deadline = Instant::now() + timeout;
        loop {
            if probe(&url, "/health").await.is_ok() {
                return Ok(());
            }
            self.check_alive("", &record)?;
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    cluster: "fleet".into(),
                    seconds: timeout.as_secs(),
                    waiting_for: format!("etcd at {url}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn has_component(&self, cluster: &str, component: &str) -> bool {
        self.cluster(cluster)
            .map(|c| c.processes.iter().any(|p| p.component == component))
            .unwrap_or(false)
    }

    fn spawn_component(&self, cluster: &str, component: &str) -> Result<()> {
        let child = {
            let mut state = self.state_lock();
            let record = state
                .clusters
                .iter_mut()
                .find(|c| c.name == cluster)
                .ok_or_else(|| Error::UnknownCluster(cluster.to_string()))?
                .process_mut(component)
                .ok_or_else(|| Error::Invalid(format!("{cluster} has no {component}")))?;
            record.spawn()?
        };
        self.children_lock()
            .insert(child_key(cluster, component), child);
        Ok(())
    }

    fn stop_component(&self, cluster: &str, component: &str) -> Result<()> {
        let mut child = self.children_lock().remove(&child_key(cluster, component));
        let mut state = self.state_lock();
        let record = state
            .clusters
            .iter_mut()
            .find(|c| c.name == cluster)
            .ok_or_else(|| Error::UnknownCluster(cluster.to_string()))?
            .process_mut(component)
            .ok_or_else(|| Error::Invalid(format!("{cluster} has no {component}")))?;
        record.stop(child.as_mut(), STOP_GRACE)
    }

    /// Fails with the component's log tail when it is no longer running.
    fn check_alive(&self, cluster: &str, record: &ProcessRecord) -> Result<()> {
        let mut children = self.children_lock();
        let exited = match children.get_mut(&child_key(cluster, &record.component)) {
            Some(child) => match child.try_wait() {
                Ok(Some(status)) => Some(status.to_string()),
                _ => None,
            },
            None => (!record.is_running()).then(|| "not running".to_string()),
        };
        match exited {
            Some(reason) => Err(Error::ComponentStart {
                cluster: if cluster.is_empty() {
                    "fleet".into()
                } else {
                    cluster.into()
                },
                component: record.component.clone(),
                reason,
                log: record.log.clone(),
                tail: record.log_tail(30),
            }),
            None => Ok(()),
        }
    }

    async fn wait_apiserver(&self, cluster: &str, deadline: Instant) -> Result<()> {
        let record = self.cluster(cluster)?;
        let client = kubeconfig::client(&record.kubeconfig).await?;
        let apiserver = record
            .processes
            .iter()
            .find(|p| p.component == "kube-apiserver")
            .cloned()
            .ok_or_else(|| Error::Invalid(format!("{cluster} has no kube-apiserver")))?;
        loop {
            let req = http::Request::get("/readyz").body(Vec::new());
            if let Ok(req) = req
                && let Ok(body) = client.request_text(req).await
                && body.trim() == "ok"
            {
                return Ok(());
            }
            self.check_alive(cluster, &apiserver)?;
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    cluster: cluster.into(),
                    seconds: self.snapshot().config.ready_timeout.as_secs(),
                    waiting_for: format!(
                        "kube-apiserver /readyz at {}\n--- last lines of {} ---\n{}",
                        record.api_url,
                        apiserver.log.display(),
                        apiserver.log_tail(20)
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Creates the member's nodes and waits for controllers, scheduler, kwok and nodes.
    async fn finish_cluster(
        &self,
        cluster: &str,
        shape: NodeShape,
        deadline: Instant,
    ) -> Result<()> {
        let record = self.cluster(cluster)?;
        let client = kubeconfig::client(&record.kubeconfig).await?;
        if record.role == Role::Member {
            let member_index = record
                .name
                .strip_prefix("member-")
                .and_then(|i| i.parse::<usize>().ok())
                .unwrap_or(1);
            let nodes_api: Api<Node> = Api::all(client.clone());
            for (i, name) in record.nodes.iter().enumerate() {
                let node = nodes::kwok_node(&record.name, member_index, i, shape);
                match nodes_api.create(&PostParams::default(), &node).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => {
                        return Err(Error::kube(format!("create node {name} in {cluster}"), e));
                    }
                }
            }
        }
        loop {
            let status = cluster_status(&record).await;
            if status.ready {
                return Ok(());
            }
            for p in &record.processes {
                self.check_alive(cluster, p)?;
            }
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    cluster: cluster.into(),
                    seconds: self.snapshot().config.ready_timeout.as_secs(),
                    waiting_for: status.reason,
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn stop_all(&self) {
        let mut children = std::mem::take(&mut *self.children_lock());
        let mut state = self.state_lock();
        // Reverse start order: node agents and controllers first, etcd last.
        for cluster in state.clusters.iter_mut().rev() {
            let name = cluster.name.clone();
            for record in cluster.processes.iter_mut().rev() {
                let mut child = children.remove(&child_key(&name, &record.component));
                if let Err(e) = record.stop(child.as_mut(), STOP_GRACE) {
                    tracing::warn!(cluster = %name, component = %record.component, error = %e, "stop failed");
                }
            }
        }
        let mut child = children.remove(&child_key("", "etcd"));
        if let Err(e) = state.etcd.stop(child.as_mut(), STOP_GRACE) {
            tracing::warn!(error = %e, "stopping etcd failed");
        }
    }

    fn save(&self) -> Result<()> {
        let state = self.snapshot();
        save_state(&state)
    }

    fn state_lock(&self) -> std::sync::MutexGuard<'_, FleetState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn children_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Child>> {
        self.children.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.teardown();
    }
}

fn apiserver_process(
    bin_dir: &Path,
    cluster_dir: &Path,
    cluster: &str,
    port: u16,
    etcd_url: &str,
    pki: &Pki,
    serving: &CertFiles,
) -> ProcessRecord {
    ProcessRecord {
        component: "kube-apiserver".into(),
        program: bin_dir.join("kube-apiserver"),
        args: vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--etcd-prefix=/lifeboat-fleet/{cluster}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!(
                "--cert-dir={}",
                cluster_dir.join("apiserver-certs").display()
            ),
            format!("--tls-cert-file={}", serving.cert.display()),
            format!("--tls-private-key-file={}", serving.key.display()),
            format!("--client-ca-file={}", pki.ca_cert.display()),
            format!(
                "--service-account-key-file={}",
                pki.service_account_pub.display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                pki.service_account_key.display()
            ),
            format!("--service-account-issuer=https://{cluster}.fleet.lifeboat.local"),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--authorization-mode=Node,RBAC".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
            "--endpoint-reconciler-type=none".into(),
        ],
        log: cluster_dir.join("kube-apiserver.log"),
        pid: 0,
    }
}

fn controller_manager_process(
    bin_dir: &Path,
    cluster_dir: &Path,
    kubeconfig: &Path,
    port: u16,
    pki: &Pki,
    index: usize,
) -> ProcessRecord {
    ProcessRecord {
        component: "kube-controller-manager".into(),
        program: bin_dir.join("kube-controller-manager"),
        args: vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--authentication-kubeconfig={}", kubeconfig.display()),
            format!("--authorization-kubeconfig={}", kubeconfig.display()),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", cluster_dir.join("kcm-certs").display()),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=true".into(),
            format!(
                "--service-account-private-key-file={}",
                pki.service_account_key.display()
            ),
            format!("--root-ca-file={}", pki.ca_cert.display()),
            format!("--cluster-signing-cert-file={}", pki.ca_cert.display()),
            format!("--cluster-signing-key-file={}", pki.ca_key.display()),
            format!("--cluster-name=lifeboat-{index}"),
            "--controllers=*".into(),
            // The default client rate (20 requests/s) makes a Job of thousands of pods take
            // minutes; clusters that run such Jobs raise it.
            "--kube-api-qps=100".into(),
            "--kube-api-burst=200".into(),
        ],
        log: cluster_dir.join("kube-controller-manager.log"),
        pid: 0,
    }
}

/// GET `path` on `base` without credentials or certificate verification; Ok when 2xx.
async fn probe(base: &str, path: &str) -> std::result::Result<String, String> {
    let uri: http::Uri = base.parse().map_err(|e| format!("{base}: {e}"))?;
    let mut config = kube::Config::new(uri);
    config.accept_invalid_certs = true;
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(5));
    let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
    let req = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client.request_text(req).await.map_err(|e| e.to_string())
}

async fn cluster_status(record: &ClusterRecord) -> ClusterStatus {
    let mut status = ClusterStatus {
        name: record.name.clone(),
        role: record.role,
        api_url: record.api_url.clone(),
        kubeconfig: record.kubeconfig.clone(),
        region: record.region.clone(),
        zone: record.zone.clone(),
        nodes: 0,
        nodes_ready: 0,
        ready: false,
        reason: String::new(),
    };
    let mut waiting = Vec::new();
    let client = match kubeconfig::config(&record.kubeconfig).await {
        Ok(mut config) => {
            config.connect_timeout = Some(Duration::from_secs(2));
            config.read_timeout = Some(Duration::from_secs(5));
            kube::Client::try_from(config).ok()
        }
        Err(_) => None,
    };
    let Some(client) = client else {
        status.reason = "no usable kubeconfig".into();
        return status;
    };
    let readyz = http::Request::get("/readyz").body(Vec::new());
    match readyz {
        Ok(req) => match client.request_text(req).await {
            Ok(body) if body.trim() == "ok" => {}
            Ok(body) => waiting.push(format!("kube-apiserver /readyz: {}", body.trim())),
            Err(e) => {
                status.reason = format!("kube-apiserver unreachable: {e}");
                return status;
            }
        },
        Err(e) => waiting.push(e.to_string()),
    }
    for endpoint in &record.health {
        if let Err(e) = probe(&endpoint.url, "/healthz").await {
            waiting.push(format!("{} /healthz: {e}", endpoint.component));
        }
    }
    // The service-account controller has run once the default account exists.
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    match sa.get_opt("default").await {
        Ok(Some(_)) => {}
        Ok(None) => waiting.push("default service account (kube-controller-manager)".into()),
        Err(e) => waiting.push(format!("service accounts: {e}")),
    }
    let nodes_api: Api<Node> = Api::all(client);
    match nodes_api.list(&ListParams::default()).await {
        Ok(list) => {
            status.nodes = list.items.len();
            status.nodes_ready = list.items.iter().filter(|n| node_is_ready(n)).count();
            if status.nodes_ready < record.nodes.len() {
                waiting.push(format!(
                    "nodes ready {}/{}",
                    status.nodes_ready,
                    record.nodes.len()
                ));
            }
        }
        Err(e) => waiting.push(format!("nodes: {e}")),
    }
    status.ready = waiting.is_empty();
    status.reason = waiting.join("; ");
    status
}

/// True when the node's Ready condition is True.
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
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

fn state_file(dir: &Path) -> PathBuf {
    dir.join(STATE_FILE)
}

fn save_state(state: &FleetState) -> Result<()> {
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

fn remove_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(dir, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper(dir: &Path, name: &str) -> ProcessRecord {
        let log = dir.join(format!("{name}.log"));
        ProcessRecord {
            component: name.into(),
            program: "/bin/sh".into(),
            args: vec!["-c".into(), format!("sleep 60; echo {}", log.display())],
            log,
            pid: 0,
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
}
