//! HTTP/3 framing of a forwarded request, as the pipeline's [`Downstream`]: the
//! request body read from the stream as it arrives (each piece awaited for at most
//! the header timeout), the response head, body pieces as DATA (each within the
//! send timeout), and the stream's end (FIN) only once the body is complete. A cut
//! response resets the stream with H3_INTERNAL_ERROR, so the client never takes part
//! of a body for the whole. QUIC seals every packet in user space: bodies are
//! copied, never spliced.
//!
//! A tunnel (a WebSocket asked for by an extended CONNECT, RFC 9220) runs over the
//! same stream: its 200 head and the upstream's bytes go out as a response whose
//! length is unknown (DATA, each piece within the send timeout, so a client that
//! keeps its window shut is cut but an idle tunnel, which sends nothing, is not),
//! the client's bytes are the stream's DATA as they arrive ([`Downstream::read_tunnel`],
//! bounded only by the tunnel's idle timer), its end is FIN and a cut resets the
//! stream. The connection's retirement signal ends it after the relay's grace.
//!
//! Not here: what is forwarded and when (`handler::pipeline`, `handler::proxy`), the
//! relay (`handler::proxy::tunnel`), QUIC.

use std::os::fd::BorrowedFd;

use bytes::{BufMut, Bytes};
use h3::quic::BidiStream;
use h3::server::RequestStream;

use super::{within, Settings, Unsent};
use crate::handler::pipeline::Failure;
use crate::handler::pipeline::{BodyError, Downstream};
use crate::handler::{Response, Status};

/// One request stream during a forward.
pub(super) struct Stream<'s, S: BidiStream<Bytes>> {
    pub stream: &'s mut RequestStream<S, Bytes>,
    pub settings: &'s Settings,
    /// For an extended CONNECT: the connection's retirement signal.
    pub retired: Option<tokio::sync::watch::Receiver<bool>>,
}

impl<S: BidiStream<Bytes>> Downstream for Stream<'_, S> {
    type Error = Unsent;

    async fn read_body(&mut self, into: &mut Vec<u8>) -> Result<bool, BodyError<Unsent>> {
        match tokio::time::timeout(self.settings.header_timeout, self.stream.recv_data()).await {
            Ok(Ok(Some(piece))) => {
                into.put(piece);
                Ok(true)
            }
            Ok(Ok(None)) => Ok(false),
            Ok(Err(_)) => Err(BodyError::Refused(Status::BAD_REQUEST, "the request body failed")),
            Err(_) => {
                Err(BodyError::Refused(Status::REQUEST_TIMEOUT, "the request body stalled past the header timeout"))
            }
        }
    }

    async fn send_head(
        &mut self,
        head: Response,
        _len: Option<u64>,
        first: &[u8],
        end: bool,
        _source: Option<BorrowedFd<'_>>,
    ) -> Result<(), Unsent> {
        within(self.settings.send_timeout, self.stream.send_response(super::head(&head))).await?;
        self.send_body(first, end).await
    }

    /// A HEADERS frame of its own ahead of the final one (RFC 9114 section 4.1).
    async fn send_interim(&mut self, head: Response) -> Result<(), Unsent> {
        within(self.settings.send_timeout, self.stream.send_response(super::interim_head(&head))).await
    }

    async fn send_body(&mut self, piece: &[u8], end: bool) -> Result<(), Unsent> {
        let limit = self.settings.send_timeout;
        if !piece.is_empty() {
            within(limit, self.stream.send_data(Bytes::copy_from_slice(piece))).await?;
        }
        if end {
            within(limit, self.stream.finish()).await?;
        }
        Ok(())
    }

    /// `recv_data` is polled to completion or dropped before a piece is taken.
    fn duplex(&self) -> bool {
        true
    }

    fn sends_trailers(&self) -> bool {
        true
    }

    async fn send_trailers(&mut self, trailers: Vec<(String, String)>) -> Result<(), Unsent> {
        let limit = self.settings.send_timeout;
        let mut map = http::HeaderMap::new();
        for (n, v) in &trailers {
            if let (Ok(n), Ok(v)) = (http::HeaderName::from_bytes(n.as_bytes()), http::HeaderValue::from_str(v)) {
                map.append(n, v);
            }
        }
        within(limit, self.stream.send_trailers(map)).await?;
        within(limit, self.stream.finish()).await
    }

    fn abort(&mut self, _failure: &Failure) {
        self.stream.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
    }

    /// The stream's DATA as they arrive; its end (FIN, or trailers) ends the client's
    /// side. No bound of its own: the relay's idle timer bounds the wait.
    ///
    /// # Cancel safety
    /// Cancel-safe: `recv_data` is polled to completion or dropped before a piece is
    /// taken.
    async fn read_tunnel(&mut self, into: &mut Vec<u8>) -> Result<bool, Unsent> {
        match self.stream.recv_data().await {
            Ok(Some(piece)) => {
                into.put(piece);
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(e) => Err(Unsent::Stream(e)),
        }
    }

    fn retired(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.retired.clone()
    }
}
