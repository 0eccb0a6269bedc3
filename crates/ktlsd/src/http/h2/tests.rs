//! In-process tests of the codec, built from hand-made frames, following RFC 9113
//! section by section (the h2spec cases), RFC 9218 and the flood limits.

use std::time::{Duration, Instant};

use super::frame::{self, setting, ErrorCode, Head};
use super::priority::{self, Priority};
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

// ---- 3.4 preface, 4.1-4.3 frames and HPACK ----

#[test]
fn preface_must_match() {
    let mut c = Client::raw(Limits::default());
    assert_eq!(c.conn.recv(&PREFACE[..10], c.now), 0, "a partial preface waits");
    let mut bad = PREFACE.to_vec();
    bad[3] = b'X';
    c.send(&bad);
    assert_eq!(goaway(&c.frames()), Some(ProtocolError));
}

#[test]
fn first_frame_must_be_settings() {
    let mut c = Client::raw(Limits::default());
    let mut hello = PREFACE.to_vec();
    hello.extend(raw(frame::PING, 0, 0, &[0; 8]));
    c.send(&hello);
    assert_eq!(goaway(&c.frames()), Some(ProtocolError));
}

#[test]
fn server_preface_advertises_limits() {
    let mut c = Client::raw(Limits { max_concurrent_streams: 7, ..Limits::default() });
    let got = c.frames();
    assert_eq!(got.len(), 1);
    let params: Vec<_> = frame::settings_params(&got[0].payload).collect();
    assert!(params.contains(&(setting::MAX_CONCURRENT_STREAMS, 7)));
    assert!(params.contains(&(setting::NO_RFC7540_PRIORITIES, 1)));
}

#[test]
fn frames_may_arrive_in_pieces() {
    let mut c = Client::new();
    let bytes = c.headers(1, GET, true);
    assert_eq!(c.conn.recv(&bytes[..5], c.now), 0);
    assert_eq!(c.conn.recv(&bytes[..12], c.now), 0);
    assert_eq!(c.conn.recv(&bytes, c.now), bytes.len());
    assert!(matches!(c.events()[..], [Event::Request { stream: StreamId(1), end_stream: true, .. }]));
}

#[test]
fn unknown_frames_and_flags_are_ignored() {
    assert_eq!(connection_error(|_| raw(0x42, 0xff, 0, b"whatever")), None);
    let mut c = Client::new();
    let block = c.block(GET);
    // Unknown flag bits (0x2, 0x10) on HEADERS change nothing.
    c.send(&raw(frame::HEADERS, 0x2 | 0x10 | frame::FLAG_END_HEADERS | frame::FLAG_END_STREAM, 1, &block));
    assert_eq!(c.events().len(), 1);
}

#[test]
fn reserved_bit_of_stream_id_is_ignored() {
    let mut c = Client::new();
    let mut bytes = c.headers(1, GET, true);
    bytes[5] |= 0x80;
    c.send(&bytes);
    assert!(matches!(c.events()[..], [Event::Request { stream: StreamId(1), .. }]));
}

#[test]
fn frame_size_limits() {
    assert_eq!(connection_error(|_| data(1, &[0; 16_385], false)), Some(FrameSizeError));
    // Exactly SETTINGS_MAX_FRAME_SIZE is fine.
    assert_eq!(connection_error(|_| data(1, &[0; 16_384], false)), None);
}

#[test]
fn bad_hpack_is_a_compression_error() {
    // Index 70 is past the static table and the empty dynamic table.
    let bad = raw(frame::HEADERS, frame::FLAG_END_HEADERS, 5, &[0x80 | 70]);
    assert_eq!(connection_error(|_| bad), Some(CompressionError));
    // A table size update closing the block (RFC 7541 section 4.2).
    let trailing = raw(frame::HEADERS, frame::FLAG_END_HEADERS, 5, &[0x82, 0x20]);
    assert_eq!(connection_error(|_| trailing), Some(CompressionError));
    // A table larger than our SETTINGS_HEADER_TABLE_SIZE (4096): 0x3f e1 1f = 4097.
    let big = raw(frame::HEADERS, frame::FLAG_END_HEADERS, 5, &[0x3f, 0xe2, 0x1f, 0x82]);
    assert_eq!(connection_error(|_| big), Some(CompressionError));
}

// ---- 5.1 stream states, 5.1.1 ids, 5.1.2 concurrency ----

#[test]
fn frames_on_idle_streams() {
    assert_eq!(connection_error(|_| data(9, b"x", true)), Some(ProtocolError));
    assert_eq!(connection_error(|_| rst(9, 8)), Some(ProtocolError));
    assert_eq!(connection_error(|_| window_update(9, 100)), Some(ProtocolError));
    // PRIORITY may be sent on an idle stream.
    assert_eq!(connection_error(|_| raw(frame::PRIORITY, 0, 9, &[0, 0, 0, 1, 16])), None);
}

#[test]
fn half_closed_remote_rejects_more_from_the_client() {
    // Stream 5 ended its request; its response is pending.
    let setup = |c: &mut Client| {
        let mut b = c.headers(5, GET, true);
        b.extend(data(5, b"late", false));
        b
    };
    assert_eq!(stream_error(setup), [(5, StreamClosed)]);
    let setup = |c: &mut Client| {
        let mut b = c.headers(5, GET, true);
        b.extend(c.headers(5, &[("x-late", "1")], true));
        b
    };
    assert_eq!(stream_error(setup), [(5, StreamClosed)]);
}

