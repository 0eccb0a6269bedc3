//! HTTP/2 upstreams (`h2c://` with prior knowledge, `h2://` over TLS with ALPN
//! `h2`, `unix+h2c:` on a Unix socket), spoken with the `h2` crate: gRPC and any
//! HTTP/2 application.
//!
//! Each worker keeps a few connections per upstream ([`Pooled`]) and puts many
//! requests on each as streams, up to the upstream's `SETTINGS_MAX_CONCURRENT_STREAMS`;
//! a full connection leads to another one (at most [`MAX_CONNS`]). A connection's
//! frames are read and written by a driver task of its own; one that ends (the
//! upstream's GOAWAY, an error, a close) is retired, its streams in flight finishing
//! or failing as the upstream says; a request without a body that failed so before
//! its answer goes again on a new connection when nothing of it was acted on. An
//! idle one is closed after [`IDLE_FOR`].
//!
//! [`forward`] sends one request as a stream: the head as the HTTP/1.1 path builds it
//! (`headers::request_head`, so every header rule is the same), the body as it
//! arrives within the stream's flow-control credit, and, for a client whose codec
//! can read its body while the answer streams ([`Downstream::duplex`]: HTTP/2 and
//! HTTP/3), both directions at once (gRPC's bidirectional calls); an HTTP/1.1
//! client's body is sent whole first. The answer's body goes to the client piece by
//! piece, its credit given back to the upstream only once the client took the piece,
//! so a slow client holds the upstream back rather than filling memory. Trailers
//! (gRPC's `grpc-status`) go to the client ([`Downstream::send_trailers`]). An
//! upstream that resets the stream, or fails, after the head has the client's
//! response cut ([`Downstream::abort`]: RST_STREAM on HTTP/2 and HTTP/3, the
//! connection closed on HTTP/1.1); before the head, a 502 (504 on a timeout). The
//! cache and `X-Accel-Redirect` take the answer as they take an HTTP/1.1 one.
//!
//! Not here: the client's framing (the codecs), the HTTP/1.1 exchange (`super::Exchange`).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::SendRequest;
use h2::SendStream;

use super::cached::{self, Next, Pending};
use super::parse::{Framing, Head};
use super::replies::{answer, commit, commit_before_head, cut, refused, Added};
use super::upstream::{self, IoFailure};
use super::{
    client_fields, connect_failed, headers, host_for, idempotent, mark_failed, metrics, note_attempt, pool, timed_out,
    Failure, FailureKind, Forwarding, Rule, Upstream, PIECE,
};
use crate::fds;
use crate::handler::downstream::{BodyError, Downstream, Outcome, StreamEnd, Streamed};
use crate::handler::{Body, Request, Response, Status};
use crate::log::vars::Attempt;
use crate::vocab::BodyPath;

/// Most HTTP/2 connections per upstream and worker.
const MAX_CONNS: usize = 16;

/// How long a connection without a stream is kept.
const IDLE_FOR: Duration = Duration::from_secs(60);

/// The flow-control window this client gives each stream and each connection: what
/// an upstream may send ahead of what the client took.
const STREAM_WINDOW: u32 = 256 * 1024;
const CONN_WINDOW: u32 = 1024 * 1024;

/// The largest header block taken from an upstream (a larger one, or one that never
/// ends, fails the connection).
const MAX_HEADER_LIST: u32 = 64 * 1024;

/// One HTTP/2 connection to an upstream.
struct Pooled {
    send: SendRequest<Bytes>,
    /// Streams of this worker open on it.
    open: Rc<Cell<usize>>,
    /// Turned true when its driver ended (GOAWAY, error, close).
    gone: Rc<Cell<bool>>,
    /// When its last stream ended.
    idle_since: Rc<Cell<Instant>>,
    _counted: fds::Counted,
}

impl Pooled {
    fn has_room(&self) -> bool {
        !self.gone.get() && self.open.get() < self.send.current_max_send_streams()
    }
}

thread_local! {
    static CONNS: RefCell<HashMap<String, Vec<Pooled>>> = RefCell::default();
}

