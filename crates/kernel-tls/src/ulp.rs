//! Attaching the kernel's `tls` upper-layer protocol (ULP) to a TCP socket.
//!
//! [`enable_ulp`] is the first step of every kTLS connection: it turns a
//! connected TCP socket into one that accepts `SOL_TLS` options. Until keys
//! are installed the socket still behaves exactly like plain TCP, so a
//! failure here (or a successful attach followed by no keys) always leaves the
//! caller free to continue with user-space TLS.
//!
//! It is on the per-connection path, so it stays cheap: one `setsockopt`
//! (plus a `getsockopt` if a ULP is already attached), no file reads, no
//! waiting. Finding out *why* the ULP is missing is
//! [`diagnose`](crate::diagnose)'s job, at start-up.

use std::os::fd::{AsFd, AsRawFd, RawFd};

use crate::error::Error;
use crate::{sys, uapi};

/// Attaches the `tls` ULP to a connected TCP socket
/// (`setsockopt(SOL_TCP, TCP_ULP, "tls")`).
///
/// Idempotent: if `tls` is already attached this returns `Ok(())`. Never
/// blocks. Servers driving a whole connection use
/// [`KtlsConnection::prepare`](crate::KtlsConnection::prepare), which calls
/// this once; call it directly only with the low-level key functions
/// ([`set_tx`](crate::set_tx), [`set_rx`](crate::set_rx)).
///
/// # Errors
/// All of them leave the socket a plain TCP socket:
/// - [`Error::UlpMissing`] when the kernel has no `tls` ULP,
/// - [`Error::UlpDenied`] when a security policy refuses it,
/// - [`Error::UlpUnsupported`] when the socket or kernel lacks `TCP_ULP`,
/// - [`Error::NotConnected`] if the socket is not an established TCP socket,
/// - [`Error::UlpInUse`] if a different ULP is attached,
/// - [`Error::Io`] for anything else.
pub fn enable_ulp(fd: impl AsFd) -> Result<(), Error> {
    let raw = fd.as_fd().as_raw_fd();
    let err = match sys::setsockopt(raw, uapi::SOL_TCP, uapi::TCP_ULP, b"tls") {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    match err.raw_os_error() {
        Some(libc::EEXIST) => {
            if attached_ulp(raw).as_deref() == Some("tls") {
                Ok(())
            } else {
                Err(Error::UlpInUse)
            }
        }
        Some(libc::ENOTCONN) => Err(Error::NotConnected),
        Some(libc::ENOENT) => Err(Error::UlpMissing),
        Some(libc::EPERM) | Some(libc::EACCES) => Err(Error::UlpDenied(err)),
        Some(libc::ENOPROTOOPT) | Some(libc::EOPNOTSUPP) => Err(Error::UlpUnsupported(err)),
        _ => Err(Error::Io(err)),
    }
}

/// Name of the ULP attached to a socket (`getsockopt(SOL_TCP, TCP_ULP)`), if any.
fn attached_ulp(fd: RawFd) -> Option<String> {
    let mut name = [0u8; 16];
    let len = sys::getsockopt(fd, uapi::SOL_TCP, uapi::TCP_ULP, &mut name).ok()?;
    let name = &name[..len];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Some(String::from_utf8_lossy(&name[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unconnected_socket_is_reported() {
        // A fresh, unconnected TCP socket: on kTLS kernels ENOTCONN, on
        // kernels without kTLS ENOENT (the ULP lookup happens first).
        let sock = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        match enable_ulp(&sock) {
            Err(Error::NotConnected) | Err(Error::UlpMissing) => {}
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn connected_socket_attaches_once_or_reports_missing_ulp() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let _server = listener.accept().unwrap();
        match enable_ulp(&client) {
            // kTLS kernels: a second call finds `tls` attached and succeeds.
            Ok(()) => assert!(enable_ulp(&client).is_ok()),
            // Kernels without kTLS: the plain refusal, no diagnosis attached.
            Err(Error::UlpMissing) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}
