//! Namespaces the hub's works (and the credential Secret) need in the member: created when
//! missing, labelled as Lifeboat's, as Karmada propagates a workload's namespace with it. They
//! are never deleted by the agent (other objects may have moved in).

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};

use super::fencer::FencerBinding;

/// Label on the namespaces the agent created.
pub const CREATED_BY_LABEL: &str = "app.kubernetes.io/created-by";
pub const CREATED_BY: &str = "lifeboat-agent";

/// Namespaces known to exist (so each is looked up once per leadership term).
pub struct Namespaces {
    client: kube::Client,
    known: Mutex<HashSet<String>>,
    /// With a fencing credential, each namespace gets the fencer's RoleBinding with it.
    fencer: Option<FencerBinding>,
}

impl Namespaces {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            known: Mutex::new(HashSet::new()),
            fencer: None,
        }
    }

    /// Gives every namespace ensured the fencing ServiceAccount's RoleBinding
    /// ([`super::fencer`]): the hub's fencing credential may delete (what Lifeboat placed) in the
    /// namespaces of the hub's work and nowhere else.
    pub fn with_fencer(mut self, fencer: Option<FencerBinding>) -> Self {
        self.fencer = fencer;
        self
    }

    /// Creates `name` unless it exists; returns whether this call created it.
    pub async fn ensure(&self, name: &str) -> Result<bool, kube::Error> {
        if self.lock().contains(name) {
            return Ok(false);
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        let created = if api.get_opt(name).await?.is_some() {
            false
        } else {
            let namespace = Namespace {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    labels: Some(BTreeMap::from([(
                        CREATED_BY_LABEL.to_string(),
                        CREATED_BY.to_string(),
                    )])),
                    ..Default::default()
                },
                ..Default::default()
            };
            match api.create(&PostParams::default(), &namespace).await {
                Ok(_) => {
                    tracing::info!(namespace = name, "created the namespace of a work");
                    true
                }
                Err(kube::Error::Api(s)) if s.code == 409 => false,
                Err(e) => return Err(e),
            }
        };
        if let Some(fencer) = &self.fencer {
            fencer.apply(&self.client, name).await?;
        }
        self.lock().insert(name.to_string());
        Ok(created)
    }

    /// A namespace was found missing after all (deleted since): look it up again next time.
    pub fn forget(&self, name: &str) {
        self.lock().remove(name);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lifeboat_runtime::mock::{ApiServer, Method};
    use serde_json::json;

    #[tokio::test]
    async fn a_missing_namespace_is_created_labelled_once() {
        let (client, mut server) = ApiServer::new();
        let namespaces = Namespaces::new(client);
        let task = tokio::spawn(async move {
            let first = namespaces.ensure("shop").await.expect("created");
            let again = namespaces.ensure("shop").await.expect("known");
            (first, again)
        });
        server
            .next()
            .await
            .expect(Method::GET, "/api/v1/namespaces/shop")
            .fail(404, "NotFound", "namespaces \"shop\" not found");
        let create = server
            .next()
            .await
            .expect(Method::POST, "/api/v1/namespaces");
        assert_eq!(
            create.body["metadata"],
            json!({"name": "shop", "labels": {"app.kubernetes.io/created-by": "lifeboat-agent"}})
        );
        create.reply(201, json!({"metadata": {"name": "shop"}}));
        assert_eq!(task.await.expect("joined"), (true, false));
        assert!(server.is_idle().await, "the second call made no request");
    }

    #[tokio::test]
    async fn an_existing_namespace_is_left_alone() {
        let (client, mut server) = ApiServer::new();
        let namespaces = Namespaces::new(client);
        let task = tokio::spawn(async move { namespaces.ensure("default").await });
        server
            .next()
            .await
            .expect(Method::GET, "/api/v1/namespaces/default")
            .reply(200, json!({"metadata": {"name": "default"}}));
        assert!(!task.await.expect("joined").expect("ok"));
    }
}
