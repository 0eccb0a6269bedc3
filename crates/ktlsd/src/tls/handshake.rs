//! The TLS handshake, driven in user space with rustls' unbuffered API.
//!
//! The socket is read one TLS record at a time (header first, then exactly the
//! record's length), so the handshake never consumes bytes past the client's
//! last handshake record. Whatever the client sends right after its Finished
//! (typically the first HTTP request) stays in the kernel's receive queue, where
//! the kernel record layer, once installed, decrypts it with the right sequence number.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::ConnectionState;
use rustls::ServerConfig;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::net;

/// TLS record header: type (1), legacy version (2), length (2).
const HEADER_LEN: usize = 5;
/// Largest record a peer may send: 2^14 plaintext plus the TLS 1.2/1.3 expansion allowance.
const MAX_RECORD_LEN: usize = 16384 + 2048;

/// Why a handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("handshake timed out")]
    Timeout,
    #[error("client closed the connection during the handshake")]
    Eof,
    #[error("socket error during the handshake: {0}")]
    Io(#[from] io::Error),
    #[error("TLS error: {0}")]
    Tls(#[from] rustls::Error),
    #[error("record of {0} bytes exceeds the TLS limit")]
    RecordTooLarge(usize),
}

/// A connection whose handshake has completed, positioned at a record boundary
/// in both directions and with nothing left to send.
pub struct Established {
    pub conn: UnbufferedServerConnection,
}

/// Runs the handshake on `stream`, bounded in total by `timeout`.
pub async fn accept(
    stream: &TcpStream,
    config: Arc<ServerConfig>,
    timeout: Duration,
) -> Result<Established, HandshakeError> {
    let deadline = Instant::now() + timeout;
    let mut conn = UnbufferedServerConnection::new(config)?;
    let mut incoming = vec![0u8; HEADER_LEN + MAX_RECORD_LEN];
    let mut filled = 0usize;
    let mut outgoing: Vec<u8> = Vec::with_capacity(8192);
    let mut out_len = 0usize;

    loop {
        let status = conn.process_tls_records(&mut incoming[..filled]);
        let discard = status.discard;
        let state = match status.state {
            Ok(s) => s,
            Err(e) => {
                send_pending_alert(stream, &mut conn).await;
                return Err(e.into());
            }
        };
        // Handle the state first: it borrows `conn` and `incoming`.
        let waiting = match state {
            ConnectionState::EncodeTlsData(mut enc) => {
                super::encode_into(&mut enc, &mut outgoing, &mut out_len);
                false
            }
            ConnectionState::TransmitTlsData(tx) => {
                write_before(stream, &outgoing[..out_len], deadline).await?;
                out_len = 0;
                tx.done();
                false
            }
            // Nothing to send: either more client records are needed, or (TLS 1.3)
            // the server may already send while it waits for the client's Finished.
            ConnectionState::BlockedHandshake | ConnectionState::WriteTraffic(_) => true,
            ConnectionState::PeerClosed | ConnectionState::Closed => return Err(HandshakeError::Eof),
            // Early data is disabled and application data cannot precede the client's
            // Finished; anything else is a protocol violation.
            _ => {
                return Err(rustls::Error::General("unexpected data during the handshake".into()).into())
            }
        };
        if discard > 0 {
            incoming.copy_within(discard..filled, 0);
            filled -= discard;
        }
        if waiting {
            if !conn.is_handshaking() {
                // Reading by record means nothing past the client's Finished was consumed.
                debug_assert_eq!(filled, 0);
                return Ok(Established { conn });
            }
            read_one_record_more(stream, &mut incoming, &mut filled, deadline).await?;
        }
    }
}

/// Reads bytes of the current record only: the header, then exactly its body.
async fn read_one_record_more(
    stream: &TcpStream,
    incoming: &mut [u8],
    filled: &mut usize,
    deadline: Instant,
) -> Result<(), HandshakeError> {
    let want = if *filled < HEADER_LEN {
        HEADER_LEN
    } else {
        let len = u16::from_be_bytes([incoming[3], incoming[4]]) as usize;
        if len > MAX_RECORD_LEN {
            return Err(HandshakeError::RecordTooLarge(len));
        }
        HEADER_LEN + len
    };
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(HandshakeError::Timeout);
    }
    match net::read_some(stream, &mut incoming[*filled..want], left).await {
        Ok(0) => Err(HandshakeError::Eof),
        Ok(n) => {
            *filled += n;
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::TimedOut => Err(HandshakeError::Timeout),
        Err(e) => Err(e.into()),
    }
}

async fn write_before(stream: &TcpStream, buf: &[u8], deadline: Instant) -> Result<(), HandshakeError> {
    let left = deadline.saturating_duration_since(Instant::now());
    match net::write_all(stream, buf, left).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::TimedOut => Err(HandshakeError::Timeout),
        Err(e) => Err(e.into()),
    }
}

/// After a failed handshake rustls has queued a fatal alert; send it, best effort,
/// so the client learns why instead of seeing a bare reset.
async fn send_pending_alert(stream: &TcpStream, conn: &mut UnbufferedServerConnection) {
    let mut out = [0u8; 64];
    let mut len = 0;
    for _ in 0..4 {
        let status = conn.process_tls_records(&mut []);
        match status.state {
            Ok(ConnectionState::EncodeTlsData(mut enc)) => {
                if let Ok(n) = enc.encode(&mut out[len..]) {
                    len += n;
                }
            }
            Ok(ConnectionState::TransmitTlsData(tx)) => {
                tx.done();
                break;
            }
            _ => break,
        }
    }
    if len > 0 {
        let _ = net::write_all(stream, &out[..len], Duration::from_millis(200)).await;
    }
}
