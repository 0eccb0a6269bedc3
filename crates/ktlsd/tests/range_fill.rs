//! The cold range fill of the response cache, end to end: the real binary in front
//! of a Python origin (`tests/range_fill/origin.py`) that honours Range and prints
//! every request it reads with its Range, curl as the client over HTTP/1.1 and
//! HTTP/2. A cold `Range` request stores the whole object from one upstream request
//! without a Range and gets its 206 before the object has arrived whole; the next
//! ranges (first byte, middle, last bytes, suffix, open, several) are hits with the
//! source's bytes; concurrent cold ranges make one upstream request; objects above
//! `max_object_size` and answers that are not storable send their ranges upstream.

use std::time::{Duration, Instant};

use testkit::*;

#[path = "range_fill/client.rs"]
mod client;
use client::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const PROTOCOLS: [&str; 2] = ["--http1.1", "--http2"];

/// ktlsd (one worker) caching `/obj/**` from `up` in `dir`, with `cache` added to `[cache]`.
fn server(up: &ScriptUpstream, dir: &std::path::Path, cache: &str) -> Server {
    let config = format!(
        "[[proxy]]\npath = \"/obj/**\"\nupstream = [{:?}]\ncache = true\n\n[cache]\ndir = {:?}\nmax_size = \"256M\"\n{cache}\n",
        up.url(),
        dir.display().to_string()
    );
    origin::ktlsd(BIN, &config, &[])
}

/// The origin, a cache directory, and ktlsd in front of the origin with `cache` in its `[cache]`.
fn setup(cache: &str) -> (ScriptUpstream, tempfile::TempDir, Server) {
    let up = origin();
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&up, dir.path(), cache);
    (up, dir, srv)
}

#[test]
fn a_cold_range_stores_the_object_and_the_next_ranges_are_hits() {
    let (up, _dir, srv) = setup("");
    let n = 1_000_000;
    let source = object(0, n);
    for proto in PROTOCOLS {
        let t = format!("/obj/cold{proto}?size={n}");
        let first = get(&srv, &t, proto, Some("1000-1999"));
        assert_part(&first, &source, 1000..2000, proto);
        assert_eq!(cache_status(&first), "ktlsd; fwd=miss", "{proto}");
        // The next request waits for the fill if it is still running, then hits.
        let cases: [(&str, std::ops::Range<usize>); 6] = [
            ("0-0", 0..1),
            ("400000-400099", 400_000..400_100),
            ("999990-999999", 999_990..n),
            ("-500", n - 500..n),
            ("999000-", 999_000..n),
            ("999990-2000000", 999_990..n),
        ];
        for (range, want) in cases {
            let r = get(&srv, &t, proto, Some(range));
            assert_part(&r, &source, want, &format!("{range} {proto}"));
            assert!(cache_status(&r).starts_with("ktlsd; hit"), "{range} {proto}: {}", cache_status(&r));
        }
        // Several ranges: the whole object from the entry (as for any hit).
        let multi = get(&srv, &t, proto, Some("0-9,500-599"));
        assert_eq!((multi.status, sha256(&multi.body)), (200, sha256(&source)), "{proto}");
        assert_eq!(cache_status(&multi), "ktlsd; hit", "{proto}");
        let whole = get(&srv, &t, proto, None);
        assert_eq!((whole.status, sha256(&whole.body)), (200, sha256(&source)), "{proto}");
        assert_eq!(cache_status(&whole), "ktlsd; hit", "{proto}");
        let unsatisfiable = get(&srv, &t, proto, Some("2000000-"));
        assert_eq!(unsatisfiable.status, 416, "{proto}");
        assert_eq!(asked(&up, &t), ["-"], "one upstream request, without Range ({proto})");
    }
}

#[test]
fn a_small_cold_range_is_stored_before_its_answer() {
    let (up, _dir, srv) = setup("");
    let source = object(0, 5000);
    for proto in PROTOCOLS {
        let t = format!("/obj/small{proto}?size=5000");
        let first = get(&srv, &t, proto, Some("-100"));
        assert_part(&first, &source, 4900..5000, proto);
        assert_eq!(cache_status(&first), "ktlsd; fwd=miss; stored", "{proto}");
        let next = get(&srv, &t, proto, Some("10-19"));
        assert_part(&next, &source, 10..20, proto);
        assert_eq!(cache_status(&next), "ktlsd; hit", "{proto}");
        assert_eq!(asked(&up, &t), ["-"], "{proto}");
    }
}

