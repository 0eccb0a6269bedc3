//! `open_file_cache_valid` through a real client: a cached file's length and times
//! are trusted for the interval, and read again once it ends. (Without the option
//! a change is seen by the very next request: `http.rs` holds the server to that.)

use std::time::{Duration, Instant};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

#[test]
fn a_change_is_seen_after_the_interval_and_not_before() {
    let srv = Server::builder(BIN).file("a.txt", b"hello\n").args(["--open-file-cache-valid", "2"]).start();
    let mut c = TlsClient::connect(srv.addr());
    let first = c.get("/a.txt");
    assert_eq!((first.status, first.content_length()), (200, Some(6)));
    let changed = Instant::now();
    srv.write("a.txt", b"rewritten in place, longer\n");
    let stale = c.get("/a.txt");
    // The entry was bound by the first request, at most this long before the change.
    assert!(changed.elapsed() < Duration::from_millis(1500), "the machine is too slow for this test");
    assert_eq!(stale.content_length(), Some(6), "the new length was read within the interval");
    std::thread::sleep(Duration::from_millis(2200).saturating_sub(changed.elapsed()));
    let fresh = c.get("/a.txt");
    assert_eq!(fresh.content_length(), Some(27), "the change was not seen after the interval");
    assert_eq!(fresh.body, b"rewritten in place, longer\n");
}

#[test]
fn an_interval_over_an_hour_stops_start_up() {
    Server::builder(BIN)
        .args(["--open-file-cache-valid", "3601"])
        .run_to_exit()
        .assert_startup_error(&["open_file_cache_valid 3601", "expected 0 to 3600 seconds"]);
}