#[test]
fn closed_streams() {
    // Stream 3 ended normally both ways.
    assert_eq!(connection_error(|_| data(3, b"x", true)), Some(StreamClosed));
    assert_eq!(connection_error(|c| c.headers(3, GET, true)), Some(StreamClosed));
    assert_eq!(connection_error(|_| raw(frame::PRIORITY, 0, 3, &[0, 0, 0, 0, 16])), None);
    assert_eq!(connection_error(|_| window_update(3, 10_000)), None, "WINDOW_UPDATE may cross our close");
    // Reset by the client: later frames are stream errors.
    let setup = |c: &mut Client| {
        let mut b = c.headers(5, GET, false);
        b.extend(rst(5, 8));
        b.extend(data(5, b"x", true));
        b
    };
    assert_eq!(stream_error(setup), [(5, StreamClosed)]);
}

#[test]
fn frames_after_our_reset_are_ignored() {
    let mut c = Client::new();
    let bytes = c.headers(1, &[GET, &[("connection", "close")]].concat(), false);
    c.send(&bytes);
    assert_eq!(resets(&c.frames()), [(1, ProtocolError)]);
    let mut late = data(1, b"body in flight", false);
    late.extend(c.headers(1, &[("x-trailer", "1")], true));
    c.send(&late);
    let got = c.frames();
    assert_eq!(goaway(&got), None);
    assert_eq!(resets(&got), []);
}

#[test]
fn stream_ids_must_be_odd_and_increase() {
    assert_eq!(connection_error(|c| c.headers(6, GET, true)), Some(ProtocolError));
    let mut c = Client::new();
    c.get(7);
    let bytes = c.headers(5, GET, true);
    c.send(&bytes);
    assert_eq!(goaway(&c.frames()), Some(ProtocolError));
}

#[test]
fn concurrency_limit_refuses_streams() {
    let mut c = Client::new();
    for i in 0..128 {
        c.get(1 + 2 * i);
    }
    assert_eq!(resets(&c.frames()), []);
    c.get(257);
    assert_eq!(resets(&c.frames()), [(257, RefusedStream)]);
    // A finished stream makes room again.
    c.conn.respond(StreamId(1), 204, Vec::<(&str, &str)>::new(), BodySize::None).unwrap();
    c.frames();
    c.get(259);
    assert_eq!(resets(&c.frames()), []);
    assert_eq!(c.conn.active_streams(), 128);
}

// ---- 5.3 priority, 5.5 extensions ----

#[test]
fn self_dependency_is_a_stream_error() {
    let headers = |c: &mut Client| {
        let block = c.block(GET);
        let mut payload = vec![0, 0, 0, 5, 16];
        payload.extend(block);
        raw(frame::HEADERS, frame::FLAG_END_HEADERS | frame::FLAG_END_STREAM | frame::FLAG_PRIORITY, 5, &payload)
    };
    assert_eq!(stream_error(headers), [(5, ProtocolError)]);
    assert_eq!(stream_error(|_| raw(frame::PRIORITY, 0, 1, &[0, 0, 0, 1, 16])), [(1, ProtocolError)]);
}

#[test]
fn headers_priority_field_is_parsed_and_skipped() {
    let mut c = Client::new();
    let block = c.block(GET);
    let mut payload = vec![0, 0, 0, 0, 200];
    payload.extend(block);
    c.send(&raw(frame::HEADERS, frame::FLAG_END_HEADERS | frame::FLAG_END_STREAM | frame::FLAG_PRIORITY, 1, &payload));
    assert!(matches!(&c.events()[..], [Event::Request { head, .. }] if head.path.as_deref() == Some("/")));
}

#[test]
fn unknown_frame_inside_a_header_block_is_an_error() {
    let bytes = |c: &mut Client| {
        let block = c.block(GET);
        let mut b = raw(frame::HEADERS, frame::FLAG_END_STREAM, 5, &block[..2]);
        b.extend(raw(0x42, 0, 0, b""));
        b
    };
    assert_eq!(connection_error(bytes), Some(ProtocolError));
}

// ---- 6.x each frame type ----

#[test]
fn data_frame_rules() {
    assert_eq!(connection_error(|_| data(0, b"x", false)), Some(ProtocolError));
    // Pad length 10 > 3 bytes left.
    assert_eq!(connection_error(|_| raw(frame::DATA, frame::FLAG_PADDED, 1, &[10, 1, 2, 3])), Some(ProtocolError));
    assert_eq!(connection_error(|_| raw(frame::DATA, frame::FLAG_PADDED, 1, &[3, 1, 2, 3])), None);
}

#[test]
fn headers_frame_rules() {
    assert_eq!(connection_error(|c| c.headers(0, GET, true)), Some(ProtocolError));
    let padded = |c: &mut Client| {
        let mut payload = vec![200];
        payload.extend(c.block(GET));
        raw(frame::HEADERS, frame::FLAG_PADDED | frame::FLAG_END_HEADERS, 5, &payload)
    };
    assert_eq!(connection_error(padded), Some(ProtocolError));
    let mut c = Client::new();
    let mut payload = vec![4, 0, 0, 0, 0, 16];
    payload.extend(c.block(GET));
    payload.extend([0; 4]);
    let flags = frame::FLAG_PADDED | frame::FLAG_PRIORITY | frame::FLAG_END_HEADERS | frame::FLAG_END_STREAM;
    c.send(&raw(frame::HEADERS, flags, 1, &payload));
    assert!(matches!(&c.events()[..], [Event::Request { .. }]), "padding and priority are stripped");
}

