//! HTTP/1.x framing of a proxied request ([`Connection::proxy`]): the request body
//! goes to the upstream as it arrives (Content-Length framed, within
//! `max_body_bytes`), the response head is written with the client's framing
//! (Content-Length when the upstream gave one, else chunked, or close-delimited for an
//! HTTP/1.0 client), and the body follows piece by piece. A Content-Length body
//! from a plain `http://` upstream to a client on kernel TLS, not being stored,
//! moves by `splice` instead (`Transport::splice`): socket to socket, never
//! through user space. An upstream that fails after the head was sent cuts the
//! connection without the last chunk or close_notify, so the client never takes
//! part of a body for the whole.
//!
//! With `cache = true`, the response cache is asked first (`handler::proxy::cached`):
//! a hit is answered as a file, and a stored miss's body is teed into its entry as
//! it is sent, committed once complete. The exchange with the upstream itself is
//! `handler::proxy`'s.

use std::io::Write;
use std::time::Instant;

use super::parse::Version;
use super::{logged, write, Connection, Exchange, State};
use crate::handler::proxy::cached::{self, Next, Plan};
use crate::handler::proxy::parse::{Chunked, Framing};
use crate::handler::proxy::upstream::{closed_early, IoFailure};
use crate::handler::proxy::{self, headers, metrics, Failure, Forwarding, Rule};
use crate::handler::{self, Body, Header, Method, Response, Site, Status};
use crate::http::conn::Sent;
use crate::http::{End, Spliced, Transport};
use crate::vocab::BodyPath;

