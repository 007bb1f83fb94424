//! The AppWrapper admission webhook on a real kube-apiserver (reference §6.2), driven through
//! kubectl: the agent's webhook runs in this process on a free port, registered with a URL client
//! config, exactly as an agent running outside its member cluster.
//!
//! One member cluster. The CRD install, the webhook and its registration are shared by the tests
//! (set up once, by whichever test comes first); each test works in its own namespace.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use lifeboat_agent::config::AppWrapperConfig;
use lifeboat_agent::install::{CrdInstall, ensure_crd};
use lifeboat_agent::webhook::{
    CertificateSource, ClientConfigTarget, MAX_COMPONENTS, VALIDATING_WEBHOOK, Webhook,
    WebhookConfig, register,
};
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestError, TestResult};
use lifeboat_e2e::wait;
use lifeboat_tls::{CertificateAuthority, ServingCertificate, Validity};
use prometheus::Registry;
use serde_json::{Value, json};
use tokio::sync::OnceCell;

const DEFAULT_QUEUE: &str = "system-default-queue";
const LIMITED_USER: &str = "limited-user";
const LIMITED_UID: &str = "8da0fcfe-6d7f-4f44-b433-d91d22cc1b8c";
/// The fleet's admin client certificate's user.
const ADMIN_USER: &str = "lifeboat-admin";
const USER_LABEL: &str = "workload.codeflare.dev/user";
const USERID_LABEL: &str = "workload.codeflare.dev/userid";
const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
const CRD_NAME: &str = "appwrappers.workload.codeflare.dev";

fn main() -> ExitCode {
    harness::run(
        "agent-webhook",
        |c| {
            c.members = 1;
            c.nodes_per_member = 1;
        },
        vec![
            E2eTest::new("crd_is_installed_idempotently_and_repaired", crd_install),
            E2eTest::new("samples_are_accepted_unchanged", samples_accepted),
            E2eTest::new(
                "defaulting_sets_queue_and_overrides_user_labels",
                defaulting,
            ),
            E2eTest::new("structural_invariants_are_enforced", structural_invariants),
            E2eTest::new("podset_paths_must_resolve_to_a_podspec", podset_paths),
            E2eTest::new(
                "other_namespaces_and_nested_appwrappers_are_rejected",
                namespaces_and_nesting,
            ),
            E2eTest::new("user_labels_are_immutable", user_labels_immutable),
            E2eTest::new(
                "user_labels_survive_updates_by_another_user",
                user_labels_preserved,
            ),
            E2eTest::new(
                "components_are_immutable_but_suspend_podsetinfos_and_annotations_change",
                components_immutable,
            ),
            E2eTest::new("rbac_is_enforced_for_wrapped_resources", rbac_enforced),
            E2eTest::new("well_formed_appwrappers_are_accepted", well_formed),
            E2eTest::new("podsets_are_inferred_for_known_kinds", inference),
            E2eTest::new("admission_verdicts_are_counted", metrics_count),
            E2eTest::new(
                "too_many_components_are_rejected_naming_the_field",
                too_many_components,
            ),
            E2eTest::new("made_up_kinds_are_rejected_naming_the_kind", made_up_kinds),
            E2eTest::new(
                "rotated_certificate_files_are_served_without_a_restart",
                rotated_files,
            ),
            E2eTest::new(
                "webhooks_started_against_one_cluster_share_the_ca_secret",
                shared_ca_secret,
            ),
        ],
    )
}

// ---------------------------------------------------------------------------------------------
// Shared setup: CRDs, webhook server, registration.

/// Kinds the upstream samples and webhook tests wrap, served here by CRDs as in upstream's test
/// environment (training-operator, KubeRay, JobSet, LeaderWorkerSet): a kind discovery does not
/// know is rejected.
const WRAPPED_KINDS: [(&str, &str, &str, &str); 5] = [
    ("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"),
    ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
    (
        "leaderworkerset.x-k8s.io",
        "v1",
        "LeaderWorkerSet",
        "leaderworkersets",
    ),
    ("ray.io", "v1", "RayCluster", "rayclusters"),
    ("ray.io", "v1", "RayJob", "rayjobs"),
];

struct Setup {
    kubeconfig: PathBuf,
    cache_dir: PathBuf,
    registry: Registry,
    crd_outcomes: Vec<CrdInstall>,
    short_names_after_repair: Option<Vec<String>>,
    /// The webhook serves the certificate in these files (issued by `ca`).
    cert_files: CertFiles,
    ca: CertificateAuthority,
    webhook_addr: std::net::SocketAddr,
}

/// Where the registered webhook's certificate lives.
struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

impl CertFiles {
    /// Writes `serving` as a rotation does: each file replaced by a rename.
    fn write(&self, serving: &ServingCertificate) -> std::io::Result<()> {
        for (path, contents) in [
            (&self.ca, &serving.ca_bundle_pem),
            (&self.key, &serving.key_pem),
            (&self.cert, &serving.chain_pem),
        ] {
            let next = path.with_extension("next");
            std::fs::write(&next, contents)?;
            std::fs::rename(&next, path)?;
        }
        Ok(())
    }
}

fn serving_certificate(ca: &CertificateAuthority) -> Result<ServingCertificate, TestError> {
    Ok(ca.serving_certificate(
        "127.0.0.1",
        &["127.0.0.1".into()],
        Validity::starting_now(Duration::from_secs(24 * 3600)),
    )?)
}

static SETUP: OnceCell<Setup> = OnceCell::const_new();

