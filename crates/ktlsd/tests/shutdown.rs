//! Stopping: SIGTERM/SIGINT close the listeners at once, let in-flight responses
//! finish within --shutdown-timeout, and exit 0 with the final counters.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

fn split_head(data: &[u8]) -> (RawResponse, &[u8]) {
    let end = find(data, b"\r\n\r\n").expect("a response head") + 4;
    let (version, status, headers) = parse_head(&String::from_utf8_lossy(&data[..end]));
    (RawResponse { version, status, headers, body: Vec::new() }, &data[end..])
}

#[test]
fn sigterm_lets_an_inflight_download_finish() {
    let srv = Server::builder(BIN).args(["--shutdown-timeout", "20"]).start();
    let path = srv.root().join("big.bin");
    write_big_file(&path, 32 << 20);
    let want = std::fs::read(&path).unwrap();

    let mut c = TlsClient::connect(srv.addr());
    c.send(get_request("/big.bin").as_bytes());
    // Take the head and a little of the body, then stop reading: the server is
    // now blocked mid-response.
    let mut first = c.read_exact_bytes(4096).unwrap();
    std::thread::sleep(Duration::from_millis(200));

    srv.signal(libc::SIGTERM);
    assert!(srv.wait_stderr("stopping:", Duration::from_secs(10)).is_some(), "{}", srv.stderr());
    assert!(wait_connect_refused(srv.addr(), Duration::from_secs(5)), "new connections still accepted after SIGTERM");

    let (rest, how) = c.read_until_close();
    first.extend_from_slice(&rest);
    let (head, body) = split_head(&first);
    assert_eq!(head.status, 200);
    assert_eq!(head.content_length(), Some(32 << 20));
    assert_eq!(body.len(), want.len(), "download cut short by the shutdown");
    assert!(body == want.as_slice(), "download corrupted across the shutdown");
    assert_eq!(how, Closing::CloseNotify, "the connection must end cleanly after the response");

    let st = srv.wait_exit(Duration::from_secs(25));
    st.assert_clean_exit();
    assert!(st.stderr.contains("stopped: "), "{}", st.stderr);
    // (Probes of the listener may have been accepted in the moment before it closed.)
    assert!(st.stat("connections") >= 1);
    assert_eq!(st.stat("errors"), 0);
    assert!(!st.stderr.contains("still busy"), "{}", st.stderr);
}

#[test]
fn sigterm_during_curl_download() {
    let srv = Server::builder(BIN).args(["--shutdown-timeout", "30"]).start();
    let path = srv.root().join("big.bin");
    let want = write_big_file(&path, 12 << 20);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.bin");
    // About 3 s at 4 MiB/s: certainly still running when SIGTERM arrives.
    let mut child = Command::new("curl")
        .args(["-sS", "-k", "--http1.1", "--max-time", "60", "--limit-rate", "4M", "-o"])
        .arg(&out)
        .arg(srv.url("/big.bin"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("curl");
    // Wait until bytes are flowing.
    let t = Instant::now();
    while std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0) < (1 << 20) {
        assert!(t.elapsed() < Duration::from_secs(20), "download did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    srv.signal(libc::SIGTERM);
    assert!(srv.wait_stderr("stopping:", Duration::from_secs(10)).is_some());
    assert!(wait_connect_refused(srv.addr(), Duration::from_secs(5)), "listener still open after SIGTERM");
    let status = child.wait().expect("curl wait");
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "curl failed across the shutdown: {status:?} {err}");
    assert_eq!(sha256_file(&out), want, "download differs");
    let st = srv.wait_exit(Duration::from_secs(30));
    st.assert_clean_exit();
    assert_eq!(st.stat("errors"), 0, "{}", st.stderr);
    let log = std::fs::read_to_string(st.dir.as_ref().unwrap().path().join("access.log")).unwrap();
    assert!(log.contains("\"GET /big.bin HTTP/1.1\" 200 12582912 "), "{log}");
}

#[test]
fn sigint_stops_too() {
    let srv = Server::builder(BIN).file("a.txt", b"a").start();
    assert_eq!(fetch(&srv.url("/a.txt"), &[]).body, b"a");
    srv.signal(libc::SIGINT);
    let st = srv.wait_exit(Duration::from_secs(20));
    st.assert_clean_exit();
    assert!(st.stderr.contains("stopping:"), "{}", st.stderr);
    assert_eq!(st.stat("connections"), 1);
}

#[test]
fn stopped_line_has_every_counter() {
    let srv = Server::builder(BIN).file("a.txt", b"a").start();
    assert_eq!(fetch(&srv.url("/a.txt"), &[]).body, b"a");
    let st = srv.stop();
    st.assert_clean_exit();
    assert!(st.took < Duration::from_secs(5), "an idle server took {:?} to stop", st.took);
    for c in ["connections", "handshake_failures", "handshake_timeouts", "ktls", "userspace", "timeouts", "errors"] {
        st.stat(c);
    }
    assert_eq!(st.stat("connections"), 1);
    assert_eq!(st.stat("ktls") + st.stat("userspace"), 1);
    assert_eq!(st.stat("handshake_failures") + st.stat("timeouts") + st.stat("errors"), 0);
}

#[test]
fn shutdown_timeout_bounds_a_stalled_client() {
    let srv = Server::builder(BIN).args(["--shutdown-timeout", "1"]).start();
    write_big_file(&srv.root().join("big.bin"), 32 << 20);
    let mut c = TlsClient::connect(srv.addr());
    c.set_recv_buffer(64 * 1024);
    c.send(get_request("/big.bin").as_bytes());
    let _ = c.read_exact_bytes(1000).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let st = srv.stop();
    st.assert_clean_exit();
    assert!(st.took >= Duration::from_millis(900), "did not wait for the in-flight response: {:?}", st.took);
    assert!(st.took < Duration::from_secs(6), "--shutdown-timeout 1 took {:?}", st.took);
    assert!(st.stderr.contains("still busy after the shutdown timeout"), "{}", st.stderr);
    // The client can tell its download was cut: no close_notify.
    let (data, how) = c.read_until_close();
    assert!(data.len() < 32 << 20);
    assert!(matches!(how, Closing::Eof | Closing::Reset), "{how:?}");
}

#[test]
fn idle_connections_do_not_delay_shutdown() {
    let srv = Server::builder(BIN).file("a.txt", b"a").args(["--shutdown-timeout", "20"]).start();
    let mut used = TlsClient::connect(srv.addr());
    assert_eq!(used.get("/a.txt").body, b"a");
    let mut fresh = TlsClient::connect(srv.addr());
    let st = srv.stop();
    st.assert_clean_exit();
    assert!(st.took < Duration::from_secs(5), "idle keep-alive connections held the shutdown for {:?}", st.took);
    for c in [&mut used, &mut fresh] {
        let (rest, how) = c.read_until_close();
        assert!(rest.is_empty());
        assert!(matches!(how, Closing::CloseNotify | Closing::Eof), "{how:?}");
    }
    assert_eq!(st.stat("connections"), 2);
}

#[test]
fn partial_request_at_shutdown_is_not_left_hanging() {
    let srv =
        Server::builder(BIN).file("a.txt", b"a").args(["--shutdown-timeout", "2", "--header-timeout", "30"]).start();
    let mut c = TlsClient::connect(srv.addr());
    c.send(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n");
    std::thread::sleep(Duration::from_millis(200));
    let st = srv.stop();
    st.assert_clean_exit();
    assert!(st.took < Duration::from_secs(8), "{:?}", st.took);
    let (_, how) = c.read_until_close();
    assert_ne!(how, Closing::TimedOut);
}
