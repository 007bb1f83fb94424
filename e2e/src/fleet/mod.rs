//! The local fleet: one hub and N member control planes on loopback, sharing one etcd (each
//! cluster under its own `--etcd-prefix`), with kwok playing the members' GPU nodes and pods.
//!
//! `Fleet::up` returns once every cluster is ready. The fleet is torn down when the `Fleet` is
//! dropped (also on panic), unless it was detached for the `fleet` command, whose `down` stops it
//! from the state file. Every process runs in its own process group with its log in the state dir.
//!
//! `config` (how to build it), `components` (each process built one way: command line, log,
//! readiness probe), `start` (starting one, again on new ports when a port was taken), `state`
//! (the state file), `probes` (readiness, waited for with `wait::until`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};

use crate::error::{Error, Result};
use crate::kubeconfig;
use crate::nodes::{self, NodeShape};
use crate::pki::{CertFiles, Pki};
use crate::process::ProcessRecord;
use crate::wait;

pub mod components;
mod config;
pub mod lifeboat;
pub mod probes;
mod start;
mod state;

pub use config::{BINARIES, FleetConfig, default_state_dir, resolve_bin_dir, workspace_root};
pub use lifeboat::{LifeboatConfig, LifeboatProcess, LifeboatStatus, lifeboat_bin_dir};
pub use probes::{ClusterStatus, node_is_ready};
pub use start::{ADDRESS_IN_USE, START_ATTEMPTS};
pub use state::{ClusterRecord, FleetState, HealthEndpoint, Role, cleanup_stale, load_state};

use components::{Component, Layout, TlsFiles};
use start::{exit_error, remaining};
use state::{remove_dir, save_state};

/// The kwok stages of the fleet (how fake nodes and pods behave).
pub const KWOK_STAGES: &str = include_str!("../../kwok/stages.yaml");

/// The hub cluster's name.
pub const HUB: &str = "hub";
const STOP_GRACE: Duration = Duration::from_secs(5);

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

/// The client certificates of one cluster's components.
struct Identities {
    admin: CertFiles,
    controller_manager: CertFiles,
    scheduler: CertFiles,
    kwok: CertFiles,
}

/// The fleet's CA, service-account keys and serving certificate, and each component's client
/// certificate.
fn issue_certificates(dir: &Path) -> Result<(TlsFiles, Identities)> {
    let pki = Pki::create(dir)?;
    let serving = pki.serving_cert("kube-apiserver", &[])?;
    let identities = Identities {
        admin: pki.client_cert("admin", "lifeboat-admin", &["system:masters"])?,
        controller_manager: pki.client_cert(
            "kube-controller-manager",
            "system:kube-controller-manager",
            &[],
        )?,
        scheduler: pki.client_cert("kube-scheduler", "system:kube-scheduler", &[])?,
        kwok: pki.client_cert("kwok", "kwok-controller", &["system:masters"])?,
    };
    let tls = TlsFiles {
        ca_cert: pki.ca_cert.clone(),
        ca_key: pki.ca_key.clone(),
        service_account_key: pki.service_account_key.clone(),
        service_account_pub: pki.service_account_pub.clone(),
        serving_cert: serving.cert,
        serving_key: serving.key,
    };
    Ok((tls, identities))
}

