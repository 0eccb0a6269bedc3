//! One forwarded request, the same for every codec: [`Forward::run`] asks the cache,
//! opens the exchange with an upstream (the request body at hand goes with the
//! head), uploads the rest of the body within `max_body_bytes`, reads the
//! upstream's head, lets the cache decide what it does to the stored entry, then
//! streams the body to the client through the codec's [`Downstream`]: bytes as they
//! come (each piece at most [`PIECE`], so a response holds one piece in memory
//! whatever its size), or, from a plain `http://` upstream to a client that can
//! take it, the rest of a Content-Length body by `splice`. A body being stored is
//! teed into the cache entry as it passes and committed before the last bytes
//! leave; one that fits a piece and follows its head at once is read and stored
//! before its head leaves, which then says `stored` (a larger or slower one's head
//! cannot know: its `Cache-Status` says only `fwd=miss`). The upstream's 103 Early
//! Hints go to the client before the final head ([`Downstream::send_interim`]; the
//! first [`MAX_HINTS`]); its other interim answers are dropped (a `100 Continue` is
//! the codec's own to send). A body that fails after the head is cut
//! ([`Downstream::abort`]) and never stored.
//!
//! Not here: how a codec frames what it is handed, and the upstream's wire format
//! (`super::Exchange`).

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cached::{self, Next, Pending, Plan};
use super::parse::Framing;
use super::ranged::{self, Cold};
pub use super::replies::Added;
use super::replies::{answer, commit, commit_before_head, cut, refused};
use super::upstream::{closed_early, IoFailure};
use super::{buffers, client_fields, metrics, tunnel, Exchange, Failure, FailureKind, Forwarding, Rule, PIECE};
use crate::handler::cache::{Cache, Key};
use crate::handler::downstream::{Answer, BodyError, Downstream, Outcome, StreamEnd, Streamed};
use crate::handler::response::ContentRange;
use crate::handler::{Body, Header, Request, Response, Status};
use crate::vocab::{BodyPath, Spliced};

/// How long a body being stored of at most one piece is awaited before its head
/// leaves, so that the head may say `stored`: an upstream that sends its body with
/// its head is well within it, and a slow one delays the head by no more.
const STORE_FIRST_WAIT: Duration = Duration::from_millis(200);

/// Most 103 (Early Hints) responses relayed per request; an upstream's further
/// ones are read and dropped.
const MAX_HINTS: usize = 4;

/// A request a `[[proxy]]` rule takes, owning all it needs (so that a codec may run
/// it on a task of its own).
pub struct Forward {
    rule: Arc<Rule>,
    fwd: Forwarding,
    fields: Vec<(String, String)>,
    max_body: u64,
    added: Added,
    cache: Option<(Arc<Cache>, Key)>,
}

impl Forward {
    pub(crate) fn new(
        rule: Arc<Rule>,
        fwd: Forwarding,
        fields: Vec<(String, String)>,
        max_body: u64,
        added: Added,
    ) -> Forward {
        Forward { rule, fwd, fields, max_body, added, cache: None }
    }

    /// With the cache `rule` stores into, when it caches (the sites hold it).
    pub fn with_cache(mut self, sites: &crate::handler::Sites<'_>) -> Forward {
        if self.fwd.upgrade.is_some() {
            // A tunnel is never stored, nor answered from the cache.
            return self;
        }
        let target = self.fwd.cache_key.as_deref().unwrap_or(&self.fwd.target);
        self.cache = cached::cache_of(sites, &self.rule, self.fwd.authority.as_deref(), target);
        self
    }

    /// Runs the forward over `d` to its end.
    ///
    /// # Cancel safety
    /// Dropped at any await (the client gone), it leaves nothing half-done behind:
    /// the upstream connection is closed rather than pooled, a cache fill is
    /// abandoned (its temporary file removed, lookups waiting for it woken), and a
    /// commit already under way finishes on the blocking pool with a complete body.
    pub async fn run<D: Downstream>(mut self, req: &Request, d: &mut D) -> Outcome<D::Error> {
        let added = std::mem::take(&mut self.added);
        match self.exchange(req, d, &added).await {
            Outcome::Answer { answer: Answer::Response(mut response), from_cache } => {
                added.apply(&mut response.headers);
                Outcome::Answer { answer: Answer::Response(response), from_cache }
            }
            other => other,
        }
    }

