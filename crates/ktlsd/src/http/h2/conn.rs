//! The server side of one HTTP/2 connection as a state machine: bytes in (`recv`),
//! events out (`poll_event`), responses in (`respond`), writes out (`poll_write`).
//! It keeps the stream states of RFC 9113 section 5.1, both directions of flow
//! control, the HPACK contexts, and the limits against known floods.
//!
//! Not here: sockets, files or time sources (the caller passes `now`), and what a
//! response says (the handler decides).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::frame::{self, setting, ErrorCode, Frame, FrameError, Head};
use super::hpack::{self, Decoded};
use super::priority::{self, Priority};
use crate::http::fields::{self as request, RequestHead};

/// The client connection preface (RFC 9113 section 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A client-initiated stream (odd, non-zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u32);

/// Settings and flood limits for one connection.
#[derive(Debug, Clone)]
pub struct Limits {
    /// SETTINGS_MAX_CONCURRENT_STREAMS; streams beyond it get REFUSED_STREAM.
    pub max_concurrent_streams: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE, enforced on the decoded list (RFC 9113 size
    /// rule); a larger request is answered 431.
    pub max_header_list_size: u32,
    /// SETTINGS_HEADER_TABLE_SIZE: the largest HPACK table the peer may make us keep.
    pub header_table_size: u32,
    /// Encoded bytes of one field block (HEADERS plus CONTINUATIONs); beyond it the
    /// connection ends with ENHANCE_YOUR_CALM.
    pub max_header_block: usize,
    /// CONTINUATION frames in one field block; beyond it, ENHANCE_YOUR_CALM.
    pub max_continuations: u32,
    /// The accounting window of the two rate limits below.
    pub flood_window: Duration,
    /// Streams cancelled before their response ended (RST_STREAM from the client,
    /// or a reset the client provoked) per window; beyond it, ENHANCE_YOUR_CALM
    /// (rapid reset, CVE-2023-44487).
    pub max_resets: u32,
    /// Frames that cost us work but carry no request (SETTINGS, PING, PRIORITY,
    /// PRIORITY_UPDATE, unknown types, empty DATA without END_STREAM,
    /// WINDOW_UPDATE below 1 KiB) per window; beyond it, ENHANCE_YOUR_CALM.
    pub max_control: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_concurrent_streams: 128,
            max_header_list_size: 32 * 1024,
            header_table_size: 4096,
            max_header_block: 64 * 1024,
            max_continuations: 32,
            flood_window: Duration::from_secs(10),
            max_resets: 200,
            max_control: 1000,
        }
    }
}

/// A response body as the codec needs it: only its size when the bytes are a file
/// the caller sends itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodySize {
    /// No body (HEAD, 304, ...): HEADERS ends the stream.
    None,
    /// A body the codec frames itself.
    Bytes(Vec<u8>),
    /// A file body of `len` bytes; each DATA frame comes out as `Write::FileData`.
    File { len: u64 },
    /// A body the caller hands over piece by piece ([`Connection::push`]); its DATA
    /// frames come out as [`Write::Data`] as far as the pieces given reach. `len`: its
    /// length; `None`: not known ahead, the body ends where [`Connection::finish`] says.
    Stream { len: Option<u64> },
}

/// What the connection tells its caller.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// A new request; `end_stream` is false when a body follows (the codec reads it,
    /// returning its flow-control credit, and discards it unless bodies are delivered).
    Request { stream: StreamId, head: RequestHead, end_stream: bool },
    /// A piece of a request body, once [`Connection::deliver_bodies`] asked for them;
    /// its stream's credit comes back when the caller says so ([`Connection::consumed`]).
    Data { stream: StreamId, data: Vec<u8>, end_stream: bool },
    /// A request whose decoded field list exceeds SETTINGS_MAX_HEADER_LIST_SIZE:
    /// answer it 431 (RFC 9113 section 10.5.1) with `respond`, Date and all.
    HeaderListTooLarge { stream: StreamId },
    /// The stream ended early (the client reset it, or broke a rule on it): drop
    /// its response.
    Reset { stream: StreamId, code: ErrorCode },
    /// The client sent GOAWAY: it opens no more streams; the open ones finish.
    PeerGoAway { code: ErrorCode },
    /// The connection failed with this error; GOAWAY is queued and every stream is
    /// gone. Send what `poll_write` gives, then close.
    ConnectionError { code: ErrorCode },
}

