//! HTTP/2 streams whose request the pipeline forwards. Each runs the forward
//! (`handler::proxy::Forward::run`) as its own task on the worker's `LocalSet`
//! ([`start`]), over a [`Feed`], this codec's per-request handle: the request body
//! comes from the connection's loop by a bounded queue, and what the forward sends
//! (interim 103 heads, the head, body pieces, a count of body bytes waiting in the upstream socket, the
//! end, a cut) waits in the stream's [`Out`] until the loop takes it
//! ([`Proxied::step`]) when the task raises the connection's [`Signal`]. Body pieces
//! are handed to the codec only while less than [`QUEUED`] bytes of the stream wait
//! there, so the stream's and the connection's flow-control windows pace the
//! upstream read and a stream holds at most about two times [`QUEUED`] plus one
//! read piece, whatever the body's size and whether it is being stored.
//!
//! On a kTLS connection a body spliced from a plain upstream is not read at all:
//! the task waits for the upstream socket and says how many body bytes are queued
//! there ([`Step::AtSource`]), and the loop splices exactly those after each DATA
//! frame's header (`Transport::send_queued`), so the writer never waits on an
//! upstream. A forward that fails after the head resets the stream (INTERNAL_ERROR).
//!
//! The request body (a tunnel's client-to-upstream bytes alike) goes the other
//! way under HTTP/2's flow control: the loop queues each DATA frame's bytes for
//! the task without waiting ([`Proxied::data`]), and the stream's credit goes back
//! to the client only as the task takes them ([`Proxied::credit`], then
//! `Connection::consumed`), so a stream whose upstream reads slowly holds at most
//! its window (64 KiB) here and makes its own client wait, never the connection's
//! loop and its other streams.
//!
//! Dropping a [`Proxied`] (the client reset the stream, or the connection ended)
//! aborts its task, unless the task's answer has ended: then it runs to its end
//! (a cold range fill stores the rest of the object after the client's range);
//! `Forward::run` says what either leaves behind.
//!
//! Not here: the frames (the codec), what is forwarded and the exchange itself
//! (`handler::pipeline`, `handler::proxy`).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::RequestHead;
use crate::handler::pipeline::{self, Answer, BodyError, Downstream, Outcome};
use crate::handler::pipeline::{Failure, Forward};
use crate::handler::{Request, Response, Site};
use crate::vocab::Spliced;

/// Body bytes a stream keeps waiting, in its task's hands and in the codec each.
const QUEUED: usize = 64 * 1024;

/// A request body on its way from the loop to the task: at most the stream's
/// receive window, which the client may not exceed (the codec checks it).
#[derive(Default)]
struct Upload {
    pieces: VecDeque<Vec<u8>>,
    /// The client ended the body (END_STREAM).
    ended: bool,
    /// The task will read no more (it is done): pieces are dropped as they come.
    gone: bool,
    /// Bytes taken by the task whose credit the loop has not returned.
    taken: usize,
}

