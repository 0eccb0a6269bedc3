//! The UDP sockets of HTTP/3: on each worker, one per `listen` address, on the port
//! TCP was bound to, with `SO_REUSEPORT` so the kernel spreads clients across the
//! workers by address and port (the same client stays on one worker as long as its
//! address does; a packet that reaches another worker gets a stateless reset, which
//! every worker can send as they share [`super::Keys`]).
//!
//! Sockets passed by the service manager (`ListenDatagram=`) are used as they are:
//! one worker reads each (two readers of one socket would each see packets of the
//! other's connections), unless the socket has `SO_REUSEPORT` (`ReusePort=yes`),
//! when the other workers bind their own beside it.
//!
//! Not here: the TCP listeners (`server::listener`), or reading `LISTEN_FDS`
//! (`server::systemd`).

use std::io;
use std::net::{SocketAddr, UdpSocket};

use socket2::{Domain, Protocol, Socket, Type};

/// Receive and send buffer asked for: a burst of full-sized datagrams from many
/// clients must not be dropped while a worker serves others. The kernel caps it at
/// `net.core.rmem_max`/`wmem_max` (`ktlsd doctor` shows both).
pub const SOCKET_BUFFER: usize = 4 * 1024 * 1024;

fn bind_one(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    // Best effort: a smaller buffer only costs drops under bursts.
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER);
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Binds `workers` UDP sockets on each of `addrs` (the TCP addresses as bound, so
/// with their ports resolved). Fails naming the address when a port is taken.
pub fn bind_all(addrs: &[SocketAddr], workers: usize) -> Result<Vec<Vec<UdpSocket>>, String> {
    let mut per_worker: Vec<Vec<UdpSocket>> = (0..workers).map(|_| Vec::new()).collect();
    for &addr in addrs {
        // Bound once without SO_REUSEPORT first: a port another process holds is an error, not a share.
        Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
            .and_then(|s| {
                if addr.is_ipv6() {
                    s.set_only_v6(true)?;
                }
                s.bind(&addr.into())
            })
            .map_err(|e| format!("http3: cannot bind UDP {addr}: {e} (another QUIC server on this port?)"))?;
        for w in per_worker.iter_mut() {
            w.push(bind_one(addr).map_err(|e| format!("http3: cannot bind UDP {addr}: {e}"))?);
        }
    }
    Ok(per_worker)
}

/// Each worker's UDP sockets: the `passed` ones first (worker 0 reads each; the
/// others bind beside it when it has `SO_REUSEPORT`), then bound ones for every
/// HTTPS address in `addrs` that no passed socket covers (same port, and the same
/// or an unspecified IP).
pub fn with_passed(
    passed: Vec<UdpSocket>,
    addrs: &[SocketAddr],
    workers: usize,
) -> Result<Vec<Vec<UdpSocket>>, String> {
    let mut covered = Vec::new();
    let mut per_worker: Vec<Vec<UdpSocket>> = (0..workers.max(1)).map(|_| Vec::new()).collect();
    for socket in passed {
        let addr = socket.local_addr().map_err(|e| format!("http3: a passed UDP socket has no address: {e}"))?;
        let sock = socket2::SockRef::from(&socket);
        let _ = sock.set_recv_buffer_size(SOCKET_BUFFER);
        let _ = sock.set_send_buffer_size(SOCKET_BUFFER);
        let shared = sock.reuse_port().unwrap_or(false);
        let mut others = per_worker.iter_mut().skip(1);
        if shared {
            for w in others.by_ref() {
                match bind_one(addr) {
                    Ok(s) => w.push(s),
                    Err(e) => {
                        tracing::warn!(
                            "http3: cannot bind UDP {addr} beside the passed socket ({e}); one worker reads it"
                        );
                        break;
                    }
                }
            }
        }
        covered.push(addr);
        per_worker[0].push(socket);
    }
    let is_covered =
        |a: &SocketAddr| covered.iter().any(|c| c.port() == a.port() && (c.ip() == a.ip() || c.ip().is_unspecified()));
    let rest: Vec<SocketAddr> = addrs.iter().copied().filter(|a| !is_covered(a)).collect();
    for (w, bound) in per_worker.iter_mut().zip(bind_all(&rest, workers)?) {
        w.extend(bound);
    }
    Ok(per_worker)
}

/// What this machine offers HTTP/3's UDP sockets, for `ktlsd doctor`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct UdpFacts {
    /// Datagrams one send may carry with UDP GSO (1: no GSO, each datagram its own send).
    pub gso_segments: usize,
    /// Datagrams one receive may return with UDP GRO (1: no GRO).
    pub gro_segments: usize,
    /// `net.core.rmem_max` and `wmem_max`: the most a socket may ask for.
    pub rmem_max: Option<u64>,
    pub wmem_max: Option<u64>,
    /// What a socket asking for [`SOCKET_BUFFER`] gets (the kernel counts its own overhead in it).
    pub recv_buffer: Option<usize>,
    pub send_buffer: Option<usize>,
}

