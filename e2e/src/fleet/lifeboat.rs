//! Lifeboat itself on the fleet, as real processes: the hub (`lifeboat-hub`, one or more
//! replicas with `--leader-elect`, its agent-API CA in a Secret on the hub) and one agent
//! (`lifeboat-agent`) per member in hub mode, registered with a bootstrap token. Each is a fleet
//! component like kube-apiserver: own process group, log and pid file in the state dir, ports
//! from `ports::free_port`, recorded in the state file so that `fleet status` shows it and
//! `fleet down` stops it.
//!
//! Ready means: every hub's `/readyz` answers and every member's Cluster is Ready on the hub.
//! Tests stop (SIGTERM), kill (SIGKILL) and restart each process ([`LifeboatProcess`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, ObjectMeta, PostParams};
use lifeboat_api::cluster::{CONDITION_READY, Cluster, HUB_SYSTEM_NAMESPACE, TAINT_UNREACHABLE};
use lifeboat_api::credentials::{BOOTSTRAP_TOKEN_KEY, BOOTSTRAP_TOKEN_TYPE};
use serde::{Deserialize, Serialize};

use super::components::{Component, Probe};
use super::start::remaining;
use super::{Fleet, HUB, Role};
use crate::error::{Error, Result};
use crate::wait;

/// The Lifeboat binaries the fleet runs.
pub const LIFEBOAT_BINARIES: [&str; 2] = ["lifeboat-hub", "lifeboat-agent"];
/// The agent's component name in its member cluster.
pub const AGENT_COMPONENT: &str = "lifeboat-agent";
/// The hub's Lease (its default `--leader-elect-lease-name`) in [`HUB_SYSTEM_NAMESPACE`].
pub const HUB_LEASE: &str = lifeboat_api::cluster::HUB_LEASE_NAME;
/// The Secret on the hub the hubs issue the agent API's certificate from.
pub const HUB_CA_SECRET: &str = "lifeboat-hub-ca";
/// The bootstrap token Secret the fleet's agents register with.
pub const BOOTSTRAP_SECRET: &str = "fleet-bootstrap-token";

const READY: Probe = Probe::http("/readyz");

/// How Lifeboat runs on the fleet.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LifeboatConfig {
    /// Hub replicas (`--leader-elect`: one acts, every one serves the agent API).
    pub hubs: usize,
    /// The hub's `--cluster-lease-seconds`: a cluster whose agent is silent this long is Unknown.
    pub cluster_lease_seconds: u64,
    /// The hub's `--heartbeat-seconds`.
    pub heartbeat_seconds: u64,
    /// Agent replicas per member (more than one: `--leader-elect`, one acts, the others stand
    /// by, as the agent chart runs them).
    #[serde(default = "one")]
    pub agent_replicas: usize,
    /// Where `lifeboat-hub` and `lifeboat-agent` are; `None`: [`lifeboat_bin_dir`].
    pub bin_dir: Option<PathBuf>,
}

fn one() -> usize {
    1
}

impl Default for LifeboatConfig {
    /// The binaries' own defaults: one hub, 40 s cluster lease, 10 s heartbeat, one agent per
    /// member.
    fn default() -> Self {
        Self {
            hubs: 1,
            cluster_lease_seconds: 40,
            heartbeat_seconds: 10,
            agent_replicas: 1,
            bin_dir: None,
        }
    }
}

impl LifeboatConfig {
    pub(super) fn validate(&self) -> Result<()> {
        if self.hubs == 0 || self.hubs > 3 {
            return Err(Error::Invalid(format!(
                "--hubs must be between 1 and 3, got {}",
                self.hubs
            )));
        }
        if self.agent_replicas == 0 || self.agent_replicas > 3 {
            return Err(Error::Invalid(format!(
                "--agent-replicas must be between 1 and 3, got {}",
                self.agent_replicas
            )));
        }
        if self.heartbeat_seconds == 0 || self.heartbeat_seconds >= self.cluster_lease_seconds {
            return Err(Error::Invalid(format!(
                "--heartbeat-seconds must be greater than 0 and less than --cluster-lease-seconds ({}), got {}",
                self.cluster_lease_seconds, self.heartbeat_seconds
            )));
        }
        Ok(())
    }

