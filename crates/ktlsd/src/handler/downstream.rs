//! What a codec offers the pipeline for one request, and what a forward run over it
//! comes to: the per-request handle ([`Downstream`]) through which a request body
//! arrives and a response leaves, and the [`Outcome`] the codec sends (a whole
//! answer), logs and goes on from.
//!
//! Not here: the phases and the forward themselves (`handler::pipeline`,
//! `handler::proxy`), or any framing (the codecs implement the handle).

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use super::failure::Failure;
use super::{Response, Status};
use crate::vocab::{BodyPath, Spliced};

/// A forward's answer that the codec sends as any response (after [`Exchange::finish`]).
#[allow(clippy::large_enum_variant)] // one per request, moved once
pub enum Answer {
    Response(Response),
    /// The exchange failed before a response head: the failure and the
    /// `Cache-Status` it is answered with.
    Failed(Failure, String),
    /// The upstream's `X-Accel-Redirect`: the file it names, answered as a static
    /// file of the site.
    Accel(Box<super::accel::Accel>),
}

/// How a forward ended.
#[allow(clippy::large_enum_variant)] // one per request, moved once
pub enum Outcome<E> {
    /// Not streamed: send [`Exchange::finish`]'s response. `from_cache`: a file
    /// body is a cache entry's (its bytes count as cache-hit bytes).
    Answer { answer: Answer, from_cache: bool },
    /// The upstream's response went out through the [`Downstream`].
    Streamed(Streamed<E>),
    /// The client went away (or was too slow) while its request body was read.
    ClientGone(E),
}

/// A response streamed from an upstream: for the access log and the codec's next step.
pub struct Streamed<E> {
    pub status: u16,
    /// When its head was handed to the codec.
    pub answered: Instant,
    /// Body bytes sent.
    pub sent: u64,
    /// How they left (splice for any part spliced).
    pub path: BodyPath,
    pub end: StreamEnd<E>,
}

/// How a streamed body ended.
pub enum StreamEnd<E> {
    /// Whole.
    Complete,
    /// The upstream failed after the head: the codec was told to cut the response
    /// ([`Downstream::abort`]).
    Cut(Failure),
    /// The client failed (or was too slow): the connection is gone.
    Client(E),
}

/// Why a request body could not be read.
pub enum BodyError<E> {
    /// The client went away or was too slow.
    Client(E),
    /// The body itself is refused (malformed, or too large): its status and why.
    Refused(Status, &'static str),
}

/// A codec's handle on one request for a forward: the request body comes in
/// through it and the response goes out. Each method states whether it may be
/// cancelled; [`Forward::run`] drives it to the end.
#[allow(async_fn_in_trait)] // the workers' tasks are local: no Send bound is wanted
pub trait Downstream {
    /// The client's failure (the connection or stream is gone).
    type Error;

    /// Request body bytes already at hand, taken to go upstream with the request head.
    fn body_at_hand(&mut self) -> Vec<u8> {
        Vec::new()
    }

    /// Appends the next piece of the request body to `into`; `Ok(false)`: the body
    /// is complete (`into` may hold its last bytes).
    async fn read_body(&mut self, into: &mut Vec<u8>) -> Result<bool, BodyError<Self::Error>>;

    /// Whether [`Downstream::read_body`] is cancel-safe and may wait while the
    /// response streams (an HTTP/2 upstream's bidirectional call, gRPC's): the codec
    /// reads the request body apart from writing the response. HTTP/1.1's cannot:
    /// its request body is read whole before the answer.
    fn duplex(&self) -> bool {
        false
    }

    /// Ends the response body with `trailers` (an HTTP/2 upstream's, gRPC's
    /// `grpc-status`), the end of the stream. A codec that cannot send trailers
    /// (HTTP/1.1 here) ends the body without them.
    async fn send_trailers(&mut self, trailers: Vec<(String, String)>) -> Result<(), Self::Error> {
        let _ = trailers;
        self.send_body(&[], true).await
    }

    /// Whether [`Downstream::send_trailers`] sends them (HTTP/2 and HTTP/3).
    fn sends_trailers(&self) -> bool {
        false
    }

    /// Whether a body may be spliced to this client from an upstream's socket.
    fn can_splice(&self) -> bool {
        false
    }

    /// Sends the response head, announcing a body of `len` bytes (`None`: known only
    /// at its end), with `first`, its first bytes, and `end` when they are all of it.
    /// `source`: the upstream socket the body's rest will be spliced from.
    async fn send_head(
        &mut self,
        head: Response,
        len: Option<u64>,
        first: &[u8],
        end: bool,
        source: Option<BorrowedFd<'_>>,
    ) -> Result<(), Self::Error>;

    /// Sends an interim response, a 103 (Early Hints) from the upstream, ahead of the
    /// final head. A codec that cannot send one (an HTTP/1.0 client, RFC 9110 section
    /// 15.2) drops it: the default.
    ///
    /// # Cancel safety
    /// Not cancel-safe: part of the head may have been sent.
    async fn send_interim(&mut self, head: Response) -> Result<(), Self::Error> {
        let _ = head;
        Ok(())
    }

    /// Sends the next body bytes; `end`: they are the last (possibly none).
    async fn send_body(&mut self, piece: &[u8], end: bool) -> Result<(), Self::Error>;

    /// Moves `len` body bytes from the upstream socket `from` to the client (given as
    /// `source` to [`Downstream::send_head`]), each wait for the upstream bounded
    /// by `read_timeout`.
    async fn splice(
        &mut self,
        from: &tokio::net::TcpStream,
        len: u64,
        read_timeout: Duration,
    ) -> Result<u64, Spliced<Self::Error>> {
        let _ = (from, len, read_timeout);
        Err(Spliced::Unsupported)
    }

    /// The body failed after the head: the response is to be cut (the connection
    /// closed without its end, the stream reset), never ended as if whole.
    fn abort(&mut self, failure: &Failure);

    /// Sends the head of a tunnel's answer, with `first`, the upstream's first tunnel
    /// bytes; the tunnel's bytes follow by [`Downstream::send_body`] (and
    /// [`Downstream::splice`]) and end with an empty last piece. HTTP/1.1 writes the
    /// 101 as it is, its connection carried by the tunnel from then on; by default the
    /// head goes as a response whose body's length is unknown (HTTP/2's 200 and DATA).
    async fn send_switch(&mut self, head: Response, first: &[u8]) -> Result<(), Self::Error> {
        self.send_head(head, None, first, false, None).await
    }

    /// Appends the client's next tunnel bytes to `into`; `Ok(false)`: the client
    /// ended its side. No bound of its own on the wait (and so no timer set per
    /// read): the tunnel's one timer bounds it. A handle that carries no tunnel
    /// has nothing to read.
    ///
    /// # Cancel safety
    /// Must be cancel-safe: the tunnel waits for both sides at once, and bytes
    /// received are never lost.
    async fn read_tunnel(&mut self, into: &mut Vec<u8>) -> Result<bool, Self::Error> {
        let _ = into;
        Ok(false)
    }

    /// Whether a tunnel's bytes from a plain upstream socket may be spliced to this
    /// client ([`Downstream::splice`], the bytes queued in the socket at a time).
    fn splices_tunnel(&self) -> bool {
        false
    }

    /// The signal that turns true when the connection is retired (a reload, a
    /// stop): a tunnel then ends after a grace period.
    fn retired(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        None
    }
}