/// A stream's place on its connection, given back when dropped.
struct Lease {
    open: Rc<Cell<usize>>,
    idle_since: Rc<Cell<Instant>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.open.set(self.open.get().saturating_sub(1));
        if self.open.get() == 0 {
            self.idle_since.set(Instant::now());
        }
    }
}

/// A connection with room for one more stream: a pooled one, else a new one.
/// `Ok(bool)`: whether it was opened now.
///
/// # Cancel safety
/// Cancel-safe: a connection being opened is dropped.
async fn connection(rule: &Rule, up: &Upstream) -> Result<(SendRequest<Bytes>, Lease, bool), IoFailure> {
    let found = CONNS.with(|c| {
        let mut c = c.borrow_mut();
        let list = c.entry(up.url.clone()).or_default();
        let now = Instant::now();
        let idle_too_long = |p: &Pooled| p.open.get() == 0 && now.duration_since(p.idle_since.get()) >= IDLE_FOR;
        list.retain(|p| !p.gone.get() && !idle_too_long(p));
        list.iter().find(|p| p.has_room()).map(lease)
    });
    if let Some((send, lease)) = found {
        return Ok((send, lease, false));
    }
    fds::make_room(1);
    let conn = upstream::connect(up, rule.tls.as_ref(), rule.timeouts.connect).await?;
    let handshake = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONN_WINDOW)
        .max_header_list_size(MAX_HEADER_LIST)
        .max_send_buffer_size(PIECE)
        .enable_push(false)
        .handshake::<_, Bytes>(conn);
    let (send, driver) = match tokio::time::timeout(rule.timeouts.connect, handshake).await {
        Ok(Ok(pair)) => pair,
        Ok(Err(e)) => return Err(IoFailure::Failed(std::io::Error::other(e))),
        Err(_) => return Err(IoFailure::TimedOut),
    };
    let gone = Rc::new(Cell::new(false));
    let url = up.url.clone();
    let flag = gone.clone();
    // The driver reads and writes the connection's frames until it ends; the pool
    // forgets it then.
    tokio::task::spawn_local(async move {
        match driver.await {
            Ok(()) => tracing::debug!("HTTP/2 upstream {url}: connection closed"),
            Err(e) => tracing::debug!("HTTP/2 upstream {url}: connection ended: {e}"),
        }
        flag.set(true);
    });
    let pooled = Pooled {
        send,
        open: Rc::new(Cell::new(0)),
        gone,
        idle_since: Rc::new(Cell::new(Instant::now())),
        _counted: fds::count(fds::Kind::Upstream),
    };
    let (send, l) = lease(&pooled);
    CONNS.with(|c| {
        let mut c = c.borrow_mut();
        let list = c.entry(up.url.clone()).or_default();
        if list.len() < MAX_CONNS {
            list.push(pooled);
        }
        // Beyond the bound, the connection serves this stream only: its driver ends
        // once the stream and this handle are dropped.
    });
    Ok((send, l, true))
}

fn lease(p: &Pooled) -> (SendRequest<Bytes>, Lease) {
    p.open.set(p.open.get() + 1);
    (p.send.clone(), Lease { open: p.open.clone(), idle_since: p.idle_since.clone() })
}

/// Forgets every connection of `url` (the upstream failed).
pub(super) fn forget(url: &str) {
    CONNS.with(|c| c.borrow_mut().remove(url));
}

