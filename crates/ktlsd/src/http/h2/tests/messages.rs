//! HTTP messages on streams (RFC 9113 section 8.1): malformed requests,
//! trailers, Content-Length, and request bodies discarded with their credit returned.

use super::*;
use crate::http::h2::priority::Priority;

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
        ("host other than :authority", &[("host", "other.test")]),
        ("two hosts", &[("host", "example.test"), ("host", "example.test")]),
        ("invalid host", &[("host", "a/b")]),
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
        ("method not a token", &[(":method", "GET/p/x?"), (":scheme", "https"), (":path", "/")]),
        ("method with a space", &[(":method", "GET /x"), (":scheme", "https"), (":path", "/")]),
        ("method with a comma", &[(":method", "GET,POST"), (":scheme", "https"), (":path", "/")]),
        ("empty method", &[(":method", ""), (":scheme", "https"), (":path", "/")]),
        ("CONNECT with path", &[(":method", "CONNECT"), (":authority", "a:443"), (":path", "/")]),
        // RFC 8441 section 4: :protocol only on CONNECT, which then has all four others.
        ("protocol on GET", &[(":method", "GET"), (":scheme", "https"), (":path", "/"), (":protocol", "websocket")]),
        (
            "extended CONNECT without path",
            &[(":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "https"), (":authority", "a")],
        ),
        (
            "extended CONNECT without scheme",
            &[(":method", "CONNECT"), (":protocol", "websocket"), (":path", "/"), (":authority", "a")],
        ),
        (
            "extended CONNECT without authority",
            &[(":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "https"), (":path", "/")],
        ),
        (
            "two protocols",
            &[
                (":method", "CONNECT"),
                (":protocol", "websocket"),
                (":protocol", "websocket"),
                (":scheme", "https"),
                (":path", "/"),
                (":authority", "a"),
            ],
        ),
        ("authority ../..", &[(":method", "GET"), (":scheme", "https"), (":path", "/"), (":authority", "../..")]),
        ("empty authority", &[(":method", "GET"), (":scheme", "https"), (":path", "/"), (":authority", "")]),
        ("empty host", &[(":method", "GET"), (":scheme", "https"), (":path", "/"), ("host", "")]),
        (
            "two different hosts",
            &[(":method", "GET"), (":scheme", "https"), (":path", "/"), ("host", "a"), ("host", "b")],
        ),
    ];
    for (what, fields) in missing {
        assert_eq!(stream_error(|c| c.headers(5, fields, true)), [(5, ProtocolError)], "{what}");
    }
    // Any token is a method (RFC 9110 section 9.1), known or not.
    for method in ["PURGE", "M-SEARCH", "get", "X!#$%&'*+.^_`|~1"] {
        let fields = [(":method", method), (":scheme", "https"), (":path", "/")];
        assert_eq!(stream_error(|c| c.headers(5, &fields, true)), [], "{method}");
    }
    // A host that names :authority's host (case aside) is well formed.
    let same = [GET, &[("host", "EXAMPLE.test")]].concat();
    assert_eq!(stream_error(|c| c.headers(5, &same, true)), []);
}

#[test]
fn extended_connect_carries_its_protocol() {
    let mut c = Client::new();
    let fields = [
        (":method", "CONNECT"),
        (":protocol", "WebSocket"),
        (":scheme", "https"),
        (":path", "/chat?room=1"),
        (":authority", "h.test"),
        ("sec-websocket-version", "13"),
    ];
    let bytes = c.headers(1, &fields, false);
    c.send(&bytes);
    let events = c.events();
    let [Event::Request { head, end_stream: false, .. }] = &events[..] else { panic!("{events:?}") };
    assert_eq!((head.method.as_str(), head.protocol.as_deref()), ("CONNECT", Some("websocket")));
    let req = crate::http::fields::to_request(head, "192.0.2.1".parse().unwrap()).unwrap();
    assert_eq!((req.path.as_str(), req.query.as_deref()), ("/chat", Some("room=1")));
    assert_eq!(req.upgrade.as_deref(), Some("websocket"));
    // A plain CONNECT asks for no tunnel through a `[[proxy]]` rule.
    let mut c = Client::new();
    let bytes = c.headers(1, &[(":method", "CONNECT"), (":authority", "h.test:443")], false);
    c.send(&bytes);
    let events = c.events();
    let [Event::Request { head, .. }] = &events[..] else { panic!("{events:?}") };
    assert_eq!(head.protocol, None);
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

#[test]
fn request_bodies_are_delivered_only_when_asked_for() {
    for deliver in [false, true] {
        let mut c = Client::new();
        if deliver {
            c.conn.deliver_bodies();
        }
        let mut b = c.headers(1, GET, false);
        b.extend(data(1, b"abc", false));
        b.extend(data(1, b"", false));
        b.extend(data(1, b"de", true));
        c.send(&b);
        let data_events: Vec<(u32, Vec<u8>, bool)> = c
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Data { stream, data, end_stream } => Some((stream.0, data, end_stream)),
                _ => None,
            })
            .collect();
        let want = match deliver {
            true => vec![(1, b"abc".to_vec(), false), (1, b"de".to_vec(), true)],
            false => vec![],
        };
        assert_eq!(data_events, want, "deliver {deliver}");
    }
}

/// A delivered body's stream credit waits for its reader (`consumed`); the
/// connection's comes back at once, so one slow reader holds only its own stream.
#[test]
fn delivered_bodies_get_stream_credit_as_they_are_consumed() {
    let mut c = Client::new();
    c.conn.deliver_bodies();
    for id in [1, 3] {
        let bytes = c.headers(id, &[(":method", "POST"), (":scheme", "https"), (":path", "/")], false);
        c.send(&bytes);
    }
    let chunk = vec![7; 16_000];
    for _ in 0..4 {
        c.send(&data(1, &chunk, false));
    }
    let credit = |c: &mut Client| {
        let frames = c.frames();
        assert!(!frames.iter().any(|f| f.head.kind == frame::RST_STREAM), "{frames:?}");
        let sum = |id: u32| -> u32 {
            frames
                .iter()
                .filter(|f| f.head.kind == frame::WINDOW_UPDATE && f.head.stream == id)
                .map(|f| u32::from_be_bytes(f.payload[..4].try_into().unwrap()))
                .sum()
        };
        (sum(0), sum(1), sum(3))
    };
    // The connection's credit came back; stream 1's window has 1535 bytes left.
    assert_eq!(credit(&mut c), (48_000, 0, 0));
    // Stream 3 goes on meanwhile.
    c.send(&data(3, &chunk, false));
    c.conn.consumed(StreamId(3), 16_000);
    c.conn.consumed(StreamId(1), 16_000);
    assert_eq!(credit(&mut c), (0, 0, 0), "below half the window, no update yet");
    c.conn.consumed(StreamId(1), 32_000);
    assert_eq!(credit(&mut c), (0, 48_000, 0));
    // Without that credit these would overflow stream 1's window.
    for _ in 0..3 {
        c.send(&data(1, &chunk, false));
    }
    assert_eq!(goaway(&c.frames()), None);
    // No credit for a stream whose client has finished sending.
    c.send(&data(3, b"", true));
    c.conn.consumed(StreamId(3), 40_000);
    assert_eq!(credit(&mut c).2, 0);
    let data_events = c.events().into_iter().filter(|e| matches!(e, Event::Data { .. })).count();
    assert_eq!(data_events, 9);
}
