//! Why an established TLS session ended early: one enum for both record layers,
//! so the HTTP layer can tell a slow peer from a failure and the worker can count
//! and log each cause without looking inside `io::Error`s.
//!
//! Not for handshake failures (see `handshake::HandshakeError`) nor for a
//! connection that could not move into the kernel (see [`super::InstallError`]).

use std::io;

use rustls::AlertDescription;

/// What ended a session before its orderly close.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The peer sent or accepted nothing for the whole timeout (idle, slow
    /// request head, or a client that stopped reading).
    #[error("the peer made no progress within the timeout")]
    Timeout,
    /// The TCP connection ended under us: reset, broken pipe, or end of stream
    /// in the middle of a record.
    #[error("the peer closed or reset the connection")]
    PeerClosed,
    /// The peer ended the session with a fatal alert.
    #[error("the peer sent alert {0:?}")]
    PeerAlert(AlertDescription),
    /// The peer broke the TLS protocol after the handshake (a malformed control
    /// record, an oversized record, a record that failed authentication); `alert`
    /// was sent to say so.
    #[error("the peer broke the TLS protocol ({detail}); sent alert {alert:?}")]
    Protocol { alert: AlertDescription, detail: String },
    /// The kernel rejected a record (authentication failure, oversized record,
    /// malformed header): kTLS only. `sent` says whether `alert` went out: after
    /// a record fails authentication the kernel may refuse every send.
    #[error("the kernel rejected a record ({reason}); {}", AlertFate { alert: *alert, sent: *sent })]
    RecordRejected { reason: &'static str, alert: AlertDescription, sent: bool },
    /// The peer updated its TLS 1.3 keys and this kernel cannot install new keys
    /// on a live connection (Linux before 6.14): the connection is closed.
    #[error("this kernel cannot install updated TLS 1.3 keys (KeyUpdate needs Linux 6.14+ kTLS)")]
    RekeyUnsupported,
    /// TLS 1.2 has no key update: the connection is closed once the cipher's
    /// confidentiality limit is reached.
    #[error("TLS 1.2 confidentiality limit reached")]
    ConfidentialityLimit,
    /// The file became shorter while it was being sent: the response cannot be
    /// completed, and the connection is cut so the client does not take it as whole.
    #[error("the file shrank while it was being sent")]
    FileShrank,
    /// Any other socket or TLS library failure.
    #[error(transparent)]
    Io(io::Error),
}

/// Whether an alert left, as a log line says it.
struct AlertFate {
    alert: AlertDescription,
    sent: bool,
}

impl std::fmt::Display for AlertFate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.sent {
            true => write!(f, "sent alert {:?}", self.alert),
            false => write!(f, "alert {:?} could not be sent (the kernel refused the send)", self.alert),
        }
    }
}

impl SessionError {
    /// Whether the peer was too slow, as opposed to a failure.
    pub fn is_timeout(&self) -> bool {
        matches!(self, SessionError::Timeout)
    }
}

impl From<io::Error> for SessionError {
    /// Socket errors from the wait-and-retry helpers in `net`: they report an
    /// expired wait as `TimedOut`, the one place a kind is read.
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::TimedOut => SessionError::Timeout,
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::WriteZero => SessionError::PeerClosed,
            _ => SessionError::Io(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_errors_map_to_variants() {
        let table = [
            (io::ErrorKind::TimedOut, "Timeout"),
            (io::ErrorKind::ConnectionReset, "PeerClosed"),
            (io::ErrorKind::BrokenPipe, "PeerClosed"),
            (io::ErrorKind::UnexpectedEof, "PeerClosed"),
            (io::ErrorKind::PermissionDenied, "Io"),
        ];
        for (kind, want) in table {
            let got = SessionError::from(io::Error::from(kind));
            let name = format!("{got:?}");
            assert!(name.starts_with(want), "{kind:?} became {name}");
            assert_eq!(got.is_timeout(), want == "Timeout");
        }
    }

    /// The log says whether the kernel let the alert out.
    #[test]
    fn record_rejected_tells_whether_the_alert_left() {
        let e = |sent| SessionError::RecordRejected { reason: "bad MAC", alert: AlertDescription::BadRecordMac, sent };
        assert!(e(true).to_string().ends_with("sent alert BadRecordMac"), "{}", e(true));
        let unsent = e(false).to_string();
        assert!(unsent.contains("could not be sent") && !unsent.contains("sent alert"), "{unsent}");
    }
}