/// Bytes for the caller to send, in order. Each write fits the `max_payload` + 9
/// bytes it was asked for when it carries DATA, so on kTLS it leaves as one record.
#[derive(Debug, PartialEq, Eq)]
pub enum Write {
    /// Frames whose bytes the codec owns.
    Bytes(Vec<u8>),
    /// Send `head` (pending frames, then the 9-byte DATA frame header that ends it),
    /// then `len` bytes of the stream's file starting at body offset `offset`.
    /// `end_stream`: this is the stream's last frame; the caller may drop the file.
    FileData { stream: StreamId, head: Vec<u8>, offset: u64, len: u32, end_stream: bool },
    /// Pending frames, then a DATA frame of `len` bytes of a [`BodySize::Stream`] body.
    /// `end_stream`: this is the stream's last frame.
    Data { stream: StreamId, bytes: Vec<u8>, len: u32, end_stream: bool },
    /// Send `head` (pending frames, then the 9-byte DATA frame header that ends it),
    /// then `len` bytes the caller takes from the stream's source itself, in one
    /// record ([`Connection::push_at_source`]). `end_stream`: the stream's last frame.
    SourceData { stream: StreamId, head: Vec<u8>, len: u32, end_stream: bool },
}

/// Why `respond` refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RespondError {
    #[error("the stream is gone (reset by the client, or the connection failed); drop the response")]
    StreamGone,
    #[error("this stream has a response already")]
    AlreadyResponded,
}

/// What we still send on a stream.
#[derive(Debug)]
enum Send {
    /// The caller has not responded yet.
    Waiting,
    Bytes {
        data: Vec<u8>,
        pos: usize,
    },
    File {
        len: u64,
        offset: u64,
    },
    /// A body handed over piece by piece: `buf[pos..]` is given and unsent, then
    /// `at_source` bytes the caller moves from its source itself; `left` is what is
    /// still to send in all (given or not), `None` until the caller says where an
    /// open-ended body ends.
    Stream {
        buf: Vec<u8>,
        pos: usize,
        at_source: u64,
        left: Option<u64>,
    },
    Done,
}

/// What we still receive on a stream.
#[derive(Debug)]
enum Recv {
    Open {
        content_length: Option<u64>,
        received: u64,
        window: i64,
        unacked: u32,
    },
    /// The client sent END_STREAM (half-closed remote).
    Closed,
}

#[derive(Debug)]
struct Stream {
    id: u32,
    recv: Recv,
    send: Send,
    send_window: i64,
    priority: Priority,
    /// The response is sent but the request is not: until this deadline the client
    /// may finish it, then RST_STREAM NO_ERROR ends it (see `HOLD`).
    held_until: Option<Instant>,
    /// Since when the stream has bytes to send and its own window is shut (see
    /// `reset_stalled`).
    blocked_since: Option<Instant>,
}

impl Stream {
    fn remaining(&self) -> u64 {
        match &self.send {
            Send::Bytes { data, pos } => (data.len() - pos) as u64,
            Send::File { len, offset } => len - offset,
            // What the next DATA frame may carry: the bytes given in memory go first.
            Send::Stream { buf, pos, at_source, .. } if *pos == buf.len() => *at_source,
            Send::Stream { buf, pos, .. } => (buf.len() - pos) as u64,
            Send::Waiting | Send::Done => 0,
        }
    }

    /// An open-ended body ended with every byte sent: only its END_STREAM is due,
    /// as an empty DATA frame, which flow control does not hold back.
    fn ends_empty(&self) -> bool {
        matches!(self.send, Send::Stream { left: Some(0), .. })
    }
}

/// How a stream that left the table ended, for the frames that may still arrive
/// on it (RFC 9113 section 5.1, "closed").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// Both sides ended the stream normally.
    Normally,
    /// We sent RST_STREAM: frames in flight are ignored.
    ResetByUs,
    /// The client sent RST_STREAM.
    ResetByPeer,
}

#[path = "conn_flow.rs"]
mod flow;

#[path = "conn_body.rs"]
mod body;

#[path = "conn_close.rs"]
mod close;
use close::Closing;

/// How long a stream whose response is sent waits for the rest of its request
/// before RST_STREAM NO_ERROR (RFC 9113 section 8.1 allows the reset at once). The
/// wait makes the answer to a request the client is still sending deterministic: a
/// broken frame later on the stream is a stream error whatever the timing, and a
/// client that finishes in time gets no reset at all.
pub const HOLD: Duration = Duration::from_secs(1);

/// Recently ended streams remembered for `Ended`.
const ENDED_MEMORY: usize = 32;

/// A field block being assembled from HEADERS and CONTINUATION frames.
#[derive(Debug)]
struct Assembly {
    stream: u32,
    end_stream: bool,
    self_dependent: bool,
    block: Vec<u8>,
    continuations: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the client preface; the count of bytes already matched.
    Preface,
    /// The preface came; its SETTINGS frame must be next.
    FirstSettings,
    Open,
    /// A connection error: input is ignored, GOAWAY is queued.
    Failed,
}

