//! One HTTP/2 connection's life over a [`Transport`]: bytes read are fed to the
//! codec, each request it reports is answered by [`handler::handle`], and the
//! frames it hands back are written, each DATA frame sized to one TLS record.
//!
//! The loop alternates: answer the codec's events, queue one of its writes, and
//! then look at the input once without waiting, so WINDOW_UPDATE and RST_STREAM
//! act between frames of a long download; when there is nothing more to write,
//! flush what was queued (the frames of every stream that had some, packed into as
//! few records and writes as the transport can) and wait for input (idle timeout
//! without streams, stall timeout with them). Proxied streams run as tasks of
//! their own (`super::proxy`); the loop also wakes when one of them has an answer
//! or body bytes for it, and takes them at the top of each turn.
//!
//! Not here: the frame rules (the codec), TLS, or what responses say.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::forwarded::{Signal, Step, Streamed};
use super::{BodySize, Connection, Event, Limits, RequestHead, StreamId, Write};
use crate::files::Found;
use crate::handler::pipeline::{self, Decision, Forward, Handshake, RequestBody};
use crate::handler::request::{Method, Request};
use crate::handler::{self, Body, Response, Site, Status};
use crate::http::conn::{http_date_now, with_http_date_now, Logged, Sent, Who};
use crate::http::{Context, End, Transport};
use crate::log::RequestLine;
use crate::vocab::BodyPath;

/// Limits and timeouts of the HTTP/2 codec.
#[derive(Debug, Clone)]
pub struct Settings {
    pub limits: Limits,
    /// How long a connection without open streams may wait for its next request.
    pub idle_timeout: Duration,
    /// How long a connection with open streams may make no progress (a peer that
    /// keeps its flow-control window shut, or a request body that stops).
    pub stall_timeout: Duration,
    /// Largest request body forwarded to an upstream (413 beyond).
    pub max_body_bytes: u64,
}

/// Bytes of frames written between two looks at the input while frames are ready:
/// a reset or a window update acts within this much, the interval at which a body
/// writer yields to the worker's other connections. A look that finds nothing
/// costs a timer (its read's time-out), and registering it wakes the worker's
/// event loop through its eventfd: looking after every frame cost one `write`
/// system call per response under `h2load -m32`.
const LOOK_EVERY: usize = 64 * 1024;

/// How long a graceful close waits for the ACK of the PING sent with its first
/// GOAWAY before it sends the final one: well above a round trip on any working
/// path (the ACK usually comes within milliseconds), and short enough that a client
/// that does not answer PINGs holds a retired connection at most this much longer.
const SHUTDOWN_ACK_WAIT: Duration = Duration::from_secs(1);

/// A response under way, kept until its last frame is sent (the file stays open).
struct Open {
    /// The client's address as the pipeline found it, for the access log.
    client: Who,
    /// The file and where the response's range starts in it.
    file: Option<(Found, u64)>,
    /// A body made of parts (of `file`, whose start is then 0); empty otherwise.
    parts: Vec<handler::Part>,
    method: Method,
    target: String,
    status: u16,
    sent: u64,
    started: Instant,
    /// From `started` until the response was handed to the codec.
    ttfb: Duration,
    referer: Option<String>,
    user_agent: Option<String>,
    /// The :authority, for the access log.
    host: Option<String>,
    /// How the body leaves, for the access log.
    body: Option<BodyPath>,
    /// The body is a cache entry's: its bytes count as cache-hit bytes.
    from_cache: bool,
    /// The upstream socket a proxied body is spliced from (`Write::SourceData`).
    source: Option<std::rc::Rc<std::os::fd::OwnedFd>>,
}

