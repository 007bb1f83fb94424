use std::fmt;

use super::event::EventKind;

/// Which database holds the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors of the ledger. Each has a low-cardinality metric label.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The `--database-url` is not one the ledger can use (the password, if any, is redacted).
    #[error("--database-url {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("connecting to the ledger database ({backend}): {source}")]
    Connect {
        backend: Backend,
        #[source]
        source: sqlx::Error,
    },
    #[error("migrating the ledger database ({backend}): {source}")]
    Migrate {
        backend: Backend,
        #[source]
        source: sqlx::migrate::MigrateError,
    },
    #[error("writing {events} ledger events ({backend}): {source}")]
    Write {
        backend: Backend,
        events: usize,
        #[source]
        source: sqlx::Error,
    },
    #[error("reading the ledger ({query}, {backend}): {source}")]
    Query {
        backend: Backend,
        query: &'static str,
        #[source]
        source: sqlx::Error,
    },
    /// A stored row that this version cannot read (e.g. an unknown kind written by a newer hub).
    #[error("ledger event {id}: field {field}: {reason}")]
    Corrupt {
        id: i64,
        field: &'static str,
        reason: String,
    },
    #[error(
        "the ledger writer's queue is full ({capacity} events waiting); {kind} event not recorded"
    )]
    QueueFull { capacity: usize, kind: EventKind },
    #[error("the ledger writer has shut down; event not recorded")]
    WriterClosed,
    /// Events accepted by the writer that it could not write (after its retries).
    #[error("{lost} ledger events could not be written; last error: {last_error}")]
    EventsLost { lost: u64, last_error: String },
    #[error("the ledger writer task failed: {0}")]
    WriterFailed(String),
}

impl LedgerError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            LedgerError::InvalidUrl { .. } => "invalid_url",
            LedgerError::Connect { .. } => "connect",
            LedgerError::Migrate { .. } => "migrate",
            LedgerError::Write { .. } => "write",
            LedgerError::Query { .. } => "query",
            LedgerError::Corrupt { .. } => "corrupt",
            LedgerError::QueueFull { .. } => "queue_full",
            LedgerError::WriterClosed => "writer_closed",
            LedgerError::EventsLost { .. } => "events_lost",
            LedgerError::WriterFailed(_) => "writer_failed",
        }
    }
}

/// The URL with its password (if any) replaced by `***`, for error messages and logs.
pub(crate) fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let authority_start = scheme_end + 3;
    let authority_end = url[authority_start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| authority_start + i);
    let authority = &url[authority_start..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &authority[..at];
    let Some(colon) = userinfo.find(':') else {
        return url.to_owned();
    };
    format!(
        "{}{}:***{}",
        &url[..authority_start],
        &userinfo[..colon],
        &url[authority_start + at..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("postgres://hub:s3cr:et@db.example:5432/lifeboat?sslmode=require"),
            "postgres://hub:***@db.example:5432/lifeboat?sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://hub@db/lifeboat"),
            "postgres://hub@db/lifeboat"
        );
        assert_eq!(
            redact_url("sqlite:///var/lib/lifeboat/ledger.db"),
            "sqlite:///var/lib/lifeboat/ledger.db"
        );
        assert_eq!(redact_url("ledger.db"), "ledger.db");
        // An '@' after the authority is not a password separator.
        assert_eq!(
            redact_url("postgres://db/lifeboat?application_name=a@b"),
            "postgres://db/lifeboat?application_name=a@b"
        );
    }

    #[test]
    fn metric_labels_are_distinct() {
        let errors = [
            LedgerError::InvalidUrl {
                url: String::new(),
                reason: String::new(),
            },
            LedgerError::Corrupt {
                id: 1,
                field: "kind",
                reason: String::new(),
            },
            LedgerError::QueueFull {
                capacity: 1,
                kind: EventKind::Dispatch,
            },
            LedgerError::WriterClosed,
            LedgerError::EventsLost {
                lost: 1,
                last_error: String::new(),
            },
            LedgerError::WriterFailed(String::new()),
        ];
        let labels: std::collections::HashSet<_> =
            errors.iter().map(LedgerError::metric_label).collect();
        assert_eq!(labels.len(), errors.len());
    }
}