#[test]
fn the_range_is_answered_before_the_object_has_arrived() {
    let (up, _dir, srv) = setup("");
    // 32 pieces of 64 KiB, 100 ms apart: the whole object takes 3.2 s to arrive.
    let n = 32 * 65536;
    let source = object(0, n);
    for proto in PROTOCOLS {
        let t = format!("/obj/paced{proto}?size={n}&pace=0.1");
        let started = Instant::now();
        let first = get(&srv, &t, proto, Some("0-99"));
        let took = started.elapsed();
        assert_part(&first, &source, 0..100, proto);
        assert!(took < Duration::from_millis(1500), "{proto}: the first 100 bytes took {took:?}");
        // Waits for the fill, then hits.
        let next = get(&srv, &t, proto, Some("-1000"));
        assert_part(&next, &source, n - 1000..n, proto);
        assert!(cache_status(&next).starts_with("ktlsd; hit"), "{proto}: {}", cache_status(&next));
        assert_eq!(asked(&up, &t), ["-"], "{proto}");
    }
}

#[test]
fn concurrent_cold_ranges_make_one_upstream_request() {
    let (up, _dir, srv) = setup("");
    let n = 16 * 65536;
    let source = object(0, n);
    for proto in PROTOCOLS {
        let t = format!("/obj/together{proto}?size={n}&pace=0.05");
        let ranges: Vec<std::ops::Range<usize>> = (0..8).map(|i| i * 100_000..i * 100_000 + 5000).collect();
        let answers: Vec<Response> = std::thread::scope(|s| {
            let (srv, t) = (&srv, &t);
            let running: Vec<_> = ranges
                .iter()
                .map(|r| {
                    let spec = format!("{}-{}", r.start, r.end - 1);
                    s.spawn(move || get(srv, t, proto, Some(&spec)))
                })
                .collect();
            running.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, range) in answers.iter().zip(&ranges) {
            assert_part(r, &source, range.clone(), &format!("{range:?} {proto}"));
        }
        assert_eq!(asked(&up, &t), ["-"], "eight cold ranges, one upstream request ({proto})");
        let collapsed = answers.iter().filter(|r| cache_status(r).contains("collapsed")).count();
        assert_eq!(collapsed, 7, "{proto}: {:?}", answers.iter().map(cache_status).collect::<Vec<_>>());
    }
}

#[test]
fn objects_too_large_or_not_storable_send_their_ranges_upstream() {
    let (up, _dir, srv) = setup("max_object_size = \"1M\"");
    let n = 2 << 20;
    let source = object(0, n);
    for proto in PROTOCOLS {
        // Above max_object_size: the first answer's head says so; asked again with the range.
        let t = format!("/obj/large{proto}?size={n}");
        let r = get(&srv, &t, proto, Some("2000000-2000099"));
        assert_part(&r, &source, 2_000_000..2_000_100, proto);
        assert_eq!(cache_status(&r), "ktlsd; fwd=miss", "{proto}");
        assert_eq!(asked(&up, &t), ["-", "bytes=2000000-2000099"], "{proto}");
        let r = get(&srv, &t, proto, Some("-10"));
        assert_part(&r, &source, n - 10..n, proto);
        assert_eq!(asked(&up, &t), ["-", "bytes=2000000-2000099", "bytes=-10"], "then as sent ({proto})");

        // Not storable: the range is cut from the streamed answer; the next goes as sent.
        let small = object(0, 300_000);
        let t = format!("/obj/private{proto}?size=300000&cc=no-store");
        let r = get(&srv, &t, proto, Some("200000-200009"));
        assert_part(&r, &small, 200_000..200_010, proto);
        let r = get(&srv, &t, proto, Some("0-9"));
        assert_part(&r, &small, 0..10, proto);
        assert_eq!(asked(&up, &t), ["-", "bytes=0-9"], "{proto}");
    }
}

#[test]
fn an_if_range_that_does_not_match_gets_the_whole_object_which_is_stored() {
    let (up, _dir, srv) = setup("");
    let n = 200_000;
    let source = object(0, n);
    let t = format!("/obj/ifrange?size={n}");
    let r = fetch(&srv.url(&t), &["-H", "Range: bytes=0-9", "-H", "If-Range: \"other\""]);
    assert_eq!((r.status, sha256(&r.body)), (200, sha256(&source)));
    let r = fetch(&srv.url(&t), &["-H", "Range: bytes=0-9", "-H", "If-Range: \"ifrange-0\""]);
    assert_part(&r, &source, 0..10, "a matching If-Range");
    assert_eq!(cache_status(&r), "ktlsd; hit");
    assert_eq!(asked(&up, &t), ["-"]);
}
