//! HTTP/2 streams that a `[[proxy]]` rule takes. Each runs as its own task on the
//! worker's `LocalSet` ([`start`]): the cache lookup (a coalesced wait included),
//! the exchange with the upstream, the request body's upload, the cache fill, and
//! the response body. The connection's loop goes on meanwhile with its other
//! streams, and takes what a task has ([`Proxied::step`]) when the task raises the
//! connection's [`Signal`]: the answer, then body pieces, each handed to the codec
//! only while less than [`QUEUED`] bytes of the stream wait there, so the stream's
//! and the connection's flow-control windows pace the upstream read and a stream
//! holds at most about two times [`QUEUED`] plus one read piece.
//!
//! A body is streamed, of known length or not (chunked or close-delimited: each
//! piece goes on as it comes, and an empty DATA frame ends the stream). On a kTLS
//! connection, from a plain `http://` upstream, a Content-Length body not being
//! stored is not read at all: the task waits for its upstream socket and says how
//! many body bytes are queued there ([`Step::AtSource`]), and the loop splices
//! exactly those after each DATA frame's header (`Transport::send_queued`), so the
//! writer never waits on an upstream. An upstream that fails after the head resets
//! the stream (INTERNAL_ERROR). A response being stored (`cache = true`) with a
//! Content-Length of at most [`MAX_BUFFERED`] bytes is read whole and stored before
//! its stream is answered, so a hostile upstream's answer is a clean 502 or 504;
//! any other is stored as it streams and committed before its last frame leaves.
//!
//! Dropping a [`Proxied`] (the client reset the stream, or the connection ended)
//! aborts its task; see [`run`] for what that leaves behind. A request is forwarded
//! only once the handler's guarding phases (`handler::guard`: canonical host,
//! redirects, IP rules, rate limit, basic auth) let it; they run on the loop.
//!
//! Not here: the frames (the codec) and the exchange itself (`handler::proxy`).

use std::cell::{Cell, RefCell};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;

use tokio::sync::{mpsc, Notify};

use super::RequestHead;
use crate::handler::cache::{Cache, Key};
use crate::handler::proxy::cached::{self, Next, Pending, Plan};
use crate::handler::proxy::upstream::{closed_early, IoFailure};
use crate::handler::proxy::{self, metrics, parse::Framing, Exchange, Failure, Forwarding, Rule, PIECE};
use crate::handler::{self, Body, Header, Pick, Request, Response, Site, Status};
use crate::http::Context;

/// The largest Content-Length of an upstream response being stored that an HTTP/2
/// stream holds whole before it is answered.
pub const MAX_BUFFERED: usize = 8 * 1024 * 1024;

/// Body bytes a stream keeps waiting, in its task's hands and in the codec each.
const QUEUED: usize = 64 * 1024;

/// Request body pieces (DATA frames) queued for a task before the loop waits for it.
const UPLOAD_QUEUE: usize = 8;

/// The site and rule that take `head`, if a `[[proxy]]` rule does.
pub(super) fn route<'a, S>(ctx: &Context<'a, S>, head: &RequestHead) -> Option<(Site<'a>, &'a Rule)> {
    let path = head.path.as_deref()?.split(['?', '#']).next()?;
    let Pick::Site(site) = ctx.sites.pick(head.authority.as_deref().filter(|a| !a.is_empty())) else { return None };
    handler::proxy::route(&site, path).map(|rule| (site, rule))
}

/// Wakes a connection's loop when one of its proxied streams has something for it.
#[derive(Default)]
pub(super) struct Signal {
    dirty: Cell<bool>,
    notify: Notify,
}

impl Signal {
    fn raise(&self) {
        self.dirty.set(true);
        self.notify.notify_one();
    }

    /// Marks the streams for a look without waking anyone (the loop sent some of a body).
    pub fn poke(&self) {
        self.dirty.set(true);
    }

