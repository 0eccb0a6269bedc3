//! HTTP/2 frames (RFC 9113 section 4 and 6, RFC 9218 PRIORITY_UPDATE): the 9-byte
//! header, decoding a whole frame into a borrowed view with the size and field
//! checks the RFC requires, and the bytes of the frames a server sends.
//!
//! Not here: what a frame means for stream or connection state (see `conn`), and
//! HPACK (field blocks stay opaque bytes).

use std::fmt;

/// Length of every frame header.
pub const HEADER_LEN: usize = 9;
/// SETTINGS_MAX_FRAME_SIZE before any SETTINGS, and the least a peer may set.
pub const DEFAULT_MAX_FRAME_SIZE: u32 = 16_384;
/// The largest SETTINGS_MAX_FRAME_SIZE a peer may set.
pub const MAX_MAX_FRAME_SIZE: u32 = (1 << 24) - 1;
/// The largest flow-control window (RFC 9113 section 6.9.1).
pub const MAX_WINDOW: i64 = (1 << 31) - 1;
/// Flow-control windows before SETTINGS_INITIAL_WINDOW_SIZE says otherwise.
pub const DEFAULT_WINDOW: u32 = 65_535;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const PRIORITY: u8 = 0x2;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;
/// RFC 9218 section 7.1.
pub const PRIORITY_UPDATE: u8 = 0x10;

pub const FLAG_END_STREAM: u8 = 0x1;
pub const FLAG_ACK: u8 = 0x1;
pub const FLAG_END_HEADERS: u8 = 0x4;
pub const FLAG_PADDED: u8 = 0x8;
pub const FLAG_PRIORITY: u8 = 0x20;

/// SETTINGS parameter identifiers (RFC 9113 section 6.5.2, RFC 9218 section 2.1).
pub mod setting {
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    pub const ENABLE_PUSH: u16 = 0x2;
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
    /// RFC 8441 section 3: the extended CONNECT (WebSockets over HTTP/2) is accepted.
    pub const ENABLE_CONNECT_PROTOCOL: u16 = 0x8;
    pub const NO_RFC7540_PRIORITIES: u16 = 0x9;
}

/// HTTP/2 error codes (RFC 9113 section 7); unknown codes are kept as received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    NoError,
    ProtocolError,
    InternalError,
    FlowControlError,
    SettingsTimeout,
    StreamClosed,
    FrameSizeError,
    RefusedStream,
    Cancel,
    CompressionError,
    ConnectError,
    EnhanceYourCalm,
    InadequateSecurity,
    Http11Required,
    Unknown(u32),
}

impl ErrorCode {
    pub fn from_u32(code: u32) -> ErrorCode {
        use ErrorCode::*;
        match code {
            0x0 => NoError,
            0x1 => ProtocolError,
            0x2 => InternalError,
            0x3 => FlowControlError,
            0x4 => SettingsTimeout,
            0x5 => StreamClosed,
            0x6 => FrameSizeError,
            0x7 => RefusedStream,
            0x8 => Cancel,
            0x9 => CompressionError,
            0xa => ConnectError,
            0xb => EnhanceYourCalm,
            0xc => InadequateSecurity,
            0xd => Http11Required,
            other => Unknown(other),
        }
    }

    pub fn as_u32(self) -> u32 {
        use ErrorCode::*;
        match self {
            NoError => 0x0,
            ProtocolError => 0x1,
            InternalError => 0x2,
            FlowControlError => 0x3,
            SettingsTimeout => 0x4,
            StreamClosed => 0x5,
            FrameSizeError => 0x6,
            RefusedStream => 0x7,
            Cancel => 0x8,
            CompressionError => 0x9,
            ConnectError => 0xa,
            EnhanceYourCalm => 0xb,
            InadequateSecurity => 0xc,
            Http11Required => 0xd,
            Unknown(other) => other,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorCode::Unknown(code) => write!(f, "error code {code:#x}"),
            known => write!(f, "{known:?}"),
        }
    }
}

/// A frame's 9-byte header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub len: u32,
    pub kind: u8,
    pub flags: u8,
    /// The stream identifier with the reserved bit cleared (RFC 9113 section 4.1).
    pub stream: u32,
}

