//! The graceful close of one [`Connection`] in the two steps of RFC 9113 section
//! 6.8: a first GOAWAY with the largest stream id, so that the client opens no
//! more streams, and a PING; then, once the PING's ACK shows that every stream the
//! client opened before it saw the GOAWAY has arrived (or when the caller gives up
//! waiting), the final GOAWAY with the last stream taken. Streams opened in between
//! are served; the connection is finished when the final GOAWAY is out and every
//! stream is done.
//!
//! Not here: how long to wait for the ACK (the caller's clock decides, and calls
//! [`Connection::finish_shutdown`]).

use super::frame::{self, ErrorCode};
use super::{Connection, Phase};

/// The last-stream-id of the first GOAWAY: the largest a stream id can be, so that no
/// stream the client may have opened already is refused (RFC 9113 section 6.8).
pub const ANY_STREAM: u32 = (1 << 31) - 1;

/// The opaque data of the PING sent with the first GOAWAY; its ACK ends the wait.
pub const SHUTDOWN_PING: [u8; 8] = *b"ktlsd-gw";

/// Where our side of a graceful close stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    /// No GOAWAY sent.
    Open,
    /// GOAWAY with [`ANY_STREAM`] and a PING sent: new streams are still taken, until
    /// the PING's ACK or [`Connection::finish_shutdown`].
    Announced,
    /// The final GOAWAY, naming the last stream taken, is sent: new streams are ignored.
    Final,
}

impl Connection {
    /// Starts a graceful close: GOAWAY with [`ANY_STREAM`] and NO_ERROR, then a PING.
    /// Streams keep being taken until its ACK arrives (then the final GOAWAY goes out
    /// by itself) or the caller calls [`Connection::finish_shutdown`]; streams taken
    /// finish, and `is_finished` turns true when all is sent. A second call does nothing.
    pub fn shutdown(&mut self) {
        if self.closing == Closing::Open && self.phase != Phase::Failed {
            self.closing = Closing::Announced;
            frame::put_goaway(&mut self.out, ANY_STREAM, ErrorCode::NoError);
            frame::put_ping(&mut self.out, SHUTDOWN_PING);
        }
    }

    /// Sends the final GOAWAY now, naming the last stream taken (starting the close
    /// if `shutdown` did not): for a client that does not answer the PING in time.
    /// From here new streams are ignored.
    pub fn finish_shutdown(&mut self) {
        if self.closing != Closing::Final && self.phase != Phase::Failed {
            self.closing = Closing::Final;
            frame::put_goaway(&mut self.out, self.last_stream, ErrorCode::NoError);
        }
    }

    /// Whether the close is between its two GOAWAYs, waiting for the PING's ACK.
    pub fn awaits_shutdown_ack(&self) -> bool {
        self.closing == Closing::Announced && self.phase != Phase::Failed
    }

    /// Whether the connection is over and everything is written: close it now.
    pub fn is_finished(&self) -> bool {
        let drained = (self.closing == Closing::Final || self.peer_going_away) && self.streams.is_empty();
        self.out.is_empty() && (self.phase == Phase::Failed || drained)
    }

    /// A PING ACK: the one for our shutdown PING ends the wait between the GOAWAYs;
    /// every frame the client sent before it has been read.
    pub(super) fn on_ping_ack(&mut self, data: [u8; 8]) {
        if self.closing == Closing::Announced && data == SHUTDOWN_PING {
            self.finish_shutdown();
        }
    }
}
