//! The IO behind the RBAC check: kind → plural resource through discovery, and the
//! SubjectAccessReviews. [`Authorizer`] lets the decision be tested with a fake apiserver.
//!
//! Work per admission request is bounded: at most [`MAX_COMPONENTS`] components reach this
//! point, at most [`AccessLimits::per_request`] checks of one request run at once, at most
//! [`AccessLimits::global`] across all requests, every check ends by [`AccessLimits::deadline`],
//! and only kinds discovery confirmed are cached ([`KindCache`], bounded), so a flood of
//! made-up kinds does not grow memory.
//!
//! [`MAX_COMPONENTS`]: super::admission::MAX_COMPONENTS

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::authorization::v1::{SubjectAccessReview, SubjectAccessReviewStatus};
use kube::api::{Api, PostParams};
use kube::core::DynamicObject;
use kube::core::admission::AdmissionRequest;
use lifeboat_api::appwrapper::AppWrapper;
use lifeboat_api::appwrapper::podsets::GroupVersionKind;
use tokio::sync::Semaphore;

use super::admission::{
    AccessCheck, AccessOutcome, Verdict, access_checks, access_review, component_count_error,
    create_verdict, request_namespace, servable,
};

/// What the RBAC check needs from the apiserver.
pub trait Authorizer: Send + Sync + 'static {
    /// The plural resource name of a kind: `Ok(None)` when the cluster does not serve it, `Err`
    /// when discovery could not tell.
    fn resource_for(
        &self,
        gvk: &GroupVersionKind,
    ) -> impl Future<Output = Result<Option<String>, String>> + Send;

    /// Sends a SubjectAccessReview and returns the apiserver's answer.
    fn review(
        &self,
        review: SubjectAccessReview,
    ) -> impl Future<Output = Result<SubjectAccessReviewStatus, String>> + Send;
}

/// Checks (discovery, then a SubjectAccessReview) of one request in flight at once.
pub const CHECKS_PER_REQUEST: usize = 4;
/// Checks in flight across all requests. The apiserver calls the webhook for a burst of creates
/// at once; this keeps the webhook from answering a burst with a burst of its own.
pub const CONCURRENT_CHECKS: usize = 16;
/// The checks of one request must be done within this time, below the 10 s the apiserver gives
/// the whole webhook call: a late answer is useless, a timely "could not check" is not.
pub const CHECKS_DEADLINE: Duration = Duration::from_secs(8);

/// How much apiserver IO admission may do.
#[derive(Debug, Clone)]
pub struct AccessLimits {
    /// Checks of one request in flight at once (at least 1).
    pub per_request: usize,
    /// Shared by every request: one permit per check in flight.
    pub global: Arc<Semaphore>,
    /// Time the checks of one request get; a check not done by then fails the request with an
    /// internal error naming its component.
    pub deadline: Duration,
}

impl Default for AccessLimits {
    fn default() -> Self {
        Self {
            per_request: CHECKS_PER_REQUEST,
            global: Arc::new(Semaphore::new(CONCURRENT_CHECKS)),
            deadline: CHECKS_DEADLINE,
        }
    }
}

/// Create validation with the RBAC check: one SubjectAccessReview per distinct wrapped kind
/// (with the [`AccessLimits`]), then the pure verdict. An AppWrapper over the component cap is
/// judged without any apiserver call.
pub async fn validate_create_with_access<A: Authorizer>(
    request: &AdmissionRequest<DynamicObject>,
    aw: &AppWrapper,
    check_access: bool,
    authorizer: &A,
    limits: &AccessLimits,
) -> Verdict {
    let namespace = request_namespace(request, aw);
    if !check_access || component_count_error(aw).is_some() {
        return create_verdict(aw, &namespace, &request.user_info, &[]);
    }
    let deadline = tokio::time::Instant::now() + limits.deadline;
    let checks = access_checks(aw);
    let namespace = namespace.as_str();
    let outcomes: Vec<AccessOutcome> = futures::stream::iter(checks.clone())
        .map(|check| async move {
            bounded_outcome(&check, namespace, request, authorizer, limits, deadline).await
        })
        .buffered(limits.per_request.max(1))
        .collect()
        .await;
    let judged: Vec<_> = checks.into_iter().zip(outcomes).collect();
    create_verdict(aw, namespace, &request.user_info, &judged)
}