    /// The directory of the Lifeboat binaries, checked to hold both.
    pub fn binaries(&self) -> Result<PathBuf> {
        let dir = match &self.bin_dir {
            Some(dir) => dir.clone(),
            None => lifeboat_bin_dir()?,
        };
        for name in LIFEBOAT_BINARIES {
            if !dir.join(name).is_file() {
                return Err(Error::MissingLifeboatBinary {
                    name: name.to_string(),
                    dir,
                });
            }
        }
        Ok(dir)
    }
}

/// Where the built Lifeboat binaries are: `LIFEBOAT_BIN_DIR`, else the cargo target directory of
/// the running executable (`target/debug` for `fleet` and for test binaries in
/// `target/debug/deps`).
pub fn lifeboat_bin_dir() -> Result<PathBuf> {
    if let Ok(dir) = std::env::var("LIFEBOAT_BIN_DIR")
        && !dir.is_empty()
    {
        return Ok(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().map_err(|e| Error::io(Path::new("current_exe"), e))?;
    let dir = exe
        .parent()
        .ok_or_else(|| Error::Invalid(format!("{} has no directory", exe.display())))?;
    if dir.file_name().is_some_and(|n| n == "deps")
        && let Some(profile_dir) = dir.parent()
    {
        return Ok(profile_dir.to_path_buf());
    }
    Ok(dir.to_path_buf())
}

/// What the fleet's Lifeboat was started with (in the state file).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LifeboatState {
    pub config: LifeboatConfig,
    pub bin_dir: PathBuf,
    /// The hubs' agent API URLs, in replica order (every agent is given all of them).
    pub hub_urls: Vec<String>,
    /// The CA of the agent API (from the hub's CA Secret), as the agents read it.
    pub ca_file: PathBuf,
    pub bootstrap_token_file: PathBuf,
}

/// One Lifeboat process of the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LifeboatProcess {
    /// Hub replica 1, 2, ...
    Hub(usize),
    /// Agent replica 1, 2, ... of this member cluster.
    Agent(String, usize),
}

impl LifeboatProcess {
    /// The fleet cluster the process belongs to.
    pub fn cluster(&self) -> &str {
        match self {
            LifeboatProcess::Hub(_) => HUB,
            LifeboatProcess::Agent(member, _) => member,
        }
    }

    /// The first (or only) agent replica of `member`.
    pub fn agent(member: &str) -> Self {
        LifeboatProcess::Agent(member.to_string(), 1)
    }

    /// Its component name (also its leader-election identity, for hubs).
    pub fn component(&self) -> String {
        match self {
            LifeboatProcess::Hub(i) => format!("lifeboat-hub-{i}"),
            LifeboatProcess::Agent(_, 1) => AGENT_COMPONENT.into(),
            LifeboatProcess::Agent(_, i) => format!("{AGENT_COMPONENT}-{i}"),
        }
    }

    fn parse(cluster: &str, component: &str) -> Option<Self> {
        if cluster != HUB {
            if component == AGENT_COMPONENT {
                return Some(LifeboatProcess::agent(cluster));
            }
            if let Some(i) = component
                .strip_prefix(AGENT_COMPONENT)
                .and_then(|rest| rest.strip_prefix('-'))
                .and_then(|i| i.parse().ok())
                .filter(|i| *i >= 2)
            {
                return Some(LifeboatProcess::Agent(cluster.to_string(), i));
            }
        }
        component
            .strip_prefix("lifeboat-hub-")
            .and_then(|i| i.parse().ok())
            .filter(|_| cluster == HUB)
            .map(LifeboatProcess::Hub)
    }
}

impl std::fmt::Display for LifeboatProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.cluster(), self.component())
    }
}

