//! The fleet's components, each built one way: a [`Component`] names its program, the command
//! line for the loopback ports it is given, its log file and its readiness probe. Here are the
//! command lines of etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok;
//! starting one (with new ports when its port was taken first) is `Fleet::start` in `start.rs`.

use std::path::{Path, PathBuf};

use crate::nodes;
use crate::process::ProcessRecord;

/// What a component's command line is built from, given its ports.
type Args = Box<dyn Fn(&[u16]) -> Vec<String> + Send + Sync>;

/// One process of the fleet.
pub struct Component {
    /// The cluster it belongs to; empty for etcd, which serves every cluster.
    pub cluster: String,
    pub name: String,
    pub program: PathBuf,
    pub log: PathBuf,
    pub ports: Ports,
    args: Args,
    /// Ready when this answers 2xx on the first port.
    pub ready: Probe,
}

/// The loopback ports a component listens on.
pub enum Ports {
    /// This many, chosen afresh at every start attempt.
    Fresh(usize),
    /// These (a restart: clients already know them).
    Fixed(Vec<u16>),
}

/// A readiness probe: GET `path` on `scheme://127.0.0.1:<first port>` without credentials.
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    pub scheme: &'static str,
    pub path: &'static str,
}

impl Probe {
    pub const fn http(path: &'static str) -> Self {
        Self {
            scheme: "http",
            path,
        }
    }

    pub const fn https(path: &'static str) -> Self {
        Self {
            scheme: "https",
            path,
        }
    }

    /// The base URL for the component's first port.
    pub fn base(&self, port: u16) -> String {
        format!("{}://127.0.0.1:{port}", self.scheme)
    }
}

/// kube-apiserver is ready when `/readyz` says so (anonymous access to it is part of the
/// default RBAC policy).
pub const APISERVER_READY: Probe = Probe::https("/readyz");

impl Component {
    pub(super) fn new(
        cluster: &str,
        name: &str,
        program: PathBuf,
        log: PathBuf,
        ports: usize,
        ready: Probe,
        args: impl Fn(&[u16]) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            cluster: cluster.to_string(),
            name: name.to_string(),
            program,
            log,
            ports: Ports::Fresh(ports),
            args: Box::new(args),
            ready,
        }
    }

    /// The same process again, on the ports and with the command line it had.
    pub fn restart(cluster: &str, record: &ProcessRecord, ready: Probe) -> Self {
        let args = record.args.clone();
        Self {
            cluster: cluster.to_string(),
            name: record.component.clone(),
            program: record.program.clone(),
            log: record.log.clone(),
            ports: Ports::Fixed(record.ports.clone()),
            args: Box::new(move |_| args.clone()),
            ready,
        }
    }

    /// The process record for a start on `ports` (not started yet).
    pub fn record(&self, ports: &[u16]) -> ProcessRecord {
        ProcessRecord {
            component: self.name.clone(),
            program: self.program.clone(),
            args: (self.args)(ports),
            log: self.log.clone(),
            pid: 0,
            ports: ports.to_vec(),
        }
    }

    /// Its record before the first start (no command line, no ports, no pid).
    pub fn unstarted(&self) -> ProcessRecord {
        ProcessRecord {
            component: self.name.clone(),
            program: self.program.clone(),
            args: Vec::new(),
            log: self.log.clone(),
            pid: 0,
            ports: Vec::new(),
        }
    }

    /// Where it is, for messages: `kwok of cluster member-2`, `etcd of the fleet`.
    pub fn describe(&self) -> String {
        if self.cluster.is_empty() {
            format!("{} of the fleet", self.name)
        } else {
            format!("{} of cluster {}", self.name, self.cluster)
        }
    }
}

/// The files every component's command line refers to.
pub struct Layout {
    pub bin_dir: PathBuf,
    /// The fleet's state dir.
    pub dir: PathBuf,
    pub tls: TlsFiles,
    pub kwok_stages: PathBuf,
}

/// The fleet's certificate authority, service-account keys and apiserver serving certificate.
pub struct TlsFiles {
    pub ca_cert: PathBuf,
    /// kube-controller-manager signs CSRs with it.
    pub ca_key: PathBuf,
    pub service_account_key: PathBuf,
    pub service_account_pub: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
}

impl Layout {
    pub fn cluster_dir(&self, cluster: &str) -> PathBuf {
        self.dir.join(cluster)
    }

    fn bin(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }
}

