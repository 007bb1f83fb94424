//! The agent API's HTTPS server: TCP accept, connection limits, TLS, HTTP/1.1 (hyper), and the
//! timeouts that keep slow or silent clients from holding connections.
//!
//! - **Connection limits** ([`ConnectionTable`], pure): at most [`ConnectionLimits::max_total`]
//!   connections at once, and at most [`ConnectionLimits::max_per_ip`] from one source address.
//!   A connection beyond either is closed as soon as it is accepted, before its TLS handshake.
//! - **TLS handshake**: given up after [`ConnectionLimits::tls_handshake_timeout`]. Handshakes
//!   run in the connection's own task, so a slow one holds up nobody else.
//! - **Request header**: hyper's HTTP/1 `header_read_timeout`. Its timer starts when the server
//!   starts waiting for a request (after the handshake, and after each response on a kept-alive
//!   connection), so it bounds both a header trickled in byte by byte and a kept-alive
//!   connection left idle between requests.
//! - **Inactivity**: a connection on which no byte is read or written for
//!   [`ConnectionLimits::idle_timeout`] is closed (a request body that stops coming, a work
//!   stream nobody reads any more). hyper has no setting for that; the work stream's bookmarks
//!   keep a live stream active.
//!
//! Every refused or closed connection is counted in
//! `lifeboat_hub_agent_connections_dropped_total{reason}` ([`DropReason`]); open ones in
//! `lifeboat_hub_agent_connections`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use super::metrics::AgentApiMetrics;

/// Limits and timeouts of the agent API's connections (flags `--agent-api-*` of the hub).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once, from everyone.
    pub max_total: usize,
    /// Connections open at once from one source IP address. Agents of many clusters may share
    /// one (a NAT): each holds its work stream and one or two pooled request connections.
    pub max_per_ip: usize,
    /// A client that has not completed its TLS handshake after this long is dropped.
    pub tls_handshake_timeout: Duration,
    /// A request's header must have arrived in full this long after the server started waiting
    /// for it (also the longest a kept-alive connection may sit idle between requests).
    pub header_read_timeout: Duration,
    /// A connection on which no byte moves either way for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_total: 4096,
            max_per_ip: 1024,
            tls_handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// Why a connection was refused or closed by the server (the metric's `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Refused: its source address had [`ConnectionLimits::max_per_ip`] open.
    PerIpLimit,
    /// Refused: [`ConnectionLimits::max_total`] were open.
    TotalLimit,
    TlsHandshakeTimeout,
    TlsHandshakeFailed,
    /// No complete request header within [`ConnectionLimits::header_read_timeout`].
    HeaderTimeout,
    /// Nothing moved for [`ConnectionLimits::idle_timeout`].
    IdleTimeout,
}

impl DropReason {
    pub const ALL: [DropReason; 6] = [
        DropReason::PerIpLimit,
        DropReason::TotalLimit,
        DropReason::TlsHandshakeTimeout,
        DropReason::TlsHandshakeFailed,
        DropReason::HeaderTimeout,
        DropReason::IdleTimeout,
    ];

    pub fn label(self) -> &'static str {
        match self {
            DropReason::PerIpLimit => "per_ip_limit",
            DropReason::TotalLimit => "total_limit",
            DropReason::TlsHandshakeTimeout => "tls_handshake_timeout",
            DropReason::TlsHandshakeFailed => "tls_handshake_failed",
            DropReason::HeaderTimeout => "header_timeout",
            DropReason::IdleTimeout => "idle_timeout",
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    by_ip: HashMap<IpAddr, usize>,
}

/// The connections open now, by source address, and the limits they are held to.
#[derive(Debug)]
pub struct ConnectionTable {
    max_total: usize,
    max_per_ip: usize,
    counts: Mutex<Counts>,
}

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
pub struct Admitted {
    table: Arc<ConnectionTable>,
    ip: IpAddr,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut counts = self.table.lock();
        counts.total = counts.total.saturating_sub(1);
        if let Some(n) = counts.by_ip.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.by_ip.remove(&self.ip);
            }
        }
    }
}

