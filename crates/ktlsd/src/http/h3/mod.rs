//! HTTP/3 (RFC 9114) over a QUIC connection: each request stream is answered by
//! [`handler::handle`] with the same sites, host checks and responses as HTTP/1.1
//! and HTTP/2 (the pipeline, `handler::pipeline`), a forward running over the stream
//! ([`downstream`]), and logged as
//! `HTTP/3.0`. The server sends SETTINGS_ENABLE_CONNECT_PROTOCOL: an extended CONNECT
//! with `:protocol = websocket` (RFC 9220) reaches the pipeline as HTTP/2's does
//! (RFC 8441), and a `[[proxy]]` rule tunnels it over its stream.
//!
//! Why the framing and QPACK (RFC 9204) are the `h3` crate's rather than our own
//! codec, as HTTP/2's are: HTTP/2's own codec exists so that a DATA frame can be one
//! TLS record sent by `sendfile`. QUIC has no such path (every packet is sealed in
//! user space), so an HTTP/3 body is bytes in memory whatever the codec, and QPACK
//! and the mapping of requests onto QUIC streams are not what this server is about.
//! The crate is bounded here: the field section size (`max_header_bytes`), and the
//! streams a client may open are QUIC's limits, set by `crate::quic`.
//!
//! Bodies: a file range is read window by window ([`WINDOW`]) into a buffer that
//! becomes the `Bytes` handed to `send_data`, which returns once QUIC has taken it
//! within its flow-control and send windows: one window in flight per stream. A
//! window out of the page cache is read in off the event loop first, as on TCP.
//!
//! Not here: QUIC, its handshake, limits and keys (`crate::quic`), or what a
//! response says (`crate::handler`).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h3::error::{ConnectionError, StreamError};
use h3::quic::{BidiStream, Connection as QuicConnection, OpenStreams};
use h3::server::RequestStream;

use crate::files::residency::ColdReads;
use crate::files::FileRange;
use crate::handler::pipeline::{self, Decision, Handshake, Outcome, RequestBody, StreamEnd};
use crate::handler::request::Method;
use crate::handler::{self, Body, Response, Status};
use crate::http::conn::{http_date_now, Logged, Sent};
use crate::http::{fields, Context, End};
use crate::log::RequestLine;
use crate::vocab::RecordLayer;

mod downstream;

/// Limits of the HTTP/3 layer (the QUIC ones are `crate::quic`'s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Largest request field section, as QPACK decodes it (SETTINGS_MAX_FIELD_SECTION_SIZE).
    pub max_field_section: u64,
    /// Requests a client may cancel (reset or stop before their answer is sent) per
    /// [`FLOOD_WINDOW`] before the connection ends with H3_EXCESSIVE_LOAD: QUIC
    /// returns stream credit as streams close, so without it a client could open and
    /// cancel requests without end (HTTP/2's rapid reset). HTTP/2's `h2_max_resets`.
    pub max_resets: u32,
    /// Time a request stream may take to deliver its field section once opened.
    pub header_timeout: Duration,
    /// Time a response may make no progress (a client that keeps its flow-control
    /// window shut) before its stream is reset; the connection's other streams go on.
    pub send_timeout: Duration,
    /// Largest request body a `[[proxy]]` rule forwards (HTTP/1.1's `max_body_bytes`).
    pub max_body_bytes: u64,
}

/// Why a response was not sent whole.
#[derive(Debug, thiserror::Error)]
enum Unsent {
    #[error("{0}")]
    Stream(StreamError),
    #[error("no progress within the send timeout")]
    Stalled,
    /// A proxied body's upstream failed after the head.
    #[error("{0}")]
    Upstream(pipeline::Failure),
}

/// `op` within `limit`.
async fn within<T>(limit: Duration, op: impl Future<Output = Result<T, StreamError>>) -> Result<T, Unsent> {
    match tokio::time::timeout(limit, op).await {
        Ok(r) => r.map_err(Unsent::Stream),
        Err(_) => Err(Unsent::Stalled),
    }
}