async fn setup(ctx: &TestContext) -> Result<&'static Setup, TestError> {
    SETUP
        .get_or_try_init(|| async {
            let cluster = ctx.first_member();
            let client = ctx.client(&cluster).await?;
            let kubeconfig = ctx.fleet.kubeconfig(&cluster)?;
            let cache_dir = ctx.fleet.state_dir().join("kubectl-cache");
            // Install, install again, then repair a drift made by another field manager. Done
            // here, before the webhook tests run, so no test sees the CRD change under it.
            let mut crd_outcomes = vec![ensure_crd(&client).await?, ensure_crd(&client).await?];
            let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
            crds.patch(
                CRD_NAME,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"names": {"shortNames": ["aw", "drifted"]}}})),
            )
            .await?;
            crd_outcomes.push(ensure_crd(&client).await?);
            let short_names_after_repair = crds.get(CRD_NAME).await?.spec.names.short_names;
            install_wrapped_kinds(&kubeconfig, &cache_dir).await?;

            // The webhook serves PEM files, as from a mounted cert-manager Secret.
            let dir = ctx.fleet.state_dir().join("webhook-tls");
            std::fs::create_dir_all(&dir)?;
            let cert_files = CertFiles {
                cert: dir.join("tls.crt"),
                key: dir.join("tls.key"),
                ca: dir.join("ca.crt"),
            };
            let ca = CertificateAuthority::generate(
                "webhook-e2e-ca",
                Validity::starting_now(Duration::from_secs(24 * 3600)),
            )?;
            cert_files.write(&serving_certificate(&ca)?)?;

            let registry = Registry::new();
            let webhook = Webhook::bind(
                WebhookConfig {
                    bind: "127.0.0.1:0".parse()?,
                    target: ClientConfigTarget::Url {
                        host: "127.0.0.1".into(),
                        port: None,
                    },
                    certificate: CertificateSource::Files {
                        cert: cert_files.cert.clone(),
                        key: cert_files.key.clone(),
                        ca: Some(cert_files.ca.clone()),
                    },
                },
                &client,
                &registry,
            )
            .await?;
            let endpoint = webhook.endpoint();
            let webhook_addr = webhook.local_addr();
            let app_config = Arc::new(AppWrapperConfig {
                default_queue_name: DEFAULT_QUEUE.into(),
                user_rbac_admission_check: true,
                ..Default::default()
            });
            tokio::spawn(async move {
                if let Err(e) = webhook.serve(app_config, std::future::pending()).await {
                    eprintln!("webhook server stopped: {e}");
                }
            });
            let started = std::time::Instant::now();
            register(&client, &endpoint).await?;
            eprintln!(
                "webhook at {} live {:?} after registration",
                endpoint.base_url(),
                started.elapsed()
            );
            Ok::<_, TestError>(Setup {
                kubeconfig,
                cache_dir,
                registry,
                crd_outcomes,
                short_names_after_repair,
                cert_files,
                ca,
                webhook_addr,
            })
        })
        .await
}

/// CRDs for [`WRAPPED_KINDS`] (any content), applied with kubectl and waited for.
async fn install_wrapped_kinds(kubeconfig: &Path, cache_dir: &Path) -> TestResult {
    for (group, version, kind, plural) in WRAPPED_KINDS {
        let mut metadata = json!({"name": format!("{plural}.{group}")});
        if group.ends_with(".k8s.io") {
            // groups under k8s.io need the API-approval annotation
            metadata["annotations"] = json!({"api-approved.kubernetes.io": "https://github.com/kubernetes/enhancements/pull/1111"});
        }
        let crd = json!({"apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition", "metadata": metadata,
            "spec": {"group": group, "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase()},
                "versions": [{"name": version, "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object",
                        "x-kubernetes-preserve-unknown-fields": true}}}]}});
        kubectl(
            kubeconfig,
            cache_dir,
            &["apply", "-f", "-"],
            Some(crd.to_string()),
        )
        .await?
        .map_err(|stderr| format!("applying the {kind} CRD: {stderr}"))?;
    }
    let names: Vec<String> = WRAPPED_KINDS
        .iter()
        .map(|(group, _, _, plural)| format!("crd/{plural}.{group}"))
        .collect();
    let mut args = vec!["wait", "--for=condition=Established", "--timeout=60s"];
    args.extend(names.iter().map(String::as_str));
    kubectl(kubeconfig, cache_dir, &args, None)
        .await?
        .map_err(|stderr| format!("waiting for the CRDs: {stderr}"))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// kubectl

#[derive(Clone, Copy, PartialEq, Eq)]
enum Who {
    Admin,
    /// Impersonated with `--as limited-user --as-uid ...`.
    Limited,
}

struct Kubectl {
    setup: &'static Setup,
    namespace: String,
}

impl Kubectl {
    async fn new(ctx: &TestContext) -> Result<Self, TestError> {
        let setup = setup(ctx).await?;
        let namespace = ctx.namespace(&ctx.first_member()).await?;
        Ok(Self { setup, namespace })
    }

    /// Runs kubectl in the test namespace; `Ok(Err(stderr))` when kubectl failed.
    async fn run(
        &self,
        who: Who,
        args: &[&str],
        stdin: Option<String>,
    ) -> Result<Result<String, String>, TestError> {
        let mut all = vec!["--namespace", &self.namespace];
        if who == Who::Limited {
            all.extend(["--as", LIMITED_USER, "--as-uid", LIMITED_UID]);
        }
        all.extend(args);
        kubectl(&self.setup.kubeconfig, &self.setup.cache_dir, &all, stdin).await
    }

    /// `kubectl create -f - -o json`; `Ok(Err(stderr))` when the apiserver refused.
    async fn try_create(
        &self,
        who: Who,
        object: &Value,
    ) -> Result<Result<Value, String>, TestError> {
        Ok(
            match self
                .run(
                    who,
                    &["create", "-f", "-", "-o", "json"],
                    Some(object.to_string()),
                )
                .await?
            {
                Ok(stdout) => Ok(serde_json::from_str(&stdout)?),
                Err(stderr) => Err(stderr),
            },
        )
    }

    async fn create(&self, who: Who, object: &Value) -> Result<Value, TestError> {
        self.try_create(who, object).await?.map_err(|stderr| {
            format!(
                "{} was rejected: {stderr}",
                object["metadata"]["name"].as_str().unwrap_or("object")
            )
            .into()
        })
    }

    /// Expects the create to be rejected by our webhook with every `(field, reason)` named.
    async fn rejected(&self, who: Who, object: &Value, expected: &[(&str, &str)]) -> TestResult {
        match self.try_create(who, object).await? {
            Ok(_) => Err(format!(
                "{} was accepted; expected a rejection naming {expected:?}",
                object["metadata"]["name"]
            )
            .into()),
            Err(stderr) => names(&stderr, expected),
        }
    }

