//! The sans-I/O HTTP/2 connection (`http/h2`) driven by arbitrary sequences of client
//! frames (well-formed ones with HPACK field blocks from an independent encoder, and
//! raw ones) interleaved with what the server loop does: responding with each kind of
//! body, pushing, finishing and aborting stream bodies, writing with varying record
//! sizes, time passing, graceful shutdown. Besides never panicking:
//! - everything the connection writes parses as HTTP/2 frames no larger than the client allowed (16 KiB unless its SETTINGS said more), the
//!   first of them SETTINGS;
//! - a write carrying DATA is at most `max_payload` + 9 bytes (one TLS record);
//! - the DATA it sends never exceeds the connection window the client opened;
//! - once it reports a connection error, it sends GOAWAY and is finished when drained.
#![no_main]

use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use ktlsd::fuzzing::{BodySize, Connection, Event, Limits, StreamId, Write};
use libfuzzer_sys::fuzz_target;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[derive(Arbitrary, Debug)]
enum Name {
    Method,
    Scheme,
    Authority,
    Path,
    Protocol,
    Status,
    Host,
    Te,
    Connection,
    ContentLength,
    Priority,
    Cookie,
    Range,
    Other(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Value {
    Get,
    Head,
    Post,
    Connect,
    Https,
    Root,
    Path(u8),
    Host,
    Trailers,
    Number(u32),
    Urgency(u8),
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum FrameSpec {
    Headers {
        stream: u8,
        end_stream: bool,
        split: Option<u8>,
        padding: Option<u8>,
        priority: bool,
        fields: Vec<(Name, Value)>,
    },
    Data {
        stream: u8,
        end_stream: bool,
        padding: Option<u8>,
        len: u16,
    },
    Settings {
        ack: bool,
        params: Vec<(u8, u32)>,
    },
    Ping {
        ack: bool,
        data: u64,
    },
    WindowUpdate {
        stream: u8,
        increment: u32,
    },
    RstStream {
        stream: u8,
        code: u8,
    },
    Priority {
        stream: u8,
        depends_on: u8,
        weight: u8,
    },
    PriorityUpdate {
        stream: u8,
        urgency: u8,
        incremental: bool,
    },
    GoAway {
        last: u8,
        code: u8,
    },
    Raw {
        kind: u8,
        flags: u8,
        stream: u8,
        payload: Vec<u8>,
    },
}

#[derive(Arbitrary, Debug)]
enum BodyKind {
    None,
    Bytes(Vec<u8>),
    File(u32),
    Stream(Option<u32>),
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// Frames from the client; `cut` delivers them in two reads.
    Send {
        frames: Vec<FrameSpec>,
        cut: u16,
    },
    Respond {
        which: u8,
        status: u16,
        body: BodyKind,
    },
    Push {
        which: u8,
        len: u16,
    },
    PushAtSource {
        which: u8,
        n: u32,
    },
    Finish {
        which: u8,
    },
    /// The body's source failed: the stream ends with RST_STREAM (every write so far was
    /// sent, as the server loop calls it).
    Abort {
        which: u8,
    },
    Write {
        max_payload: u16,
    },
    Elapse {
        millis: u16,
    },
    Shutdown,
    DeliverBodies,
    Expire,
}

#[derive(Arbitrary, Debug)]
struct Input {
    tight: bool,
    preface: bool,
    ops: Vec<Op>,
}

/// Stream `n` of the fuzz input: odd client streams mostly, even and zero too.
fn stream_id(n: u8) -> u32 {
    if n >= 0xf0 {
        u32::from(n & 0x0f) * 2
    } else {
        u32::from(n) * 2 + 1
    }
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len().min(0xff_ffff) as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(&payload[..len as usize]);
}

fn name(n: &Name) -> &[u8] {
    match n {
        Name::Method => b":method",
        Name::Scheme => b":scheme",
        Name::Authority => b":authority",
        Name::Path => b":path",
        Name::Protocol => b":protocol",
        Name::Status => b":status",
        Name::Host => b"host",
        Name::Te => b"te",
        Name::Connection => b"connection",
        Name::ContentLength => b"content-length",
        Name::Priority => b"priority",
        Name::Cookie => b"cookie",
        Name::Range => b"range",
        Name::Other(b) => b,
    }
}

fn value(v: &Value) -> Vec<u8> {
    match v {
        Value::Get => b"GET".to_vec(),
        Value::Head => b"HEAD".to_vec(),
        Value::Post => b"POST".to_vec(),
        Value::Connect => b"CONNECT".to_vec(),
        Value::Https => b"https".to_vec(),
        Value::Root => b"/".to_vec(),
        Value::Path(n) => format!("/f{n}?q").into_bytes(),
        Value::Host => b"example.test".to_vec(),
        Value::Trailers => b"trailers".to_vec(),
        Value::Number(n) => n.to_string().into_bytes(),
        Value::Urgency(u) => format!("u={}, i", u % 9).into_bytes(),
        Value::Bytes(b) => b.clone(),
    }
}

fn encode(spec: &FrameSpec, hpack: &mut loona_hpack::Encoder<'static>, out: &mut Vec<u8>) {
    match spec {
        FrameSpec::Headers { stream, end_stream, split, padding, priority, fields } => {
            let pairs: Vec<(&[u8], Vec<u8>)> = fields.iter().map(|(n, v)| (name(n), value(v))).collect();
            let block = hpack.encode(pairs.iter().map(|(n, v)| (*n, &v[..])));
            let at = split.map_or(block.len(), |s| usize::from(s).min(block.len()));
            let mut payload = Vec::new();
            let mut flags = if *end_stream { 0x1 } else { 0 };
            if at == block.len() {
                flags |= 0x4;
            }
            if let Some(p) = padding {
                flags |= 0x8;
                payload.push(*p);
            }
            if *priority {
                flags |= 0x20;
                payload.extend_from_slice(&[0, 0, 0, 0, 15]);
            }
            payload.extend_from_slice(&block[..at]);
            payload.extend(std::iter::repeat_n(0, usize::from(padding.unwrap_or(0))));
            frame(out, 0x1, flags, stream_id(*stream), &payload);
            if at < block.len() {
                frame(out, 0x9, 0x4, stream_id(*stream), &block[at..]);
            }
        }
        FrameSpec::Data { stream, end_stream, padding, len } => {
            let mut payload = Vec::new();
            let mut flags = if *end_stream { 0x1 } else { 0 };
            if let Some(p) = padding {
                flags |= 0x8;
                payload.push(*p);
            }
            payload.extend(std::iter::repeat_n(b'd', usize::from(*len)));
            payload.extend(std::iter::repeat_n(0, usize::from(padding.unwrap_or(0))));
            frame(out, 0x0, flags, stream_id(*stream), &payload);
        }
        FrameSpec::Settings { ack, params } => {
            let payload: Vec<u8> = params
                .iter()
                .flat_map(|(id, v)| [&u16::from(*id % 10).to_be_bytes()[..], &v.to_be_bytes()].concat())
                .collect();
            frame(out, 0x4, u8::from(*ack), 0, &payload);
        }
        FrameSpec::Ping { ack, data } => frame(out, 0x6, u8::from(*ack), 0, &data.to_be_bytes()),
        FrameSpec::WindowUpdate { stream, increment } => {
            frame(out, 0x8, 0, stream_id(*stream), &increment.to_be_bytes());
        }
        FrameSpec::RstStream { stream, code } => {
            frame(out, 0x3, 0, stream_id(*stream), &u32::from(*code).to_be_bytes())
        }
        FrameSpec::Priority { stream, depends_on, weight } => {
            let mut payload = stream_id(*depends_on).to_be_bytes().to_vec();
            payload.push(*weight);
            frame(out, 0x2, 0, stream_id(*stream), &payload);
        }
        FrameSpec::PriorityUpdate { stream, urgency, incremental } => {
            let mut payload = stream_id(*stream).to_be_bytes().to_vec();
            payload.extend_from_slice(format!("u={}{}", urgency % 9, if *incremental { ", i" } else { "" }).as_bytes());
            frame(out, 0x10, 0, 0, &payload);
        }
        FrameSpec::GoAway { last, code } => {
            let mut payload = stream_id(*last).to_be_bytes().to_vec();
            payload.extend_from_slice(&u32::from(*code).to_be_bytes());
            frame(out, 0x7, 0, 0, &payload);
        }
        FrameSpec::Raw { kind, flags, stream, payload } => frame(out, *kind, *flags, stream_id(*stream), payload),
    }
}

/// What the client grants among whole frames `bytes`: the sum of the connection's
/// WINDOW_UPDATE increments, and the largest SETTINGS_MAX_FRAME_SIZE it announces (the
/// server may send frames that large, RFC 9113 section 4.2).
fn grants(bytes: &[u8]) -> (u64, u32) {
    let (mut at, mut sum, mut max_frame) = (0, 0, 0);
    while let Some(head) = bytes.get(at..at + 9) {
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let payload = bytes.get(at + 9..at + 9 + len).unwrap_or_default();
        match (head[3], stream) {
            (0x8, 0) if payload.len() >= 4 => {
                sum += u64::from(u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff);
            }
            (0x4, 0) if head[4] & 0x1 == 0 => {
                for p in payload.chunks_exact(6) {
                    if p[..2] == [0, 5] {
                        max_frame = max_frame.max(u32::from_be_bytes([p[2], p[3], p[4], p[5]]));
                    }
                }
            }
            _ => {}
        }
        at += 9 + len;
    }
    (sum, max_frame)
}

/// The server's output, parsed frame by frame as a client would.
#[derive(Default)]
struct Output {
    bytes: Vec<u8>,
    /// The largest frame the client has allowed (16 KiB until it says more).
    max_frame: usize,
    frames: usize,
    data_sent: u64,
    goaway: bool,
}

impl Output {
    fn take(&mut self, bytes: &[u8], body_len: u32) {
        self.bytes.extend_from_slice(bytes);
        // A file or source body: the caller sends its bytes after the DATA frame header.
        self.bytes.extend(std::iter::repeat_n(0, body_len as usize));
        let mut at = 0;
        while let Some(head) = self.bytes.get(at..at + 9) {
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            assert!(len <= self.max_frame.max(16_384), "a frame of {len} bytes");
            if self.frames == 0 {
                assert_eq!(head[3], 0x4, "the first frame is not SETTINGS");
            }
            if self.bytes.len() < at + 9 + len {
                break;
            }
            match head[3] {
                0x0 => self.data_sent += len as u64,
                0x7 => self.goaway = true,
                _ => {}
            }
            self.frames += 1;
            at += 9 + len;
        }
        self.bytes.drain(..at);
    }
}

fuzz_target!(|input: Input| {
    let limits = if input.tight {
        Limits {
            max_concurrent_streams: 3,
            max_header_list_size: 512,
            header_table_size: 256,
            max_header_block: 1024,
            max_continuations: 2,
            flood_window: Duration::from_secs(1),
            max_resets: 4,
            max_control: 16,
        }
    } else {
        Limits::default()
    };
    let mut conn = Connection::new(limits);
    let mut hpack = loona_hpack::Encoder::new();
    let mut now = Instant::now();
    let (mut inbuf, mut out, mut window_given) = (Vec::new(), Output::default(), 65_535u64);
    let (mut open, mut failed): (Vec<StreamId>, bool) = (Vec::new(), false);
    if input.preface {
        inbuf.extend_from_slice(PREFACE);
        frame(&mut inbuf, 0x4, 0, 0, &[]);
    }
    for op in input.ops.iter().take(256) {
        match op {
            Op::Send { frames, cut } => {
                let mut sent = Vec::new();
                for spec in frames.iter().take(64) {
                    encode(spec, &mut hpack, &mut sent);
                }
                let (increments, max_frame) = grants(&sent);
                window_given += increments;
                out.max_frame = out.max_frame.max(max_frame.min(0xff_ffff) as usize);
                inbuf.extend_from_slice(&sent);
                let first = usize::from(*cut).min(inbuf.len());
                let used = conn.recv(&inbuf[..first], now);
                assert!(used <= first);
                inbuf.drain(..used);
                let used = conn.recv(&inbuf, now);
                assert!(used <= inbuf.len());
                inbuf.drain(..used);
            }
            Op::Respond { which, status, body } => {
                let Some(&stream) = open.get(usize::from(*which) % open.len().max(1)) else { continue };
                let body = match body {
                    BodyKind::None => BodySize::None,
                    BodyKind::Bytes(b) => BodySize::Bytes(b.clone()),
                    BodyKind::File(len) => BodySize::File { len: u64::from(*len) },
                    BodyKind::Stream(len) => BodySize::Stream { len: len.map(u64::from) },
                };
                let headers = [("content-type", "text/plain"), ("Connection", "close"), ("server", "ktlsd")];
                let _ = conn.respond(stream, *status, headers, body);
            }
            Op::Push { which, len } => {
                if let Some(&stream) = open.get(usize::from(*which) % open.len().max(1)) {
                    let _ = conn.push(stream, &vec![b'p'; usize::from(*len)]);
                    let _ = conn.buffered(stream);
                }
            }
            Op::PushAtSource { which, n } => {
                if let Some(&stream) = open.get(usize::from(*which) % open.len().max(1)) {
                    let _ = conn.push_at_source(stream, u64::from(*n));
                }
            }
            Op::Finish { which } => {
                if let Some(&stream) = open.get(usize::from(*which) % open.len().max(1)) {
                    let _ = conn.finish(stream);
                }
            }
            Op::Abort { which } => {
                if let Some(&stream) = open.get(usize::from(*which) % open.len().max(1)) {
                    conn.abort(stream, 0);
                    open.retain(|&s| s != stream);
                }
            }
            Op::Write { max_payload } => {
                for _ in 0..64 {
                    let Some(w) = conn.poll_write(usize::from(*max_payload)) else { break };
                    let cap = usize::from(*max_payload).max(1) + 9;
                    match w {
                        Write::Bytes(b) => out.take(&b, 0),
                        Write::FileData { head, len, .. } | Write::SourceData { head, len, .. } => {
                            assert!(head.len() + len as usize <= cap, "{} + {len} > {cap}", head.len());
                            out.take(&head, len);
                        }
                        Write::Data { bytes, len, .. } => {
                            assert!(bytes.len() <= cap, "{} > {cap}", bytes.len());
                            assert!(bytes.len() >= 9 + len as usize);
                            out.take(&bytes, 0);
                        }
                    }
                }
                assert!(out.data_sent <= window_given, "sent {} > window {window_given}", out.data_sent);
            }
            Op::Elapse { millis } => {
                now += Duration::from_millis(u64::from(*millis));
                conn.reset_stalled(now, Duration::from_secs(30));
            }
            Op::Shutdown => conn.shutdown(),
            Op::DeliverBodies => conn.deliver_bodies(),
            Op::Expire => {
                let _ = conn.next_deadline();
                conn.expire(now);
            }
        }
        while let Some(event) = conn.poll_event() {
            match event {
                Event::Request { stream, .. } | Event::HeaderListTooLarge { stream } => open.push(stream),
                Event::Reset { stream, .. } => open.retain(|&s| s != stream),
                Event::ConnectionError { .. } => failed = true,
                Event::Data { .. } | Event::PeerGoAway { .. } => {}
            }
        }
        let _ = conn.active_streams();
    }
    if failed {
        for _ in 0..1024 {
            match conn.poll_write(16_384) {
                Some(Write::Bytes(b)) => out.take(&b, 0),
                Some(Write::FileData { head, len, .. } | Write::SourceData { head, len, .. }) => out.take(&head, len),
                Some(Write::Data { bytes, .. }) => out.take(&bytes, 0),
                None => break,
            }
        }
        assert!(out.goaway, "a connection error without GOAWAY");
        assert!(conn.is_finished(), "failed and drained but not finished");
    }
});