    /// [`Forward::run`] but for the site's fields on a whole answer; a streamed head
    /// gets them here (`added`).
    async fn exchange<D: Downstream>(self, req: &Request, d: &mut D, added: &Added) -> Outcome<D::Error> {
        let Forward { rule, fwd, mut fields, max_body, cache, .. } = self;
        if fwd.version.starts_with('1') && is_grpc(&fields) {
            return answer(grpc_refusal(), false);
        }
        let has_body = fwd.body.is_some();
        if let (Some(n), Some((c, key))) = (super::sliced::applies(&rule, req, &fwd, &fields), cache.as_ref()) {
            let (c, key) = (c.clone(), key.clone());
            return super::sliced::forward(&rule, fwd, fields, c, key, n, req, d, added).await;
        }
        let peer_key = cache.as_ref().map(|(_, k)| k.as_str().to_string());
        let mut pending = match cached::plan(cache, &rule, req, has_body, &fwd, &mut fields).await {
            Plan::Answer(response) => {
                cached::note_answer(&rule, req, &response);
                return answer(response, true);
            }
            Plan::Forward(pending) => pending,
        };
        let failed_status = pending.failed_status();
        // Cache peers: a miss another member owns is asked of it; when it fails, of the origin.
        let route = peer_key
            .filter(|_| pending.is_plain_miss() && !has_body)
            .and_then(|key| super::peers::route(&rule, &fwd, &fields, &key));
        let from_owner = match &route {
            Some(route) => match ask_owner(route, d).await {
                Ok(answered) => answered,
                Err(e) => return Outcome::ClientGone(e),
            },
            None => None,
        };
        let (mut up, mut head, again) = match from_owner {
            Some((up, head)) => {
                pending.leave_to_peer();
                (up, head, None)
            }
            None => {
                if rule.upstreams.first().is_some_and(|u| u.h2) {
                    return super::multiplex::forward(&rule, fwd, fields, max_body, pending, req, d, added).await;
                }
                // A cold range fill may have to ask again with the Range (an object too large).
                let again = pending.is_cold().then(|| fwd.clone());
                let first = if has_body { d.body_at_hand() } else { Vec::new() };
                let mut up = match Exchange::begin_with_body(&rule, fwd, fields, &first).await {
                    Ok(up) => up,
                    Err(f) => return failed(pending, f, req, failed_status),
                };
                if has_body {
                    let allowed = max_body.saturating_sub(first.len() as u64);
                    match upload(d, &mut up, allowed).await {
                        Ok(()) => {}
                        Err(Upload::Client(e)) => return Outcome::ClientGone(e),
                        Err(Upload::Failed(f)) => return refused(f, req, failed_status),
                    }
                }
                let head = match final_head(&mut up, d).await {
                    Ok(head) => head,
                    Err(HeadEnd::Client(e)) => return Outcome::ClientGone(e),
                    Err(HeadEnd::Failed(f)) => return failed(pending, f, req, failed_status),
                };
                (up, head, again)
            }
        };
        let mut cold = pending.cold(&head, req);
        if let (Some(Cold::Again), Some(fwd)) = (&cold, again) {
            // Too large to store: asked again with its Range, as without a cache (the
            // first answer's connection is closed, not pooled).
            if let Some(sent) = pending.again() {
                drop(up);
                up = match Exchange::begin_with_body(&rule, fwd, sent, &[]).await {
                    Ok(up) => up,
                    Err(f) => return failed(pending, f, req, failed_status),
                };
                head = match up.response().await {
                    Ok(head) => head,
                    Err(f) => return failed(pending, f, req, failed_status),
                };
            }
            cold = None;
        }
        if head.status == 101 {
            // Only a request that asked for it gets here with a 101 (parse refuses others).
            let limits = tunnel::Limits { idle: rule.timeouts.tunnel_idle, read: rule.timeouts.read };
            return switch(up, head, req, d, added, failed_status, limits).await;
        }
        if let Some(mut a) = super::control::accel(&rule, &mut head, req) {
            // Never stored: the file is the answer, not the upstream's body (an empty
            // one leaves the connection to the pool).
            up.release_if_bodiless().await;
            up.body_complete();
            added.apply(&mut a.fields);
            return Outcome::Answer { answer: Answer::Accel(Box::new(a)), from_cache: false };
        }
        let (mut cache_status, mut store) = match pending.on_head(&head, req).await {
            Next::Answer(response) => {
                up.release_if_bodiless().await;
                return answer(response, true);
            }
            Next::Pass(status, store) => (status, store),
        };
        cached::note(&rule, req, &cache_status);
        let mut status = head.status;
        let len = match head.framing {
            Framing::None | Framing::Length(0) => {
                // No body (HEAD, 204, 304, or an empty one): a whole answer, its entry stored first.
                up.release_if_bodiless().await;
                up.body_complete();
                drop(up);
                commit_before_head(&mut store, &mut cache_status).await;
                let fields = client_fields(&mut head, &cache_status);
                let response = Response { status: Status(status), headers: fields, body: Body::Empty, refused: None };
                return answer(response, false);
            }
            Framing::Length(n) => Some(n),
            Framing::Chunked | Framing::Close => None,
        };
        // A cold range fill: the client gets its range of the body as it streams past.
        let mut window = None;
        match cold {
            Some(Cold::Window { range, size }) => window = Some((range, size)),
            Some(Cold::Unsatisfiable { size }) => {
                // Answered at once; the entry is not stored (the next request fills it).
                drop(store);
                let response = Response::page(Status::RANGE_NOT_SATISFIABLE)
                    .with(Header::ContentRange(ContentRange::Unsatisfied { size }))
                    .with(Header::Field("Cache-Status".into(), cache_status));
                return answer(response, false);
            }
            _ => {}
        }

        // A body being stored that fits one piece and follows its head at once is
        // read whole first: it is stored before its head leaves, which then says so
        // (and a fault in it is a clean 502). One slower than STORE_FIRST_WAIT
        // streams as any other, so a slow upstream delays the head by that at most.
        let mut piece = buffers::take();
        let mut end = false;
        if let (Some(n), Some(_)) = (len, store.as_ref()) {
            if n <= PIECE as u64 {
                let whole = async {
                    loop {
                        match up.read_body(&mut piece).await {
                            Ok(more) if more && !up.body_complete() => {}
                            Ok(_) => return Ok(()),
                            Err(f) => return Err(f),
                        }
                    }
                };
                // Cancel-safe: bytes read are kept in the exchange or in `piece`.
                match tokio::time::timeout(STORE_FIRST_WAIT, whole).await {
                    Ok(Ok(())) => end = true,
                    Ok(Err(f)) => return refused(f, req, failed_status),
                    Err(_) => {}
                }
                if end {
                    if let Some(s) = store.as_mut() {
                        s.write(&piece);
                    }
                    commit_before_head(&mut store, &mut cache_status).await;
                }
            }
        }
        let mut fields = client_fields(&mut head, &cache_status);
        let mut client_len = len;
        let mut window = window.map(|(range, size)| {
            // A window comes with a Content-Length body only, whose length `client_fields`
            // gives as the typed field (the upstream's own field is dropped there).
            fields.retain(|h| !matches!(h, Header::ContentLength(_)));
            let w = ranged::Window::new(range.clone());
            fields.push(Header::ContentLength(w.len()));
            fields.push(Header::ContentRange(ContentRange::Bytes { range, size }));
            (status, client_len) = (206, Some(w.len()));
            w
        });
        added.apply(&mut fields);
        let response = Response { status: Status(status), headers: fields, body: Body::Empty, refused: None };

        // The body bytes that came with the upstream's head (or in the wait above)
        // leave with the head.
        if !end {
            end = match up.read_buffered(&mut piece) {
                None => false,
                Some(Ok(more)) => !more || up.body_complete(),
                // Nothing is sent yet: a clean 502.
                Some(Err(f)) => return refused(f, req, failed_status),
            };
            if let Some(s) = store.as_mut() {
                s.write(&piece);
            }
            if end {
                commit(&mut store).await;
            }
        }
        let (first, mut client_end) = ranged::to_client(window.as_mut(), &piece, end);
        let mut sent = first.len() as u64;
        metrics::body_bytes(BodyPath::Copy.label(), sent);
        // The rest by splice when the client and the exchange allow it.
        let mut splice =
            !end && store.is_none() && window.is_none() && d.can_splice() && up.plain_body_socket().is_some();
        let source = splice.then(|| up.plain_body_socket()).flatten().map(|s| s.as_fd());
        let head_sent = d.send_head(response, client_len, first, client_end, source).await;
        let answered = Instant::now();
        let streamed = |sent, path, end| Outcome::Streamed(Streamed { status, answered, sent, path, end });
        if let Err(e) = head_sent {
            return streamed(0, BodyPath::Copy, StreamEnd::Client(e));
        }
        let mut path = BodyPath::Copy;
        while !client_end {
            if let Some((from, left, read_timeout)) = up.splice_source().filter(|_| splice) {
                splice = false;
                let (moved, cause) = match d.splice(from, left, read_timeout).await {
                    Ok(n) => (n, None),
                    Err(Spliced::Unsupported) => (0, None),
                    Err(Spliced::Peer(e)) => return streamed(sent, path, StreamEnd::Client(e)),
                    Err(Spliced::SourceClosed { moved }) => (moved, Some(IoFailure::Failed(closed_early()))),
                    Err(Spliced::SourceTimedOut { moved }) => (moved, Some(IoFailure::TimedOut)),
                    Err(Spliced::Source { moved, error }) => (moved, Some(IoFailure::Failed(error))),
                };
                sent += moved;
                metrics::body_bytes(BodyPath::Splice.label(), moved);
                if moved > 0 {
                    path = BodyPath::Splice;
                }
                if let Some(cause) = cause {
                    let f = up.splice_failed(cause);
                    return streamed(sent, path, cut(d, req, f, sent));
                }
                up.spliced(moved);
                if up.body_complete() {
                    (end, client_end) = (true, true);
                    if let Err(e) = d.send_body(&[], true).await {
                        return streamed(sent, path, StreamEnd::Client(e));
                    }
                }
                continue;
            }
            piece.clear();
            let more = match up.read_body(&mut piece).await {
                Ok(more) => more,
                Err(f) => return streamed(sent, path, cut(d, req, f, sent)),
            };
            end = !more || up.body_complete();
            if let Some(s) = store.as_mut() {
                s.write(&piece);
            }
            if end {
                commit(&mut store).await;
            }
            let out;
            (out, client_end) = ranged::to_client(window.as_mut(), &piece, end);
            metrics::body_bytes(BodyPath::Copy.label(), out.len() as u64);
            if out.is_empty() && !client_end {
                continue;
            }
            if let Err(e) = d.send_body(out, client_end).await {
                return streamed(sent, path, StreamEnd::Client(e));
            }
            sent += out.len() as u64;
        }
        if let Some(s) = store.take().filter(|_| !end) {
            // The client has its range: the rest of the body is read into the entry.
            fill_rest(&mut up, s, &mut piece, req).await;
        }
        buffers::give(piece);
        drop(up);
        tracing::debug!("proxied \"{} {}\": {status} with {sent} body bytes by {}", req.method, req.path, path.label());
        streamed(sent, path, StreamEnd::Complete)
    }
}

