//! SETTINGS and WINDOW_UPDATE for one [`Connection`]: the peer's parameters and
//! the send windows they move (RFC 9113 sections 6.5 and 6.9).
//!
//! Not here: our receive windows (credit for discarded request bodies stays with DATA).

use std::time::{Duration, Instant};

use super::frame::{self, setting, ErrorCode, FrameError};
use super::{Connection, Ended, Event, StreamId, SMALL_WINDOW_UPDATE};

impl Connection {
    /// Resets with CANCEL each stream that has had bytes to send and its own window
    /// shut for `timeout`, as nginx does at its `send_timeout`; the connection's
    /// other streams go on. Call it with the time as often as the connection
    /// writes: a stream's stall is counted from the first call that sees it.
    pub fn reset_stalled(&mut self, now: Instant, timeout: Duration) {
        let mut i = 0;
        while i < self.streams.len() {
            let stream = &mut self.streams[i];
            if stream.remaining() == 0 || stream.send_window > 0 {
                stream.blocked_since = None;
                i += 1;
                continue;
            }
            let since = *stream.blocked_since.get_or_insert(now);
            if now.saturating_duration_since(since) < timeout {
                i += 1;
                continue;
            }
            let id = stream.id;
            self.streams.swap_remove(i);
            frame::put_rst_stream(&mut self.out, id, ErrorCode::Cancel);
            self.remember(id, Ended::ResetByUs);
            self.events.push_back(Event::Reset { stream: StreamId(id), code: ErrorCode::Cancel });
        }
    }

    pub(super) fn on_settings(&mut self, params: &[u8]) -> Result<(), FrameError> {
        use ErrorCode::*;
        use FrameError::Connection as Conn;
        for (id, value) in frame::settings_params(params) {
            match id {
                setting::HEADER_TABLE_SIZE => self.encoder.set_peer_table_size(value),
                setting::ENABLE_PUSH if value > 1 => return Err(Conn(ProtocolError)),
                setting::NO_RFC7540_PRIORITIES if value > 1 => return Err(Conn(ProtocolError)),
                setting::INITIAL_WINDOW_SIZE => {
                    if i64::from(value) > frame::MAX_WINDOW {
                        return Err(Conn(FlowControlError));
                    }
                    // The change applies to every stream's window, which may go
                    // negative (RFC 9113 section 6.9.2).
                    let delta = i64::from(value) - i64::from(self.peer_initial_window);
                    self.peer_initial_window = value;
                    for stream in &mut self.streams {
                        stream.send_window += delta;
                        if stream.send_window > frame::MAX_WINDOW {
                            return Err(Conn(FlowControlError));
                        }
                    }
                }
                setting::MAX_FRAME_SIZE => {
                    if !(frame::DEFAULT_MAX_FRAME_SIZE..=frame::MAX_MAX_FRAME_SIZE).contains(&value) {
                        return Err(Conn(ProtocolError));
                    }
                    self.peer_max_frame = value;
                }
                // MAX_CONCURRENT_STREAMS limits pushes, which we never make;
                // MAX_HEADER_LIST_SIZE is advisory; unknown settings are ignored.
                _ => {}
            }
        }
        Ok(())
    }

    pub(super) fn on_window_update(&mut self, id: u32, increment: u32) -> Result<(), FrameError> {
        use ErrorCode::*;
        use FrameError::{Connection as Conn, Stream as Strm};
        if increment < SMALL_WINDOW_UPDATE {
            self.count_control()?;
        }
        if id == 0 {
            if increment == 0 {
                return Err(Conn(ProtocolError));
            }
            self.send_window += i64::from(increment);
            if self.send_window > frame::MAX_WINDOW {
                return Err(Conn(FlowControlError));
            }
            return Ok(());
        }
        if id > self.last_stream {
            return Err(Conn(ProtocolError));
        }
        let Some(index) = self.index(id) else {
            // Closed streams may still receive WINDOW_UPDATE for a while.
            return Ok(());
        };
        if increment == 0 {
            return Err(Strm(id, ProtocolError));
        }
        let stream = &mut self.streams[index];
        stream.send_window += i64::from(increment);
        if stream.send_window > frame::MAX_WINDOW {
            return Err(Strm(id, FlowControlError));
        }
        Ok(())
    }
}