/// The HTTP/2 request for `fwd`: its method and target, the fields
/// `headers::request_fields` gives the HTTP/1.1 head (so every header rule is the
/// same), Host made `:authority` (`host` as the rule chose it), the framing and
/// connection fields dropped (HTTP/2 frames the body; it has no such fields), `te:
/// trailers` when the client sent it (gRPC servers ask for it).
fn request_of(
    fwd: &Forwarding,
    fields: &[(String, String)],
    host: &str,
    scheme: &str,
    te_trailers: bool,
) -> Result<http::Request<()>, &'static str> {
    const CONNECTION: [&str; 6] =
        ["transfer-encoding", "connection", "upgrade", "keep-alive", "proxy-connection", "te"];
    let mut map = http::HeaderMap::with_capacity(fields.len() + 8);
    let mut authority = String::new();
    let mut bad = None;
    headers::request_fields(fwd, fields, host, &mut |name, value| {
        if name.eq_ignore_ascii_case("host") {
            authority = value.to_string();
            return;
        }
        if CONNECTION.iter().any(|n| name.eq_ignore_ascii_case(n)) {
            return;
        }
        match (http::HeaderName::from_bytes(name.as_bytes()), http::HeaderValue::from_bytes(value.as_bytes())) {
            (Ok(n), Ok(v)) => {
                map.append(n, v);
            }
            (Err(_), _) => bad = bad.or(Some("a field name is not valid")),
            (_, Err(_)) => bad = bad.or(Some("a field value is not valid")),
        }
    });
    if let Some(why) = bad {
        return Err(why);
    }
    if te_trailers {
        map.insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    }
    let uri = http::Uri::builder()
        .scheme(scheme)
        .authority(authority)
        .path_and_query(&*headers::request_target(fwd))
        .build()
        .map_err(|_| "the target or Host is not a valid URI")?;
    let method = http::Method::from_bytes(fwd.method.as_bytes()).map_err(|_| "the method is not valid")?;
    let mut req = http::Request::builder().method(method).uri(uri).body(()).map_err(|_| "invalid request")?;
    *req.headers_mut() = map;
    Ok(req)
}

/// Whether the client's `te` fields name `trailers`.
fn asks_trailers(fields: &[(String, String)]) -> bool {
    fields
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("te"))
        .flat_map(|(_, v)| v.split(','))
        .any(|t| t.trim().split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("trailers")))
}

/// The parts of an upstream's answer head as the rest of the proxy reads one
/// (`parse::Head`): status, fields, and the framing (none when the stream ended
/// with its head, a length when the upstream gave a valid one, else unknown).
fn head_of(parts: &http::response::Parts, ended: bool, method: &str) -> Head {
    let fields: Vec<_> = parts
        .headers
        .iter()
        .map(|(n, v)| {
            let value = match v.to_str() {
                Ok(v) => v.to_string(),
                Err(_) => String::from_utf8_lossy(v.as_bytes()).into_owned(),
            };
            (crate::handler::response::field_name(n.as_str()), value)
        })
        .collect();
    let length = parts.headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let status = parts.status.as_u16();
    let framing = match length {
        _ if ended || method == "HEAD" || status == 204 || status == 304 => Framing::None,
        Some(n) => Framing::Length(n),
        None => Framing::Chunked,
    };
    Head { status, version: "2", fields, framing, reusable: true }
}

/// The failure of an h2 error: a reset (RST_STREAM) or GOAWAY the upstream sent,
/// a protocol fault, or the connection's I/O.
fn h2_failure(url: &str, e: &h2::Error, what: &str) -> Failure {
    let detail = match e.reason() {
        Some(r) if e.is_remote() && e.is_reset() => format!("{what}: the upstream reset the stream ({r})"),
        Some(r) if e.is_remote() && e.is_go_away() => {
            format!("{what}: the upstream closed the connection (GOAWAY {r})")
        }
        // This side's GOAWAY or reset: the upstream broke the protocol (an endless
        // header block, DATA past its window, ...).
        Some(r) if !e.is_remote() => format!("{what}: the upstream broke HTTP/2 ({r:?}: {r})"),
        _ => format!("{what}: {e}"),
    };
    let kind = match e.reason() {
        Some(
            h2::Reason::PROTOCOL_ERROR
            | h2::Reason::COMPRESSION_ERROR
            | h2::Reason::FRAME_SIZE_ERROR
            | h2::Reason::FLOW_CONTROL_ERROR
            | h2::Reason::ENHANCE_YOUR_CALM,
        ) if !e.is_remote() => FailureKind::Invalid,
        _ => FailureKind::Closed,
    };
    Failure { status: Status::BAD_GATEWAY, kind, upstream: url.to_string(), detail }
}

