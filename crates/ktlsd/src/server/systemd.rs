//! The two pieces of the systemd protocols ktlsd speaks: listening sockets
//! passed by socket activation (`LISTEN_FDS`/`LISTEN_PID`, sd_listen_fds(3), and
//! their names, `LISTEN_FDNAMES`: `http` marks the plain-HTTP one; UDP sockets
//! are HTTP/3's),
//! and state notifications to `NOTIFY_SOCKET` (sd_notify(3): `READY=1`,
//! `RELOADING=1`, `STOPPING=1`) for `Type=notify` services.

use std::net::{TcpListener, UdpSocket};
use std::os::fd::RawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};

use socket2::{Domain, Type};

use crate::sys;

/// The first passed descriptor (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: RawFd = 3;

static TAKEN: AtomicBool = AtomicBool::new(false);

/// The name (`FileDescriptorName=` of the socket unit, `LISTEN_FDNAMES`) that
/// marks a passed socket as the plain-HTTP (port 80) listener; any other name is HTTPS.
pub const HTTP_FD_NAME: &str = "http";

/// The sockets the service manager passed.
#[derive(Default)]
pub struct Passed {
    /// Listening TCP sockets (`ListenStream=`), each with its name from
    /// `LISTEN_FDNAMES` (empty when none was given).
    pub tcp: Vec<(TcpListener, String)>,
    /// Bound UDP sockets (`ListenDatagram=`), for HTTP/3.
    pub udp: Vec<UdpSocket>,
}

/// The sockets passed by the service manager, when `LISTEN_PID` names this
/// process; `Ok(None)` when none were passed. Each must be a listening TCP socket
/// or a bound UDP one. Takes ownership of the descriptors, so it acts once per process.
pub fn listen_fds() -> Result<Option<Passed>, String> {
    let pid = std::env::var("LISTEN_PID").ok();
    if pid.and_then(|p| p.trim().parse::<u32>().ok()) != Some(std::process::id()) {
        return Ok(None);
    }
    let Some(count) = std::env::var("LISTEN_FDS").ok() else { return Ok(None) };
    let n: RawFd = count
        .trim()
        .parse()
        .ok()
        .filter(|n| (1..=1024).contains(n))
        .ok_or_else(|| format!("LISTEN_FDS={count:?} is not a number of sockets from 1 to 1024"))?;
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Ok(None);
    }
    let names: Vec<String> =
        std::env::var("LISTEN_FDNAMES").map(|v| v.split(':').map(str::to_string).collect()).unwrap_or_default();
    let mut out = Passed::default();
    for fd in LISTEN_FDS_START..LISTEN_FDS_START + n {
        let name = names.get((fd - LISTEN_FDS_START) as usize).cloned().unwrap_or_default();
        let Some(socket) = sys::take_passed_socket(fd) else {
            return Err(format!("socket activation: descriptor {fd} (of LISTEN_FDS={n}) is not open"));
        };
        let bad = |what: &str| {
            format!("socket activation: descriptor {fd} is {what}; ktlsd needs listening TCP sockets (ListenStream= with an IP address and port) or UDP ones for HTTP/3 (ListenDatagram=)")
        };
        let ip = matches!(socket.domain(), Ok(d) if d == Domain::IPV4 || d == Domain::IPV6);
        let datagram = match (ip, socket.r#type(), socket.is_listener()) {
            (true, Ok(t), _) if t == Type::DGRAM => true,
            (true, Ok(t), Ok(true)) if t == Type::STREAM => false,
            (_, Ok(t), Ok(false)) if t == Type::STREAM => return Err(bad("not listening")),
            _ => return Err(bad("neither an IP TCP nor an IP UDP socket")),
        };
        // Non-blocking for the event loops; close-on-exec as every other descriptor here.
        socket.set_nonblocking(true).map_err(|e| format!("socket activation: descriptor {fd}: {e}"))?;
        socket.set_cloexec(true).map_err(|e| format!("socket activation: descriptor {fd}: {e}"))?;
        match datagram {
            true => out.udp.push(socket.into()),
            false => out.tcp.push((socket.into(), name)),
        }
    }
    Ok(Some(out))
}

/// Sends `state` to the service manager when `NOTIFY_SOCKET` is set; a failure
/// is logged and otherwise ignored (the manager's timeout then says the rest).
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let result = (|| -> std::io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let sock = UnixDatagram::unbound()?;
        let bytes = path.as_bytes();
        if let Some(name) = bytes.strip_prefix(b"@") {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
        } else {
            sock.send_to(state.as_bytes(), &path)?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        tracing::warn!("cannot notify the service manager ({}) of {state:?}: {e}", path.to_string_lossy());
    }
}

/// `RELOADING=1` with the `MONOTONIC_USEC=` stamp that `Type=notify-reload` requires.
pub fn reloading_message() -> String {
    let usec = sys::monotonic_usec();
    format!("RELOADING=1\nMONOTONIC_USEC={usec}")
}

/// What a failed reload tells the service manager: the server is ready again (it
/// still serves the previous configuration), and its status line says that the
/// reload failed and why, with `RELOAD_FAILED=1` for tools that look for it.
pub fn reload_failed_message(why: &str) -> String {
    let why: String = why.chars().map(|c| if c == '\n' { ' ' } else { c }).collect();
    format!("READY=1\nRELOAD_FAILED=1\nSTATUS=reload failed, still serving the previous configuration: {why}")
}
