//! HTTP/2 streams that a `[[proxy]]` rule takes: the exchange with the upstream
//! (`handler::proxy`) runs up to the response head before the stream is answered.
//! A body of known length is then streamed: each DATA frame the codec schedules is
//! filled from the upstream ([`Streamed::take`]), so flow control paces the upstream
//! and at most one frame and one read piece are held; an upstream that fails after
//! the head resets the stream (INTERNAL_ERROR). A body of unknown length (chunked or
//! close-delimited) is held whole, at most [`MAX_BUFFERED`] bytes, and answered
//! 502 or 504 when the upstream fails.
//!
//! A request body is forwarded as its DATA frames arrive ([`Upload`]), with its
//! content-length or chunked. The connection's other streams wait while an upstream
//! is awaited. A response being stored (`[[proxy]] cache = true`) of at most
//! [`MAX_BUFFERED`] bytes is read whole and stored before its stream is answered; a
//! larger one is stored as it streams. A request is forwarded only once the handler's guarding phases
//! (`handler::guard`: canonical host, redirects, IP rules, rate limit, basic auth) let it.

use super::RequestHead;
use crate::handler::proxy::cached::{self, Next, Pending, Plan, Store};
use crate::handler::proxy::{headers, metrics, parse::Framing, Exchange, Failure, Forwarding, Rule};
use crate::handler::{self, Body, Header, Pick, Request, Response, Site, Status};
use crate::http::Context;

/// The largest upstream response body of unknown length an HTTP/2 stream holds
/// before it is answered.
pub const MAX_BUFFERED: usize = 8 * 1024 * 1024;

/// A response body of known length still coming from the upstream.
pub(super) struct Streamed<'a> {
    exchange: Exchange<'a>,
    /// The body being stored, when the response is cached.
    store: Option<Store>,
    /// Read from the upstream, not yet sent (less than one frame and one piece).
    pending: Vec<u8>,
    /// The body's length.
    pub len: u64,
}

impl Streamed<'_> {
    /// The next `len` body bytes; an error means the body cannot be completed.
    ///
    /// # Cancel safety
    /// Cancel-safe: bytes read stay in `pending`.
    pub async fn take(&mut self, len: usize) -> Result<Vec<u8>, Failure> {
        while self.pending.len() < len {
            let more = self.exchange.read_body(&mut self.pending).await?;
            if !more && self.pending.len() < len {
                return Err(self.exchange.failure_now("body", "the body ended before its Content-Length"));
            }
        }
        metrics::body_bytes("copy", len as u64);
        let out: Vec<u8> = self.pending.drain(..len).collect();
        if let Some(store) = self.store.as_mut() {
            store.write(&out);
        }
        Ok(out)
    }

    /// After the last frame: lets the exchange see its body complete, so that its
    /// connection goes back to the pool, and stores the body when it is cached.
    ///
    /// # Cancel safety
    /// Cancel-safe: a cancelled call only keeps the connection out of the pool
    /// (and the body out of the cache).
    pub async fn finish(&mut self) {
        let _ = self.exchange.read_body(&mut self.pending).await;
        if let Some(store) = self.store.take() {
            store.commit().await;
        }
    }
}

/// The site and rule that take `head`, if a `[[proxy]]` rule does.
pub(super) fn route<'a, S>(ctx: &Context<'a, S>, head: &RequestHead) -> Option<(Site<'a>, &'a Rule)> {
    let path = head.path.as_deref()?.split(['?', '#']).next()?;
    let Pick::Site(site) = ctx.sites.pick(head.authority.as_deref().filter(|a| !a.is_empty())) else { return None };
    handler::proxy::route(&site, path).map(|rule| (site, rule))
}