/// Sends some of `to_up` as the stream's flow control allows, once it allows any;
/// returns how many bytes left (taken off `to_up`).
///
/// # Cancel safety
/// Cancel-safe: bytes are taken only in the poll that sends them.
async fn send_some(s: &mut SendStream<Bytes>, to_up: &mut Vec<u8>) -> Result<usize, h2::Error> {
    s.reserve_capacity(to_up.len());
    loop {
        let room = s.capacity();
        if room > 0 {
            let n = room.min(to_up.len());
            s.send_data(Bytes::copy_from_slice(&to_up[..n]), false)?;
            to_up.drain(..n);
            return Ok(n);
        }
        match std::future::poll_fn(|cx| s.poll_capacity(cx)).await {
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e),
            None => return Err(h2::Error::from(h2::Reason::STREAM_CLOSED)),
        }
    }
}

/// The client side of a request body in flight: bytes read from the client and
/// not yet sent upstream (one client read at most), and whether more may come.
struct Upload {
    to_up: Vec<u8>,
    open: bool,
    /// The upstream's side was ended (END_STREAM sent).
    ended: bool,
    allowed: u64,
}

/// What woke the exchange.
enum Event<T, E> {
    Upstream(T),
    Client(Result<bool, BodyError<E>>),
    Sent(Result<usize, h2::Error>),
    Timer,
}

/// A stream's request body side, moved along with the answer.
struct Uploading {
    stream: SendStream<Bytes>,
    up: Upload,
    inbox: Vec<u8>,
}

impl Uploading {
    /// Takes what the client sent (`Ok(true)`: a piece, or the end), ending the
    /// upstream's side with the client's. An `Err` is the request body's failure.
    fn took<E>(&mut self, r: Result<bool, BodyError<E>>) -> Result<(), BodyError<E>> {
        let more = r?;
        if self.inbox.len() as u64 > self.up.allowed {
            return Err(BodyError::Refused(Status::PAYLOAD_TOO_LARGE, "request body exceeds max_body_bytes"));
        }
        self.up.allowed -= self.inbox.len() as u64;
        std::mem::swap(&mut self.up.to_up, &mut self.inbox);
        self.inbox.clear();
        if !more {
            self.up.open = false;
        }
        self.end_if_done();
        Ok(())
    }

    /// Ends the upstream's side once the client's has ended and all of it was sent.
    fn end_if_done(&mut self) {
        if !self.up.open && self.up.to_up.is_empty() && !self.up.ended {
            // A stream the upstream closed already has its side ended too.
            let _ = self.stream.send_data(Bytes::new(), true);
            self.up.ended = true;
        }
    }

    /// The upstream's side failed (`e`): nothing more of the body goes.
    fn stopped(&mut self, e: &h2::Error, fwd: &Forwarding) {
        tracing::debug!("proxy {} {}: the request body stopped: {e}", fwd.method, fwd.target);
        self.up = Upload { to_up: Vec::new(), open: false, ended: true, allowed: 0 };
    }

    fn wants_client(&self) -> bool {
        self.up.open && self.up.to_up.is_empty()
    }
}

