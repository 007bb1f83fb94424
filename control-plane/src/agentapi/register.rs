//! Registration: a bootstrap token buys a cluster token. The hub creates the Cluster if absent
//! (with the hub's finalizer), mints the token, keeps only its SHA-256 (Secret
//! `cluster-<name>-credential`, owned by the Cluster), renews the Lease and records the agent in
//! the Cluster status. A new registration replaces the credential: the previous token stops
//! working. So registering a cluster that holds a live credential takes either that credential
//! (an agent rotating its own) or a bootstrap token bound to the cluster's name; a bootstrap
//! token without a name registers new clusters only ([`Registrant::may_register`]). The answer
//! is sent once the new credential is live in the index, so the agent's next call is never
//! refused for lag.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::header;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;
use lifeboat_api::cluster::{AgentInfo, Cluster, ClusterSpec};
use lifeboat_api::protocol::{PROTOCOL_VERSION, RegisterRequest, RegisterResponse};
use tracing::Instrument;

use super::auth::{self, RegisterRefusal, Registrant, TokenHash};
use super::heartbeat::{LeaseNotes, whole_seconds};
use super::{ApiError, Shared, json_body, seconds};
use crate::clusters::removal::FINALIZER;
use lifeboat_api::credentials::{CLUSTER_CREDENTIAL_TYPE, CREDENTIAL_HASH_KEY};

/// Whether `name` is a DNS-1123 label (what a Cluster name must be here: it also names the
/// Lease and the Secret).
pub fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// Checks the fields of a registration that do not depend on the hub's state.
pub fn validate(request: &RegisterRequest) -> Result<(), ApiError> {
    if !is_dns_label(&request.cluster_name) {
        return Err(ApiError::BadRequest(format!(
            "clusterName: {:?} is not a DNS-1123 label (at most 63 lowercase letters, digits \
             and '-', starting and ending with a letter or digit)",
            request.cluster_name
        )));
    }
    if request.protocol_version != PROTOCOL_VERSION {
        return Err(ApiError::BadRequest(format!(
            "protocolVersion: the hub speaks {PROTOCOL_VERSION}, the agent sent {:?}",
            request.protocol_version
        )));
    }
    if request.identity.trim().is_empty() {
        return Err(ApiError::BadRequest(
            "identity: must name the agent replica, got an empty string".into(),
        ));
    }
    if request.fencing_period_seconds < 1 {
        return Err(ApiError::BadRequest(format!(
            "fencingPeriodSeconds: must be at least 1, got {}",
            request.fencing_period_seconds
        )));
    }
    Ok(())
}

/// The agent and the hub must agree on the fencing period: the hub waits that long before it
/// recreates `Directly` work elsewhere, the agent suspends it after that long without the hub.
pub fn check_fencing(request: &RegisterRequest, hub_seconds: i32) -> Result<(), ApiError> {
    if request.fencing_period_seconds != hub_seconds {
        return Err(ApiError::BadRequest(format!(
            "fencingPeriodSeconds: the agent's is {} but the hub's for cluster {} is {} \
             (Cluster spec.fencingPeriodSeconds, else the hub's default); set both the same",
            request.fencing_period_seconds, request.cluster_name, hub_seconds
        )));
    }
    Ok(())
}