/// The tunnel an upstream's 101 opens: the 101 checked (a 502 when it switches to
/// something else than was asked), the client's head sent with the bytes that came
/// with the 101, then the tunnel's bytes both ways until it ends ([`tunnel::relay`]).
///
/// # Cancel safety
/// Dropped at any await, it closes the upstream connection.
async fn switch<D: Downstream>(
    up: Exchange<'_>,
    mut head: super::parse::Head,
    req: &Request,
    d: &mut D,
    added: &Added,
    cache_status: String,
    limits: tunnel::Limits,
) -> Outcome<D::Error> {
    let Some(asked) = up.upgrade().cloned() else {
        let f = up.failure_now(FailureKind::Invalid, "invalid response: protocol upgrade (101) is not forwarded");
        return refused(f, req, cache_status);
    };
    if let Err(why) = tunnel::check_switch(&head, &asked) {
        metrics::error(FailureKind::Invalid.label());
        let f = up.failure_now(FailureKind::Invalid, &format!("invalid response: {why}"));
        return refused(f, req, cache_status);
    }
    let connect = req.method == crate::handler::Method::Connect;
    let mut response = tunnel::switched_head(&mut head, &asked, connect, &cache_status);
    added.apply(&mut response.headers);
    let status = response.status.0;
    let lost = up.failure_now(FailureKind::Closed, "no connection");
    let Some(mut wire) = up.into_tunnel() else {
        return refused(lost, req, cache_status);
    };
    let early = wire.take_early();
    let sent = d.send_switch(response, &early).await;
    let answered = Instant::now();
    let streamed = |sent, path, end| Outcome::Streamed(Streamed { status, answered, sent, path, end });
    if let Err(e) = sent {
        return streamed(0, BodyPath::Copy, StreamEnd::Client(e));
    }
    metrics::body_bytes(BodyPath::Copy.label(), early.len() as u64);
    let r = tunnel::relay(d, &mut wire, limits).await;
    let peer = req.client.map_or_else(String::new, |c| c.to_string());
    tracing::debug!(
        "tunnel {peer} \"{} {}\": {} bytes to the client by {}, {} to the upstream",
        req.method,
        req.path,
        early.len() as u64 + r.to_client,
        r.path.label(),
        r.to_upstream
    );
    streamed(early.len() as u64 + r.to_client, r.path, r.end)
}