async fn bounded_outcome<A: Authorizer>(
    check: &AccessCheck,
    namespace: &str,
    request: &AdmissionRequest<DynamicObject>,
    authorizer: &A,
    limits: &AccessLimits,
    deadline: tokio::time::Instant,
) -> AccessOutcome {
    if !servable(&check.gvk) {
        return AccessOutcome::NotServed;
    }
    let checked = async {
        // The semaphore is never closed; if it were, checking without a permit is still safe.
        let _permit = limits.global.acquire().await.ok();
        outcome(check, namespace, request, authorizer).await
    };
    tokio::time::timeout_at(deadline, checked)
        .await
        .unwrap_or_else(|_| {
            AccessOutcome::Failed(format!(
                "not checked within {:?} (the apiserver is slow or the webhook is busy)",
                limits.deadline
            ))
        })
}

async fn outcome<A: Authorizer>(
    check: &AccessCheck,
    namespace: &str,
    request: &AdmissionRequest<DynamicObject>,
    authorizer: &A,
) -> AccessOutcome {
    let resource = match authorizer.resource_for(&check.gvk).await {
        Ok(Some(plural)) => plural,
        Ok(None) => return AccessOutcome::NotServed,
        Err(error) => return AccessOutcome::Failed(format!("discovery failed: {error}")),
    };
    let review = access_review(check, &resource, namespace, &request.user_info);
    match authorizer.review(review).await {
        Ok(status) if status.allowed => AccessOutcome::Allowed,
        Ok(_) => AccessOutcome::Denied { resource },
        Err(error) => AccessOutcome::Failed(error),
    }
}

/// Kinds the cache holds at most. A cluster serves a finite number of kinds and only those can
/// enter, so the cap is a safety net; when full, further kinds are looked up every time.
pub const MAX_CACHED_KINDS: usize = 1024;

/// kind → plural, for kinds discovery confirmed only (never for unknown ones).
#[derive(Debug)]
pub struct KindCache {
    plurals: RwLock<HashMap<GroupVersionKind, String>>,
    capacity: usize,
}

impl KindCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            plurals: RwLock::new(HashMap::new()),
            capacity,
        }
    }

    pub fn get(&self, gvk: &GroupVersionKind) -> Option<String> {
        let plurals = self.plurals.read().unwrap_or_else(|e| e.into_inner());
        plurals.get(gvk).cloned()
    }

    /// Remembers a kind discovery confirmed; `false` when the cache is full (not remembered).
    pub fn confirm(&self, gvk: &GroupVersionKind, plural: &str) -> bool {
        let mut plurals = self.plurals.write().unwrap_or_else(|e| e.into_inner());
        if plurals.len() >= self.capacity && !plurals.contains_key(gvk) {
            return false;
        }
        plurals.insert(gvk.clone(), plural.to_string());
        true
    }

    pub fn len(&self) -> usize {
        self.plurals.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Per call; the checks of a request share [`CHECKS_DEADLINE`].
const CALL_TIMEOUT: Duration = Duration::from_secs(4);

/// [`Authorizer`] backed by the member cluster's apiserver.
pub struct KubeAuthorizer {
    client: kube::Client,
    kinds: KindCache,
}

impl KubeAuthorizer {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            kinds: KindCache::new(MAX_CACHED_KINDS),
        }
    }

    /// The discovery-confirmed kinds remembered.
    pub fn kinds(&self) -> &KindCache {
        &self.kinds
    }
}

impl Authorizer for KubeAuthorizer {
    async fn resource_for(&self, gvk: &GroupVersionKind) -> Result<Option<String>, String> {
        if let Some(plural) = self.kinds.get(gvk) {
            return Ok(Some(plural));
        }
        let kube_gvk = kube::api::GroupVersionKind::gvk(&gvk.group, &gvk.version, &gvk.kind);
        let found = tokio::time::timeout(
            CALL_TIMEOUT,
            kube::discovery::pinned_kind(&self.client, &kube_gvk),
        )
        .await
        .map_err(|_| format!("no answer within {CALL_TIMEOUT:?}"))?;
        match found {
            Ok((resource, _)) => {
                if !self.kinds.confirm(gvk, &resource.plural) {
                    tracing::debug!(%gvk, "kind cache full; not remembered");
                }
                Ok(Some(resource.plural))
            }
            // The group/version is not served at all, or it does not list the kind.
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(kube::Error::Discovery(_)) => Ok(None),
            Err(error) => Err(error.to_string()),
        }
    }

