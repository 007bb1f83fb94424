//! The IO behind the RBAC check: kind → plural resource through discovery (cached), and the
//! SubjectAccessReviews. [`Authorizer`] lets the decision be tested with a fake apiserver.

use std::collections::HashMap;
use std::future::Future;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{SubjectAccessReview, SubjectAccessReviewStatus};
use kube::api::{Api, PostParams};
use kube::core::DynamicObject;
use kube::core::admission::AdmissionRequest;
use lifeboat_api::appwrapper::AppWrapper;
use lifeboat_api::appwrapper::podsets::GroupVersionKind;

use super::admission::{AccessCheck, AccessOutcome, access_checks, access_review, create_verdict};
use super::admission::{Verdict, request_namespace};

/// What the RBAC check needs from the apiserver.
pub trait Authorizer: Send + Sync + 'static {
    /// The plural resource name of a kind; `None` when the cluster does not serve it.
    fn resource_for(&self, gvk: &GroupVersionKind) -> impl Future<Output = Option<String>> + Send;

    /// Sends a SubjectAccessReview and returns the apiserver's answer.
    fn review(
        &self,
        review: SubjectAccessReview,
    ) -> impl Future<Output = Result<SubjectAccessReviewStatus, String>> + Send;
}

/// Create validation with the RBAC check: one SubjectAccessReview per distinct wrapped kind
/// (concurrently), then the pure verdict.
pub async fn validate_create_with_access<A: Authorizer>(
    request: &AdmissionRequest<DynamicObject>,
    aw: &AppWrapper,
    check_access: bool,
    authorizer: &A,
) -> Verdict {
    let namespace = request_namespace(request, aw);
    let outcomes = if check_access {
        let checks = access_checks(aw);
        let answers = futures::future::join_all(
            checks
                .iter()
                .map(|check| outcome(check, &namespace, request, authorizer)),
        )
        .await;
        checks.into_iter().zip(answers).collect()
    } else {
        Vec::new()
    };
    create_verdict(aw, &namespace, &request.user_info, &outcomes)
}

async fn outcome<A: Authorizer>(
    check: &AccessCheck,
    namespace: &str,
    request: &AdmissionRequest<DynamicObject>,
    authorizer: &A,
) -> AccessOutcome {
    let resource = authorizer.resource_for(&check.gvk).await;
    let review = access_review(check, resource.as_deref(), namespace, &request.user_info);
    match authorizer.review(review).await {
        Ok(status) if status.allowed => AccessOutcome::Allowed,
        Ok(_) => AccessOutcome::Denied { resource },
        Err(error) => AccessOutcome::Failed(error),
    }
}

/// How long a "kind not served" answer is remembered (a CRD may be installed later).
const NEGATIVE_TTL: Duration = Duration::from_secs(30);
/// Per call; the apiserver gives the whole webhook call 10 s.
const CALL_TIMEOUT: Duration = Duration::from_secs(4);

/// [`Authorizer`] backed by the member cluster's apiserver.
pub struct KubeAuthorizer {
    client: kube::Client,
    /// kind → plural (or `None` with the time it was found unknown).
    plurals: RwLock<HashMap<GroupVersionKind, Cached>>,
}

#[derive(Clone)]
enum Cached {
    Plural(String),
    Unknown(Instant),
}

impl KubeAuthorizer {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            plurals: RwLock::new(HashMap::new()),
        }
    }

    fn cached(&self, gvk: &GroupVersionKind) -> Option<Option<String>> {
        let cache = self.plurals.read().unwrap_or_else(|e| e.into_inner());
        match cache.get(gvk)? {
            Cached::Plural(plural) => Some(Some(plural.clone())),
            Cached::Unknown(at) if at.elapsed() < NEGATIVE_TTL => Some(None),
            Cached::Unknown(_) => None,
        }
    }
}

impl Authorizer for KubeAuthorizer {
    async fn resource_for(&self, gvk: &GroupVersionKind) -> Option<String> {
        if let Some(hit) = self.cached(gvk) {
            return hit;
        }
        let kube_gvk = kube::api::GroupVersionKind::gvk(&gvk.group, &gvk.version, &gvk.kind);
        let found = tokio::time::timeout(
            CALL_TIMEOUT,
            kube::discovery::pinned_kind(&self.client, &kube_gvk),
        )
        .await;
        let entry = match found {
            Ok(Ok((resource, _))) => Cached::Plural(resource.plural),
            Ok(Err(e)) => {
                tracing::debug!(%gvk, error = %e, "kind not found by discovery; reviewing `*`");
                Cached::Unknown(Instant::now())
            }
            Err(_) => {
                tracing::warn!(%gvk, "discovery timed out; reviewing `*`");
                return None;
            }
        };
        let plural = match &entry {
            Cached::Plural(p) => Some(p.clone()),
            Cached::Unknown(_) => None,
        };
        self.plurals
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(gvk.clone(), entry);
        plural
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
    use serde_json::json;
    use std::sync::Mutex;

    /// An apiserver where the user may create only the listed resources; kinds not in
    /// `plurals` are unknown to discovery.
    #[derive(Default)]
    pub struct FakeAuthorizer {
        pub plurals: HashMap<String, String>,
        pub allowed: Vec<String>,
        pub fail: bool,
        pub reviews: Mutex<Vec<SubjectAccessReview>>,
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
    }

    impl Authorizer for FakeAuthorizer {
        async fn resource_for(&self, gvk: &GroupVersionKind) -> Option<String> {
            self.plurals.get(&gvk.kind).cloned()
        }

        async fn review(
            &self,
            review: SubjectAccessReview,
        ) -> Result<SubjectAccessReviewStatus, String> {
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

    fn create_request(
        components: Vec<serde_json::Value>,
    ) -> (AdmissionRequest<DynamicObject>, AppWrapper) {
        let object = appwrapper(json!({}), components);
        let req = parse_review(&review_body("CREATE", object.clone(), None)).unwrap();
        (req, serde_json::from_value(object).unwrap())
    }

    #[tokio::test]
    async fn pods_allowed_deployments_denied_with_the_field_named() {
        let authorizer = FakeAuthorizer::new(&["pods"]);
        let (req, aw) = create_request(vec![pod_component("p")]);
        let verdict = validate_create_with_access(&req, &aw, true, &authorizer).await;
        assert!(verdict.allowed(), "{verdict:?}");

        let (req, aw) = create_request(vec![pod_component("p"), deployment_component(1)]);
        let verdict = validate_create_with_access(&req, &aw, true, &authorizer).await;
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
        let (req, aw) = create_request(vec![deployment_component(1)]);
        assert!(
            validate_create_with_access(&req, &aw, false, &authorizer)
                .await
                .allowed()
        );
        assert!(authorizer.reviews.lock().unwrap().is_empty());

        let failing = FakeAuthorizer {
            fail: true,
            ..FakeAuthorizer::new(&["pods"])
        };
        let verdict = validate_create_with_access(&req, &aw, true, &failing).await;
        assert!(verdict.internal);
        assert!(verdict.errors[0].reason.contains("apiserver unavailable"));
    }
}