/// The window over which cancelled requests are counted (as HTTP/2's flood limits are).
pub const FLOOD_WINDOW: Duration = Duration::from_secs(10);

/// Why an HTTP/3 connection failed.
#[derive(Debug, thiserror::Error)]
pub enum H3Error {
    #[error("{0}")]
    Connection(ConnectionError),
    /// More cancelled requests than [`Settings::max_resets`] in [`FLOOD_WINDOW`]: the
    /// connection was closed with H3_EXCESSIVE_LOAD.
    #[error("more than {0} requests cancelled within {FLOOD_WINDOW:?}")]
    Flood(u32),
}

/// Bytes of a file read into one buffer and handed to QUIC at once: large enough
/// that a window costs one `pread`, small enough that a stream holds little.
pub const WINDOW: usize = 64 * 1024;

/// How long a graceful close keeps taking requests after its first GOAWAY, before the
/// final one: the requests a client opened before the first GOAWAY reached it arrive
/// within a round trip, which on any working path is well under this. The h3 crate
/// offers no PING to measure it, so the wait is fixed (HTTP/2's ends at the ACK).
pub const GOAWAY_GRACE: Duration = Duration::from_secs(1);

/// How long a connection done with its requests after GOAWAY stays open before the
/// caller closes it: QUIC discards stream data not yet sent when the connection
/// closes, and the final GOAWAY (or the end of the last response) is written but
/// leaves only when the connection's driver next runs, which a few milliseconds
/// allow on any worker that is not stalled.
const CLOSE_FLUSH: Duration = Duration::from_millis(50);

/// How an HTTP/3 connection ended, or why it failed.
pub type H3End = End<H3Error>;

/// A request stream's task, borrowing the connection's context; true when the
/// client cancelled the request before its answer was sent.
type StreamTask<'a> = Pin<Box<dyn Future<Output = bool> + 'a>>;

/// Cancelled requests in the current [`FLOOD_WINDOW`].
struct Resets {
    since: Instant,
    count: u32,
}

impl Resets {
    /// Counts `n` more; true when the limit is passed.
    fn add(&mut self, n: u32, max: u32, now: Instant) -> bool {
        if now.duration_since(self.since) >= FLOOD_WINDOW {
            *self = Resets { since: now, count: 0 };
        }
        self.count = self.count.saturating_add(n);
        self.count > max
    }
}

