//! `lifeboatctl history`: the hub's event ledger, read with the ledger's own queries.
//!
//! - `history binding NAMESPACE/NAME`: the latest `--limit` events of a ResourceBinding.
//! - `history cluster NAME --since RFC3339|DURATION`: the first `--limit` events on a cluster at
//!   or after a time (`2026-11-23T10:00:00Z`) or that long ago (`90s`, `15m`, `2h`, `7d`,
//!   `1h30m`).
//!
//! Oldest first, as a table or (`-o json`) a JSON array of records.

use std::process::ExitCode;

use anyhow::Context;
use chrono::{DateTime, Utc};
use lifeboat_ledger::{DEFAULT_DATABASE_URL, Ledger, LedgerRecord};

use crate::table::one_line;

#[derive(clap::Args)]
pub struct HistoryArgs {
    #[command(subcommand)]
    subject: Subject,
    /// The ledger's database, as the hub's `--database-url`: `sqlite://PATH` or
    /// `postgres://USER:PASSWORD@HOST/DB`. Default: the SQLite file lifeboat-ledger.db in the
    /// working directory.
    #[arg(long, global = true, env = "LIFEBOAT_DATABASE_URL", default_value = DEFAULT_DATABASE_URL, hide_env_values = true)]
    database_url: String,
    /// Most events shown.
    #[arg(long, global = true, default_value_t = 500)]
    limit: u32,
    /// Output format.
    #[arg(short = 'o', long = "output", global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(clap::Subcommand)]
enum Subject {
    /// What happened to a ResourceBinding: its latest events.
    Binding {
        /// NAMESPACE/NAME of the ResourceBinding.
        binding: String,
    },
    /// What happened on a cluster since a time.
    Cluster {
        /// The Cluster's name.
        name: String,
        /// RFC 3339 time (`2026-11-23T10:00:00Z`) or a duration ago (`90s`, `15m`, `2h`, `7d`).
        #[arg(long)]
        since: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Table,
    Json,
}

pub fn run(args: HistoryArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let records = runtime.block_on(query(&args, Utc::now()))?;
    print!("{}", render(&records, args.output)?);
    Ok(ExitCode::SUCCESS)
}

/// The events `args` asks for, oldest first; `now` is what a `--since` duration counts back from.
async fn query(args: &HistoryArgs, now: DateTime<Utc>) -> anyhow::Result<Vec<LedgerRecord>> {
    // Parse before connecting: bad input is reported without touching the database.
    let lookup = match &args.subject {
        Subject::Binding { binding } => {
            let (namespace, name) = parse_binding(binding)?;
            Lookup::Binding { namespace, name }
        }
        Subject::Cluster { name, since } => {
            anyhow::ensure!(!name.is_empty(), "cluster: the name is empty");
            Lookup::Cluster {
                name,
                since: parse_since(since, now).context("--since")?,
            }
        }
    };
    anyhow::ensure!(args.limit > 0, "--limit: must be at least 1");
    let ledger = open(&args.database_url).await?;
    let records = match lookup {
        Lookup::Binding { namespace, name } => {
            ledger.history_of_binding(namespace, name, args.limit).await
        }
        Lookup::Cluster { name, since } => ledger.cluster_since(name, since, args.limit).await,
    };
    ledger.close().await;
    Ok(records?)
}

enum Lookup<'a> {
    Binding { namespace: &'a str, name: &'a str },
    Cluster { name: &'a str, since: DateTime<Utc> },
}

/// Opens the ledger. A SQLite file that does not exist is an error here (the hub creates it;
/// reading must not leave an empty one behind a typo).
async fn open(url: &str) -> anyhow::Result<Ledger> {
    if let Some(path) = sqlite_path(url)
        && !std::path::Path::new(path).exists()
    {
        anyhow::bail!(
            "--database-url: no ledger at {path} (the hub creates it on its first start)"
        );
    }
    Ok(Ledger::connect(url).await?)
}

/// The file of a `sqlite://PATH` or `sqlite:PATH` URL (`None` for other URLs and in-memory ones).
fn sqlite_path(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && !path.starts_with(":memory:")).then_some(path)
}

/// `NAMESPACE/NAME` of a ResourceBinding.
pub(crate) fn parse_binding(text: &str) -> anyhow::Result<(&str, &str)> {
    match text.split_once('/') {
        Some((namespace, name))
            if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
        {
            Ok((namespace, name))
        }
        _ => anyhow::bail!("binding: expected NAMESPACE/NAME, got {text:?}"),
    }
}

/// An RFC 3339 time, or a duration before `now` made of `<number><unit>` parts (units `s`,
/// `m`, `h`, `d`).
fn parse_since(text: &str, now: DateTime<Utc>) -> anyhow::Result<DateTime<Utc>> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    let seconds = parse_duration_seconds(text).with_context(|| {
        format!("{text:?} is neither an RFC 3339 time (2026-11-23T10:00:00Z) nor a duration (90s, 15m, 2h, 7d, 1h30m)")
    })?;
    let ago = chrono::Duration::try_seconds(seconds)
        .with_context(|| format!("{text:?} is too long ago"))?;
    now.checked_sub_signed(ago)
        .with_context(|| format!("{text:?} is too long ago"))
}