impl ConnectionTable {
    pub fn new(max_total: usize, max_per_ip: usize) -> Arc<ConnectionTable> {
        Arc::new(ConnectionTable {
            max_total,
            max_per_ip,
            counts: Mutex::new(Counts::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a connection from `ip`, or why there is none.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Admitted, DropReason> {
        let mut counts = self.lock();
        if counts.total >= self.max_total {
            return Err(DropReason::TotalLimit);
        }
        let from_ip = counts.by_ip.entry(ip).or_insert(0);
        if *from_ip >= self.max_per_ip {
            return Err(DropReason::PerIpLimit);
        }
        *from_ip += 1;
        counts.total += 1;
        Ok(Admitted {
            table: self.clone(),
            ip,
        })
    }

    /// Connections open now (total, from `ip`).
    pub fn open(&self, ip: IpAddr) -> (usize, usize) {
        let counts = self.lock();
        (counts.total, counts.by_ip.get(&ip).copied().unwrap_or(0))
    }
}

/// When a byte last moved on a connection.
#[derive(Debug)]
struct Activity {
    start: Instant,
    /// Nanoseconds after `start`.
    last: AtomicU64,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            start: Instant::now(),
            last: AtomicU64::new(0),
        })
    }

    fn touch(&self) {
        let since = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last.store(since, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_nanos(self.last.load(Ordering::Relaxed))
    }

    /// Resolves once nothing has moved for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            let deadline = self.last() + timeout;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A stream that records in [`Activity`] every read or write that moved bytes.
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What every connection task needs.
#[derive(Clone)]
struct ConnectionContext {
    router: Router,
    acceptor: TlsAcceptor,
    limits: ConnectionLimits,
    metrics: AgentApiMetrics,
    stopping: watch::Receiver<bool>,
}

/// Serves `router` over TLS on `listener` until `stopping` turns true, then lets the open
/// connections finish the requests in flight (hyper's graceful shutdown) and returns once they
/// are closed.
pub async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: Router,
    limits: ConnectionLimits,
    metrics: AgentApiMetrics,
    mut stopping: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let table = ConnectionTable::new(limits.max_total, limits.max_per_ip);
    let context = ConnectionContext {
        router,
        acceptor,
        limits,
        metrics,
        stopping: stopping.clone(),
    };
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            biased;
            () = until_stopping(&mut stopping) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match table.admit(peer.ip()) {
                    Ok(admitted) => {
                        let _ = stream.set_nodelay(true);
                        connections.spawn(connection(context.clone(), stream, peer, admitted));
                    }
                    Err(reason) => {
                        // Closed at once: no handshake, no buffer, nothing held.
                        drop(stream);
                        context.metrics.connections_dropped.with_label_values(&[reason.label()]).inc();
                        tracing::debug!(%peer, reason = reason.label(), "agent API: connection refused");
                    }
                },
                Err(error) => {
                    // Out of descriptors and the like: back off rather than spin.
                    tracing::warn!(%error, "agent API: accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    drop(listener);
    // Each connection saw `stopping` too and is finishing its request in flight.
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// One connection: TLS handshake, then HTTP/1.1 until the client leaves, a timeout, or
/// shutdown.
async fn connection(
    context: ConnectionContext,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    admitted: Admitted,
) {
    let _admitted = admitted;
    let metrics = context.metrics.clone();
    metrics.connections.inc();
    let _open = scopeguard(move || metrics.connections.dec());
    let dropped = |reason: DropReason| {
        context
            .metrics
            .connections_dropped
            .with_label_values(&[reason.label()])
            .inc();
        tracing::debug!(%peer, reason = reason.label(), "agent API: connection closed");
    };
    let mut stopping = context.stopping.clone();
    let tls = tokio::select! {
        handshake = tokio::time::timeout(
            context.limits.tls_handshake_timeout,
            context.acceptor.accept(stream),
        ) => match handshake {
            Ok(Ok(tls)) => tls,
            Ok(Err(_)) => return dropped(DropReason::TlsHandshakeFailed),
            Err(_) => return dropped(DropReason::TlsHandshakeTimeout),
        },
        () = until_stopping(&mut stopping) => return,
    };
    let activity = Activity::new();
    let io = TokioIo::new(Tracked {
        inner: tls,
        activity: activity.clone(),
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(context.limits.header_read_timeout)
        .keep_alive(true);
    let served = builder.serve_connection(io, TowerToHyperService::new(context.router.clone()));
    let mut served = std::pin::pin!(served);
    let idle = activity.idle_for(context.limits.idle_timeout);
    let mut idle = std::pin::pin!(idle);
    let mut asked_to_close = false;
    loop {
        tokio::select! {
            result = served.as_mut() => {
                if let Err(error) = result {
                    if error.is_timeout() {
                        dropped(DropReason::HeaderTimeout);
                    } else {
                        tracing::debug!(%peer, %error, "agent API: connection ended with an error");
                    }
                }
                return;
            }
            // Shutdown: the request in flight finishes, then the connection closes.
            () = until_stopping(&mut stopping), if !asked_to_close => {
                served.as_mut().graceful_shutdown();
                asked_to_close = true;
            }
            () = idle.as_mut() => return dropped(DropReason::IdleTimeout),
        }
    }
}

/// Resolves once `stopping` is true (or its sender is gone).
async fn until_stopping(stopping: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped here: it must not live across an await.
    let _ = stopping.wait_for(|s| *s).await.map(|_| ());
}

/// Runs `f` when dropped.
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn each_source_gets_its_share_and_everyone_the_total() {
        let table = ConnectionTable::new(5, 2);
        let a1 = table.admit(ip("10.0.0.1")).unwrap();
        let _a2 = table.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(
            table.admit(ip("10.0.0.1")).unwrap_err(),
            DropReason::PerIpLimit
        );
        let _b1 = table.admit(ip("10.0.0.2")).unwrap();
        let _b2 = table.admit(ip("10.0.0.2")).unwrap();
        let _c1 = table.admit(ip("::1")).unwrap();
        assert_eq!(table.open(ip("10.0.0.1")), (5, 2));
        // the total is reached: a new source is refused too
        assert_eq!(
            table.admit(ip("10.0.0.3")).unwrap_err(),
            DropReason::TotalLimit
        );
        // a closed connection frees its place, for its source and in the total
        drop(a1);
        assert_eq!(table.open(ip("10.0.0.1")), (4, 1));
        let _a3 = table.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(
            table.admit(ip("10.0.0.1")).unwrap_err(),
            DropReason::TotalLimit
        );
    }

    #[test]
    fn a_source_with_nothing_open_is_forgotten() {
        let table = ConnectionTable::new(10, 10);
        drop(table.admit(ip("10.0.0.1")).unwrap());
        assert!(table.lock().by_ip.is_empty());
        assert_eq!(table.open(ip("10.0.0.1")), (0, 0));
    }

    #[test]
    fn reasons_have_distinct_labels() {
        let labels: std::collections::BTreeSet<_> =
            DropReason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), DropReason::ALL.len());
    }

    #[tokio::test(start_paused = true)]
    async fn inactivity_is_counted_from_the_last_byte() {
        let activity = Activity::new();
        let timeout = Duration::from_secs(60);
        tokio::time::advance(Duration::from_secs(50)).await;
        activity.touch();
        let started = Instant::now();
        activity.idle_for(timeout).await;
        assert_eq!(started.elapsed(), timeout, "60 s after the touch at 50 s");
    }
}
