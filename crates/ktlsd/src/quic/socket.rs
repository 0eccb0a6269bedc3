//! The UDP sockets of HTTP/3: on each worker, one per `listen` address, on the port
//! TCP was bound to, with `SO_REUSEPORT` so the kernel spreads clients across the
//! workers by address and port (the same client stays on one worker as long as its
//! address does; a packet that reaches another worker gets a stateless reset, which
//! every worker can send as they share [`super::Keys`]).
//!
//! Not here: the TCP listeners (`server::listener`).

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
}
