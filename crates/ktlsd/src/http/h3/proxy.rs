//! HTTP/3 requests that a `[[proxy]]` rule takes ([`forward`]), as HTTP/1.1 and
//! HTTP/2 forward theirs: guarded as files are (`handler::guard`), answered from the
//! cache or sent to the upstream (`handler::proxy`), the request body read from the
//! stream as it arrives (within `max_body_bytes`), the response body sent on as it
//! comes from the upstream and stored as it goes when the cache keeps it.
//!
//! The stream ends (FIN) only once the body is complete and stored: an upstream that
//! fails after the head gets the stream reset with H3_INTERNAL_ERROR, so the client
//! never takes part of a body for the whole; one that fails before it gets a 502 or
//! 504 (or the stale entry under `stale-if-error`). Each request stream is its own
//! future on the connection's task, so a slow upstream holds back no other stream.
//! QUIC seals every packet in user space: bodies are copied, never spliced.
//!
//! Not here: the exchange itself and the cache rules (`handler::proxy`), QUIC.

use std::time::Instant;

use bytes::{Buf, Bytes};
use h3::quic::BidiStream;
use h3::server::RequestStream;

use super::{within, Settings, Unsent};
use crate::handler::proxy::cached::{self, Next, Pending, Plan};
use crate::handler::proxy::{self, metrics, Exchange, Failure, Rule, PIECE};
use crate::handler::{self, Body, Header, Method, Request, Response, Site, Status};
use crate::http::h2::{self, RequestHead};
use crate::http::Context;

/// How [`forward`] answered.
#[allow(clippy::large_enum_variant)] // one per request, moved once
pub(super) enum Forwarded {
    /// A response for the caller to send as any other: a guard's, a cache hit, a
    /// 502 or 504.
    Answer(Response),
    /// The upstream's response went out: its status, when its head was sent, and the
    /// body bytes sent or why it was cut after how many.
    Streamed { status: u16, answered: Instant, sent: Result<u64, (u64, Unsent)> },
}

/// Forwards the request of `head` (read as `req`) by `rule` of `site`, and sends the
/// upstream's response on `stream` unless it is an [`Forwarded::Answer`].
///
/// # Cancel safety
/// Not cancel-safe: dropped mid-way (the connection gone), the upstream connection
/// is closed rather than pooled and a cache fill under way is abandoned.
pub(super) async fn forward<S: BidiStream<Bytes>>(
    stream: &mut RequestStream<S, Bytes>,
    head: &RequestHead,
    req: &Request,
    site: &Site<'_>,
    rule: &Rule,
    ctx: &Context<'_, Settings>,
) -> Forwarded {
    let settings = ctx.settings;
    // A stream's end says where its body ends, but not ahead of it: without a
    // content-length, the methods that carry none by custom send none.
    let has_body = match head.content_length {
        Some(n) => n > 0,
        None => !matches!(req.method, Method::Get | Method::Head | Method::Options | Method::Delete),
    };
    let (fwd, mut fields) = match h2::forwarding(head, req, site, ctx.peer.ip(), "3", has_body, settings.max_body_bytes)
    {
        Ok(forwarded) => forwarded,
        Err(response) => return Forwarded::Answer(response),
    };
    let pending = match cached::plan(&ctx.sites, rule, req, has_body, &fwd, &mut fields).await {
        Plan::Answer(response) => return Forwarded::Answer(handler::with_hsts(response, site)),
        Plan::Forward(pending) => pending,
    };
    let failed_status = pending.failed_status();
    let mut up = match Exchange::begin(rule, fwd, fields).await {
        Ok(up) => up,
        Err(f) => return failed(pending, f, req, site, ctx, failed_status),
    };
    if has_body {
        if let Err(f) = send_body(stream, &mut up, settings).await {
            return refused(f, req, site, ctx, failed_status);
        }
    }
    let mut upstream_head = match up.response().await {
        Ok(h) => h,
        Err(f) => return failed(pending, f, req, site, ctx, failed_status),
    };
    let (cache_status, mut store) = match pending.on_head(&upstream_head, req).await {
        Next::Answer(response) => {
            up.release_if_bodiless().await;
            return Forwarded::Answer(handler::with_hsts(response, site));
        }
        Next::Pass(status, store) => (status, store),
    };
    let status = upstream_head.status;
    let fields = proxy::client_fields(&mut upstream_head, &cache_status);
    let response = Response { status: Status(status), headers: fields, body: Body::Empty, refused: None };
    let response = handler::with_hsts(response, site);
    let limit = settings.send_timeout;
    let head_sent = within(limit, stream.send_response(super::head(&response))).await;
    let answered = Instant::now();
    if let Err(e) = head_sent {
        return Forwarded::Streamed { status, answered, sent: Err((0, e)) };
    }
    let mut sent = 0u64;
    loop {
        let mut piece = Vec::with_capacity(PIECE);
        match up.read_body(&mut piece).await {
            Ok(true) if piece.is_empty() => {}
            Ok(true) => {
                if let Some(store) = store.as_mut() {
                    store.write(&piece);
                }
                let n = piece.len() as u64;
                metrics::body_bytes("copy", n);
                if let Err(e) = within(limit, stream.send_data(Bytes::from(piece))).await {
                    return Forwarded::Streamed { status, answered, sent: Err((sent, e)) };
                }
                sent += n;
            }
            Ok(false) => break,
            Err(f) => return Forwarded::Streamed { status, answered, sent: Err((sent, Unsent::Upstream(f))) },
        }
    }
    drop(up);
    if let Some(store) = store {
        store.commit().await;
    }
    let end = within(limit, stream.finish()).await;
    Forwarded::Streamed { status, answered, sent: end.map(|()| sent).map_err(|e| (sent, e)) }
}

