//! The crate's error types: what went wrong and what to do about it.
//!
//! Functions that perform exactly one system call on a caller's socket
//! (sending, receiving) return [`std::io::Error`] so readiness-based callers
//! (e.g. tokio's `try_io`) can see `WouldBlock` unchanged. Everything that
//! involves a decision — attaching the ULP, installing keys, interpreting
//! control records — returns [`Error`], whose `Display` says what happened and
//! what the caller should do next.
//!
//! Not here: why kTLS is missing on this machine, which is a diagnosis
//! ([`Unavailable`](crate::Unavailable)) made once at start-up rather than
//! an error of one connection.

use core::fmt;
use std::io;

use rustls::{AlertDescription, ContentType, HandshakeType};

use crate::types::{Cipher, Direction, TlsVersion};

/// Errors from installing or driving kernel TLS.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The kernel has no `tls` ULP (`ENOENT`): the `tls` module is not
    /// loaded or the kernel lacks `CONFIG_TLS`. The socket is unchanged:
    /// continue in user space. [`diagnose`](crate::diagnose) tells which
    /// cause applies; call it at start-up, not per connection.
    UlpMissing,
    /// A security policy (seccomp, LSM) refused `TCP_ULP` (`EPERM`/`EACCES`).
    /// The socket is unchanged.
    UlpDenied(io::Error),
    /// The socket or kernel does not know `TCP_ULP` (`ENOPROTOOPT`/
    /// `EOPNOTSUPP`: Linux < 4.13, or not a TCP socket). The socket is unchanged.
    UlpUnsupported(io::Error),
    /// `TCP_ULP` was refused because the socket is not in the ESTABLISHED
    /// state (e.g. the peer already sent FIN). The socket is unchanged.
    NotConnected,
    /// Another upper-layer protocol (not kTLS) is already attached to the socket.
    UlpInUse,
    /// The protocol version or cipher cannot be expressed to the kernel.
    /// Restrict the rustls configuration to AES-GCM/ChaCha20-Poly1305 suites.
    UnsupportedCipher {
        /// What exactly was unsupported.
        what: &'static str,
    },
    /// The kernel refused the keys for this version/cipher (first installation).
    KernelRefused {
        /// Direction being installed.
        direction: Direction,
        /// Protocol version of the keys.
        version: TlsVersion,
        /// Cipher of the keys.
        cipher: Cipher,
        /// The `setsockopt` error.
        source: io::Error,
    },
    /// The kernel refused new keys on a socket that already has keys: it has
    /// no TLS 1.3 key-update support (before Linux 6.14), or the connection
    /// is TLS 1.2. Close the connection cleanly and count it.
    RekeyUnsupported {
        /// Direction being re-keyed.
        direction: Direction,
        /// The `setsockopt` error.
        source: io::Error,
    },
    /// The confidentiality limit of the cipher is reached and TLS 1.2 cannot
    /// update keys: close the connection (send `close_notify`).
    ConfidentialityLimit,
    /// rustls refused (secret extraction disabled, handshake incomplete,
    /// buffered data, key derivation failure, ...).
    Rustls(rustls::Error),
    /// The peer broke the protocol; send [`Error::alert`] and close.
    Protocol(ProtocolError),
    /// A system call on the socket failed (including `WouldBlock`).
    Io(io::Error),
}

impl Error {
    /// The alert to send to the peer (best effort) before closing, if any.
    pub fn alert(&self) -> Option<AlertDescription> {
        match self {
            Error::Protocol(p) => Some(p.alert()),
            _ => None,
        }
    }