#[test]
fn priority_frame_rules() {
    assert_eq!(connection_error(|_| raw(frame::PRIORITY, 0, 0, &[0, 0, 0, 1, 16])), Some(ProtocolError));
    assert_eq!(stream_error(|_| raw(frame::PRIORITY, 0, 1, &[0, 0, 0, 3, 16, 0])), [(1, FrameSizeError)]);
}

#[test]
fn rst_stream_frame_rules() {
    assert_eq!(connection_error(|_| rst(0, 8)), Some(ProtocolError));
    assert_eq!(connection_error(|_| raw(frame::RST_STREAM, 0, 1, &[0, 0, 8])), Some(FrameSizeError));
    let (mut c, got) = after_setup(|_| rst(1, 0x99));
    assert_eq!(goaway(&got), None);
    // Unknown error codes are kept as they are (RFC 9113 section 7).
    assert_eq!(c.events(), [Event::Reset { stream: StreamId(1), code: Unknown(0x99) }]);
    assert_eq!(c.conn.respond(StreamId(1), 200, [("a", "b")], BodySize::None), Err(RespondError::StreamGone));
}

#[test]
fn settings_frame_rules() {
    assert_eq!(connection_error(|_| raw(frame::SETTINGS, frame::FLAG_ACK, 0, &[0; 6])), Some(FrameSizeError));
    assert_eq!(connection_error(|_| raw(frame::SETTINGS, 0, 1, &[])), Some(ProtocolError));
    assert_eq!(connection_error(|_| raw(frame::SETTINGS, 0, 0, &[0; 5])), Some(FrameSizeError));
    assert_eq!(connection_error(|_| settings(&[(setting::ENABLE_PUSH, 2)])), Some(ProtocolError));
    assert_eq!(connection_error(|_| settings(&[(setting::INITIAL_WINDOW_SIZE, 1 << 31)])), Some(FlowControlError));
    assert_eq!(connection_error(|_| settings(&[(setting::MAX_FRAME_SIZE, 16_383)])), Some(ProtocolError));
    assert_eq!(connection_error(|_| settings(&[(setting::MAX_FRAME_SIZE, 1 << 24)])), Some(ProtocolError));
    assert_eq!(connection_error(|_| settings(&[(0xff, 7)])), None, "unknown settings are ignored");
    let (_, got) = after_setup(|_| settings(&[(setting::MAX_FRAME_SIZE, 1 << 20)]));
    assert!(got
        .iter()
        .any(|f| f.head.kind == frame::SETTINGS && f.head.flags == frame::FLAG_ACK && f.payload.is_empty()));
}

#[test]
fn ping_frame_rules() {
    let (_, got) = after_setup(|_| raw(frame::PING, 0, 0, b"12345678"));
    assert!(got
        .iter()
        .any(|f| f.head.kind == frame::PING && f.head.flags == frame::FLAG_ACK && f.payload == b"12345678"));
    let (_, got) = after_setup(|_| raw(frame::PING, frame::FLAG_ACK, 0, b"12345678"));
    assert!(got.is_empty(), "a PING ACK is not answered");
    assert_eq!(connection_error(|_| raw(frame::PING, 0, 1, &[0; 8])), Some(ProtocolError));
    assert_eq!(connection_error(|_| raw(frame::PING, 0, 0, &[0; 6])), Some(FrameSizeError));
}

#[test]
fn goaway_frame_rules() {
    assert_eq!(connection_error(|_| raw(frame::GOAWAY, 0, 1, &[0; 8])), Some(ProtocolError));
    let (mut c, got) = after_setup(|_| raw(frame::GOAWAY, 0, 0, &[0; 8]));
    assert!(got.is_empty());
    assert_eq!(c.events(), [Event::PeerGoAway { code: NoError }]);
    assert!(!c.conn.is_finished(), "stream 1 is still open");
    c.conn.respond(StreamId(1), 200, [("a", "b")], BodySize::Bytes(b"hi".to_vec())).unwrap();
    c.frames();
    assert!(c.conn.is_finished());
}

#[test]
fn push_promise_from_a_client_is_an_error() {
    assert_eq!(
        connection_error(|_| raw(frame::PUSH_PROMISE, frame::FLAG_END_HEADERS, 1, &[0, 0, 0, 2])),
        Some(ProtocolError)
    );
}

#[test]
fn window_update_frame_rules() {
    assert_eq!(connection_error(|_| window_update(0, 0)), Some(ProtocolError));
    assert_eq!(stream_error(|_| window_update(1, 0)), [(1, ProtocolError)]);
    assert_eq!(connection_error(|_| raw(frame::WINDOW_UPDATE, 0, 0, &[0, 0, 1])), Some(FrameSizeError));
    assert_eq!(connection_error(|_| window_update(0, (1 << 31) - 1)), Some(FlowControlError));
    assert_eq!(stream_error(|_| window_update(1, (1 << 31) - 1)), [(1, FlowControlError)]);
}

#[test]
fn continuation_assembles_a_field_block() {
    let mut c = Client::new();
    let block = c.block(&[GET, &[("x-long", &"v".repeat(20_000))]].concat());
    let (a, rest) = block.split_at(8_000);
    let (b, d) = rest.split_at(8_000);
    let mut bytes = raw(frame::HEADERS, frame::FLAG_END_STREAM, 1, a);
    bytes.extend(raw(frame::CONTINUATION, 0, 1, b));
    bytes.extend(raw(frame::CONTINUATION, frame::FLAG_END_HEADERS, 1, d));
    c.send(&bytes);
    let events = c.events();
    let [Event::Request { head, end_stream: true, .. }] = &events[..] else { panic!("{events:?}") };
    assert_eq!(head.header("x-long").map(<[u8]>::len), Some(20_000));
}

