//! HTTP/1.1 (and 1.0): one connection's life. Requests are read and answered in
//! order, each passing through the same phases: read head -> check limits and
//! method -> discard any body -> [`handler::handle`] -> send -> log.
//!
//! The loop is generic over [`Transport`]: it knows nothing of TLS, sockets or
//! configuration; its settings and the site come in as arguments.

pub mod parse;
pub mod write;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::Transport;
use crate::handler::{self, Body, Pick, Response, Site, Sites, Status};
use crate::log::{AccessEntry, AccessLog, RequestLine};
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

/// How the connection ended, for the caller's counters.
#[derive(Debug)]
pub enum End<E> {
    /// The client closed, or we close after `Connection: close` or a final error
    /// response: the caller closes gracefully.
    Done,
    /// Idle keep-alive, slow request head, or a client that stopped reading (send timeout).
    Timeout,
    /// The transport failed mid-connection; the caller must not close gracefully.
    Error(E),
    /// The peer closed in the middle of a request body it had announced.
    Truncated,
}

/// Serves requests on `conn` until the connection ends or `shutdown` turns true
/// (a request under way is answered first, with `Connection: close`).
///
/// # Cancel safety
/// Not cancel-safe: a response may be cut in the middle. The loop watches
/// `shutdown` itself; callers do not need to race it.
pub async fn serve<T: Transport>(
    conn: &mut T,
    settings: &Settings,
    sites: &Sites<'_>,
    log: &AccessLog,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
) -> End<T::Error> {
    let mut buf: Vec<u8> = Vec::with_capacity(2048);
    // One wait for shutdown for the connection's life, polled by every idle read:
    // a wait made per read would register with the watch and leave it again for
    // each request.
    let mut stop_rx = shutdown.clone();
    let stop = stop_rx.wait_for(|s| *s);
    tokio::pin!(stop);
    loop {
        // Phase 1: a complete request head.
        let mut started: Option<Instant> = if buf.is_empty() { None } else { Some(Instant::now()) };
        let parsed = loop {
            match parse::parse(&buf, settings.max_head_bytes) {
                Ok(Some(r)) => break Ok(r),
                Ok(None) => {}
                Err(bad) => break Err(bad),
            }
            let timeout = match started {
                None => settings.idle_timeout,
                Some(t) => settings.header_timeout.saturating_sub(t.elapsed()),
            };
            let before = buf.len();
            let read = tokio::select! {
                r = conn.read(&mut buf, timeout) => r,
                _ = &mut stop, if buf.is_empty() => return End::Done,
            };
            match read {
                Ok(0) => return End::Done,
                Ok(_) => {
                    if started.is_none() && buf.len() > before {
                        started = Some(Instant::now());
                    }
                }
                Err(e) if T::timed_out(&e) => {
                    if buf.is_empty() {
                        return End::Timeout;
                    }
                    let bad =
                        BadRequest { status: Status::REQUEST_TIMEOUT, reason: "request head not received in time" };
                    refuse_unparsed(conn, &sites.default, log, peer, &buf, &bad).await;
                    return End::Timeout;
                }
                Err(e) => return End::Error(e),
            }
        };
        let t0 = started.unwrap_or_else(Instant::now);
        let (head, used) = match parsed {
            Ok(r) => r,
            Err(bad) => {
                refuse_unparsed(conn, &sites.default, log, peer, &buf, &bad).await;
                conn.linger_on_close(shutdown.clone());
                return End::Done;
            }
        };
        buf.drain(..used);
        let req = &head.request;
        let mut keep_alive = head.keep_alive && !*shutdown.borrow();
        // The site is chosen by Host for each request: one connection may carry
        // requests for several names its certificate covers.
        let site = match sites.pick(req.authority.as_deref()) {
            Pick::Site(s) => s,
            Pick::Misdirected => {
                let response = handler::with_hsts(Response::page(Status::MISDIRECTED_REQUEST), &sites.default);
                let response = if req.method == handler::Method::Head { response.without_body() } else { response };
                refuse(conn, log, peer, Some(&head), response, "no site has the requested host", Instant::now()).await;
                conn.linger_on_close(shutdown.clone());
                return End::Done;
            }
        };
        let site = &site;

        // Phase 2: a request body is read and thrown away, within limits. A client
        // that waits for `100 Continue` gets the final answer at once instead when
        // the body would not be read: too large, or a method we refuse.
        if head.content_length > settings.max_body_bytes {
            let response = handler::with_hsts(Response::page(Status::PAYLOAD_TOO_LARGE), site);
            let response = if req.method == handler::Method::Head { response.without_body() } else { response };
            refuse(conn, log, peer, Some(&head), response, "request body exceeds max_body_bytes", Instant::now()).await;
            conn.linger_on_close(shutdown.clone());
            return End::Done;
        }
        if head.content_length > 0 && head.expect_continue && !req.method.is_served() {
            let response = handler::handle(req, site);
            refuse(conn, log, peer, Some(&head), response, "method not allowed (body not read)", t0).await;
            conn.linger_on_close(shutdown.clone());
            return End::Done;
        }
        if head.content_length > 0 {
            // The client may already have sent the body; RFC 9110 section 10.1.1 lets
            // the server send 100 anyway, and nginx does.
            if head.expect_continue {
                if let Err(e) = conn.send(write::CONTINUE, None).await {
                    return End::Error(e);
                }
            }
            match discard_body(conn, &mut buf, head.content_length, settings.header_timeout).await {
                Ok(true) => {}
                Ok(false) => return End::Truncated,
                Err(e) => return End::Error(e),
            }
        }

        // Phases 3-5: method, file, preconditions, range.
        let response = handler::handle(req, site);
        if let Some(why) = &response.refused {
            refused(&head, response.status, why, peer);
        }

        // Phase 6: send.
        let status = response.status;
        let ttfb = t0.elapsed();
        if !keep_alive {
            conn.last_response();
        }
        let bytes = match send(conn, &response, head.version, keep_alive).await {
            Ok(b) => b,
            // The response could not be completed; the connection is cut without
            // close_notify so the client cannot take a partial body for a whole one.
            // A client that stopped reading (send timeout) counts as a timeout.
            Err(e) if T::timed_out(&e) => return End::Timeout,
            Err(e) => return End::Error(e),
        };

        // Phase 7: log.
        log.write(&entry(conn, peer, Some(&head), status, bytes, t0, ttfb));

        if *shutdown.borrow() {
            keep_alive = false;
        }
        if !keep_alive {
            conn.linger_on_close(shutdown.clone());
            return End::Done;
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
        body => {
            conn.send(&write::head_and_bytes(response, version, keep_alive), None).await?;
            Ok(match body {
                Body::Bytes(b) => b.len() as u64,
                _ => 0,
            })
        }
    }
}

fn line(head: &Head) -> RequestLine<'_> {
    RequestLine { method: &head.request.method, target: &head.target, version: head.version.as_str() }
}