    async fn review(
        &self,
        review: SubjectAccessReview,
    ) -> Result<SubjectAccessReviewStatus, String> {
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer =
            tokio::time::timeout(CALL_TIMEOUT, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| format!("SubjectAccessReview timed out after {CALL_TIMEOUT:?}"))?
                .map_err(|e| format!("SubjectAccessReview failed: {e}"))?;
        answer
            .status
            .ok_or_else(|| "SubjectAccessReview answered without a status".to_string())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::webhook::admission::parse_review;
    use crate::webhook::admission::tests::{
        appwrapper, deployment_component, pod_component, review_body,
    };
    use serde_json::{Value, json};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An apiserver where the user may create only the listed resources; kinds not in
    /// `plurals` are unknown to discovery. Every call counts how many calls are in flight and
    /// yields a few times before answering, so calls overlap as far as the limits let them.
    #[derive(Default)]
    pub struct FakeAuthorizer {
        pub plurals: HashMap<String, String>,
        pub allowed: Vec<String>,
        pub fail: bool,
        /// Discovery never answers.
        pub hang: bool,
        pub reviews: Mutex<Vec<SubjectAccessReview>>,
        pub lookups: AtomicUsize,
        in_flight: AtomicUsize,
        pub max_in_flight: AtomicUsize,
    }

    impl FakeAuthorizer {
        pub fn new(allowed: &[&str]) -> Self {
            Self {
                plurals: HashMap::from([
                    ("Pod".to_string(), "pods".to_string()),
                    ("Deployment".to_string(), "deployments".to_string()),
                ]),
                allowed: allowed.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            }
        }

        async fn call(&self) {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_flight.fetch_max(now, Ordering::SeqCst);
            for _ in 0..8 {
                tokio::task::yield_now().await;
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl Authorizer for FakeAuthorizer {
        async fn resource_for(&self, gvk: &GroupVersionKind) -> Result<Option<String>, String> {
            self.lookups.fetch_add(1, Ordering::SeqCst);
            if self.hang {
                std::future::pending::<()>().await;
            }
            self.call().await;
            Ok(self.plurals.get(&gvk.kind).cloned())
        }

        async fn review(
            &self,
            review: SubjectAccessReview,
        ) -> Result<SubjectAccessReviewStatus, String> {
            self.call().await;
            if self.fail {
                return Err("apiserver unavailable".into());
            }
            let resource = review
                .spec
                .resource_attributes
                .as_ref()
                .and_then(|a| a.resource.clone())
                .unwrap_or_default();
            self.reviews
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(review);
            Ok(SubjectAccessReviewStatus {
                allowed: self.allowed.contains(&resource),
                ..Default::default()
            })
        }
    }

    fn create_request(components: Vec<Value>) -> (AdmissionRequest<DynamicObject>, AppWrapper) {
        let object = appwrapper(json!({}), components);
        let req = parse_review(&review_body("CREATE", object.clone(), None)).unwrap();
        (req, serde_json::from_value(object).unwrap())
    }

    /// A component of kind `example.com/v1 Kind{i}` without pods.
    fn custom_component(i: usize) -> Value {
        json!({"template": {"apiVersion": "example.com/v1", "kind": format!("Kind{i}"),
            "metadata": {"name": format!("c{i}")}}})
    }

    /// A pod and `Kind0..Kind{n}`: `n + 1` distinct kinds.
    fn pod_and_custom(n: usize) -> Vec<Value> {
        std::iter::once(pod_component("p"))
            .chain((0..n).map(custom_component))
            .collect()
    }

    /// Knows `Kind0..Kind{n}` and lets the user create all of them and pods.
    fn custom_authorizer(n: usize) -> FakeAuthorizer {
        let mut authorizer = FakeAuthorizer::new(&["pods"]);
        for i in 0..n {
            authorizer
                .plurals
                .insert(format!("Kind{i}"), format!("kind{i}s"));
            authorizer.allowed.push(format!("kind{i}s"));
        }
        authorizer
    }

    #[tokio::test]
    async fn pods_allowed_deployments_denied_with_the_field_named() {
        let authorizer = FakeAuthorizer::new(&["pods"]);
        let limits = AccessLimits::default();
        let (req, aw) = create_request(vec![pod_component("p")]);
        let verdict = validate_create_with_access(&req, &aw, true, &authorizer, &limits).await;
        assert!(verdict.allowed(), "{verdict:?}");

        let (req, aw) = create_request(vec![pod_component("p"), deployment_component(1)]);
        let verdict = validate_create_with_access(&req, &aw, true, &authorizer, &limits).await;
        assert_eq!(verdict.errors.len(), 1);
        assert_eq!(verdict.errors[0].field, "spec.components[1].template");
        assert_eq!(
            verdict.errors[0].reason,
            "User limited-user is not authorized to create deployments.apps in team"
        );
        let reviews = authorizer.reviews.lock().unwrap();
        // one review for the first AppWrapper, one per distinct kind for the second
        assert_eq!(reviews.len(), 3);
        let last = reviews[2].spec.resource_attributes.clone().unwrap();
        assert_eq!(last.resource.as_deref(), Some("deployments"));
        assert_eq!(last.namespace.as_deref(), Some("team"));
    }

    #[tokio::test]
    async fn the_check_can_be_turned_off_and_failures_are_internal() {
        let authorizer = FakeAuthorizer::new(&[]);
        let limits = AccessLimits::default();
        let (req, aw) = create_request(vec![deployment_component(1)]);
        assert!(
            validate_create_with_access(&req, &aw, false, &authorizer, &limits)
                .await
                .allowed()
        );
        assert!(authorizer.reviews.lock().unwrap().is_empty());
        assert_eq!(authorizer.lookups.load(Ordering::SeqCst), 0);

        let failing = FakeAuthorizer {
            fail: true,
            ..FakeAuthorizer::new(&["pods"])
        };
        let verdict = validate_create_with_access(&req, &aw, true, &failing, &limits).await;
        assert!(verdict.internal);
        assert!(verdict.errors[0].reason.contains("apiserver unavailable"));
    }

    #[tokio::test]
    async fn made_up_kinds_are_rejected_naming_the_kind_without_a_review() {
        let authorizer = FakeAuthorizer::new(&["pods"]);
        let limits = AccessLimits::default();
        let mut badly_spelled = custom_component(1);
        badly_spelled["template"]["apiVersion"] = json!("v1/../../api/v1");
        let (req, aw) =
            create_request(vec![pod_component("p"), custom_component(0), badly_spelled]);
        let verdict = validate_create_with_access(&req, &aw, true, &authorizer, &limits).await;
        let fields: Vec<_> = verdict.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            vec![
                "spec.components[1].template.kind",
                "spec.components[2].template.kind"
            ]
        );
        assert_eq!(
            verdict.errors[0].reason,
            "no kind \"Kind0\" is served in version \"example.com/v1\" by this cluster"
        );
        assert!(!verdict.internal);
        // discovery was asked about the pod and Kind0, never about the badly spelled one, and
        // only the pod was reviewed
        assert_eq!(authorizer.lookups.load(Ordering::SeqCst), 2);
        assert_eq!(authorizer.reviews.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn over_the_component_cap_nothing_is_looked_up() {
        let authorizer = custom_authorizer(40);
        let (req, aw) = create_request(pod_and_custom(40));
        let verdict =
            validate_create_with_access(&req, &aw, true, &authorizer, &AccessLimits::default())
                .await;
        assert_eq!(verdict.errors.len(), 1);
        assert_eq!(verdict.errors[0].field, "spec.components");
        assert_eq!(authorizer.lookups.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn one_request_runs_at_most_its_share_of_checks_at_once() {
        let authorizer = custom_authorizer(10);
        let (req, aw) = create_request(pod_and_custom(10));
        let limits = AccessLimits {
            per_request: 4,
            global: Arc::new(Semaphore::new(100)),
            deadline: Duration::from_secs(60),
        };
        let verdict = validate_create_with_access(&req, &aw, true, &authorizer, &limits).await;
        assert!(verdict.allowed(), "{verdict:?}");
        assert_eq!(authorizer.reviews.lock().unwrap().len(), 11);
        // the checks did overlap, and never more than 4 of them
        assert_eq!(authorizer.max_in_flight.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn all_requests_together_run_at_most_the_global_number_of_checks() {
        let authorizer = custom_authorizer(10);
        let limits = AccessLimits {
            per_request: 4,
            global: Arc::new(Semaphore::new(6)),
            deadline: Duration::from_secs(60),
        };
        let requests: Vec<_> = (0..5).map(|_| create_request(pod_and_custom(10))).collect();
        let verdicts = futures::future::join_all(
            requests
                .iter()
                .map(|(req, aw)| validate_create_with_access(req, aw, true, &authorizer, &limits)),
        )
        .await;
        assert!(verdicts.iter().all(Verdict::allowed), "{verdicts:?}");
        assert_eq!(authorizer.reviews.lock().unwrap().len(), 55);
        // 5 requests × 4 would be 20 at once; the global limit holds it at 6
        assert_eq!(authorizer.max_in_flight.load(Ordering::SeqCst), 6);
        assert_eq!(limits.global.available_permits(), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn checks_not_done_by_the_deadline_fail_the_request() {
        let hanging = FakeAuthorizer {
            hang: true,
            ..FakeAuthorizer::new(&["pods"])
        };
        let limits = AccessLimits::default();
        let (req, aw) = create_request(vec![pod_component("p")]);
        let started = tokio::time::Instant::now();
        let verdict = validate_create_with_access(&req, &aw, true, &hanging, &limits).await;
        // the paused clock jumped straight to the deadline
        assert_eq!(started.elapsed(), CHECKS_DEADLINE);
        assert!(verdict.internal);
        assert_eq!(verdict.errors[0].field, "spec.components[0].template");
        assert!(
            verdict.errors[0]
                .reason
                .ends_with("not checked within 8s (the apiserver is slow or the webhook is busy)"),
            "{}",
            verdict.errors[0].reason
        );
        assert_eq!(limits.global.available_permits(), CONCURRENT_CHECKS);
    }

    #[test]
    fn the_kind_cache_is_bounded() {
        let cache = KindCache::new(2);
        let gvk = |kind: &str| GroupVersionKind {
            group: "example.com".into(),
            version: "v1".into(),
            kind: kind.into(),
        };
        assert!(cache.confirm(&gvk("A"), "as"));
        assert!(cache.confirm(&gvk("B"), "bs"));
        assert!(!cache.confirm(&gvk("C"), "cs"));
        assert!(
            cache.confirm(&gvk("A"), "as"),
            "known kinds may be refreshed"
        );
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(&gvk("B")).as_deref(), Some("bs"));
        assert_eq!(cache.get(&gvk("C")), None);
    }

    /// A kube client whose apiserver serves discovery for `apps/v1` (deployments) only, answers
    /// 404 for other group versions and 500 for `broken.example.com`, counting requests.
    fn discovery_client(requests: Arc<AtomicUsize>) -> kube::Client {
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            requests.fetch_add(1, Ordering::SeqCst);
            let path = request.uri().path().to_string();
            async move {
                let (status, body) = match path.as_str() {
                    "/apis/apps/v1" => (
                        200,
                        json!({"kind": "APIResourceList", "apiVersion": "v1",
                            "groupVersion": "apps/v1", "resources": [
                            {"name": "deployments", "singularName": "deployment",
                             "namespaced": true, "kind": "Deployment",
                             "verbs": ["create", "get", "list"]},
                            {"name": "deployments/status", "singularName": "",
                             "namespaced": true, "kind": "Deployment", "verbs": ["get"]}]}),
                    ),
                    p if p.starts_with("/apis/broken.example.com/") => (
                        500,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "message": "etcd is down", "reason": "InternalError", "code": 500}),
                    ),
                    _ => (
                        404,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "message": "the server could not find the requested resource",
                            "reason": "NotFound", "code": 404}),
                    ),
                };
                let mut response =
                    http::Response::new(kube::client::Body::from(body.to_string().into_bytes()));
                *response.status_mut() =
                    http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::OK);
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        kube::Client::new(service, "default")
    }

    #[tokio::test]
    async fn only_kinds_discovery_confirms_are_cached() {
        let requests = Arc::new(AtomicUsize::new(0));
        let authorizer = KubeAuthorizer::new(discovery_client(requests.clone()));
        let gvk = |group: &str, kind: &str| GroupVersionKind {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
        };
        let deployment = gvk("apps", "Deployment");
        assert_eq!(
            authorizer.resource_for(&deployment).await,
            Ok(Some("deployments".to_string()))
        );
        assert_eq!(
            authorizer.resource_for(&deployment).await,
            Ok(Some("deployments".to_string()))
        );
        assert_eq!(
            requests.load(Ordering::SeqCst),
            1,
            "the second answer is cached"
        );

        // a flood of made-up kinds: each is looked up, none is remembered
        for i in 0..100 {
            let made_up = gvk("example.com", &format!("Thing{i}"));
            assert_eq!(authorizer.resource_for(&made_up).await, Ok(None));
        }
        // a kind missing from a served group version
        assert_eq!(
            authorizer.resource_for(&gvk("apps", "Nothing")).await,
            Ok(None)
        );
        assert_eq!(requests.load(Ordering::SeqCst), 102);
        assert_eq!(authorizer.kinds().len(), 1);

        // discovery failing is not "not served"
        let broken = authorizer
            .resource_for(&gvk("broken.example.com", "Thing"))
            .await
            .unwrap_err();
        assert!(broken.contains("etcd is down"), "{broken}");
        assert_eq!(authorizer.kinds().len(), 1);
    }
}