/// An [`Upload`] as the loop and the task share it.
#[derive(Default)]
struct Shared {
    upload: RefCell<Upload>,
    /// Wakes the task when a piece or the end came.
    arrived: Notify,
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
enum Reply {
    /// A whole answer, for the loop to finish and send.
    Whole(Answer, bool),
    /// The head of a streamed response; its body follows.
    Head(Response, Streamed),
}

/// Interim responses (103 Early Hints) a stream keeps waiting for the loop; more
/// are dropped.
const INTERIMS: usize = 4;

/// What a task has for the loop.
#[derive(Default)]
struct Out {
    /// Interim responses not yet sent, ahead of `answer` (at most [`INTERIMS`]).
    interim: std::collections::VecDeque<Response>,
    answer: Option<Reply>,
    /// Body bytes not yet handed to the codec (at most [`QUEUED`] and a piece).
    body: Vec<u8>,
    /// The body is complete: `body` is the last of it.
    ended: bool,
    /// The trailer section that ends the body (an HTTP/2 upstream's), when `ended`.
    trailers: Option<Vec<(String, String)>>,
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
    /// An interim response (103) ahead of the answer, for `Connection::interim`.
    Interim(Response),
    /// Answer the stream; `Some`: its body follows. `bool`: a file body is a cache entry's.
    Respond(Response, Option<Streamed>, bool),
    /// The next body bytes, for `Connection::push`.
    Body(Vec<u8>),
    /// More body bytes wait in the stream's source, for `Connection::push_at_source`.
    AtSource(u64),
    /// The body failed after the head: reset the stream.
    Reset,
    /// Every body byte was sent: end the stream with these trailers
    /// (`Connection::trailers`), then forget it.
    Trailers(Vec<(String, String)>),
    /// The stream needs the task no more: forget it, after ending its body of unknown
    /// length (`Connection::finish`).
    Done,
}

/// A proxied stream as its connection's loop sees it. Dropping it aborts its task
/// while its answer has not ended.
pub(super) struct Proxied<'a> {
    out: Rc<RefCell<Out>>,
    /// Wakes the task when the loop took body bytes.
    room: Rc<Notify>,
    /// The request body towards the task; `None`: it has none.
    upload: Option<Rc<Shared>>,
    task: tokio::task::AbortHandle,
    site: Site<'a>,
    pub head: RequestHead,
    /// When the request arrived.
    pub started: Instant,
    /// The client's address as the pipeline found it, for the access log.
    pub client: crate::http::conn::Who,
    answered: bool,
}

impl Drop for Proxied<'_> {
    fn drop(&mut self) {
        // A task whose answer has ended sends nothing more; it is left to run to its
        // end, which may still store the rest of a cold range fill's body in the cache.
        if !self.out.try_borrow().is_ok_and(|o| o.ended) {
            self.task.abort();
        }
    }
}

/// Starts `forward` for the request of `head` (read as `req`, of `site`) on a task
/// of the worker's `LocalSet` that raises `signal` when it has something for the
/// loop. `end_stream`: the request has no body; else feed it to [`Proxied::data`].
/// `splice`: the connection can take a body spliced from a plain upstream socket.
/// `retired`: the connection's retirement signal, which ends a tunnel (an extended
/// CONNECT) after a grace period.
#[allow(clippy::too_many_arguments)] // the parts of one request, each used once
pub(super) fn start<'a>(
    forward: Forward,
    req: Request,
    head: &RequestHead,
    site: Site<'a>,
    end_stream: bool,
    splice: bool,
    started: Instant,
    signal: &Rc<Signal>,
    retired: &tokio::sync::watch::Receiver<bool>,
) -> Proxied<'a> {
    let upload = (!end_stream).then(|| Rc::new(Shared::default()));
    let body = upload.clone().map(|upload| Reading { shared: upload, last: 0, signal: signal.clone() });
    let out = Rc::new(RefCell::new(Out::default()));
    let room = Rc::new(Notify::new());
    let client = crate::http::conn::Who::of(&req);
    let retired = req.upgrade.is_some().then(|| retired.clone());
    let mut feed = Feed { out: out.clone(), room: room.clone(), signal: signal.clone(), upload: body, splice, retired };
    let task = tokio::task::spawn_local(async move {
        match forward.run(&req, &mut feed).await {
            Outcome::Answer { answer, from_cache } => feed.reply(Reply::Whole(answer, from_cache)),
            // What went out went through the feed; a client that is gone has its stream dropped.
            Outcome::Streamed(_) | Outcome::ClientGone(()) => {}
        }
    })
    .abort_handle();
    Proxied { out, room, upload, task, site, head: head.clone(), started, client, answered: false }
}