/// Forwards `req` to the HTTP/2 upstreams of `rule` over `d`, the cache's
/// `pending` deciding what is stored.
///
/// # Cancel safety
/// Dropped at any await (the client gone), it resets the upstream stream (the
/// `h2` crate sends RST_STREAM CANCEL for a stream whose handles are dropped).
#[allow(clippy::too_many_arguments)] // one forward's parts, each used once
pub(super) async fn forward<D: Downstream>(
    rule: &Rule,
    fwd: Forwarding,
    fields: Vec<(String, String)>,
    max_body: u64,
    pending: Pending,
    req: &Request,
    d: &mut D,
    added: &Added,
) -> Outcome<D::Error> {
    let failed_status = pending.failed_status();
    let url0 = rule.upstreams.first().map_or_else(String::new, |u| u.url.clone());
    let fail = |status, kind, url: &str, detail: String| Failure { status, kind, upstream: url.to_string(), detail };
    if fwd.upgrade.is_some() {
        let f = fail(
            Status::BAD_GATEWAY,
            FailureKind::Invalid,
            &url0,
            "a tunnel (WebSocket) needs an HTTP/1.1 upstream".into(),
        );
        return refused(f, req, failed_status);
    }
    let has_body = fwd.body.is_some();
    let te = asks_trailers(&fields);
    let mut tried = Vec::new();
    let mut last: Option<Failure> = None;
    let mut retried_stale = false;
    let duplex = d.duplex();
    let read_timeout = rule.timeouts.read;
    // An attempt: an upstream, a connection with room, the request's head sent, the
    // response's head received. As the HTTP/1.1 exchange does, a request without a
    // body whose connection failed before any answer is made again when nothing of
    // it could have been acted on: it is idempotent, or the upstream said it never
    // processed it (a GOAWAY below its stream, REFUSED_STREAM). A pooled connection
    // the upstream had closed meanwhile is not held against the upstream.
    let (index, mut uploading, head, lease, attempt_at) = 'attempt: loop {
        let Some(i) = pool::pick(rule, &tried) else {
            let f = last.take().unwrap_or_else(|| pool::none_left(rule, &url0));
            return match pending.on_failure(&f, req) {
                Some(stale) => answer(stale, true),
                None => refused(f, req, failed_status),
            };
        };
        let up = &rule.upstreams[i];
        let attempt_at = Instant::now();
        fwd.notes.with(|n| n.upstream.push(Attempt { addr: up.address(), ..Attempt::default() }));
        let (send, lease, fresh) = match connection(rule, up).await {
            Ok(c) => c,
            Err(e) => {
                tried.push(i);
                last = Some(connect_failed(rule, up, &fwd, e));
                continue;
            }
        };
        note_attempt(&fwd, |a| a.connect = Some(if fresh { attempt_at.elapsed() } else { Duration::ZERO }));
        let host = host_for(rule, up, fwd.authority.as_deref());
        let scheme = if up.tls { "https" } else { "http" };
        let request = match request_of(&fwd, &fields, host, scheme, te) {
            Ok(r) => r,
            Err(why) => {
                let f = fail(Status::BAD_GATEWAY, FailureKind::Send, &up.url, format!("sending the request: {why}"));
                return refused(f, req, failed_status);
            }
        };
        let ready = tokio::time::timeout(rule.timeouts.send, send.ready()).await;
        let sent = match ready {
            Ok(Ok(mut send)) => send.send_request(request, !has_body),
            Ok(Err(e)) => Err(e),
            Err(_) => {
                // The connection's streams are all taken (a limit lowered meanwhile): another.
                tried.push(i);
                last = Some(timed_out(up, "waiting for a free stream"));
                continue;
            }
        };
        let (send_stream, response_future) = match sent {
            Ok((response, stream)) => (stream, response),
            Err(e) => {
                // The connection went away before the stream was opened: nothing was
                // sent; the next connection (or upstream) may take it.
                let f = h2_failure(&up.url, &e, "opening a stream");
                tracing::info!("proxy {} {}: {f}; trying again", fwd.method, fwd.target);
                forget(&up.url);
                if !fresh {
                    // A pooled connection the upstream had closed: try once more on a new one.
                    continue;
                }
                tried.push(i);
                mark_failed(rule, up, &f);
                last = Some(f);
                continue;
            }
        };
        let first = if has_body { d.body_at_hand() } else { Vec::new() };
        let mut uploading = Uploading {
            stream: send_stream,
            up: Upload { to_up: Vec::new(), open: has_body, ended: !has_body, allowed: max_body },
            inbox: first,
        };
        if has_body {
            let at_hand = !uploading.inbox.is_empty();
            // What the codec had at hand is the start of the body; more follows.
            if at_hand {
                if let Err(e) = uploading.took::<D::Error>(Ok(true)) {
                    return body_refused(e, up, req, failed_status);
                }
            }
        }
        // An HTTP/1.1 client's body goes whole first (its codec reads one thing at a time).
        let mut response_future = std::pin::pin!(response_future);
        let mut deadline = Instant::now() + read_timeout;
        let head = loop {
            let event = tokio::select! {
                r = &mut response_future, if duplex || !uploading.up.open && uploading.up.to_up.is_empty() => Event::Upstream(r),
                r = d.read_body(&mut uploading.inbox), if uploading.wants_client() => Event::Client(r),
                r = send_some(&mut uploading.stream, &mut uploading.up.to_up), if !uploading.up.to_up.is_empty() => Event::Sent(r),
                () = tokio::time::sleep_until(deadline.into()) => Event::Timer,
            };
            match event {
                Event::Upstream(Ok(r)) => break r,
                Event::Upstream(Err(e)) => {
                    let f = h2_failure(&up.url, &e, "waiting for the response head");
                    note_attempt(&fwd, |a| (a.status, a.response) = (Some(f.status.0), Some(attempt_at.elapsed())));
                    let unprocessed =
                        e.is_remote() && (e.is_go_away() || e.reason() == Some(h2::Reason::REFUSED_STREAM));
                    // A pooled connection that ended (closed, GOAWAY, a fault of another of its
                    // streams) took this request down with it: once, a new connection to the same
                    // upstream; a quiet close says nothing against the upstream.
                    let stale = !fresh && !e.is_reset() && !retried_stale;
                    // Nor is a reset (the upstream's answer) a fault of the upstream.
                    let blameless = e.is_reset() || stale && e.is_io();
                    if !blameless {
                        mark_failed(rule, up, &f);
                    }
                    if stale {
                        retried_stale = true;
                        forget(&up.url);
                    } else {
                        tried.push(i);
                    }
                    // A reset other than REFUSED_STREAM is the upstream's answer to this request.
                    if !has_body && (unprocessed || idempotent(&fwd.method) && !e.is_reset()) {
                        tracing::info!("proxy {} {}: {f}; trying again", fwd.method, fwd.target);
                        last = Some(f);
                        continue 'attempt;
                    }
                    return match pending.on_failure(&f, req) {
                        Some(stale) => answer(stale, true),
                        None => refused(f, req, failed_status),
                    };
                }
                Event::Client(r) => {
                    if let Err(e) = uploading.took(r) {
                        return body_refused(e, up, req, failed_status);
                    }
                }
                Event::Sent(Ok(_)) => {
                    uploading.end_if_done();
                    deadline = Instant::now() + read_timeout;
                }
                // The upstream may have answered already (and reset the rest): its answer comes next.
                Event::Sent(Err(e)) => uploading.stopped(&e, &fwd),
                Event::Timer => {
                    let f = timed_out(up, "waiting for the response head");
                    note_attempt(&fwd, |a| (a.status, a.response) = (Some(f.status.0), Some(attempt_at.elapsed())));
                    mark_failed(rule, up, &f);
                    return refused(f, req, failed_status);
                }
            }
        };
        break 'attempt (i, uploading, head, lease, attempt_at);
    };
    let up = &rule.upstreams[index];
    pool::succeeded(&up.url);
    let (parts, mut body) = head.into_parts();
    let method = fwd.method.clone();
    let mut head = head_of(&parts, body.is_end_stream(), &method);
    metrics::answered(&up.url, attempt_at.elapsed());
    note_attempt(&fwd, |a| (a.status, a.header) = (Some(head.status), Some(attempt_at.elapsed())));
    if let Some(mut a) = super::control::accel(rule, &mut head, req) {
        added.apply(&mut a.fields);
        return Outcome::Answer { answer: crate::handler::downstream::Answer::Accel(Box::new(a)), from_cache: false };
    }
    let (mut cache_status, mut store) = match pending.on_head(&head, req).await {
        Next::Answer(response) => return answer(response, true),
        Next::Pass(status, store) => (status, store),
    };
    cached::note(rule, req, &cache_status);
    let status = head.status;
    let len = match head.framing {
        Framing::None => {
            commit_before_head(&mut store, &mut cache_status).await;
            let fields = client_fields(&mut head, &cache_status);
            note_attempt(&fwd, |a| a.response = Some(attempt_at.elapsed()));
            let response = Response { status: Status(status), headers: fields, body: Body::Empty, refused: None };
            drop(lease);
            return answer(response, false);
        }
        Framing::Length(n) => Some(n),
        _ => None,
    };
    let mut fields = client_fields(&mut head, &cache_status);
    added.apply(&mut fields);
    let response = Response { status: Status(status), headers: fields, body: Body::Empty, refused: None };
    // A body of announced length ends with its last byte; trailers may still follow
    // it from an HTTP/2 upstream, so a client that takes trailers learns the length
    // from the Content-Length field only and the end from the upstream's.
    let announced = if d.sends_trailers() { None } else { len };
    let head_sent = d.send_head(response, announced, &[], false, None).await;
    let answered = Instant::now();
    let streamed = |sent, end| Outcome::Streamed(Streamed { status, answered, sent, path: BodyPath::Copy, end });
    if let Err(e) = head_sent {
        return streamed(0, StreamEnd::Client(e));
    }
    let mut sent = 0u64;
    let mut deadline = Instant::now() + read_timeout;
    // The body, while the request's goes on (a bidirectional call).
    let end = loop {
        let event = tokio::select! {
            r = body.data() => Event::Upstream(r),
            r = d.read_body(&mut uploading.inbox), if duplex && uploading.wants_client() => Event::Client(r),
            r = send_some(&mut uploading.stream, &mut uploading.up.to_up), if !uploading.up.to_up.is_empty() => Event::Sent(r),
            () = tokio::time::sleep_until(deadline.into()) => Event::Timer,
        };
        match event {
            Event::Upstream(Some(Ok(piece))) => {
                deadline = Instant::now() + read_timeout;
                if let Some(s) = store.as_mut() {
                    s.write(&piece);
                }
                metrics::body_bytes(BodyPath::Copy.label(), piece.len() as u64);
                if let Err(e) = d.send_body(&piece, false).await {
                    break StreamEnd::Client(e);
                }
                sent += piece.len() as u64;
                // Credit back only once the client took the piece.
                let _ = body.flow_control().release_capacity(piece.len());
            }
            Event::Upstream(None) => {
                let trailers = match body.trailers().await {
                    Ok(t) => t,
                    Err(e) => break cut(d, req, h2_failure(&up.url, &e, "reading the trailers"), sent),
                };
                let trailers: Vec<(String, String)> = trailers
                    .iter()
                    .flat_map(|t| t.iter())
                    .map(|(n, v)| (n.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
                    .collect();
                match trailers.is_empty() {
                    true => commit(&mut store).await,
                    // A body with trailers is not stored: the stored answer would lack them.
                    false => drop(store.take()),
                }
                let r =
                    if trailers.is_empty() { d.send_body(&[], true).await } else { d.send_trailers(trailers).await };
                break match r {
                    Ok(()) => StreamEnd::Complete,
                    Err(e) => StreamEnd::Client(e),
                };
            }
            Event::Upstream(Some(Err(e))) => {
                break cut(d, req, h2_failure(&up.url, &e, "reading the response body"), sent);
            }
            Event::Client(r) => match uploading.took(r) {
                Ok(()) => {}
                Err(BodyError::Client(e)) => break StreamEnd::Client(e),
                Err(BodyError::Refused(_, why)) => {
                    uploading.stream.send_reset(h2::Reason::CANCEL);
                    let f = fail(Status::BAD_REQUEST, FailureKind::RequestBody, &up.url, why.to_string());
                    break cut(d, req, f, sent);
                }
            },
            Event::Sent(Ok(_)) => uploading.end_if_done(),
            Event::Sent(Err(e)) => uploading.stopped(&e, &fwd),
            Event::Timer => break cut(d, req, timed_out(up, "reading the response body"), sent),
        }
    };
    note_attempt(&fwd, |a| a.response = Some(attempt_at.elapsed()));
    drop(lease);
    if matches!(end, StreamEnd::Cut(_)) {
        metrics::error(FailureKind::Body.label());
    }
    tracing::debug!("proxied \"{} {}\" over HTTP/2: {status} with {sent} body bytes", req.method, req.path);
    streamed(sent, end)
}

/// The answer to a request body refused (too large, malformed) or a client gone
/// before the head.
fn body_refused<E>(e: BodyError<E>, up: &Upstream, req: &Request, cache_status: String) -> Outcome<E> {
    match e {
        BodyError::Client(e) => Outcome::ClientGone(e),
        BodyError::Refused(status, why) => {
            let f = Failure { status, kind: FailureKind::RequestBody, upstream: up.url.clone(), detail: why.into() };
            refused(f, req, cache_status)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn te_trailers_is_seen() {
        let f = |v: &str| vec![("TE".to_string(), v.to_string())];
        for (v, want) in [("trailers", true), ("gzip, trailers", true), ("Trailers;q=1", true), ("gzip", false)] {
            assert_eq!(asks_trailers(&f(v)), want, "{v}");
        }
        assert!(!asks_trailers(&[]));
    }

    fn forwarding(method: &str, target: &str, authority: &str, body: Option<Option<u64>>) -> Forwarding {
        Forwarding {
            method: method.into(),
            target: target.into(),
            authority: Some(authority.into()),
            peer: std::net::IpAddr::from([192, 0, 2, 7]),
            version: "2",
            body,
            upgrade: None,
            request_id: "abc".into(),
            strip: None,
            control: Default::default(),
            notes: Default::default(),
            cache_key: None,
        }
    }

    #[test]
    fn forwarded_requests_become_http2_requests() {
        let client: Vec<(String, String)> = [
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("x-request-id", "client's"),
            ("connection", "x-hop"),
            ("x-hop", "1"),
            ("x-app", "kept"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
        let fwd = forwarding("POST", "/pkg.Svc/Call?x=1", "api.test:8443", Some(None));
        let r = request_of(&fwd, &client, "api.test:8443", "http", true).ok();
        let r = r.as_ref().map(|r| {
            let field = |n: &str| r.headers().get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
            (
                r.method().as_str().to_string(),
                r.uri().to_string(),
                field("content-type"),
                field("te"),
                field("x-request-id"),
                field("x-app"),
                field("via"),
                ["transfer-encoding", "host", "connection", "x-hop"].iter().any(|n| r.headers().contains_key(*n)),
            )
        });
        let some = |s: &str| Some(s.to_string());
        assert_eq!(
            r,
            Some((
                "POST".into(),
                "http://api.test:8443/pkg.Svc/Call?x=1".into(),
                some("application/grpc"),
                some("trailers"),
                some("abc"),
                some("kept"),
                some("2 ktlsd"),
                false,
            ))
        );
        // A body of known length keeps its Content-Length; the prefix is taken off.
        let fwd = Forwarding { strip: Some("/api".into()), ..forwarding("PUT", "/api/x", "a", Some(Some(3))) };
        let r = request_of(&fwd, &[], "a", "https", false).ok();
        let r = r
            .map(|r| (r.uri().to_string(), r.headers().get("content-length").cloned(), r.headers().get("te").cloned()));
        assert_eq!(r, Some(("https://a/x".into(), Some(http::HeaderValue::from_static("3")), None)));
        assert!(request_of(&forwarding("GET", "/", "a b", None), &[], "a b", "http", false).is_err());
        assert!(request_of(&forwarding("G T", "/", "a", None), &[], "a", "http", false).is_err());
    }

    #[test]
    fn heads_are_framed() {
        let parts = |status: u16, length: Option<&str>| {
            let mut b = http::Response::builder().status(status);
            if let Some(l) = length {
                b = b.header("content-length", l);
            }
            b.body(()).map(|r| r.into_parts().0).ok()
        };
        for (status, length, ended, method, want) in [
            (200, Some("5"), false, "GET", Framing::Length(5)),
            (200, None, false, "POST", Framing::Chunked),
            (200, Some("x"), false, "GET", Framing::Chunked),
            (200, None, true, "POST", Framing::None),
            (200, Some("5"), false, "HEAD", Framing::None),
            (304, None, false, "GET", Framing::None),
        ] {
            let Some(p) = parts(status, length) else { panic!("parts") };
            assert_eq!(head_of(&p, ended, method).framing, want, "{status} {length:?} {ended} {method}");
        }
    }
}
