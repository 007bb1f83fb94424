//! A TCP listener that hands axum TLS connections, for every HTTPS server of Lifeboat (the hub's
//! agent API, the admission webhooks of the agent and the hub). Handshakes run concurrently
//! (one slow or silent client cannot hold up the others) and are given up after
//! [`HANDSHAKE_TIMEOUT`].

use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// A client that has not finished its handshake after this long is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

type Handshake = Pin<Box<dyn Future<Output = Option<(TlsStream<TcpStream>, SocketAddr)>> + Send>>;

pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    pending: FuturesUnordered<Handshake>,
    /// What is served, for the logs ("agent API", "webhook").
    what: &'static str,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, acceptor: TlsAcceptor, what: &'static str) -> TlsListener {
        TlsListener {
            tcp,
            acceptor,
            pending: FuturesUnordered::new(),
            what,
        }
    }

    fn handshake(&self, stream: TcpStream, peer: SocketAddr) -> Handshake {
        let accept = self.acceptor.accept(stream);
        let what = self.what;
        Box::pin(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, accept).await {
                Ok(Ok(tls)) => Some((tls, peer)),
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "{what}: TLS handshake failed");
                    None
                }
                Err(_) => {
                    tracing::debug!(%peer, "{what}: TLS handshake timed out");
                    None
                }
            }
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                // The inherent accept (a Result), not axum's Listener::accept of TcpListener.
                accepted = TcpListener::accept(&self.tcp) => match accepted {
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        let handshake = self.handshake(stream, peer);
                        self.pending.push(handshake);
                    }
                    Err(error) => {
                        // Out of descriptors and the like: back off rather than spin.
                        tracing::warn!(%error, "{}: accepting a connection failed", self.what);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                Some(done) = self.pending.next(), if !self.pending.is_empty() => {
                    if let Some(connection) = done {
                        return connection;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