/// What forwarding a request gave.
#[allow(clippy::large_enum_variant)] // one per request, moved once
pub(super) enum Forwarded<'a> {
    /// The answer, and its body still to come when that is streamed.
    Answer(Response, Option<Streamed<'a>>),
    /// The request body is still arriving: feed it to [`Upload::data`].
    Upload(Upload<'a>),
}

/// A proxied request whose body is still arriving from the client.
pub(super) struct Upload<'a> {
    exchange: Exchange<'a>,
    pending: Pending,
    req: Request,
    /// The first failure to send to the upstream; the rest of the body is dropped.
    failed: Option<Failure>,
    is_head: bool,
    method: String,
    target: String,
    /// Body bytes still allowed (`max_body_bytes`).
    allowed: u64,
}

impl<'a> Upload<'a> {
    /// Forwards a piece of the body.
    ///
    /// # Cancel safety
    /// Not cancel-safe: part of the piece may have been sent.
    pub async fn data(&mut self, piece: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        if piece.len() as u64 > self.allowed {
            let too_large = Failure { status: Status::PAYLOAD_TOO_LARGE, ..self.exchange.failure_now("body", "") };
            self.failed = Some(Failure {
                kind: "request-body",
                detail: "request body exceeds max_body_bytes".into(),
                ..too_large
            });
            return;
        }
        self.allowed -= piece.len() as u64;
        if let Err(f) = self.exchange.send_body(piece).await {
            self.failed = Some(f);
        }
    }

    /// The answer once the body has ended.
    ///
    /// # Cancel safety
    /// Not cancel-safe: the upstream may be half-way through its answer.
    pub async fn finish<S>(mut self, ctx: &Context<'_, S>, site: &Site<'_>) -> (Response, Option<Streamed<'a>>) {
        let done = match self.failed.take() {
            Some(f) => Err(f),
            None => match self.exchange.end_body().await {
                Ok(()) => complete(self.exchange, self.pending, &self.req).await,
                Err(f) => Err(f),
            },
        };
        answer(ctx, site, done, self.is_head, &self.method, &self.target, "ktlsd; fwd=method")
    }
}

/// Forwards `head` (read as `req`) by `rule` once the guarding phases let it: the
/// answer, or the upload of its body.
///
/// # Cancel safety
/// Not cancel-safe: the request may be half-sent to the upstream.
pub(super) async fn forward<'a, S>(
    ctx: &Context<'_, S>,
    head: &RequestHead,
    req: Request,
    end_stream: bool,
    site: &Site<'_>,
    rule: &'a Rule,
    max_body: u64,
) -> Forwarded<'a> {
    let is_head = head.method == "HEAD";
    // Guarded as files are.
    if let Some(response) = handler::guard(&req, site) {
        return Forwarded::Answer(response, None);
    }
    let target = head.path.clone().unwrap_or_else(|| "/".into());
    if head.content_length.is_some_and(|n| n > max_body) {
        let mut r = handler::refusal(Status::PAYLOAD_TOO_LARGE, site, is_head);
        r.refused = Some("request body exceeds max_body_bytes".into());
        return Forwarded::Answer(r, None);
    }
    let fields: Vec<(String, String)> =
        head.headers.iter().map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned())).collect();
    let mut fields = fields;
    let fwd = Forwarding {
        method: head.method.clone(),
        target: target.clone(),
        authority: head.authority.clone(),
        peer: ctx.peer.ip(),
        version: "2",
        // A body without content-length goes on chunked.
        body: (!end_stream).then_some(head.content_length),
    };
    let pending = match cached::plan(&ctx.sites, rule, &req, !end_stream, &fwd, &mut fields).await {
        Plan::Answer(response) => return Forwarded::Answer(handler::with_hsts(response, site), None),
        Plan::Forward(pending) => pending,
    };
    let failed_status = pending.failed_status();
    let begun = Exchange::begin(rule, fwd, fields).await;
    let done = match begun {
        Ok(exchange) if !end_stream => {
            let method = head.method.clone();
            let allowed = max_body;
            return Forwarded::Upload(Upload {
                exchange,
                pending,
                req,
                failed: None,
                is_head,
                method,
                target,
                allowed,
            });
        }
        Ok(exchange) => complete(exchange, pending, &req).await,
        Err(f) => match pending.on_failure(&f, &req) {
            Some(stale) => Ok((stale, None)),
            None => Err(f),
        },
    };
    let (response, streamed) = answer(ctx, site, done, is_head, &head.method, &target, &failed_status);
    Forwarded::Answer(response, streamed)
}

