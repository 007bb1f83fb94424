//! The hub's ResourceBindings as an operator reads and acts on them:
//!
//! - `get bindings [-n NAMESPACE | -A] [-o json]`: each binding's placement, what every cluster
//!   it is placed on or being evicted from reports (applied, health, failure class, reason) and
//!   its eviction tasks with what each waits for.
//! - `confirm-purge NAMESPACE/NAME CLUSTER`: confirms the purge of an old copy in CLUSTER (adds
//!   the cluster to the binding's `work.lifeboat.dev/confirm-purge` annotation; the hub removes
//!   the entry once the purge is done). For a `Never` eviction the hub then removes the copy; for
//!   a `Directly` eviction whose cluster is lost it is the operator's word that the copy no
//!   longer runs (the hub could not confirm it), and the hub creates the new copy. Refused when
//!   the binding has no such eviction. `confirm-purge --all-in CLUSTER` does it for every
//!   binding with such an eviction from CLUSTER (a whole cluster known to be down).
//!
//! Both read the hub cluster through `--kubeconfig` (or `KUBECONFIG`, in-cluster, then
//! `~/.kube/config`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams};
use lifeboat_api::binding::{
    ANNOTATION_CONFIRM_PURGE, CONDITION_FAILOVER_BLOCKED, CONDITION_SCHEDULED,
    GracefulEvictionTask, ResourceBinding, confirmed_purges,
};
use lifeboat_api::policy::PurgeMode;
use serde::Serialize;

use crate::history::parse_binding;
use crate::table::{self, one_line};

/// How long a Gracefully task without a grace period lasts (the hub's default).
const DEFAULT_GRACE_SECONDS: i64 = 600;
/// Tries of the annotation patch when the binding changes meanwhile.
const CONFIRM_TRIES: usize = 5;

