//! The reverse proxy: the `[[proxy]]` rules of a site ([`Rule`], chosen by [`route`]
//! before the static answer), and one forwarded request as an [`Exchange`] that the
//! codec drives: [`Exchange::begin`] chooses an upstream and sends the request head,
//! [`Exchange::send_body`] forwards the request body as it arrives,
//! [`Exchange::response`] reads the upstream's head, [`Exchange::read_body`] hands
//! out its body piece by piece (bounded) or [`Exchange::splice_source`] lends the
//! plain socket a body of known length is still on, for the codec to `splice` to
//! its client, and dropping the exchange returns a clean keep-alive connection to
//! the worker's pool.
//!
//! HTTP/1.1 to the upstream, over TCP or TLS ([`upstream`]); idle connections, balancing
//! and passive health per worker ([`pool`]); the header rules ([`headers`]) and the
//! reading of upstream bytes ([`parse`]) as pure functions; figures for `/metrics`
//! ([`metrics`]). A request is sent again to another upstream only while nothing of
//! it could have been acted on: when no connection could be opened or the head not
//! written, or, for an idempotent request without a body, when no byte of a
//! response arrived.
//!
//! The response cache of a rule with `cache = true` is asked before an exchange and
//! given its answer by [`cached`], which the codecs call around the exchange.
//!
//! Not here: the client's framing (chunked or not, HTTP/2 DATA, aborting a stream),
//! which belongs to the codec; and the cache itself (`handler::cache`).

pub mod buffers;
pub mod cached;
pub mod control;
pub mod forward;
pub mod headers;
pub mod health;
pub mod metrics;
pub mod multiplex;
pub mod parse;
pub mod peers;
pub mod pool;
pub mod ranged;
pub mod replies;
pub mod shared;
pub mod sliced;
pub mod tunnel;
pub mod upstream;

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use super::failure::{Failure, FailureKind};
use super::pattern::PathPattern;
use super::{Header, Status};
use crate::log::vars::Attempt;
pub use forward::Forward;
pub use headers::Forwarding;
use parse::{Chunked, Framing};
use upstream::{Conn, IoFailure};

/// Largest piece of a body read from an upstream at once: the bound of the
/// exchange's buffer, whatever the body's size.
pub const PIECE: usize = 64 * 1024;

/// The RFC 9211 `Cache-Status` of a response forwarded without a cache.
pub const CACHE_STATUS_MISS: &str = "ktlsd; fwd=uri-miss";

/// The client's response fields from the upstream's `head` (whose fields are moved
/// out): [`headers::response_fields`], then the length where the framing gives one:
/// a Content-Length body's, or for an answer without a body (HEAD, 304) the length a
/// GET would have had, as the upstream declared it. A chunked or close-delimited body
/// is framed by the codec.
pub fn client_fields(head: &mut parse::Head, cache_status: &str) -> Vec<Header> {
    let declared = match head.framing {
        Framing::None if head.status >= 200 && head.status != 204 => {
            head.fields.iter().find(|(n, _)| n.eq_ignore_ascii_case("content-length")).map(|(_, v)| v.clone())
        }
        _ => None,
    };
    let mut fields: Vec<Header> =
        headers::response_fields(std::mem::take(&mut head.fields), head.version, cache_status)
            .into_iter()
            .map(|(n, v)| Header::Field(n, v))
            .collect();
    match (head.framing, declared) {
        (Framing::Length(n), _) => fields.push(Header::ContentLength(n)),
        (Framing::None, Some(v)) => fields.push(Header::Field("Content-Length".into(), v)),
        _ => {}
    }
    fields
}

/// One validated `[[proxy]]` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The request paths it takes.
    pub path: PathPattern,
    pub upstreams: Vec<Upstream>,
    /// Whether cacheable responses are stored (used by the response cache).
    pub cache: bool,
    pub host: HostMode,
    pub balance: Balance,
    pub timeouts: Timeouts,
    /// How long an upstream that failed is skipped.
    pub fail_timeout: Duration,
    /// Idle connections kept per upstream and worker.
    pub keepalive: usize,
    /// Trust for `https://` upstreams; `None` when every upstream is `http://`.
    pub tls: Option<TlsClient>,
    /// The path prefix taken off, the field rules, `accel_root`.
    pub control: control::Control,
    /// Active health checks of its upstreams (`health_check`).
    pub health_check: Option<health::HealthCheck>,
}

impl Rule {
    /// The rule's identity for its round-robin turn: its upstream list.
    fn key(&self) -> String {
        self.upstreams.iter().map(|u| u.url.as_str()).collect::<Vec<_>>().join(" ")
    }
}

/// The Host the upstream gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMode {
    /// The client's (nginx's `proxy_set_header Host $host`).
    Preserve,
    /// The upstream URL's host and port (nginx's default, `$proxy_host`).
    Upstream,
    Fixed(String),
}

