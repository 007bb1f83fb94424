//! `lifeboatctl convert`: legacy AppWrappers to workload.codeflare.dev/v1beta2.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ConvertArgs {
    /// The legacy AppWrapper YAML file (`-` for stdin).
    #[arg(short = 'f', long = "filename")]
    pub file: String,
}

pub fn run(_args: ConvertArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("convert is not built yet")
}