#[derive(clap::Args)]
pub struct HubArgs {
    /// Kubeconfig of the hub cluster (default: in-cluster, then ~/.kube/config).
    #[arg(long, env = "KUBECONFIG", global = true)]
    kubeconfig: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct GetArgs {
    #[command(subcommand)]
    what: GetWhat,
}

#[derive(clap::Subcommand)]
enum GetWhat {
    /// ResourceBindings: placement, per-cluster applied, health, class and reason, eviction tasks.
    Bindings(GetBindingsArgs),
}

#[derive(clap::Args)]
struct GetBindingsArgs {
    /// Only this namespace (default: the kubeconfig context's namespace, else `default`).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    all_namespaces: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(flatten)]
    hub: HubArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(clap::Args)]
pub struct ConfirmPurgeArgs {
    /// NAMESPACE/NAME of the ResourceBinding.
    #[arg(required_unless_present = "all_in", requires = "cluster")]
    binding: Option<String>,
    /// The cluster whose old copy may now be removed (Never), or no longer runs (Directly).
    #[arg(conflicts_with = "all_in")]
    cluster: Option<String>,
    /// Every binding with a Never eviction, or a Directly eviction still waiting, from this
    /// cluster: the whole cluster is known to be down (its old copies no longer run).
    #[arg(long, value_name = "CLUSTER")]
    all_in: Option<String>,
    #[command(flatten)]
    hub: HubArgs,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// A client of the hub cluster (also `reset`'s).
pub(crate) async fn hub_client(hub: &HubArgs) -> anyhow::Result<kube::Client> {
    Ok(lifeboat_runtime::client::from_kubeconfig(hub.kubeconfig.as_deref()).await?)
}

pub fn run_get(args: GetArgs) -> anyhow::Result<ExitCode> {
    let GetWhat::Bindings(args) = args.what;
    let bindings = runtime()?.block_on(async {
        let client = hub_client(&args.hub).await?;
        let api: Api<ResourceBinding> = if args.all_namespaces {
            Api::all(client)
        } else {
            let namespace = args
                .namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_string());
            Api::namespaced(client, &namespace)
        };
        api.list(&ListParams::default())
            .await
            .context("listing ResourceBindings on the hub")
    })?;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut views: Vec<BindingView> = bindings.items.iter().map(|b| view(b, &now)).collect();
    views.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&views)?),
        Output::Table => print!("{}", render_table(&views)),
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run_confirm_purge(args: ConfirmPurgeArgs) -> anyhow::Result<ExitCode> {
    if let Some(cluster) = &args.all_in {
        anyhow::ensure!(!cluster.is_empty(), "--all-in: the cluster name is empty");
        let messages = runtime()?.block_on(async {
            let client = hub_client(&args.hub).await?;
            let bindings = Api::<ResourceBinding>::all(client.clone())
                .list(&ListParams::default())
                .await
                .context("listing ResourceBindings on the hub")?;
            let mut messages = Vec::new();
            for b in bindings
                .items
                .iter()
                .filter(|b| awaits_confirmation(b, cluster))
            {
                let (namespace, name) = b.key();
                let api: Api<ResourceBinding> = Api::namespaced(client.clone(), &namespace);
                messages.push(confirm_purge(&api, &namespace, &name, cluster).await?);
            }
            anyhow::Ok(messages)
        })?;
        for message in &messages {
            println!("{message}");
        }
        println!(
            "{} binding(s) with an eviction from {cluster} waiting for a confirmation",
            messages.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let (Some(binding), Some(cluster)) = (&args.binding, &args.cluster) else {
        anyhow::bail!("give NAMESPACE/NAME CLUSTER, or --all-in CLUSTER");
    };
    let (namespace, name) = parse_binding(binding)?;
    anyhow::ensure!(!cluster.is_empty(), "cluster: the name is empty");
    let message = runtime()?.block_on(async {
        let client = hub_client(&args.hub).await?;
        let api: Api<ResourceBinding> = Api::namespaced(client, namespace);
        confirm_purge(&api, namespace, name, cluster).await
    })?;
    println!("{message}");
    Ok(ExitCode::SUCCESS)
}

/// The binding has an eviction from `cluster` that a confirmation is for, not confirmed yet.
fn awaits_confirmation(binding: &ResourceBinding, cluster: &str) -> bool {
    matches!(confirmation(binding, cluster), Ok(Some(_)))
}

/// Adds `cluster` to the binding's confirm-purge annotation (a merge patch with the binding's
/// resourceVersion, read again and retried when the binding changed meanwhile); says what it
/// did.
pub async fn confirm_purge(
    api: &Api<ResourceBinding>,
    namespace: &str,
    name: &str,
    cluster: &str,
) -> anyhow::Result<String> {
    for _ in 0..CONFIRM_TRIES {
        let binding = api
            .get_opt(name)
            .await
            .with_context(|| format!("reading ResourceBinding {namespace}/{name}"))?
            .with_context(|| {
                format!("binding: no ResourceBinding {namespace}/{name} on the hub")
            })?;
        let Some(value) = confirmation(&binding, cluster)? else {
            return Ok(format!(
                "the purge of the old copy of {namespace}/{name} in {cluster} was already confirmed"
            ));
        };
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": binding.metadata.resource_version,
            "annotations": {ANNOTATION_CONFIRM_PURGE: value},
        }});
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                let directly = binding
                    .spec
                    .graceful_eviction_tasks
                    .iter()
                    .any(|t| t.from_cluster == cluster && purge_mode(t) == PurgeMode::Directly);
                return Ok(if directly {
                    format!(
                        "confirmed: the old copy of {namespace}/{name} in {cluster} no longer runs (your word); the hub creates the new copy"
                    )
                } else {
                    format!(
                        "confirmed: the hub removes the old copy of {namespace}/{name} in {cluster}"
                    )
                });
            }
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("annotating ResourceBinding {namespace}/{name} with {ANNOTATION_CONFIRM_PURGE}")
                });
            }
        }
    }
    anyhow::bail!(
        "ResourceBinding {namespace}/{name} kept changing: not confirmed after {CONFIRM_TRIES} tries"
    )
}