/// Serves streams on `conn` until the connection ends; when the context's shutdown turns true
/// the connection closes gracefully in RFC 9113's two steps (see `Connection::shutdown`):
/// GOAWAY with the largest stream id and a PING, then, at the PING's ACK or after
/// [`SHUTDOWN_ACK_WAIT`], the final GOAWAY; streams opened until then are served, and the
/// connection closes once they are done.
///
/// # Cancel safety
/// Not cancel-safe: a frame may be cut in the middle. The loop watches the
/// shutdown signal itself; callers do not need to race it.
pub async fn serve<T: Transport>(conn: &mut T, ctx: Context<'_, Settings>) -> End<T::Error> {
    let (settings, peer) = (ctx.settings, ctx.peer);
    let mut h2 = Connection::new(settings.limits.clone());
    let mut open: HashMap<StreamId, Open> = HashMap::new();
    // Proxied streams whose tasks are not done, and what wakes the loop for them.
    let mut proxied = HashMap::new();
    let signal = std::rc::Rc::new(Signal::default());
    if pipeline::forwards(&ctx.sites) {
        h2.deliver_bodies();
    }
    let mut buf: Vec<u8> = Vec::new();
    // When the graceful close began (GOAWAY sent), if it did.
    let mut going_away: Option<Instant> = None;
    // Bytes of frames handed to the transport since the input was last looked at.
    let mut since_look = 0usize;
    // One wait for shutdown for the connection's life (see h1's).
    let mut stop_rx = ctx.shutdown.clone();
    let stop = stop_rx.wait_for(|s| *s);
    tokio::pin!(stop);
    loop {
        if signal.take() {
            step_proxied(&mut h2, &mut open, &mut proxied, &ctx, conn);
        }
        while let Some(event) = h2.poll_event() {
            match event {
                Event::Request { stream, head, end_stream } => {
                    let started = Instant::now();
                    let decided = match crate::http::fields::to_request(&head, peer.ip()) {
                        Ok(req) => decide(req, &head, end_stream, &ctx, conn).await,
                        Err(why) => {
                            let mut r =
                                handler::refusal(Status::BAD_REQUEST, &ctx.sites.default, head.method == "HEAD");
                            r.refused = Some(why.into());
                            Decided::Answer(r, Who::peer(peer.ip()))
                        }
                    };
                    let (response, client) = match decided {
                        Decided::Answer(response, client) => (response, client),
                        Decided::Forward(forward, req, site) => {
                            let splice = conn.can_splice();
                            let task = super::forwarded::start(
                                forward,
                                req,
                                &head,
                                site,
                                end_stream,
                                splice,
                                started,
                                &signal,
                                &ctx.shutdown,
                            );
                            proxied.insert(stream, task);
                            continue;
                        }
                    };
                    answer(&mut h2, &mut open, stream, &head, &ctx, conn, response, None, false, started, client)
                }
                Event::Data { stream, data, end_stream } => {
                    // Queued for the stream's task, whose credit comes back as it takes
                    // them (`step_proxied`); bytes nobody reads are credited at once.
                    let dropped = match proxied.get_mut(&stream) {
                        Some(task) => task.data(data, end_stream),
                        None => data.len(),
                    };
                    h2.consumed(stream, dropped);
                }
                Event::HeaderListTooLarge { stream } => {
                    crate::log::refusal(431, "header list too large", || {
                        format!("refused {peer} stream {}: 431 header list too large", stream.0)
                    });
                    let fields =
                        [("server", "ktlsd".into()), ("date", http_date_now()), ("content-length", "0".into())];
                    let _ = h2.respond(stream, 431, fields, BodySize::None);
                }
                Event::Reset { stream, code } => {
                    // Its task, if any, is aborted.
                    proxied.remove(&stream);
                    if let Some(o) = open.remove(&stream) {
                        tracing::debug!("stream {} from {peer} reset ({code:?}) after {} bytes", stream.0, o.sent);
                        o.log(&ctx, conn);
                    }
                }
                Event::PeerGoAway { .. } => {}
                Event::ConnectionError { code } => {
                    tracing::info!("HTTP/2 connection with {peer} failed: {code:?}");
                    open.clear();
                    proxied.clear();
                }
            }
        }

        // A stream stalled on its own window is reset while the others go on.
        h2.reset_stalled(Instant::now(), settings.stall_timeout);
        if going_away.is_none() && ctx.stopping() {
            h2.shutdown();
            going_away = Some(Instant::now());
        }

        let max_payload = conn.next_record().saturating_sub(super::frame::HEADER_LEN).max(1);
        if let Some(write) = h2.poll_write(max_payload) {
            since_look += match &write {
                Write::Bytes(bytes) | Write::Data { bytes, .. } => bytes.len(),
                Write::FileData { head, len, .. } | Write::SourceData { head, len, .. } => head.len() + *len as usize,
            };
            let sent = match write {
                Write::Bytes(bytes) => conn.queue(&bytes, None).await.map(|_| ()),
                Write::FileData { stream, head, offset, len, end_stream } => {
                    let Some(o) = open.get_mut(&stream) else {
                        // The codec sends DATA only for streams it was given a file
                        // for, and reports every stream it drops.
                        tracing::warn!("HTTP/2 DATA for stream {} without its file; closing", stream.0);
                        return End::Done;
                    };
                    let r = match &o.file {
                        Some((found, _)) if !o.parts.is_empty() => {
                            let span = (offset, u64::from(len));
                            crate::http::parts::send_span(conn, &head, found, &o.parts, span.0, span.1).await
                        }
                        Some((found, start)) => {
                            let from = start + offset;
                            conn.queue(&head, Some(found.body(from..from + u64::from(len)))).await
                        }
                        None => conn.queue(&head, None).await,
                    };
                    // The transport counts file bytes.
                    if let Ok(n) = r {
                        o.sent += n;
                    }
                    if end_stream {
                        if let Some(o) = open.remove(&stream) {
                            o.log(&ctx, conn);
                        }
                    }
                    r.map(|_| ())
                }
                Write::SourceData { stream, head, len, end_stream } => {
                    let found = open.get_mut(&stream).and_then(|o| Some((o.source.clone()?, o)));
                    let Some((source, o)) = found else {
                        tracing::warn!("HTTP/2 DATA for stream {} without its source; closing", stream.0);
                        return End::Done;
                    };
                    let r = conn.send_queued(&head, std::os::fd::AsFd::as_fd(&*source), len as usize).await;
                    if let Ok(true) = r {
                        o.sent += u64::from(len);
                        o.body = Some(BodyPath::Splice);
                        if let Some(task) = proxied.get(&stream) {
                            task.sent_from_source(u64::from(len));
                        }
                    }
                    if end_stream {
                        if let Some(o) = open.remove(&stream) {
                            o.log(&ctx, conn);
                        }
                    }
                    match r {
                        Ok(true) => Ok(()),
                        Ok(false) => {
                            // The codec was told of source bytes only on a transport that splices.
                            tracing::warn!("HTTP/2 stream {}: this connection cannot splice; closing", stream.0);
                            return End::Done;
                        }
                        Err(e) => Err(e),
                    }
                }
                Write::Data { stream, bytes, len, end_stream } => {
                    // A proxied body: its task may hand over more now.
                    signal.poke();
                    let r = conn.queue(&bytes, None).await;
                    if let (Ok(_), Some(o)) = (&r, open.get_mut(&stream)) {
                        o.sent += u64::from(len);
                    }
                    if end_stream {
                        if let Some(o) = open.remove(&stream) {
                            o.log(&ctx, conn);
                        }
                    }
                    r.map(|_| ())
                }
            };
            match sent {
                Ok(()) => {}
                Err(e) if T::timed_out(&e) => return End::Timeout,
                Err(e) => return End::Error(e),
            }
            // Input between frames, after each LOOK_EVERY bytes of them: a window
            // update or a reset may change what goes next. `read` is cancel-safe, so a
            // look that finds nothing is dropped.
            if since_look < LOOK_EVERY {
                continue;
            }
            since_look = 0;
            let polled = tokio::select! {
                biased;
                r = conn.read(&mut buf, settings.stall_timeout) => Some(r),
                _ = std::future::ready(()) => None,
            };
            if let Some(r) = polled {
                match feed::<T>(&mut h2, &mut buf, r) {
                    Input::More => {}
                    Input::Closed => return End::Done,
                    Input::TimedOut => return End::Timeout,
                    Input::Failed(e) => return End::Error(e),
                }
            }
            continue;
        }
        // Nothing more to write now: what was queued leaves before any wait.
        match conn.flush().await {
            Ok(()) => {}
            Err(e) if T::timed_out(&e) => return End::Timeout,
            Err(e) => return End::Error(e),
        }
        if h2.is_finished() {
            // As HTTP/1.1 does: drain what the client still sends, so the close does
            // not reset the connection and lose the GOAWAY and the last frames.
            conn.linger_on_close(ctx.shutdown.clone());
            return End::Done;
        }

        let idle = h2.active_streams() == 0;
        if idle && buf.is_empty() && open.is_empty() {
            // An idle connection keeps no read buffer or stream table: the next request brings them back.
            (buf, open) = (Vec::new(), HashMap::new());
        }
        let timeout = if idle { settings.idle_timeout } else { settings.stall_timeout };
        // A stream held for the rest of its request is reset when its time is up; a
        // close waits for its PING's ACK until its own time is up.
        let held = h2.next_deadline();
        let ack_due = going_away.filter(|_| h2.awaits_shutdown_ack()).map(|t| t + SHUTDOWN_ACK_WAIT);
        let due = held.into_iter().chain(ack_due).min();
        let wait = due.map_or(timeout, |d| d.saturating_duration_since(Instant::now()).min(timeout));
        let read = tokio::select! {
            r = conn.read(&mut buf, wait) => Some(r),
            _ = &mut stop, if going_away.is_none() => None,
            () = signal.wait(), if !proxied.is_empty() => continue,
        };
        let Some(read) = read else {
            // Shutdown (or the server dropped its signal, which means the same).
            h2.shutdown();
            going_away = Some(Instant::now());
            continue;
        };
        match feed::<T>(&mut h2, &mut buf, read) {
            Input::More => {}
            Input::Closed => return End::Done,
            Input::TimedOut if held.is_some_and(|d| d <= Instant::now()) => h2.expire(Instant::now()),
            // No ACK of the close's PING in time: the final GOAWAY names the last stream taken.
            Input::TimedOut if h2.awaits_shutdown_ack() => h2.finish_shutdown(),
            // A stream awaiting its upstream is bounded by the upstream's own timeouts.
            Input::TimedOut if proxied.iter().any(|(id, p)| p.awaits_upstream(h2.buffered(*id))) => {}
            // An idle connection is closed politely: GOAWAY, then close_notify.
            Input::TimedOut if idle && going_away.is_none() => {
                h2.shutdown();
                going_away = Some(Instant::now());
            }
            Input::TimedOut => return End::Timeout,
            Input::Failed(e) => return End::Error(e),
        }
    }
}

