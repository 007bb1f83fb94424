//! Loopback ports: the one way the fleet and the e2e tests pick a free port, and the proof that a
//! given process listens on one.
//!
//! A port found free can be taken before the component that was given it binds it. Two things
//! keep that from breaking a run: ports are picked below the kernel's ephemeral range, which the
//! kernel hands out as the source port of every outgoing connection (the usual thief on a busy
//! machine), and the fleet restarts a component that could not bind with new ports
//! (`fleet::start`), checking with [`is_listening`] that the port is really the component's.

use std::hash::{BuildHasher, RandomState};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// The lowest port picked (below it live well-known and registered services).
pub const LOWEST_PORT: u16 = 10_000;

/// The kernel's default ephemeral range starts here when it cannot be read.
const DEFAULT_EPHEMERAL_START: u16 = 32_768;

/// Random tries below the ephemeral range before falling back to the kernel's choice.
const TRIES: usize = 100;

/// A free TCP port on 127.0.0.1, chosen at random below the kernel's ephemeral range (the
/// kernel's own choice when that range starts too low to leave room).
pub fn free_port() -> Result<u16> {
    let end = ephemeral_start().unwrap_or(DEFAULT_EPHEMERAL_START);
    if end > LOWEST_PORT {
        let span = u64::from(end - LOWEST_PORT);
        for _ in 0..TRIES {
            let offset = u16::try_from(random() % span).unwrap_or(0);
            let port = LOWEST_PORT + offset;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0").map_err(Error::Port)?;
    Ok(listener.local_addr().map_err(Error::Port)?.port())
}

/// `n` distinct free ports.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let mut ports: Vec<u16> = Vec::with_capacity(n);
    while ports.len() < n {
        let port = free_port()?;
        if !ports.contains(&port) {
            ports.push(port);
        }
    }
    Ok(ports)
}

/// First port of the kernel's ephemeral range (`net.ipv4.ip_local_port_range`).
fn ephemeral_start() -> Option<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

/// A random number from std's per-instance random hasher keys (no extra dependency needed for
/// picking ports).
fn random() -> u64 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    RandomState::new().hash_one(CALLS.fetch_add(1, Ordering::Relaxed))
}

/// True when process `pid` holds a socket listening on TCP `port` (IPv4 or IPv6). Reads
/// `/proc/net/tcp{,6}` for the listening socket's inode and `/proc/<pid>/fd` for that inode, so
/// another process listening on the same port does not count.
pub fn is_listening(pid: i32, port: u16) -> bool {
    let inodes: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| listening_inodes(&table, port))
        .collect();
    if inodes.is_empty() || pid <= 0 {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(|fd| fd.ok())
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|target| {
            let target = target.to_string_lossy();
            inodes
                .iter()
                .any(|inode| target == format!("socket:[{inode}]"))
        })
}

/// Inodes of the sockets listening on `port` in a `/proc/net/tcp` table. A line reads
/// `sl local_address rem_address st ... inode`, addresses as `HEXIP:HEXPORT`, state 0A = LISTEN.
fn listening_inodes(table: &str, port: u16) -> Vec<String> {
    const LISTEN: &str = "0A";
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields.get(1)?.rsplit_once(':')?.1;
            let listening = fields.get(3) == Some(&LISTEN);
            (listening && u16::from_str_radix(local_port, 16).ok()? == port)
                .then(|| fields.get(9).map(|inode| inode.to_string()))
                .flatten()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_and_below_the_ephemeral_range() {
        let end = ephemeral_start().unwrap_or(DEFAULT_EPHEMERAL_START);
        let ports = free_ports(20).unwrap();
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 20);
        if end > LOWEST_PORT {
            for port in ports {
                assert!((LOWEST_PORT..end).contains(&port), "{port}");
            }
        }
    }

    #[test]
    fn a_listener_is_found_for_its_own_process_only() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = i32::try_from(std::process::id()).unwrap();
        assert!(is_listening(me, port));
        // Another process (init) does not hold it; a port nobody listens on is not listened on.
        assert!(!is_listening(1, port));
        drop(listener);
        assert!(!is_listening(me, port));
    }

    #[test]
    fn proc_net_tcp_lines_are_parsed() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1 0000000000000000 100 0 0 10 0";
        // 0x1F90 = 8080: the listener, not the established connection on the same port.
        assert_eq!(listening_inodes(table, 8080), vec!["4242"]);
        assert_eq!(listening_inodes(table, 8081), vec!["4444"]);
        assert!(listening_inodes(table, 9000).is_empty());
    }
}
