//! `lifeboatctl interpret`: run Lua resource interpreters offline.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct InterpretArgs {}

pub fn run(_args: InterpretArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("interpret is not built yet")
}