    /// A command expected to succeed.
    async fn ok(&self, who: Who, args: &[&str]) -> Result<String, TestError> {
        self.run(who, args, None)
            .await?
            .map_err(|stderr| format!("kubectl {args:?} failed: {stderr}").into())
    }

    /// A command expected to be refused by our webhook naming every `(field, reason)`.
    async fn refused(&self, who: Who, args: &[&str], expected: &[(&str, &str)]) -> TestResult {
        match self.run(who, args, None).await? {
            Ok(out) => {
                Err(format!("kubectl {args:?} succeeded ({out}); expected {expected:?}").into())
            }
            Err(stderr) => names(&stderr, expected),
        }
    }

    async fn get(&self, name: &str) -> Result<Value, TestError> {
        Ok(serde_json::from_str(
            &self
                .ok(Who::Admin, &["get", "appwrapper", name, "-o", "json"])
                .await?,
        )?)
    }
}

/// Runs kubectl; `Ok(Err(stderr))` when kubectl failed.
async fn kubectl(
    kubeconfig: &Path,
    cache_dir: &Path,
    args: &[&str],
    stdin: Option<String>,
) -> Result<Result<String, String>, TestError> {
    lifeboat_e2e::kubectl::run(kubeconfig, Some(cache_dir), args, stdin).await
}

/// The rejection is our validating webhook's and names each field with its reason. kubectl
/// prints a 403 denial as `admission webhook "vappwrapper.lifeboat.dev" denied the request:
/// field: reason; ...` and a 422 one, from its status causes, as `The AppWrapper "x" is
/// invalid: * field: reason ...`; the reasons are only ours either way.
fn names(stderr: &str, expected: &[(&str, &str)]) -> TestResult {
    let denied = stderr.contains(&format!("\"{VALIDATING_WEBHOOK}\" denied the request"));
    let invalid = stderr.contains("The AppWrapper \"") && stderr.contains("\" is invalid: ");
    if !denied && !invalid {
        return Err(format!("not a denial by {VALIDATING_WEBHOOK}: {stderr}").into());
    }
    for (field, reason) in expected {
        if !stderr.contains(&format!("{field}: {reason}")) {
            return Err(
                format!("the rejection does not name `{field}: {reason}`:\n{stderr}").into(),
            );
        }
    }
    Ok(())
}

/// `(field, reason)` pairs a rejection must name.
type Expected<'a> = Vec<(&'a str, &'a str)>;

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

fn label(object: &Value, key: &str) -> Option<String> {
    object["metadata"]["labels"][key]
        .as_str()
        .map(str::to_string)
}

// ---------------------------------------------------------------------------------------------
// Fixtures (upstream's appwrapper_fixtures_test.go, reference §6.2)

fn pod_spec() -> Value {
    json!({"restartPolicy": "Never", "containers": [{"name": "busybox",
        "image": "quay.io/project-codeflare/busybox:1.36", "command": ["sh", "-c", "sleep 10"],
        "resources": {"requests": {"cpu": "100m"}}}]})
}

fn pod_template() -> Value {
    json!({"spec": pod_spec()})
}

fn pod_for_inference() -> Value {
    json!({"template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": pod_spec()}})
}

fn pod() -> Value {
    let mut c = pod_for_inference();
    c["podSets"] = json!([{"path": "template"}]);
    c
}

fn namespaced_pod(namespace: &str) -> Value {
    let mut c = pod();
    c["template"]["metadata"]["namespace"] = json!(namespace);
    c
}

fn service() -> Value {
    json!({"template": {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
        "spec": {"selector": {"app": "x"}, "ports": [{"port": 80}]}}})
}

fn deployment_for_inference(replicas: i32) -> Value {
    json!({"template": {"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d"}, "spec": {"replicas": replicas,
        "selector": {"matchLabels": {"app": "d"}},
        "template": {"metadata": {"labels": {"app": "d"}}, "spec": pod_spec()}}}})
}

fn deployment(replicas: i32) -> Value {
    let mut c = deployment_for_inference(replicas);
    c["podSets"] = json!([{"path": "template.spec.template", "replicas": replicas}]);
    c
}

fn ray_cluster_spec(workers: i32) -> Value {
    json!({"headGroupSpec": {"rayStartParams": {}, "template": pod_template()},
        "workerGroupSpecs": [{"groupName": "w", "replicas": workers, "rayStartParams": {},
            "template": pod_template()}]})
}

fn ray_cluster_for_inference(workers: i32) -> Value {
    json!({"template": {"apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": "rc"}, "spec": ray_cluster_spec(workers)}})
}

fn ray_cluster(workers: i32) -> Value {
    let mut c = ray_cluster_for_inference(workers);
    c["podSets"] = json!([
        {"path": "template.spec.headGroupSpec.template", "replicas": 1},
        {"path": "template.spec.workerGroupSpecs[0].template", "replicas": workers}
    ]);
    c
}

fn ray_job_for_inference(workers: i32) -> Value {
    json!({"template": {"apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": {"name": "rj"}, "spec": {"entrypoint": "python train.py",
        "rayClusterSpec": ray_cluster_spec(workers)}}})
}

fn job_set(workers: i32) -> Value {
    json!({"podSets": [
        {"path": "template.spec.replicatedJobs[0].template.spec.template"},
        {"path": "template.spec.replicatedJobs[1].template.spec.template", "replicas": workers}
    ],
    "template": {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
    "metadata": {"name": "js"}, "spec": {"replicatedJobs": [
        {"name": "driver", "template": {"spec": {"parallelism": 1, "completions": 1,
            "template": pod_template()}}},
        {"name": "workers", "template": {"spec": {"parallelism": workers,
            "completions": workers, "template": pod_template()}}}
    ]}}})
}

fn job_for_inference(parallelism: i32, completions: i32) -> Value {
    json!({"template": {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
        "spec": {"parallelism": parallelism, "completions": completions,
        "template": pod_template()}}})
}