/// A Lifeboat process as `fleet status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessStatus {
    pub cluster: String,
    pub component: String,
    pub pid: i32,
    pub alive: bool,
    pub ports: Vec<u16>,
    pub log: PathBuf,
}

/// A member as the hub sees it.
#[derive(Debug, Clone, Serialize)]
pub struct MemberStatus {
    pub name: String,
    /// The Cluster's Ready condition: True, False, Unknown, or "-" when not registered.
    pub ready: String,
    pub reason: String,
    pub taints: Vec<String>,
}

/// Lifeboat on the fleet: its processes, the hub's leader, and each member's Cluster.
#[derive(Debug, Clone, Serialize)]
pub struct LifeboatStatus {
    pub processes: Vec<ProcessStatus>,
    pub hub_urls: Vec<String>,
    /// `holderIdentity` of the hub's Lease (a hub process's component name).
    pub leader: Option<String>,
    pub members: Vec<MemberStatus>,
    /// Why the hub could not be asked (empty when it answered).
    pub error: String,
}

impl LifeboatStatus {
    /// Every process alive and every member's Cluster Ready.
    pub fn ready(&self) -> bool {
        self.error.is_empty()
            && self.processes.iter().all(|p| p.alive)
            && self.members.iter().all(|m| m.ready == "True")
    }
}

/// The Ready condition of a Cluster: (status, reason); `None` before the hub wrote one.
pub fn cluster_ready(cluster: &Cluster) -> Option<(String, String)> {
    cluster
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_READY)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// True when the hub put its unreachable taint on the Cluster.
pub fn has_unreachable_taint(cluster: &Cluster) -> bool {
    cluster
        .spec
        .taints
        .iter()
        .any(|t| t.key == TAINT_UNREACHABLE && t.effect == "NoSchedule")
}

/// A fresh bootstrap token (32 random bytes, hex).
fn new_token() -> Result<String> {
    use std::io::Read;
    let path = Path::new("/dev/urandom");
    let mut bytes = [0u8; 32];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Error::io(path, e))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn write_private(path: &Path, contents: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    file.write_all(contents).map_err(|e| Error::io(path, e))
}

impl Fleet {
    /// Starts the hub replicas (first one first, so that it leads and makes the CA), then an
    /// agent per member; returns once every hub is ready and every member's Cluster is Ready.
    pub(super) async fn start_lifeboat(
        &self,
        config: &LifeboatConfig,
        deadline: Instant,
    ) -> Result<()> {
        config.validate()?;
        let bin_dir = config.binaries()?;
        let dir = self.state_dir().join("lifeboat");
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let hub = self.client(HUB).await?;
        // The hub keeps AppWrappers as templates: their CRD must be served there too.
        lifeboat_runtime::crd::ensure(
            &hub,
            &lifeboat_api::crds::appwrapper().crd,
            "lifeboat-fleet",
            lifeboat_runtime::crd::ESTABLISHED_TIMEOUT,
        )
        .await
        .map_err(|e| Error::Invalid(format!("installing the AppWrapper CRD on the hub: {e}")))?;
        let bootstrap_token_file = dir.join("bootstrap-token");
        create_bootstrap_token(&hub, &bootstrap_token_file).await?;

        let hub_kubeconfig = self.kubeconfig(HUB)?;
        let mut hub_urls = Vec::new();
        for i in 1..=config.hubs {
            let component = hub_component(&bin_dir, &hub_kubeconfig, i, config);
            let record = self.start(&component, deadline).await?;
            write_pid_file(&record.log, record.pid)?;
            hub_urls.push(format!("https://127.0.0.1:{}", record.ports[1]));
        }
        let ca_file = dir.join("hub-ca.pem");
        write_hub_ca(&hub, &ca_file, deadline).await?;
        let state = LifeboatState {
            config: config.clone(),
            bin_dir: bin_dir.clone(),
            hub_urls,
            ca_file,
            bootstrap_token_file,
        };
        self.state_lock().lifeboat = Some(state.clone());
        self.save()?;

        for member in self.member_names() {
            let record = self.cluster(&member)?;
            for replica in 1..=config.agent_replicas {
                let component = agent_component(&state, &record, replica);
                let started = self.start(&component, deadline).await?;
                write_pid_file(&started.log, started.pid)?;
            }
        }
        self.until_lifeboat_ready(remaining(deadline)).await
    }

