//! A Kubernetes API call that failed, with what the caller was doing: the one type behind every
//! component's "kubernetes API ({context})" error variant.
//!
//! [`KubeError`] displays as the `kube::Error` it holds and takes that error's place in an error
//! chain (its [`source`](std::error::Error::source) is the `kube::Error`'s source), so a variant
//! `#[error("kubernetes API ({context}): {0}", context = .0.context())] Kube(#[source] KubeError)` reads and
//! chains exactly as one holding the `kube::Error` itself. The variant's `#[error]` says where
//! the context goes; [`KubeError::metric_label`] is the low-cardinality `error` label of every
//! metric that counts failures by kind.

use std::borrow::Cow;
use std::fmt;

/// A failed Kubernetes API call and what it was for (see the module).
#[derive(Debug)]
pub struct KubeError {
    context: Cow<'static, str>,
    source: Box<kube::Error>,
}

impl KubeError {
    /// The `error` label of failures that are Kubernetes API errors.
    pub const METRIC_LABEL: &'static str = "kube";

    pub fn new(context: impl Into<Cow<'static, str>>, source: kube::Error) -> Self {
        Self {
            context: context.into(),
            source: Box::new(source),
        }
    }

    /// What the call was for ("writing the binding's spec").
    pub fn context(&self) -> &str {
        &self.context
    }

    /// The error the client returned.
    pub fn kube(&self) -> &kube::Error {
        &self.source
    }

    pub fn into_kube(self) -> kube::Error {
        *self.source
    }

    /// The API server's answer, when it answered with a Status.
    pub fn status(&self) -> Option<&kube::core::Status> {
        match self.source.as_ref() {
            kube::Error::Api(status) => Some(status),
            _ => None,
        }
    }

    /// The API server's HTTP status code, when it answered with a Status.
    pub fn code(&self) -> Option<u16> {
        self.status().map(|s| s.code)
    }

    /// `409 Conflict`: the object changed since it was read (or already exists).
    pub fn is_conflict(&self) -> bool {
        self.code() == Some(409)
    }

    /// The low-cardinality metric label of this failure: [`KubeError::METRIC_LABEL`].
    pub fn metric_label(&self) -> &'static str {
        Self::METRIC_LABEL
    }
}

impl fmt::Display for KubeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

impl std::error::Error for KubeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.source()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;
    use std::error::Error as _;

    fn conflict() -> kube::Error {
        kube::Error::Api(
            Status::failure("the object has been modified", "Conflict")
                .with_code(409)
                .boxed(),
        )
    }

    #[derive(Debug, thiserror::Error)]
    enum Wrapped {
        #[error("kubernetes API ({context}): {0}", context = .0.context())]
        Kube(#[source] KubeError),
    }

    #[derive(Debug, thiserror::Error)]
    enum Bare {
        #[error("kubernetes API ({context}): {source}")]
        Kube {
            context: &'static str,
            #[source]
            source: kube::Error,
        },
    }

    fn chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
        let mut out = vec![e.to_string()];
        let mut source = e.source();
        while let Some(s) = source {
            out.push(s.to_string());
            source = s.source();
        }
        out
    }

    #[test]
    fn a_variant_holding_it_reads_and_chains_as_one_holding_the_kube_error() {
        let refused =
            || kube::Error::Service(Box::new(std::io::Error::other("connection refused")));
        for make in [conflict as fn() -> kube::Error, refused] {
            let bare = Bare::Kube {
                context: "writing the spec",
                source: make(),
            };
            let wrapped = Wrapped::Kube(KubeError::new("writing the spec", make()));
            assert_eq!(chain(&wrapped), chain(&bare));
        }
        let wrapped = Wrapped::Kube(KubeError::new("writing the spec", refused()));
        assert_eq!(
            chain(&wrapped),
            [
                "kubernetes API (writing the spec): ServiceError: connection refused",
                "ServiceError: connection refused",
                "connection refused"
            ]
        );
    }

    #[test]
    fn it_says_the_answer_and_the_label() {
        let e = KubeError::new(String::from("reading it"), conflict());
        assert_eq!(e.context(), "reading it");
        assert_eq!(e.code(), Some(409));
        assert!(e.is_conflict());
        assert_eq!(e.metric_label(), "kube");
        let refused = KubeError::new(
            "reading it",
            kube::Error::Service(Box::new(std::io::Error::other("connection refused"))),
        );
        assert_eq!(refused.code(), None);
        assert!(!refused.is_conflict());
        assert!(refused.source().is_some());
        assert!(matches!(refused.into_kube(), kube::Error::Service(_)));
    }
}