/// What a read brought.
enum Input<E> {
    More,
    Closed,
    TimedOut,
    Failed(E),
}

fn feed<T: Transport>(h2: &mut Connection, buf: &mut Vec<u8>, read: Result<usize, T::Error>) -> Input<T::Error> {
    match read {
        Ok(0) => Input::Closed,
        Ok(_) => {
            let used = h2.recv(buf, Instant::now());
            buf.drain(..used);
            Input::More
        }
        Err(e) if T::timed_out(&e) => Input::TimedOut,
        Err(e) => Input::Failed(e),
    }
}

/// How a request goes on.
#[allow(clippy::large_enum_variant)] // one per request, moved once
enum Decided<'a> {
    /// An answer, and the client's address as the pipeline found it.
    Answer(Response, Who),
    /// A forward, for a task of its own, with its request and site.
    Forward(Forward, Request, Site<'a>),
}

/// The pipeline for `req` (read from `head`): its site, the phases before the
/// content, then the static answer or a forward. A body to compress for the static
/// answer is made first, off the loop; the connection's other streams wait meanwhile
/// (only the first request for a file and coding ever does).
async fn decide<'a>(
    req: Request,
    head: &RequestHead,
    end_stream: bool,
    ctx: &Context<'a, Settings>,
    conn: &impl Transport,
) -> Decided<'a> {
    let x = match pipeline::Exchange::begin(req, &ctx.sites, Handshake::Tcp(conn.server_name())) {
        Ok(x) => x,
        Err((req, response)) => return Decided::Answer(response, Who::of(&req)),
    };
    let body = match (end_stream, head.content_length) {
        (true, _) => RequestBody::None,
        (false, Some(n)) => RequestBody::Length(n),
        (false, None) => RequestBody::Unknown,
    };
    let max_body = ctx.settings.max_body_bytes;
    match x.decide(body, max_body, || head.upstreamed("2", body)).await {
        Decision::Respond(response) | Decision::Static(response) => Decided::Answer(response, Who::of(&x.req)),
        Decision::Forward(forward) => Decided::Forward(forward.with_cache(&ctx.sites), x.req, x.site),
    }
}