impl<'a, T: Transport> Connection<'_, 'a, T> {
    /// Forwards the request of `x` by `rule` and sends the answer; the connection then
    /// waits for the next head, or ends.
    ///
    /// # Cancel safety
    /// Not cancel-safe, as the loop's other states: a response may be cut.
    pub(super) async fn proxy(&mut self, x: Exchange, site: Site<'a>, rule: &'a Rule) -> State<'a, T::Error> {
        let req = &x.head.request;
        let mut fields = x.raw.as_deref().map(headers::fields_of_head).unwrap_or_default();
        let target = match x.head.target.starts_with('/') {
            true => x.head.target.clone(),
            // Absolute form: the path and query alone go upstream.
            false => match &req.query {
                Some(q) => format!("{}?{q}", req.path),
                None => req.path.clone(),
            },
        };
        let length = x.head.content_length;
        let fwd = Forwarding {
            method: req.method.as_str().to_string(),
            target,
            authority: req.authority.clone(),
            peer: self.ctx.peer.ip(),
            version: if x.head.version == Version::Http10 { "1.0" } else { "1.1" },
            body: if x.head.chunked { Some(None) } else { (length > 0).then_some(Some(length)) },
        };
        let has_body = length > 0 || x.head.chunked;
        let pending = match cached::plan(&self.ctx.sites, rule, req, has_body, &fwd, &mut fields).await {
            Plan::Answer(response) => return self.reply_as(x, handler::with_hsts(response, &site), true).await,
            Plan::Forward(pending) => pending,
        };
        let failed_status = pending.failed_status();
        // What the client sent of a Content-Length body with its head goes in the head's write.
        let first = if x.head.chunked { 0 } else { (self.buf.len() as u64).min(length) as usize };
        let mut up = match proxy::Exchange::begin_with_body(rule, fwd, fields, &self.buf[..first]).await {
            Ok(up) => up,
            Err(f) => return self.proxy_failed_or_stale(x, site, &f, pending).await,
        };
        self.buf.drain(..first);
        if length > 0 || x.head.chunked {
            if x.head.expect_continue {
                if let Err(e) = self.conn.send(write::CONTINUE, None).await {
                    return State::Closed(End::Error(e));
                }
            }
            let sent = match x.head.chunked {
                true => self.forward_chunked(&mut up).await,
                false => self.forward_length(&mut up, length - first as u64).await,
            };
            match sent {
                RequestBody::Sent => {}
                RequestBody::ClientEnded(end) => return State::Closed(end),
                RequestBody::UpstreamFailed(f) => return self.proxy_failed(&x, &site, &f, &failed_status).await,
                RequestBody::Refused(status, why) => {
                    let response = handler::refusal(status, &site, x.head.request.method == Method::Head);
                    return self.refuse_and_close(&x.head, response, why, Instant::now()).await;
                }
            }
        }
        let mut head = match up.response().await {
            Ok(h) => h,
            Err(f) => return self.proxy_failed_or_stale(x, site, &f, pending).await,
        };
        let (cache_status, mut store) = match pending.on_head(&head, &x.head.request).await {
            Next::Answer(response) => {
                up.release_if_bodiless().await;
                drop(up);
                return self.reply_as(x, handler::with_hsts(response, &site), true).await;
            }
            Next::Pass(status, store) => (status, store),
        };
        let ttfb = x.started.elapsed();
        let mut fields = proxy::client_fields(&mut head, &cache_status);
        let mut keep_alive = x.keep_alive;
        let chunked = match head.framing {
            Framing::Length(_) | Framing::None => false,
            Framing::Chunked | Framing::Close if x.head.version == Version::Http11 => {
                fields.push(Header::Field("Transfer-Encoding".into(), "chunked".into()));
                true
            }
            Framing::Chunked | Framing::Close => {
                keep_alive = false;
                false
            }
        };
        let response = Response { status: Status(head.status), headers: fields, body: Body::Empty, refused: None };
        let response = handler::with_hsts(response, &site);
        let mut out = write::head_into(proxy::buffers::take(), &response, x.head.version, keep_alive);
        let mut piece = proxy::buffers::take();
        let mut sent = 0u64;
        // The body bytes that came with the upstream's head leave in the head's write
        // (one record, one system call), its end too when they are all of it.
        let mut more = true;
        match up.read_buffered(&mut piece) {
            None => {}
            Some(Ok(m)) => {
                more = m;
                if let Some(store) = store.as_mut() {
                    store.write(&piece);
                }
                frame(&mut out, &piece, chunked);
                sent += piece.len() as u64;
                metrics::body_bytes("copy", piece.len() as u64);
                if chunked && !more {
                    out.extend_from_slice(LAST_CHUNK);
                }
            }
            Some(Err(f)) => {
                let _ = self.conn.send(&out, None).await;
                return self.cut(&x, head.status, 0, ttfb, BodyPath::Copy, &f);
            }
        }
        if let Err(e) = self.conn.send(&out, None).await {
            return State::Closed(if T::timed_out(&e) { End::Timeout } else { End::Error(e) });
        }
        // What the exchange already read goes by copy, the rest by splice when it can.
        let mut splice = !chunked && store.is_none() && self.conn.can_splice();
        let mut path = BodyPath::Copy;
        while more {
            if let Some((from, left, read_timeout)) = up.splice_source().filter(|_| splice) {
                let (moved, cause) = match self.conn.splice(from, left, read_timeout).await {
                    Ok(n) => (n, None),
                    Err(Spliced::Unsupported) => (0, None),
                    Err(Spliced::Peer(e)) => {
                        return State::Closed(if T::timed_out(&e) { End::Timeout } else { End::Error(e) })
                    }
                    Err(Spliced::SourceClosed { moved }) => (moved, Some(IoFailure::Failed(closed_early()))),
                    Err(Spliced::SourceTimedOut { moved }) => (moved, Some(IoFailure::TimedOut)),
                    Err(Spliced::Source { moved, error }) => (moved, Some(IoFailure::Failed(error))),
                };
                splice = false;
                sent += moved;
                metrics::body_bytes(BodyPath::Splice.label(), moved);
                if moved > 0 {
                    path = BodyPath::Splice;
                }
                match cause {
                    None => up.spliced(moved),
                    Some(cause) => {
                        let f = up.splice_failed(cause);
                        return self.cut(&x, head.status, sent, ttfb, path, &f);
                    }
                }
            }
            piece.clear();
            more = match up.read_body(&mut piece).await {
                Ok(more) => more,
                Err(f) => return self.cut(&x, head.status, sent, ttfb, path, &f),
            };
            if !piece.is_empty() {
                if let Some(store) = store.as_mut() {
                    store.write(&piece);
                }
                sent += piece.len() as u64;
                metrics::body_bytes("copy", piece.len() as u64);
            }
            let bytes: &[u8] = match chunked {
                true => {
                    out.clear();
                    frame(&mut out, &piece, true);
                    if !more {
                        out.extend_from_slice(LAST_CHUNK);
                    }
                    &out
                }
                false => &piece,
            };
            if bytes.is_empty() {
                continue;
            }
            if let Err(e) = self.conn.send(bytes, None).await {
                return State::Closed(if T::timed_out(&e) { End::Timeout } else { End::Error(e) });
            }
        }
        proxy::buffers::give(piece);
        proxy::buffers::give(out);
        drop(up);
        if let Some(store) = store {
            // Stored only now that the body is known complete.
            store.commit().await;
        }
        tracing::debug!(
            "proxied \"{} {}\": {} with {sent} body bytes by {}",
            x.head.request.method,
            x.head.target,
            head.status,
            path.label()
        );
        self.log_proxied(&x, head.status, sent, ttfb, path);
        if keep_alive && !self.ctx.stopping() {
            State::Head
        } else {
            self.close()
        }
    }

    /// Forwards `length` body bytes as they arrive.
    async fn forward_length(&mut self, up: &mut proxy::Exchange<'_>, length: u64) -> RequestBody<T::Error> {
        let mut left = length;
        while left > 0 {
            if self.buf.is_empty() {
                if let Err(end) = self.read_more().await {
                    return RequestBody::ClientEnded(end);
                }
            }
            let take = (self.buf.len() as u64).min(left) as usize;
            if let Err(f) = up.send_body(&self.buf[..take]).await {
                return RequestBody::UpstreamFailed(f);
            }
            self.buf.drain(..take);
            left -= take as u64;
        }
        RequestBody::Sent
    }

    /// Decodes a chunked body as it arrives and forwards its data, within `max_body_bytes`.
    async fn forward_chunked(&mut self, up: &mut proxy::Exchange<'_>) -> RequestBody<T::Error> {
        let max = self.ctx.settings.max_body_bytes;
        let (mut decoder, mut piece, mut total) = (Chunked::default(), Vec::new(), 0u64);
        loop {
            if !self.buf.is_empty() {
                let Ok(used) = decoder.decode(&self.buf, &mut piece) else {
                    return RequestBody::Refused(Status::BAD_REQUEST, "invalid chunked request body");
                };
                self.buf.drain(..used);
                total += piece.len() as u64;
                if total > max {
                    return RequestBody::Refused(Status::PAYLOAD_TOO_LARGE, "request body exceeds max_body_bytes");
                }
                if let Err(f) = up.send_body(&piece).await {
                    return RequestBody::UpstreamFailed(f);
                }
                piece.clear();
                if decoder.is_done() {
                    return match up.end_body().await {
                        Ok(()) => RequestBody::Sent,
                        Err(f) => RequestBody::UpstreamFailed(f),
                    };
                }
                if used > 0 {
                    continue;
                }
            }
            if let Err(end) = self.read_more().await {
                return RequestBody::ClientEnded(end);
            }
        }
    }

    /// Reads more of the request body within the header timeout.
    async fn read_more(&mut self) -> Result<(), End<T::Error>> {
        match self.conn.read(&mut self.buf, self.ctx.settings.header_timeout).await {
            Ok(0) => Err(End::Truncated),
            Ok(_) => Ok(()),
            Err(e) if T::timed_out(&e) => Err(End::Timeout),
            Err(e) => Err(End::Error(e)),
        }
    }

    fn log_proxied(&self, x: &Exchange, status: u16, bytes: u64, ttfb: std::time::Duration, body: BodyPath) {
        let sent = Sent { status, bytes, started: x.started, ttfb, body: Some(body) };
        self.ctx.log(self.conn, Some(logged(&x.head)), sent);
    }

    /// Ends a response whose upstream failed after `sent` body bytes: logged, and the
    /// connection cut so that the client cannot take the part for the whole.
    fn cut(
        &self,
        x: &Exchange,
        status: u16,
        sent: u64,
        ttfb: std::time::Duration,
        path: BodyPath,
        f: &Failure,
    ) -> State<'a, T::Error> {
        tracing::warn!(
            "proxy {} \"{} {}\": {f}; response cut after {sent} body bytes",
            self.ctx.peer,
            x.head.request.method,
            x.head.target
        );
        self.log_proxied(x, status, sent, ttfb, path);
        State::Closed(End::Aborted)
    }

    /// Answers a failed exchange from the stale entry when `stale-if-error` allows
    /// it, else as [`Self::proxy_failed`].
    async fn proxy_failed_or_stale(
        &mut self,
        x: Exchange,
        site: Site<'a>,
        f: &Failure,
        pending: cached::Pending,
    ) -> State<'a, T::Error> {
        let status = pending.failed_status();
        match pending.on_failure(f, &x.head.request) {
            Some(response) => self.reply_as(x, handler::with_hsts(response, &site), true).await,
            None => self.proxy_failed(&x, &site, f, &status).await,
        }
    }

    /// Answers a failed exchange with 502 or 504 (no body for HEAD) and `cache_status`
    /// with the failure's kind, logs why, and closes the connection (a request body
    /// may be left unread).
    async fn proxy_failed(
        &mut self,
        x: &Exchange,
        site: &Site<'a>,
        f: &Failure,
        cache_status: &str,
    ) -> State<'a, T::Error> {
        tracing::warn!("proxy {} \"{} {}\": {} {f}", self.ctx.peer, x.head.request.method, x.head.target, f.status.0);
        let head_request = x.head.request.method == Method::Head;
        let response = handler::refusal(f.status, site, head_request)
            .with(Header::Field("Cache-Status".into(), format!("{cache_status}; detail={}", f.kind)));
        let started = Instant::now();
        self.conn.last_response();
        let bytes = super::send(self.conn, &response, x.head.version, false).await.unwrap_or(0);
        self.ctx.log(
            self.conn,
            Some(logged(&x.head)),
            Sent { status: f.status.0, bytes, started: x.started, ttfb: started.elapsed(), body: Some(BodyPath::Copy) },
        );
        self.close()
    }
}

/// How forwarding a request body ended.
enum RequestBody<E> {
    Sent,
    /// The client went away or was too slow.
    ClientEnded(End<E>),
    UpstreamFailed(Failure),
    /// The body itself is refused (malformed, too large).
    Refused(Status, &'static str),
}

/// The last chunk of a chunked body, with no trailer.
const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Appends `piece` of a body to `out`, as a chunk when `chunked` (nothing for an empty piece).
fn frame(out: &mut Vec<u8>, piece: &[u8], chunked: bool) {
    if piece.is_empty() {
        return;
    }
    if chunked {
        let _ = write!(out, "{:x}\r\n", piece.len()); // into a Vec: cannot fail
        out.extend_from_slice(piece);
        out.extend_from_slice(b"\r\n");
    } else {
        out.extend_from_slice(piece);
    }
}