/// Probes a loopback UDP socket set up as the server sets up its own.
pub fn probe() -> UdpFacts {
    let sysctl = |name: &str| std::fs::read_to_string(format!("/proc/sys/net/core/{name}")).ok()?.trim().parse().ok();
    let socket = bind_one(SocketAddr::from(([127, 0, 0, 1], 0))).ok();
    let state = socket.as_ref().and_then(|s| quinn::udp::UdpSocketState::new(s.into()).ok());
    let sock_ref = socket.as_ref().map(socket2::SockRef::from);
    UdpFacts {
        gso_segments: state.as_ref().map_or(1, |s| s.max_gso_segments()),
        gro_segments: state.as_ref().map_or(1, |s| s.gro_segments()),
        rmem_max: sysctl("rmem_max"),
        wmem_max: sysctl("wmem_max"),
        recv_buffer: sock_ref.as_ref().and_then(|s| s.recv_buffer_size().ok()),
        send_buffer: sock_ref.as_ref().and_then(|s| s.send_buffer_size().ok()),
    }
}

impl UdpFacts {
    /// What to do about each gap, one line each.
    pub fn advice(&self) -> Vec<String> {
        let mut advice = Vec::new();
        if self.gso_segments <= 1 {
            advice.push(
                "UDP GSO: unavailable; HTTP/3 sends each datagram with its own system call (Linux 4.18+ has GSO)"
                    .to_string(),
            );
        }
        let want = SOCKET_BUFFER as u64;
        for (name, max) in [("rmem_max", self.rmem_max), ("wmem_max", self.wmem_max)] {
            if max.is_some_and(|m| m < want) {
                advice.push(format!(
                    "UDP buffers: net.core.{name} is {} bytes; HTTP/3 asks for {want}: `sysctl -w net.core.{name}={want}` so bursts are not dropped",
                    max.unwrap_or(0)
                ));
            }
        }
        advice
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_every_worker_on_one_port_and_refuses_a_taken_one() {
        let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        assert!(bind_all(&[addr], 2).unwrap_err().contains(&addr.to_string()));
        drop(taken);
        let sockets = bind_all(&[addr], 2).unwrap();
        assert_eq!(sockets.len(), 2);
        assert!(sockets.iter().all(|w| w[0].local_addr().unwrap() == addr));
    }

    #[test]
    fn a_passed_socket_is_read_by_one_worker_and_covers_its_address() {
        let passed = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = passed.local_addr().unwrap();
        let other = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        // The other address is free again once its probe socket is dropped.
        let sockets = with_passed(vec![passed], &[addr, other], 2).unwrap();
        let addrs: Vec<Vec<SocketAddr>> =
            sockets.iter().map(|w| w.iter().map(|s| s.local_addr().unwrap()).collect()).collect();
        assert_eq!(addrs, vec![vec![addr, other], vec![other]]);
        // With SO_REUSEPORT, the other workers bind beside it.
        let shared = bind_one(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let addr = shared.local_addr().unwrap();
        let sockets = with_passed(vec![shared], &[addr], 3).unwrap();
        assert!(sockets.iter().all(|w| w.len() == 1 && w[0].local_addr().unwrap() == addr));
    }

    #[test]
    fn advice_names_each_gap() {
        let facts = |gso, rmem| UdpFacts {
            gso_segments: gso,
            gro_segments: 1,
            rmem_max: Some(rmem),
            wmem_max: Some(1 << 30),
            recv_buffer: None,
            send_buffer: None,
        };
        assert!(facts(64, 1 << 30).advice().is_empty());
        let a = facts(1, 212_992).advice();
        assert!(a[0].contains("GSO") && a[1].contains("net.core.rmem_max=4194304"), "{a:?}");
        assert!(probe().gso_segments >= 1);
    }
}
