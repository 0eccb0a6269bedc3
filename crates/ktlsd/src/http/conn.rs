//! One connection's HTTP life: requests are read and answered in order, each passing
//! through the same phases: read head -> check limits and method -> discard any body ->
//! resolve the file -> evaluate preconditions and range -> send -> log.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::preconditions::{self, Outcome, RangeOutcome, Validators};
use super::request::{self, BadRequest, Request, Version};
use super::response::{self, Head};
use super::Status;
use super::Transport;
use crate::files::{self, FileRange, Refusal, Resolved};
use crate::log::{AccessEntry, AccessLog};
use crate::server::Shared;

/// How the connection ended, for the worker's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Client closed, or we closed after `Connection: close` / a final error response.
    Done,
    /// Idle keep-alive, slow request head, or a client that stopped reading (send timeout).
    Timeout,
    /// Socket or TLS error mid-connection.
    Error,
}

/// What the body phase decided.
#[allow(clippy::large_enum_variant)] // lives on the stack for one request
enum Answer {
    /// Head plus optional file range.
    File { head: Vec<u8>, found: files::Found, range: Option<(u64, u64)>, status: Status },
    /// A complete small response (error, redirect, listing, 304).
    Small { bytes: Vec<u8>, status: Status },
}

pub async fn serve<T: Transport>(
    session: &mut T,
    shared: &Shared,
    log: &AccessLog,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) -> End {
    let cfg = &shared.config;
    let hsts = cfg.hsts.as_deref();
    let mut buf: Vec<u8> = Vec::with_capacity(2048);
    loop {
        // Phase 1: a complete request head.
        let mut started: Option<Instant> = if buf.is_empty() { None } else { Some(Instant::now()) };
        let parsed = loop {
            match request::parse(&buf, cfg.limits.max_header_bytes) {
                Ok(Some(r)) => break Ok(r),
                Ok(None) => {}
                Err(bad) => break Err(bad),
            }
            let timeout = match started {
                None => cfg.timeouts.idle,
                Some(t) => cfg.timeouts.header.saturating_sub(t.elapsed()),
            };
            let before = buf.len();
            let read = tokio::select! {
                r = session.read(&mut buf, timeout) => r,
                _ = shutdown.wait_for(|s| *s), if buf.is_empty() => return End::Done,
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
                    let bad = BadRequest { status: Status::REQUEST_TIMEOUT, reason: "request head not received in time" };
                    refuse_and_close(session, log, peer, &Request::default(), request::is_head(&buf), &bad, hsts).await;
                    return End::Timeout;
                }
                Err(_) => return End::Error,
            }
        };
        let t0 = started.unwrap_or_else(Instant::now);
        let (req, used) = match parsed {
            Ok(r) => r,
            Err(bad) => {
                refuse_and_close(session, log, peer, &Request::default(), request::is_head(&buf), &bad, hsts).await;
                session.linger_on_close(shutdown.clone());
                return End::Done;
            }
        };
        buf.drain(..used);
        let version = req.version.unwrap_or(Version::Http11);
        let mut keep_alive = req.keep_alive && !*shutdown.borrow();
        let head_only = req.method == "HEAD";
        let method_allowed = req.method == "GET" || head_only;

        // Phase 2: a request body is read and thrown away, within limits. A client
        // that waits for `100 Continue` gets the final answer at once instead when
        // the body would not be read: too large, or a method we refuse.
        if req.content_length > cfg.limits.max_body_bytes {
            let bad = BadRequest { status: Status::PAYLOAD_TOO_LARGE, reason: "request body exceeds max_body_bytes" };
            refuse_and_close(session, log, peer, &req, head_only, &bad, hsts).await;
            session.linger_on_close(shutdown.clone());
            return End::Done;
        }
        if req.content_length > 0 && req.expect_continue && !method_allowed {
            refused(&req, Status::METHOD_NOT_ALLOWED, "method not allowed (body not read)", peer);
            let bytes = method_not_allowed(version, false, hsts);
            let _ = session.send(&bytes, None).await;
            log.write(&AccessEntry { peer, line: &req.line, status: 405, bytes: 0, started: t0, mode: session.label() });
            session.linger_on_close(shutdown.clone());
            return End::Done;
        }
        if req.content_length > 0 {
            // The client may already have sent the body; RFC 9110 section 10.1.1 lets
            // the server send 100 anyway, and nginx does.
            if req.expect_continue && session.send(response::CONTINUE, None).await.is_err() {
                return End::Error;
            }
            match discard_body(session, &mut buf, req.content_length, cfg.timeouts.header).await {
                Ok(()) => {}
                Err(_) => return End::Error,
            }
        }

        // Phases 3-5: method, file, preconditions, range.
        let answer = if !method_allowed {
            refused(&req, Status::METHOD_NOT_ALLOWED, "method not allowed", peer);
            Answer::Small { bytes: method_not_allowed(version, keep_alive, hsts), status: Status::METHOD_NOT_ALLOWED }
        } else {
            answer(&req, shared, version, keep_alive, head_only, peer)
        };

        // Phase 6: send.
        let (sent, status) = match answer {
            Answer::Small { bytes, status } => (session.send(&bytes, None).await.map(|_| 0), status),
            Answer::File { head, found, range, status } => {
                let body = match range {
                    Some((start, end)) if !head_only => {
                        Some(FileRange { file: &found.file, range: start..end + 1 })
                    }
                    _ => None,
                };
                (session.send(&head, body).await, status)
            }
        };
        let bytes = match sent {
            Ok(b) => b,
            // The response could not be completed; the connection is cut without
            // close_notify so the client cannot take a partial body for a whole one.
            // A client that stopped reading (send timeout) counts as a timeout.
            Err(e) if T::timed_out(&e) => return End::Timeout,
            Err(_) => return End::Error,
        };

        // Phase 7: log.
        log.write(&AccessEntry { peer, line: &req.line, status: status.0, bytes, started: t0, mode: session.label() });

        if *shutdown.borrow() {
            keep_alive = false;
        }
        if !keep_alive {
            session.linger_on_close(shutdown.clone());
            return End::Done;
        }
    }
}