/// How the upstream of each request is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Balance {
    RoundRobin,
    LeastConnections,
}

/// Time limits of an exchange with an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// To open the connection (TLS handshake included).
    pub connect: Duration,
    /// Between two reads (the response head included), as nginx's `proxy_read_timeout`.
    pub read: Duration,
    /// For each write of the request, as nginx's `proxy_send_timeout`.
    pub send: Duration,
    /// How long a tunnel (a WebSocket) may move no byte either way before it is closed.
    pub tunnel_idle: Duration,
}

/// The TLS client configuration of a rule's `https://` upstreams.
#[derive(Clone)]
pub struct TlsClient {
    /// The PEM file its roots came from.
    pub ca: std::path::PathBuf,
    pub config: Arc<rustls::ClientConfig>,
    /// The same trust offering only HTTP/2 by ALPN, for `h2://` upstreams.
    pub h2: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TlsClient({})", self.ca.display())
    }
}

impl PartialEq for TlsClient {
    fn eq(&self, other: &TlsClient) -> bool {
        self.ca == other.ca
    }
}

impl Eq for TlsClient {}

/// One upstream server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// As configured, without a trailing slash: its name in logs and metrics.
    pub url: String,
    pub tls: bool,
    /// The host to connect to (an IPv6 address without brackets); `localhost` for a
    /// Unix socket.
    pub host: String,
    pub port: u16,
    /// `host[:port]` as the URL gives them, for `host = "upstream"` (`localhost`
    /// for a Unix socket).
    pub authority: String,
    /// The Unix socket to connect to instead of `host` and `port` (`unix:`, `unix+h2c:`).
    pub unix: Option<std::path::PathBuf>,
    /// Whether it speaks HTTP/2 (`h2c://`, `h2://`, `unix+h2c:`) rather than HTTP/1.1.
    pub h2: bool,
    /// What every worker shares of it: the drain flag, the pooled connections.
    pub shared: shared::Handle,
}

/// The longest Unix socket path the kernel takes (`sun_path`, less its NUL).
const MAX_UNIX_PATH: usize = 107;

impl Upstream {
    /// `HOST:PORT` (an IPv6 address in brackets), or `unix:PATH`: the address the
    /// admin's drain and enable name it by.
    pub fn address(&self) -> String {
        if let Some(path) = &self.unix {
            return format!("unix:{}", path.display());
        }
        match self.host.contains(':') {
            true => format!("[{}]:{}", self.host, self.port),
            false => format!("{}:{}", self.host, self.port),
        }
    }

    /// `http://HOST[:PORT]`, `https://HOST[:PORT]`, `h2c://HOST[:PORT]`,
    /// `h2://HOST[:PORT]` (an optional trailing `/`), `unix:/PATH` or `unix+h2c:/PATH`.
    pub fn parse(url: &str) -> Result<Upstream, String> {
        let form = || {
            format!(
                "upstream {url:?}: expected http://HOST[:PORT], https://HOST[:PORT], h2c://HOST[:PORT], \
                 h2://HOST[:PORT], unix:/PATH or unix+h2c:/PATH"
            )
        };
        if let Some((scheme, path)) = url.split_once(':').filter(|(s, _)| s.to_ascii_lowercase().starts_with("unix")) {
            let h2 = match scheme.to_ascii_lowercase().as_str() {
                "unix" => false,
                "unix+h2c" => true,
                _ => return Err(form()),
            };
            if !path.starts_with('/') || path.contains('\0') {
                return Err(format!("upstream {url:?}: expected an absolute socket path such as unix:/run/app.sock"));
            }
            if path.len() > MAX_UNIX_PATH {
                return Err(format!("upstream {url:?}: a Unix socket path is at most {MAX_UNIX_PATH} bytes"));
            }
            let shared = shared::Handle(shared::of(url));
            return Ok(Upstream {
                url: url.to_string(),
                tls: false,
                host: "localhost".into(),
                port: 0,
                authority: "localhost".into(),
                unix: Some(path.into()),
                h2,
                shared,
            });
        }
        let (tls, h2, rest) = match url.split_once("://") {
            Some((s, rest)) if s.eq_ignore_ascii_case("http") => (false, false, rest),
            Some((s, rest)) if s.eq_ignore_ascii_case("https") => (true, false, rest),
            Some((s, rest)) if s.eq_ignore_ascii_case("h2c") => (false, true, rest),
            Some((s, rest)) if s.eq_ignore_ascii_case("h2") => (true, true, rest),
            _ => return Err(form()),
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if !path.is_empty() && path != "/" {
            return Err(format!("upstream {url:?}: no path may follow the host (the request's path is sent as it is)"));
        }
        let name_char = |b: u8| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b);
        if authority.is_empty() || !authority.bytes().all(name_char) {
            return Err(form());
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(':') && (h.starts_with('[') == h.ends_with(']')) => {
                let port = p.parse::<u16>().ok().filter(|&p| p > 0);
                (h, port.ok_or_else(|| format!("upstream {url:?}: port {p:?} is not a port number"))?)
            }
            _ => (authority, if tls { 443 } else { 80 }),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(form());
        }
        let url = url.trim_end_matches('/').to_string();
        let shared = shared::Handle(shared::of(&url));
        Ok(Upstream {
            url,
            tls,
            host: host.to_ascii_lowercase(),
            port,
            authority: authority.to_string(),
            unix: None,
            h2,
            shared,
        })
    }
}