#[test]
fn continuation_rules() {
    assert_eq!(
        connection_error(|_| raw(frame::CONTINUATION, frame::FLAG_END_HEADERS, 1, &[0x82])),
        Some(ProtocolError)
    );
    let other_stream = |c: &mut Client| {
        let block = c.block(GET);
        let mut b = raw(frame::HEADERS, 0, 5, &block);
        b.extend(raw(frame::CONTINUATION, frame::FLAG_END_HEADERS, 7, &[]));
        b
    };
    assert_eq!(connection_error(other_stream), Some(ProtocolError));
    let interleaved = |c: &mut Client| {
        let block = c.block(GET);
        let mut b = raw(frame::HEADERS, 0, 5, &block);
        b.extend(data(1, b"x", false));
        b
    };
    assert_eq!(connection_error(interleaved), Some(ProtocolError));
    assert_eq!(connection_error(|_| raw(frame::CONTINUATION, frame::FLAG_END_HEADERS, 0, &[])), Some(ProtocolError));
}

// ---- 8.1 HTTP message rules ----

#[test]
fn malformed_requests_are_stream_errors() {
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("uppercase name", &[("X-Upper", "1")]),
        ("unknown pseudo", &[(":foo", "1")]),
        ("response pseudo", &[(":status", "200")]),
        ("pseudo after regular", &[("x-a", "1"), (":authority", "a")]),
        ("duplicate pseudo", &[(":path", "/again")]),
        ("connection", &[("connection", "keep-alive")]),
        ("keep-alive", &[("keep-alive", "5")]),
        ("transfer-encoding", &[("transfer-encoding", "chunked")]),
        ("upgrade", &[("upgrade", "h2c")]),
        ("te other than trailers", &[("te", "gzip")]),
        ("bad content-length", &[("content-length", "12a")]),
        ("conflicting content-length", &[("content-length", "1"), ("content-length", "2")]),
        ("value with LF", &[("x-a", "a\nb")]),
        ("value with leading space", &[("x-a", " a")]),
        ("name with space", &[("x a", "1")]),
    ];
    for (what, extra) in cases {
        let got = stream_error(|c| c.headers(5, &[GET, extra].concat(), false));
        assert_eq!(got, [(5, ProtocolError)], "{what}");
    }
    let missing: &[(&str, &[(&str, &str)])] = &[
        ("no method", &[(":scheme", "https"), (":path", "/")]),
        ("no scheme", &[(":method", "GET"), (":path", "/")]),
        ("no path", &[(":method", "GET"), (":scheme", "https")]),
        ("empty path", &[(":method", "GET"), (":scheme", "https"), (":path", "")]),
        ("CONNECT with path", &[(":method", "CONNECT"), (":authority", "a:443"), (":path", "/")]),
    ];
    for (what, fields) in missing {
        assert_eq!(stream_error(|c| c.headers(5, fields, true)), [(5, ProtocolError)], "{what}");
    }
}

#[test]
fn well_formed_request_head() {
    let mut c = Client::new();
    let fields = [
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/a?b"),
        ("host", "h.test"),
        ("te", "trailers"),
        ("priority", "u=1, i"),
        ("accept", "*/*"),
    ];
    let bytes = c.headers(1, &fields, true);
    c.send(&bytes);
    let events = c.events();
    let [Event::Request { head, .. }] = &events[..] else { panic!("{events:?}") };
    assert_eq!(head.method, "GET");
    assert_eq!(head.scheme.as_deref(), Some("https"));
    assert_eq!(head.authority.as_deref(), Some("h.test"), "host stands in for :authority");
    assert_eq!(head.path.as_deref(), Some("/a?b"));
    assert_eq!(head.header("accept"), Some(&b"*/*"[..]));
    assert_eq!(head.priority, Priority { urgency: 1, incremental: true });
}

#[test]
fn trailers_must_end_the_stream() {
    let more = |c: &mut Client| c.headers(1, &[("x-trailer", "1")], false);
    assert_eq!(stream_error(more), [(1, ProtocolError)]);
    let pseudo = |c: &mut Client| c.headers(1, &[(":path", "/")], true);
    assert_eq!(stream_error(pseudo), [(1, ProtocolError)]);
    let ok = |c: &mut Client| c.headers(1, &[("x-trailer", "1")], true);
    assert_eq!(stream_error(ok), []);
}

#[test]
fn content_length_must_match_data() {
    let fields = [GET, &[("content-length", "4")]].concat();
    let short = |c: &mut Client| {
        let mut b = c.headers(5, &fields, false);
        b.extend(data(5, b"abc", true));
        b
    };
    assert_eq!(stream_error(short), [(5, ProtocolError)]);
    let long = |c: &mut Client| {
        let mut b = c.headers(5, &fields, false);
        b.extend(data(5, b"abc", false));
        b.extend(data(5, b"de", true));
        b
    };
    assert_eq!(stream_error(long), [(5, ProtocolError)]);
    let none = |c: &mut Client| c.headers(5, &fields, true);
    assert_eq!(stream_error(none), [(5, ProtocolError)]);
    let exact = |c: &mut Client| {
        let mut b = c.headers(5, &fields, false);
        b.extend(data(5, b"ab", false));
        b.extend(data(5, b"cd", true));
        b
    };
    assert_eq!(stream_error(exact), []);
}