    /// Whether the streams are to be looked at ([`Proxied::step`]); clears the mark.
    pub fn take(&self) -> bool {
        self.dirty.replace(false)
    }

    /// Waits for a task to raise the signal.
    ///
    /// # Cancel safety
    /// Cancel-safe: a raise while nobody waits is kept for the next wait.
    pub async fn wait(&self) {
        self.notify.notified().await;
    }
}

/// A proxied response's body that its task hands over after the head, as a
/// [`super::BodySize::Stream`] of `len` bytes (`None`: a length not known ahead).
#[derive(Debug, Clone, Copy)]
pub(super) struct Streamed {
    pub len: Option<u64>,
}

/// A task's answer.
#[allow(clippy::large_enum_variant)] // one per request, moved once
enum Answer {
    /// A response; `Some`: its body follows.
    Response(Response, Option<Streamed>),
    /// The exchange failed before a response head: 502 or 504, with this Cache-Status.
    Failed(Failure, String),
}

/// What a task has for the loop.
#[derive(Default)]
struct Out {
    answer: Option<Answer>,
    /// Body bytes not yet handed to the codec (at most [`QUEUED`] and a piece).
    body: Vec<u8>,
    /// The body is complete: `body` is the last of it.
    ended: bool,
    /// The body failed after the head: the stream is to be reset.
    failed: Option<Failure>,
    /// The upstream socket the loop splices the body from (a duplicate of the
    /// exchange's descriptor), when the body goes that way.
    source: Option<Rc<OwnedFd>>,
    /// Body bytes queued in `source` that the loop has not yet handed to the codec.
    at_source: u64,
    /// Body bytes at the source the loop has handed to the codec.
    source_handed: u64,
    /// Body bytes the loop has spliced from `source`.
    source_sent: u64,
}

/// What the loop does next for a proxied stream.
#[allow(clippy::large_enum_variant)] // one per step, moved once
pub(super) enum Step {
    /// Nothing for now.
    Idle,
    /// Answer the stream; `Some`: its body follows.
    Respond(Response, Option<Streamed>),
    /// The next body bytes, for `Connection::push`.
    Body(Vec<u8>),
    /// More body bytes wait in the stream's source, for `Connection::push_at_source`.
    AtSource(u64),
    /// The body failed after the head: reset the stream.
    Reset(Failure),
    /// The stream needs the task no more: forget it, after ending its body of unknown
    /// length (`Connection::finish`).
    Done,
}

/// A proxied stream as its connection's loop sees it. Dropping it aborts its task.
pub(super) struct Proxied<'a> {
    out: Rc<RefCell<Out>>,
    /// Wakes the task when the loop took body bytes.
    room: Rc<Notify>,
    upload: Option<mpsc::Sender<Vec<u8>>>,
    task: tokio::task::AbortHandle,
    site: Site<'a>,
    pub head: RequestHead,
    answered: bool,
}

impl Drop for Proxied<'_> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How [`start`] took a request.
#[allow(clippy::large_enum_variant)] // one per request, moved once
pub(super) enum Started<'a> {
    /// Answered at once (a guarding phase, or a body over `max_body_bytes`).
    Answer(Response),
    /// Forwarded by a task.
    Task(Proxied<'a>),
}

/// What forwarding `head` (read as `req`) by a rule of `site` begins with, over
/// HTTP/2 and HTTP/3 alike: the guarding phases (as files are guarded), then the
/// request body's limit (`max_body`); either may answer, which ends the request
/// (`Err`). Else the request as it goes upstream (`version` as `Via` names the
/// client's protocol; `has_body`: a body follows, chunked when it has no
/// content-length) and its fields.
#[allow(clippy::result_large_err)] // one per request, moved once
pub(crate) fn forwarding(
    head: &RequestHead,
    req: &Request,
    site: &Site<'_>,
    peer: IpAddr,
    version: &'static str,
    has_body: bool,
    max_body: u64,
) -> Result<(Forwarding, Vec<(String, String)>), Response> {
    if let Some(response) = handler::guard(req, site) {
        return Err(response);
    }
    if head.content_length.is_some_and(|n| n > max_body) {
        let mut r = handler::refusal(Status::PAYLOAD_TOO_LARGE, site, head.method == "HEAD");
        r.refused = Some("request body exceeds max_body_bytes".into());
        return Err(r);
    }
    let fields = head.headers.iter().map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned())).collect();
    let fwd = Forwarding {
        method: head.method.clone(),
        target: head.path.clone().unwrap_or_else(|| "/".into()),
        authority: head.authority.clone(),
        peer,
        version,
        body: has_body.then_some(head.content_length),
    };
    Ok((fwd, fields))
}