    /// Waits until every Lifeboat process is alive and every member's Cluster is Ready on the
    /// hub.
    pub async fn until_lifeboat_ready(&self, timeout: Duration) -> Result<()> {
        wait::until(
            "Lifeboat ready (every member's Cluster Ready)",
            timeout,
            || async {
                match self.lifeboat_status().await {
                    Some(status) if status.ready() => Ok(()),
                    Some(status) => Err(describe_waiting(&status)),
                    None => Err("Lifeboat is not started on this fleet".to_string()),
                }
            },
        )
        .await
    }

    /// What Lifeboat started with (`None` without `--lifeboat`).
    pub fn lifeboat(&self) -> Option<LifeboatState> {
        self.state_lock().lifeboat.clone()
    }

    /// The fleet's Lifeboat processes (hubs first, then agents).
    pub fn lifeboat_processes(&self) -> Vec<LifeboatProcess> {
        let state = self.state_lock();
        let mut out: Vec<LifeboatProcess> = state
            .clusters
            .iter()
            .flat_map(|c| {
                c.processes
                    .iter()
                    .filter_map(|p| LifeboatProcess::parse(&c.name, &p.component))
            })
            .collect();
        out.sort_by_key(|p| match p {
            LifeboatProcess::Hub(i) => (0, String::new(), *i),
            LifeboatProcess::Agent(m, i) => (1, m.clone(), *i),
        });
        out
    }

    /// Processes, leader and members' Cluster conditions (`None` without Lifeboat).
    pub async fn lifeboat_status(&self) -> Option<LifeboatStatus> {
        let lifeboat = self.lifeboat()?;
        let state = self.snapshot();
        let processes = self
            .lifeboat_processes()
            .iter()
            .filter_map(|p| {
                let record = state
                    .clusters
                    .iter()
                    .find(|c| c.name == p.cluster())?
                    .processes
                    .iter()
                    .find(|r| r.component == p.component())?;
                Some(ProcessStatus {
                    cluster: p.cluster().to_string(),
                    component: record.component.clone(),
                    pid: record.pid,
                    alive: record.is_running(),
                    ports: record.ports.clone(),
                    log: record.log.clone(),
                })
            })
            .collect();
        let mut status = LifeboatStatus {
            processes,
            hub_urls: lifeboat.hub_urls.clone(),
            leader: None,
            members: Vec::new(),
            error: String::new(),
        };
        let members: Vec<String> = state
            .clusters
            .iter()
            .filter(|c| c.role == Role::Member)
            .map(|c| c.name.clone())
            .collect();
        match self.hub_view(&members).await {
            Ok((leader, m)) => {
                status.leader = leader;
                status.members = m;
            }
            Err(e) => status.error = e.to_string(),
        }
        Some(status)
    }