fn pytorch_job_for_inference(workers: i32) -> Value {
    json!({"template": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "pt"}, "spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": pod_template()},
            "Worker": {"replicas": workers, "template": pod_template()}}}}})
}

fn appwrapper(name: &str, components: Vec<Value>) -> Value {
    json!({"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
        "metadata": {"name": name}, "spec": {"components": components}})
}

fn with_labels(mut aw: Value, labels: Value) -> Value {
    aw["metadata"]["labels"] = labels;
    aw
}

/// A Role for `limited-user` in the test namespace: `*` on appwrappers and pods, only `get` on
/// deployments (upstream's ClusterRole, namespaced).
async fn grant_limited_user(ctx: &TestContext, namespace: &str) -> TestResult {
    let client = ctx.client(&ctx.first_member()).await?;
    let rule = |groups: &[&str], resources: &[&str], verbs: &[&str]| PolicyRule {
        api_groups: Some(groups.iter().map(|s| s.to_string()).collect()),
        resources: Some(resources.iter().map(|s| s.to_string()).collect()),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let role = Role {
        metadata: ObjectMeta {
            name: Some(LIMITED_USER.into()),
            ..Default::default()
        },
        rules: Some(vec![
            rule(&["workload.codeflare.dev"], &["appwrappers"], &["*"]),
            rule(&[""], &["pods"], &["*"]),
            rule(&["apps"], &["deployments"], &["get"]),
        ]),
    };
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some(LIMITED_USER.into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: LIMITED_USER.into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: LIMITED_USER.into(),
            ..Default::default()
        }]),
    };
    let ignore_exists = |r: Result<(), kube::Error>| match r {
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        other => other,
    };
    ignore_exists(
        Api::<Role>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &role)
            .await
            .map(|_| ()),
    )?;
    ignore_exists(
        Api::<RoleBinding>::namespaced(client, namespace)
            .create(&PostParams::default(), &binding)
            .await
            .map(|_| ()),
    )?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tests

async fn crd_install(ctx: Arc<TestContext>) -> TestResult {
    let setup = setup(&ctx).await?;
    assert_eq!(
        setup.crd_outcomes,
        vec![
            CrdInstall::Created,
            CrdInstall::Unchanged,
            CrdInstall::Updated
        ],
        "fresh fleet: created, then nothing to do, then the drift repaired"
    );
    assert_eq!(setup.short_names_after_repair, Some(vec!["aw".to_string()]));
    // kubectl sees the CRD with its short name and printer columns
    let k = Kubectl::new(&ctx).await?;
    k.create(Who::Admin, &appwrapper("columns", vec![pod()]))
        .await?;
    let table = k.ok(Who::Admin, &["get", "aw", "columns"]).await?;
    let header = table.lines().next().unwrap_or_default();
    for column in ["NAME", "STATUS", "QUOTA RESERVED", "RETRIES", "AGE"] {
        assert!(header.contains(column), "{header}");
    }
    Ok(())
}

async fn samples_accepted(ctx: Arc<TestContext>) -> TestResult {
    let k = Kubectl::new(&ctx).await?;
    let shared = std::env::var("LIFEBOAT_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            lifeboat_e2e::fleet::workspace_root()
                .join("..")
                .join("shared")
        });
    let dir = shared.join("testdata").join("appwrapper-samples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e} (set LIFEBOAT_SHARED_DIR)", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "samples in {}: {files:?}", dir.display());
    for file in files {
        let path = file.display().to_string();
        let text = std::fs::read_to_string(&file)?;
        let original: Value = serde_saphyr::from_str(&text)?;
        // the file itself, unchanged
        let created: Value = serde_json::from_str(
            &k.ok(Who::Admin, &["create", "-f", &path, "-o", "json"])
                .await?,
        )?;
        assert_eq!(created["spec"], original["spec"], "{path}: spec changed");
        assert_eq!(
            label(&created, QUEUE_LABEL),
            label(&original, QUEUE_LABEL),
            "{path}: the sample's queue wins over the default"
        );
        assert_eq!(label(&created, USER_LABEL).as_deref(), Some(ADMIN_USER));
        // the admin's client certificate carries no UID
        assert_eq!(label(&created, USERID_LABEL).as_deref(), Some(""));
    }
    Ok(())
}

async fn defaulting(ctx: Arc<TestContext>) -> TestResult {
    let k = Kubectl::new(&ctx).await?;
    grant_limited_user(&ctx, &k.namespace).await?;
    // 1. the default queue is set
    let aw = k
        .create(Who::Admin, &appwrapper("default-queue", vec![pod()]))
        .await?;
    assert_eq!(label(&aw, QUEUE_LABEL).as_deref(), Some(DEFAULT_QUEUE));
    // 2. a user-provided queue is not overridden
    let aw = k
        .create(
            Who::Admin,
            &with_labels(
                appwrapper("user-queue", vec![pod()]),
                json!({QUEUE_LABEL: "user-provided-queue"}),
            ),
        )
        .await?;
    assert_eq!(
        label(&aw, QUEUE_LABEL).as_deref(),
        Some("user-provided-queue")
    );
    // 3. user name and UID are set, overriding what the user wrote
    let aw = k
        .create(
            Who::Limited,
            &with_labels(
                appwrapper("user-labels", vec![pod()]),
                json!({USER_LABEL: "bad", USERID_LABEL: "bad"}),
            ),
        )
        .await?;
    assert_eq!(label(&aw, USER_LABEL).as_deref(), Some(LIMITED_USER));
    assert_eq!(label(&aw, USERID_LABEL).as_deref(), Some(LIMITED_UID));
    // and they are stored, not only returned
    let stored = k.get("user-labels").await?;
    assert_eq!(label(&stored, USER_LABEL).as_deref(), Some(LIMITED_USER));
    Ok(())
}

