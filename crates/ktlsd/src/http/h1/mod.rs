//! HTTP/1.1 (and 1.0): one connection's life. Requests are read and answered in
//! order, each passing through the same [`State`]s: a head is read ([`State::Head`]),
//! its site chosen and any body discarded within limits ([`State::Body`]), then it is
//! answered by [`handler::handle`], sent and logged ([`State::Answer`]); the
//! connection goes back to waiting for a head or ends ([`State::Closed`]).
//!
//! The loop is generic over [`Transport`]: it knows nothing of TLS, sockets or
//! configuration; its settings and the sites come in its [`Context`].

mod downstream;
pub mod parse;
pub mod write;

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use super::conn::{Logged, Sent};
use super::{Context, End, Transport};
use crate::handler::pipeline::{self, Answer, Decision, Forward, Handshake, Outcome, RequestBody, StreamEnd};
use crate::handler::{self, Body, Method, Response, Site, Status};
use crate::log::RequestLine;
use parse::{BadRequest, Head, Version};

/// Limits and timeouts of the HTTP/1.x codec.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Largest request head, request line included (414 or 431 beyond).
    pub max_head_bytes: usize,
    /// Largest request body read and discarded (413 beyond).
    pub max_body_bytes: u64,
    /// How long a request head (and a request body) may take once it has begun (408).
    pub header_timeout: Duration,
    /// How long a kept-alive connection may wait for its next request.
    pub idle_timeout: Duration,
}

/// Where a connection is between two requests, or within one. Each state but
/// the last has one method of [`Connection`] that does its I/O and returns the next.
#[allow(clippy::large_enum_variant)] // one per request, moved once
pub enum State<E> {
    /// Waiting for a request head ([`Connection::read_head`]).
    Head,
    /// A whole head has arrived: its site is chosen and its body, if any, read
    /// and dropped within limits ([`Connection::read_body`]).
    Body(Exchange),
    /// All of the request is in: its answer is sent and logged ([`Connection::answer`]).
    Answer(Exchange, Response),
    /// The connection is over.
    Closed(End<E>),
}

/// One request under way.
pub struct Exchange {
    pub head: Head,
    /// When its first byte arrived.
    pub started: Instant,
    /// Whether the connection stays open after the answer.
    pub keep_alive: bool,
    /// The head as received, kept only when a site proxies (the upstream gets its fields).
    pub raw: Option<Vec<u8>>,
}

/// One connection's transport, surroundings and unread bytes.
pub struct Connection<'c, 'a, T> {
    conn: &'c mut T,
    ctx: Context<'a, Settings>,
    /// Bytes received and not yet consumed (pipelined requests stay here).
    buf: Vec<u8>,
    /// Whether any site has `[[proxy]]` rules (then request heads are kept for them).
    proxies: bool,
    /// Whether a request was answered: a connection that has had none is new,
    /// and its first request may be on its way when the shutdown signal comes.
    answered: bool,
}

/// How long a connection with no request answered yet may still send its first
/// one once the shutdown signal came (a reload or a stop): the client that just
/// connected has its request on the way, and closing now would fail it.
const FIRST_REQUEST_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Serves requests on `conn` until the connection ends or the context's
/// shutdown turns true (a request under way is answered first, with `Connection: close`).
///
/// # Cancel safety
/// Not cancel-safe: a response may be cut in the middle. The loop watches the
/// shutdown signal itself; callers do not need to race it.
pub async fn serve<T: Transport>(conn: &mut T, ctx: Context<'_, Settings>) -> End<T::Error> {
    // One wait for shutdown for the connection's life, polled by every idle read:
    // a wait made per read would register with the watch and leave it again for
    // each request.
    let mut stop_rx = ctx.shutdown.clone();
    let stop = stop_rx.wait_for(|s| *s);
    tokio::pin!(stop);
    let mut c = Connection::new(conn, ctx);
    let mut state = State::Head;
    loop {
        state = match state {
            State::Head => c.read_head(stop.as_mut()).await,
            // Boxed while they run: an idle connection's future holds only what
            // waiting for the next head needs, not room for a response under way.
            State::Body(x) => Box::pin(c.read_body(x)).await,
            State::Answer(x, response) => Box::pin(c.answer(x, response)).await,
            State::Closed(end) => return end,
        };
    }
}