/// Reads the rest of a body being stored once a cold range fill's client has its
/// range, and commits the entry. A failure abandons the entry (logged): the
/// client's answer is whole already.
///
/// # Cancel safety
/// Dropped at any await, the entry is abandoned (its temporary file removed) and
/// the upstream connection closed.
async fn fill_rest(up: &mut Exchange<'_>, mut store: cached::Store, piece: &mut Vec<u8>, req: &Request) {
    loop {
        piece.clear();
        match up.read_body(piece).await {
            Ok(more) => {
                store.write(piece);
                if !more || up.body_complete() {
                    store.commit().await;
                    return;
                }
            }
            Err(f) => {
                tracing::warn!(
                    "proxy \"{} {}\": {f}; the range was answered, the object is not stored",
                    req.method,
                    req.path
                );
                return;
            }
        }
    }
}

/// Whether the request is gRPC (`application/grpc`, `application/grpc+proto`,
/// `application/grpc;...`; not gRPC-Web, which is made for HTTP/1.1).
fn is_grpc(fields: &[(String, String)]) -> bool {
    fields.iter().filter(|(n, _)| n.eq_ignore_ascii_case("content-type")).any(|(_, v)| {
        let v = v.trim().as_bytes();
        v.len() >= 16
            && v[..16].eq_ignore_ascii_case(b"application/grpc")
            && matches!(v.get(16), None | Some(b'+' | b';' | b' '))
    })
}