async fn structural_invariants(ctx: Arc<TestContext>) -> TestResult {
    let k = Kubectl::new(&ctx).await?;
    let no_podspecs = [("spec.components", "components contains no podspecs")];
    // at least one podspec (a): no components; (b): only a Service
    k.rejected(Who::Admin, &appwrapper("empty", vec![]), &no_podspecs)
        .await?;
    k.rejected(
        Who::Admin,
        &appwrapper("service-only", vec![service()]),
        &no_podspecs,
    )
    .await?;
    // no more than 8
    let nine: Vec<Value> = (0..9).map(|_| pod()).collect();
    k.rejected(
        Who::Admin,
        &appwrapper("nine-pods", nine),
        &[(
            "spec.components",
            "components contains 9 podspecs; at most 8 are allowed",
        )],
    )
    .await?;
    // eight is fine
    let eight: Vec<Value> = (0..8).map(|_| pod()).collect();
    k.create(Who::Admin, &appwrapper("eight-pods", eight))
        .await?;
    // a service next to a pod is fine too
    k.create(
        Who::Admin,
        &appwrapper("pod-and-service", vec![pod(), service()]),
    )
    .await?;
    Ok(())
}

async fn podset_paths(ctx: Arc<TestContext>) -> TestResult {
    let k = Kubectl::new(&ctx).await?;
    let field = "spec.components[0].podSets[0].path";
    let not_a_podspec = "path does not refer to a v1.PodSpecTemplate";
    // non-existent paths
    let mut d = deployment(1);
    d["podSets"][0]["path"] = json!("template.spec.missing");
    k.rejected(
        Who::Admin,
        &appwrapper("missing-path", vec![d.clone()]),
        &[(field, not_a_podspec)],
    )
    .await?;
    d["podSets"][0]["path"] = json!("");
    k.rejected(
        Who::Admin,
        &appwrapper("empty-path", vec![d.clone()]),
        &[(field, "podspec must specify path")],
    )
    .await?;
    // a path that is not a PodSpecTemplate
    d["podSets"][0]["path"] = json!("template.spec.template.metadata");
    k.rejected(
        Who::Admin,
        &appwrapper("metadata-path", vec![d]),
        &[(field, not_a_podspec)],
    )
    .await?;
    // array and map path elements
    for path in [
        "template.spec.replicatedJobs.template.spec.template",
        "template.spec.replicatedJobs",
        "template.spec.replicatedJobs[0].template[0].spec.template",
        "template.spec.replicatedJobs[10].template.spec.template",
        "template.spec.replicatedJobs[-1].template.spec.template",
        "template.spec.replicatedJobs[a10].template.spec.template",
        "template.spec.replicatedJobs[1",
        "template.spec.replicatedJobs[1]].template.spec.template",
    ] {
        let mut js = job_set(1);
        js["podSets"][0]["path"] = json!(path);
        k.rejected(
            Who::Admin,
            &appwrapper("bad-jobset-path", vec![js]),
            &[(field, not_a_podspec)],
        )
        .await
        .map_err(|e| format!("path {path}: {e}"))?;
    }
    Ok(())
}

async fn namespaces_and_nesting(ctx: Arc<TestContext>) -> TestResult {
    let k = Kubectl::new(&ctx).await?;
    k.rejected(
        Who::Admin,
        &appwrapper("other-namespace", vec![namespaced_pod("test")]),
        &[(
            "spec.components[0].template.metadata.namespace",
            "AppWrappers cannot create objects in other namespaces",
        )],
    )
    .await?;
    let nested = json!({"template": appwrapper("inner", vec![pod()])});
    k.rejected(
        Who::Admin,
        &appwrapper("nested", vec![pod(), nested]),
        &[(
            "spec.components[1].template",
            "Nested AppWrappers are forbidden",
        )],
    )
    .await?;
    // both at once: one message names both fields
    let nested = json!({"template": appwrapper("inner", vec![pod()])});
    k.rejected(
        Who::Admin,
        &appwrapper("both", vec![namespaced_pod("test"), nested]),
        &[
            (
                "spec.components[0].template.metadata.namespace",
                "AppWrappers cannot create objects in other namespaces",
            ),
            (
                "spec.components[1].template",
                "Nested AppWrappers are forbidden",
            ),
        ],
    )
    .await
}

async fn user_labels_immutable(ctx: Arc<TestContext>) -> TestResult {
    let k = Kubectl::new(&ctx).await?;
    k.create(Who::Admin, &appwrapper("labelled", vec![pod()]))
        .await?;
    let immutable = "attempt to change immutable field";
    k.refused(
        Who::Admin,
        &[
            "label",
            "appwrapper",
            "labelled",
            "--overwrite",
            &format!("{USER_LABEL}=mallory"),
        ],
        &[(&format!("metadata.labels[{USER_LABEL}]"), immutable)],
    )
    .await?;
    k.refused(
        Who::Admin,
        &[
            "label",
            "appwrapper",
            "labelled",
            "--overwrite",
            &format!("{USERID_LABEL}=1234"),
        ],
        &[(&format!("metadata.labels[{USERID_LABEL}]"), immutable)],
    )
    .await?;
    k.refused(
        Who::Admin,
        &["label", "appwrapper", "labelled", &format!("{USER_LABEL}-")],
        &[(&format!("metadata.labels[{USER_LABEL}]"), immutable)],
    )
    .await?;
    // other labels may change
    k.ok(Who::Admin, &["label", "appwrapper", "labelled", "team=a"])
        .await?;
    let aw = k.get("labelled").await?;
    assert_eq!(label(&aw, USER_LABEL).as_deref(), Some(ADMIN_USER));
    assert_eq!(label(&aw, "team").as_deref(), Some("a"));
    Ok(())
}

async fn user_labels_preserved(ctx: Arc<TestContext>) -> TestResult {
    let k = Kubectl::new(&ctx).await?;
    grant_limited_user(&ctx, &k.namespace).await?;
    k.create(Who::Limited, &appwrapper("owned", vec![pod()]))
        .await?;
    // the admin updates it, leaving the labels alone
    k.ok(
        Who::Admin,
        &["annotate", "appwrapper", "owned", "note=by-admin"],
    )
    .await?;
    k.ok(
        Who::Admin,
        &[
            "patch",
            "appwrapper",
            "owned",
            "--type=merge",
            "-p",
            r#"{"spec":{"suspend":true}}"#,
        ],
    )
    .await?;
    let aw = k.get("owned").await?;
    assert_eq!(label(&aw, USER_LABEL).as_deref(), Some(LIMITED_USER));
    assert_eq!(label(&aw, USERID_LABEL).as_deref(), Some(LIMITED_UID));
    assert_eq!(aw["spec"]["suspend"], json!(true));
    assert_eq!(aw["metadata"]["annotations"]["note"], json!("by-admin"));
    Ok(())
}