pub(super) async fn register(
    State(shared): State<Arc<Shared>>,
    request: Request,
) -> Result<Json<RegisterResponse>, ApiError> {
    let presented = auth::bearer(
        request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    )
    .ok_or_else(|| {
        ApiError::Unauthorized(
            "no bearer token (a bootstrap token or the cluster's credential) in the \
             Authorization header"
                .into(),
        )
    })?;
    tokio::time::timeout(
        shared.config.cache_wait,
        shared.bootstrap.wait_until_ready(),
    )
    .await
    .ok()
    .and_then(|r| r.ok())
    .ok_or_else(|| ApiError::Unavailable("the hub is still loading the bootstrap tokens".into()))?;
    if !shared
        .credentials
        .wait_ready(shared.config.cache_wait)
        .await
    {
        return Err(ApiError::Unavailable(
            "the hub is still loading the cluster credentials".into(),
        ));
    }
    // Known token first: a stranger's body is never read.
    let registrant = match shared.credentials.cluster_of(&TokenHash::of(presented)) {
        Some(cluster) => Registrant::Credential { cluster },
        None => Registrant::Bootstrap(
            auth::find_bootstrap(
                shared.bootstrap.state().iter().map(|s| s.as_ref()),
                presented,
            )
            .map_err(|refusal| ApiError::Unauthorized(refusal.to_string()))?,
        ),
    };
    let body: RegisterRequest =
        json_body(request, "registration", shared.config.body_limit).await?;
    let span = tracing::info_span!("register", cluster = %body.cluster_name);
    async move {
        let refuse = |refusal: RegisterRefusal| {
            if refusal.is_unauthorized() {
                ApiError::Unauthorized(refusal.to_string())
            } else {
                ApiError::Forbidden(refusal.to_string())
            }
        };
        // What the token alone allows (expired, bound elsewhere), before any read.
        registrant
            .may_name(&body.cluster_name, shared.now())
            .map_err(refuse)?;
        validate(&body)?;

        let clusters: Api<Cluster> = Api::all(shared.client.clone());
        let name = body.cluster_name.as_str();
        let existing = clusters
            .get_opt(name)
            .await
            .map_err(|e| ApiError::from_kube(&format!("reading Cluster {name}"), e))?;
        if existing
            .as_ref()
            .is_some_and(|c| c.metadata.deletion_timestamp.is_some())
        {
            return Err(ApiError::Conflict(format!(
                "cluster {name} is being deleted from the hub; register again once it is gone"
            )));
        }
        // Registering replaces the cluster's credential: a registered cluster is not an
        // unbound token's to take.
        let registered = existing.is_some() && shared.credentials.has_credential(name);
        registrant
            .may_register(name, registered, shared.now())
            .map_err(|refusal| {
                tracing::warn!(registrant = %registrant.describe(), %refusal, "registration refused");
                refuse(refusal)
            })?;
        let fencing = shared.fencing_seconds(existing.as_ref());
        check_fencing(&body, fencing)?;
        let cluster = match existing {
            Some(cluster) => cluster,
            None => create_cluster(&clusters, &body, &registrant).await?,
        };

        let token = lifeboat_api::credentials::mint_token(&shared.rng)
            .map_err(|_| ApiError::Unavailable("the system random source failed".into()))?;
        let hash = TokenHash::of(&token);
        shared
            .renew_lease(&cluster, &body.identity, LeaseNotes::default())
            .await?;
        store_credential(&shared, &cluster, hash).await?;
        let agent = AgentInfo {
            identity: body.identity.clone(),
            version: body.agent_version.clone(),
            registered_at: Some(Time(whole_seconds(shared.now()))),
            fencing_period_seconds: Some(fencing),
        };
        shared
            .write_agent_status(&cluster, |current| {
                let mut next = current.clone();
                next.agent = Some(agent);
                next
            })
            .await?;

        // Answer once the agent's next call will be recognised.
        let started = Instant::now();
        let live = shared
            .credentials
            .wait_for(name, hash, shared.config.cache_wait)
            .await
            && wait_for_cluster(&shared, name).await;
        shared
            .metrics
            .registration_wait
            .observe(started.elapsed().as_secs_f64());
        if !live {
            return Err(ApiError::Unavailable(format!(
                "the credential of cluster {name} was stored but is not live yet; register again"
            )));
        }
        tracing::info!(
            registrant = %registrant.describe(),
            identity = %body.identity,
            version = %body.agent_version,
            "agent registered"
        );
        Ok(Json(RegisterResponse {
            cluster_name: name.to_string(),
            token,
            lease_duration_seconds: shared.config.lease_seconds(),
            heartbeat_interval_seconds: seconds(shared.config.heartbeat_interval),
            fencing_period_seconds: fencing,
        }))
    }
    .instrument(span)
    .await
}