fn method_not_allowed(version: Version, keep_alive: bool, hsts: Option<&str>) -> Vec<u8> {
    let extra = with_hsts(&[("Allow", "GET, HEAD".to_string())], hsts);
    response::simple(version, Status::METHOD_NOT_ALLOWED, &extra, keep_alive, false)
}

/// `extra` headers plus Strict-Transport-Security when configured: every HTTPS
/// response carries it, errors included (RFC 6797 section 8.1 takes it from any).
fn with_hsts<'a>(extra: &[(&'a str, String)], hsts: Option<&str>) -> Vec<(&'a str, String)> {
    let mut all = extra.to_vec();
    if let Some(v) = hsts {
        all.push((STS, v.to_string()));
    }
    all
}

const STS: &str = "Strict-Transport-Security";

fn refused(req: &Request, status: Status, why: &str, peer: SocketAddr) {
    tracing::info!("refused {peer} \"{}\": {} {}", req.line, status.0, why);
}

/// Answers a request that cannot be served, then ends the connection. `head_only`:
/// the request is a HEAD, whose answer has no body.
async fn refuse_and_close<T: Transport>(
    session: &mut T,
    log: &AccessLog,
    peer: SocketAddr,
    req: &Request,
    head_only: bool,
    bad: &BadRequest,
    hsts: Option<&str>,
) {
    refused(req, bad.status, bad.reason, peer);
    let version = req.version.unwrap_or(Version::Http11);
    let bytes = response::simple(version, bad.status, &with_hsts(&[], hsts), false, head_only);
    let _ = session.send(&bytes, None).await;
    let line = if req.line.is_empty() { "-" } else { req.line.as_str() };
    log.write(&AccessEntry { peer, line, status: bad.status.0, bytes: 0, started: Instant::now(), mode: session.label() });
}

