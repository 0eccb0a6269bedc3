//! Responses: how bodies leave as frames sized to records, flow control out,
//! frame and header-table sizes the peer set.

use super::*;
use crate::http::h2::conn::HOLD;
use std::time::Duration;

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
            _ => None,
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
            _ => None,
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
fn response_before_request_body_ends_is_held_then_reset_with_no_error() {
    let mut c = Client::new();
    let bytes = c.headers(1, GET, false);
    c.send(&bytes);
    c.conn.respond(StreamId(1), 413, [("a", "b")], BodySize::None).unwrap();
    assert_eq!(resets(&c.frames()), [], "the request may still end in time");
    assert_eq!(c.conn.next_deadline(), Some(c.now + HOLD));
    c.conn.expire(c.now + HOLD);
    assert_eq!(resets(&c.frames()), [(1, NoError)]);
    // The rest of the body, already in flight, is ignored.
    c.send(&data(1, b"more", true));
    assert_eq!(c.frames().len(), 0);
}

/// While held, the request is still checked (a later offending frame is a stream
/// error whatever the timing), and a request that ends in time ends the stream
/// without a reset.
#[test]
fn held_request_is_still_checked() {
    let fields = [GET, &[("content-length", "4")]].concat();
    let mut c = Client::new();
    let bytes = c.headers(1, &fields, false);
    c.send(&bytes);
    c.conn.respond(StreamId(1), 200, [("a", "b")], BodySize::None).unwrap();
    c.frames();
    c.send(&data(1, b"toolong", false));
    assert_eq!(resets(&c.frames()), [(1, ProtocolError)]);

    let bytes = c.headers(3, &fields, false);
    c.send(&bytes);
    c.conn.respond(StreamId(3), 200, [("a", "b")], BodySize::None).unwrap();
    c.send(&data(3, b"abcd", true));
    assert_eq!(resets(&c.frames()), []);
    assert_eq!(c.conn.active_streams(), 0);
    c.conn.expire(c.now + HOLD);
    assert_eq!(resets(&c.frames()), []);
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

/// A stream whose own window stays shut is reset with CANCEL after the timeout,
/// while a stream that moves is left alone.
#[test]
fn stream_stalled_on_its_window_is_reset() {
    let mut c = Client::new();
    c.send(&settings(&[(setting::INITIAL_WINDOW_SIZE, 1)]));
    c.get(1);
    c.get(3);
    c.events();
    for id in [1, 3] {
        c.conn.respond(StreamId(id), 200, [("a", "b")], BodySize::File { len: 10 }).unwrap();
    }
    c.frames();
    let t = Duration::from_secs(5);
    c.conn.reset_stalled(c.now, t);
    c.send(&window_update(3, 2));
    c.frames();
    c.conn.reset_stalled(c.now + t / 2, t);
    c.send(&window_update(3, 2));
    c.frames();
    c.conn.reset_stalled(c.now + t, t);
    assert_eq!(resets(&c.frames()), [(1, Cancel)]);
    assert_eq!(c.events(), [Event::Reset { stream: StreamId(1), code: Cancel }]);
    assert_eq!(c.conn.active_streams(), 1, "stream 3 moved and stays");
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

#[test]
fn streamed_body_leaves_as_far_as_its_pieces_reach() {
    let mut c = Client::new();
    c.get(1);
    c.conn.respond(StreamId(1), 200, [("a", "b")], BodySize::Stream { len: Some(30_000) }).unwrap();
    let data = |c: &mut Client| -> Vec<(u32, bool)> {
        std::iter::from_fn(|| c.conn.poll_write(c.max_payload))
            .filter_map(|w| match w {
                Write::Data { stream, bytes, len, end_stream } => {
                    assert_eq!(
                        (stream, &bytes[bytes.len() - len as usize..]),
                        (StreamId(1), &vec![7; len as usize][..])
                    );
                    Some((len, end_stream))
                }
                _ => None,
            })
            .collect()
    };
    assert_eq!(data(&mut c), [], "nothing given, only the HEADERS leave");
    assert_eq!(c.conn.buffered(StreamId(1)), Some(0));
    c.conn.push(StreamId(1), &[7; 20_000]).unwrap();
    assert_eq!(c.conn.buffered(StreamId(1)), Some(20_000));
    assert_eq!(data(&mut c), [(16_375, false), (3_625, false)]);
    // Bytes beyond the length are dropped.
    c.conn.push(StreamId(1), &[7; 10_100]).unwrap();
    assert_eq!(data(&mut c), [(10_000, true)]);
    assert_eq!(c.conn.buffered(StreamId(1)), None);
    assert_eq!(c.conn.push(StreamId(1), &[7]), Err(RespondError::StreamGone));
}

/// A streamed body of unknown length: pieces leave as they are given, none ends
/// the stream until `finish`; then the last bytes given carry END_STREAM, or an
/// empty DATA frame does when all were sent, even with the windows shut.
#[test]
fn streamed_body_of_unknown_length_ends_where_finish_says() {
    let data = |c: &mut Client| -> Vec<(u32, u32, bool)> {
        std::iter::from_fn(|| c.conn.poll_write(c.max_payload))
            .filter_map(|w| match w {
                Write::Data { stream, len, end_stream, .. } => Some((stream.0, len, end_stream)),
                _ => None,
            })
            .collect()
    };
    let mut c = Client::new();
    c.send(&settings(&[(setting::INITIAL_WINDOW_SIZE, 10_000)]));
    c.get(1);
    c.conn.respond(StreamId(1), 200, [("a", "b")], BodySize::Stream { len: None }).unwrap();
    c.conn.push(StreamId(1), &[7; 12_000]).unwrap();
    assert_eq!(data(&mut c), [(1, 10_000, false)]);
    c.conn.finish(StreamId(1)).unwrap();
    assert_eq!(data(&mut c), [], "2,000 bytes wait for the stream's window");
    c.send(&window_update(1, 5_000));
    assert_eq!(data(&mut c), [(1, 2_000, true)]);
    assert_eq!(c.conn.push(StreamId(1), &[7]), Err(RespondError::StreamGone));

    c.get(3);
    c.conn.respond(StreamId(3), 200, [("a", "b")], BodySize::Stream { len: None }).unwrap();
    c.conn.push(StreamId(3), &[7; 10_000]).unwrap();
    assert_eq!(data(&mut c), [(3, 10_000, false)]);
    c.conn.push(StreamId(3), &[7; 10]).unwrap();
    assert_eq!(data(&mut c), [], "the stream's window is shut");
    assert_eq!(c.conn.buffered(StreamId(3)), Some(10));
    c.send(&window_update(3, 10));
    assert_eq!(data(&mut c), [(3, 10, false)]);
    c.conn.finish(StreamId(3)).unwrap();
    assert_eq!(data(&mut c), [(3, 0, true)], "an empty END_STREAM frame, whatever the windows");
    assert_eq!(c.conn.finish(StreamId(3)), Err(RespondError::StreamGone));
}

/// A streamed body whose first bytes are given in memory and the rest counted at
/// the caller's source: the memory bytes leave first, then DATA frames the caller
/// fills from its source, each within one record, the last with END_STREAM; no
/// more is taken in memory once bytes wait at the source.
#[test]
fn streamed_body_from_its_source_follows_the_bytes_given() {
    let mut c = Client::new();
    c.get(1);
    c.conn.respond(StreamId(1), 200, [("a", "b")], BodySize::Stream { len: Some(40_000) }).unwrap();
    let writes = |c: &mut Client| -> Vec<(&'static str, u32, bool)> {
        std::iter::from_fn(|| c.conn.poll_write(c.max_payload))
            .filter_map(|w| match w {
                Write::Data { len, end_stream, .. } => Some(("memory", len, end_stream)),
                Write::SourceData { stream, head, len, end_stream } => {
                    assert_eq!(stream, StreamId(1));
                    assert!(head.len() + len as usize <= c.max_payload + 9, "one write, one record");
                    let frame = &head[head.len() - 9..];
                    let said = u32::from_be_bytes([0, frame[0], frame[1], frame[2]]);
                    assert_eq!((said, frame[3]), (len, frame::DATA), "the header ending `head` is this DATA frame's");
                    Some(("source", len, end_stream))
                }
                _ => None,
            })
            .collect()
    };
    assert_eq!(writes(&mut c), []);
    c.conn.push(StreamId(1), &[7; 1_000]).unwrap();
    c.conn.push_at_source(StreamId(1), 30_000).unwrap();
    assert_eq!(c.conn.push(StreamId(1), &[7]), Err(RespondError::AlreadyResponded), "memory bytes go first");
    assert_eq!(writes(&mut c), [("memory", 1_000, false), ("source", 16_375, false), ("source", 13_625, false)]);
    // More than the body's length waits at the source: only its length is counted.
    c.conn.push_at_source(StreamId(1), 50_000).unwrap();
    assert_eq!(writes(&mut c), [("source", 9_000, true)]);
    assert_eq!(c.conn.push_at_source(StreamId(1), 1), Err(RespondError::StreamGone));
}