/// The confirm-purge annotation's value with `cluster` added (`None`: it is there already), or
/// why `cluster` has no purge to confirm.
pub fn confirmation(binding: &ResourceBinding, cluster: &str) -> anyhow::Result<Option<String>> {
    let (namespace, name) = binding.key();
    let tasks = &binding.spec.graceful_eviction_tasks;
    let Some(task) = tasks.iter().find(|t| t.from_cluster == cluster) else {
        let others: Vec<String> = tasks
            .iter()
            .map(|t| format!("{} ({})", t.from_cluster, purge_mode(t).as_str()))
            .collect();
        anyhow::bail!(
            "cluster: ResourceBinding {namespace}/{name} has no eviction from {cluster} (its eviction tasks: {}); \
             confirm-purge confirms the purge of an old copy that an eviction with purgeMode Never keeps, \
             or that a Directly eviction waits for",
            if others.is_empty() {
                "none".to_string()
            } else {
                others.join(", ")
            }
        );
    };
    match purge_mode(task) {
        PurgeMode::Never => {}
        PurgeMode::Directly if task.purged_at.is_none() => {}
        PurgeMode::Directly => anyhow::bail!(
            "cluster: the old copy of ResourceBinding {namespace}/{name} in {cluster} was already confirmed gone: nothing to confirm"
        ),
        mode => anyhow::bail!(
            "cluster: the eviction of ResourceBinding {namespace}/{name} from {cluster} has purgeMode {}, not Never or Directly: \
             the hub removes that old copy without a confirmation",
            mode.as_str()
        ),
    }
    let mut confirmed = confirmed_purges(binding);
    if !confirmed.insert(cluster.to_string()) {
        return Ok(None);
    }
    Ok(Some(confirmed.into_iter().collect::<Vec<_>>().join(",")))
}

fn purge_mode(task: &GracefulEvictionTask) -> PurgeMode {
    task.purge_mode.unwrap_or_default()
}

/// What `get bindings` shows of one binding.
#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BindingView {
    pub namespace: String,
    pub name: String,
    /// `Kind/name` of the workload template.
    pub resource: String,
    pub placement: Vec<PlacedView>,
    /// Every cluster the binding is placed on, being evicted from, or has a status item of.
    pub clusters: Vec<ClusterView>,
    pub eviction_tasks: Vec<TaskView>,
    /// The `Scheduled` condition's message when it is not True.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unscheduled: Option<String>,
    /// The `FailoverBlocked` condition's message while it is True.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover_blocked: Option<String>,
}

#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PlacedView {
    pub cluster: String,
    pub replicas: i32,
}

#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterView {
    pub cluster: String,
    /// `placed`, `evicted` (an eviction task keeps or awaits its old copy) or `reported` (a
    /// status item only).
    pub role: &'static str,
    pub applied: bool,
    pub health: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_class: Option<String>,
    /// The health reason, else the apply message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<Time>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gone_at: Option<Time>,
}

#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TaskView {
    pub from_cluster: String,
    pub purge_mode: &'static str,
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Time>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub purged_at: Option<Time>,
    /// What the task waits for.
    pub state: String,
}

