//! Which stream goes next (RFC 9218 priorities), shutdown, and the limits
//! that calm floods of resets, control frames and CONTINUATION.

use std::time::Duration;

use super::*;
use crate::http::h2::priority::{self, Priority};

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

/// The last-stream-id and code of each GOAWAY, in order.
fn goaways(frames: &[Got]) -> Vec<(u32, ErrorCode)> {
    let last = |f: &Got| u32::from_be_bytes(f.payload[..4].try_into().unwrap());
    frames.iter().filter(|f| f.head.kind == frame::GOAWAY).map(|f| (last(f), f.code())).collect()
}

/// The payload of the PING the server sent (not an ACK).
fn ping_sent(frames: &[Got]) -> Option<Vec<u8>> {
    frames.iter().find(|f| f.head.kind == frame::PING && !f.head.has(frame::FLAG_ACK)).map(|f| f.payload.clone())
}

fn ping_ack(data: &[u8]) -> Vec<u8> {
    raw(frame::PING, frame::FLAG_ACK, 0, data)
}

/// The streams of the request events.
fn requests(events: &[Event]) -> Vec<u32> {
    events.iter().filter_map(|e| if let Event::Request { stream, .. } = e { Some(stream.0) } else { None }).collect()
}

/// RFC 9113 section 6.8: the first GOAWAY names the largest stream id, with NO_ERROR,
/// and a PING goes with it; streams the client opens until the PING's ACK (or until
/// the wait is given up) are taken, and the final GOAWAY names the last of them;
/// streams after it are ignored.
#[test]
fn shutdown_sends_two_goaways_and_serves_the_streams_in_between() {
    type Act = fn(&mut Client, &[u8]);
    // (what the client does after the first GOAWAY, the final GOAWAY's last stream
    // if one was sent, the streams taken after stream 1)
    let cases: &[(&str, Act, Option<u32>, &[u32])] = &[
        ("nothing yet", |_, _| {}, None, &[]),
        ("a stream crossing the GOAWAY", |c, _| c.get(3), None, &[3]),
        ("our PING acknowledged", |c, ping| c.send(&ping_ack(ping)), Some(1), &[]),
        ("another PING acknowledged", |c, _| c.send(&ping_ack(b"12345678")), None, &[]),
        (
            "a stream, then the ACK",
            |c, ping| {
                c.get(3);
                c.send(&ping_ack(ping));
            },
            Some(3),
            &[3],
        ),
        (
            "the ACK, then a stream",
            |c, ping| {
                c.send(&ping_ack(ping));
                c.get(3);
            },
            Some(1),
            &[],
        ),
        (
            "two streams, then the wait given up",
            |c, _| {
                c.get(3);
                c.get(5);
                c.conn.finish_shutdown();
            },
            Some(5),
            &[3, 5],
        ),
    ];
    for &(what, act, last, taken) in cases {
        let mut c = Client::new();
        c.get(1);
        assert_eq!(requests(&c.events()), [1]);
        c.conn.shutdown();
        let got = c.frames();
        assert_eq!(goaways(&got), [((1 << 31) - 1, NoError)], "{what}: the first GOAWAY");
        let ping = ping_sent(&got).expect("a PING goes with the first GOAWAY");
        c.conn.shutdown();
        assert!(c.frames().is_empty(), "{what}: a second shutdown sends nothing");

        act(&mut c, &ping);
        let got = c.frames();
        assert_eq!(goaways(&got), last.map(|l| (l, NoError)).into_iter().collect::<Vec<_>>(), "{what}");
        assert_eq!(requests(&c.events()), taken, "{what}: streams taken");
        assert_eq!(c.conn.awaits_shutdown_ack(), last.is_none(), "{what}");
        // A new stream after the final GOAWAY is ignored.
        c.conn.finish_shutdown();
        let final_last = goaways(&c.frames()).first().map_or(last, |g| Some(g.0));
        c.get(9);
        assert_eq!(c.events(), [], "{what}: stream 9 after the final GOAWAY");
        assert!(c.frames().iter().all(|f| f.head.stream != 9), "{what}: stream 9 gets nothing");
        assert_eq!(final_last, Some(*taken.last().unwrap_or(&1)), "{what}: the final GOAWAY");

        for id in std::iter::once(1).chain(taken.iter().copied()) {
            assert!(!c.conn.is_finished(), "{what}: stream {id} unanswered");
            c.conn.respond(StreamId(id), 200, [("a", "b")], BodySize::Bytes(b"ok".to_vec())).unwrap();
        }
        assert!(!c.conn.is_finished(), "{what}: responses still to be written");
        assert_eq!(data_frames(&c.frames()).len(), 1 + taken.len(), "{what}");
        assert!(c.conn.is_finished(), "{what}");
    }
}

/// A connection retired after its handshake and before its first request (the
/// client preface not yet read) still serves the request that was on its way.
#[test]
fn shutdown_before_the_client_preface_serves_its_first_request() {
    let mut c = Client::raw(Limits::default());
    c.conn.shutdown();
    let got = c.frames();
    assert_eq!(got[0].head.kind, frame::SETTINGS, "the server preface comes first");
    assert_eq!(goaways(&got), [((1 << 31) - 1, NoError)]);
    let ping = ping_sent(&got).unwrap();
    let mut hello = PREFACE.to_vec();
    hello.extend(settings(&[]));
    hello.extend(c.headers(1, GET, true));
    hello.extend(ping_ack(&ping));
    c.send(&hello);
    assert_eq!(requests(&c.events()), [1]);
    assert_eq!(goaways(&c.frames()), [(1, NoError)]);
    assert!(!c.conn.is_finished());
    c.conn.respond(StreamId(1), 204, [("a", "b")], BodySize::None).unwrap();
    let got = c.frames();
    assert!(got.iter().any(|f| f.head.kind == frame::HEADERS && f.head.stream == 1));
    assert!(c.conn.is_finished());
}

/// A client that never answers the PING: the caller gives up, the final GOAWAY
/// names no stream, and the connection is finished at once.
#[test]
fn shutdown_without_an_ack_ends_when_given_up() {
    let mut c = Client::new();
    c.conn.shutdown();
    c.frames();
    assert!(!c.conn.is_finished(), "waiting for the PING's ACK");
    c.conn.finish_shutdown();
    assert_eq!(goaways(&c.frames()), [(0, NoError)]);
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
    assert_eq!(c.events(), [Event::HeaderListTooLarge { stream: StreamId(3) }], "only its size reaches the caller");
    c.conn.respond(StreamId(3), 431, [("content-length", "0")], BodySize::None).unwrap();
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
fn reset_of_an_oversized_request_is_reported() {
    let mut c = Client::with(limits());
    let big = "b".repeat(2000);
    let bytes = c.headers(1, &[GET, &[("x-big", big.as_str())]].concat(), false);
    c.send(&bytes);
    c.send(&rst(1, 8));
    let stream = StreamId(1);
    assert_eq!(c.events(), [Event::HeaderListTooLarge { stream }, Event::Reset { stream, code: Cancel }]);
}