#[test]
fn request_bodies_are_discarded_and_credit_returned() {
    let mut c = Client::new();
    let bytes = c.headers(1, &[(":method", "POST"), (":scheme", "https"), (":path", "/")], false);
    c.send(&bytes);
    let chunk = vec![7; 16_000];
    for _ in 0..3 {
        c.send(&data(1, &chunk, false));
    }
    let updates: Vec<_> = c.frames().into_iter().filter(|f| f.head.kind == frame::WINDOW_UPDATE).collect();
    let credit = |id: u32| -> u32 {
        updates
            .iter()
            .filter(|f| f.head.stream == id)
            .map(|f| u32::from_be_bytes(f.payload[..4].try_into().unwrap()))
            .sum()
    };
    assert_eq!(credit(0), 48_000);
    assert_eq!(credit(1), 48_000);
    // Without that credit these would overflow the 65535-byte windows.
    for _ in 0..4 {
        c.send(&data(1, &chunk, false));
    }
    assert_eq!(goaway(&c.frames()), None);
}

// ---- responses, flow control out, frame sizes ----

fn data_frames(got: &[Got]) -> Vec<(u32, usize, bool)> {
    got.iter()
        .filter(|f| f.head.kind == frame::DATA)
        .map(|f| (f.head.stream, f.payload.len(), f.head.has(frame::FLAG_END_STREAM)))
        .collect()
}

#[test]
fn file_body_comes_out_as_headers_and_sendfile_sized_frames() {
    let mut c = Client::new();
    c.get(1);
    c.conn
        .respond(
            StreamId(1),
            200,
            [("Content-Type", "text/plain"), ("Connection", "close")],
            BodySize::File { len: 40_000 },
        )
        .unwrap();
    let mut writes = Vec::new();
    while let Some(w) = c.conn.poll_write(c.max_payload) {
        writes.push(w);
    }
    let files: Vec<_> = writes
        .iter()
        .filter_map(|w| match w {
            Write::FileData { stream, head, offset, len, .. } => Some((*stream, head.len(), *offset, *len)),
            Write::Bytes(_) => None,
        })
        .collect();
    // A body longer than one record: the HEADERS go out alone, so the client
    // reads them from a small record; then full frames within the peer's
    // 65535-byte windows.
    let Write::Bytes(headers) = &writes[0] else { panic!("{writes:?}") };
    let got = split(headers);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].head.kind, frame::HEADERS);
    let fields = c.decode(&got[0].payload);
    assert_eq!(fields, [(":status".into(), "200".into()), ("content-type".into(), "text/plain".into())]);
    assert_eq!(files[0], (StreamId(1), 9, 0, 16_375));
    assert_eq!(files[1], (StreamId(1), 9, 16_375, 16_375));
    let ends: Vec<bool> = writes
        .iter()
        .filter_map(|w| match w {
            Write::FileData { end_stream, .. } => Some(*end_stream),
            Write::Bytes(_) => None,
        })
        .collect();
    assert_eq!(ends.iter().filter(|e| **e).count(), 1);
    assert_eq!(ends.last(), Some(&true));
    let total: u64 = files.iter().map(|f| u64::from(f.3)).sum();
    assert_eq!(total, 40_000);
    assert!(files.windows(2).all(|w| w[0].2 + u64::from(w[0].3) == w[1].2), "offsets follow each other");
}

#[test]
fn small_file_shares_one_record_with_its_headers() {
    let mut c = Client::new();
    c.get(1);
    c.conn.respond(StreamId(1), 200, [("Content-Type", "text/plain")], BodySize::File { len: 1000 }).unwrap();
    let writes: Vec<Write> = std::iter::from_fn(|| c.conn.poll_write(c.max_payload)).collect();
    assert_eq!(writes.len(), 1, "{writes:?}");
    let Write::FileData { head, offset: 0, len: 1000, end_stream: true, .. } = &writes[0] else { panic!("{writes:?}") };
    assert_eq!(split(&head[..head.len() - 9])[0].head.kind, frame::HEADERS);
}

#[test]
fn small_records_make_small_frames() {
    let mut c = Client::new();
    c.max_payload = 1000;
    c.get(1);
    c.conn.respond(StreamId(1), 200, [("a", "b")], BodySize::Bytes(vec![1; 5000])).unwrap();
    let got = c.frames();
    let frames = data_frames(&got);
    assert!(frames.iter().all(|&(_, len, _)| len <= 1000));
    assert_eq!(frames.iter().map(|f| f.1).sum::<usize>(), 5000);
    assert!(frames.last().unwrap().2, "the last frame ends the stream");
    assert_eq!(got.iter().filter(|f| f.payload.starts_with(&[1, 1, 1])).count(), frames.len());
}

#[test]
fn bodyless_responses_end_with_headers() {
    let mut c = Client::new();
    c.get(1);
    c.conn.respond(StreamId(1), 304, [("etag", "\"x\"")], BodySize::None).unwrap();
    let got = c.frames();
    assert_eq!(got.len(), 1);
    assert!(got[0].head.has(frame::FLAG_END_STREAM) && got[0].head.has(frame::FLAG_END_HEADERS));
    assert_eq!(c.conn.respond(StreamId(1), 200, [("a", "b")], BodySize::None), Err(RespondError::StreamGone));
    assert_eq!(c.conn.active_streams(), 0);
}