impl Fleet {
    /// Starts a fleet and waits until every cluster is ready. A stale fleet left in the same
    /// state dir by an earlier run is stopped and removed first.
    pub async fn up(config: FleetConfig) -> Result<Fleet> {
        config.validate()?;
        cleanup_stale(&config.state_dir)?;
        let bin_dir = config.binaries()?;
        let dir = &config.state_dir;
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let dir = dir.canonicalize().map_err(|e| Error::io(dir, e))?;
        let started = Instant::now();
        let deadline = started + config.ready_timeout;

        let (tls, identities) = issue_certificates(&dir.join("pki"))?;
        let kwok_stages = dir.join("kwok-stages.yaml");
        std::fs::write(&kwok_stages, KWOK_STAGES).map_err(|e| Error::io(&kwok_stages, e))?;
        let layout = Layout {
            bin_dir: bin_dir.clone(),
            dir: dir.clone(),
            tls,
            kwok_stages,
        };
        let etcd = components::etcd(&layout);
        let etcd_dir = dir.join("etcd");
        std::fs::create_dir_all(&etcd_dir).map_err(|e| Error::io(&etcd_dir, e))?;
        let clusters = std::iter::once((HUB.to_string(), Role::Hub))
            .chain((1..=config.members).map(|i| (format!("member-{i}"), Role::Member)))
            .map(|(name, role)| {
                let cluster_dir = layout.cluster_dir(&name);
                std::fs::create_dir_all(&cluster_dir).map_err(|e| Error::io(&cluster_dir, e))?;
                Ok(ClusterRecord::planned(
                    &cluster_dir,
                    name,
                    role,
                    config.nodes_per_member,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let fleet = Fleet {
            state: Mutex::new(FleetState {
                config: config.clone(),
                bin_dir,
                etcd_url: String::new(),
                etcd: etcd.unstarted(),
                clusters,
                lifeboat: None,
            }),
            children: Mutex::new(HashMap::new()),
            teardown_on_drop: AtomicBool::new(true),
            keep_state_dir: AtomicBool::new(false),
        };
        // From here on, dropping `fleet` (error or panic) stops whatever was started.
        fleet.save()?;
        let etcd = fleet.start(&etcd, deadline).await?;
        let etcd_url = format!("http://127.0.0.1:{}", etcd.ports[0]);
        fleet.state_lock().etcd_url = etcd_url.clone();
        fleet.save()?;
        let shape = NodeShape::gpu_node(config.gpus_per_node);
        try_join_all(fleet.cluster_names().iter().map(|name| {
            fleet.start_cluster(&layout, &identities, name, &etcd_url, shape, deadline)
        }))
        .await?;
        tracing::info!(seconds = started.elapsed().as_secs_f64(), "fleet ready");
        if let Some(lifeboat) = &config.lifeboat {
            fleet.start_lifeboat(lifeboat, deadline).await?;
            tracing::info!(seconds = started.elapsed().as_secs_f64(), "Lifeboat ready");
        }
        Ok(fleet)
    }

    /// One cluster: its kube-apiserver, then its kubeconfigs, controllers, scheduler and kwok
    /// (members), then its nodes; returns once the cluster is ready.
    async fn start_cluster(
        &self,
        layout: &Layout,
        identities: &Identities,
        cluster: &str,
        etcd_url: &str,
        shape: NodeShape,
        deadline: Instant,
    ) -> Result<()> {
        let apiserver = components::kube_apiserver(layout, cluster, etcd_url);
        let apiserver = self.start(&apiserver, deadline).await?;
        let api_url = format!("https://127.0.0.1:{}", apiserver.ports[0]);
        let record = self.update_cluster(cluster, |c| c.api_url = api_url.clone())?;
        let cluster_dir = layout.cluster_dir(cluster);
        let kc = |file: &str, user: &CertFiles| {
            kubeconfig::write(
                &cluster_dir.join(file),
                cluster,
                &api_url,
                &layout.tls.ca_cert,
                user,
            )
        };
        kc("admin.kubeconfig", &identities.admin)?;
        let index = record.member_index();
        let mut controllers = vec![components::kube_controller_manager(
            layout,
            cluster,
            index,
            &kc(
                "kube-controller-manager.kubeconfig",
                &identities.controller_manager,
            )?,
            record.role == Role::Hub,
        )];
        if record.role == Role::Member {
            controllers.push(components::kube_scheduler(
                layout,
                cluster,
                &kc("kube-scheduler.kubeconfig", &identities.scheduler)?,
            ));
            controllers.push(components::kwok(
                layout,
                cluster,
                index,
                &kc("kwok.kubeconfig", &identities.kwok)?,
            ));
        }
        // The nodes need only the apiserver: create them while the controllers start.
        let (started, ()) = futures::future::try_join(
            try_join_all(controllers.iter().map(|c| self.start(c, deadline))),
            self.create_nodes(&record, shape),
        )
        .await?;
        let record = self.update_cluster(cluster, |c| {
            c.health = controllers
                .iter()
                .zip(&started)
                .map(|(component, process)| HealthEndpoint {
                    component: component.name.clone(),
                    url: component.ready.base(process.ports[0]),
                })
                .collect();
        })?;
        self.until_cluster_ready(&record, deadline).await
    }

    /// Creates a member's kwok nodes (none for the hub).
    async fn create_nodes(&self, record: &ClusterRecord, shape: NodeShape) -> Result<()> {
        if record.role != Role::Member {
            return Ok(());
        }
        let client = kubeconfig::client(&record.kubeconfig).await?;
        let nodes_api: Api<Node> = Api::all(client);
        for (i, name) in record.nodes.iter().enumerate() {
            let node = nodes::kwok_node(&record.name, record.member_index(), i, shape);
            match nodes_api.create(&PostParams::default(), &node).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => {
                    return Err(Error::kube(
                        format!("create node {name} in {}", record.name),
                        e,
                    ));
                }
            }
        }
        Ok(())
    }

    /// Waits for controllers, scheduler, kwok, the default service account and every node;
    /// fails at once when one of the cluster's processes exits.
    async fn until_cluster_ready(&self, record: &ClusterRecord, deadline: Instant) -> Result<()> {
        let what = format!("cluster {} ready", record.name);
        let ready = wait::until(&what, remaining(deadline), || async {
            let status = probes::cluster_status(record).await;
            if status.ready {
                Ok(())
            } else {
                Err(status.reason)
            }
        });
        let names: Vec<&str> = record
            .processes
            .iter()
            .map(|p| p.component.as_str())
            .collect();
        tokio::select! {
            result = ready => result,
            (component, reason) = self.exited(&record.name, &names) => {
                let process = record
                    .processes
                    .iter()
                    .find(|p| p.component == component)
                    .ok_or_else(|| Error::Invalid(format!("{} has no {component}", record.name)))?;
                Err(exit_error(&record.name, process, reason))
            }
        }
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
        futures::future::join_all(clusters.iter().map(probes::cluster_status)).await
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
        self.stop_process(cluster, "kube-apiserver")?;
        self.save()
    }

    /// Starts a stopped kube-apiserver again on the same port and waits until it is ready.
    pub async fn start_apiserver(&self, cluster: &str) -> Result<()> {
        let deadline = Instant::now() + self.snapshot().config.ready_timeout;
        let record = self
            .cluster(cluster)?
            .processes
            .into_iter()
            .find(|p| p.component == "kube-apiserver")
            .ok_or_else(|| Error::Invalid(format!("{cluster} has no kube-apiserver")))?;
        let component = Component::restart(cluster, &record, components::APISERVER_READY);
        if record.is_running() {
            let port = record.ports.first().copied().unwrap_or(0);
            return probes::until_ready(
                &component.describe(),
                component.ready,
                port,
                remaining(deadline),
            )
            .await;
        }
        self.start(&component, deadline).await.map(|_| ())
    }

    /// Records a started process (replacing the component's earlier record) and its child, and
    /// saves the state file, so that `down` can stop it even if this process dies.
    fn put_process(&self, cluster: &str, record: ProcessRecord, child: Child) -> Result<()> {
        let key = child_key(cluster, &record.component);
        {
            let mut state = self.state_lock();
            if cluster.is_empty() {
                state.etcd = record;
            } else {
                state.cluster_mut(cluster)?.put_process(record);
            }
        }
        self.children_lock().insert(key, child);
        self.save()
    }

    /// Stops one process of a cluster (or etcd, for cluster "").
    fn stop_process(&self, cluster: &str, component: &str) -> Result<()> {
        let mut child = self.children_lock().remove(&child_key(cluster, component));
        let mut state = self.state_lock();
        let record = if cluster.is_empty() {
            &mut state.etcd
        } else {
            state
                .cluster_mut(cluster)?
                .process_mut(component)
                .ok_or_else(|| Error::Invalid(format!("{cluster} has no {component}")))?
        };
        record.stop(child.as_mut(), STOP_GRACE)
    }

    /// Kills one process of a cluster with SIGKILL: no grace, no shutdown of its own.
    fn kill_process(&self, cluster: &str, component: &str) -> Result<()> {
        let mut child = self.children_lock().remove(&child_key(cluster, component));
        let mut state = self.state_lock();
        let record = state
            .cluster_mut(cluster)?
            .process_mut(component)
            .ok_or_else(|| Error::Invalid(format!("{cluster} has no {component}")))?;
        record.kill(child.as_mut())
    }

    /// Why a process is no longer running (None while it runs).
    fn exit_status(&self, cluster: &str, component: &str) -> Option<String> {
        if let Some(child) = self.children_lock().get_mut(&child_key(cluster, component)) {
            return match child.try_wait() {
                Ok(Some(status)) => Some(status.to_string()),
                _ => None,
            };
        }
        let state = self.state_lock();
        let record = if cluster.is_empty() {
            Some(&state.etcd)
        } else {
            state
                .clusters
                .iter()
                .find(|c| c.name == cluster)
                .and_then(|c| c.processes.iter().find(|p| p.component == component))
        };
        match record {
            Some(r) if r.is_running() => None,
            _ => Some("not running".into()),
        }
    }

    /// Changes a cluster's record, saves the state file, and returns the new record.
    fn update_cluster(
        &self,
        cluster: &str,
        change: impl FnOnce(&mut ClusterRecord),
    ) -> Result<ClusterRecord> {
        let record = {
            let mut state = self.state_lock();
            let record = state.cluster_mut(cluster)?;
            change(record);
            record.clone()
        };
        self.save()?;
        Ok(record)
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

    /// Writes the state file (under the state lock, so concurrent starts cannot interleave).
    fn save(&self) -> Result<()> {
        save_state(&self.state_lock())
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