impl<'c, 'a, T: Transport> Connection<'c, 'a, T> {
    pub fn new(conn: &'c mut T, ctx: Context<'a, Settings>) -> Connection<'c, 'a, T> {
        let proxies = pipeline::forwards(&ctx.sites);
        Connection { conn, ctx, buf: Vec::with_capacity(2048), proxies, answered: false }
    }

    /// [`State::Head`]: reads until a whole head is in. The idle timeout applies
    /// until its first byte, the header timeout from then on; `stop` ends a
    /// connection with no request begun: once it has answered one, as soon as a look
    /// at the input finds no byte (a request that arrived with the signal is read and
    /// answered, with `Connection: close`), after [`FIRST_REQUEST_GRACE`] without a
    /// first byte when it is new. A request begun is always read whole. `stop` is
    /// polled only while the shutdown signal is false, so never after it completed.
    pub async fn read_head<F: Future>(&mut self, mut stop: Pin<&mut F>) -> State<T::Error> {
        let settings = self.ctx.settings;
        let mut started: Option<Instant> = if self.buf.is_empty() { None } else { Some(Instant::now()) };
        // A kept-alive connection waiting for its next request is idle (the status page's count).
        let log = self.ctx.log;
        let _idle = crate::stats::Gauged::new(
            (started.is_none() && self.answered).then(|| log.metrics().map(|m| &m.traffic.idle)).flatten(),
        );
        let parsed = loop {
            // An empty buffer (the usual case after an answer) holds no head to parse.
            if !self.buf.is_empty() {
                match parse::parse(&self.buf, settings.max_head_bytes) {
                    Ok(Some(r)) => break Ok(r),
                    Ok(None) => {}
                    Err(bad) => break Err(bad),
                }
            }
            let stopping = self.ctx.stopping();
            let before = self.buf.len();
            let read = if stopping && self.buf.is_empty() && self.answered {
                // Between requests: the connection ends, unless a request arrived as
                // the signal came (it is answered, with `Connection: close`).
                match self.look().await {
                    Some(Ok(n)) if n > 0 => Ok(n),
                    Some(Err(e)) if !T::timed_out(&e) => Err(e),
                    _ => return State::Closed(End::Done),
                }
            } else {
                let timeout = match started {
                    None if stopping => settings.idle_timeout.min(FIRST_REQUEST_GRACE),
                    None => settings.idle_timeout,
                    Some(t) => settings.header_timeout.saturating_sub(t.elapsed()),
                };
                // `read` is cancel-safe: a wait cut short by the signal loses nothing. Input
                // is looked at first, so bytes that came with the signal are never left unread.
                tokio::select! {
                    biased;
                    r = self.conn.read(&mut self.buf, timeout) => r,
                    _ = stop.as_mut(), if self.buf.is_empty() && !stopping => continue,
                }
            };
            match read {
                Ok(0) => return State::Closed(End::Done),
                Ok(_) => {
                    if started.is_none() && self.buf.len() > before {
                        started = Some(Instant::now());
                    }
                }
                Err(e) if T::timed_out(&e) => {
                    if !self.buf.is_empty() {
                        let reason = "request head not received in time";
                        self.refuse_unparsed(&BadRequest { status: Status::REQUEST_TIMEOUT, reason }).await;
                    }
                    return State::Closed(End::Timeout);
                }
                Err(e) => return State::Closed(End::Error(e)),
            }
        };
        match parsed {
            Ok((mut head, used)) => {
                let raw = self.proxies.then(|| self.buf[..used].to_vec());
                self.buf.drain(..used);
                // The client is the TCP peer, whatever the request's fields say.
                head.request.client = Some(self.ctx.peer.ip().to_canonical());
                let keep_alive = head.keep_alive && !self.ctx.stopping();
                State::Body(Exchange { head, started: started.unwrap_or_else(Instant::now), keep_alive, raw })
            }
            Err(bad) => {
                self.refuse_unparsed(&bad).await;
                self.close()
            }
        }
    }