#[test]
fn respond_twice_is_refused() {
    let mut c = Client::new();
    c.get(1);
    c.conn.respond(StreamId(1), 200, [("a", "b")], BodySize::File { len: 10 }).unwrap();
    assert_eq!(c.conn.respond(StreamId(1), 200, [("a", "b")], BodySize::None), Err(RespondError::AlreadyResponded));
}

#[test]
fn response_before_request_body_ends_resets_with_no_error() {
    let mut c = Client::new();
    let bytes = c.headers(1, GET, false);
    c.send(&bytes);
    c.conn.respond(StreamId(1), 413, [("a", "b")], BodySize::None).unwrap();
    assert_eq!(resets(&c.frames()), [(1, NoError)]);
    // The rest of the body, already in flight, is ignored.
    c.send(&data(1, b"more", true));
    assert_eq!(c.frames().len(), 0);
}

#[test]
fn large_response_headers_use_continuation() {
    let mut c = Client::new();
    c.get(1);
    let big = "v".repeat(40_000);
    c.conn.respond(StreamId(1), 200, [("x-big", big.as_str())], BodySize::None).unwrap();
    let got = c.frames();
    let kinds: Vec<_> = got.iter().map(|f| f.head.kind).collect();
    assert_eq!(kinds, [frame::HEADERS, frame::CONTINUATION, frame::CONTINUATION]);
    assert!(got.iter().all(|f| f.payload.len() <= 16_384));
    assert!(got[2].head.has(frame::FLAG_END_HEADERS) && !got[0].head.has(frame::FLAG_END_HEADERS));
    let block: Vec<u8> = got.iter().flat_map(|f| f.payload.clone()).collect();
    assert_eq!(c.decode(&block)[1].1.len(), 40_000);
}

#[test]
fn peer_max_frame_size_is_respected() {
    let mut c = Client::new();
    c.max_payload = 100_000;
    c.send(&settings(&[(setting::MAX_FRAME_SIZE, 20_000), (setting::INITIAL_WINDOW_SIZE, 1 << 20)]));
    c.send(&window_update(0, 1 << 20));
    c.get(1);
    c.conn.respond(StreamId(1), 200, [("a", "b")], BodySize::File { len: 50_000 }).unwrap();
    let sizes: Vec<_> = data_frames(&c.frames()).into_iter().map(|f| f.1).collect();
    assert_eq!(sizes, [20_000, 20_000, 10_000]);
}

#[test]
fn send_windows_block_and_resume() {
    let mut c = Client::new();
    c.send(&settings(&[(setting::INITIAL_WINDOW_SIZE, 1)]));
    c.get(1);
    c.conn.respond(StreamId(1), 200, [("a", "b")], BodySize::File { len: 10 }).unwrap();
    assert_eq!(data_frames(&c.frames()), [(1, 1, false)]);
    c.send(&window_update(1, 4));
    assert_eq!(data_frames(&c.frames()), [(1, 4, false)]);
    c.send(&window_update(1, 100));
    assert_eq!(data_frames(&c.frames()), [(1, 5, true)]);
}

#[test]
fn connection_window_limits_all_streams() {
    let mut c = Client::new();
    c.get(1);
    c.get(3);
    for id in [1, 3] {
        c.conn.respond(StreamId(id), 200, [("a", "b")], BodySize::File { len: 50_000 }).unwrap();
    }
    let total: usize = data_frames(&c.frames()).iter().map(|f| f.1).sum();
    assert_eq!(total, 65_535);
    c.send(&window_update(0, 1000));
    let total: usize = data_frames(&c.frames()).iter().map(|f| f.1).sum();
    assert_eq!(total, 1000);
}

#[test]
fn initial_window_changes_apply_to_open_streams_even_below_zero() {
    let mut c = Client::new();
    c.get(1);
    c.conn.respond(StreamId(1), 200, [("a", "b")], BodySize::File { len: 100 }).unwrap();
    c.send(&settings(&[(setting::INITIAL_WINDOW_SIZE, 10)]));
    assert_eq!(data_frames(&c.frames()), [(1, 10, false)]);
    // 10 sent; a window of 0 leaves it at -10.
    c.send(&settings(&[(setting::INITIAL_WINDOW_SIZE, 0)]));
    c.send(&window_update(1, 15));
    assert_eq!(data_frames(&c.frames()), [(1, 5, false)]);
    c.send(&settings(&[(setting::INITIAL_WINDOW_SIZE, 1000)]));
    assert_eq!(data_frames(&c.frames()), [(1, 85, true)]);
    // Raising it past 2^31-1 on an open stream is a FLOW_CONTROL_ERROR.
    let mut c = Client::new();
    c.get(1);
    c.send(&window_update(1, (1 << 31) - 1 - 65_535));
    c.send(&settings(&[(setting::INITIAL_WINDOW_SIZE, 65_536)]));
    assert_eq!(goaway(&c.frames()), Some(FlowControlError));
}

#[test]
fn peer_header_table_size_is_honoured() {
    let mut c = Client::new();
    c.send(&settings(&[(setting::HEADER_TABLE_SIZE, 0)]));
    c.dec.set_max_table_size(0);
    for id in [1, 3] {
        c.get(id);
        c.conn.respond(StreamId(id), 200, [("x-custom", "same")], BodySize::None).unwrap();
        let got = c.frames();
        let headers: Vec<_> = got.iter().filter(|f| f.head.kind == frame::HEADERS).collect();
        assert_eq!(c.decode(&headers[0].payload)[1], ("x-custom".into(), "same".into()));
    }
}

// ---- RFC 9218 scheduling ----

