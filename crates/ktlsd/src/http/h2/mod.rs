//! HTTP/2 (RFC 9113) as a sans-I/O codec: bytes and
//! header lists go in, events and bytes to send come out. It reads no socket, opens
//! no file and reads no clock (the caller passes `now`), so it is tested wholly
//! in-process, and the connection loop over `http::Transport` drives it.
//!
//! Why the framing is ours rather than the `h2` crate's: `h2` owns its write
//! buffer and wants every DATA payload as bytes in memory. Our file bodies leave
//! through `sendfile` from the page cache, and on kernel TLS each DATA frame should
//! be exactly one TLS record: the 9-byte frame header sent with `MSG_MORE`, then
//! the payload by `sendfile`, which is what `Transport::send(head, file range)`
//! does. So the codec never holds file bytes: `poll_write` decides which stream
//! sends how many bytes next (priorities, flow control, frame size) and hands back
//! the frame header ([`Write::FileData`]); the caller sends that many bytes of the
//! stream's file at the offset given.
//!
//! HPACK (RFC 7541) is our own, decoder and encoder; the codec bounds its dynamic table
//! and counts the decoded field list against SETTINGS_MAX_HEADER_LIST_SIZE.
//!
//! Parts: `frame` (wire format and per-frame checks), `hpack` (field-block coding
//! with limits), `request` (RFC 9113 section 8 message rules), `priority` (RFC 9218
//! urgency and the fair choice of the next stream), `conn` (the state machine).
//!
//! `serve` is the connection loop over `http::Transport` that drives the codec:
//! requests through the pipeline (`handler::pipeline`), responses and file ranges
//! to the transport, one DATA frame per TLS record; `forwarded` is the per-stream
//! handle a forward runs over, on a task of its own.
//!
//! Not in the codec: TLS, files, time-outs (the loop closes an idle connection; see
//! [`Connection::active_streams`]), or what responses say.

mod conn;
mod forwarded;
mod frame;
mod hpack;
mod priority;
mod serve;

pub use crate::http::fields::RequestHead;
pub use conn::{BodySize, Connection, Event, Limits, StreamId, Write};
#[cfg(test)]
pub use conn::{RespondError, PREFACE};
/// The HPACK coders alone, for the fuzz targets (`crate::fuzzing`).
pub(crate) use hpack::{Decoded as HpackDecoded, Decoder as HpackDecoder, Encoder as HpackEncoder};
pub use serve::{serve, Settings};

#[cfg(test)]
mod tests;
