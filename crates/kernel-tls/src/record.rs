//! Sending and receiving TLS records on a socket with kTLS keys installed.
//!
//! Application data goes through [`send`] and [`sendfile`]; the kernel cuts
//! it into records. Everything else — alerts, `close_notify`, `KeyUpdate` —
//! is sent as a record of an explicit type with [`send_record`] and its
//! helpers. [`recv_record`] reads decrypted data together with its record
//! type, which is how control records from the peer are noticed.
//!
//! Every function is one system call and returns [`io::Error`] unchanged
//! (`WouldBlock` included), so readiness-based callers can retry. Use
//! [`RxError::classify`] to turn a receive error into a decision.
//!
//! Nothing here keeps state: applying a peer's `KeyUpdate` or counting
//! records against the confidentiality limit is
//! [`KtlsConnection`](crate::KtlsConnection)'s job.

use core::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd};

use rustls::{AlertDescription, ContentType};

use crate::message::{key_update_message, Alert};
use crate::sys;

/// Sends application data (`send(2)` with `MSG_NOSIGNAL`).
///
/// With `more = true` (`MSG_MORE`) the kernel holds the data in an open
/// record until a later call without it (or until 16 KiB accumulate), so
/// small writes such as headers and a body can share one record. Returns the
/// number of bytes accepted, which may be less than `data.len()`.
pub fn send(fd: impl AsFd, data: &[u8], more: bool) -> io::Result<usize> {
    let mut flags = libc::MSG_NOSIGNAL;
    if more {
        flags |= libc::MSG_MORE;
    }
    sys::send(fd.as_fd().as_raw_fd(), data, flags)
}

/// Sends `data` as one record of the given content type (`sendmsg(2)` with a
/// `SOL_TLS`/`TLS_SET_RECORD_TYPE` control message, `MSG_NOSIGNAL`).
///
/// `data` is plaintext; the kernel encrypts it with the current TX key.
/// Keep control records small (≤ 16 KiB) so they are never split.
pub fn send_record(fd: impl AsFd, content_type: ContentType, data: &[u8]) -> io::Result<usize> {
    sys::sendmsg_record(fd.as_fd().as_raw_fd(), u8::from(content_type), data, libc::MSG_NOSIGNAL)
}

/// Sends a small control record completely, or fails.
fn send_whole(fd: impl AsFd, content_type: ContentType, data: &[u8]) -> io::Result<()> {
    let n = send_record(fd, content_type, data)?;
    if n == data.len() {
        Ok(())
    } else {
        // The kernel reserves room for the whole record before copying, so
        // a few-byte record is accepted whole or not at all; be defensive.
        Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("kernel accepted {n} of {} bytes of a control record", data.len()),
        ))
    }
}

/// Sends an alert record.
pub fn send_alert_record(fd: impl AsFd, alert: Alert) -> io::Result<()> {
    send_whole(fd, ContentType::Alert, &alert.encode())
}

/// Sends `close_notify` (alert level 1, description 0): the orderly end of
/// our data. Shut down the write side (or close) afterwards.
pub fn send_close_notify(fd: impl AsFd) -> io::Result<()> {
    send_alert_record(fd, Alert::close_notify())
}

/// Sends a fatal alert with the given description (close afterwards).
pub fn send_alert(fd: impl AsFd, description: AlertDescription) -> io::Result<()> {
    send_alert_record(fd, Alert::fatal(description))
}

/// Sends a TLS 1.3 `KeyUpdate` handshake message under the current TX key.
///
/// Install the new TX key with [`update_tx`](crate::update_tx) right after
/// this returns `Ok`; with `update_requested` the peer will answer with its
/// own `KeyUpdate`, to be handled like any other.
pub fn send_key_update(fd: impl AsFd, update_requested: bool) -> io::Result<()> {
    send_whole(fd, ContentType::Handshake, &key_update_message(update_requested))
}