/// One etcd for the whole fleet (each cluster under its own `--etcd-prefix`); ports: client, peer.
pub fn etcd(layout: &Layout) -> Component {
    let data_dir = layout.dir.join("etcd").join("data");
    Component::new(
        "",
        "etcd",
        layout.bin("etcd"),
        layout.dir.join("etcd").join("etcd.log"),
        2,
        Probe::http("/health"),
        move |ports| {
            let client = format!("http://127.0.0.1:{}", ports[0]);
            let peer = format!("http://127.0.0.1:{}", ports[1]);
            vec![
                "--name=lifeboat-fleet".into(),
                format!("--data-dir={}", data_dir.display()),
                format!("--listen-client-urls={client}"),
                format!("--advertise-client-urls={client}"),
                format!("--listen-peer-urls={peer}"),
                format!("--initial-advertise-peer-urls={peer}"),
                format!("--initial-cluster=lifeboat-fleet={peer}"),
                // A throwaway test bed: durability across host crashes is not needed, speed is.
                "--unsafe-no-fsync".into(),
                "--quota-backend-bytes=4294967296".into(),
                "--log-level=warn".into(),
            ]
        },
    )
}

pub fn kube_apiserver(layout: &Layout, cluster: &str, etcd_url: &str) -> Component {
    let cluster_dir = layout.cluster_dir(cluster);
    let fixed = vec![
        format!("--etcd-servers={etcd_url}"),
        format!("--etcd-prefix=/lifeboat-fleet/{cluster}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!(
            "--cert-dir={}",
            cluster_dir.join("apiserver-certs").display()
        ),
        format!("--tls-cert-file={}", layout.tls.serving_cert.display()),
        format!(
            "--tls-private-key-file={}",
            layout.tls.serving_key.display()
        ),
        format!("--client-ca-file={}", layout.tls.ca_cert.display()),
        format!(
            "--service-account-key-file={}",
            layout.tls.service_account_pub.display()
        ),
        format!(
            "--service-account-signing-key-file={}",
            layout.tls.service_account_key.display()
        ),
        format!("--service-account-issuer=https://{cluster}.fleet.lifeboat.local"),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--authorization-mode=Node,RBAC".into(),
        "--allow-privileged=true".into(),
        // `LIFEBOAT_FLEET_PROFILING=1` serves /debug/pprof (how BENCHMARKS.md's apiserver
        // profiles were taken); off otherwise.
        format!(
            "--profiling={}",
            std::env::var("LIFEBOAT_FLEET_PROFILING").is_ok_and(|v| v == "1")
        ),
        "--endpoint-reconciler-type=none".into(),
    ];
    Component::new(
        cluster,
        "kube-apiserver",
        layout.bin("kube-apiserver"),
        cluster_dir.join("kube-apiserver.log"),
        1,
        APISERVER_READY,
        move |ports| {
            let mut args = fixed.clone();
            args.push(format!("--secure-port={}", ports[0]));
            args
        },
    )
}

/// The flags kube-controller-manager and kube-scheduler share: their kubeconfig, and serving
/// `/healthz` on loopback.
fn controller_flags(kubeconfig: &Path, port: u16, cert_dir: &Path) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--authentication-kubeconfig={}", kubeconfig.display()),
        format!("--authorization-kubeconfig={}", kubeconfig.display()),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", cert_dir.display()),
        "--leader-elect=false".into(),
    ]
}

/// Controllers the hub does not run: the hub keeps workload templates (Deployments, Jobs, ...)
/// that run in the members, so nothing may create their pods on the hub or write their status
/// (Karmada's hub runs without them too). Garbage collection, namespaces and service accounts
/// stay on.
pub const HUB_DISABLED_CONTROLLERS: &[&str] = &[
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "daemonset-controller",
    "job-controller",
    "cronjob-controller",
    "replicationcontroller-controller",
];

/// The `--controllers` flag of a cluster's kube-controller-manager.
pub fn controllers_flag(hub: bool) -> String {
    let mut flag = "--controllers=*".to_string();
    if hub {
        for name in HUB_DISABLED_CONTROLLERS {
            flag.push_str(",-");
            flag.push_str(name);
        }
    }
    flag
}

pub fn kube_controller_manager(
    layout: &Layout,
    cluster: &str,
    index: usize,
    kubeconfig: &Path,
    hub: bool,
) -> Component {
    let cluster_dir = layout.cluster_dir(cluster);
    let kubeconfig = kubeconfig.to_path_buf();
    let cert_dir = cluster_dir.join("kcm-certs");
    let tls = &layout.tls;
    let fixed = vec![
        "--use-service-account-credentials=true".into(),
        format!(
            "--service-account-private-key-file={}",
            tls.service_account_key.display()
        ),
        format!("--root-ca-file={}", tls.ca_cert.display()),
        format!("--cluster-signing-cert-file={}", tls.ca_cert.display()),
        format!("--cluster-signing-key-file={}", tls.ca_key.display()),
        format!("--cluster-name=lifeboat-{index}"),
        controllers_flag(hub),
        // The default client rate (20 requests/s) makes a Job of thousands of pods take
        // minutes; clusters that run such Jobs raise it.
        "--kube-api-qps=100".into(),
        "--kube-api-burst=200".into(),
    ];
    Component::new(
        cluster,
        "kube-controller-manager",
        layout.bin("kube-controller-manager"),
        cluster_dir.join("kube-controller-manager.log"),
        1,
        Probe::https("/healthz"),
        move |ports| {
            let mut args = controller_flags(&kubeconfig, ports[0], &cert_dir);
            args.extend(fixed.iter().cloned());
            args
        },
    )
}