async fn create_cluster(
    clusters: &Api<Cluster>,
    body: &RegisterRequest,
    registrant: &Registrant,
) -> Result<Cluster, ApiError> {
    let name = body.cluster_name.as_str();
    let mut cluster = Cluster::new(
        name,
        ClusterSpec {
            provider: body.provider.clone(),
            region: body.region.clone(),
            zone: body.zone.clone(),
            ..ClusterSpec::default()
        },
    );
    // The hub's finalizer from the start: a Cluster deleted right after its creation still
    // stops its agent (the health monitor adds it to Clusters created otherwise).
    cluster.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    match clusters.create(&PostParams::default(), &cluster).await {
        Ok(created) => {
            tracing::info!("created the Cluster at its agent's first registration");
            Ok(created)
        }
        // Created meanwhile by a concurrent registration: with an unbound token, that one
        // registered the name first.
        Err(kube::Error::Api(status))
            if status.code == 409
                && matches!(registrant, Registrant::Bootstrap(t) if t.cluster_name.is_none()) =>
        {
            Err(ApiError::Forbidden(format!(
                "cluster {name} was registered by another agent meanwhile; a bootstrap token \
                 without a cluster-name only registers new clusters"
            )))
        }
        // Created meanwhile (an operator): use that one.
        Err(kube::Error::Api(status)) if status.code == 409 => clusters
            .get(name)
            .await
            .map_err(|e| ApiError::from_kube(&format!("reading Cluster {name}"), e)),
        Err(e) => Err(ApiError::from_kube(&format!("creating Cluster {name}"), e)),
    }
}

/// Writes the credential Secret (server-side apply: created or replaced in one call).
async fn store_credential(
    shared: &Shared,
    cluster: &Cluster,
    hash: TokenHash,
) -> Result<(), ApiError> {
    shared
        .apply_cluster_secret(
            cluster,
            &auth::credential_secret_name(&cluster.name_any()),
            CLUSTER_CREDENTIAL_TYPE,
            BTreeMap::from([(CREDENTIAL_HASH_KEY.to_string(), hash.to_hex().into_bytes())]),
        )
        .await
}

async fn wait_for_cluster(shared: &Shared, name: &str) -> bool {
    let deadline = Instant::now() + shared.config.cache_wait;
    while Instant::now() < deadline {
        if shared
            .clusters
            .get(&ObjectRef::new(name))
            .is_some_and(|c| c.metadata.deletion_timestamp.is_none())
        {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> RegisterRequest {
        RegisterRequest {
            cluster_name: "gpu-east-1".into(),
            identity: "agent-0/17".into(),
            agent_version: "0.1.0".into(),
            protocol_version: "v1".into(),
            fencing_period_seconds: 60,
            ..Default::default()
        }
    }

    fn message(result: Result<(), ApiError>) -> String {
        match result {
            Err(ApiError::BadRequest(m)) => m,
            other => panic!("expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn dns_labels() {
        for ok in ["a", "gpu-east-1", "0abc", &"a".repeat(63)] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }

    #[test]
    fn a_bad_registration_names_the_field() {
        assert!(validate(&request()).is_ok());
        let m = message(validate(&RegisterRequest {
            cluster_name: "GPU_East".into(),
            ..request()
        }));
        assert!(
            m.starts_with("clusterName:") && m.contains("GPU_East"),
            "{m}"
        );
        let m = message(validate(&RegisterRequest {
            protocol_version: "v2".into(),
            ..request()
        }));
        assert!(m.starts_with("protocolVersion:") && m.contains("v2"), "{m}");
        let m = message(validate(&RegisterRequest {
            fencing_period_seconds: 0,
            ..request()
        }));
        assert!(m.starts_with("fencingPeriodSeconds:"), "{m}");
        let m = message(validate(&RegisterRequest {
            identity: " ".into(),
            ..request()
        }));
        assert!(m.starts_with("identity:"), "{m}");
    }

    #[test]
    fn the_fencing_periods_must_agree() {
        assert!(check_fencing(&request(), 60).is_ok());
        let m = message(check_fencing(&request(), 90));
        assert!(
            m.starts_with("fencingPeriodSeconds:") && m.contains("60") && m.contains("90"),
            "{m}"
        );
    }
}