/// Sends up to `count` bytes of `in_fd` starting at `*offset`, encrypted by
/// the kernel (`sendfile(2)`); advances `*offset` by the bytes sent.
///
/// Returns 0 at end of file. A short count is normal on non-blocking sockets.
pub fn sendfile(out_fd: impl AsFd, in_fd: impl AsFd, offset: &mut u64, count: usize) -> io::Result<usize> {
    let mut off = libc::off_t::try_from(*offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file offset too large"))?;
    let n = sys::sendfile(out_fd.as_fd().as_raw_fd(), in_fd.as_fd().as_raw_fd(), &mut off, count)?;
    // The kernel only moves the offset forward from a non-negative start.
    *offset = u64::try_from(off).unwrap_or(*offset);
    Ok(n)
}

/// One successful [`recv_record`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// The record's content type: application data, alert or handshake
    /// (anything else is the peer's doing; see
    /// [`KtlsConnection::handle_control`](crate::KtlsConnection::handle_control)).
    pub content_type: ContentType,
    /// Bytes written to the buffer.
    pub len: usize,
}

impl Received {
    /// Application data (the common case).
    pub fn is_application_data(&self) -> bool {
        self.content_type == ContentType::ApplicationData
    }

    /// End of stream: the peer closed TCP without (further) records.
    pub fn is_eof(&self) -> bool {
        self.is_application_data() && self.len == 0
    }
}

/// Reads decrypted data and its record type (`recvmsg(2)` with a control
/// buffer for `TLS_GET_RECORD_TYPE`).
///
/// Application data from consecutive records may be merged into one read;
/// a record of another type ends the read, and control records (alerts,
/// handshake) are returned one per call. Give a buffer of at least 16 KiB
/// (a full record) so a control record always arrives whole.
///
/// `Ok` with `len == 0` and application data means end of stream. Errors
/// are returned raw; see [`RxError::classify`].
pub fn recv_record(fd: impl AsFd, buf: &mut [u8]) -> io::Result<Received> {
    let msg = sys::recvmsg_record(fd.as_fd().as_raw_fd(), buf, 0)?;
    // No control message: plain data (the kernel reports a type for every
    // record it decrypts; a 0-byte read at EOF has none).
    let content_type = msg.record_type.map_or(ContentType::ApplicationData, ContentType::from);
    Ok(Received { content_type, len: msg.len })
}

/// What a receive error means for the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RxError {
    /// `EAGAIN`: nothing to read yet; wait for readability.
    WouldBlock,
    /// `EINTR`: retry.
    Interrupted,
    /// `EBADMSG`: a record failed authentication (wrong key, tampering,
    /// or records encrypted under a key the kernel was not given).
    DecryptFailed,
    /// `EMSGSIZE`: a record longer than TLS allows.
    RecordOverflow,
    /// `EINVAL`: a record with a wrong version or otherwise malformed header.
    BadRecord,
    /// `EKEYEXPIRED`: the peer sent `KeyUpdate` and the new RX key has not
    /// been installed yet (handle the `KeyUpdate` record, then read again).
    KeyExpired,
    /// `EIO`: a control record arrived but its type could not be delivered.
    ControlTruncated,
    /// The TCP connection failed (`ECONNRESET`, `EPIPE`, `ETIMEDOUT`, ...).
    ConnectionLost,
    /// Anything else.
    Other,
}

impl RxError {
    /// Classifies an error returned by [`recv_record`].
    pub fn classify(err: &io::Error) -> RxError {
        if err.kind() == io::ErrorKind::WouldBlock {
            return RxError::WouldBlock;
        }
        match err.raw_os_error() {
            Some(libc::EINTR) => RxError::Interrupted,
            Some(libc::EBADMSG) => RxError::DecryptFailed,
            Some(libc::EMSGSIZE) => RxError::RecordOverflow,
            Some(libc::EINVAL) => RxError::BadRecord,
            Some(code) if code == libc::EKEYEXPIRED => RxError::KeyExpired,
            Some(libc::EIO) => RxError::ControlTruncated,
            Some(libc::ECONNRESET)
            | Some(libc::EPIPE)
            | Some(libc::ETIMEDOUT)
            | Some(libc::ECONNABORTED)
            | Some(libc::EHOSTUNREACH)
            | Some(libc::ENETUNREACH) => RxError::ConnectionLost,
            _ => RxError::Other,
        }
    }

    /// Whether the connection is finished (anything but `WouldBlock`,
    /// `Interrupted` and `KeyExpired`).
    pub fn is_fatal(&self) -> bool {
        !matches!(self, RxError::WouldBlock | RxError::Interrupted | RxError::KeyExpired)
    }