impl Head {
    pub fn parse(b: &[u8; HEADER_LEN]) -> Head {
        Head {
            len: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    pub fn encode(self) -> [u8; HEADER_LEN] {
        let len = self.len.to_be_bytes();
        let id = (self.stream & 0x7fff_ffff).to_be_bytes();
        [len[1], len[2], len[3], self.kind, self.flags, id[0], id[1], id[2], id[3]]
    }

    pub fn has(self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// RFC 7540 priority information in HEADERS or PRIORITY; only its self-dependency
/// is checked (RFC 9113 section 5.3.1), the rest is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dependency {
    pub on: u32,
}

/// A decoded frame, borrowing its payload.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    Data {
        stream: u32,
        end_stream: bool,
        /// Payload without padding.
        data: &'a [u8],
        /// The whole frame payload length, which is what flow control counts.
        flow_len: u32,
    },
    Headers {
        stream: u32,
        end_stream: bool,
        end_headers: bool,
        dependency: Option<Dependency>,
        block: &'a [u8],
    },
    Priority {
        stream: u32,
        dependency: Dependency,
    },
    RstStream {
        stream: u32,
        code: ErrorCode,
    },
    Settings {
        ack: bool,
        /// Six-byte (identifier, value) entries.
        params: &'a [u8],
    },
    Ping {
        ack: bool,
        data: [u8; 8],
    },
    GoAway {
        last_stream: u32,
        code: ErrorCode,
    },
    WindowUpdate {
        stream: u32,
        increment: u32,
    },
    Continuation {
        stream: u32,
        end_headers: bool,
        block: &'a [u8],
    },
    PriorityUpdate {
        prioritized: u32,
        value: &'a [u8],
    },
    /// Unknown frame types are ignored (RFC 9113 section 5.5).
    Unknown,
}

/// A malformed frame, and the error the RFC requires for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// The whole connection ends with GOAWAY carrying this code.
    Connection(ErrorCode),
    /// Only this stream ends, with RST_STREAM carrying this code.
    Stream(u32, ErrorCode),
}

use ErrorCode::{FrameSizeError, ProtocolError};
use FrameError::Connection;

/// Iterates the (identifier, value) pairs of a SETTINGS payload whose length is a
/// multiple of six (checked by `decode`).
pub fn settings_params(params: &[u8]) -> impl Iterator<Item = (u16, u32)> + '_ {
    params.chunks_exact(6).map(|p| (u16::from_be_bytes([p[0], p[1]]), u32::from_be_bytes([p[2], p[3], p[4], p[5]])))
}

/// Removes the padding of a PADDED frame; padding as long as the payload is a
/// connection error (RFC 9113 sections 6.1 and 6.2).
fn unpad(head: Head, payload: &[u8]) -> Result<&[u8], FrameError> {
    if !head.has(FLAG_PADDED) {
        return Ok(payload);
    }
    let (&pad, rest) = payload.split_first().ok_or(Connection(ProtocolError))?;
    let pad = usize::from(pad);
    if pad > rest.len() {
        return Err(Connection(ProtocolError));
    }
    Ok(&rest[..rest.len() - pad])
}