/// Starts forwarding `head` (read as `req`) by `rule` once the guarding phases let
/// it, on a task of the worker's `LocalSet` that raises `signal` when it has
/// something for the loop. `end_stream`: the request has no body; else feed it to
/// [`Proxied::data`].
#[allow(clippy::too_many_arguments)] // the parts of one request, each used once
pub(super) fn start<'a, S>(
    ctx: &Context<'a, S>,
    head: &RequestHead,
    req: Request,
    end_stream: bool,
    site: Site<'a>,
    rule: &Rule,
    max_body: u64,
    splice: bool,
    signal: &Rc<Signal>,
) -> Started<'a> {
    let (fwd, fields) = match forwarding(head, &req, &site, ctx.peer.ip(), "2", !end_stream, max_body) {
        Ok(forwarded) => forwarded,
        Err(response) => return Started::Answer(response),
    };
    let cache = cached::cache_of(&ctx.sites, rule, &req, &fwd);
    let (upload, body) = match end_stream {
        true => (None, None),
        false => {
            let (tx, rx) = mpsc::channel(UPLOAD_QUEUE);
            (Some(tx), Some(rx))
        }
    };
    let out = Rc::new(RefCell::new(Out::default()));
    let room = Rc::new(Notify::new());
    let feed = Feed { out: out.clone(), room: room.clone(), signal: signal.clone() };
    let job = Job { rule: rule.clone(), cache, req, fwd, fields, max_body, peer: ctx.peer, splice };
    let task = tokio::task::spawn_local(run(job, body, feed)).abort_handle();
    Started::Task(Proxied { out, room, upload, task, site, head: head.clone(), answered: false })
}