/// Serves request streams on `conn` until the client closes it, it times out, or
/// the server stops: then the connection closes in RFC 9114 section 5.2's two steps.
/// A first GOAWAY with the largest id (2^62-4) tells the client to open no more
/// requests, those already on their way are still taken for [`GOAWAY_GRACE`], then
/// the final GOAWAY names the first request not taken (the one after the last taken,
/// or 0); the requests taken finish, and the connection ends. Before any request is
/// taken the h3 crate can announce no id above 0, so the first GOAWAY is left out
/// then, and requests are taken during the grace all the same.
///
/// # Cancel safety
/// Not cancel-safe: responses under way are cut off. The loop watches the shutdown
/// signal itself.
pub async fn serve<C>(conn: C, ctx: Context<'_, Settings>) -> H3End
where
    C: QuicConnection<Bytes>,
    <C as h3::quic::OpenStreams<Bytes>>::BidiStream: BidiStream<Bytes>,
{
    // Closes the connection with a code of ours (the crate's own close on drop says H3_NO_ERROR).
    let mut closer = conn.opener();
    let mut builder = h3::server::builder();
    // SETTINGS_ENABLE_CONNECT_PROTOCOL: a WebSocket may come as an extended CONNECT (RFC 9220).
    builder.max_field_section_size(ctx.settings.max_field_section).enable_extended_connect(true);
    let mut h3: h3::server::Connection<C, Bytes> = match builder.build(conn).await {
        Ok(c) => c,
        Err(e) => return ended(e),
    };
    let ctx = &ctx;
    let mut streams: Vec<StreamTask<'_>> = Vec::new();
    let mut stop = ctx.shutdown.clone();
    // The final GOAWAY is sent: no request is taken any more.
    let mut going_away = false;
    // Between the two GOAWAYs: until when requests are still taken.
    let mut grace: Option<tokio::time::Instant> = None;
    let mut taken_any = false;
    let mut resets = Resets { since: Instant::now(), count: 0 };
    let mut cancelled = 0;
    loop {
        if resets.add(std::mem::take(&mut cancelled), ctx.settings.max_resets, Instant::now()) {
            tracing::info!(
                "HTTP/3 client {} cancelled over {} requests in {FLOOD_WINDOW:?}",
                ctx.peer,
                ctx.settings.max_resets
            );
            closer.close(h3::error::Code::H3_EXCESSIVE_LOAD, b"too many cancelled requests");
            return End::Error(H3Error::Flood(ctx.settings.max_resets));
        }
        if going_away && streams.is_empty() {
            tokio::time::sleep(CLOSE_FLUSH).await;
            return End::Done;
        }
        let accepted = tokio::select! {
            r = h3.accept(), if !going_away => r,
            () = drive(&mut streams, &mut cancelled), if !streams.is_empty() => continue,
            _ = stop.wait_for(|s| *s), if !going_away && grace.is_none() => {
                grace = Some(tokio::time::Instant::now() + GOAWAY_GRACE);
                // The largest id: `shutdown` adds its count to the last request taken.
                if taken_any {
                    goaway(&mut h3, usize::MAX, ctx).await;
                }
                continue;
            }
            () = tokio::time::sleep_until(grace.unwrap_or_else(tokio::time::Instant::now)), if grace.is_some() => {
                (grace, going_away) = (None, true);
                // The id after the last request taken (0 if none): requests from it on were not.
                goaway(&mut h3, 1, ctx).await;
                continue;
            }
        };
        taken_any |= matches!(accepted, Ok(Some(_)));
        match accepted {
            Ok(Some(resolver)) => streams.push(Box::pin(async move {
                match tokio::time::timeout(ctx.settings.header_timeout, resolver.resolve_request()).await {
                    Ok(Ok((request, stream))) => answer(request, stream, ctx).await,
                    // The crate has reset the stream (or closed the connection) with the RFC's code.
                    Ok(Err(e)) => {
                        tracing::debug!("HTTP/3 request from {} refused: {e}", ctx.peer);
                        matches!(e, StreamError::RemoteTerminate { .. })
                    }
                    // Dropping the stream resets it.
                    Err(_) => {
                        tracing::debug!("HTTP/3 request from {} incomplete after the header timeout", ctx.peer);
                        false
                    }
                }
            })),
            Ok(None) => going_away = true,
            Err(e) => {
                // The connection is gone: streams under way end at once, and are logged.
                while !streams.is_empty() {
                    drive(&mut streams, &mut cancelled).await;
                }
                return ended(e);
            }
        }
    }
}

/// Sends GOAWAY naming the request `after` requests past the last one taken (the
/// h3 crate's count; 0 when none was taken), as [`serve`] closes.
async fn goaway<C>(h3: &mut h3::server::Connection<C, Bytes>, after: usize, ctx: &Context<'_, Settings>)
where
    C: QuicConnection<Bytes>,
{
    if let Err(e) = h3.shutdown(after).await {
        tracing::debug!("HTTP/3 GOAWAY to {} failed: {e}", ctx.peer);
    }
}

/// Polls every stream task, dropping those done (counting in `cancelled` those the
/// client cancelled); ready once none is left.
///
/// # Cancel safety
/// Cancel-safe: the tasks stay in `streams`, each where it was.
async fn drive(streams: &mut Vec<StreamTask<'_>>, cancelled: &mut u32) {
    std::future::poll_fn(move |cx| {
        streams.retain_mut(|s| match s.as_mut().poll(cx) {
            Poll::Ready(reset) => {
                *cancelled += u32::from(reset);
                false
            }
            Poll::Pending => true,
        });
        if streams.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
}

/// What a connection error means for the caller's counters.
fn ended(e: ConnectionError) -> H3End {
    match e {
        e if e.is_h3_no_error() => End::Done,
        ConnectionError::Timeout { .. } => End::Timeout,
        ConnectionError::Remote { 0: h3::quic::ConnectionErrorIncoming::Timeout, .. } => End::Timeout,
        // The client closed the connection (with an error code of its own).
        ConnectionError::Remote { 0: h3::quic::ConnectionErrorIncoming::ApplicationClose { .. }, .. } => End::Done,
        e => End::Error(H3Error::Connection(e)),
    }
}

/// Answers one request on its stream and logs it; true when the client cancelled
/// it (reset the stream or stopped reading) before the answer was complete.
async fn answer<S>(request: http::Request<()>, mut stream: RequestStream<S, Bytes>, ctx: &Context<'_, Settings>) -> bool
where
    S: BidiStream<Bytes>,
{
    let started = Instant::now();
    let method_token = request.method().as_str().to_string();
    let target = request.uri().path_and_query().map_or_else(String::new, |p| p.as_str().to_string());
    let head = fields::parse(fields(&request));
    let is_head = method_token == "HEAD";
    let (parsed, forwarded) = match head
        .as_ref()
        .map_err(|e| format!("{e:?}"))
        .and_then(|h| fields::to_request(h, ctx.peer.ip()).map(|req| (h, req)).map_err(str::to_string))
    {
        Ok((head, req)) => match pipeline::Exchange::begin(req, &ctx.sites, Handshake::Quic) {
            Ok(x) => {
                let forwarded = through(&x, head, &mut stream, ctx).await;
                (Some(x.req), forwarded)
            }
            Err((req, response)) => (Some(req), Forwarded::Answer(response, false)),
        },
        Err(why) => {
            let mut response = handler::refusal(Status::BAD_REQUEST, &ctx.sites.default, is_head);
            response.refused = Some(format!("malformed request: {why}").into());
            (None, Forwarded::Answer(response, false))
        }
    };
    let host = parsed.as_ref().and_then(|r| r.authority.clone());
    let client = parsed.as_ref().and_then(|r| r.client);
    let notes = parsed.as_ref().map(|r| r.notes.clone());
    let method = parsed.map_or_else(|| Method::from_token(&method_token), |r| r.method);
    let mut hit = false;
    let (status, ttfb, result) = match forwarded {
        Forwarded::Answer(mut response, from_cache) => {
            if let Some(why) = &response.refused {
                tracing::info!("refused {} \"{method} {target} HTTP/3.0\": {} {why}", ctx.peer, response.status.0);
            }
            let ttfb = started.elapsed();
            let body = std::mem::replace(&mut response.body, Body::Empty);
            hit = from_cache && matches!(body, Body::File { .. });
            (response.status.0, ttfb, send(&mut stream, &response, body, ctx.settings.send_timeout).await)
        }
        Forwarded::Streamed { status, answered, sent } => (status, answered.duration_since(started), sent),
    };
    let (sent, cancelled) = match result {
        Ok(n) => (n, false),
        // The forward logged why, and reset the stream.
        Err((n, Unsent::Upstream(_))) => (n, false),
        Err((n, e)) => {
            tracing::debug!("HTTP/3 response to {} \"{method} {target}\" cut short after {n} bytes: {e}", ctx.peer);
            if matches!(e, Unsent::Stalled) {
                stream.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
            }
            (n, matches!(e, Unsent::Stream(StreamError::RemoteTerminate { .. })))
        }
    };
    if hit {
        pipeline::hit_bytes(crate::vocab::BodyPath::Copy, sent);
    }
    let text = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
    let line = RequestLine { method: &method, target: &target, version: "HTTP/3.0" };
    let logged =
        Logged { line, referer: text("referer"), user_agent: text("user-agent"), client, notes: notes.as_ref() };
    let sent = Sent { status, bytes: sent, started, ttfb, body: Some(crate::vocab::BodyPath::Copy) };
    ctx.log_over(RecordLayer::Quic, None, None, Some(logged), sent, host.as_deref());
    cancelled
}

/// The request's pseudo-header and regular fields, as HTTP/2's message rules check
/// them: an extended CONNECT's `:protocol` (RFC 9220) is the h3 crate's
/// [`h3::ext::Protocol`] extension, which the same rules take as HTTP/2's.
fn fields(request: &http::Request<()>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let uri = request.uri();
    let mut fields = vec![(b":method".to_vec(), request.method().as_str().as_bytes().to_vec())];
    let protocol = request.extensions().get::<h3::ext::Protocol>();
    let pseudo = [
        (&b":scheme"[..], uri.scheme_str()),
        (b":authority", uri.authority().map(|a| a.as_str())),
        (b":path", uri.path_and_query().map(|p| p.as_str())),
        (b":protocol", protocol.map(|p| p.as_str())),
    ];
    fields.extend(pseudo.into_iter().filter_map(|(n, v)| Some((n.to_vec(), v?.as_bytes().to_vec()))));
    fields.extend(request.headers().iter().map(|(n, v)| (n.as_str().as_bytes().to_vec(), v.as_bytes().to_vec())));
    fields
}

/// How [`answer`]'s request was answered.
#[allow(clippy::large_enum_variant)] // one per request, moved once
enum Forwarded {
    /// A response for the caller to send as any other; `bool`: a file body is a
    /// cache entry's.
    Answer(Response, bool),
    /// The upstream's response went out: its status, when its head was sent, and the
    /// body bytes sent or why it was cut after how many.
    Streamed { status: u16, answered: Instant, sent: Result<u64, (u64, Unsent)> },
}

/// The pipeline's phases and route for `x` (read from `head`), a forward run over
/// `stream`.
///
/// # Cancel safety
/// Not cancel-safe: dropped mid-way (the connection gone), a forward is abandoned
/// as `Forward::run` says.
async fn through<S: BidiStream<Bytes>>(
    x: &pipeline::Exchange<'_>,
    head: &fields::RequestHead,
    stream: &mut RequestStream<S, Bytes>,
    ctx: &Context<'_, Settings>,
) -> Forwarded {
    // A stream's end says where its body ends, but not ahead of it: without a
    // content-length, the methods that carry none by custom send none.
    let body = match head.content_length {
        Some(0) => RequestBody::None,
        Some(n) => RequestBody::Length(n),
        None if matches!(x.req.method, Method::Get | Method::Head | Method::Options | Method::Delete) => {
            RequestBody::None
        }
        None => RequestBody::Unknown,
    };
    let max_body = ctx.settings.max_body_bytes;
    let forward = match x.decide(body, max_body, || head.upstreamed("3", body)).await {
        Decision::Respond(response) | Decision::Static(response) => return Forwarded::Answer(response, false),
        Decision::Forward(forward) => forward.with_cache(&ctx.sites),
    };
    // A tunnel ends after a grace once the connection is retired (a reload, a stop).
    let retired = x.req.upgrade.is_some().then(|| ctx.shutdown.clone());
    let mut d = downstream::Stream { stream, settings: ctx.settings, retired };
    match forward.run(&x.req, &mut d).await {
        Outcome::Answer { answer, from_cache } => Forwarded::Answer(x.finish(answer), from_cache),
        Outcome::Streamed(s) => {
            let sent = match s.end {
                StreamEnd::Complete => Ok(s.sent),
                StreamEnd::Cut(f) => Err((s.sent, Unsent::Upstream(f))),
                StreamEnd::Client(e) => Err((s.sent, e)),
            };
            Forwarded::Streamed { status: s.status, answered: s.answered, sent }
        }
        Outcome::ClientGone(e) => Forwarded::Streamed { status: 400, answered: Instant::now(), sent: Err((0, e)) },
    }
}

/// Sends the head, then the body, then ends the stream, each step within `limit`;
/// returns the body bytes sent, also when it fails part-way (with the reason).
async fn send<S>(
    stream: &mut RequestStream<S, Bytes>,
    response: &Response,
    body: Body,
    limit: Duration,
) -> Result<u64, (u64, Unsent)>
where
    S: BidiStream<Bytes>,
{
    within(limit, stream.send_response(head(response))).await.map_err(|e| (0, e))?;
    let sent = match body {
        Body::Empty => 0,
        Body::Bytes(b) if b.is_empty() => 0,
        Body::Bytes(b) => {
            let n = b.len() as u64;
            within(limit, stream.send_data(Bytes::from(b))).await.map_err(|e| (0, e))?;
            n
        }
        Body::File { found, range } => send_file(stream, &found.body(range), limit).await?,
        // Several ranges: each part's delimiter and bytes in turn.
        Body::Parts { found, parts } => {
            let mut n = 0;
            for part in &parts {
                n += match part {
                    handler::Part::Bytes(b) => {
                        within(limit, stream.send_data(Bytes::copy_from_slice(b))).await.map_err(|e| (n, e))?;
                        b.len() as u64
                    }
                    handler::Part::File(range) => {
                        send_file(stream, &found.body(range.clone()), limit).await.map_err(|(k, e)| (n + k, e))?
                    }
                };
            }
            n
        }
    };
    within(limit, stream.finish()).await.map_err(|e| (sent, e))?;
    Ok(sent)
}

/// Sends a file range one [`WINDOW`] at a time, each within `limit`.
async fn send_file<S>(
    stream: &mut RequestStream<S, Bytes>,
    body: &FileRange<'_>,
    limit: Duration,
) -> Result<u64, (u64, Unsent)>
where
    S: BidiStream<Bytes>,
{
    let mut cold = ColdReads::default();
    let mut offset = body.range.start;
    while offset < body.range.end {
        let n = usize::try_from(body.range.end - offset).unwrap_or(WINDOW).min(WINDOW);
        let sent = offset - body.range.start;
        let window = match read_window(&mut cold, body, offset, n).await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!("HTTP/3 body read failed at offset {offset}: {e}; the stream is reset");
                stream.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
                return Ok(sent);
            }
        };
        within(limit, stream.send_data(window)).await.map_err(|e| (sent, e))?;
        offset += n as u64;
    }
    Ok(body.len())
}

/// `n` bytes of the file at `offset`: from the open-file cache's copy when it
/// holds them, else read (off the loop when the window is cold).
async fn read_window(cold: &mut ColdReads, body: &FileRange<'_>, offset: u64, n: usize) -> std::io::Result<Bytes> {
    if let Some(bytes) = body.cached_at(offset, n) {
        return Ok(Bytes::copy_from_slice(bytes));
    }
    let mut buf = vec![0u8; n];
    let mut filled = 0;
    while filled < n {
        match cold.read_at(body.file, &mut buf[filled..], offset + filled as u64, body.range.end).await? {
            0 => {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the file shrank while it was sent"))
            }
            r => filled += r,
        }
    }
    Ok(Bytes::from(buf))
}

/// The response head: status, Server, Date and the handler's fields (a field the
/// `http` crate cannot carry is left out and logged).
fn head(response: &Response) -> http::Response<()> {
    let mut out = interim_head(response);
    let headers = out.headers_mut();
    headers.insert(http::header::SERVER, http::HeaderValue::from_static("ktlsd"));
    if let Ok(date) = http::HeaderValue::from_str(&http_date_now()) {
        headers.insert(http::header::DATE, date);
    }
    out
}

/// `response`'s status and own fields, without Server and Date: an interim (1xx)
/// response as it is, a final one's start.
fn interim_head(response: &Response) -> http::Response<()> {
    let mut out = http::Response::new(());
    *out.status_mut() =
        http::StatusCode::from_u16(response.status.0).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    let headers = out.headers_mut();
    for h in &response.headers {
        let value = h.to_string();
        match (http::HeaderName::from_bytes(h.name().as_bytes()), http::HeaderValue::from_str(&value)) {
            (Ok(name), Ok(value)) => {
                headers.append(name, value);
            }
            _ => tracing::warn!("HTTP/3: response field {}: {value:?} cannot be sent; left out", h.name()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancelled_requests_are_counted_per_window() {
        let t0 = Instant::now();
        let mut r = Resets { since: t0, count: 0 };
        // (cancelled now, at seconds, over the limit of 3)
        for (n, at, over) in [(2, 0, false), (1, 1, false), (1, 2, true), (3, 10, false), (1, 11, true)] {
            assert_eq!(r.add(n, 3, t0 + Duration::from_secs(at)), over, "{n} at {at}s");
        }
    }

    #[test]
    fn requests_are_checked_by_the_http2_message_rules() {
        let req = |uri: &str, host: Option<&str>| {
            let mut b = http::Request::builder().method("GET").uri(uri);
            if let Some(h) = host {
                b = b.header("host", h);
            }
            fields::parse(fields(&b.body(()).unwrap()))
        };
        let ok = req("https://a.example/f?x=1", None).unwrap();
        assert_eq!((ok.authority.as_deref(), ok.path.as_deref()), (Some("a.example"), Some("/f?x=1")));
        assert!(req("https://a.example/f", Some("b.example")).is_err(), "host must name :authority's host");
        assert!(req("https://a.example/f", Some("a.example")).is_ok());
        assert!(req("/f", None).is_err(), "no :scheme");
    }

    #[test]
    fn an_extended_connect_carries_its_protocol_as_http2s_does() {
        let connect = |method: &str, protocol: Option<h3::ext::Protocol>| {
            let mut r = http::Request::builder().method(method).uri("https://a.example/chat?x=1").body(()).unwrap();
            if let Some(p) = protocol {
                r.extensions_mut().insert(p);
            }
            fields::parse(fields(&r))
                .map_err(|e| format!("{e:?}"))
                .and_then(|h| fields::to_request(&h, std::net::Ipv4Addr::LOCALHOST.into()).map_err(str::to_string))
        };
        // (method, :protocol, the tunnel asked for or why the request is refused)
        let cases = [
            ("CONNECT", Some(h3::ext::Protocol::WEBSOCKET), Ok(Some("websocket"))),
            ("CONNECT", Some(h3::ext::Protocol::WEB_TRANSPORT), Err(":protocol other than websocket")),
            ("GET", Some(h3::ext::Protocol::WEBSOCKET), Err("MissingPseudo")),
            ("GET", None, Ok(None)),
        ];
        for (method, protocol, want) in cases {
            let got = connect(method, protocol);
            match (&got, want) {
                (Ok(req), Ok(upgrade)) => {
                    assert_eq!(req.upgrade.as_deref(), upgrade, "{method} {protocol:?}");
                    assert_eq!((req.path.as_str(), req.query.as_deref()), ("/chat", Some("x=1")));
                }
                (Err(why), Err(want)) => assert_eq!(why, want, "{method} {protocol:?}"),
                _ => panic!("{method} {protocol:?}: {:?}", got.as_ref().map(|r| r.upgrade.clone())),
            }
        }
    }
}
