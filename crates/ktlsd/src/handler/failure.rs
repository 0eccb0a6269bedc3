//! Why a forward failed ([`Failure`]): the status the client gets, the kind that
//! names it in metrics, logs and `Cache-Status`, the upstream and what happened.
//! Plain values, shared by the reverse proxy that makes them and the codecs' handles
//! that carry them.

use super::Status;

/// Why an exchange failed, for the client's status and the log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// 502, or 504 when the upstream was too slow.
    pub status: Status,
    pub kind: FailureKind,
    /// The upstream's URL.
    pub upstream: String,
    pub detail: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "upstream {}: {}", self.upstream, self.detail)
    }
}

/// What failed in an exchange; its label names it in metrics, logs and `Cache-Status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// No connection could be opened.
    Connect,
    /// The upstream was too slow (504).
    Timeout,
    /// The request could not be written.
    Send,
    /// The upstream closed before a complete response head.
    Closed,
    /// The response head is not valid HTTP/1.1.
    Invalid,
    /// The response body failed after the head.
    Body,
    /// The client's request body failed (malformed, too large, stalled).
    RequestBody,
    /// This host ran short of a resource (descriptors, memory) opening a connection:
    /// 503, and the upstream is not marked down.
    Local,
}

impl FailureKind {
    pub fn label(self) -> &'static str {
        match self {
            FailureKind::Connect => "connect",
            FailureKind::Timeout => "timeout",
            FailureKind::Send => "send",
            FailureKind::Closed => "closed",
            FailureKind::Invalid => "invalid",
            FailureKind::Body => "body",
            FailureKind::RequestBody => "request-body",
            FailureKind::Local => "local",
        }
    }
}