/// Whether any of `sites` has `[[proxy]]` rules (the codecs then keep what a
/// forwarded request needs: its fields, its body).
pub fn any(sites: &super::Sites<'_>) -> bool {
    sites.default.content.locations.forwards() || sites.named.iter().any(|s| s.content.locations.forwards())
}

/// What the upstream request of a tunnel asks for: `protocol`, with a key of this
/// hop's when the client's request was an extended CONNECT (`method`), whose
/// HTTP/2 form has none.
pub fn tunnel_upgrade(protocol: &str, method: &super::Method) -> headers::Upgrade {
    let key = (*method == super::Method::Connect).then(tunnel::new_key);
    headers::Upgrade { protocol: protocol.to_string(), key }
}

/// Methods RFC 9110 section 9.2.2 makes idempotent.
fn idempotent(method: &str) -> bool {
    matches!(method, "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE")
}

/// The failure of `up` for an I/O error while `what`: 504 on a timeout, 503 when
/// this host ran short (descriptors, memory), else a 502 of `kind`. One mapping for
/// the HTTP/1.1 exchange and the HTTP/2 forward.
fn io_failure(up: &Upstream, e: IoFailure, what: &str, kind: FailureKind) -> Failure {
    let (status, kind, detail) = match e {
        IoFailure::TimedOut => (Status::GATEWAY_TIMEOUT, FailureKind::Timeout, format!("{what}: timed out")),
        IoFailure::Local(e) => (Status::SERVICE_UNAVAILABLE, FailureKind::Local, format!("{what}: {e}")),
        IoFailure::Failed(e) => (Status::BAD_GATEWAY, kind, format!("{what}: {e}")),
    };
    Failure { status, kind, upstream: up.url.clone(), detail }
}

/// The 504 of `up` silent for the read timeout while `what`.
fn timed_out(up: &Upstream, what: &str) -> Failure {
    io_failure(up, IoFailure::TimedOut, what, FailureKind::Timeout)
}

/// Marks `up` failed in this worker for the rule's `fail_timeout` (passive health),
/// its pooled connections forgotten, and counts it.
fn mark_failed(rule: &Rule, up: &Upstream, f: &Failure) {
    tracing::warn!("{f}; the upstream is skipped for {:?}", rule.fail_timeout);
    if up.h2 {
        multiplex::forget(&up.url);
    }
    pool::failed(&up.url, rule.fail_timeout);
    metrics::failed(&up.url, f.kind.label(), true);
}

/// The failure of a connection to `up` that could not be opened, noted for the
/// access log; `up` is marked failed unless the fault was this host's own shortage,
/// which says nothing of the upstream's health.
fn connect_failed(rule: &Rule, up: &Upstream, fwd: &Forwarding, e: IoFailure) -> Failure {
    let local = matches!(e, IoFailure::Local(_));
    let f = io_failure(up, e, "connect", FailureKind::Connect);
    note_attempt(fwd, |a| a.status = Some(f.status.0));
    if !local {
        mark_failed(rule, up, &f);
    }
    f
}

/// The Host `up` gets under `rule`'s `host`: the client's (`client`, when it sent
/// one; the upstream's otherwise, as for a health check), the upstream's, or the
/// fixed one.
fn host_for<'a>(rule: &'a Rule, up: &'a Upstream, client: Option<&'a str>) -> &'a str {
    match &rule.host {
        HostMode::Preserve => client.unwrap_or(&up.authority),
        HostMode::Upstream => &up.authority,
        HostMode::Fixed(h) => h,
    }
}

/// Applies `f` to the access log's notes of the current attempt of `fwd`.
fn note_attempt(fwd: &Forwarding, f: impl FnOnce(&mut Attempt)) {
    fwd.notes.with(|n| {
        if let Some(a) = n.upstream.last_mut() {
            f(a);
        }
    });
}

