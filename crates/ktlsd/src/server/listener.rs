//! Listening sockets: one per worker per address, bound with `SO_REUSEPORT` so the
//! kernel spreads new connections across workers with no shared accept queue.
//!
//! `SO_REUSEPORT` would also let a second server bind the same port and silently
//! take half the connections, so each address is first bound without it: a port
//! someone else listens on (with or without `SO_REUSEPORT`) then stops start-up.

use std::io;
use std::net::{SocketAddr, TcpListener};

use socket2::{Domain, Protocol, Socket, Type};

/// nginx's default backlog.
const BACKLOG: i32 = 511;

fn bind_one(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// Fails, with the one-line "address already in use" message, when another
/// socket listens on `addr`. Port 0 is always free.
fn probe_free(addr: SocketAddr) -> io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // SO_REUSEADDR so that connections in TIME_WAIT from an earlier run do not count.
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())
}

/// Checks, without keeping anything bound, that every address is free to listen on.
pub fn check_free(addrs: &[SocketAddr]) -> Result<(), String> {
    for &addr in addrs {
        probe_free(addr).map_err(|e| describe(addr, e))?;
    }
    Ok(())
}

/// What `ktlsd check` finds at a listen address.
#[derive(Debug, PartialEq, Eq)]
pub enum PortState {
    Free,
    /// A service manager (systemd, systemd-socket-activate) listens there for
    /// socket activation: `serve` started by it receives that very socket.
    HeldForActivation {
        pid: u32,
        command: String,
    },
    /// A running ktlsd listens there: the server a reload of this configuration
    /// would go to, which keeps its listening sockets.
    HeldByRunningServer {
        pid: u32,
    },
}

/// [`check_free`] for `ktlsd check`, which may run while the service manager
/// holds the port of a socket-activated ktlsd, or while the ktlsd to be reloaded
/// runs (`ktlsd check && systemctl reload ktlsd`): those holders are not conflicts.
/// Any other holder is an error naming it when `/proc` tells who it is.
pub fn check_port(addr: SocketAddr) -> Result<PortState, String> {
    match probe_free(addr) {
        Ok(()) => Ok(PortState::Free),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => match holder::of(addr) {
            Some((pid, command)) if command.starts_with("systemd") => Ok(PortState::HeldForActivation { pid, command }),
            Some((pid, command)) if command == "ktlsd" => Ok(PortState::HeldByRunningServer { pid }),
            Some((pid, command)) => Err(format!("{} (held by {command}, pid {pid})", describe(addr, e))),
            None => Err(describe(addr, e)),
        },
        Err(e) => Err(describe(addr, e)),
    }
}

/// Binds `workers` listeners on each address. Port 0 is resolved once, by the first
/// bind, so that every worker listens on the same port.
/// Returns, per worker, its listeners, and the addresses actually bound.
pub fn bind_all(addrs: &[SocketAddr], workers: usize) -> Result<(Vec<Vec<TcpListener>>, Vec<SocketAddr>), String> {
    let mut per_worker: Vec<Vec<TcpListener>> = (0..workers).map(|_| Vec::new()).collect();
    let mut bound = Vec::new();
    check_free(addrs)?;
    for &addr in addrs {
        let first = bind_one(addr).map_err(|e| describe(addr, e))?;
        let actual = first.local_addr().map_err(|e| describe(addr, e))?;
        if bound.contains(&actual) {
            return Err(format!("listen address {actual} is given twice"));
        }
        bound.push(actual);
        per_worker[0].push(first);
        for w in per_worker.iter_mut().skip(1) {
            w.push(bind_one(actual).map_err(|e| describe(actual, e))?);
        }
    }
    Ok((per_worker, bound))
}

fn describe(addr: SocketAddr, e: io::Error) -> String {
    match e.kind() {
        io::ErrorKind::AddrInUse => {
            format!("cannot listen on {addr}: address already in use (another server is running there?)")
        }
        io::ErrorKind::PermissionDenied => {
            format!("cannot listen on {addr}: permission denied (ports below 1024 need privileges)")
        }
        io::ErrorKind::AddrNotAvailable => format!("cannot listen on {addr}: no such local address"),
        _ => format!("cannot listen on {addr}: {e}"),
    }
}

