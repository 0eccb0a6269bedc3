//! Response bodies of one [`Connection`] whose bytes the caller hands over as they
//! come ([`super::BodySize::Stream`]), and the early end of a body whose source failed.
//!
//! Not here: the choice of which stream sends next (`poll_write`).

use super::frame::{self, ErrorCode};
use super::{Connection, Ended, Phase, RespondError, Send, StreamId};

impl Connection {
    /// Gives the next piece of a [`super::BodySize::Stream`] body; bytes beyond its length
    /// are dropped. `StreamGone`: the stream was reset or the connection failed.
    pub fn push(&mut self, stream: StreamId, data: &[u8]) -> Result<(), RespondError> {
        if self.phase == Phase::Failed {
            return Err(RespondError::StreamGone);
        }
        let index = self.index(stream.0).ok_or(RespondError::StreamGone)?;
        let Send::Stream { buf, pos, left, at_source } = &mut self.streams[index].send else {
            return Err(RespondError::AlreadyResponded);
        };
        if *at_source > 0 {
            // The bytes in memory go before those at the source: none may follow them.
            return Err(RespondError::AlreadyResponded);
        }
        buf.drain(..*pos);
        *pos = 0;
        let given = buf.len() as u64;
        let room = left.map_or(data.len(), |left| left.saturating_sub(given).min(data.len() as u64) as usize);
        buf.extend_from_slice(&data[..room]);
        Ok(())
    }

    /// Ends `stream`'s open-ended [`super::BodySize::Stream`] body after the bytes
    /// given so far: the last of them carry END_STREAM, or an empty DATA frame does
    /// when all are sent. A body of known length ends by itself: nothing changes.
    pub fn finish(&mut self, stream: StreamId) -> Result<(), RespondError> {
        if self.phase == Phase::Failed {
            return Err(RespondError::StreamGone);
        }
        let index = self.index(stream.0).ok_or(RespondError::StreamGone)?;
        if let Send::Stream { buf, pos, left: left @ None, at_source } = &mut self.streams[index].send {
            *left = Some((buf.len() - *pos) as u64 + *at_source);
        }
        Ok(())
    }

    /// Ends `stream`'s open-ended [`super::BodySize::Stream`] body with a trailer
    /// section (HEADERS with END_STREAM; names lowercased, connection-specific fields
    /// dropped), once every byte given so far was sent: `AlreadyResponded` while some
    /// wait (try again after they left) or when the body is of known length, which
    /// ends by itself.
    pub fn trailers(&mut self, stream: StreamId, fields: &[(String, String)]) -> Result<(), RespondError> {
        if self.phase == Phase::Failed {
            return Err(RespondError::StreamGone);
        }
        let index = self.index(stream.0).ok_or(RespondError::StreamGone)?;
        match &self.streams[index].send {
            Send::Stream { buf, pos, left: None, at_source: 0 } if *pos == buf.len() => {}
            _ => return Err(RespondError::AlreadyResponded),
        }
        let mut block = std::mem::take(&mut self.block);
        self.encoder.start(&mut block);
        self.encode_fields(fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())), &mut block);
        frame::put_headers(&mut self.out, stream.0, &block, true, frame::DEFAULT_MAX_FRAME_SIZE as usize);
        self.block = block;
        self.streams[index].send = Send::Done;
        self.finish_send(index);
        Ok(())
    }

    /// Says that `n` more bytes of `stream`'s [`super::BodySize::Stream`] body wait at
    /// the caller's source (an upstream socket): they leave as [`super::Write::SourceData`],
    /// after every byte given by [`Connection::push`], which takes no more then. Bytes
    /// beyond the body's length are not counted.
    pub fn push_at_source(&mut self, stream: StreamId, n: u64) -> Result<(), RespondError> {
        if self.phase == Phase::Failed {
            return Err(RespondError::StreamGone);
        }
        let index = self.index(stream.0).ok_or(RespondError::StreamGone)?;
        let Send::Stream { buf, pos, left, at_source } = &mut self.streams[index].send else {
            return Err(RespondError::AlreadyResponded);
        };
        let given = (buf.len() - *pos) as u64 + *at_source;
        *at_source += left.map_or(n, |left| left.saturating_sub(given).min(n));
        Ok(())
    }

    /// Bytes of `stream`'s [`super::BodySize::Stream`] body given in memory and not yet
    /// sent (`None`: the stream is not sending such a body), so the caller bounds what
    /// it hands over.
    pub fn buffered(&self, stream: StreamId) -> Option<usize> {
        match &self.streams[self.index(stream.0)?].send {
            Send::Stream { buf, pos, .. } => Some(buf.len() - pos),
            _ => None,
        }
    }

    /// Ends `stream`'s response early with RST_STREAM INTERNAL_ERROR because its body's
    /// source failed: the client sees the stream fail, never a short body as whole.
    /// `unsent` is the DATA length of the last [`Write::FileData`] that was not sent;
    /// it goes back to the connection's window. Not counted as a reset the client provoked.
    pub fn abort(&mut self, stream: StreamId, unsent: u32) {
        self.send_window += i64::from(unsent);
        frame::put_rst_stream(&mut self.out, stream.0, ErrorCode::InternalError);
        if let Some(index) = self.index(stream.0) {
            self.streams.swap_remove(index);
        }
        self.remember(stream.0, Ended::ResetByUs);
    }
}