/// The answer to gRPC from an HTTP/1.1 client: 505, as gRPC needs HTTP/2 (its
/// trailers, its bidirectional streams), which the client should use.
fn grpc_refusal() -> Response {
    let body = b"gRPC needs HTTP/2: this request came over HTTP/1.1\n".to_vec();
    let headers = vec![Header::Field("Content-Type".into(), "text/plain; charset=utf-8".into())];
    Response { status: Status(505), headers, body: Body::Bytes(body), refused: None }
}

/// How waiting for the upstream's final head ended, when it brought none.
enum HeadEnd<E> {
    Client(E),
    Failed(Failure),
}

/// The upstream's final head; its 103 Early Hints go to the client as they come
/// (the first [`MAX_HINTS`]).
///
/// # Cancel safety
/// Not cancel-safe: a hint may have been sent in part.
async fn final_head<D: Downstream>(up: &mut Exchange<'_>, d: &mut D) -> Result<super::parse::Head, HeadEnd<D::Error>> {
    let mut hints = 0;
    loop {
        match up.next_head().await {
            Ok(hint) if hint.status == 103 => {
                hints += 1;
                if hints > MAX_HINTS {
                    continue;
                }
                let fields = super::headers::interim_fields(hint.fields);
                let headers = fields.into_iter().map(|(n, v)| Header::Field(n, v)).collect();
                let interim = Response { status: Status(103), headers, body: Body::Empty, refused: None };
                d.send_interim(interim).await.map_err(HeadEnd::Client)?;
            }
            Ok(head) => return Ok(head),
            Err(f) => return Err(HeadEnd::Failed(f)),
        }
    }
}

