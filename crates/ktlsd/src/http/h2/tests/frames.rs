//! Frames: the preface and framing (RFC 9113 sections 3.4, 4.1-4.3), stream
//! states and ids (5.1), priority and extensions (5.3, 5.5), and each frame type's rules (6.x).

use super::*;

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
    assert!(params.contains(&(setting::ENABLE_CONNECT_PROTOCOL, 1)), "RFC 8441");
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
    assert!(!c.conn.is_finished(), "stream 1's request is held for its end");
    c.conn.expire(c.now + crate::http::h2::conn::HOLD);
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
