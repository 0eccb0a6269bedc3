//! TLS: configuration, the userspace handshake, and the two record layers a
//! finished handshake can continue on: the kernel's (kTLS) or ours in user space.
//! Both take the traffic keys from rustls, which keeps the key schedule.
//!
//! A connection goes [`handshake::accept`] -> [`establish`] (the one place that
//! chooses the record layer) -> [`Session`], which the HTTP layer drives through
//! `http::Transport`, then [`Session::close`]. Each record layer keeps its body
//! writer beside it (`kernel::body`, `userspace::body`), both sized by [`sizing`].
//! This layer knows nothing of the server's configuration: it takes
//! [`config::TlsSettings`] and [`SessionSettings`] built for it.

pub mod client_auth;
pub mod config;
pub mod error;
pub mod handshake;
pub mod kernel;
pub mod pool;
pub mod session;
pub mod sizing;
pub mod sni;
pub mod tcp;
pub mod userspace;

pub use error::SessionError;
pub use session::Session;

use std::time::Duration;

use tokio::net::TcpStream;

use handshake::Established;
use kernel::KernelTls;
use sizing::{RecordPolicy, RecordSizer};
use userspace::UserspaceTls;

/// A TLS record's header: content type (1), legacy version (2), length (2).
pub const RECORD_HEADER_LEN: usize = 5;

/// How established sessions send; the server builds it from its configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSettings {
    pub record_policy: RecordPolicy,
    /// Longest wait for the peer to take more of a response.
    pub send_timeout: Duration,
}

/// This connection's keys could not be taken over from rustls (by the kernel, or by
/// the userspace record layer): the rustls state went with them, so the connection
/// cannot go on.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InstallError(#[from] kernel_tls::Error);

/// Continues a finished handshake as a [`Session`]: in the kernel when `kernel`
/// is given and can carry this connection's suite in both directions, in user
/// space otherwise (and when attaching the kernel's TLS layer to this socket
/// fails, e.g. because the client already sent FIN). This is the only place the
/// record layer is chosen.
pub fn establish(
    stream: TcpStream,
    established: Established,
    kernel: Option<&kernel::Support>,
    settings: &SessionSettings,
) -> Result<Session, InstallError> {
    let conn = established.conn;
    let info = match (
        conn.protocol_version().and_then(|v| v.as_str()),
        conn.negotiated_cipher_suite().and_then(|s| s.suite().as_str()),
    ) {
        (Some(version), Some(cipher)) => Some(crate::log::TlsInfo { version, cipher }),
        _ => None,
    };
    // Verified by the site's client verifier during the handshake.
    let client = conn.peer_certificates().and_then(|chain| chain.first()).and_then(|c| client_auth::subject_of(c));
    let server_name = established.server_name;
    let sizer = RecordSizer::new(settings.record_policy, record_expansion(&conn));
    let support = kernel.filter(|k| conn.negotiated_cipher_suite().is_some_and(|s| k.supports_both(s)));
    let prepared = support.and_then(|k| {
        KernelTls::prepare(&stream, &conn)
            .inspect_err(|e| tracing::debug!("kTLS not used for {:?}: {e}", stream.peer_addr().ok()))
            .ok()
            .map(|p| (k, p))
    });
    let tls = match prepared {
        Some((k, prepared)) => KernelTls::install(&stream, prepared, conn, k.record_cap(settings.record_policy))?,
        None => {
            return Ok(Session::userspace(stream, UserspaceTls::new(conn)?, sizer, settings.send_timeout)
                .with_info(info)
                .with_client(client, server_name.as_deref()))
        }
    };
    Ok(Session::kernel(stream, tls, sizer, settings.send_timeout)
        .with_info(info)
        .with_client(client, server_name.as_deref()))
}

use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{EncodeError, EncodeTlsData};
use rustls::CipherSuite;

use crate::vocab::TlsVersion;

/// Bytes each application-data record adds to its payload on this connection:
/// header (5) and tag (16), plus the inner content type (1) in TLS 1.3, or the
/// explicit nonce (8) of TLS 1.2 AES-GCM. Record sizing uses it to fill segments
/// exactly.
pub fn record_expansion(conn: &UnbufferedServerConnection) -> usize {
    let chacha = matches!(
        conn.negotiated_cipher_suite().map(|s| s.suite()),
        Some(
            CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
                | CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        )
    );
    let version = conn.protocol_version().and_then(TlsVersion::from_rustls).unwrap_or(TlsVersion::Tls12);
    userspace::record::expansion(version, !chacha)
}

/// Appends the handshake record rustls wants sent to `out[..*used]`, growing `out` as needed.
fn encode_into<Data>(enc: &mut EncodeTlsData<'_, Data>, out: &mut Vec<u8>, used: &mut usize) {
    loop {
        match enc.encode(&mut out[*used..]) {
            Ok(n) => {
                *used += n;
                return;
            }
            Err(EncodeError::InsufficientSize(e)) => out.resize(*used + e.required_size, 0),
            Err(EncodeError::AlreadyEncoded) => return,
        }
    }
}