/// One request forwarded to one of a rule's upstreams.
pub struct Exchange<'r> {
    rule: &'r Rule,
    fwd: Forwarding,
    fields: Vec<(String, String)>,
    /// The request body bytes that leave in one write with the head (sent again
    /// with it when the head goes to another upstream).
    first: Vec<u8>,
    /// The upstream in use (its index in the rule) and its connection.
    index: usize,
    conn: Option<Conn>,
    reused: bool,
    tried: Vec<usize>,
    /// Whether any request body byte went out (then it cannot be sent again).
    sent_body: bool,
    sent_at: Instant,
    /// When the current attempt began (its connection asked for), for the access log.
    attempt_at: Instant,
    /// Response bytes read and not yet handed out (bounded by [`parse::MAX_HEAD`] and [`PIECE`]).
    buf: Vec<u8>,
    framing: Framing,
    left: u64,
    chunks: Chunked,
    reusable: bool,
    done: bool,
}

impl<'r> Exchange<'r> {
    /// Chooses an upstream of `rule` and sends it the request head; an upstream that
    /// cannot be reached is marked failed and the next is tried. `fields` are the
    /// client's request fields.
    ///
    /// # Cancel safety
    /// Cancel-safe as to the pool: a dropped exchange returns no connection.
    pub async fn begin(
        rule: &'r Rule,
        fwd: Forwarding,
        fields: Vec<(String, String)>,
    ) -> Result<Exchange<'r>, Failure> {
        Exchange::begin_with_body(rule, fwd, fields, &[]).await
    }

    /// As [`Exchange::begin`], with `first`, the start of the request body already
    /// at hand, written together with the head (one write, as nginx's `writev`);
    /// the rest follows with [`Exchange::send_body`].
    ///
    /// # Cancel safety
    /// As [`Exchange::begin`].
    pub async fn begin_with_body(
        rule: &'r Rule,
        fwd: Forwarding,
        fields: Vec<(String, String)>,
        first: &[u8],
    ) -> Result<Exchange<'r>, Failure> {
        let mut x = Exchange {
            rule,
            fwd,
            fields,
            first: first.to_vec(),
            index: 0,
            conn: None,
            reused: false,
            tried: Vec::new(),
            sent_body: false,
            sent_at: Instant::now(),
            attempt_at: Instant::now(),
            buf: buffers::take(),
            framing: Framing::None,
            left: 0,
            chunks: Chunked::default(),
            reusable: false,
            done: false,
        };
        x.open(None).await?;
        Ok(x)
    }

    fn upstream(&self) -> &'r Upstream {
        &self.rule.upstreams[self.index]
    }

    /// A 502 of `kind` naming this exchange's upstream.
    pub fn failure_now(&self, kind: FailureKind, detail: &str) -> Failure {
        self.failure(Status::BAD_GATEWAY, kind, detail.to_string())
    }

    fn failure(&self, status: Status, kind: FailureKind, detail: String) -> Failure {
        Failure { status, kind, upstream: self.upstream().url.clone(), detail }
    }

    fn io_failure(&self, e: IoFailure, what: &str, kind: FailureKind) -> Failure {
        io_failure(self.upstream(), e, what, kind)
    }

    /// Drops the current connection (not reusable) and its count in flight.
    fn release(&mut self) {
        if self.conn.take().is_some() {
            pool::finished(&self.upstream().url);
        }
    }

    /// Opens a connection to the next upstream to try and writes the head; `last` is
    /// the failure that led here, returned when no upstream is left.
    async fn open(&mut self, mut last: Option<Failure>) -> Result<(), Failure> {
        self.release();
        loop {
            let Some(i) = pool::pick(self.rule, &self.tried) else {
                return Err(last.unwrap_or_else(|| pool::none_left(self.rule, &self.upstream().url)));
            };
            self.index = i;
            let up = self.upstream();
            self.attempt_at = Instant::now();
            let addr = up.address();
            self.fwd.notes.with(|n| n.upstream.push(Attempt { addr, ..Attempt::default() }));
            let (conn, reused) = match pool::take_idle(&up.url) {
                Some(c) => (c, true),
                None => match upstream::connect(up, self.rule.tls.as_ref(), self.rule.timeouts.connect).await {
                    Ok(c) => (c, false),
                    Err(e) => {
                        self.tried.push(i);
                        last = Some(connect_failed(self.rule, up, &self.fwd, e));
                        continue;
                    }
                },
            };
            pool::started(&up.url);
            self.note(|a, started| a.connect = Some(started.elapsed()));
            self.conn = Some(conn);
            self.reused = reused;
            let host = host_for(self.rule, up, self.fwd.authority.as_deref());
            let mut head = headers::request_head(&self.fwd, &self.fields, host);
            if !self.first.is_empty() {
                // A body in the same write: if it fails, no upstream had the whole request.
                head.extend_from_slice(&self.first);
            }
            self.sent_at = Instant::now();
            match self.write(&head).await {
                Ok(()) => {
                    self.sent_body |= !self.first.is_empty();
                    return Ok(());
                }
                Err(e) => {
                    let f = self.io_failure(e, "sending the request head", FailureKind::Send);
                    self.release();
                    // A kept-alive connection the upstream had closed is not the upstream's failure.
                    if !reused {
                        self.tried.push(i);
                        self.mark_failed(&f);
                    }
                    last = Some(f);
                }
            }
        }
    }

    /// Notes of the current attempt, for the access log: `f` gets it and when it began.
    fn note(&self, f: impl FnOnce(&mut Attempt, Instant)) {
        let at = self.attempt_at;
        note_attempt(&self.fwd, |a| f(a, at));
    }

    fn mark_failed(&self, f: &Failure) {
        mark_failed(self.rule, self.upstream(), f);
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), IoFailure> {
        let send = self.rule.timeouts.send;
        match self.conn.as_mut() {
            Some(c) => c.write_all(bytes, send).await,
            None => Err(IoFailure::Failed(std::io::Error::other("no connection"))),
        }
    }

    /// Forwards a piece of the request body (chunk-framed when its length is unknown).
    ///
    /// # Cancel safety
    /// Not cancel-safe: part of the piece may have been sent.
    pub async fn send_body(&mut self, piece: &[u8]) -> Result<(), Failure> {
        let r = self.send_piece(piece).await;
        self.counted(r)
    }

    /// `r`, its failure counted in the metrics (the upstream is not marked failed:
    /// it may have answered early, or the fault may be the body's).
    fn counted<R>(&self, r: Result<R, Failure>) -> Result<R, Failure> {
        if let Err(f) = &r {
            metrics::error(f.kind.label());
        }
        r
    }

    async fn send_piece(&mut self, piece: &[u8]) -> Result<(), Failure> {
        if piece.is_empty() {
            return Ok(());
        }
        self.sent_body = true;
        let r = if self.fwd.body == Some(None) {
            let mut framed = format!("{:x}\r\n", piece.len()).into_bytes();
            framed.extend_from_slice(piece);
            framed.extend_from_slice(b"\r\n");
            self.write(&framed).await
        } else {
            self.write(piece).await
        };
        r.map_err(|e| self.io_failure(e, "sending the request body", FailureKind::Send))
    }

    /// Ends a request body of unknown length (its last chunk).
    ///
    /// # Cancel safety
    /// Not cancel-safe: part of the last chunk may have been sent.
    pub async fn end_body(&mut self) -> Result<(), Failure> {
        if self.fwd.body != Some(None) {
            return Ok(());
        }
        self.sent_body = true;
        self.write(b"0\r\n\r\n").await.map_err(|e| self.io_failure(e, "sending the request body", FailureKind::Send))
    }

    /// Reads the upstream's final response head (interim 1xx responses dropped).
    ///
    /// # Cancel safety
    /// Not cancel-safe, as [`Exchange::next_head`].
    pub async fn response(&mut self) -> Result<parse::Head, Failure> {
        loop {
            let head = self.next_head().await?;
            if head.status != 103 {
                return Ok(head);
            }
        }
    }

    /// Reads the upstream's next response head: a 103 (Early Hints, its fields for the
    /// client, more heads to follow) or the final one; other interim 1xx responses
    /// are dropped. An idempotent request without a body whose upstream fails before
    /// a byte of a response is sent to the next upstream.
    ///
    /// # Cancel safety
    /// Not cancel-safe: a retry may be half-sent; drop the exchange after a cancel.
    pub async fn next_head(&mut self) -> Result<parse::Head, Failure> {
        loop {
            match self.read_head().await {
                Ok(head) if head.status == 103 => return Ok(head),
                Ok(head) => {
                    pool::succeeded(&self.upstream().url);
                    metrics::answered(&self.upstream().url, self.sent_at.elapsed());
                    self.note(|a, started| (a.status, a.header) = (Some(head.status), Some(started.elapsed())));
                    return Ok(head);
                }
                Err((f, nothing_received)) => {
                    self.note(|a, started| (a.status, a.response) = (Some(f.status.0), Some(started.elapsed())));
                    let stale = self.reused && nothing_received && f.kind == FailureKind::Closed;
                    if !stale {
                        self.tried.push(self.index);
                        self.mark_failed(&f);
                    }
                    let retry = nothing_received && !self.sent_body && idempotent(&self.fwd.method);
                    if !retry {
                        self.release();
                        return Err(f);
                    }
                    tracing::info!("proxy {} {}: {f}; trying another upstream", self.fwd.method, self.fwd.target);
                    self.buf.clear();
                    self.open(Some(f)).await?;
                }
            }
        }
    }

    /// The next response head; on failure, whether no byte of a response had arrived.
    async fn read_head(&mut self) -> Result<parse::Head, (Failure, bool)> {
        let read_timeout = self.rule.timeouts.read;
        let mut received = false;
        loop {
            match parse::head_for(&self.buf, &self.fwd.method, self.fwd.upgrade.is_some()) {
                Ok(Some((head, used))) => {
                    self.buf.drain(..used);
                    // A 103 goes to the caller (early hints); other interim answers are
                    // dropped; a 101 (asked for) is the final one.
                    if head.status == 103 {
                        return Ok(head);
                    }
                    if (100..200).contains(&head.status) && head.status != 101 {
                        continue;
                    }
                    self.framing = head.framing;
                    self.left = match head.framing {
                        Framing::Length(n) => n,
                        _ => 0,
                    };
                    self.reusable = head.reusable;
                    return Ok(head);
                }
                Ok(None) => {}
                Err(parse::Invalid(why)) => {
                    return Err((
                        self.failure(Status::BAD_GATEWAY, FailureKind::Invalid, format!("invalid response: {why}")),
                        false,
                    ))
                }
            }
            let Some(conn) = self.conn.as_mut() else {
                return Err((
                    self.failure(Status::BAD_GATEWAY, FailureKind::Closed, "no connection".into()),
                    !received,
                ));
            };
            let room = parse::MAX_HEAD + 1 - self.buf.len().min(parse::MAX_HEAD);
            match conn.read(&mut self.buf, room, read_timeout).await {
                Ok(0) => {
                    let f = self.failure(
                        Status::BAD_GATEWAY,
                        FailureKind::Closed,
                        "closed the connection before a complete response head".into(),
                    );
                    return Err((f, !received));
                }
                Ok(_) => received = true,
                Err(e) => {
                    return Err((self.io_failure(e, "waiting for the response head", FailureKind::Closed), !received))
                }
            }
        }
    }

    /// Appends the next piece of the response body (at most [`PIECE`] bytes) to `out`;
    /// `Ok(false)`: the body is complete. An error means the body is incomplete: the
    /// client's response must be cut, never ended as if whole.
    ///
    /// # Cancel safety
    /// Cancel-safe: bytes read are kept in the exchange until handed out.
    pub async fn read_body(&mut self, out: &mut Vec<u8>) -> Result<bool, Failure> {
        let r = self.read_piece(out).await;
        self.counted(r)
    }

    async fn read_piece(&mut self, out: &mut Vec<u8>) -> Result<bool, Failure> {
        loop {
            if let Some(r) = self.take_buffered(out) {
                return r;
            }
            let read_timeout = self.rule.timeouts.read;
            let Some(conn) = self.conn.as_mut() else {
                return Err(self.failure(Status::BAD_GATEWAY, FailureKind::Body, "no connection".into()));
            };
            // A chunk-size line may span reads: what is kept stays bounded by the decoder's limits.
            let n = match conn.read(&mut self.buf, PIECE, read_timeout).await {
                Ok(n) => n,
                Err(e) => return Err(self.io_failure(e, "reading the response body", FailureKind::Body)),
            };
            if n == 0 {
                if self.framing == Framing::Close {
                    self.done = true;
                    return Ok(false);
                }
                return Err(self.failure(
                    Status::BAD_GATEWAY,
                    FailureKind::Body,
                    "closed the connection before the end of the body".into(),
                ));
            }
        }
    }

    /// As [`Exchange::read_body`] without waiting: the next piece of the body among
    /// the bytes already read (the end of a body is known without a read too);
    /// `None` when it needs a read from the upstream.
    pub fn read_buffered(&mut self, out: &mut Vec<u8>) -> Option<Result<bool, Failure>> {
        let r = self.take_buffered(out)?;
        Some(self.counted(r))
    }

    fn take_buffered(&mut self, out: &mut Vec<u8>) -> Option<Result<bool, Failure>> {
        if self.done {
            return Some(Ok(false));
        }
        match self.framing {
            Framing::None => {
                self.done = true;
                return Some(Ok(false));
            }
            Framing::Length(_) if self.left == 0 => {
                self.done = true;
                self.reusable &= self.buf.is_empty();
                return Some(Ok(false));
            }
            Framing::Length(_) if !self.buf.is_empty() => {
                let take = (self.buf.len() as u64).min(self.left) as usize;
                if take as u64 == self.left && beyond_length(&self.buf[take..]) {
                    let why = format!("sent more than its Content-Length of {} bytes", self.length());
                    return Some(Err(self.failure(Status::BAD_GATEWAY, FailureKind::Body, why)));
                }
                if out.is_empty() && take == self.buf.len() {
                    // All of it: the buffers change places instead of copying.
                    std::mem::swap(out, &mut self.buf);
                } else {
                    out.extend_from_slice(&self.buf[..take]);
                    self.buf.drain(..take);
                }
                self.left -= take as u64;
                return Some(Ok(true));
            }
            Framing::Chunked if !self.buf.is_empty() => {
                let before = out.len();
                let used = match self.chunks.decode(&self.buf, out) {
                    Ok(n) => n,
                    Err(parse::Invalid(why)) => {
                        return Some(Err(self.failure(
                            Status::BAD_GATEWAY,
                            FailureKind::Body,
                            format!("invalid chunked body: {why}"),
                        )))
                    }
                };
                self.buf.drain(..used);
                if self.chunks.is_done() {
                    self.done = true;
                    self.reusable &= self.buf.is_empty();
                    return Some(Ok(out.len() > before));
                }
                if out.len() > before {
                    return Some(Ok(true));
                }
            }
            Framing::Close if !self.buf.is_empty() => {
                out.append(&mut self.buf);
                return Some(Ok(true));
            }
            _ => {}
        }
        None
    }
}