impl Proxied<'_> {
    /// Forwards a piece of the request body; `end_stream` ends it.
    ///
    /// # Cancel safety
    /// Cancel-safe: a piece not queued when cancelled is not sent.
    pub async fn data(&mut self, piece: Vec<u8>, end_stream: bool) {
        if let Some(tx) = &self.upload {
            // A task that stopped reading has its answer already: the rest is dropped.
            let _ = tx.send(piece).await;
        }
        if end_stream {
            self.upload = None;
        }
    }

    /// Whether the stream waits for its upstream rather than its client: no answer
    /// yet, or no body bytes waiting in the codec (`buffered`).
    pub fn awaits_upstream(&self, buffered: Option<usize>) -> bool {
        let out = self.out.borrow();
        let none_at_source = out.at_source == 0 && out.source_handed == out.source_sent;
        !self.answered || (buffered == Some(0) && out.body.is_empty() && none_at_source)
    }

    /// The socket to splice this stream's body from, once its answer says so.
    pub fn take_source(&mut self) -> Option<Rc<OwnedFd>> {
        self.out.borrow_mut().source.take()
    }

    /// `n` body bytes were spliced from the source: the task may look for more.
    pub fn sent_from_source(&self, n: u64) {
        self.out.borrow_mut().source_sent += n;
        self.room.notify_one();
    }

    /// What the loop does next for this stream; `buffered` is what the codec holds of
    /// its body (`Connection::buffered`), `peer` the client for the log lines.
    pub fn step(&mut self, buffered: Option<usize>, peer: SocketAddr) -> Step {
        let mut out = self.out.borrow_mut();
        if !self.answered {
            let is_head = self.head.method == "HEAD";
            return match out.answer.take() {
                None => Step::Idle,
                Some(Answer::Response(r, len)) => {
                    self.answered = true;
                    Step::Respond(handler::with_hsts(r, &self.site), len)
                }
                Some(Answer::Failed(f, cache_status)) => {
                    self.answered = true;
                    let (method, target) = (&self.head.method, self.head.path.as_deref().unwrap_or("/"));
                    tracing::warn!("proxy {peer} \"{method} {target} HTTP/2.0\": {} {f}", f.status.0);
                    let status = format!("{cache_status}; detail={}", f.kind);
                    let r = handler::refusal(f.status, &self.site, is_head);
                    Step::Respond(r.with(Header::Field("Cache-Status".into(), status)), None)
                }
            };
        }
        if let Some(f) = out.failed.take() {
            return Step::Reset(f);
        }
        let Some(buffered) = buffered else {
            // The codec is done with the stream. When it spliced the body to its end,
            // the task still finishes the exchange (its upstream connection goes back
            // to the pool): wait for it to say so.
            let spliced_whole = out.source_handed > 0 && out.source_sent == out.source_handed && out.at_source == 0;
            return if spliced_whole && !out.ended { Step::Idle } else { Step::Done };
        };
        if out.body.is_empty() && out.at_source > 0 {
            // After the bytes given in memory: what waits at the source.
            let n = std::mem::take(&mut out.at_source);
            out.source_handed += n;
            return Step::AtSource(n);
        }
        if out.body.is_empty() {
            return if out.ended { Step::Done } else { Step::Idle };
        }
        if buffered >= QUEUED {
            return Step::Idle;
        }
        let take = out.body.len().min(QUEUED);
        let piece = match take == out.body.len() {
            true => std::mem::take(&mut out.body),
            false => out.body.drain(..take).collect(),
        };
        self.room.notify_one();
        Step::Body(piece)
    }
}

/// What a task owns of its request: nothing borrowed from the connection.
struct Job {
    rule: Rule,
    cache: Option<(Arc<Cache>, Key)>,
    req: Request,
    fwd: Forwarding,
    fields: Vec<(String, String)>,
    max_body: u64,
    peer: SocketAddr,
    /// The connection can take a body spliced from a plain upstream socket.
    splice: bool,
}

/// A task's side of its stream.
struct Feed {
    out: Rc<RefCell<Out>>,
    room: Rc<Notify>,
    signal: Rc<Signal>,
}

impl Feed {
    fn answer(&self, answer: Answer) {
        self.out.borrow_mut().answer = Some(answer);
        self.signal.raise();
    }

    /// Hands over body bytes once the loop has taken enough of the earlier ones.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is handed over until the wait is over.
    async fn body(&self, piece: &[u8]) {
        while self.out.borrow().body.len() >= QUEUED {
            self.room.notified().await;
        }
        self.out.borrow_mut().body.extend_from_slice(piece);
        self.signal.raise();
    }

    /// Says that `n` more body bytes wait in the source, then waits until the loop
    /// has spliced every byte said so far (so that the source's queue counts anew).
    ///
    /// # Cancel safety
    /// Cancel-safe: the bytes are said at once; only the wait is cut.
    async fn at_source(&self, n: u64, said: u64) {
        self.out.borrow_mut().at_source += n;
        self.signal.raise();
        while self.out.borrow().source_sent < said {
            self.room.notified().await;
        }
    }

    fn end(&self) {
        self.out.borrow_mut().ended = true;
        self.signal.raise();
    }

    fn fail(&self, f: Failure) {
        self.out.borrow_mut().failed = Some(f);
        self.signal.raise();
    }
}