#[test]
fn priority_field_values() {
    let cases: &[(&str, u8, bool)] = &[
        ("", 3, false),
        ("u=0", 0, false),
        ("u=7, i", 7, true),
        ("i, u=2", 2, true),
        ("i=?0, u=5", 5, false),
        ("u=8", 3, false),
        ("u=-1", 3, false),
        ("u=1;foo=bar, i;x", 1, true),
        ("garbage, u=4", 4, false),
        ("i=?1", 3, true),
    ];
    for &(value, urgency, incremental) in cases {
        assert_eq!(Priority::parse(value.as_bytes()), Priority { urgency, incremental }, "{value}");
    }
}

#[test]
fn pick_orders_by_urgency_then_mode() {
    let p = |urgency, incremental| Priority { urgency, incremental };
    let ready = [(1, p(3, true)), (3, p(3, false)), (5, p(3, false)), (7, p(1, true)), (9, p(1, true))];
    assert_eq!(priority::pick(ready.iter().copied(), 0), Some(7), "urgency 1 first");
    assert_eq!(priority::pick(ready.iter().copied(), 7), Some(9), "round robin");
    assert_eq!(priority::pick(ready.iter().copied(), 9), Some(7), "wraps");
    assert_eq!(priority::pick(ready[..3].iter().copied(), 3), Some(3), "non-incremental one at a time");
    assert_eq!(priority::pick(ready[..1].iter().copied(), 1), Some(1));
    assert_eq!(priority::pick(std::iter::empty(), 0), None);
}

fn stream_order(c: &mut Client) -> Vec<u32> {
    data_frames(&c.frames()).into_iter().map(|f| f.0).collect()
}

#[test]
fn concurrent_responses_interleave_by_priority() {
    let mut c = Client::new();
    c.max_payload = 1000;
    for (id, prio) in [(1, "u=3, i"), (3, "u=3, i"), (5, "u=0"), (7, "u=3")] {
        let bytes = c.headers(id, &[GET, &[("priority", prio)]].concat(), true);
        c.send(&bytes);
        c.conn.respond(StreamId(id), 200, [("a", "b")], BodySize::File { len: 2500 }).unwrap();
    }
    // Urgent stream 5 alone, then non-incremental 7, then 1 and 3 take turns.
    assert_eq!(stream_order(&mut c), [5, 5, 5, 7, 7, 7, 1, 3, 1, 3, 1, 3]);
}

#[test]
fn priority_update_frame_reorders() {
    let mut c = Client::new();
    c.max_payload = 1000;
    c.get(1);
    c.get(3);
    for id in [1, 3] {
        c.conn.respond(StreamId(id), 200, [("a", "b")], BodySize::File { len: 1500 }).unwrap();
    }
    let mut payload = 3u32.to_be_bytes().to_vec();
    payload.extend(b"u=0");
    c.send(&raw(frame::PRIORITY_UPDATE, 0, 0, &payload));
    assert_eq!(stream_order(&mut c), [3, 3, 1, 1]);
}

// ---- shutdown ----

#[test]
fn shutdown_finishes_streams_then_closes() {
    let mut c = Client::new();
    c.get(1);
    c.get(3);
    c.conn.shutdown();
    let got = c.frames();
    assert_eq!(goaway(&got), Some(NoError));
    let last =
        u32::from_be_bytes(got.iter().find(|f| f.head.kind == frame::GOAWAY).unwrap().payload[..4].try_into().unwrap());
    assert_eq!(last, 3);
    c.events();
    // A new stream after GOAWAY is ignored.
    c.get(5);
    assert_eq!(c.events(), []);
    assert!(!c.conn.is_finished());
    for id in [1, 3] {
        c.conn.respond(StreamId(id), 200, [("a", "b")], BodySize::Bytes(b"ok".to_vec())).unwrap();
    }
    assert!(!c.conn.is_finished(), "responses still to be written");
    assert_eq!(data_frames(&c.frames()).len(), 2);
    assert!(c.conn.is_finished());
}

// ---- limits against floods ----

fn limits() -> Limits {
    Limits { max_resets: 5, max_control: 10, max_continuations: 4, max_header_list_size: 1000, ..Limits::default() }
}

#[test]
fn rapid_reset_is_calmed() {
    let mut c = Client::with(limits());
    for i in 0..5 {
        let mut b = c.headers(1 + 2 * i, GET, true);
        b.extend(rst(1 + 2 * i, 8));
        c.send(&b);
    }
    assert_eq!(goaway(&c.frames()), None);
    let mut b = c.headers(11, GET, true);
    b.extend(rst(11, 8));
    c.send(&b);
    assert_eq!(goaway(&c.frames()), Some(EnhanceYourCalm));
}

#[test]
fn provoked_resets_count_too() {
    let mut c = Client::with(limits());
    for i in 0..6 {
        let bytes = c.headers(1 + 2 * i, &[GET, &[("te", "gzip")]].concat(), true);
        c.send(&bytes);
    }
    assert_eq!(goaway(&c.frames()), Some(EnhanceYourCalm));
}

#[test]
fn flood_counters_restart_each_window() {
    let mut c = Client::with(limits());
    for round in 0..3u32 {
        for i in 0..5 {
            let id = 1 + 2 * (round * 5 + i);
            let mut b = c.headers(id, GET, true);
            b.extend(rst(id, 8));
            c.send(&b);
        }
        c.now += Duration::from_secs(11);
    }
    assert_eq!(goaway(&c.frames()), None);
}