    async fn hub_view(&self, members: &[String]) -> Result<(Option<String>, Vec<MemberStatus>)> {
        let client = self.client(HUB).await?;
        let leases: Api<Lease> = Api::namespaced(client.clone(), HUB_SYSTEM_NAMESPACE);
        let leader = leases
            .get_opt(HUB_LEASE)
            .await
            .map_err(|e| Error::kube("get the hub's Lease", e))?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty());
        let clusters: Api<Cluster> = Api::all(client);
        let mut out = Vec::new();
        for name in members {
            let cluster = clusters
                .get_opt(name)
                .await
                .map_err(|e| Error::kube(format!("get Cluster {name}"), e))?;
            let member = match cluster {
                None => MemberStatus {
                    name: name.clone(),
                    ready: "-".into(),
                    reason: "not registered".into(),
                    taints: Vec::new(),
                },
                Some(c) => {
                    let (ready, reason) =
                        cluster_ready(&c).unwrap_or_else(|| ("-".into(), "no condition".into()));
                    MemberStatus {
                        name: name.clone(),
                        ready,
                        reason,
                        taints: c
                            .spec
                            .taints
                            .iter()
                            .map(|t| format!("{}:{}", t.key, t.effect))
                            .collect(),
                    }
                }
            };
            out.push(member);
        }
        Ok((leader, out))
    }

    /// Stops a Lifeboat process gracefully (SIGTERM; a hub releases its Lease).
    pub fn stop_lifeboat(&self, process: &LifeboatProcess) -> Result<()> {
        let record = self.lifeboat_record(process)?;
        self.stop_process(process.cluster(), &process.component())?;
        remove_pid_file(&record.log);
        self.save()
    }

    /// Kills a Lifeboat process with SIGKILL (no shutdown: a hub keeps its Lease until it
    /// expires, an agent its cluster Lease on the hub).
    pub fn kill_lifeboat(&self, process: &LifeboatProcess) -> Result<()> {
        let record = self.lifeboat_record(process)?;
        self.kill_process(process.cluster(), &process.component())?;
        remove_pid_file(&record.log);
        self.save()
    }

    /// Starts a stopped or killed Lifeboat process again with the command line and ports it had
    /// (agents know the hubs' ports); returns once its `/readyz` answers.
    pub async fn restart_lifeboat(&self, process: &LifeboatProcess) -> Result<()> {
        let record = self.lifeboat_record(process)?;
        if record.is_running() {
            return Err(Error::Invalid(format!(
                "{process} is running; stop it first"
            )));
        }
        let deadline = Instant::now() + self.snapshot().config.ready_timeout;
        let component = Component::restart(process.cluster(), &record, READY);
        let started = self.start(&component, deadline).await?;
        write_pid_file(&started.log, started.pid)
    }

    fn lifeboat_record(&self, process: &LifeboatProcess) -> Result<crate::process::ProcessRecord> {
        self.cluster(process.cluster())?
            .processes
            .into_iter()
            .find(|p| p.component == process.component())
            .ok_or_else(|| Error::Invalid(format!("the fleet runs no {process}")))
    }
}

fn describe_waiting(status: &LifeboatStatus) -> String {
    if !status.error.is_empty() {
        return status.error.clone();
    }
    let mut waiting: Vec<String> = status
        .processes
        .iter()
        .filter(|p| !p.alive)
        .map(|p| format!("{}/{} not running", p.cluster, p.component))
        .collect();
    waiting.extend(
        status
            .members
            .iter()
            .filter(|m| m.ready != "True")
            .map(|m| format!("Cluster {} Ready={} ({})", m.name, m.ready, m.reason)),
    );
    waiting.join("; ")
}

fn pid_file(log: &Path) -> PathBuf {
    log.with_extension("pid")
}

fn write_pid_file(log: &Path, pid: i32) -> Result<()> {
    let path = pid_file(log);
    std::fs::write(&path, format!("{pid}\n")).map_err(|e| Error::io(&path, e))
}

fn remove_pid_file(log: &Path) {
    let _ = std::fs::remove_file(pid_file(log));
}