pub fn kube_scheduler(layout: &Layout, cluster: &str, kubeconfig: &Path) -> Component {
    let cluster_dir = layout.cluster_dir(cluster);
    let kubeconfig = kubeconfig.to_path_buf();
    let cert_dir = cluster_dir.join("scheduler-certs");
    Component::new(
        cluster,
        "kube-scheduler",
        layout.bin("kube-scheduler"),
        cluster_dir.join("kube-scheduler.log"),
        1,
        Probe::https("/healthz"),
        move |ports| controller_flags(&kubeconfig, ports[0], &cert_dir),
    )
}

/// kwok plays the member's nodes (those annotated for it) and their pods.
pub fn kwok(layout: &Layout, cluster: &str, index: usize, kubeconfig: &Path) -> Component {
    let cluster_dir = layout.cluster_dir(cluster);
    let fixed = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--config={}", layout.kwok_stages.display()),
        "--manage-all-nodes=false".into(),
        format!(
            "--manage-nodes-with-annotation-selector={}=fake",
            nodes::KWOK_NODE_ANNOTATION
        ),
        "--node-lease-duration-seconds=40".into(),
        format!("--cidr=10.{}.0.0/16", 100 + index),
        format!("--node-ip=10.{}.255.1", 100 + index),
    ];
    Component::new(
        cluster,
        "kwok",
        layout.bin("kwok"),
        cluster_dir.join("kwok.log"),
        1,
        Probe::http("/healthz"),
        move |ports| {
            let mut args = fixed.clone();
            args.push(format!("--server-address=127.0.0.1:{}", ports[0]));
            args
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        let dir = PathBuf::from("/state");
        Layout {
            bin_dir: "/bin-dir".into(),
            dir: dir.clone(),
            tls: TlsFiles {
                ca_cert: dir.join("pki/ca.crt"),
                ca_key: dir.join("pki/ca.key"),
                service_account_key: dir.join("pki/sa.key"),
                service_account_pub: dir.join("pki/sa.pub"),
                serving_cert: dir.join("pki/serving.crt"),
                serving_key: dir.join("pki/serving.key"),
            },
            kwok_stages: dir.join("kwok-stages.yaml"),
        }
    }

    #[test]
    fn the_hub_runs_no_workload_controllers() {
        assert_eq!(controllers_flag(false), "--controllers=*");
        let hub = controllers_flag(true);
        assert!(
            hub.starts_with("--controllers=*,-deployment-controller,"),
            "{hub}"
        );
        assert!(hub.contains(",-job-controller"), "{hub}");
    }

    #[test]
    fn each_port_given_is_on_the_command_line_and_in_the_record() {
        let layout = layout();
        let kc = Path::new("/state/member-1/x.kubeconfig");
        let cases = [
            (etcd(&layout), vec![2379, 2380]),
            (
                kube_apiserver(&layout, "hub", "http://127.0.0.1:2379"),
                vec![6443],
            ),
            (
                kube_controller_manager(&layout, "member-1", 1, kc, false),
                vec![10257],
            ),
            (kube_scheduler(&layout, "member-1", kc), vec![10259]),
            (kwok(&layout, "member-1", 1, kc), vec![10247]),
        ];
        for (component, ports) in cases {
            let record = component.record(&ports);
            assert_eq!(record.ports, ports);
            assert_eq!(record.pid, 0);
            for port in &ports {
                assert!(
                    record
                        .args
                        .iter()
                        .any(|a| a.ends_with(&format!(":{port}"))
                            || a.ends_with(&format!("={port}"))),
                    "{}: {port} not in {:?}",
                    component.name,
                    record.args
                );
            }
            assert!(record.program.starts_with("/bin-dir"));
            assert!(record.log.starts_with("/state"), "{}", record.log.display());
        }
    }

    #[test]
    fn a_restart_keeps_the_command_line_and_ports() {
        let layout = layout();
        let first = kube_apiserver(&layout, "member-2", "http://127.0.0.1:1").record(&[7000]);
        let again = Component::restart("member-2", &first, APISERVER_READY);
        assert!(matches!(&again.ports, Ports::Fixed(p) if p == &[7000]));
        // Whatever ports it is handed, the restarted command line is the recorded one.
        assert_eq!(again.record(&[7000]).args, first.args);
        assert_eq!(again.describe(), "kube-apiserver of cluster member-2");
        assert_eq!(etcd(&layout).describe(), "etcd of the fleet");
        assert_eq!(APISERVER_READY.base(7000), "https://127.0.0.1:7000");
    }
}