#[test]
fn control_frame_floods_are_calmed() {
    type Make = fn(&mut Client) -> Vec<u8>;
    let floods: &[(&str, Make)] = &[
        ("ping", |_| raw(frame::PING, 0, 0, &[0; 8])),
        ("settings", |_| settings(&[])),
        ("empty data", |_| data(1, b"", false)),
        ("tiny window update", |_| window_update(0, 1)),
        ("priority", |_| raw(frame::PRIORITY, 0, 1, &[0, 0, 0, 0, 1])),
        ("unknown", |_| raw(0x42, 0, 0, b"")),
    ];
    for (what, make) in floods {
        let mut c = Client::with(limits());
        let open = c.headers(1, GET, false);
        c.send(&open);
        // The SETTINGS of the handshake counted once.
        for _ in 0..9 {
            let b = make(&mut c);
            c.send(&b);
        }
        assert_eq!(goaway(&c.frames()), None, "{what}");
        let b = make(&mut c);
        c.send(&b);
        assert_eq!(goaway(&c.frames()), Some(EnhanceYourCalm), "{what}");
    }
    // Large window updates are normal traffic.
    let mut c = Client::with(limits());
    for _ in 0..20 {
        c.send(&window_update(0, 65_536));
        c.send(&window_update(0, 1024));
    }
    // The window would overflow 2^31-1 only after 32768 such updates.
    assert_eq!(goaway(&c.frames()), None);
}

#[test]
fn continuation_flood_is_calmed() {
    let mut c = Client::with(limits());
    let mut b = raw(frame::HEADERS, 0, 1, &[0x82]);
    for _ in 0..5 {
        b.extend(raw(frame::CONTINUATION, 0, 1, &[]));
    }
    c.send(&b);
    assert_eq!(goaway(&c.frames()), Some(EnhanceYourCalm));
    // Bytes: 5 frames of 16 KiB exceed the 64 KiB block limit.
    let mut c = Client::with(Limits { max_continuations: 100, ..limits() });
    let mut b = raw(frame::HEADERS, 0, 1, &[0x82]);
    for _ in 0..4 {
        b.extend(raw(frame::CONTINUATION, 0, 1, &[0x82; 16_384]));
    }
    c.send(&b);
    assert_eq!(goaway(&c.frames()), Some(EnhanceYourCalm));
}

#[test]
fn hpack_bomb_gets_431_and_keeps_the_table() {
    let mut c = Client::with(limits());
    // One 700-byte field in the dynamic table, then referenced again and again:
    // a few bytes on the wire, kilobytes decoded.
    let big = "b".repeat(700);
    let first = c.headers(1, &[GET, &[("x-big", big.as_str())]].concat(), true);
    c.send(&first);
    assert!(matches!(c.events()[..], [Event::Request { .. }]));
    let bomb = c.headers(3, &[GET, &[("x-big", big.as_str()); 50][..]].concat(), true);
    assert!(bomb.len() < 200, "the bomb is small on the wire");
    c.send(&bomb);
    assert_eq!(c.events(), [], "the oversized request never reaches the caller");
    let got = c.frames();
    let headers = got.iter().find(|f| f.head.kind == frame::HEADERS && f.head.stream == 3).unwrap();
    assert_eq!(c.decode(&headers.payload)[0], (":status".into(), "431".into()));
    // The table stayed in step: the next request decodes.
    let next = c.headers(5, GET, true);
    c.send(&next);
    assert!(matches!(c.events()[..], [Event::Request { stream: StreamId(5), .. }]));
}

#[test]
fn idle_connection_is_small() {
    let mut c = Client::new();
    c.get(1);
    c.conn.respond(StreamId(1), 200, [("a", "b")], BodySize::Bytes(vec![0; 10_000])).unwrap();
    c.frames();
    c.events();
    let size = std::mem::size_of::<Connection>();
    println!("idle h2 Connection: {size} bytes inline");
    assert!(size <= 512, "{size}");
    assert_eq!(c.conn.active_streams(), 0);
}

#[test]
fn huffman_coded_requests_decode() {
    // RFC 7541 appendix C.4.1: GET http://www.example.com/ with Huffman strings.
    let block = [0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff];
    let mut c = Client::new();
    c.send(&raw(frame::HEADERS, frame::FLAG_END_HEADERS | frame::FLAG_END_STREAM, 1, &block));
    let events = c.events();
    let [Event::Request { head, .. }] = &events[..] else { panic!("{events:?}") };
    assert_eq!(head.authority.as_deref(), Some("www.example.com"));
    // A field name of one Huffman byte: '0' (00000) padded with zero bits instead
    // of the start of EOS (ones).
    let bad = [0x82, 0x86, 0x84, 0x00, 0x81, 0x00, 0x00];
    assert_eq!(
        connection_error(|_| raw(frame::HEADERS, frame::FLAG_END_HEADERS | frame::FLAG_END_STREAM, 5, &bad)),
        Some(CompressionError)
    );
}

#[test]
fn respond_to_an_unknown_stream_is_refused() {
    let mut c = Client::new();
    assert_eq!(c.conn.respond(StreamId(1), 200, [("a", "b")], BodySize::None), Err(RespondError::StreamGone));
}

#[test]
fn reset_of_a_request_the_codec_answered_is_not_reported() {
    let mut c = Client::with(limits());
    let big = "b".repeat(2000);
    let bytes = c.headers(1, &[GET, &[("x-big", big.as_str())]].concat(), false);
    c.send(&bytes);
    c.send(&rst(1, 8));
    assert_eq!(c.events(), []);
}
