//! TLS: configuration, the userspace handshake, and the two record layers a
//! finished handshake can continue on: the kernel's (kTLS) or rustls' in user space.

pub mod config;
pub mod handshake;
pub mod kernel;
pub mod session;
pub mod sizing;
pub mod tcp;
pub mod userspace;

pub use session::Session;

use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{EncodeError, EncodeTlsData};
use rustls::{CipherSuite, ProtocolVersion};

/// Bytes each application-data record adds to its payload on this connection:
/// header (5) and tag (16), plus the inner content type (1) in TLS 1.3, or the
/// explicit nonce (8) of TLS 1.2 AES-GCM. Record sizing uses it to fill segments
/// exactly.
pub fn record_expansion(conn: &UnbufferedServerConnection) -> usize {
    let chacha = matches!(
        conn.negotiated_cipher_suite().map(|s| s.suite()),
        Some(CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 | CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256)
    );
    match conn.protocol_version() {
        Some(ProtocolVersion::TLSv1_3) => 5 + 16 + 1,
        _ if chacha => 5 + 16,
        _ => 5 + 8 + 16,
    }
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

/// The file changed size under us: the response cannot be completed, and
/// the connection must be cut so the client does not mistake it for whole.
pub fn truncated() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "file shrank while it was being sent")
}