/// Sends `response`, the answer to the request of `head` (`streamed`: its body
/// follows from a forward's task; `from_cache`: a file body is a cache entry's): to
/// the codec, a file body kept open in `open` until its last frame.
#[allow(clippy::too_many_arguments)] // the parts of one answer, each used once
fn answer<S>(
    h2: &mut Connection,
    open: &mut HashMap<StreamId, Open>,
    stream: StreamId,
    head: &RequestHead,
    ctx: &Context<'_, S>,
    conn: &impl Transport,
    response: Response,
    streamed: Option<Streamed>,
    from_cache: bool,
    started: Instant,
    client: Who,
) {
    let peer = ctx.peer;
    let target = head.path.clone().unwrap_or_default();
    let method = Method::from_token(&head.method);
    if let Some(why) = &response.refused {
        let status = response.status.0;
        crate::log::refusal(status, why, || {
            format!("refused {peer} \"{} {target} HTTP/2.0\": {status} {why}", head.method)
        });
    }
    let response = ctx.advertise(response);
    let status = response.status.0;
    // The fields' values written one after another into one buffer, each field
    // its name and where its value ends.
    let mut values = String::with_capacity(256);
    let mut ends: Vec<(&str, usize)> = Vec::with_capacity(response.headers.len() + 2);
    values.push_str("ktlsd");
    ends.push(("server", values.len()));
    with_http_date_now(|date| values.push_str(date));
    ends.push(("date", values.len()));
    for h in &response.headers {
        h.write_value(&mut values);
        ends.push((h.name(), values.len()));
    }
    let mut start = 0;
    let fields = ends.iter().map(|&(name, end)| {
        let value = &values[start..end];
        start = end;
        (name, value)
    });
    // A file the open-file cache holds whole leaves from memory with the frames.
    let body = match &response.body {
        _ if streamed.is_some() => Some(BodyPath::Copy),
        Body::File { found, .. } | Body::Parts { found, .. } if found.content.is_some() => Some(BodyPath::Copy),
        body => crate::http::conn::body_path(conn, body),
    };
    let (size, file, parts) = match response.body {
        _ if streamed.is_some() => (BodySize::Stream { len: streamed.and_then(|s| s.len) }, None, Vec::new()),
        Body::File { found, range } if !range.is_empty() => {
            (BodySize::File { len: range.end - range.start }, Some((found, range.start)), Vec::new())
        }
        Body::Parts { found, parts } => {
            (BodySize::File { len: parts.iter().map(handler::Part::len).sum() }, Some((found, 0)), parts)
        }
        Body::Bytes(b) if !b.is_empty() => (BodySize::Bytes(b), None, Vec::new()),
        _ => (BodySize::None, None, Vec::new()),
    };
    let has_file = file.is_some() || streamed.is_some();
    // An in-memory body (a built-in error page, a listing) is handed to the codec
    // whole and leaves with the stream's frames: logged as sent, as HTTP/1.1 logs it.
    let in_memory = match &size {
        BodySize::Bytes(b) => b.len() as u64,
        _ => 0,
    };
    let text = |name: &str| head.header(name).map(|v| String::from_utf8_lossy(v).into_owned());
    let (referer, user_agent) = (text("referer"), text("user-agent"));
    let host = head.authority.clone().filter(|a| !a.is_empty());
    let ttfb = started.elapsed();
    let o = Open {
        client,
        file,
        parts,
        method,
        target,
        status,
        sent: in_memory,
        started,
        ttfb,
        referer,
        user_agent,
        host,
        body,
        from_cache,
        source: None,
    };
    match h2.respond(stream, status, fields, size) {
        Ok(()) if has_file => {
            open.insert(stream, o);
        }
        Ok(()) => o.log(ctx, conn),
        Err(e) => tracing::debug!("stream {} from {peer}: response dropped: {e}", stream.0),
    }
}

