//! HTTP/1.x framing of a forwarded request, as the pipeline's [`Downstream`]: the
//! request body as it arrives (Content-Length framed or chunked, a `100 Continue`
//! first when the client waits for one), the response head with the client's
//! framing (Content-Length when the upstream gave one, else chunked, or
//! close-delimited for an HTTP/1.0 client), body pieces, and a Content-Length body
//! moved by `splice` on kernel TLS (`Transport::splice`): socket to socket, never
//! through user space. A cut response ends the connection without its last chunk
//! or close_notify, so the client never takes part of a body for the whole.
//!
//! Not here: what is forwarded and when (`handler::pipeline`, `handler::proxy`).

use std::io::Write;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use super::parse::Version;
use super::write;
use crate::handler::pipeline::{buffers, Chunked, Failure};
use crate::handler::pipeline::{BodyError, Downstream};
use crate::handler::{Header, Response, Status};
use crate::http::{End, Spliced, Transport};

/// The request body still to come.
pub(super) enum RequestBody {
    /// This many bytes of a Content-Length body.
    Length(u64),
    Chunked(Chunked),
}

/// One request's side of an HTTP/1.x connection during a forward.
pub(super) struct Client<'c, T> {
    pub conn: &'c mut T,
    /// Bytes received and not yet consumed.
    pub buf: &'c mut Vec<u8>,
    pub version: Version,
    /// Whether the connection may carry another request after this one.
    pub keep_alive: bool,
    pub expect_continue: bool,
    pub body: RequestBody,
    /// The time each read of the request body may take.
    pub header_timeout: Duration,
    /// The response body is chunk-framed (its length unknown, HTTP/1.1).
    pub chunked: bool,
    /// The response was cut: the connection must end without closing politely.
    pub aborted: bool,
    /// For a request that asks for a tunnel: the connection's retirement signal.
    pub retired: Option<tokio::sync::watch::Receiver<bool>>,
}

impl<T: Transport> Client<'_, T> {
    /// Whether the request body was read to its end.
    pub fn body_read(&self) -> bool {
        match &self.body {
            RequestBody::Length(left) => *left == 0,
            RequestBody::Chunked(decoder) => decoder.is_done(),
        }
    }

    async fn read_more(&mut self) -> Result<(), End<T::Error>> {
        match self.conn.read(self.buf, self.header_timeout).await {
            Ok(0) => Err(End::Truncated),
            Ok(_) => Ok(()),
            Err(e) => Err(ended::<T>(e)),
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), End<T::Error>> {
        self.conn.send(bytes, None).await.map(drop).map_err(ended::<T>)
    }
}

/// The connection's end for a failed read or send.
fn ended<T: Transport>(e: T::Error) -> End<T::Error> {
    if T::timed_out(&e) {
        End::Timeout
    } else {
        End::Error(e)
    }
}