    /// Looks at the input once without waiting, after the event loop has taken in
    /// what the socket received: `None` (or a timeout) when no bytes have come. A
    /// request's bytes that had not all arrived as one TLS record stay unread.
    async fn look(&mut self) -> Option<Result<usize, T::Error>> {
        tokio::task::yield_now().await;
        tokio::select! {
            biased;
            r = self.conn.read(&mut self.buf, Duration::ZERO) => Some(r),
            () = std::future::ready(()) => None,
        }
    }

    /// [`State::Body`]: the request goes through the pipeline (its site chosen by
    /// Host, as one connection may carry requests for several names its certificate
    /// covers; the guards; the body's limit; the route). A static answer's body is
    /// read and dropped; a refusal ends the connection without reading it; a
    /// forward runs over this connection ([`downstream::Client`]). A client that
    /// waits for `100 Continue` gets the final answer at once instead when the body
    /// would not be read: refused, or a method the static answer refuses.
    pub async fn read_body(&mut self, x: Exchange) -> State<T::Error> {
        let Exchange { mut head, started, keep_alive, raw } = x;
        // The pipeline owns the request until the answer; the head keeps the rest.
        let req = std::mem::replace(&mut head.request, handler::Request::new(Method::Get, ""));
        let px = match pipeline::Exchange::begin(req, &self.ctx.sites, Handshake::Tcp(self.conn.server_name())) {
            Ok(px) => px,
            Err((req, response)) => {
                head.request = req;
                return self.refuse_and_close(&head, response, "no site has the requested host", Instant::now()).await;
            }
        };
        let body = match (head.chunked, head.content_length) {
            (true, _) => RequestBody::Unknown,
            (false, 0) => RequestBody::None,
            (false, n) => RequestBody::Length(n),
        };
        let max_body = self.ctx.settings.max_body_bytes;
        let upstreamed = || pipeline::Upstreamed {
            method: px.req.method.as_str().to_string(),
            fields: raw.as_deref().map(pipeline::fields_of_head).unwrap_or_default(),
            version: if head.version == Version::Http10 { "1.0" } else { "1.1" },
            body,
        };
        let decision = px.decide(body, max_body, upstreamed).await;
        let pipeline::Exchange { req, site, .. } = px;
        head.request = req;
        let x = Exchange { head, started, keep_alive, raw: None };
        let has_body = body != RequestBody::None;
        match decision {
            Decision::Respond(response) if has_body => {
                let why = response.refused.clone().unwrap_or("refused (body not read)".into());
                self.refuse_and_close(&x.head, response, &why, x.started).await
            }
            Decision::Respond(response) => self.reply(x, response).await,
            Decision::Static(_) if x.head.chunked => {
                let response = handler::refusal(Status::LENGTH_REQUIRED, &site, x.head.request.method == Method::Head);
                let why = "Transfer-Encoding request bodies are not accepted";
                self.refuse_and_close(&x.head, response, why, Instant::now()).await
            }
            Decision::Static(response) if has_body && x.head.expect_continue && !x.head.request.method.is_served() => {
                self.refuse_and_close(&x.head, response, "method not allowed (body not read)", x.started).await
            }
            Decision::Static(response) => {
                if has_body {
                    // The client may already have sent the body; RFC 9110 section 10.1.1
                    // lets the server send 100 anyway, and nginx does.
                    if x.head.expect_continue {
                        if let Err(e) = self.conn.send(write::CONTINUE, None).await {
                            return State::Closed(End::Error(e));
                        }
                    }
                    let timeout = self.ctx.settings.header_timeout;
                    match discard_body(self.conn, &mut self.buf, x.head.content_length, timeout).await {
                        Ok(true) => {}
                        Ok(false) => return State::Closed(End::Truncated),
                        Err(e) => return State::Closed(End::Error(e)),
                    }
                }
                State::Answer(x, response)
            }
            Decision::Forward(forward) => self.forward(x, site, forward.with_cache(&self.ctx.sites)).await,
        }
    }