    /// The alert to send (best effort) before closing, if one applies.
    pub fn alert(&self) -> Option<AlertDescription> {
        match self {
            RxError::DecryptFailed => Some(AlertDescription::BadRecordMac),
            RxError::RecordOverflow => Some(AlertDescription::RecordOverflow),
            RxError::BadRecord => Some(AlertDescription::DecodeError),
            RxError::ControlTruncated => Some(AlertDescription::InternalError),
            _ => None,
        }
    }

    /// A short stable name, for counters and logs (`"decrypt_failed"`).
    pub fn name(&self) -> &'static str {
        match self {
            RxError::WouldBlock => "would_block",
            RxError::Interrupted => "interrupted",
            RxError::DecryptFailed => "decrypt_failed",
            RxError::RecordOverflow => "record_overflow",
            RxError::BadRecord => "bad_record",
            RxError::KeyExpired => "key_expired",
            RxError::ControlTruncated => "control_truncated",
            RxError::ConnectionLost => "connection_lost",
            RxError::Other => "other",
        }
    }
}

impl fmt::Display for RxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RxError::WouldBlock => "no data yet",
            RxError::Interrupted => "interrupted",
            RxError::DecryptFailed => "a record failed decryption/authentication",
            RxError::RecordOverflow => "a record exceeded the maximum TLS record size",
            RxError::BadRecord => "a malformed record (bad version or header)",
            RxError::KeyExpired => "the peer updated its key; install the new RX key",
            RxError::ControlTruncated => "a control record could not be delivered",
            RxError::ConnectionLost => "the TCP connection failed",
            RxError::Other => "unexpected receive error",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    #[test]
    fn classify_errors() {
        let e = |c| io::Error::from_raw_os_error(c);
        assert_eq!(RxError::classify(&e(libc::EAGAIN)), RxError::WouldBlock);
        assert_eq!(RxError::classify(&e(libc::EBADMSG)), RxError::DecryptFailed);
        assert_eq!(RxError::classify(&e(libc::EMSGSIZE)), RxError::RecordOverflow);
        assert_eq!(RxError::classify(&e(libc::EINVAL)), RxError::BadRecord);
        assert_eq!(RxError::classify(&e(libc::EKEYEXPIRED)), RxError::KeyExpired);
        assert_eq!(RxError::classify(&e(libc::ECONNRESET)), RxError::ConnectionLost);
        assert_eq!(RxError::classify(&e(libc::EIO)), RxError::ControlTruncated);
        assert!(RxError::DecryptFailed.is_fatal());
        assert!(!RxError::WouldBlock.is_fatal());
        assert_eq!(RxError::DecryptFailed.alert(), Some(AlertDescription::BadRecordMac));
        assert_eq!(RxError::RecordOverflow.alert(), Some(AlertDescription::RecordOverflow));
    }

    #[test]
    fn plain_tcp_roundtrip_without_keys() {
        // Without kTLS keys these calls are ordinary TCP: data comes back as
        // "application data", control records' payload arrives as bytes.
        let (c, mut s) = pair();
        assert_eq!(send(&c, b"hello", true).unwrap(), 5);
        assert_eq!(send(&c, b" world", false).unwrap(), 6);
        let mut buf = [0u8; 64];
        let mut got = Vec::new();
        while got.len() < 11 {
            let r = recv_record(&s, &mut buf).unwrap();
            assert!(r.is_application_data());
            got.extend_from_slice(&buf[..r.len]);
        }
        assert_eq!(got, b"hello world");

        send_close_notify(&c).unwrap();
        let mut two = [0u8; 2];
        s.read_exact(&mut two).unwrap();
        assert_eq!(two, [1, 0]);
        send_key_update(&c, true).unwrap();
        let mut five = [0u8; 5];
        s.read_exact(&mut five).unwrap();
        assert_eq!(five, [24, 0, 0, 1, 1]);

        s.write_all(b"x").unwrap();
        drop(s);
        let mut c2 = &c;
        let mut one = [0u8; 1];
        c2.read_exact(&mut one).unwrap();
        let r = recv_record(&c, &mut buf).unwrap();
        assert!(r.is_eof());
    }

    #[test]
    fn sendfile_plain() {
        let (c, mut s) = pair();
        let path = std::env::temp_dir().join(format!("kernel-tls-sendfile-{}", std::process::id()));
        std::fs::write(&path, b"0123456789").unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let mut off = 3u64;
        let n = sendfile(&c, &f, &mut off, 4).unwrap();
        assert_eq!((n, off), (4, 7));
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"3456");
        let _ = std::fs::remove_file(&path);
    }
}