/// The client's answer from an exchange's outcome: with the site's HSTS, or the 502/504 page.
fn answer<'a, S>(
    ctx: &Context<'_, S>,
    site: &Site<'_>,
    done: Result<(Response, Option<Streamed<'a>>), Failure>,
    is_head: bool,
    method: &str,
    target: &str,
    cache_status: &str,
) -> (Response, Option<Streamed<'a>>) {
    match done {
        Ok((r, streamed)) => (handler::with_hsts(r, site), streamed),
        Err(f) => {
            tracing::warn!("proxy {} \"{method} {target} HTTP/2.0\": {} {f}", ctx.peer, f.status.0);
            let status = format!("{cache_status}; detail={}", f.kind);
            (handler::refusal(f.status, site, is_head).with(Header::Field("Cache-Status".into(), status)), None)
        }
    }
}

/// Reads the upstream's answer to a request sent whole (or the cache's, after a
/// revalidation or under `stale-if-error`).
async fn complete<'a>(
    mut up: Exchange<'a>,
    pending: Pending,
    req: &Request,
) -> Result<(Response, Option<Streamed<'a>>), Failure> {
    let head = match up.response().await {
        Ok(head) => head,
        Err(f) => return pending.on_failure(&f, req).map(|stale| (stale, None)).ok_or(f),
    };
    let (cache_status, mut store) = match pending.on_head(&head, req).await {
        Next::Answer(response) => {
            if head.framing == Framing::None {
                // A 304 has no body: the connection goes back to the pool.
                let _ = up.read_body(&mut Vec::new()).await;
            }
            return Ok((response, None));
        }
        Next::Pass(status, store) => (status, store),
    };
    let mut fields: Vec<Header> = headers::response_fields(&head.fields, head.version, &cache_status)
        .into_iter()
        .map(|(n, v)| Header::Field(n.into(), v))
        .collect();
    let status = Status(head.status);
    if let Framing::Length(len) = head.framing {
        fields.push(Header::ContentLength(len));
        if let Some(mut s) = store.take_if(|_| len <= MAX_BUFFERED as u64) {
            // Read and stored before the stream is answered: a later stream of this
            // connection asking for the same key then finds the entry instead of
            // waiting for a fill that only this loop could finish.
            let mut body = Vec::with_capacity(len as usize);
            while up.read_body(&mut body).await? {}
            drop(up);
            s.write(&body);
            s.commit().await;
            metrics::body_bytes("copy", body.len() as u64);
            let body = if body.is_empty() { Body::Empty } else { Body::Bytes(body) };
            return Ok((Response { status, headers: fields, body, refused: None }, None));
        }
        let response = Response { status, headers: fields, body: Body::Empty, refused: None };
        let streamed = (len > 0).then(|| Streamed { exchange: up, store, pending: Vec::new(), len });
        return Ok((response, streamed));
    }
    let mut body = Vec::new();
    while up.read_body(&mut body).await? {
        if body.len() > MAX_BUFFERED {
            return Err(up.failure_now("body", "a body of unknown length larger than the 8 MiB HTTP/2 streams hold"));
        }
    }
    drop(up);
    if let Some(mut store) = store {
        store.write(&body);
        store.commit().await;
    }
    metrics::body_bytes("copy", body.len() as u64);
    let declared = head.fields.iter().find(|(n, _)| n.eq_ignore_ascii_case("content-length"));
    match (head.framing, declared) {
        (Framing::None, Some((_, v))) if head.status >= 200 && head.status != 204 => {
            fields.push(Header::Field("Content-Length".into(), v.clone()))
        }
        (Framing::None, _) => {}
        _ => fields.push(Header::ContentLength(body.len() as u64)),
    }
    let body = if body.is_empty() { Body::Empty } else { Body::Bytes(body) };
    Ok((Response { status, headers: fields, body, refused: None }, None))
}