async fn components_immutable(ctx: Arc<TestContext>) -> TestResult {
    let k = Kubectl::new(&ctx).await?;
    let aw = k
        .create(
            Who::Admin,
            &appwrapper("frozen", vec![pod(), deployment(4)]),
        )
        .await?;
    let json_patch = |ops: Value| {
        vec![
            "patch".to_string(),
            "appwrapper".into(),
            "frozen".into(),
            "--type=json".into(),
            "-p".into(),
            ops.to_string(),
        ]
    };

    // non-sensitive fields may change: suspend, podSetInfos, annotations
    let allowed = [
        json_patch(json!([{"op": "add", "path": "/spec/suspend", "value": true}])),
        json_patch(
            json!([{"op": "add", "path": "/spec/components/1/podSetInfos",
            "value": [{"labels": {"kueue": "admitted"}, "nodeSelector": {"zone": "a"}}]}]),
        ),
        json_patch(
            json!([{"op": "add", "path": "/spec/components/1/annotations",
            "value": {"note": "x"}}]),
        ),
        vec![
            "annotate".into(),
            "appwrapper".into(),
            "frozen".into(),
            "workload.codeflare.dev.appwrapper/retryLimit=5".into(),
        ],
    ];
    for command in &allowed {
        k.ok(Who::Admin, &strs(command)).await?;
    }
    let stored = k.get("frozen").await?;
    assert_eq!(stored["spec"]["suspend"], json!(true));
    assert_eq!(
        stored["spec"]["components"][1]["podSetInfos"][0]["labels"]["kueue"],
        json!("admitted")
    );

    let immutable = "attempt to change immutable field";
    let t0 = aw["spec"]["components"][0]["template"].clone();
    let t1 = aw["spec"]["components"][1]["template"].clone();
    let podsets1 = aw["spec"]["components"][1]["podSets"].clone();
    let cases: Vec<(Vec<String>, Expected)> = vec![
        // swap the templates
        (
            json_patch(json!([
                {"op": "replace", "path": "/spec/components/0/template", "value": t1},
                {"op": "replace", "path": "/spec/components/1/template", "value": t0}])),
            vec![
                ("spec.components[0].template", immutable),
                ("spec.components[1].template", immutable),
            ],
        ),
        // append a component
        (
            json_patch(json!([{"op": "add", "path": "/spec/components/-", "value": pod()}])),
            vec![(
                "spec.components",
                "attempt to change immutable field: the number of components changed from 2 to 3",
            )],
        ),
        // duplicate the declared podSets
        (
            json_patch(json!([{"op": "add", "path": "/spec/components/1/podSets/-",
                "value": podsets1[0]}])),
            vec![("spec.components[1].podSets", immutable)],
        ),
        // path to "bad"
        (
            json_patch(
                json!([{"op": "replace", "path": "/spec/components/1/podSets/0/path",
                "value": "bad"}]),
            ),
            vec![("spec.components[1].podSets[0].path", immutable)],
        ),
        // replicas to 12
        (
            json_patch(json!([{"op": "replace",
                "path": "/spec/components/1/podSets/0/replicas", "value": 12}])),
            vec![("spec.components[1].podSets[0].replicas", immutable)],
        ),
        // one field inside a template
        (
            json_patch(json!([{"op": "replace",
                "path": "/spec/components/0/template/spec/restartPolicy", "value": "Always"}])),
            vec![("spec.components[0].template", immutable)],
        ),
    ];
    for (command, expected) in &cases {
        k.refused(Who::Admin, &strs(command), expected)
            .await
            .map_err(|e| format!("{}: {e}", command.join(" ")))?;
    }
    // nothing sensitive changed
    let after = k.get("frozen").await?;
    assert_eq!(
        after["spec"]["components"][0]["template"],
        aw["spec"]["components"][0]["template"]
    );
    assert_eq!(after["spec"]["components"][1]["podSets"], podsets1);
    Ok(())
}

async fn rbac_enforced(ctx: Arc<TestContext>) -> TestResult {
    let k = Kubectl::new(&ctx).await?;
    grant_limited_user(&ctx, &k.namespace).await?;
    // the limited user may create an AppWrapper of a Pod...
    k.create(Who::Limited, &appwrapper("limited-pod", vec![pod()]))
        .await?;
    // ...but not one of a Deployment: it could only `get` deployments
    let denial = format!(
        "User {LIMITED_USER} is not authorized to create deployments.apps in {}",
        k.namespace
    );
    k.rejected(
        Who::Limited,
        &appwrapper("limited-deployment", vec![deployment(1)]),
        &[("spec.components[0].template", &denial)],
    )
    .await?;
    // a served custom kind the user has no rule for is refused by its plural
    k.rejected(
        Who::Limited,
        &appwrapper("limited-pytorch", vec![pod(), pytorch_job_for_inference(1)]),
        &[(
            "spec.components[1].template",
            &format!(
                "User {LIMITED_USER} is not authorized to create pytorchjobs.kubeflow.org in {}",
                k.namespace
            ),
        )],
    )
    .await?;
    // the admin may create both
    k.create(
        Who::Admin,
        &appwrapper("admin-deployment", vec![deployment(1)]),
    )
    .await?;
    Ok(())
}