/// Counters of the rate limits, reset every `Limits::flood_window`.
#[derive(Debug)]
struct Flood {
    since: Option<Instant>,
    resets: u32,
    control: u32,
}

/// Our receive window, per stream and for the connection: the protocol default,
/// since request bodies are read only to be discarded.
const RECV_WINDOW: i64 = frame::DEFAULT_WINDOW as i64;
/// Credit is returned once half the window is used, not per frame.
const CREDIT_THRESHOLD: u32 = frame::DEFAULT_WINDOW / 2;
/// A WINDOW_UPDATE below this is counted as a control frame (flood limit).
const SMALL_WINDOW_UPDATE: u32 = 1024;

/// One HTTP/2 server connection, without I/O.
pub struct Connection {
    limits: Limits,
    phase: Phase,
    /// Where our side of a graceful close stands (`shutdown`).
    closing: Closing,
    peer_going_away: bool,
    decoder: hpack::Decoder,
    encoder: hpack::Encoder,
    /// The field block being encoded, kept so that each response reuses its room.
    block: Vec<u8>,
    streams: Vec<Stream>,
    ended: VecDeque<(u32, Ended)>,
    last_stream: u32,
    assembly: Option<Assembly>,
    peer_initial_window: u32,
    peer_max_frame: u32,
    send_window: i64,
    recv_window: i64,
    recv_unacked: u32,
    out: Vec<u8>,
    events: VecDeque<Event>,
    last_served: u32,
    flood: Flood,
    /// The `now` of the latest `recv` or `expire`, for the deadlines of held streams.
    now: Option<Instant>,
    /// Whether request bodies come out as [`Event::Data`].
    deliver: bool,
}

impl Connection {
    /// A connection whose server preface (our SETTINGS) is already queued.
    pub fn new(limits: Limits) -> Connection {
        let mut out = Vec::new();
        frame::put_settings(
            &mut out,
            &[
                (setting::MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams),
                (setting::HEADER_TABLE_SIZE, limits.header_table_size),
                (setting::MAX_HEADER_LIST_SIZE, limits.max_header_list_size),
                (setting::ENABLE_PUSH, 0),
                // WebSockets over HTTP/2 (RFC 8441), tunnelled by `[[proxy]]` rules.
                (setting::ENABLE_CONNECT_PROTOCOL, 1),
                // Priorities come from the `priority` field (RFC 9218 section 2.1).
                (setting::NO_RFC7540_PRIORITIES, 1),
            ],
        );
        Connection {
            decoder: hpack::Decoder::new(limits.header_table_size, limits.max_header_list_size),
            encoder: hpack::Encoder::new(),
            block: Vec::new(),
            limits,
            phase: Phase::Preface,
            closing: Closing::Open,
            peer_going_away: false,
            streams: Vec::new(),
            ended: VecDeque::new(),
            last_stream: 0,
            assembly: None,
            peer_initial_window: frame::DEFAULT_WINDOW,
            peer_max_frame: frame::DEFAULT_MAX_FRAME_SIZE,
            send_window: i64::from(frame::DEFAULT_WINDOW),
            recv_window: RECV_WINDOW,
            recv_unacked: 0,
            out,
            events: VecDeque::new(),
            last_served: 0,
            flood: Flood { since: None, resets: 0, control: 0 },
            now: None,
            deliver: false,
        }
    }

    /// Reads whole frames from the front of `input`; returns how many bytes it used.
    /// The caller keeps the rest and passes it again with more bytes behind it.
    /// `now` drives the flood limits' windows.
    pub fn recv(&mut self, input: &[u8], now: Instant) -> usize {
        self.tick(now);
        self.expire(now);
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match self.phase {
                Phase::Failed => return input.len(),
                Phase::Preface => {
                    let n = rest.len().min(PREFACE.len());
                    if rest[..n] != PREFACE[..n] {
                        self.fail(ErrorCode::ProtocolError);
                        return input.len();
                    }
                    if n < PREFACE.len() {
                        return used;
                    }
                    used += n;
                    self.phase = Phase::FirstSettings;
                }
                Phase::FirstSettings | Phase::Open => {
                    let Some(head_bytes) = rest.first_chunk::<{ frame::HEADER_LEN }>() else {
                        return used;
                    };
                    let head = Head::parse(head_bytes);
                    if head.len > frame::DEFAULT_MAX_FRAME_SIZE {
                        // We never raise SETTINGS_MAX_FRAME_SIZE.
                        self.fail(ErrorCode::FrameSizeError);
                        return input.len();
                    }
                    let total = frame::HEADER_LEN + head.len as usize;
                    if rest.len() < total {
                        return used;
                    }
                    used += total;
                    let payload = &rest[frame::HEADER_LEN..total];
                    match self.on_frame(head, payload) {
                        Ok(()) => {}
                        Err(FrameError::Connection(code)) => self.fail(code),
                        Err(FrameError::Stream(id, code)) => self.reset(id, code),
                    }
                }
            }
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        let event = self.events.pop_front();
        if self.events.is_empty() && self.events.capacity() > 16 {
            self.events = VecDeque::new();
        }
        event
    }

