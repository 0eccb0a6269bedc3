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
        io::ErrorKind::AddrInUse => format!("cannot listen on {addr}: address already in use (another server is running there?)"),
        io::ErrorKind::PermissionDenied => format!("cannot listen on {addr}: permission denied (ports below 1024 need privileges)"),
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
        let addr = socket.local_addr().map_err(|e| format!("socket activation: cannot read a passed socket's address: {e}"))?;
        for w in per_worker.iter_mut().skip(1) {
            w.push(socket.try_clone().map_err(|e| format!("cannot duplicate the passed socket {addr}: {e}"))?);
        }
        per_worker[0].push(socket);
        bound.push(addr);
    }
    Ok((per_worker, bound))
}
