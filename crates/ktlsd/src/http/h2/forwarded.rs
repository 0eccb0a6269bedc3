//! HTTP/2 streams whose request the pipeline forwards. Each runs the forward
//! (`handler::proxy::Forward::run`) as its own task on the worker's `LocalSet`
//! ([`start`]), over a [`Feed`], this codec's per-request handle: the request body
//! comes from the connection's loop by a bounded queue, and what the forward sends
//! (the head, body pieces, a count of body bytes waiting in the upstream socket, the
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
//! Dropping a [`Proxied`] (the client reset the stream, or the connection ended)
//! aborts its task; `Forward::run` says what that leaves behind.
//!
//! Not here: the frames (the codec), what is forwarded and the exchange itself
//! (`handler::pipeline`, `handler::proxy`).

use std::cell::{Cell, RefCell};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify};

use super::RequestHead;
use crate::handler::pipeline::{self, Answer, BodyError, Downstream, Outcome};
use crate::handler::pipeline::{Failure, Forward};
use crate::handler::{Request, Response, Site};
use crate::vocab::Spliced;

/// Body bytes a stream keeps waiting, in its task's hands and in the codec each.
const QUEUED: usize = 64 * 1024;

/// Request body pieces (DATA frames) queued for a task before the loop waits for it.
const UPLOAD_QUEUE: usize = 8;

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

/// What a task has for the loop.
#[derive(Default)]
struct Out {
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

/// A proxied stream as its connection's loop sees it. Dropping it aborts its task.
pub(super) struct Proxied<'a> {
    out: Rc<RefCell<Out>>,
    /// Wakes the task when the loop took body bytes.
    room: Rc<Notify>,
    upload: Option<mpsc::Sender<Vec<u8>>>,
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
        self.task.abort();
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
    let (upload, body) = match end_stream {
        true => (None, None),
        false => {
            let (tx, rx) = mpsc::channel(UPLOAD_QUEUE);
            (Some(tx), Some(rx))
        }
    };
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
    pub fn step(&mut self, buffered: Option<usize>) -> Step {
        let mut out = self.out.borrow_mut();
        if !self.answered {
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
    upload: Option<mpsc::Receiver<Vec<u8>>>,
    splice: bool,
    /// For an extended CONNECT: the connection's retirement signal.
    retired: Option<tokio::sync::watch::Receiver<bool>>,
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
        match upload.recv().await {
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
    async fn read_tunnel(&mut self, into: &mut Vec<u8>, _idle: Duration) -> Result<bool, ()> {
        match self.read_body(into).await {
            Ok(more) => Ok(more || !into.is_empty()),
            Err(_) => Ok(false),
        }
    }

    fn retired(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.retired.clone()
    }
}