async fn well_formed(ctx: Arc<TestContext>) -> TestResult {
    let k = Kubectl::new(&ctx).await?;
    let own_namespace = k.namespace.clone();
    for (name, component) in [
        ("pod", pod()),
        ("deployment", deployment(1)),
        ("namespaced-pod", namespaced_pod(&own_namespace)),
        ("ray-cluster", ray_cluster(1)),
        ("job-set", job_set(1)),
    ] {
        let created = k
            .create(Who::Admin, &appwrapper(name, vec![component.clone()]))
            .await?;
        assert_eq!(created["spec"]["components"][0], component, "{name}");
    }
    Ok(())
}

async fn inference(ctx: Arc<TestContext>) -> TestResult {
    let k = Kubectl::new(&ctx).await?;
    // (a) five podSets
    k.create(
        Who::Admin,
        &appwrapper(
            "inferred-a",
            vec![
                pod(),
                deployment_for_inference(1),
                pod_for_inference(),
                job_for_inference(2, 4),
                job_for_inference(8, 4),
            ],
        ),
    )
    .await?;
    // (b) six podSets
    k.create(
        Who::Admin,
        &appwrapper(
            "inferred-b",
            vec![
                pytorch_job_for_inference(4),
                ray_cluster_for_inference(7),
                ray_job_for_inference(7),
            ],
        ),
    )
    .await?;
    // declared podSets must agree with the inferred ones
    let mut d = deployment_for_inference(2);
    d["podSets"] = json!([{"path": "template.spec.template", "replicas": 12}]);
    k.rejected(
        Who::Admin,
        &appwrapper("mismatch", vec![d]),
        &[(
            "spec.components[0].podSets[0].replicas",
            "mismatched replica count for podSet `template.spec.template`: declared 12, inferred 2",
        )],
    )
    .await?;
    // inference counts toward the limit of 8: 4 inferred podSets + 5 pods
    let mut nine = vec![pytorch_job_for_inference(1), ray_cluster_for_inference(1)];
    nine.extend((0..5).map(|_| pod_for_inference()));
    k.rejected(
        Who::Admin,
        &appwrapper("too-many-inferred", nine),
        &[(
            "spec.components",
            "components contains 9 podspecs; at most 8 are allowed",
        )],
    )
    .await
}

fn verdicts(registry: &Registry, operation: &str, allowed: &str) -> u64 {
    registry
        .gather()
        .iter()
        .filter(|family| family.name() == "appwrapper_admission_total")
        .flat_map(|family| family.get_metric().to_vec())
        .filter(|metric| {
            let has = |name: &str, value: &str| {
                metric
                    .get_label()
                    .iter()
                    .any(|l| l.name() == name && l.value() == value)
            };
            has("operation", operation) && has("allowed", allowed)
        })
        .map(|metric| metric.get_counter().get_value() as u64)
        .sum()
}

async fn metrics_count(ctx: Arc<TestContext>) -> TestResult {
    let k = Kubectl::new(&ctx).await?;
    let registry = &k.setup.registry;
    // Other tests run concurrently: counters only grow, so compare with at-least.
    let (allowed, denied) = (
        verdicts(registry, "CREATE", "true"),
        verdicts(registry, "CREATE", "false"),
    );
    k.create(Who::Admin, &appwrapper("counted", vec![pod()]))
        .await?;
    k.rejected(
        Who::Admin,
        &appwrapper("counted-bad", vec![service()]),
        &[("spec.components", "components contains no podspecs")],
    )
    .await?;
    let update_denied = verdicts(registry, "UPDATE", "false");
    k.refused(
        Who::Admin,
        &[
            "label",
            "appwrapper",
            "counted",
            "--overwrite",
            &format!("{USER_LABEL}=x"),
        ],
        &[(
            &format!("metadata.labels[{USER_LABEL}]"),
            "attempt to change immutable field",
        )],
    )
    .await?;
    assert!(verdicts(registry, "CREATE", "true") > allowed);
    assert!(verdicts(registry, "CREATE", "false") > denied);
    assert!(verdicts(registry, "UPDATE", "false") > update_denied);
    Ok(())
}

async fn too_many_components(ctx: Arc<TestContext>) -> TestResult {
    let k = Kubectl::new(&ctx).await?;
    let services = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| {
                let mut s = service();
                s["template"]["metadata"]["name"] = json!(format!("s{i}"));
                s
            })
            .collect()
    };
    // at the cap: accepted
    let mut at_cap = vec![pod()];
    at_cap.extend(services(MAX_COMPONENTS - 1));
    k.create(Who::Admin, &appwrapper("at-the-cap", at_cap))
        .await?;
    // one more: rejected, naming the field, Kubernetes style
    let mut over = vec![pod()];
    over.extend(services(MAX_COMPONENTS));
    let reason = format!(
        "Too many: {}: must have at most {MAX_COMPONENTS} items",
        MAX_COMPONENTS + 1
    );
    k.rejected(
        Who::Admin,
        &appwrapper("over-the-cap", over),
        &[("spec.components", &reason)],
    )
    .await
}

async fn made_up_kinds(ctx: Arc<TestContext>) -> TestResult {
    let k = Kubectl::new(&ctx).await?;
    let mut thing = pod();
    thing["template"]["apiVersion"] = json!("example.com/v1");
    thing["template"]["kind"] = json!("Thing");
    let mut nothing = pod();
    nothing["template"]["apiVersion"] = json!("apps/v1");
    nothing["template"]["kind"] = json!("Nothing");
    // even for the admin: the controller could never create them
    k.rejected(
        Who::Admin,
        &appwrapper("made-up", vec![pod(), thing, nothing]),
        &[
            (
                "spec.components[1].template.kind",
                "no kind \"Thing\" is served in version \"example.com/v1\" by this cluster",
            ),
            (
                "spec.components[2].template.kind",
                "no kind \"Nothing\" is served in version \"apps/v1\" by this cluster",
            ),
        ],
    )
    .await
}

/// The leaf certificate the webhook presents to a client trusting `ca_pem`.
async fn presented(addr: std::net::SocketAddr, ca_pem: &str) -> Result<Vec<u8>, String> {
    lifeboat_tls::client::presented_certificate(addr, "127.0.0.1", ca_pem)
        .await
        .map(|leaf| leaf.as_ref().to_vec())
        .map_err(|e| e.to_string())
}