/// Takes what the proxied streams' tasks have: answers go to the codec (as `answer`
/// does), body pieces while the codec holds little of the stream's body, failures
/// after the head reset their streams.
fn step_proxied<'a, S>(
    h2: &mut Connection,
    open: &mut HashMap<StreamId, Open>,
    proxied: &mut HashMap<StreamId, super::forwarded::Proxied<'a>>,
    ctx: &Context<'_, S>,
    conn: &impl Transport,
) {
    let streams: Vec<StreamId> = proxied.keys().copied().collect();
    for stream in streams {
        while let Some(task) = proxied.get_mut(&stream) {
            // The request body bytes its upstream took: the client may send as many more.
            h2.consumed(stream, task.credit());
            match task.step(h2.buffered(stream)) {
                Step::Idle => break,
                Step::Interim(response) => {
                    let fields: Vec<(&str, String)> =
                        response.headers.iter().map(|h| (h.name(), h.to_string())).collect();
                    if let Err(e) = h2.interim(stream, response.status.0, fields) {
                        tracing::debug!("stream {} from {}: interim response dropped: {e}", stream.0, ctx.peer);
                    }
                }
                Step::Body(piece) => {
                    let _ = h2.push(stream, &piece);
                }
                Step::AtSource(n) => {
                    let _ = h2.push_at_source(stream, n);
                }
                Step::Respond(response, streamed, from_cache) => {
                    let (head, started, client) = (task.head.clone(), task.started, task.client.clone());
                    let source = task.take_source();
                    if streamed.is_none() {
                        forget(h2, proxied, stream);
                    }
                    answer(h2, open, stream, &head, ctx, conn, response, streamed, from_cache, started, client);
                    if let Some(o) = open.get_mut(&stream) {
                        o.source = source;
                    }
                }
                Step::Reset => {
                    // The forward logged why.
                    let o = open.remove(&stream);
                    forget(h2, proxied, stream);
                    h2.abort(stream, 0);
                    if let Some(o) = o {
                        o.log(ctx, conn);
                    }
                }
                Step::Trailers(trailers) => {
                    proxied.remove(&stream);
                    match h2.trailers(stream, &trailers) {
                        Ok(()) => {
                            if let Some(o) = open.remove(&stream) {
                                o.log(ctx, conn);
                            }
                        }
                        // A body of known length ended by itself: the trailers are dropped.
                        Err(_) => {
                            let _ = h2.finish(stream);
                        }
                    }
                }
                Step::Done => {
                    forget(h2, proxied, stream);
                    // Gone already when the codec is done with it.
                    let _ = h2.finish(stream);
                }
            }
        }
    }
}

/// Drops `stream`'s task; the request body bytes it left unread are credited, so
/// a client still sending them is not held by a window nobody opens.
fn forget(h2: &mut Connection, proxied: &mut HashMap<StreamId, super::forwarded::Proxied<'_>>, stream: StreamId) {
    if let Some(task) = proxied.remove(&stream) {
        h2.consumed(stream, task.uncredited());
    }
}

impl Open {
    /// Writes the stream's access-log entry.
    fn log<S>(&self, ctx: &Context<'_, S>, conn: &impl Transport) {
        let line = RequestLine { method: &self.method, target: &self.target, version: "HTTP/2.0" };
        let logged = Logged {
            line,
            referer: self.referer.as_deref(),
            user_agent: self.user_agent.as_deref(),
            client: self.client.ip,
            notes: Some(&self.client.notes),
        };
        if let (true, Some(path)) = (self.from_cache, self.body) {
            pipeline::hit_bytes(path, self.sent);
        }
        let sent =
            Sent { status: self.status, bytes: self.sent, started: self.started, ttfb: self.ttfb, body: self.body };
        ctx.log_host(conn, Some(logged), sent, self.host.as_deref());
    }
}

#[cfg(test)]
#[path = "serve_tests.rs"]
mod tests;
