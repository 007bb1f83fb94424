//! `lifeboatctl`: the Lifeboat command line.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bindings;
mod convert;
mod history;
mod interpret;
mod join;
mod reset;
mod table;

#[derive(Parser)]
#[command(name = "lifeboatctl", version, about = "Lifeboat command line")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Convert legacy AppWrappers (mcad.ibm.com/v1beta1, workload.codeflare.dev/v1beta1) to v1beta2.
    Convert(convert::ConvertArgs),
    /// Run Lua resource interpreters offline: one operation on files, or a conformance directory.
    Interpret(interpret::InterpretArgs),
    /// The hub's event ledger: what happened to a binding, or on a cluster since a time.
    History(history::HistoryArgs),
    /// The hub's objects: `get bindings` (placement, per-cluster health, eviction tasks).
    Get(bindings::GetArgs),
    /// Confirm the purge of the old copy an eviction with purgeMode Never keeps in a cluster.
    ConfirmPurge(bindings::ConfirmPurgeArgs),
    /// Ask the hub for one in-place reset of a binding's workload (delete and recreate it in its cluster).
    Reset(reset::ResetArgs),
    /// Mint a bootstrap token for a member cluster and print the helm install that joins it.
    Join(join::JoinArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Convert(args) => convert::run(args),
        Command::Interpret(args) => interpret::run(args),
        Command::History(args) => history::run(args),
        Command::Get(args) => bindings::run_get(args),
        Command::ConfirmPurge(args) => bindings::run_confirm_purge(args),
        Command::Reset(args) => reset::run(args),
        Command::Join(args) => join::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}