/// The answer to an exchange that failed before a response head: the stale entry
/// under `stale-if-error`, or [`refused`].
fn failed(
    pending: Pending,
    f: Failure,
    req: &Request,
    site: &Site<'_>,
    ctx: &Context<'_, Settings>,
    cache_status: String,
) -> Forwarded {
    match pending.on_failure(&f, req) {
        Some(stale) => Forwarded::Answer(handler::with_hsts(stale, site)),
        None => refused(f, req, site, ctx, cache_status),
    }
}

/// The failure's status (502, 504, or what the request body's failure calls for)
/// with the Cache-Status `cache_status`, and a log line.
fn refused(f: Failure, req: &Request, site: &Site<'_>, ctx: &Context<'_, Settings>, cache_status: String) -> Forwarded {
    tracing::warn!("proxy {} \"{} {} HTTP/3.0\": {} {f}", ctx.peer, req.method, req.path, f.status.0);
    let status = format!("{cache_status}; detail={}", f.kind);
    let r = handler::refusal(f.status, site, req.method == Method::Head);
    Forwarded::Answer(r.with(Header::Field("Cache-Status".into(), status)))
}

/// Sends the request body as it arrives on `stream`, within `max_body_bytes`, each
/// piece awaited for at most the header timeout, then ends it.
///
/// # Cancel safety
/// Not cancel-safe: part of a piece may have been sent.
async fn send_body<S: BidiStream<Bytes>>(
    stream: &mut RequestStream<S, Bytes>,
    up: &mut Exchange<'_>,
    settings: &Settings,
) -> Result<(), Failure> {
    let mut allowed = settings.max_body_bytes;
    loop {
        let mut piece = match tokio::time::timeout(settings.header_timeout, stream.recv_data()).await {
            Ok(Ok(Some(piece))) => piece,
            Ok(Ok(None)) => break,
            Ok(Err(e)) => return Err(client_failed(up, Status::BAD_REQUEST, format!("the request body failed: {e}"))),
            Err(_) => {
                let why = "the request body stalled past the header timeout".into();
                return Err(client_failed(up, Status::REQUEST_TIMEOUT, why));
            }
        };
        while piece.has_remaining() {
            let chunk = piece.chunk();
            if chunk.len() as u64 > allowed {
                let why = "request body exceeds max_body_bytes".into();
                return Err(client_failed(up, Status::PAYLOAD_TOO_LARGE, why));
            }
            allowed -= chunk.len() as u64;
            up.send_body(chunk).await?;
            let n = chunk.len();
            piece.advance(n);
        }
    }
    up.end_body().await
}

/// A failure of the client's request body, answered with `status`.
fn client_failed(up: &Exchange<'_>, status: Status, detail: String) -> Failure {
    Failure { status, kind: "request-body", detail, ..up.failure_now("body", "") }
}
