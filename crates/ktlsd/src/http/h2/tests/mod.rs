//! In-process tests of the codec, built from hand-made frames, following RFC 9113
//! section by section (the h2spec cases), RFC 9218 and the flood limits. This
//! module holds the small client they share; each file below tests one subject.

mod frames;
mod messages;
mod responses;
mod scheduling;

use std::time::Instant;

use super::frame::{self, setting, ErrorCode, Head};
use super::*;

use ErrorCode::*;

// ---- a small client: frame builder, HPACK encoder, output parser ----

fn raw(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    frame::put(&mut out, kind, flags, stream, payload);
    out
}

fn settings(params: &[(u16, u32)]) -> Vec<u8> {
    let mut out = Vec::new();
    frame::put_settings(&mut out, params);
    out
}

fn window_update(stream: u32, increment: u32) -> Vec<u8> {
    raw(frame::WINDOW_UPDATE, 0, stream, &increment.to_be_bytes())
}

fn rst(stream: u32, code: u32) -> Vec<u8> {
    raw(frame::RST_STREAM, 0, stream, &code.to_be_bytes())
}

fn data(stream: u32, payload: &[u8], end_stream: bool) -> Vec<u8> {
    raw(frame::DATA, if end_stream { frame::FLAG_END_STREAM } else { 0 }, stream, payload)
}

/// A received frame.
#[derive(Debug, Clone)]
struct Got {
    head: Head,
    payload: Vec<u8>,
}

impl Got {
    fn code(&self) -> ErrorCode {
        let at = if self.head.kind == frame::GOAWAY { 4 } else { 0 };
        ErrorCode::from_u32(u32::from_be_bytes(self.payload[at..at + 4].try_into().unwrap()))
    }
}

const GET: &[(&str, &str)] =
    &[(":method", "GET"), (":scheme", "https"), (":authority", "example.test"), (":path", "/")];

struct Client {
    conn: Connection,
    enc: loona_hpack::Encoder<'static>,
    dec: loona_hpack::Decoder<'static>,
    now: Instant,
    /// The record payload size passed to `poll_write`.
    max_payload: usize,
}

impl Client {
    /// A connection past the preface and SETTINGS exchange, its output drained.
    fn new() -> Client {
        Client::with(Limits::default())
    }

    fn with(limits: Limits) -> Client {
        let mut c = Client::raw(limits);
        let mut hello = PREFACE.to_vec();
        hello.extend(settings(&[]));
        c.send(&hello);
        let got = c.frames();
        assert_eq!(got[0].head.kind, frame::SETTINGS, "server preface comes first");
        assert!(got.iter().any(|f| f.head.kind == frame::SETTINGS && f.head.flags == frame::FLAG_ACK));
        c
    }

    fn raw(limits: Limits) -> Client {
        Client {
            conn: Connection::new(limits),
            enc: loona_hpack::Encoder::new(),
            dec: loona_hpack::Decoder::new(),
            now: Instant::now(),
            max_payload: 16_384 - 9,
        }
    }

    /// Feeds bytes; all must be used.
    fn send(&mut self, bytes: &[u8]) {
        let used = self.conn.recv(bytes, self.now);
        assert_eq!(used, bytes.len(), "whole frames are consumed");
    }

    fn block(&mut self, fields: &[(&str, &str)]) -> Vec<u8> {
        self.enc.encode(fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())))
    }

    fn headers(&mut self, stream: u32, fields: &[(&str, &str)], end_stream: bool) -> Vec<u8> {
        let block = self.block(fields);
        let flags = frame::FLAG_END_HEADERS | if end_stream { frame::FLAG_END_STREAM } else { 0 };
        raw(frame::HEADERS, flags, stream, &block)
    }

    fn get(&mut self, stream: u32) {
        let bytes = self.headers(stream, GET, true);
        self.send(&bytes);
    }

    /// All writes, with file payloads filled in as `f` bytes, split into frames.
    fn frames(&mut self) -> Vec<Got> {
        let mut bytes = Vec::new();
        while let Some(write) = self.conn.poll_write(self.max_payload) {
            match write {
                Write::Bytes(b) => {
                    assert!(!b.is_empty());
                    bytes.extend(b);
                }
                Write::FileData { head, len, .. } => {
                    assert!(head.len() + len as usize <= self.max_payload + 9, "one write, one record");
                    bytes.extend(head);
                    bytes.extend(std::iter::repeat_n(b'f', len as usize));
                }
                Write::Data { bytes: b, .. } => bytes.extend(b),
                Write::SourceData { head, len, .. } => {
                    assert!(head.len() + len as usize <= self.max_payload + 9, "one write, one record");
                    bytes.extend(head);
                    bytes.extend(std::iter::repeat_n(b's', len as usize));
                }
            }
        }
        split(&bytes)
    }

    fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.conn.poll_event()).collect()
    }

    fn decode(&mut self, block: &[u8]) -> Vec<(String, String)> {
        let fields = self.dec.decode(block).expect("our HPACK decodes");
        fields.into_iter().map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap())).collect()
    }
}

fn split(mut bytes: &[u8]) -> Vec<Got> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let head = Head::parse(bytes[..9].try_into().unwrap());
        let end = 9 + head.len as usize;
        frames.push(Got { head, payload: bytes[9..end].to_vec() });
        bytes = &bytes[end..];
    }
    frames
}

fn goaway(frames: &[Got]) -> Option<ErrorCode> {
    frames.iter().find(|f| f.head.kind == frame::GOAWAY).map(Got::code)
}

fn resets(frames: &[Got]) -> Vec<(u32, ErrorCode)> {
    frames.iter().filter(|f| f.head.kind == frame::RST_STREAM).map(|f| (f.head.stream, f.code())).collect()
}

/// Sends `bytes` on a fresh connection (with stream 1 open, its request still
/// sending a body, and stream 3 done: response sent, both ends closed) and returns
/// what came back.
fn after_setup(bytes: impl FnOnce(&mut Client) -> Vec<u8>) -> (Client, Vec<Got>) {
    let mut c = Client::new();
    let open = c.headers(1, GET, false);
    c.send(&open);
    c.get(3);
    c.conn.respond(StreamId(3), 204, [("server", "ktlsd")], BodySize::None).unwrap();
    c.frames();
    c.events();
    let bytes = bytes(&mut c);
    c.send(&bytes);
    let got = c.frames();
    (c, got)
}

fn connection_error(bytes: impl FnOnce(&mut Client) -> Vec<u8>) -> Option<ErrorCode> {
    let (mut c, got) = after_setup(bytes);
    let code = goaway(&got);
    if let Some(code) = code {
        assert!(c.events().contains(&Event::ConnectionError { code }));
        assert!(c.conn.is_finished(), "a failed connection closes once GOAWAY is out");
    }
    code
}

fn stream_error(bytes: impl FnOnce(&mut Client) -> Vec<u8>) -> Vec<(u32, ErrorCode)> {
    let (_, got) = after_setup(bytes);
    assert_eq!(goaway(&got), None, "a stream error keeps the connection");
    resets(&got)
}

fn data_frames(got: &[Got]) -> Vec<(u32, usize, bool)> {
    got.iter()
        .filter(|f| f.head.kind == frame::DATA)
        .map(|f| (f.head.stream, f.payload.len(), f.head.has(frame::FLAG_END_STREAM)))
        .collect()
}