fn refused(head: &Head, status: Status, why: &str, peer: SocketAddr) {
    tracing::info!(
        "refused {peer} \"{} {} {}\": {} {}",
        head.request.method,
        head.target,
        head.version.as_str(),
        status.0,
        why
    );
}

/// Answers a request whose head could not be parsed, then the connection ends.
/// A HEAD request's answer has no body, though the head is incomplete.
async fn refuse_unparsed<T: Transport>(
    conn: &mut T,
    site: &Site<'_>,
    log: &AccessLog,
    peer: SocketAddr,
    buf: &[u8],
    bad: &BadRequest,
) {
    let response = handler::with_hsts(Response::page(bad.status), site);
    let response = if parse::is_head(buf) { response.without_body() } else { response };
    refuse(conn, log, peer, None, response, bad.reason, Instant::now()).await;
}

/// Sends a final refusal with `Connection: close` and logs it; a failure to send
/// changes nothing, the connection ends anyway.
async fn refuse<T: Transport>(
    conn: &mut T,
    log: &AccessLog,
    peer: SocketAddr,
    head: Option<&Head>,
    response: Response,
    why: impl Into<Cow<'static, str>>,
    started: Instant,
) {
    let why = why.into();
    match head {
        Some(h) => refused(h, response.status, &why, peer),
        None => tracing::info!("refused {peer} \"\": {} {}", response.status.0, why),
    }
    let version = head.map_or(Version::Http11, |h| h.version);
    let ttfb = started.elapsed();
    conn.last_response();
    let bytes = send(conn, &response, version, false).await.unwrap_or(0);
    log.write(&entry(conn, peer, head, response.status, bytes, started, ttfb));
}

/// The access-log entry of a request answered on `conn`; `head` is `None` when
/// none could be parsed.
fn entry<'a, T: Transport>(
    conn: &T,
    peer: SocketAddr,
    head: Option<&'a Head>,
    status: Status,
    bytes: u64,
    started: Instant,
    ttfb: Duration,
) -> AccessEntry<'a> {
    AccessEntry {
        peer,
        request: head.map(line),
        status: status.0,
        bytes,
        started,
        ttfb,
        layer: conn.layer(),
        referer: head.and_then(|h| h.referer.as_deref()),
        user_agent: head.and_then(|h| h.user_agent.as_deref()),
        tls: conn.tls(),
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
