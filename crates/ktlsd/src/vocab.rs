//! The words every layer shares: where a connection's records are protected
//! ([`RecordLayer`]), which HTTP it speaks ([`HttpVersion`]), a request's
//! [`Method`], how a response body left ([`BodyPath`]) and why a splice stopped ([`Spliced`]), what a name no site has gets ([`UnknownName`]), and the TLS
//! protocol versions ([`TlsVersion`], kernel-tls's own, which already names
//! them for the kernel and for rustls).
//!
//! A leaf: plain values with their labels, no I/O, and no `use` of any other
//! module of this crate, so that config, server, tls, http, handler, log and
//! stats all speak of the same types without a cycle and without translating
//! one layer's enum into another's. It lives here rather than in the lowest
//! layer owning each concept because those layers (stats, log) sit beside the
//! others, not under them. Not here: anything with behaviour beyond naming
//! (how a method is answered, how a name is matched: see [`crate::names`]).

use std::fmt;

pub use kernel_tls::TlsVersion;

/// Where a connection's records are encrypted and decrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordLayer {
    /// The kernel (kTLS).
    Kernel,
    /// This process.
    Userspace,
    /// QUIC packet protection (HTTP/3), sealed by this process packet by packet.
    Quic,
}

impl RecordLayer {
    /// All, in the order metrics index them.
    pub const ALL: [RecordLayer; 3] = [RecordLayer::Kernel, RecordLayer::Userspace, RecordLayer::Quic];

    /// `ktls`, `userspace` or `quic`: the word in logs, metrics and the ready line.
    pub fn label(self) -> &'static str {
        match self {
            RecordLayer::Kernel => "ktls",
            RecordLayer::Userspace => "userspace",
            RecordLayer::Quic => "quic",
        }
    }
}

impl fmt::Display for RecordLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// How a response body left the process: the record layers' body writers say
/// it, the codecs pass it up, and the access log and metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyPath {
    /// `sendfile(2)` from a file (a static file, a cache entry) into a kTLS
    /// socket: the kernel encrypts the page-cache pages, no copy in user space.
    Sendfile,
    /// Through this process's memory: read or built here, then encrypted here
    /// (userspace record layer, QUIC) or handed to the kernel by `send`.
    Copy,
    /// `splice(2)` from an upstream socket through a pipe into a kTLS socket:
    /// the body never enters user space.
    Splice,
}

impl BodyPath {
    /// `sendfile`, `copy` or `splice`: the word in logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            BodyPath::Sendfile => "sendfile",
            BodyPath::Copy => "copy",
            BodyPath::Splice => "splice",
        }
    }
}

/// The HTTP a connection speaks, as ALPN agreed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpVersion {
    /// HTTP/1.1 or 1.0: ALPN `http/1.1`, `http/1.0`, or no ALPN at all.
    Http1,
    /// HTTP/2: ALPN `h2`.
    Http2,
    /// HTTP/3: ALPN `h3`, over QUIC.
    Http3,
}

impl HttpVersion {
    /// All, in the order metrics index them.
    pub const ALL: [HttpVersion; 3] = [HttpVersion::Http1, HttpVersion::Http2, HttpVersion::Http3];

    /// What an ALPN protocol name means; a client that offered nothing speaks HTTP/1.x.
    pub fn from_alpn(alpn: Option<&[u8]>) -> HttpVersion {
        match alpn {
            Some(b"h2") => HttpVersion::Http2,
            _ => HttpVersion::Http1,
        }
    }

    /// `http/1.1`, `h2` or `h3`: the metrics label.
    pub fn label(self) -> &'static str {
        match self {
            HttpVersion::Http1 => "http/1.1",
            HttpVersion::Http2 => "h2",
            HttpVersion::Http3 => "h3",
        }
    }
}

/// A request method. Only GET and HEAD are served; the methods RFC 9110 and RFC 5789
/// define are named so that logs and tests can speak of them, any other token is `Other`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Connect,
    Options,
    Trace,
    Patch,
    /// Any other token (methods are case-sensitive: `get` is one of these).
    Other(String),
}

impl Method {
    /// The method named by `token` (already checked to be a token by the codec).
    pub fn from_token(token: &str) -> Method {
        match token {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "CONNECT" => Method::Connect,
            "OPTIONS" => Method::Options,
            "TRACE" => Method::Trace,
            "PATCH" => Method::Patch,
            other => Method::Other(other.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
            Method::Connect => "CONNECT",
            Method::Options => "OPTIONS",
            Method::Trace => "TRACE",
            Method::Patch => "PATCH",
            Method::Other(s) => s,
        }
    }

    /// Whether a static file server answers it (GET and HEAD); others get 405.
    pub fn is_served(&self) -> bool {
        matches!(self, Method::Get | Method::Head)
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a client naming no configured site gets, in its handshake (SNI) and in
/// its requests (Host, `:authority`) alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum UnknownName {
    /// The default site: its certificate, its files.
    #[default]
    Default,
    /// Refused: the handshake fails with `unrecognized_name`; a request (on a
    /// connection whose handshake named a known site) gets 421 Misdirected Request.
    Refuse,
}

/// Why [`Transport::splice`] stopped before its length: the source's fault (the
/// response must be cut) or the peer's (the connection is gone).
#[derive(Debug)]
pub enum Spliced<E> {
    /// This transport cannot splice (nothing was moved).
    Unsupported,
    /// The source closed after `moved` of the bytes asked for.
    SourceClosed { moved: u64 },
    /// The source sent nothing for the whole read timeout.
    SourceTimedOut { moved: u64 },
    /// Reading the source failed.
    Source { moved: u64, error: std::io::Error },
    /// The peer failed or timed out; the connection must not be reused.
    Peer(E),
}