pub fn view(binding: &ResourceBinding, now: &Time) -> BindingView {
    let (namespace, name) = binding.key();
    let spec = &binding.spec;
    let confirmed = confirmed_purges(binding);
    let items = binding
        .status
        .as_ref()
        .map(|s| s.aggregated_status.as_slice())
        .unwrap_or_default();
    let mut names: Vec<(&str, &'static str)> = spec
        .clusters
        .iter()
        .map(|c| (c.name.as_str(), "placed"))
        .collect();
    for task in &spec.graceful_eviction_tasks {
        if !names.iter().any(|(n, _)| *n == task.from_cluster) {
            names.push((task.from_cluster.as_str(), "evicted"));
        }
    }
    for item in items {
        if !names.iter().any(|(n, _)| *n == item.cluster_name) {
            names.push((item.cluster_name.as_str(), "reported"));
        }
    }
    let clusters = names
        .into_iter()
        .map(|(cluster, role)| {
            let item = binding.cluster_status(cluster);
            ClusterView {
                cluster: cluster.to_string(),
                role,
                applied: item.is_some_and(|i| i.applied),
                health: item.map(|i| i.health.as_str()).unwrap_or("Unknown"),
                failure_class: item.and_then(|i| i.failure_class).map(|c| c.to_string()),
                reason: item.and_then(|i| i.health_reason.clone().or(i.applied_message.clone())),
                observed_at: item.and_then(|i| i.observed_at.clone()),
                gone_at: item.and_then(|i| i.gone_at.clone()),
            }
        })
        .collect();
    let eviction_tasks = spec
        .graceful_eviction_tasks
        .iter()
        .map(|t| TaskView {
            from_cluster: t.from_cluster.clone(),
            purge_mode: purge_mode(t).as_str(),
            reason: t.reason.clone(),
            created_at: t.creation_timestamp.clone(),
            purged_at: t.purged_at.clone(),
            state: task_state(
                t,
                &namespace,
                &name,
                confirmed.contains(&t.from_cluster),
                now,
            ),
        })
        .collect();
    let condition = |type_: &str| binding.condition(type_);
    BindingView {
        resource: format!("{}/{}", spec.resource.kind, spec.resource.name),
        placement: spec
            .clusters
            .iter()
            .map(|c| PlacedView {
                cluster: c.name.clone(),
                replicas: c.replicas,
            })
            .collect(),
        clusters,
        eviction_tasks,
        unscheduled: condition(CONDITION_SCHEDULED)
            .filter(|c| c.status != "True")
            .map(|c| c.message.clone()),
        failover_blocked: condition(CONDITION_FAILOVER_BLOCKED)
            .filter(|c| c.status == "True")
            .map(|c| c.message.clone()),
        namespace,
        name,
    }
}

/// What an eviction task waits for, in words.
fn task_state(
    task: &GracefulEvictionTask,
    namespace: &str,
    name: &str,
    confirmed: bool,
    now: &Time,
) -> String {
    let cluster = &task.from_cluster;
    match purge_mode(task) {
        PurgeMode::Directly => match &task.purged_at {
            None if confirmed => {
                format!("the purge is confirmed: the old copy in {cluster} counts as gone")
            }
            None => format!(
                "the new copy waits until the old one in {cluster} is confirmed gone (by its agent, the hub's fence, \
                 or `lifeboatctl confirm-purge {namespace}/{name} {cluster}`)"
            ),
            Some(at) => format!(
                "the old copy was gone at {}; the task ends when the new placement is Healthy",
                at.0
            ),
        },
        PurgeMode::Gracefully => {
            let grace = task
                .grace_period_seconds
                .map(i64::from)
                .unwrap_or(DEFAULT_GRACE_SECONDS);
            let until = task.creation_timestamp.as_ref().and_then(|t| {
                t.0.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(grace))
                    .ok()
            });
            match until {
                Some(until) if until <= now.0 => {
                    format!("the grace period ended at {until}: the old copy in {cluster} goes")
                }
                Some(until) => format!(
                    "the old copy in {cluster} stays until the new placement is Healthy or {until}"
                ),
                None => format!(
                    "the old copy in {cluster} stays until the new placement is Healthy or {grace}s have passed"
                ),
            }
        }
        PurgeMode::Never if confirmed || task.suppress_deletion == Some(false) => {
            format!("the purge is confirmed: the old copy in {cluster} goes")
        }
        PurgeMode::Never => format!(
            "the old copy in {cluster} stays until `lifeboatctl confirm-purge {namespace}/{name} {cluster}`"
        ),
    }
}

const HEADERS: [&str; 8] = [
    "BINDING", "CLUSTER", "ROLE", "APPLIED", "HEALTH", "CLASS", "REASON", "EVICTION",
];