    /// Runs a forward over this connection, then sends its answer when it is not
    /// streamed, and logs; the connection then waits for the next head, or ends.
    ///
    /// # Cancel safety
    /// Not cancel-safe, as the loop's other states: a response may be cut.
    async fn forward(&mut self, x: Exchange, site: Site<'a>, forward: Forward) -> State<T::Error> {
        let body = match x.head.chunked {
            true => downstream::RequestBody::Chunked(Default::default()),
            false => downstream::RequestBody::Length(x.head.content_length),
        };
        let mut client = downstream::Client {
            conn: &mut *self.conn,
            buf: &mut self.buf,
            version: x.head.version,
            keep_alive: x.keep_alive,
            expect_continue: x.head.expect_continue,
            body,
            header_timeout: self.ctx.settings.header_timeout,
            chunked: false,
            aborted: false,
            retired: x.head.request.upgrade.is_some().then(|| self.ctx.shutdown.clone()),
        };
        let outcome = forward.run(&x.head.request, &mut client).await;
        let (body_read, keep_alive) = (client.body_read(), client.keep_alive);
        let s = match outcome {
            Outcome::Answer { answer, from_cache } => {
                let failed = matches!(answer, Answer::Failed(..));
                let response = pipeline::finish(&site, x.head.request.method == Method::Head, answer);
                if failed || !body_read {
                    // A request body may be left unread: the connection ends after the answer.
                    return self.answer_and_close(&x, response).await;
                }
                return self.reply_as(x, response, from_cache).await;
            }
            Outcome::ClientGone(end) => return State::Closed(end),
            Outcome::Streamed(s) => s,
        };
        let sent = Sent {
            status: s.status,
            bytes: s.sent,
            started: x.started,
            ttfb: s.answered.duration_since(x.started),
            body: Some(s.path),
        };
        self.ctx.log_host(self.conn, Some(logged(&x.head)), sent, x.head.request.authority.as_deref());
        self.answered = true;
        match s.end {
            StreamEnd::Complete if keep_alive && body_read && !self.ctx.stopping() => State::Head,
            StreamEnd::Complete => self.close(),
            StreamEnd::Cut(_) => State::Closed(End::Aborted),
            StreamEnd::Client(end) => State::Closed(end),
        }
    }

    /// Sends and logs `response` with `Connection: close`; the connection then ends.
    async fn answer_and_close(&mut self, x: &Exchange, response: Response) -> State<T::Error> {
        let response = self.ctx.advertise(response);
        let ttfb = x.started.elapsed();
        self.conn.last_response();
        let bytes = send(self.conn, &response, x.head.version, false).await.unwrap_or(0);
        let body = crate::http::conn::body_path(self.conn, &response.body);
        let sent = Sent { status: response.status.0, bytes, started: x.started, ttfb, body };
        self.ctx.log_host(self.conn, Some(logged(&x.head)), sent, x.head.request.authority.as_deref());
        self.close()
    }

    /// [`State::Answer`]: the answer is sent and logged; the connection then waits
    /// for the next head, or ends.
    pub async fn answer(&mut self, x: Exchange, response: Response) -> State<T::Error> {
        self.reply(x, response).await
    }

    /// Sends and logs `response`, the answer to `x`; the connection then waits for
    /// the next head, or ends.
    async fn reply(&mut self, x: Exchange, response: Response) -> State<T::Error> {
        self.reply_as(x, response, false).await
    }

    /// [`Self::reply`]; with `from_cache`, a file body is a cache entry's and its
    /// bytes count as cache-hit bytes.
    async fn reply_as(&mut self, x: Exchange, response: Response, from_cache: bool) -> State<T::Error> {
        let response = self.ctx.advertise(response);
        if let Some(why) = &response.refused {
            self.refused(Some(&x.head), response.status, why);
        }
        let ttfb = x.started.elapsed();
        if !x.keep_alive {
            self.conn.last_response();
        }
        let bytes = match send(self.conn, &response, x.head.version, x.keep_alive).await {
            Ok(b) => b,
            // The response could not be completed; the connection is cut without
            // close_notify so the client cannot take a partial body for a whole one.
            // A client that stopped reading (send timeout) counts as a timeout.
            Err(e) if T::timed_out(&e) => return State::Closed(End::Timeout),
            Err(e) => return State::Closed(End::Error(e)),
        };
        let body = crate::http::conn::body_path(self.conn, &response.body);
        if let (true, Some(path), Body::File { .. }) = (from_cache, body, &response.body) {
            pipeline::hit_bytes(path, bytes);
        }
        let sent = Sent { status: response.status.0, bytes, started: x.started, ttfb, body };
        self.ctx.log_host(self.conn, Some(logged(&x.head)), sent, x.head.request.authority.as_deref());
        self.answered = true;
        if x.keep_alive && !self.ctx.stopping() {
            State::Head
        } else {
            self.close()
        }
    }