/// One proxied stream's task: the cache lookup, the exchange, the request body from
/// `upload` (closed at its end), and the answer and body to `feed`.
///
/// # Cancel safety
/// Aborted at any await (the stream reset, the connection gone), it leaves nothing
/// half-done behind: the exchange's upstream connection is closed rather than
/// pooled (the upstream sees the request abandoned), a cache fill is abandoned (its
/// temporary file removed, lookups waiting for it woken), and a commit already
/// under way finishes on the blocking pool with a complete body.
async fn run(job: Job, upload: Option<mpsc::Receiver<Vec<u8>>>, feed: Feed) {
    let Job { rule, cache, req, fwd, mut fields, max_body, peer, splice } = job;
    let (method, target) = (fwd.method.clone(), fwd.target.clone());
    let has_body = upload.is_some();
    let pending = match cached::plan_with(cache, &rule, &req, has_body, &fwd, &mut fields).await {
        Plan::Answer(response) => return feed.answer(Answer::Response(response, None)),
        Plan::Forward(pending) => pending,
    };
    let failed_status = pending.failed_status();
    let mut up = match Exchange::begin(&rule, fwd, fields).await {
        Ok(up) => up,
        Err(f) => return feed.answer(failed(pending, f, &req, failed_status)),
    };
    if let Some(upload) = upload {
        if let Err(f) = send_body(&mut up, upload, max_body).await {
            return feed.answer(Answer::Failed(f, failed_status));
        }
    }
    let mut head = match up.response().await {
        Ok(head) => head,
        Err(f) => return feed.answer(failed(pending, f, &req, failed_status)),
    };
    let (cache_status, mut store) = match pending.on_head(&head, &req).await {
        Next::Answer(response) => {
            up.release_if_bodiless().await;
            return feed.answer(Answer::Response(response, None));
        }
        Next::Pass(status, store) => (status, store),
    };
    let fields = proxy::client_fields(&mut head, &cache_status);
    let status = Status(head.status);
    let len = match head.framing {
        Framing::None => Some(0),
        Framing::Length(len) => Some(len),
        Framing::Chunked | Framing::Close => None,
    };
    // Held whole and stored before it is answered, so that a hostile upstream's answer
    // is a clean 502 or 504: a response being stored of a known length of at most
    // MAX_BUFFERED bytes (and one without a body).
    if len.is_some_and(|len| len == 0 || (store.is_some() && len <= MAX_BUFFERED as u64)) {
        let mut body = Vec::new();
        let whole = async {
            while up.read_body(&mut body).await? {}
            Ok(())
        };
        if let Err(f) = whole.await {
            return feed.answer(Answer::Failed(f, failed_status));
        }
        drop(up);
        if let Some(mut store) = store {
            store.write(&body);
            store.commit().await;
        }
        metrics::body_bytes("copy", body.len() as u64);
        let body = if body.is_empty() { Body::Empty } else { Body::Bytes(body) };
        return feed.answer(Answer::Response(Response { status, headers: fields, body, refused: None }, None));
    }
    let response = Response { status, headers: fields, body: Body::Empty, refused: None };
    // Spliced from the upstream socket when the connection and the exchange allow it.
    let source = (splice && store.is_none())
        .then(|| up.plain_body_socket())
        .flatten()
        .and_then(|from| from.as_fd().try_clone_to_owned().ok());
    let spliced = source.is_some();
    feed.out.borrow_mut().source = source.map(Rc::new);
    feed.answer(Answer::Response(response, Some(Streamed { len })));
    if spliced {
        return match splice_body(&mut up, &feed).await {
            Ok(()) => {
                drop(up);
                feed.end();
            }
            Err(f) => {
                tracing::debug!("proxy {peer} \"{method} {target} HTTP/2.0\": body failed: {f}");
                feed.fail(f);
            }
        };
    }
    let mut received = 0u64;
    // Of a known length, the last piece is held back until the body is complete (and
    // stored): the stream's last frame leaves only then. Of an unknown length, each
    // piece goes on as it comes, and the end (an empty last frame) follows the commit.
    let mut last = Vec::new();
    loop {
        let mut piece = Vec::with_capacity(PIECE);
        match up.read_body(&mut piece).await {
            Ok(true) => {
                if let Some(store) = store.as_mut() {
                    store.write(&piece);
                }
                metrics::body_bytes("copy", piece.len() as u64);
                received += piece.len() as u64;
                if len.is_some_and(|len| received >= len) {
                    last = piece;
                } else if !piece.is_empty() {
                    feed.body(&piece).await;
                }
            }
            Ok(false) => break,
            Err(f) => {
                tracing::debug!("proxy {peer} \"{method} {target} HTTP/2.0\": body failed: {f}");
                return feed.fail(f);
            }
        }
    }
    drop(up);
    if let Some(store) = store {
        store.commit().await;
    }
    if !last.is_empty() {
        feed.body(&last).await;
    }
    feed.end();
}