fn u32_at(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Decodes one frame whose payload (`head.len` bytes, already checked against our
/// SETTINGS_MAX_FRAME_SIZE) is complete.
pub fn decode(head: Head, payload: &[u8]) -> Result<Frame<'_>, FrameError> {
    debug_assert_eq!(payload.len(), head.len as usize);
    let stream = head.stream;
    let on_stream = || if stream == 0 { Err(Connection(ProtocolError)) } else { Ok(()) };
    let on_connection = || if stream != 0 { Err(Connection(ProtocolError)) } else { Ok(()) };
    Ok(match head.kind {
        DATA => {
            on_stream()?;
            Frame::Data {
                stream,
                end_stream: head.has(FLAG_END_STREAM),
                data: unpad(head, payload)?,
                flow_len: head.len,
            }
        }
        HEADERS => {
            on_stream()?;
            let mut block = unpad(head, payload)?;
            let mut dependency = None;
            if head.has(FLAG_PRIORITY) {
                if block.len() < 5 {
                    return Err(Connection(FrameSizeError));
                }
                dependency = Some(Dependency { on: u32_at(block) & 0x7fff_ffff });
                block = &block[5..];
            }
            Frame::Headers {
                stream,
                end_stream: head.has(FLAG_END_STREAM),
                end_headers: head.has(FLAG_END_HEADERS),
                dependency,
                block,
            }
        }
        PRIORITY => {
            on_stream()?;
            if payload.len() != 5 {
                return Err(FrameError::Stream(stream, FrameSizeError));
            }
            Frame::Priority { stream, dependency: Dependency { on: u32_at(payload) & 0x7fff_ffff } }
        }
        RST_STREAM => {
            on_stream()?;
            if payload.len() != 4 {
                return Err(Connection(FrameSizeError));
            }
            Frame::RstStream { stream, code: ErrorCode::from_u32(u32_at(payload)) }
        }
        SETTINGS => {
            on_connection()?;
            let ack = head.has(FLAG_ACK);
            if (ack && !payload.is_empty()) || payload.len() % 6 != 0 {
                return Err(Connection(FrameSizeError));
            }
            Frame::Settings { ack, params: payload }
        }
        // A client cannot promise streams (RFC 9113 section 8.4).
        PUSH_PROMISE => return Err(Connection(ProtocolError)),
        PING => {
            on_connection()?;
            let data: [u8; 8] = payload.try_into().map_err(|_| Connection(FrameSizeError))?;
            Frame::Ping { ack: head.has(FLAG_ACK), data }
        }
        GOAWAY => {
            on_connection()?;
            if payload.len() < 8 {
                return Err(Connection(FrameSizeError));
            }
            Frame::GoAway {
                last_stream: u32_at(payload) & 0x7fff_ffff,
                code: ErrorCode::from_u32(u32_at(&payload[4..])),
            }
        }
        WINDOW_UPDATE => {
            if payload.len() != 4 {
                return Err(Connection(FrameSizeError));
            }
            Frame::WindowUpdate { stream, increment: u32_at(payload) & 0x7fff_ffff }
        }
        CONTINUATION => {
            on_stream()?;
            Frame::Continuation { stream, end_headers: head.has(FLAG_END_HEADERS), block: payload }
        }
        PRIORITY_UPDATE => {
            on_connection()?;
            if payload.len() < 4 {
                return Err(Connection(FrameSizeError));
            }
            let prioritized = u32_at(payload) & 0x7fff_ffff;
            if prioritized == 0 {
                return Err(Connection(ProtocolError));
            }
            Frame::PriorityUpdate { prioritized, value: &payload[4..] }
        }
        _ => Frame::Unknown,
    })
}

/// Appends a frame with `payload` to `out`.
pub fn put(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    debug_assert!(len <= MAX_MAX_FRAME_SIZE);
    out.extend_from_slice(&Head { len, kind, flags, stream }.encode());
    out.extend_from_slice(payload);
}

pub fn put_settings(out: &mut Vec<u8>, params: &[(u16, u32)]) {
    let mut payload = Vec::with_capacity(params.len() * 6);
    for &(id, value) in params {
        payload.extend_from_slice(&id.to_be_bytes());
        payload.extend_from_slice(&value.to_be_bytes());
    }
    put(out, SETTINGS, 0, 0, &payload);
}

pub fn put_settings_ack(out: &mut Vec<u8>) {
    put(out, SETTINGS, FLAG_ACK, 0, &[]);
}

pub fn put_ping(out: &mut Vec<u8>, data: [u8; 8]) {
    put(out, PING, 0, 0, &data);
}

pub fn put_ping_ack(out: &mut Vec<u8>, data: [u8; 8]) {
    put(out, PING, FLAG_ACK, 0, &data);
}

pub fn put_goaway(out: &mut Vec<u8>, last_stream: u32, code: ErrorCode) {
    let mut payload = [0; 8];
    payload[..4].copy_from_slice(&last_stream.to_be_bytes());
    payload[4..].copy_from_slice(&code.as_u32().to_be_bytes());
    put(out, GOAWAY, 0, 0, &payload);
}

pub fn put_rst_stream(out: &mut Vec<u8>, stream: u32, code: ErrorCode) {
    put(out, RST_STREAM, 0, stream, &code.as_u32().to_be_bytes());
}

pub fn put_window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    put(out, WINDOW_UPDATE, 0, stream, &increment.to_be_bytes());
}

/// Appends a field block as HEADERS followed by as many CONTINUATION frames as
/// `max_frame` requires.
pub fn put_headers(out: &mut Vec<u8>, stream: u32, block: &[u8], end_stream: bool, max_frame: usize) {
    let mut chunks = block.chunks(max_frame.max(1));
    let first = chunks.next().unwrap_or(&[]);
    let rest = chunks.len();
    let mut flags = if end_stream { FLAG_END_STREAM } else { 0 };
    if rest == 0 {
        flags |= FLAG_END_HEADERS;
    }
    put(out, HEADERS, flags, stream, first);
    for (i, chunk) in chunks.enumerate() {
        let flags = if i + 1 == rest { FLAG_END_HEADERS } else { 0 };
        put(out, CONTINUATION, flags, stream, chunk);
    }
}

/// The header of a DATA frame carrying `len` bytes.
pub fn data_head(stream: u32, len: u32, end_stream: bool) -> [u8; HEADER_LEN] {
    let flags = if end_stream { FLAG_END_STREAM } else { 0 };
    Head { len, kind: DATA, flags, stream }.encode()
}
