//! A network partition on loopback: a TCP proxy between an agent and the hub that can be cut
//! (every open connection is dropped and new ones are closed at once) and healed. TLS passes
//! through untouched, so the agent's certificate checks are the real ones.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A proxy to one address; dropped, it stops.
pub struct PartitionProxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Bumped on every cut: open connections watch it and close.
    generation: watch::Sender<u64>,
    accept: tokio::task::JoinHandle<()>,
}

impl PartitionProxy {
    /// Listens on a free loopback port and forwards every connection to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let accept = {
            let cut = cut.clone();
            let generation = generation.clone();
            tokio::spawn(async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    if cut.load(Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    let mut closed = generation.subscribe();
                    tokio::spawn(async move {
                        let Ok(mut outbound) = TcpStream::connect(target).await else {
                            return;
                        };
                        let mut inbound = inbound;
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = closed.changed() => {}
                        }
                    });
                }
            })
        };
        Ok(Self {
            addr,
            cut,
            generation,
            accept,
        })
    }

    /// Where the agent should connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The partition starts: open connections drop, new ones are refused.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// The partition ends.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for PartitionProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.generation.send_modify(|g| *g += 1);
    }
}
