//! Unit-test helpers of the controller: the mock API server and a context over it.

pub use lifeboat_runtime::mock::{ApiServer, Method};

/// A controller context over `client` with the default configuration.
pub fn context(client: kube::Client) -> super::Context {
    let (tx, _rx) = futures::channel::mpsc::unbounded();
    super::Context::new(
        client,
        std::sync::Arc::new(crate::config::AppWrapperConfig::default()),
        crate::metrics::Metrics::new(&prometheus::Registry::new()).expect("metrics"),
        "test".into(),
        tx,
        lifeboat_runtime::readiness::Readiness::new(),
    )
}