impl Proxied<'_> {
    /// Queues a piece of the request body for the task, without waiting: the
    /// stream's window bounds what waits. `end_stream` ends it. Returns the bytes
    /// dropped (the task reads no more), whose credit the caller returns at once.
    pub fn data(&mut self, piece: Vec<u8>, end_stream: bool) -> usize {
        let Some(shared) = &self.upload else { return piece.len() };
        let mut u = shared.upload.borrow_mut();
        let dropped = match u.gone {
            true => piece.len(),
            false if piece.is_empty() => 0,
            false => {
                u.pieces.push_back(piece);
                0
            }
        };
        u.ended |= end_stream;
        shared.arrived.notify_one();
        dropped
    }

    /// Request body bytes the task took (or that wait for a task that is done)
    /// since the last call: their credit is due to the client (`Connection::consumed`).
    pub fn credit(&self) -> usize {
        let Some(shared) = &self.upload else { return 0 };
        let mut u = shared.upload.borrow_mut();
        let mut n = std::mem::take(&mut u.taken);
        if u.gone {
            n += u.pieces.drain(..).map(|p| p.len()).sum::<usize>();
        }
        n
    }

    /// Everything queued or taken and not yet credited, for a stream the loop
    /// forgets while its client may still send.
    pub fn uncredited(&self) -> usize {
        let Some(shared) = &self.upload else { return 0 };
        shared.upload.borrow_mut().gone = true;
        self.credit()
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
    pub fn step(&mut self, buffered: Option<usize>) -> Step {
        let mut out = self.out.borrow_mut();
        if !self.answered {
            if let Some(interim) = out.interim.pop_front() {
                return Step::Interim(interim);
            }
            let is_head = self.head.method == "HEAD";
            return match out.answer.take() {
                None => Step::Idle,
                Some(Reply::Head(r, streamed)) => {
                    self.answered = true;
                    Step::Respond(r, Some(streamed), false)
                }
                Some(Reply::Whole(answer, from_cache)) => {
                    self.answered = true;
                    Step::Respond(pipeline::finish(&self.site, is_head, answer), None, from_cache)
                }
            };
        }
        if out.failed.take().is_some() {
            return Step::Reset;
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
        if out.body.is_empty() && out.ended && out.trailers.is_some() {
            // The trailers follow the last byte the codec holds.
            return match (buffered, out.trailers.take()) {
                (0, Some(t)) => Step::Trailers(t),
                (_, t) => {
                    out.trailers = t;
                    Step::Idle
                }
            };
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

/// A task's side of its stream: the pipeline's [`Downstream`] for HTTP/2.
struct Feed {
    out: Rc<RefCell<Out>>,
    room: Rc<Notify>,
    signal: Rc<Signal>,
    upload: Option<Reading>,
    splice: bool,
    /// For an extended CONNECT: the connection's retirement signal.
    retired: Option<tokio::sync::watch::Receiver<bool>>,
}

/// The task's end of an [`Upload`].
struct Reading {
    shared: Rc<Shared>,
    /// The length of the piece returned last: it is taken (its credit due) once
    /// the task asks for the next, that is once the upstream has taken it.
    last: usize,
    signal: Rc<Signal>,
}

impl Reading {
    /// The next piece; `None`: the body ended.
    ///
    /// # Cancel safety
    /// Cancel-safe: a piece is removed from the queue only when returned.
    async fn next(&mut self) -> Option<Vec<u8>> {
        if self.last > 0 {
            self.shared.upload.borrow_mut().taken += std::mem::take(&mut self.last);
            self.signal.raise();
        }
        loop {
            {
                let mut u = self.shared.upload.borrow_mut();
                if let Some(piece) = u.pieces.pop_front() {
                    self.last = piece.len();
                    return Some(piece);
                }
                if u.ended {
                    return None;
                }
            }
            // One waiter: a piece queued while nobody waits leaves a permit behind.
            self.shared.arrived.notified().await;
        }
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        let mut u = self.shared.upload.borrow_mut();
        u.gone = true;
        u.taken += self.last;
        drop(u);
        self.signal.raise();
    }
}

impl Feed {
    fn reply(&self, reply: Reply) {
        self.out.borrow_mut().answer = Some(reply);
        self.signal.raise();
    }

    /// Hands over body bytes once the loop has taken enough of the earlier ones.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is handed over until the wait is over.
    async fn body(&self, piece: &[u8]) {
        if piece.is_empty() {
            return;
        }
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
}

impl Downstream for Feed {
    /// The stream is gone: the task is aborted before it could see an error.
    type Error = ();

    /// # Cancel safety
    /// Cancel-safe: a piece received is returned.
    async fn read_body(&mut self, into: &mut Vec<u8>) -> Result<bool, BodyError<()>> {
        let Some(upload) = self.upload.as_mut() else { return Ok(false) };
        match upload.next().await {
            Some(piece) => {
                into.extend_from_slice(&piece);
                Ok(true)
            }
            None => {
                self.upload = None;
                Ok(false)
            }
        }
    }

    fn can_splice(&self) -> bool {
        self.splice
    }

    fn sends_trailers(&self) -> bool {
        true
    }

    /// The request body arrives by its own queue: reading it is cancel-safe.
    fn duplex(&self) -> bool {
        true
    }

    async fn send_trailers(&mut self, trailers: Vec<(String, String)>) -> Result<(), ()> {
        self.out.borrow_mut().trailers = Some(trailers);
        self.end();
        Ok(())
    }

    async fn send_head(
        &mut self,
        head: Response,
        len: Option<u64>,
        first: &[u8],
        end: bool,
        source: Option<BorrowedFd<'_>>,
    ) -> Result<(), ()> {
        self.out.borrow_mut().source = source.and_then(|s| s.try_clone_to_owned().ok()).map(Rc::new);
        self.reply(Reply::Head(head, Streamed { len }));
        self.send_body(first, end).await
    }

    /// Queued for the loop, which sends it as a HEADERS frame of its own.
    async fn send_interim(&mut self, head: Response) -> Result<(), ()> {
        let mut out = self.out.borrow_mut();
        if out.interim.len() < INTERIMS {
            out.interim.push_back(head);
        }
        drop(out);
        self.signal.raise();
        Ok(())
    }

    async fn send_body(&mut self, piece: &[u8], end: bool) -> Result<(), ()> {
        self.body(piece).await;
        if end {
            self.end();
        }
        Ok(())
    }

    /// Says the body bytes queued in `from`, each time it has more, until `len`
    /// were said and spliced by the loop.
    ///
    /// # Cancel safety
    /// Not cancel-safe: bytes said to be at the source may be spliced after the cut.
    async fn splice(
        &mut self,
        from: &tokio::net::TcpStream,
        len: u64,
        read_timeout: Duration,
    ) -> Result<u64, Spliced<()>> {
        if self.out.borrow().source.is_none() {
            return Err(Spliced::Unsupported);
        }
        let mut said = 0u64;
        while said < len {
            match crate::net::queued(from, read_timeout).await {
                Ok(0) => return Err(Spliced::SourceClosed { moved: said }),
                Ok(n) => {
                    let n = (n as u64).min(len - said);
                    said += n;
                    self.at_source(n, said).await;
                }
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    return Err(Spliced::SourceTimedOut { moved: said })
                }
                Err(error) => return Err(Spliced::Source { moved: said, error }),
            }
        }
        Ok(said)
    }

    fn abort(&mut self, failure: &Failure) {
        self.out.borrow_mut().failed = Some(failure.clone());
        self.signal.raise();
    }

    /// The stream's DATA, as the loop queued them; END_STREAM ends the client's side.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`Feed::read_body`].
    async fn read_tunnel(&mut self, into: &mut Vec<u8>) -> Result<bool, ()> {
        match self.read_body(into).await {
            Ok(more) => Ok(more || !into.is_empty()),
            Err(_) => Ok(false),
        }
    }

    fn retired(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.retired.clone()
    }
}