fn parse_duration_seconds(text: &str) -> anyhow::Result<i64> {
    anyhow::ensure!(!text.is_empty(), "empty");
    let mut total: i64 = 0;
    let mut number = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit: i64 = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            other => anyhow::bail!("unknown unit {other:?}"),
        };
        anyhow::ensure!(!number.is_empty(), "a unit without a number");
        let value: i64 = number.parse().context("number too large")?;
        total = value
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .context("too long")?;
        number.clear();
    }
    anyhow::ensure!(number.is_empty(), "a number without a unit");
    Ok(total)
}

fn render(records: &[LedgerRecord], output: Output) -> anyhow::Result<String> {
    match output {
        Output::Json => Ok(serde_json::to_string_pretty(records)? + "\n"),
        Output::Table => Ok(table(records)),
    }
}

const HEADERS: [&str; 8] = [
    "TIME", "KIND", "BINDING", "CLUSTER", "CHANGE", "CLASS", "REASON", "DETAILS",
];

/// One row per event, columns padded to their widest cell; `-` where a field is absent.
fn table(records: &[LedgerRecord]) -> String {
    if records.is_empty() {
        return "No events.\n".to_string();
    }
    let dash = || "-".to_string();
    let rows: Vec<[String; 8]> = records
        .iter()
        .map(|r| {
            let e = &r.event;
            let change = match (&e.from, &e.to) {
                (Some(from), Some(to)) => format!("{from} -> {to}"),
                (None, Some(to)) => to.clone(),
                (Some(from), None) => format!("{from} ->"),
                (None, None) => dash(),
            };
            let details = match e.details.as_object() {
                Some(map) if map.is_empty() => dash(),
                _ => e.details.to_string(),
            };
            [
                e.at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                e.kind.to_string(),
                e.binding
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_else(dash),
                e.cluster.clone().unwrap_or_else(dash),
                change,
                e.class.map(|c| format!("{c:?}")).unwrap_or_else(dash),
                e.reason.as_deref().map(one_line).unwrap_or_else(dash),
                details,
            ]
        })
        .collect();
    crate::table::render(&HEADERS, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use lifeboat_api::health::FailureClass;
    use lifeboat_ledger::{BindingRef, EventKind, LedgerEvent};
    use serde_json::json;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        history: HistoryArgs,
    }

    fn args(argv: &[&str]) -> HistoryArgs {
        Cli::try_parse_from(std::iter::once("history").chain(argv.iter().copied()))
            .unwrap()
            .history
    }

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    /// A ledger file of its own, removed when dropped.
    struct TempLedger(std::path::PathBuf);

    impl TempLedger {
        fn new(name: &str) -> TempLedger {
            let dir = std::env::temp_dir()
                .join(format!("lifeboatctl-history-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempLedger(dir)
        }

        fn url(&self) -> String {
            format!("sqlite://{}", self.0.join("ledger.db").display())
        }
    }

    impl Drop for TempLedger {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn events() -> Vec<LedgerEvent> {
        let train = || BindingRef::new("ml", "train-appwrapper").with_uid("uid-1");
        vec![
            LedgerEvent::new(EventKind::ClusterTransition, at("2026-11-23T10:00:00Z"))
                .with_cluster("member-2")
                .with_to("Ready")
                .with_reason("ClusterReady"),
            LedgerEvent::new(EventKind::Dispatch, at("2026-11-23T10:00:01Z"))
                .with_binding(train())
                .with_cluster("member-2")
                .with_to("Dispatched")
                .with_detail("revision", 3),
            LedgerEvent::new(EventKind::Dispatch, at("2026-11-23T10:00:01.5Z"))
                .with_binding(BindingRef::new("ml", "other"))
                .with_cluster("member-1")
                .with_to("Dispatched"),
            LedgerEvent::new(EventKind::HealthTransition, at("2026-11-23T10:00:30Z"))
                .with_binding(train())
                .with_cluster("member-2")
                .with_transition("Unknown", "Healthy"),
            LedgerEvent::new(EventKind::HealthTransition, at("2026-11-23T11:00:00Z"))
                .with_binding(train())
                .with_cluster("member-2")
                .with_transition("Healthy", "Unhealthy")
                .with_class(FailureClass::Infrastructure)
                .with_reason("node n1\nis NotReady"),
        ]
    }

    async fn ledger_with_events(name: &str) -> TempLedger {
        let dir = TempLedger::new(name);
        let ledger = Ledger::connect(&dir.url()).await.unwrap();
        ledger.append(&events()).await.unwrap();
        ledger.close().await;
        dir
    }

    #[tokio::test]
    async fn binding_history_is_a_table_oldest_first() {
        let dir = ledger_with_events("binding").await;
        let url = dir.url();
        let a = args(&["binding", "ml/train-appwrapper", "--database-url", &url]);
        let records = query(&a, Utc::now()).await.unwrap();
        assert_eq!(records.len(), 3);
        let text = render(&records, a.output).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("TIME "), "{text}");
        for header in HEADERS {
            assert!(lines[0].contains(header), "{text}");
        }
        assert!(
            lines[1].starts_with("2026-11-23T10:00:01.000000Z  Dispatch "),
            "{text}"
        );
        assert!(lines[1].contains("ml/train-appwrapper"), "{text}");
        assert!(lines[1].ends_with(r#"{"revision":3}"#), "{text}");
        assert!(lines[2].contains("Unknown -> Healthy"), "{text}");
        assert!(lines[3].contains("Healthy -> Unhealthy"), "{text}");
        assert!(lines[3].contains("Infrastructure"), "{text}");
        assert!(lines[3].contains("node n1 is NotReady"), "one line: {text}");
        // Columns line up: every row has the KIND column where the header has it.
        let kind_at = lines[0].find("KIND").unwrap();
        for line in &lines[1..] {
            assert_eq!(&line[kind_at - 2..kind_at], "  ", "{text}");
        }
        // --limit keeps the latest.
        let a = args(&[
            "binding",
            "ml/train-appwrapper",
            "--database-url",
            &url,
            "--limit",
            "1",
        ]);
        let records = query(&a, Utc::now()).await.unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].event.to.as_deref(), Some("Unhealthy"));
    }

    #[tokio::test]
    async fn cluster_history_since_a_time_or_a_duration_and_as_json() {
        let dir = ledger_with_events("cluster").await;
        let url = dir.url();
        let a = args(&[
            "cluster",
            "member-2",
            "--since",
            "2026-11-23T10:00:01Z",
            "--database-url",
            &url,
            "-o",
            "json",
        ]);
        let records = query(&a, Utc::now()).await.unwrap();
        let kinds: Vec<EventKind> = records.iter().map(|r| r.event.kind).collect();
        assert_eq!(
            kinds,
            [
                EventKind::Dispatch,
                EventKind::HealthTransition,
                EventKind::HealthTransition
            ]
        );
        let json: serde_json::Value =
            serde_json::from_str(&render(&records, a.output).unwrap()).unwrap();
        assert_eq!(json[0]["kind"], "Dispatch");
        assert_eq!(json[0]["cluster"], "member-2");
        assert_eq!(
            json[0]["binding"],
            json!({"namespace": "ml", "name": "train-appwrapper", "uid": "uid-1"})
        );
        assert_eq!(json[2]["class"], "Infrastructure");
        // 90 minutes before 11:00:00 includes everything; 30 minutes only the last event.
        let a = args(&[
            "cluster",
            "member-2",
            "--since",
            "90m",
            "--database-url",
            &url,
        ]);
        assert_eq!(
            query(&a, at("2026-11-23T11:00:00Z")).await.unwrap().len(),
            4
        );
        let a = args(&[
            "cluster",
            "member-2",
            "--since",
            "30m",
            "--database-url",
            &url,
        ]);
        let records = query(&a, at("2026-11-23T11:00:00Z")).await.unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(table(&[]), "No events.\n");
    }

    #[tokio::test]
    async fn bad_input_names_the_argument_and_touches_no_database() {
        let dir = TempLedger::new("bad");
        let url = dir.url();
        let err = |argv: &[&str]| {
            let a = args(argv);
            let now = Utc::now();
            async move { format!("{:#}", query(&a, now).await.unwrap_err()) }
        };
        let e = err(&["binding", "no-slash", "--database-url", &url]).await;
        assert!(e.contains("NAMESPACE/NAME"), "{e}");
        let e = err(&[
            "cluster",
            "m1",
            "--since",
            "yesterday",
            "--database-url",
            &url,
        ])
        .await;
        assert!(e.contains("--since") && e.contains("RFC 3339"), "{e}");
        let e = err(&["cluster", "m1", "--since", "5w", "--database-url", &url]).await;
        assert!(e.contains("unknown unit 'w'"), "{e}");
        let e = err(&["binding", "ml/x", "--database-url", &url]).await;
        assert!(e.contains("no ledger at"), "{e}");
        assert!(!dir.0.join("ledger.db").exists(), "reading created no file");
        let e = err(&["binding", "ml/x", "--database-url", "mysql://x"]).await;
        assert!(e.contains("sqlite://"), "{e}");
    }

    #[test]
    fn durations_and_times() {
        let now = at("2026-11-23T12:00:00Z");
        assert_eq!(
            parse_since("1h30m", now).unwrap(),
            at("2026-11-23T10:30:00Z")
        );
        assert_eq!(parse_since("2d", now).unwrap(), at("2026-11-21T12:00:00Z"));
        assert_eq!(parse_since("90s", now).unwrap(), at("2026-11-23T11:58:30Z"));
        assert_eq!(
            parse_since("2026-11-23T10:00:00+02:00", now).unwrap(),
            at("2026-11-23T08:00:00Z")
        );
        for bad in ["", "h", "10", "1x", "99999999999999999999s"] {
            assert!(parse_since(bad, now).is_err(), "{bad}");
        }
        assert_eq!(sqlite_path("sqlite://a/b.db?mode=ro"), Some("a/b.db"));
        assert_eq!(sqlite_path("sqlite:///abs.db"), Some("/abs.db"));
        assert_eq!(sqlite_path("sqlite::memory:"), None);
        assert_eq!(sqlite_path("postgres://u@h/db"), None);
    }
}