async fn discard_body<T: Transport>(session: &mut T, buf: &mut Vec<u8>, mut left: u64, timeout: Duration) -> Result<(), ()> {
    loop {
        let take = (buf.len() as u64).min(left) as usize;
        buf.drain(..take);
        left -= take as u64;
        if left == 0 {
            return Ok(());
        }
        if session.read(buf, timeout).await.map_err(drop)? == 0 {
            return Err(());
        }
    }
}

/// Resolves the file and decides the response for a GET or HEAD.
fn answer(req: &Request, shared: &Shared, version: Version, keep_alive: bool, head_only: bool, peer: SocketAddr) -> Answer {
    let hsts = shared.config.hsts.as_deref();
    let small = |status: Status, extra: &[(&str, String)]| Answer::Small {
        bytes: response::simple(version, status, &with_hsts(extra, hsts), keep_alive, head_only),
        status,
    };
    let found = match files::resolve(&shared.root, &req.path, shared.file_options) {
        Ok(Resolved::File(f)) => f,
        Ok(Resolved::Directory(listing)) => {
            return match files::listing_html(&listing, shared.file_options) {
                Ok(html) => {
                    let mut bytes = Head::new(Status::OK)
                        .header("Content-Type", "text/html; charset=utf-8")
                        .header("Content-Length", html.len())
                        .header_opt(STS, hsts)
                        .finish(version, keep_alive);
                    if !head_only {
                        bytes.extend_from_slice(html.as_bytes());
                    }
                    Answer::Small { bytes, status: Status::OK }
                }
                Err(_) => {
                    refused(req, Status::FORBIDDEN, "directory cannot be listed", peer);
                    small(Status::FORBIDDEN, &[])
                }
            };
        }
        Err(Refusal::AddSlash(mut location)) => {
            // The query goes along, as nginx keeps it (`$args`).
            if let Some(q) = &req.query {
                location.push('?');
                location.push_str(q);
            }
            return small(Status::MOVED_PERMANENTLY, &[("Location", location)]);
        }
        Err(refusal) => {
            let status = Status(refusal.status());
            refused(req, status, &refusal.reason(), peer);
            return small(status, &[]);
        }
    };

    let size = found.meta.len();
    let etag = files::etag(&found.meta);
    let modified = files::modified(&found.meta);
    let validators = Validators { etag: &etag, modified };
    let last_modified = httpdate::fmt_http_date(modified);

    match preconditions::evaluate(req, &validators) {
        Outcome::Proceed => {}
        Outcome::NotModified => {
            let head = Head::new(Status::NOT_MODIFIED)
                .header("Last-Modified", &last_modified)
                .header("ETag", &etag)
                .header_opt(STS, hsts)
                .finish(version, keep_alive);
            return Answer::Small { bytes: head, status: Status::NOT_MODIFIED };
        }
        Outcome::Failed => return small(Status::PRECONDITION_FAILED, &[]),
    }

    let use_range = req.range.is_some()
        && req.if_range.as_deref().is_none_or(|v| preconditions::if_range_matches(v, &validators));
    let range = match req.range.as_deref() {
        Some(r) if use_range => preconditions::range(r, size),
        _ => RangeOutcome::Full,
    };
    let content_type = files::content_type(&found.rel);
    let (status, start, end) = match range {
        RangeOutcome::Full => (Status::OK, 0, size),
        RangeOutcome::Partial { start, end } => (Status::PARTIAL_CONTENT, start, end + 1),
        RangeOutcome::Unsatisfiable => {
            return small(Status::RANGE_NOT_SATISFIABLE, &[("Content-Range", format!("bytes */{size}"))]);
        }
    };
    let mut head = Head::new(status)
        .header("Content-Type", content_type)
        .header("Content-Length", end - start)
        .header("Last-Modified", last_modified)
        .header("ETag", etag)
        .header("Accept-Ranges", "bytes")
        .header_opt(STS, hsts);
    if status == Status::PARTIAL_CONTENT {
        head = head.header("Content-Range", format!("bytes {start}-{}/{size}", end - 1));
    }
    let head = head.finish(version, keep_alive);
    let range = (end > start).then(|| (start, end - 1));
    Answer::File { head, found, range, status }
}