/// Hub replica `i`: ports metrics (readiness) and agent API.
fn hub_component(
    bin_dir: &Path,
    kubeconfig: &Path,
    i: usize,
    config: &LifeboatConfig,
) -> Component {
    let name = LifeboatProcess::Hub(i).component();
    let log = kubeconfig
        .parent()
        .unwrap_or(Path::new("."))
        .join(format!("{name}.log"));
    // One ledger for every replica (only the leader writes), in the hub's state folder.
    let ledger = kubeconfig
        .parent()
        .unwrap_or(Path::new("."))
        .join("lifeboat-ledger.db");
    let kubeconfig = kubeconfig.to_path_buf();
    let (lease, heartbeat) = (config.cluster_lease_seconds, config.heartbeat_seconds);
    Component::new(
        HUB,
        &name.clone(),
        bin_dir.join("lifeboat-hub"),
        log,
        3,
        READY,
        move |ports| {
            vec![
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--metrics-bind=127.0.0.1:{}", ports[0]),
                format!("--agent-api-bind=127.0.0.1:{}", ports[1]),
                "--agent-api-names=127.0.0.1,localhost".into(),
                format!("--agent-api-ca-secret={HUB_CA_SECRET}"),
                // The customization admission webhook, registered by the hub.
                "--webhook-url-host=127.0.0.1".into(),
                format!("--webhook-bind=127.0.0.1:{}", ports[2]),
                format!("--cluster-lease-seconds={lease}"),
                format!("--heartbeat-seconds={heartbeat}"),
                format!("--database-url=sqlite://{}", ledger.display()),
                "--leader-elect=true".into(),
                format!("--leader-elect-lease-name={HUB_LEASE}"),
                // A stable identity: a restarted replica takes its own Lease back at once.
                format!("--leader-elect-identity={name}"),
            ]
        },
    )
}

/// Agent replica `replica` of a member, in hub mode: port metrics (readiness).
fn agent_component(
    lifeboat: &LifeboatState,
    member: &super::ClusterRecord,
    replica: usize,
) -> Component {
    let process = LifeboatProcess::Agent(member.name.clone(), replica);
    let name = process.component();
    let log = member
        .kubeconfig
        .parent()
        .unwrap_or(Path::new("."))
        .join(format!("{name}.log"));
    let mut fixed = vec![
        format!("--kubeconfig={}", member.kubeconfig.display()),
        format!("--cluster-name={}", member.name),
    ];
    if lifeboat.config.agent_replicas > 1 {
        // Replicas elect one leader on a Lease in the member (in its kubeconfig's namespace,
        // `default`: the agent makes its own namespace only once it leads); a stable identity
        // lets a restarted replica take its own Lease back at once.
        fixed.extend([
            "--leader-elect=true".into(),
            format!("--leader-elect-identity={}-{name}", member.name),
        ]);
    } else {
        // One replica per member; a restarted agent must not wait out its predecessor's Lease.
        fixed.push("--leader-elect=false".into());
    }
    fixed.extend([
        format!("--hub-url={}", lifeboat.hub_urls.join(",")),
        format!("--hub-ca-file={}", lifeboat.ca_file.display()),
        format!(
            "--bootstrap-token-file={}",
            lifeboat.bootstrap_token_file.display()
        ),
        "--provider=kwok".into(),
    ]);
    if let Some(region) = &member.region {
        fixed.push(format!("--region={region}"));
    }
    if let Some(zone) = &member.zone {
        fixed.push(format!("--zone={zone}"));
    }
    Component::new(
        &member.name,
        &name,
        lifeboat.bin_dir.join("lifeboat-agent"),
        log,
        1,
        READY,
        move |ports| {
            let mut args = fixed.clone();
            args.push(format!("--metrics-bind=127.0.0.1:{}", ports[0]));
            args
        },
    )
}

/// The bootstrap token Secret on the hub (in its system namespace), and the token in `file`.
async fn create_bootstrap_token(hub: &kube::Client, file: &Path) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(hub.clone());
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(HUB_SYSTEM_NAMESPACE.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match namespaces.create(&PostParams::default(), &namespace).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(Error::kube("create the hub's system namespace", e)),
    }
    let token = new_token()?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(BOOTSTRAP_SECRET.into()),
            ..Default::default()
        },
        type_: Some(BOOTSTRAP_TOKEN_TYPE.into()),
        data: Some(
            [(
                BOOTSTRAP_TOKEN_KEY.to_string(),
                ByteString(token.as_bytes().to_vec()),
            )]
            .into(),
        ),
        ..Default::default()
    };
    let secrets: Api<Secret> = Api::namespaced(hub.clone(), HUB_SYSTEM_NAMESPACE);
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .map_err(|e| Error::kube("create the bootstrap token Secret", e))?;
    write_private(file, token.as_bytes())
}

