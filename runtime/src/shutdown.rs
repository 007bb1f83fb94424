//! Graceful shutdown of a Lifeboat binary: on Ctrl-C or SIGTERM (what the kubelet sends).

/// Resolves at the first Ctrl-C or SIGTERM. Installs the SIGTERM handler at once, so a signal
/// that arrives before the future is polled is not lost.
pub fn on_signal() -> std::io::Result<impl Future<Output = ()> + Send + Sync + 'static> {
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = sigterm.recv() => {}
        }
        tracing::info!("shutting down");
    })
}