impl Exchange<'_> {
    /// What the request asked the upstream to switch to, if anything.
    pub fn upgrade(&self) -> Option<&headers::Upgrade> {
        self.fwd.upgrade.as_ref()
    }

    /// The connection of an exchange whose upstream switched protocols (101), for a
    /// tunnel: the connection (counted in flight until the tunnel is dropped) and
    /// the bytes that came after the 101's head, which are the tunnel's first.
    pub fn into_tunnel(mut self) -> Option<tunnel::Wire> {
        let conn = self.conn.take()?;
        let url = self.upstream().url.clone();
        let early = std::mem::take(&mut self.buf);
        Some(tunnel::Wire::new(conn, url, early))
    }

    /// The plain TCP socket a Content-Length body with bytes still to come arrives
    /// on, even while some already read are held: whether [`Exchange::splice_source`]
    /// will have it once those are taken.
    pub fn plain_body_socket(&self) -> Option<&tokio::net::TcpStream> {
        if self.done || self.left == 0 || !matches!(self.framing, Framing::Length(_)) {
            return None;
        }
        match self.conn.as_ref()? {
            Conn::Plain(s) => Some(s),
            Conn::Tls(_) | Conn::Unix(_) => None,
        }
    }

    /// The plain TCP socket the rest of a Content-Length body is on, the bytes of
    /// it left there, and the read timeout: for the codec to move them to its client
    /// without reading them ([`Exchange::spliced`] or [`Exchange::splice_failed`]
    /// after). `None` while body bytes already read are held (take them with
    /// [`Exchange::read_body`] first), once the body is complete, for a TLS upstream
    /// and for a body framed otherwise.
    pub fn splice_source(&self) -> Option<(&tokio::net::TcpStream, u64, Duration)> {
        if !self.buf.is_empty() {
            return None;
        }
        self.plain_body_socket().map(|s| (s, self.left, self.rule.timeouts.read))
    }

    /// Ends the exchange of a response without a body (a 304 that refreshed a stored
    /// entry, say), so that the connection goes back to the pool; a response with a
    /// body is left unread, and dropping the exchange then closes the connection.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`Exchange::read_body`].
    pub async fn release_if_bodiless(&mut self) {
        if self.framing == Framing::None {
            let _ = self.read_body(&mut Vec::new()).await;
        }
    }

    /// `n` bytes of the body were moved from [`Exchange::splice_source`]'s socket;
    /// the body is complete (and the connection reusable) when none are left.
    pub fn spliced(&mut self, n: u64) {
        self.left -= n.min(self.left);
        self.done = self.left == 0;
    }

    /// The body could not be moved to its end (`cause`: the upstream closed early,
    /// was too slow, or failed): the failure, counted; the connection is not reused.
    pub fn splice_failed(&mut self, cause: IoFailure) -> Failure {
        let f = self.io_failure(cause, "reading the response body", FailureKind::Body);
        metrics::error(f.kind.label());
        self.release();
        f
    }

    /// Whether the body is complete without another read; a Content-Length body
    /// read to its end is marked complete, so that its connection goes back to the pool.
    pub fn body_complete(&mut self) -> bool {
        if !self.done && matches!(self.framing, Framing::Length(_)) && self.left == 0 {
            self.done = true;
            self.reusable &= self.buf.is_empty();
        }
        self.done
    }

    /// The response's Content-Length (0 for a body of another framing).
    fn length(&self) -> u64 {
        match self.framing {
            Framing::Length(n) => n,
            _ => 0,
        }
    }
}