/// The ResourceBinding of template `name` on the hub (listed from `bindings`).
pub async fn binding_of(
    bindings: &Api<lifeboat_api::binding::ResourceBinding>,
    name: &str,
) -> std::result::Result<lifeboat_api::binding::ResourceBinding, String> {
    bindings
        .list(&kube::api::ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items
        .into_iter()
        .find(|b| b.spec.resource.name == name)
        .ok_or_else(|| format!("no binding of {name} yet"))
}

/// Waits until template `name`'s binding places it on exactly one cluster; returns that
/// cluster.
pub async fn until_placed_on_one(
    bindings: &Api<lifeboat_api::binding::ResourceBinding>,
    name: &str,
    timeout: Duration,
) -> Result<String> {
    wait::until(&format!("{name} placed"), timeout, || async {
        match placement(&binding_of(bindings, name).await?).as_slice() {
            [one] => Ok(one.clone()),
            other => Err(format!("clusters {other:?}")),
        }
    })
    .await
}

/// The clusters a binding is placed on.
pub fn placement(binding: &lifeboat_api::binding::ResourceBinding) -> Vec<String> {
    binding
        .spec
        .clusters
        .iter()
        .map(|c| c.name.clone())
        .collect()
}

/// Creates or updates a PropagationPolicy `namespace/name` with `spec` on the hub (server-side
/// apply, field manager `e2e`): what the tests and the demo place workloads with.
pub async fn apply_propagation_policy(
    hub: &kube::Client,
    namespace: &str,
    name: &str,
    spec: serde_json::Value,
) -> Result<()> {
    let policies: Api<lifeboat_api::policy::PropagationPolicy> =
        Api::namespaced(hub.clone(), namespace);
    let policy = serde_json::json!({
        "apiVersion": "policy.lifeboat.dev/v1alpha1", "kind": "PropagationPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    });
    policies
        .patch(
            name,
            &kube::api::PatchParams::apply("e2e").force(),
            &kube::api::Patch::Apply(&policy),
        )
        .await
        .map_err(|e| Error::kube("apply the PropagationPolicy", e))?;
    Ok(())
}

/// The PEM of the CA the hub issues its agent-API certificate from (`tls.crt` of the Secret
/// `secret` in the hub's system namespace), once the hub has created it. For the fleet and for
/// tests and benches that run the hub in process.
pub async fn hub_ca(hub: &kube::Client, secret: &str, timeout: Duration) -> Result<Vec<u8>> {
    hub_ca_in(hub, HUB_SYSTEM_NAMESPACE, secret, timeout).await
}

/// [`hub_ca`] for a hub whose `--namespace` is `namespace`.
pub async fn hub_ca_in(
    hub: &kube::Client,
    namespace: &str,
    secret: &str,
    timeout: Duration,
) -> Result<Vec<u8>> {
    let secrets: Api<Secret> = Api::namespaced(hub.clone(), namespace);
    let ca = wait::until("the hub's CA Secret", timeout, || async {
        match secrets.get_opt(secret).await {
            Ok(Some(s)) => s
                .data
                .and_then(|d| d.get("tls.crt").cloned())
                .ok_or_else(|| "no tls.crt".to_string()),
            Ok(None) => Err("not created yet".into()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    Ok(ca.0)
}

/// The AppWrapper resource (workload.codeflare.dev/v1beta2).
pub fn appwrapper_resource() -> kube::core::ApiResource {
    kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "workload.codeflare.dev",
        "v1beta2",
        "AppWrapper",
    ))
}

/// A one-pod GPU training AppWrapper that runs until deleted.
pub fn training_appwrapper(
    name: &str,
    namespace: &str,
) -> std::result::Result<kube::api::DynamicObject, serde_json::Error> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"components": [{"template": {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name},
            "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "trainer", "image": "busybox",
                    "command": ["sh", "-c", "sleep infinity"],
                    "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "100m"}}}]}}}
        }}]}
    }))
}