/// The owner's answer to a miss `route` sends it (see `super::peers`): its exchange
/// and head, or `None` when the owner failed (unreachable, timed out, 5xx), which
/// is noted, and the origin is to be asked instead.
///
/// # Cancel safety
/// Not cancel-safe, as [`final_head`].
async fn ask_owner<'r, D: Downstream>(
    route: &'r super::peers::Route,
    d: &mut D,
) -> Result<Option<(Exchange<'r>, super::parse::Head)>, D::Error> {
    let mut up = match Exchange::begin(&route.rule, route.fwd.clone(), route.fields.clone()).await {
        Ok(up) => up,
        Err(f) => {
            super::peers::failed(&route.owner, &f.to_string());
            return Ok(None);
        }
    };
    let head = match final_head(&mut up, d).await {
        Ok(head) => head,
        Err(HeadEnd::Client(e)) => return Err(e),
        Err(HeadEnd::Failed(f)) => {
            super::peers::failed(&route.owner, &f.to_string());
            return Ok(None);
        }
    };
    if head.status >= 500 {
        super::peers::failed(&route.owner, &format!("it answered {}", head.status));
        return Ok(None);
    }
    super::peers::fetched();
    Ok(Some((up, head)))
}

/// The answer to an exchange that failed before a response head: the stale entry
/// under `stale-if-error`, or the failure.
fn failed<E>(pending: Pending, f: Failure, req: &Request, cache_status: String) -> Outcome<E> {
    match pending.on_failure(&f, req) {
        Some(stale) => answer(stale, true),
        None => refused(f, req, cache_status),
    }
}

/// Why an upload stopped.
enum Upload<E> {
    Client(E),
    Failed(Failure),
}

/// Sends the request body as it comes from `d`, within `allowed` bytes, then ends it.
///
/// # Cancel safety
/// Not cancel-safe: part of a piece may have been sent.
async fn upload<D: Downstream>(d: &mut D, up: &mut Exchange<'_>, mut allowed: u64) -> Result<(), Upload<D::Error>> {
    let refused = |up: &Exchange<'_>, status, why: &str| {
        Upload::Failed(Failure {
            status,
            kind: FailureKind::RequestBody,
            ..up.failure_now(FailureKind::RequestBody, why)
        })
    };
    let mut piece = Vec::new();
    loop {
        piece.clear();
        let more = match d.read_body(&mut piece).await {
            Ok(more) => more,
            Err(BodyError::Client(e)) => return Err(Upload::Client(e)),
            Err(BodyError::Refused(status, why)) => return Err(refused(up, status, why)),
        };
        if piece.len() as u64 > allowed {
            return Err(refused(up, Status::PAYLOAD_TOO_LARGE, "request body exceeds max_body_bytes"));
        }
        allowed -= piece.len() as u64;
        up.send_body(&piece).await.map_err(Upload::Failed)?;
        if !more {
            return up.end_body().await.map_err(Upload::Failed);
        }
    }
}