/// Whether `extra`, read after a body of known length, is more body: bytes other
/// than the stray line ends some servers send after a body. Such a response is
/// not taken for whole (nor stored); a next response cannot come unasked.
fn beyond_length(extra: &[u8]) -> bool {
    extra.iter().any(|b| !matches!(b, b'\r' | b'\n'))
}

impl Drop for Exchange<'_> {
    /// A connection whose response was read to its end goes back to the pool.
    fn drop(&mut self) {
        self.note(|a, started| {
            a.response.get_or_insert_with(|| started.elapsed());
        });
        if let Some(conn) = self.conn.take() {
            let url = &self.rule.upstreams[self.index].url;
            pool::finished(url);
            if self.done && self.reusable && self.buf.is_empty() {
                pool::put_idle(url, conn, self.rule.keepalive);
            }
        }
        buffers::give(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_fields_carry_the_length_the_framing_gives() {
        let fields = || vec![("Content-Length".into(), "5".to_string()), ("ETag".into(), "\"e\"".to_string())];
        // (status, framing): the length field the client gets, if any.
        for (status, framing, want) in [
            (200, Framing::Length(5), Some("5")),
            (200, Framing::None, Some("5")), // HEAD: the length a GET would have had
            (304, Framing::None, Some("5")),
            (204, Framing::None, None),
            (103, Framing::None, None),
            (200, Framing::Chunked, None), // framed by the codec
            (200, Framing::Close, None),
        ] {
            let mut head = parse::Head { status, version: "1.1", fields: fields(), framing, reusable: true };
            let got = client_fields(&mut head, CACHE_STATUS_MISS);
            let lengths: Vec<String> =
                got.iter().filter(|h| h.name().eq_ignore_ascii_case("content-length")).map(|h| h.to_string()).collect();
            assert_eq!(lengths, want.map(str::to_string).into_iter().collect::<Vec<_>>(), "{status} {framing:?}");
            assert!(got.iter().any(|h| h.name() == "ETag") && got.iter().any(|h| h.name() == "Via"), "{got:?}");
            assert!(head.fields.is_empty(), "the upstream's fields are moved out");
        }
    }

    #[test]
    fn upstream_urls() {
        for (url, want) in [
            ("http://127.0.0.1:9000", Some((false, "127.0.0.1", 9000, "127.0.0.1:9000"))),
            ("http://127.0.0.1:9000/", Some((false, "127.0.0.1", 9000, "127.0.0.1:9000"))),
            ("HTTPS://Up.Example", Some((true, "up.example", 443, "Up.Example"))),
            ("http://[::1]:8080", Some((false, "::1", 8080, "[::1]:8080"))),
            ("http://[::1]", Some((false, "::1", 80, "[::1]"))),
            ("http://a:0", None),
            ("http://a:x", None),
            ("http://a/b", None),
            ("http://a?x", None),
            ("ws://a", None),
            ("a:80", None),
            ("http://:80", None),
            ("h2c://127.0.0.1:50051", Some((false, "127.0.0.1", 50051, "127.0.0.1:50051"))),
            ("H2://Up.Example", Some((true, "up.example", 443, "Up.Example"))),
            ("h2c://a", Some((false, "a", 80, "a"))),
            ("h3://a", None),
        ] {
            let got = Upstream::parse(url).ok();
            let got = got.as_ref().map(|u| (u.tls, u.host.as_str(), u.port, u.authority.as_str()));
            assert_eq!(got, want, "{url}");
        }
    }

    #[test]
    fn upstream_kinds() {
        // url: (unix path, h2, tls), or refused.
        for (url, want) in [
            ("http://a", Some((None, false, false))),
            ("https://a", Some((None, false, true))),
            ("h2c://a:1", Some((None, true, false))),
            ("h2://a:1", Some((None, true, true))),
            ("unix:/run/app.sock", Some((Some("/run/app.sock"), false, false))),
            ("UNIX:/run/app.sock", Some((Some("/run/app.sock"), false, false))),
            ("unix+h2c:/run/grpc.sock", Some((Some("/run/grpc.sock"), true, false))),
            ("unix:run/app.sock", None),
            ("unix:", None),
            ("unix+h2:/run/app.sock", None),
            ("unixy:/run/app.sock", None),
            ("unix:/a\0b", None),
        ] {
            let got = Upstream::parse(url).ok();
            let got = got.as_ref().map(|u| (u.unix.as_deref().and_then(|p| p.to_str()), u.h2, u.tls));
            assert_eq!(got, want, "{url}");
        }
        let long = format!("unix:/{}", "a".repeat(MAX_UNIX_PATH));
        assert!(Upstream::parse(&long).is_err());
        let u = Upstream::parse("unix:/run/app.sock").ok();
        assert_eq!(u.map(|u| (u.address(), u.authority)), Some(("unix:/run/app.sock".into(), "localhost".into())));
    }

    #[test]
    fn bytes_after_a_body_of_known_length() {
        for (extra, want) in
            [(&b""[..], false), (b"\r\n", false), (b"\n", false), (b"x", true), (b"\r\nHTTP/1.1", true)]
        {
            assert_eq!(beyond_length(extra), want, "{extra:?}");
        }
    }

    #[test]
    fn idempotent_methods() {
        for (m, want) in
            [("GET", true), ("HEAD", true), ("PUT", true), ("DELETE", true), ("POST", false), ("PATCH", false)]
        {
            assert_eq!(idempotent(m), want, "{m}");
        }
    }
}