    /// The connection ends after its last answer, draining the client's input first.
    fn close(&mut self) -> State<T::Error> {
        self.conn.linger_on_close(self.ctx.shutdown.clone());
        State::Closed(End::Done)
    }

    fn refused(&self, head: Option<&Head>, status: Status, why: &str) {
        let peer = self.ctx.peer;
        crate::log::refusal(status.0, why, || match head {
            Some(h) => format!(
                "refused {peer} \"{} {} {}\": {} {why}",
                h.request.method,
                h.target,
                h.version.as_str(),
                status.0
            ),
            None => format!("refused {peer} \"\": {} {why}", status.0),
        });
    }

    /// Answers a request whose head could not be parsed, then the connection ends.
    /// A HEAD request's answer has no body, though the head is incomplete.
    async fn refuse_unparsed(&mut self, bad: &BadRequest) {
        let response = handler::refusal(bad.status, &self.ctx.sites.default, parse::is_head(&self.buf));
        self.refuse(None, response, bad.reason, Instant::now()).await;
    }

    async fn refuse_and_close(
        &mut self,
        head: &Head,
        response: Response,
        why: &str,
        started: Instant,
    ) -> State<T::Error> {
        self.refuse(Some(head), response, why, started).await;
        self.close()
    }

    /// Sends a final refusal with `Connection: close` and logs it; a failure to send
    /// changes nothing, the connection ends anyway.
    async fn refuse(&mut self, head: Option<&Head>, response: Response, why: &str, started: Instant) {
        self.refused(head, response.status, why);
        let version = head.map_or(Version::Http11, |h| h.version);
        let ttfb = started.elapsed();
        self.conn.last_response();
        let bytes = send(self.conn, &response, version, false).await.unwrap_or(0);
        let body = crate::http::conn::body_path(self.conn, &response.body);
        let sent = Sent { status: response.status.0, bytes, started, ttfb, body };
        match head {
            Some(h) => self.ctx.log_host(self.conn, Some(logged(h)), sent, h.request.authority.as_deref()),
            None => self.ctx.log(self.conn, None, sent),
        }
    }
}

/// Sends `response`; returns the body bytes sent (the head not counted, as nginx's
/// `$body_bytes_sent`), for the access log.
async fn send<T: Transport>(
    conn: &mut T,
    response: &Response,
    version: Version,
    keep_alive: bool,
) -> Result<u64, T::Error> {
    match &response.body {
        Body::File { found, range } if !range.is_empty() => {
            let head = write::head(response, version, keep_alive);
            conn.send(&head, Some(found.body(range.clone()))).await
        }
        Body::Parts { found, parts } => {
            let head = write::head(response, version, keep_alive);
            let len = parts.iter().map(handler::Part::len).sum();
            crate::http::parts::send_span(conn, &head, found, parts, 0, len).await
        }
        body => {
            conn.send(&write::head_and_bytes(response, version, keep_alive), None).await?;
            Ok(match body {
                Body::Bytes(b) => b.len() as u64,
                _ => 0,
            })
        }
    }
}

/// What the access log says of `head`.
fn logged(head: &Head) -> Logged<'_> {
    Logged {
        line: RequestLine { method: &head.request.method, target: &head.target, version: head.version.as_str() },
        referer: head.referer.as_deref(),
        user_agent: head.user_agent.as_deref(),
        client: head.request.client,
        notes: Some(&head.request.notes),
    }
}

/// Reads and drops `left` body bytes (those already in `buf` first). `Ok(false)`:
/// the peer closed before the end.
async fn discard_body<T: Transport>(
    conn: &mut T,
    buf: &mut Vec<u8>,
    mut left: u64,
    timeout: Duration,
) -> Result<bool, T::Error> {
    loop {
        let take = (buf.len() as u64).min(left) as usize;
        buf.drain(..take);
        left -= take as u64;
        if left == 0 {
            return Ok(true);
        }
        if conn.read(buf, timeout).await? == 0 {
            return Ok(false);
        }
    }
}

#[cfg(test)]
mod tests;