fn leaf_der(serving: &ServingCertificate) -> Result<Vec<u8>, TestError> {
    Ok(
        lifeboat_tls::pem::certificates(&serving.chain_pem, "serving certificate")?[0]
            .as_ref()
            .to_vec(),
    )
}

async fn rotated_files(ctx: Arc<TestContext>) -> TestResult {
    let k = Kubectl::new(&ctx).await?;
    let setup = k.setup;
    let before = presented(setup.webhook_addr, setup.ca.cert_pem()).await?;
    // cert-manager renews: a new key and certificate from the same CA, files replaced
    let renewed = serving_certificate(&setup.ca)?;
    let expected = leaf_der(&renewed)?;
    assert_ne!(before, expected);
    setup.cert_files.write(&renewed)?;
    wait::until(
        "the webhook presents the rotated certificate",
        Duration::from_secs(30),
        || async {
            match presented(setup.webhook_addr, setup.ca.cert_pem()).await? {
                now if now == expected => Ok(()),
                _ => Err("still the previous certificate".to_string()),
            }
        },
    )
    .await?;
    // the apiserver trusts the same CA: admission goes on, defaulting and validation both
    let aw = k
        .create(Who::Admin, &appwrapper("after-rotation", vec![pod()]))
        .await?;
    assert_eq!(label(&aw, QUEUE_LABEL).as_deref(), Some(DEFAULT_QUEUE));
    k.rejected(
        Who::Admin,
        &appwrapper("after-rotation-bad", vec![service()]),
        &[("spec.components", "components contains no podspecs")],
    )
    .await
}

async fn shared_ca_secret(ctx: Arc<TestContext>) -> TestResult {
    // the registered webhook exists, so we can check below that nothing here touches it
    let setup = setup(&ctx).await?;
    let cluster = ctx.first_member();
    let client = ctx.client(&cluster).await?;
    let namespace = ctx.namespace(&cluster).await?;
    let config = |secret: &str| WebhookConfig {
        bind: ([127, 0, 0, 1], 0).into(),
        target: ClientConfigTarget::Url {
            host: "127.0.0.1".into(),
            port: None,
        },
        certificate: CertificateSource::CaSecret {
            namespace: Some(namespace.clone()),
            name: secret.into(),
        },
    };
    // two replicas starting at once: one creates the Secret, the other reads it (or loses the
    // create race and reads the winner's)
    let registries = [Registry::new(), Registry::new()];
    let (first, second) = tokio::join!(
        Webhook::bind(config("webhook-ca"), &client, &registries[0]),
        Webhook::bind(config("webhook-ca"), &client, &registries[1]),
    );
    let (first, second) = (first?, second?);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let secret = secrets.get("webhook-ca").await?;
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(
        secret
            .metadata
            .labels
            .unwrap_or_default()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("lifeboat-agent")
    );
    let data = secret.data.unwrap_or_default();
    let ca_pem = String::from_utf8(data.get("tls.crt").ok_or("no tls.crt")?.0.clone())?;
    assert_eq!(first.endpoint().ca_bundle_pem, ca_pem, "one caBundle");
    assert_eq!(second.endpoint().ca_bundle_pem, ca_pem, "one caBundle");
    // each replica issues its own serving certificate from it
    assert_ne!(
        first.certificate().chain_pem,
        second.certificate().chain_pem
    );
    // a restart reads the same CA
    let restarted = Webhook::bind(config("webhook-ca"), &client, &Registry::new()).await?;
    assert_eq!(restarted.endpoint().ca_bundle_pem, ca_pem);
    drop(restarted);

    let app_config = Arc::new(AppWrapperConfig::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let addrs = [first.local_addr(), second.local_addr()];
    let servers = [first, second].map(|webhook| {
        tokio::spawn(webhook.serve(app_config.clone(), until_stopped(stopped.clone())))
    });
    let result = async {
        for addr in addrs {
            presented(addr, &ca_pem).await?;
        }
        // the CA in the Secret is replaced: both replicas follow it without a restart
        let rotated = CertificateAuthority::generate(
            "rotated-ca",
            Validity::starting_now(Duration::from_secs(24 * 3600)),
        )?;
        secrets
            .patch(
                "webhook-ca",
                &PatchParams::default(),
                &Patch::Merge(json!({"stringData": {
                    "tls.crt": rotated.cert_pem(), "tls.key": rotated.key_pem()}})),
            )
            .await?;
        for addr in addrs {
            wait::until(
                "the replica presents a certificate from the new CA",
                Duration::from_secs(30),
                || presented(addr, rotated.cert_pem()),
            )
            .await?;
        }
        // the registered configurations point at another webhook: left as they were
        let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        let registered = validating
            .get(lifeboat_agent::webhook::VALIDATING_CONFIGURATION)
            .await?;
        let bundle = registered
            .webhooks
            .unwrap_or_default()
            .first()
            .and_then(|w| w.client_config.ca_bundle.clone())
            .ok_or("no caBundle registered")?;
        assert_eq!(bundle.0, setup.ca.cert_pem().as_bytes());

        // a Secret without a usable CA is an error naming it, and is left as it is
        let broken: Secret = serde_json::from_value(json!({"metadata": {"name": "broken-ca"},
            "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": "not a certificate", "tls.key": "not a key"}}))?;
        let created = secrets.create(&PostParams::default(), &broken).await?;
        let error = match Webhook::bind(config("broken-ca"), &client, &Registry::new()).await {
            Ok(_) => return Err("a webhook started from an unusable CA Secret".into()),
            Err(e) => e.to_string(),
        };
        assert!(
            error.contains(&format!(
                "Secret {namespace}/broken-ca does not hold a usable CA (left unchanged)"
            )),
            "{error}"
        );
        let after = secrets.get("broken-ca").await?;
        assert_eq!(
            after.metadata.resource_version,
            created.metadata.resource_version
        );
        Ok::<_, TestError>(())
    }
    .await;
    let _ = stop.send(true);
    for server in servers {
        tokio::time::timeout(Duration::from_secs(30), server)
            .await
            .map_err(|_| "a replica did not stop")???;
    }
    result
}