/// Hands listening sockets bound by someone else (the service manager, by socket
/// activation) to the workers. `SO_REUSEPORT` cannot be set on them after the
/// fact, so the workers share them: each gets its own descriptor of every socket.
pub fn share(sockets: Vec<TcpListener>, workers: usize) -> Result<(Vec<Vec<TcpListener>>, Vec<SocketAddr>), String> {
    let mut per_worker: Vec<Vec<TcpListener>> = (0..workers).map(|_| Vec::new()).collect();
    let mut bound = Vec::new();
    for socket in sockets {
        let addr = socket
            .local_addr()
            .map_err(|e| format!("socket activation: cannot read a passed socket's address: {e}"))?;
        for w in per_worker.iter_mut().skip(1) {
            w.push(socket.try_clone().map_err(|e| format!("cannot duplicate the passed socket {addr}: {e}"))?);
        }
        per_worker[0].push(socket);
        bound.push(addr);
    }
    Ok((per_worker, bound))
}

/// Addresses as one line for the log, separated by spaces.
pub fn join(addrs: &[SocketAddr]) -> String {
    addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(" ")
}

/// Who listens on a TCP address, from `/proc/net/tcp{,6}` (the socket's inode) and
/// `/proc/PID/fd` (which process holds that inode). Best effort: `None` when the
/// tables cannot be read or the holder's descriptors are not ours to see.
mod holder {
    use std::net::SocketAddr;

    /// `st` of a listening socket in `/proc/net/tcp`.
    const TCP_LISTEN: &str = "0A";

    pub fn of(addr: SocketAddr) -> Option<(u32, String)> {
        let inode = listening_inode(addr)?;
        let link = format!("socket:[{inode}]");
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else { continue };
            let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
            if fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == link.as_str())) {
                let command = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
                return Some((pid, command.trim().to_string()));
            }
        }
        None
    }

    /// The inode of the socket listening on `addr` (or on the wildcard address of
    /// its family and port, which also holds it).
    fn listening_inode(addr: SocketAddr) -> Option<u64> {
        let table = if addr.is_ipv4() { "/proc/net/tcp" } else { "/proc/net/tcp6" };
        let text = std::fs::read_to_string(table).ok()?;
        text.lines().skip(1).find_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (local, state, inode) = (f.get(1)?, f.get(3)?, f.get(9)?);
            let (ip_hex, port_hex) = local.split_once(':')?;
            let port = u16::from_str_radix(port_hex, 16).ok()?;
            let wildcard = ip_hex.bytes().all(|b| b == b'0');
            let ip_matches = wildcard || ip_hex == kernel_hex(addr);
            (*state == TCP_LISTEN && port == addr.port() && ip_matches).then(|| inode.parse().ok()).flatten()
        })
    }

    /// An address as `/proc/net/tcp` prints it: each 32-bit word in host byte order, in hex.
    fn kernel_hex(addr: SocketAddr) -> String {
        let octets: Vec<u8> = match addr {
            SocketAddr::V4(a) => a.ip().octets().to_vec(),
            SocketAddr::V6(a) => a.ip().octets().to_vec(),
        };
        octets.chunks(4).map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))).collect()
    }

    #[cfg(test)]
    mod tests {
        use std::net::TcpListener;

        #[test]
        fn finds_this_process_holding_a_listener() {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind");
            let addr = l.local_addr().expect("addr");
            let (pid, _) = super::of(addr).expect("holder found");
            assert_eq!(pid, std::process::id());
            drop(l);
            assert_eq!(super::of(addr), None);
        }

        #[test]
        fn finds_an_ipv6_listener() {
            let Ok(l) = TcpListener::bind("[::1]:0") else { return };
            let addr = l.local_addr().expect("addr");
            assert_eq!(super::of(addr).map(|h| h.0), Some(std::process::id()));
        }
    }
}