    /// Sends an interim (1xx) response on `stream` before its response: a HEADERS
    /// frame without END_STREAM (RFC 9113 section 8.1). Header names are lowercased
    /// and connection-specific fields dropped.
    pub fn interim<N, V>(
        &mut self,
        stream: StreamId,
        status: u16,
        headers: impl IntoIterator<Item = (N, V)>,
    ) -> Result<(), RespondError>
    where
        N: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        self.waiting(stream)?;
        let block = self.head_block(status.clamp(100, 199), headers);
        frame::put_headers(&mut self.out, stream.0, &block, false, frame::DEFAULT_MAX_FRAME_SIZE as usize);
        self.block = block;
        Ok(())
    }

    /// The index of `stream`, which has not been answered yet.
    fn waiting(&self, stream: StreamId) -> Result<usize, RespondError> {
        if self.phase == Phase::Failed {
            return Err(RespondError::StreamGone);
        }
        let index = self.index(stream.0).ok_or(RespondError::StreamGone)?;
        if !matches!(self.streams[index].send, Send::Waiting) {
            return Err(RespondError::AlreadyResponded);
        }
        Ok(index)
    }

    /// The HPACK block of a response head (in the connection's reused buffer, to be
    /// given back to `self.block`): `:status`, then `headers` lowercased, without
    /// the connection-specific ones.
    fn head_block<N, V>(&mut self, status: u16, headers: impl IntoIterator<Item = (N, V)>) -> Vec<u8>
    where
        N: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let status = status.min(999);
        let digits = [b'0' + (status / 100) as u8, b'0' + (status / 10 % 10) as u8, b'0' + (status % 10) as u8];
        let mut block = std::mem::take(&mut self.block);
        self.encoder.start(&mut block);
        self.encoder.field(b":status", &digits, &mut block);
        self.encode_fields(headers, &mut block);
        block
    }

    /// Starts the response on `stream`. Header names are lowercased and
    /// connection-specific fields dropped, as HTTP/2 requires.
    pub fn respond<N, V>(
        &mut self,
        stream: StreamId,
        status: u16,
        headers: impl IntoIterator<Item = (N, V)>,
        body: BodySize,
    ) -> Result<(), RespondError>
    where
        N: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let index = self.waiting(stream)?;
        let block = self.head_block(status, headers);
        let send = match body {
            BodySize::Bytes(data) if !data.is_empty() => Send::Bytes { data, pos: 0 },
            BodySize::File { len } if len > 0 => Send::File { len, offset: 0 },
            BodySize::Stream { len } if len != Some(0) => {
                Send::Stream { buf: Vec::new(), pos: 0, at_source: 0, left: len }
            }
            _ => Send::Done,
        };
        let end_stream = matches!(send, Send::Done);
        // Any frame size up to the default is valid whatever the peer allows.
        frame::put_headers(&mut self.out, stream.0, &block, end_stream, frame::DEFAULT_MAX_FRAME_SIZE as usize);
        self.block = block;
        self.streams[index].send = send;
        if end_stream {
            self.finish_send(index);
        }
        Ok(())
    }

    /// The next bytes to send, or `None` when nothing can be sent now (all sent,
    /// or the peer's flow-control windows are closed). A write carrying DATA is at
    /// most `max_payload` + 9 bytes long: one TLS record when `max_payload` is the
    /// record's plaintext size less 9.
    pub fn poll_write(&mut self, max_payload: usize) -> Option<Write> {
        let max_payload = max_payload.max(1);
        let next = if self.phase == Phase::Failed { None } else { self.next_stream() };
        // Pending frames (a response's HEADERS, say) share a record with DATA only
        // when that DATA ends the stream. Ahead of a longer body they would go out in
        // a full-sized record, which on a cold connection can be more than the first
        // flight carries: the client could not read the status line until a round
        // trip later.
        let shares = |i: usize| {
            self.out.is_empty()
                || (self.out.len() <= max_payload / 2
                    && self.streams[i].remaining() <= (max_payload - self.out.len()) as u64)
        };
        let Some(index) = next.filter(|&i| shares(i)) else {
            return (!self.out.is_empty()).then(|| Write::Bytes(std::mem::take(&mut self.out)));
        };
        let mut head = std::mem::take(&mut self.out);
        let stream = &mut self.streams[index];
        let remaining = stream.remaining();
        let budget = (max_payload - head.len()) as u64;
        let len = budget
            .min(u64::from(self.peer_max_frame))
            .min(self.send_window as u64)
            .min(stream.send_window as u64)
            .min(remaining);
        // At most the peer's frame size, so it fits the 24-bit length.
        let len32 = len as u32;
        let end = match &stream.send {
            Send::Stream { left, .. } => *left == Some(len),
            _ => len == remaining,
        };
        self.send_window -= len as i64;
        stream.send_window -= len as i64;
        self.last_served = stream.id;
        stream.blocked_since = None;
        head.extend_from_slice(&frame::data_head(stream.id, len32, end));
        let mut write = Write::Bytes(Vec::new());
        match &mut stream.send {
            Send::Bytes { data, pos } => {
                head.extend_from_slice(&data[*pos..*pos + len as usize]);
                *pos += len as usize;
                write = Write::Bytes(head);
            }
            Send::File { offset, .. } => {
                write =
                    Write::FileData { stream: StreamId(stream.id), head, offset: *offset, len: len32, end_stream: end };
                *offset += len;
            }
            Send::Stream { buf, pos, left, at_source } if *pos == buf.len() && *at_source > 0 => {
                *at_source -= len;
                *left = left.map(|l| l - len);
                write = Write::SourceData { stream: StreamId(stream.id), head, len: len32, end_stream: end };
            }
            Send::Stream { buf, pos, left, .. } => {
                head.extend_from_slice(&buf[*pos..*pos + len as usize]);
                *pos += len as usize;
                *left = left.map(|l| l - len);
                if *pos == buf.len() {
                    buf.clear();
                    *pos = 0;
                }
                write = Write::Data { stream: StreamId(stream.id), bytes: head, len: len32, end_stream: end };
            }
            // `next_stream` offers only streams with bytes left to send.
            Send::Waiting | Send::Done => {}
        }
        if end {
            self.streams[index].send = Send::Done;
            self.finish_send(index);
        }
        Some(write)
    }

    /// Hands request bodies to the caller as [`Event::Data`] from now on. The
    /// connection's credit is returned as they arrive, each stream's only as the
    /// caller says it took the bytes ([`Connection::consumed`]): a stream whose reader
    /// is slow has its client wait on its own window, and holds at most that window
    /// (64 KiB) in the caller's hands, while the connection's other streams go on.
    pub fn deliver_bodies(&mut self) {
        self.deliver = true;
    }

    /// `n` bytes of `stream`'s delivered body were taken by its reader (or dropped):
    /// their credit goes back to the client, in WINDOW_UPDATEs of at least half the
    /// window. Nothing for a stream the client has finished sending or that is gone.
    pub fn consumed(&mut self, stream: StreamId, n: usize) {
        let Some(index) = self.index(stream.0) else { return };
        let Recv::Open { window, unacked, .. } = &mut self.streams[index].recv else { return };
        *unacked = unacked.saturating_add(u32::try_from(n).unwrap_or(u32::MAX));
        if *unacked >= CREDIT_THRESHOLD {
            frame::put_window_update(&mut self.out, stream.0, *unacked);
            *window += i64::from(*unacked);
            *unacked = 0;
        }
    }

    /// Streams that are open or still sending (for idle timeouts: none means idle).
    pub fn active_streams(&self) -> usize {
        self.streams.len()
    }

    /// When the next held stream is due for its NO_ERROR reset: call `expire` then.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.streams.iter().filter_map(|s| s.held_until).min()
    }

    /// Resets the held streams whose deadline has passed (RST_STREAM NO_ERROR).
    pub fn expire(&mut self, now: Instant) {
        self.now = Some(now);
        while let Some(index) = self.streams.iter().position(|s| s.held_until.is_some_and(|d| d <= now)) {
            let stream = self.streams.swap_remove(index);
            frame::put_rst_stream(&mut self.out, stream.id, ErrorCode::NoError);
            self.remember(stream.id, Ended::ResetByUs);
        }
        if self.streams.is_empty() {
            self.streams = Vec::new();
        }
    }

    fn index(&self, id: u32) -> Option<usize> {
        self.streams.iter().position(|s| s.id == id)
    }

    /// The stream whose DATA goes next, by priority, among those with bytes left
    /// and window open.
    fn next_stream(&self) -> Option<usize> {
        let open = self.send_window > 0;
        let ready = self
            .streams
            .iter()
            .filter(|s| (open && s.send_window > 0 && s.remaining() > 0) || s.ends_empty())
            .map(|s| (s.id, s.priority));
        let id = priority::pick(ready, self.last_served)?;
        self.index(id)
    }

    /// Appends `fields` to a started header block, names lowercased and
    /// connection-specific fields dropped, as HTTP/2 requires.
    pub(super) fn encode_fields<N, V>(&mut self, fields: impl IntoIterator<Item = (N, V)>, block: &mut Vec<u8>)
    where
        N: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        for (name, value) in fields {
            request::with_lowercase(name.as_ref(), |name| {
                if !request::CONNECTION_SPECIFIC.contains(&name) {
                    self.encoder.field(name, value.as_ref(), block);
                }
            });
        }
    }

    /// Our side of the stream is done: forget the stream, or hold it for the rest of
    /// its request for `HOLD`, then reset it (RFC 9113 section 8.1 allows
    /// RST_STREAM NO_ERROR then).
    fn finish_send(&mut self, index: usize) {
        if let (Recv::Open { .. }, Some(now)) = (&self.streams[index].recv, self.now) {
            let held = &mut self.streams[index].held_until;
            held.get_or_insert(now + HOLD);
            return;
        }
        let stream = self.streams.swap_remove(index);
        let ended = match stream.recv {
            Recv::Closed => Ended::Normally,
            Recv::Open { .. } => {
                frame::put_rst_stream(&mut self.out, stream.id, ErrorCode::NoError);
                Ended::ResetByUs
            }
        };
        self.remember(stream.id, ended);
        if self.streams.is_empty() {
            self.streams = Vec::new();
        }
    }

    fn remember(&mut self, id: u32, ended: Ended) {
        if self.ended.len() == ENDED_MEMORY {
            self.ended.pop_front();
        }
        self.ended.push_back((id, ended));
    }

    fn ended(&self, id: u32) -> Option<Ended> {
        self.ended.iter().rev().find(|(i, _)| *i == id).map(|&(_, e)| e)
    }

    fn fail(&mut self, code: ErrorCode) {
        if self.phase == Phase::Failed {
            return;
        }
        self.phase = Phase::Failed;
        frame::put_goaway(&mut self.out, self.last_stream, code);
        self.streams = Vec::new();
        self.assembly = None;
        self.events.push_back(Event::ConnectionError { code });
    }

    /// A stream error: RST_STREAM, and the caller drops the stream if it knew it.
    /// Counts toward the reset limit, since the client provoked it.
    fn reset(&mut self, id: u32, code: ErrorCode) {
        frame::put_rst_stream(&mut self.out, id, code);
        if let Some(index) = self.index(id) {
            self.streams.swap_remove(index);
            self.events.push_back(Event::Reset { stream: StreamId(id), code });
        }
        self.remember(id, Ended::ResetByUs);
        if let Err(FrameError::Connection(code)) = self.count_reset() {
            self.fail(code);
        }
    }

    fn tick(&mut self, now: Instant) {
        match self.flood.since {
            Some(since) if now.saturating_duration_since(since) < self.limits.flood_window => {}
            _ => self.flood = Flood { since: Some(now), resets: 0, control: 0 },
        }
    }

    fn count_reset(&mut self) -> Result<(), FrameError> {
        self.flood.resets += 1;
        if self.flood.resets > self.limits.max_resets {
            return Err(FrameError::Connection(ErrorCode::EnhanceYourCalm));
        }
        Ok(())
    }

    fn count_control(&mut self) -> Result<(), FrameError> {
        self.flood.control += 1;
        if self.flood.control > self.limits.max_control {
            return Err(FrameError::Connection(ErrorCode::EnhanceYourCalm));
        }
        Ok(())
    }

    fn on_frame(&mut self, head: Head, payload: &[u8]) -> Result<(), FrameError> {
        use ErrorCode::*;
        use FrameError::{Connection as Conn, Stream as Strm};
        // Between HEADERS and END_HEADERS only CONTINUATION of that stream may come
        // (RFC 9113 section 6.10).
        let continuing = self.assembly.as_ref().map(|a| a.stream);
        match continuing {
            Some(id) if head.kind != frame::CONTINUATION || head.stream != id => return Err(Conn(ProtocolError)),
            None if head.kind == frame::CONTINUATION => return Err(Conn(ProtocolError)),
            _ => {}
        }
        let parsed = frame::decode(head, payload)?;
        if self.phase == Phase::FirstSettings {
            if !matches!(parsed, Frame::Settings { ack: false, .. }) {
                return Err(Conn(ProtocolError));
            }
            self.phase = Phase::Open;
        }
        match parsed {
            Frame::Data { stream, end_stream, data, flow_len } => {
                self.on_data(stream, end_stream, data.len(), flow_len)?;
                if self.deliver && (!data.is_empty() || end_stream) && self.ended(stream) != Some(Ended::ResetByUs) {
                    self.events.push_back(Event::Data { stream: StreamId(stream), data: data.to_vec(), end_stream });
                }
                Ok(())
            }
            Frame::Headers { stream, end_stream, end_headers, dependency, block } => {
                if stream % 2 == 0 {
                    return Err(Conn(ProtocolError));
                }
                if block.len() > self.limits.max_header_block {
                    return Err(Conn(EnhanceYourCalm));
                }
                self.assembly = Some(Assembly {
                    stream,
                    end_stream,
                    self_dependent: dependency.is_some_and(|d| d.on == stream),
                    block: block.to_vec(),
                    continuations: 0,
                });
                if end_headers {
                    self.on_field_block()?;
                }
                Ok(())
            }
            Frame::Continuation { end_headers, block, .. } => {
                let limits = (self.limits.max_continuations, self.limits.max_header_block);
                let assembly = self.assembly.as_mut().ok_or(Conn(ProtocolError))?;
                assembly.continuations += 1;
                assembly.block.extend_from_slice(block);
                if assembly.continuations > limits.0 || assembly.block.len() > limits.1 {
                    return Err(Conn(EnhanceYourCalm));
                }
                if end_headers {
                    self.on_field_block()?;
                }
                Ok(())
            }
            Frame::Priority { stream, dependency } => {
                self.count_control()?;
                if dependency.on == stream {
                    return Err(Strm(stream, ProtocolError));
                }
                Ok(())
            }
            Frame::RstStream { stream, code } => {
                if stream > self.last_stream {
                    return Err(Conn(ProtocolError));
                }
                if let Some(index) = self.index(stream) {
                    let held = self.streams.swap_remove(index).held_until.is_some();
                    self.remember(stream, Ended::ResetByPeer);
                    if held {
                        // Its response is complete: nothing was cancelled.
                        return Ok(());
                    }
                    self.events.push_back(Event::Reset { stream: StreamId(stream), code });
                    self.count_reset()?;
                }
                Ok(())
            }
            Frame::Settings { ack: true, .. } => Ok(()),
            Frame::Settings { ack: false, params } => {
                self.count_control()?;
                self.on_settings(params)?;
                frame::put_settings_ack(&mut self.out);
                Ok(())
            }
            Frame::Ping { ack: true, data } => {
                self.on_ping_ack(data);
                Ok(())
            }
            Frame::Ping { ack: false, data } => {
                self.count_control()?;
                frame::put_ping_ack(&mut self.out, data);
                Ok(())
            }
            Frame::GoAway { code, .. } => {
                if !self.peer_going_away {
                    self.peer_going_away = true;
                    self.events.push_back(Event::PeerGoAway { code });
                }
                Ok(())
            }
            Frame::WindowUpdate { stream, increment } => self.on_window_update(stream, increment),
            Frame::PriorityUpdate { prioritized, value } => {
                self.count_control()?;
                if let Some(index) = self.index(prioritized) {
                    self.streams[index].priority = Priority::parse(value);
                }
                Ok(())
            }
            Frame::Unknown => self.count_control(),
        }
    }

    fn on_data(&mut self, id: u32, end_stream: bool, data_len: usize, flow_len: u32) -> Result<(), FrameError> {
        use ErrorCode::*;
        use FrameError::{Connection as Conn, Stream as Strm};
        if id > self.last_stream {
            return Err(Conn(ProtocolError));
        }
        let flow = i64::from(flow_len);
        if flow > self.recv_window {
            return Err(Conn(FlowControlError));
        }
        // The connection window is spent whatever happens to the stream; the body is
        // discarded, so the credit comes back at once.
        self.recv_window -= flow;
        self.recv_unacked += flow_len;
        if self.recv_unacked >= CREDIT_THRESHOLD {
            frame::put_window_update(&mut self.out, 0, self.recv_unacked);
            self.recv_window += i64::from(self.recv_unacked);
            self.recv_unacked = 0;
        }
        if data_len == 0 && !end_stream {
            self.count_control()?;
        }
        let Some(index) = self.index(id) else {
            return match self.ended(id) {
                Some(Ended::ResetByUs) => Ok(()),
                Some(Ended::ResetByPeer) => Err(Strm(id, StreamClosed)),
                Some(Ended::Normally) | None => Err(Conn(StreamClosed)),
            };
        };
        let stream = &mut self.streams[index];
        let Recv::Open { content_length, received, window, unacked } = &mut stream.recv else {
            return Err(Strm(id, StreamClosed));
        };
        if flow > *window {
            return Err(Strm(id, FlowControlError));
        }
        *window -= flow;
        *received += data_len as u64;
        let too_long = content_length.is_some_and(|n| *received > n);
        let short = end_stream && content_length.is_some_and(|n| *received != n);
        if too_long || short {
            return Err(Strm(id, ProtocolError));
        }
        if end_stream {
            stream.recv = Recv::Closed;
            if matches!(stream.send, Send::Done) {
                self.finish_send(index);
            }
            return Ok(());
        }
        // A delivered body's credit comes back as its reader takes it (`consumed`);
        // padding's at once.
        *unacked += match self.deliver {
            true => flow_len - data_len as u32,
            false => flow_len,
        };
        if *unacked >= CREDIT_THRESHOLD {
            frame::put_window_update(&mut self.out, id, *unacked);
            *window += i64::from(*unacked);
            *unacked = 0;
        }
        Ok(())
    }

    /// A complete field block: a new request, trailers, or something to refuse.
    /// The block is always decoded, to keep the HPACK table in step.
    fn on_field_block(&mut self) -> Result<(), FrameError> {
        use ErrorCode::*;
        use FrameError::{Connection as Conn, Stream as Strm};
        let Some(assembly) = self.assembly.take() else { return Ok(()) };
        let id = assembly.stream;
        let decoded = self.decoder.decode(&assembly.block).map_err(|_| Conn(CompressionError))?;
        drop(assembly.block);

        if let Some(index) = self.index(id) {
            // A second field block: trailers, which must end the stream.
            let stream = &mut self.streams[index];
            let Recv::Open { content_length, received, .. } = &stream.recv else {
                return Err(Strm(id, StreamClosed));
            };
            let length_ok = content_length.is_none_or(|n| n == *received);
            let fields_ok = match &decoded {
                Decoded::Fields(fields) => request::check_trailers(fields).is_ok(),
                Decoded::TooLarge => true,
            };
            if !assembly.end_stream || !length_ok || !fields_ok {
                return Err(Strm(id, ProtocolError));
            }
            stream.recv = Recv::Closed;
            if matches!(stream.send, Send::Done) {
                self.finish_send(index);
            }
            return Ok(());
        }
        if id <= self.last_stream {
            return match self.ended(id) {
                Some(Ended::ResetByUs) => Ok(()),
                Some(Ended::ResetByPeer) => Err(Strm(id, StreamClosed)),
                Some(Ended::Normally) => Err(Conn(StreamClosed)),
                // Stream ids must increase (RFC 9113 section 5.1.1).
                None => Err(Conn(ProtocolError)),
            };
        }
        self.last_stream = id;
        if self.closing == Closing::Final || self.peer_going_away {
            // After the final GOAWAY new streams are ignored; the client retries elsewhere.
            self.remember(id, Ended::ResetByUs);
            return Ok(());
        }
        if assembly.self_dependent {
            return Err(Strm(id, ProtocolError));
        }
        if self.streams.len() >= self.limits.max_concurrent_streams as usize {
            return Err(Strm(id, RefusedStream));
        }
        let fields = match decoded {
            Decoded::Fields(fields) => fields,
            Decoded::TooLarge => {
                self.open(id, None, assembly.end_stream, Priority::default());
                // RFC 9113 section 10.5.1: answer 431 rather than fail the stream.
                self.events.push_back(Event::HeaderListTooLarge { stream: StreamId(id) });
                return Ok(());
            }
        };
        let head = request::parse(fields).map_err(|_| Strm(id, ProtocolError))?;
        if assembly.end_stream && head.content_length.is_some_and(|n| n != 0) {
            return Err(Strm(id, ProtocolError));
        }
        self.open(id, head.content_length, assembly.end_stream, head.priority);
        self.events.push_back(Event::Request { stream: StreamId(id), head, end_stream: assembly.end_stream });
        Ok(())
    }

    fn open(&mut self, id: u32, content_length: Option<u64>, end_stream: bool, priority: Priority) {
        let recv = if end_stream {
            Recv::Closed
        } else {
            Recv::Open { content_length, received: 0, window: RECV_WINDOW, unacked: 0 }
        };
        self.streams.push(Stream {
            id,
            recv,
            send: Send::Waiting,
            send_window: i64::from(self.peer_initial_window),
            priority,
            held_until: None,
            blocked_since: None,
        });
    }
}