    /// True if this is an I/O `WouldBlock`: retry when the socket is ready.
    pub fn is_would_block(&self) -> bool {
        matches!(self, Error::Io(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

fn errno_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => format!("{} ({e})", crate::sys::errno_name(code)),
        None => e.to_string(),
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::UlpMissing => f.write_str(
                "the kernel has no `tls` upper-layer protocol (the tls module is not loaded, \
                 or the kernel was built without CONFIG_TLS); continue this connection in \
                 user space, and run the kTLS diagnosis at start-up to learn which and how to fix it",
            ),
            Error::UlpDenied(e) => write!(
                f,
                "attaching the tls ULP was denied ({}); allow setsockopt(SOL_TCP, TCP_ULP) \
                 in the seccomp/LSM policy, and meanwhile continue in user space",
                errno_name(e)
            ),
            Error::UlpUnsupported(e) => write!(
                f,
                "this socket or kernel does not support TCP_ULP ({}); kernel TLS needs \
                 Linux 4.13+ and a TCP socket: continue in user space",
                errno_name(e)
            ),
            Error::NotConnected => f.write_str(
                "the tls ULP can only be attached to an established TCP socket \
                 (not listening, not yet connected, and not after the peer closed its side); \
                 continue this connection in user space",
            ),
            Error::UlpInUse => f.write_str(
                "another upper-layer protocol is already attached to this socket; \
                 kernel TLS cannot be used on it",
            ),
            Error::UnsupportedCipher { what } => write!(
                f,
                "unsupported for kernel TLS: {what}; restrict the TLS configuration \
                 to TLS 1.2/1.3 AES-GCM or ChaCha20-Poly1305 suites"
            ),
            Error::KernelRefused { direction, version, cipher, source } => {
                write!(f, "the kernel refused {direction} keys for {version} {cipher}: {}", errno_name(source))?;
                let hint = match source.raw_os_error() {
                    Some(libc::ENOPROTOOPT) => "; SOL_TLS options need the tls ULP: call enable_ulp first",
                    Some(libc::EINVAL) => {
                        "; this kernel does not implement this version/cipher \
                         (TLS 1.3 needs Linux 5.1+, ChaCha20-Poly1305 5.11+, RX 4.17+)"
                    }
                    Some(libc::ENOENT) => {
                        "; the kernel crypto API lacks this AEAD: load it \
                         (e.g. `modprobe gcm` or `modprobe chacha20poly1305`)"
                    }
                    Some(libc::EBUSY) => "; keys were already installed in this direction",
                    Some(libc::ENOMEM) => "; the kernel is out of memory",
                    _ => "",
                };
                f.write_str(hint)
            }
            Error::RekeyUnsupported { direction, source } => write!(
                f,
                "the kernel cannot replace {direction} keys on a live connection ({}): \
                 TLS 1.3 KeyUpdate needs Linux 6.14+ kTLS; close the connection",
                errno_name(source)
            ),
            Error::ConfidentialityLimit => f.write_str(
                "the cipher's confidentiality limit is reached and TLS 1.2 cannot \
                 update keys: close the connection",
            ),
            Error::Rustls(e) => write!(
                f,
                "rustls refused: {e}; before the hand-over the connection may continue in \
                 user space (hand over only with enable_secret_extraction set and the \
                 handshake complete), after it close the connection"
            ),
            Error::Protocol(p) => write!(f, "peer protocol violation: {p}; send the alert and close"),
            Error::Io(e) => write!(f, "socket error: {}", errno_name(e)),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::KernelRefused { source, .. }
            | Error::RekeyUnsupported { source, .. }
            | Error::UlpDenied(source)
            | Error::UlpUnsupported(source) => Some(source),
            Error::Rustls(e) => Some(e),
            Error::Protocol(p) => Some(p),
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

impl From<rustls::Error> for Error {
    fn from(e: rustls::Error) -> Self {
        Error::Rustls(e)
    }
}

impl From<ProtocolError> for Error {
    fn from(e: ProtocolError) -> Self {
        Error::Protocol(e)
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Io(e) => e,
            other => io::Error::other(other),
        }
    }
}

/// A control record from the peer that breaks the TLS protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtocolError {
    /// An alert record that is not exactly two bytes.
    MalformedAlert {
        /// Its length.
        len: usize,
    },
    /// An alert record with no alert in it (RFC 8446 §5.1: a record of type
    /// alert holds exactly one).
    EmptyAlert,
    /// A handshake record whose messages do not parse (empty record, a
    /// `KeyUpdate` of another length than 1, or a message left incomplete
    /// where it must be whole).
    MalformedHandshake,
    /// A record of another type arrived in the middle of a handshake message
    /// split over records (RFC 8446 §5.1).
    InterleavedHandshake,
    /// A handshake message a server never accepts after the handshake
    /// (e.g. `NewSessionTicket`, `Finished`).
    UnexpectedHandshake {
        /// The handshake message type.
        msg_type: HandshakeType,
    },
    /// A TLS 1.2 renegotiation attempt (`ClientHello`/`HelloRequest`); refused.
    Renegotiation,
    /// A `KeyUpdate` on a TLS 1.2 connection.
    KeyUpdateOnTls12,
    /// A `KeyUpdate` that is not the last message of its record (RFC 8446 §5.1).
    KeyUpdateNotLast,
    /// A `KeyUpdate` whose body is not one byte of 0 or 1.
    InvalidKeyUpdate,
    /// A record type that has no business arriving here (e.g.
    /// `change_cipher_spec` or heartbeat after the handshake).
    UnexpectedContentType {
        /// The record's content type.
        content_type: ContentType,
    },
}

impl ProtocolError {
    /// The alert that describes this violation to the peer.
    pub fn alert(&self) -> AlertDescription {
        match self {
            ProtocolError::MalformedAlert { .. } | ProtocolError::MalformedHandshake => AlertDescription::DecodeError,
            ProtocolError::InvalidKeyUpdate => AlertDescription::IllegalParameter,
            ProtocolError::UnexpectedHandshake { .. }
            | ProtocolError::Renegotiation
            | ProtocolError::KeyUpdateOnTls12
            | ProtocolError::KeyUpdateNotLast
            | ProtocolError::EmptyAlert
            | ProtocolError::InterleavedHandshake
            | ProtocolError::UnexpectedContentType { .. } => AlertDescription::UnexpectedMessage,
        }
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::MalformedAlert { len } => {
                write!(f, "alert record of {len} bytes (must be 2)")
            }
            ProtocolError::EmptyAlert => f.write_str("empty alert record"),
            ProtocolError::MalformedHandshake => f.write_str("malformed handshake record"),
            ProtocolError::InterleavedHandshake => {
                f.write_str("another record arrived in the middle of a handshake message split over records")
            }
            ProtocolError::UnexpectedHandshake { msg_type } => {
                write!(f, "unexpected post-handshake message {msg_type:?}")
            }
            ProtocolError::Renegotiation => f.write_str("TLS 1.2 renegotiation is not supported"),
            ProtocolError::KeyUpdateOnTls12 => f.write_str("KeyUpdate on a TLS 1.2 connection"),
            ProtocolError::KeyUpdateNotLast => f.write_str("KeyUpdate not at the end of its record"),
            ProtocolError::InvalidKeyUpdate => f.write_str("invalid KeyUpdate body"),
            ProtocolError::UnexpectedContentType { content_type } => {
                write!(f, "unexpected {content_type:?} record after the handshake")
            }
        }
    }
}

impl std::error::Error for ProtocolError {}