impl<T: Transport> Downstream for Client<'_, T> {
    type Error = End<T::Error>;

    fn body_at_hand(&mut self) -> Vec<u8> {
        let RequestBody::Length(left) = &mut self.body else { return Vec::new() };
        let take = (self.buf.len() as u64).min(*left) as usize;
        *left -= take as u64;
        self.buf.drain(..take).collect()
    }

    async fn read_body(&mut self, into: &mut Vec<u8>) -> Result<bool, BodyError<Self::Error>> {
        if std::mem::take(&mut self.expect_continue) {
            // The client may already have sent the body; RFC 9110 section 10.1.1 lets
            // the server send 100 anyway, and nginx does.
            self.send(write::CONTINUE).await.map_err(BodyError::Client)?;
        }
        loop {
            match &mut self.body {
                RequestBody::Length(0) => return Ok(false),
                RequestBody::Length(left) if !self.buf.is_empty() => {
                    let take = (self.buf.len() as u64).min(*left) as usize;
                    *left -= take as u64;
                    into.extend(self.buf.drain(..take));
                    return Ok(*left > 0);
                }
                RequestBody::Chunked(decoder) if !self.buf.is_empty() => {
                    let Ok(used) = decoder.decode(self.buf, into) else {
                        return Err(BodyError::Refused(Status::BAD_REQUEST, "invalid chunked request body"));
                    };
                    self.buf.drain(..used);
                    if decoder.is_done() {
                        return Ok(false);
                    }
                    if !into.is_empty() {
                        return Ok(true);
                    }
                    if used > 0 {
                        continue;
                    }
                }
                _ => {}
            }
            self.read_more().await.map_err(BodyError::Client)?;
        }
    }

    fn can_splice(&self) -> bool {
        self.conn.can_splice()
    }

    async fn send_head(
        &mut self,
        mut head: Response,
        len: Option<u64>,
        first: &[u8],
        end: bool,
        _source: Option<BorrowedFd<'_>>,
    ) -> Result<(), Self::Error> {
        if len.is_none() {
            match self.version {
                Version::Http11 => {
                    head.headers.push(Header::Field("Transfer-Encoding".into(), "chunked".into()));
                    self.chunked = true;
                }
                // Close-delimited, for a client that knows no chunks.
                _ => self.keep_alive = false,
            }
        }
        let mut out = write::head_into(buffers::take(), &head, self.version, self.keep_alive);
        frame(&mut out, first, self.chunked, end);
        let r = self.send(&out).await;
        buffers::give(out);
        r
    }

    /// Not to an HTTP/1.0 client, which knows no interim responses (RFC 9110
    /// section 15.2).
    async fn send_interim(&mut self, head: Response) -> Result<(), Self::Error> {
        if self.version != Version::Http11 {
            return Ok(());
        }
        let out = write::interim_into(buffers::take(), &head);
        let r = self.send(&out).await;
        buffers::give(out);
        r
    }

    async fn send_body(&mut self, piece: &[u8], end: bool) -> Result<(), Self::Error> {
        if !self.chunked {
            return match piece.is_empty() {
                true => Ok(()),
                false => self.send(piece).await,
            };
        }
        let mut out = buffers::take();
        frame(&mut out, piece, true, end);
        let r = match out.is_empty() {
            true => Ok(()),
            false => self.send(&out).await,
        };
        buffers::give(out);
        r
    }

    async fn splice(
        &mut self,
        from: &tokio::net::TcpStream,
        len: u64,
        read_timeout: Duration,
    ) -> Result<u64, Spliced<Self::Error>> {
        self.conn.splice(from, len, read_timeout).await.map_err(|e| match e {
            Spliced::Unsupported => Spliced::Unsupported,
            Spliced::SourceClosed { moved } => Spliced::SourceClosed { moved },
            Spliced::SourceTimedOut { moved } => Spliced::SourceTimedOut { moved },
            Spliced::Source { moved, error } => Spliced::Source { moved, error },
            Spliced::Peer(e) => Spliced::Peer(ended::<T>(e)),
        })
    }

    fn abort(&mut self, _failure: &Failure) {
        self.aborted = true;
    }

    /// The 101 as it is (no framing, no `Connection: close`): the connection is the
    /// tunnel's from here, and ends with it.
    async fn send_switch(&mut self, head: Response, first: &[u8]) -> Result<(), Self::Error> {
        self.keep_alive = false;
        let mut out = write::head_into(buffers::take(), &head, Version::Http11, true);
        out.extend_from_slice(first);
        let r = self.send(&out).await;
        buffers::give(out);
        r
    }

    /// Bytes that came after the request head first, then each read.
    ///
    /// # Cancel safety
    /// Cancel-safe: `Transport::read` is.
    async fn read_tunnel(&mut self, into: &mut Vec<u8>) -> Result<bool, Self::Error> {
        if !self.buf.is_empty() {
            into.append(self.buf);
            return Ok(true);
        }
        match self.conn.read(into, crate::net::UNBOUNDED).await {
            Ok(0) => Ok(false),
            Ok(_) => Ok(true),
            Err(e) => Err(ended::<T>(e)),
        }
    }

    fn splices_tunnel(&self) -> bool {
        self.conn.can_splice()
    }

    fn retired(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.retired.clone()
    }
}

/// The last chunk of a chunked body, with no trailer.
const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Appends `piece` of a body to `out`, as a chunk when `chunked` (nothing for an
/// empty piece), and the last chunk when `end`.
fn frame(out: &mut Vec<u8>, piece: &[u8], chunked: bool, end: bool) {
    if chunked && !piece.is_empty() {
        let _ = write!(out, "{:x}\r\n", piece.len()); // into a Vec: cannot fail
        out.extend_from_slice(piece);
        out.extend_from_slice(b"\r\n");
    } else {
        out.extend_from_slice(piece);
    }
    if chunked && end {
        out.extend_from_slice(LAST_CHUNK);
    }
}
