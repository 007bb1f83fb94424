//! kubectl as a user runs it, for tests that check what a user sees (admission rejections, CEL
//! messages, printer columns) against the fleet's real apiservers.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::harness::TestError;

/// How long one kubectl call may take.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `kubectl --kubeconfig K [--cache-dir D] ARGS`, with `stdin` piped in when given.
/// `Ok(Ok(stdout))` when kubectl succeeded, `Ok(Err(stderr))` when it failed (a rejection is
/// an expected outcome for many tests), `Err` when kubectl could not run or hung.
pub async fn run(
    kubeconfig: &Path,
    cache_dir: Option<&Path>,
    args: &[&str],
    stdin: Option<String>,
) -> Result<Result<String, String>, TestError> {
    let mut command = tokio::process::Command::new("kubectl");
    command.arg("--kubeconfig").arg(kubeconfig);
    if let Some(dir) = cache_dir {
        command.arg("--cache-dir").arg(dir);
    }
    command
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(|e| format!("running kubectl (is it on PATH?): {e}"))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes()).await?;
    }
    let output = tokio::time::timeout(TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| format!("kubectl {args:?} did not finish in {TIMEOUT:?}"))??;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    Ok(if output.status.success() {
        Ok(stdout)
    } else {
        Err(stderr)
    })
}