/// One row per binding and cluster (a binding placed nowhere: one row saying why).
pub fn render_table(views: &[BindingView]) -> String {
    if views.is_empty() {
        return "No bindings.\n".to_string();
    }
    let dash = || "-".to_string();
    let mut rows: Vec<[String; 8]> = Vec::new();
    for v in views {
        let binding = format!("{}/{}", v.namespace, v.name);
        if v.clusters.is_empty() {
            rows.push([
                binding.clone(),
                dash(),
                "unplaced".into(),
                dash(),
                dash(),
                dash(),
                v.unscheduled.as_deref().map(one_line).unwrap_or_else(dash),
                dash(),
            ]);
        }
        for c in &v.clusters {
            let eviction = v
                .eviction_tasks
                .iter()
                .find(|t| t.from_cluster == c.cluster)
                .map(|t| format!("{} {}: {}", t.purge_mode, t.reason, t.state))
                .unwrap_or_else(dash);
            rows.push([
                binding.clone(),
                c.cluster.clone(),
                c.role.to_string(),
                c.applied.to_string(),
                c.health.to_string(),
                c.failure_class.clone().unwrap_or_else(dash),
                c.reason.as_deref().map(one_line).unwrap_or_else(dash),
                eviction,
            ]);
        }
    }
    table::render(&HEADERS, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use k8s_openapi::jiff::Timestamp;
    use lifeboat_api::binding::{
        BLOCKED_WAITING_FOR_PURGE_CONFIRMATION, EVICTION_APPLICATION_FAILURE,
        EVICTION_CLUSTER_FAILURE, REASON_NO_CLUSTER_FIT,
    };
    use serde_json::json;

    fn at(text: &str) -> Time {
        Time(text.parse::<Timestamp>().unwrap())
    }

    /// train moved from member-1 (Never, kept) to member-2; member-3's Directly copy is gone.
    fn binding() -> ResourceBinding {
        serde_json::from_value(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "train-appwrapper", "namespace": "ml", "resourceVersion": "7"},
            "spec": {
                "resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "train"},
                "clusters": [{"name": "member-2", "replicas": 0}],
                "gracefulEvictionTasks": [
                    {"fromCluster": "member-1", "purgeMode": "Never", "reason": EVICTION_APPLICATION_FAILURE,
                     "producer": "lifeboat-hub", "suppressDeletion": true,
                     "creationTimestamp": "2026-11-23T10:00:00Z"},
                    {"fromCluster": "member-3", "purgeMode": "Directly", "reason": EVICTION_CLUSTER_FAILURE,
                     "producer": "lifeboat-hub", "creationTimestamp": "2026-11-23T10:00:00Z",
                     "purgedAt": "2026-11-23T10:00:05Z"}
                ]
            },
            "status": {
                "aggregatedStatus": [
                    {"clusterName": "member-1", "applied": true, "health": "Unhealthy",
                     "failureClass": "Infrastructure", "healthReason": "node n1\nis NotReady"},
                    {"clusterName": "member-2", "applied": true, "health": "Healthy",
                     "observedAt": "2026-11-23T10:01:00Z"},
                    {"clusterName": "member-3", "applied": false, "health": "Unknown",
                     "healthReason": "the copy was deleted from the cluster (the work was withdrawn)",
                     "goneAt": "2026-11-23T10:00:04Z"}
                ],
                "conditions": [{"type": CONDITION_FAILOVER_BLOCKED, "status": "True", "reason": BLOCKED_WAITING_FOR_PURGE_CONFIRMATION,
                                "message": "the old copy in member-1 stays", "lastTransitionTime": "2026-11-23T10:00:00Z"}]
            }
        }))
        .unwrap()
    }

    #[test]
    fn bindings_show_each_cluster_and_what_each_eviction_waits_for() {
        let v = view(&binding(), &at("2026-11-23T10:02:00Z"));
        assert_eq!(v.resource, "AppWrapper/train");
        assert_eq!(
            v.placement,
            [PlacedView {
                cluster: "member-2".into(),
                replicas: 0
            }]
        );
        let roles: Vec<(&str, &str, bool, &str)> = v
            .clusters
            .iter()
            .map(|c| (c.cluster.as_str(), c.role, c.applied, c.health))
            .collect();
        assert_eq!(
            roles,
            [
                ("member-2", "placed", true, "Healthy"),
                ("member-1", "evicted", true, "Unhealthy"),
                ("member-3", "evicted", false, "Unknown"),
            ]
        );
        assert_eq!(
            v.clusters[1].failure_class.as_deref(),
            Some("Infrastructure")
        );
        assert_eq!(v.clusters[2].gone_at, Some(at("2026-11-23T10:00:04Z")));
        assert_eq!(
            v.eviction_tasks[0].state,
            "the old copy in member-1 stays until `lifeboatctl confirm-purge ml/train-appwrapper member-1`"
        );
        assert!(
            v.eviction_tasks[1]
                .state
                .starts_with("the old copy was gone at 2026-11-23T10:00:05Z")
        );
        assert_eq!(
            v.failover_blocked.as_deref(),
            Some("the old copy in member-1 stays")
        );

        let text = render_table(std::slice::from_ref(&v));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        for header in HEADERS {
            assert!(lines[0].contains(header), "{text}");
        }
        assert!(
            lines[1].starts_with("ml/train-appwrapper  member-2  placed"),
            "{text}"
        );
        assert!(
            lines[1].ends_with(" -"),
            "no eviction from member-2: {text}"
        );
        assert!(
            lines[2].contains("Infrastructure  node n1 is NotReady  "),
            "one line: {text}"
        );
        assert!(
            lines[2].ends_with("Never ApplicationFailure: the old copy in member-1 stays until `lifeboatctl confirm-purge ml/train-appwrapper member-1`"),
            "{text}"
        );
        // columns line up
        let health_at = lines[0].find("HEALTH").unwrap();
        assert_eq!(&lines[1][health_at..health_at + 7], "Healthy", "{text}");

        let json = serde_json::to_value([&v]).unwrap();
        assert_eq!(json[0]["clusters"][2]["goneAt"], "2026-11-23T10:00:04Z");
        assert_eq!(json[0]["evictionTasks"][0]["purgeMode"], "Never");
        assert_eq!(
            json[0]["placement"][0],
            json!({"cluster": "member-2", "replicas": 0})
        );
        assert_eq!(render_table(&[]), "No bindings.\n");
    }

    #[test]
    fn an_unplaced_binding_says_why_and_a_gracefully_task_when_its_grace_ends() {
        let mut b = binding();
        b.spec.clusters.clear();
        b.spec.graceful_eviction_tasks = vec![
            serde_json::from_value(json!({
            "fromCluster": "member-1", "purgeMode": "Gracefully", "reason": EVICTION_APPLICATION_FAILURE,
            "producer": "lifeboat-hub", "gracePeriodSeconds": 60,
            "creationTimestamp": "2026-11-23T10:00:00Z"}))
            .unwrap(),
        ];
        let v = view(&b, &at("2026-11-23T10:00:30Z"));
        assert_eq!(
            v.eviction_tasks[0].state,
            "the old copy in member-1 stays until the new placement is Healthy or 2026-11-23T10:01:00Z"
        );
        let later = view(&b, &at("2026-11-23T10:02:00Z"));
        assert!(
            later.eviction_tasks[0]
                .state
                .starts_with("the grace period ended")
        );
        b.spec.graceful_eviction_tasks.clear();
        b.status = Some(
            serde_json::from_value(
                json!({"conditions": [{"type": CONDITION_SCHEDULED, "status": "False",
                "reason": REASON_NO_CLUSTER_FIT, "message": "0/2 clusters are available",
                "lastTransitionTime": "2026-11-23T10:00:00Z"}]}),
            )
            .unwrap(),
        );
        let v = view(&b, &at("2026-11-23T10:00:30Z"));
        let text = render_table(&[v]);
        assert!(text.lines().nth(1).unwrap().contains("unplaced"), "{text}");
        assert!(text.contains("0/2 clusters are available"), "{text}");
    }

    #[test]
    fn a_purge_is_confirmed_for_a_never_eviction_or_a_waiting_directly_one() {
        let mut b = binding();
        assert_eq!(
            confirmation(&b, "member-1").unwrap().as_deref(),
            Some("member-1")
        );
        b.metadata.annotations =
            Some([(ANNOTATION_CONFIRM_PURGE.to_string(), "member-9".to_string())].into());
        assert_eq!(
            confirmation(&b, "member-1").unwrap().as_deref(),
            Some("member-1,member-9")
        );
        b.metadata.annotations =
            Some([(ANNOTATION_CONFIRM_PURGE.to_string(), "member-1".to_string())].into());
        assert_eq!(
            confirmation(&b, "member-1").unwrap(),
            None,
            "already confirmed"
        );
        let v = view(&b, &at("2026-11-23T10:02:00Z"));
        assert_eq!(
            v.eviction_tasks[0].state,
            "the purge is confirmed: the old copy in member-1 goes"
        );
        // member-3's Directly copy was confirmed gone already
        let e = format!("{:#}", confirmation(&b, "member-3").unwrap_err());
        assert!(e.contains("was already confirmed gone"), "{e}");
        assert!(!awaits_confirmation(&b, "member-3"));
        // ... while it waits, an operator may confirm it (a lost cluster the hub cannot fence)
        let mut waiting = b.clone();
        waiting.spec.graceful_eviction_tasks[1].purged_at = None;
        waiting.metadata.annotations = None;
        assert_eq!(
            confirmation(&waiting, "member-3").unwrap().as_deref(),
            Some("member-3")
        );
        assert!(awaits_confirmation(&waiting, "member-3"));
        let v = view(&waiting, &at("2026-11-23T10:02:00Z"));
        assert!(
            v.eviction_tasks[1]
                .state
                .contains("lifeboatctl confirm-purge ml/train-appwrapper member-3"),
            "{}",
            v.eviction_tasks[1].state
        );
        // a Gracefully eviction needs none
        waiting.spec.graceful_eviction_tasks[1].purge_mode = Some(PurgeMode::Gracefully);
        let e = format!("{:#}", confirmation(&waiting, "member-3").unwrap_err());
        assert!(
            e.contains("purgeMode Gracefully, not Never or Directly"),
            "{e}"
        );
        let e = format!("{:#}", confirmation(&b, "member-2").unwrap_err());
        assert!(
            e.contains("no eviction from member-2 (its eviction tasks: member-1 (Never), member-3 (Directly))"),
            "{e}"
        );
        b.spec.graceful_eviction_tasks.clear();
        let e = format!("{:#}", confirmation(&b, "member-1").unwrap_err());
        assert!(e.contains("its eviction tasks: none"), "{e}");
    }

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(clap::Subcommand)]
    enum Command {
        Get(GetArgs),
        ConfirmPurge(ConfirmPurgeArgs),
    }

    #[test]
    fn flags_parse_as_kubectl_users_expect() {
        let parse = |argv: &[&str]| {
            Cli::try_parse_from(std::iter::once("lifeboatctl").chain(argv.iter().copied()))
        };
        let Ok(Cli {
            command:
                Command::Get(GetArgs {
                    what: GetWhat::Bindings(a),
                }),
        }) = parse(&["get", "bindings", "-A", "-o", "json", "--kubeconfig", "/k"])
        else {
            panic!("get bindings -A -o json");
        };
        assert!(a.all_namespaces && a.output == Output::Json);
        assert_eq!(a.hub.kubeconfig, Some(PathBuf::from("/k")));
        assert!(
            parse(&["get", "bindings", "-A", "-n", "ml"]).is_err(),
            "-A and -n conflict"
        );
        let Ok(Cli {
            command: Command::ConfirmPurge(c),
        }) = parse(&["confirm-purge", "ml/train-appwrapper", "member-1"])
        else {
            panic!("confirm-purge");
        };
        assert_eq!(
            (c.binding.as_deref(), c.cluster.as_deref()),
            (Some("ml/train-appwrapper"), Some("member-1"))
        );
        assert!(
            parse(&["confirm-purge", "ml/train-appwrapper"]).is_err(),
            "the cluster is required"
        );
        let Ok(Cli {
            command: Command::ConfirmPurge(c),
        }) = parse(&["confirm-purge", "--all-in", "member-1"])
        else {
            panic!("confirm-purge --all-in");
        };
        assert_eq!((c.binding, c.all_in.as_deref()), (None, Some("member-1")));
        assert!(
            parse(&["confirm-purge", "ml/a", "member-1", "--all-in", "member-1"]).is_err(),
            "one binding or all of a cluster's"
        );
        assert!(parse(&["confirm-purge"]).is_err(), "something to confirm");
    }
}