/// Applies a PropagationPolicy `namespace/name` pinning AppWrapper `name` to `cluster`, then
/// creates that AppWrapper ([`training_appwrapper`]) on the hub.
pub async fn place_training(
    hub: &kube::Client,
    namespace: &str,
    name: &str,
    cluster: &str,
) -> Result<()> {
    apply_propagation_policy(
        hub,
        namespace,
        name,
        serde_json::json!({
            "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": name}],
            "placement": {"clusterAffinity": {"clusterNames": [cluster]}}
        }),
    )
    .await?;
    let template = training_appwrapper(name, namespace)
        .map_err(|e| Error::Invalid(format!("the training AppWrapper: {e}")))?;
    Api::<kube::api::DynamicObject>::namespaced_with(
        hub.clone(),
        namespace,
        &appwrapper_resource(),
    )
    .create(&PostParams::default(), &template)
    .await
    .map_err(|e| Error::kube("create the AppWrapper on the hub", e))?;
    Ok(())
}

/// Waits until AppWrapper `name` in `api` (a member's) is Running; returns it. `member` names
/// the cluster in the timeout message.
pub async fn until_appwrapper_running(
    api: &Api<kube::api::DynamicObject>,
    name: &str,
    member: &str,
    timeout: Duration,
) -> Result<kube::api::DynamicObject> {
    wait::until(
        &format!("AppWrapper {name} Running in {member}"),
        timeout,
        || async {
            let aw = api
                .get_opt(name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("not applied yet")?;
            match aw.data["status"]["phase"].as_str() {
                Some("Running") => Ok(aw),
                other => Err(format!("phase {other:?}")),
            }
        },
    )
    .await
}

/// Writes the CA the hub issued its agent-API certificate from (its CA Secret's `tls.crt`).
async fn write_hub_ca(hub: &kube::Client, file: &Path, deadline: Instant) -> Result<()> {
    let ca = hub_ca(hub, HUB_CA_SECRET, remaining(deadline)).await?;
    std::fs::write(file, &ca).map_err(|e| Error::io(file, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_names_round_trip() {
        for p in [
            LifeboatProcess::Hub(1),
            LifeboatProcess::Hub(2),
            LifeboatProcess::agent("member-3"),
            LifeboatProcess::Agent("member-3".into(), 2),
        ] {
            assert_eq!(
                LifeboatProcess::parse(p.cluster(), &p.component()),
                Some(p.clone())
            );
        }
        assert_eq!(LifeboatProcess::Hub(2).to_string(), "hub/lifeboat-hub-2");
        assert_eq!(
            LifeboatProcess::Agent("member-3".into(), 2).to_string(),
            "member-3/lifeboat-agent-2"
        );
        assert_eq!(LifeboatProcess::parse("member-1", "lifeboat-agent-1"), None);
        assert_eq!(LifeboatProcess::parse("hub", "kube-apiserver"), None);
        assert_eq!(LifeboatProcess::parse("member-1", "lifeboat-hub-1"), None);
    }

    #[test]
    fn bad_settings_name_the_flag() {
        let mut config = LifeboatConfig {
            hubs: 0,
            ..Default::default()
        };
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--hubs")
        );
        config.hubs = 2;
        config.heartbeat_seconds = 40;
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--heartbeat-seconds")
        );
        config.heartbeat_seconds = 2;
        assert!(config.validate().is_ok());
    }

    #[test]
    fn a_missing_binary_names_the_build_command() {
        let config = LifeboatConfig {
            bin_dir: Some(std::env::temp_dir().join("lifeboat-no-binaries-here")),
            ..Default::default()
        };
        let text = config.binaries().unwrap_err().to_string();
        assert!(
            text.contains("lifeboat-hub")
                && text.contains("cargo build -p lifeboat-hub -p lifeboat-agent"),
            "{text}"
        );
    }

    #[test]
    fn bootstrap_tokens_are_long_random_hex() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