/// The body of `up` by way of its upstream socket: what the exchange read with the
/// head is handed over as bytes; then, each time the socket has more, the count
/// queued there is said to the loop, which splices them ([`Step::AtSource`]), until
/// the Content-Length is reached. Each wait for the upstream is bounded by the read
/// timeout; an upstream that closes early or stalls fails the body.
///
/// # Cancel safety
/// Not cancel-safe: bytes said to be at the source may be spliced after the cut.
async fn splice_body(up: &mut Exchange<'_>, feed: &Feed) -> Result<(), Failure> {
    let mut piece = Vec::new();
    if let Some(more) = up.read_buffered(&mut piece) {
        let more = more?;
        metrics::body_bytes("copy", piece.len() as u64);
        feed.body(&piece).await;
        if !more {
            return Ok(());
        }
    }
    let Some((from, left, read_timeout)) = up.splice_source() else { return Ok(()) };
    let mut said = 0u64;
    let cause = loop {
        if said == left {
            break None;
        }
        match crate::net::queued(from, read_timeout).await {
            Ok(0) => break Some(IoFailure::Failed(closed_early())),
            Ok(n) => {
                let n = (n as u64).min(left - said);
                said += n;
                feed.at_source(n, said).await;
            }
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => break Some(IoFailure::TimedOut),
            Err(e) => break Some(IoFailure::Failed(e)),
        }
    };
    up.spliced(said);
    piece.clear();
    match cause {
        Some(cause) => Err(up.splice_failed(cause)),
        None => up.read_body(&mut piece).await.map(drop),
    }
}

/// Sends the request body as it comes from `upload`, within `max_body` bytes, then
/// ends it; the first failure is kept and the rest of the body dropped.
///
/// # Cancel safety
/// Not cancel-safe: part of a piece may have been sent.
async fn send_body(up: &mut Exchange<'_>, mut upload: mpsc::Receiver<Vec<u8>>, max_body: u64) -> Result<(), Failure> {
    let mut allowed = max_body;
    let mut failed = None;
    while let Some(piece) = upload.recv().await {
        if failed.is_some() {
            continue;
        }
        if piece.len() as u64 > allowed {
            let too_large = Failure { status: Status::PAYLOAD_TOO_LARGE, ..up.failure_now("body", "") };
            let detail = "request body exceeds max_body_bytes".into();
            failed = Some(Failure { kind: "request-body", detail, ..too_large });
            continue;
        }
        allowed -= piece.len() as u64;
        if let Err(f) = up.send_body(&piece).await {
            failed = Some(f);
        }
    }
    match failed {
        Some(f) => Err(f),
        None => up.end_body().await,
    }
}

/// The answer to a failed exchange: the stale entry under `stale-if-error`, or the failure.
fn failed(pending: Pending, f: Failure, req: &Request, cache_status: String) -> Answer {
    match pending.on_failure(&f, req) {
        Some(stale) => Answer::Response(stale, None),
        None => Answer::Failed(f, cache_status),
    }
}
