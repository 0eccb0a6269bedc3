//! Many connections on the real binary: what an idle keep-alive connection
//! costs in memory over HTTP/1.1 and HTTP/2 (its record-layer buffers go back to
//! the worker after each response; HTTP/2 also drops its read buffer and stream
//! table while idle), and the per-worker connection cap (`--max-connections`) refusing
//! extra connections and admitting new ones once others have closed.
//! Thousands of connections are the `scale` bench's job (bench/run scale); these
//! use a few hundred.

use std::time::{Duration, Instant};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// A 100 KiB file: its response fills the userspace plaintext and output buffers.
fn body() -> Vec<u8> {
    (0..100 * 1024).map(|i| (i % 251) as u8).collect()
}

/// Opens `n` connections, each fetching `/big.bin` once and then left idle.
fn idle_clients(srv: &Server, n: usize, want: &[u8]) -> Vec<TlsClient> {
    (0..n)
        .map(|_| {
            let mut c = TlsClient::connect(srv.addr());
            let r = c.get("/big.bin");
            assert_eq!((r.status, r.body.len()), (200, want.len()));
            c
        })
        .collect()
}

/// Idle keep-alive connections hold no record-layer buffer: 300 of them, each
/// after a 100 KiB response, grow the server by well under the 150 KiB each
/// that per-connection input, output and plaintext buffers took; and when they
/// are gone, as many again take no more memory (the buffers are reused).
#[test]
fn idle_connections_hold_no_buffers() {
    const N: usize = 300;
    const MAX_KIB_PER_CONNECTION: u64 = 40;
    let big = body();
    let srv = Server::builder(BIN).file("big.bin", &big).workers(Some(1)).no_access_log().bin_from_env().start();
    // Warm up: the worker's pools and the open-file cache exist before the baseline.
    drop(idle_clients(&srv, 4, &big));
    let before = rss_kib(srv.pid());
    let clients = idle_clients(&srv, N, &big);
    std::thread::sleep(Duration::from_millis(300));
    let with = rss_kib(srv.pid());
    let per = with.saturating_sub(before) / N as u64;
    assert!(per <= MAX_KIB_PER_CONNECTION, "{per} KiB per idle connection (RSS {before} -> {with} KiB)");
    drop(clients);
    std::thread::sleep(Duration::from_millis(500));
    let again = idle_clients(&srv, N, &big);
    let after = rss_kib(srv.pid());
    assert!(
        after <= with + with / 10,
        "a second round of {N} idle connections grew the server from {with} to {after} KiB: memory was not returned"
    );
    drop(again);
}

/// An HTTP/2 client on a new connection: preface, empty SETTINGS, then `GET /small.txt`
/// on stream 1, read until that stream's last frame. The connection is left open.
fn h2_get_small(srv: &Server) -> TlsClient {
    let mut cfg = (*client_config(&[&rustls::version::TLS13])).clone();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let mut c = TlsClient::connect_with(srv.addr(), std::sync::Arc::new(cfg)).expect("TLS connect");
    assert_eq!(c.tls.conn.alpn_protocol(), Some(&b"h2"[..]), "ALPN did not choose h2");
    // :method GET, :scheme https, :path as a literal (static name 4), :authority localhost.
    let mut fields = vec![0x82, 0x87, 0x04, 10];
    fields.extend_from_slice(b"/small.txt");
    fields.extend_from_slice(&[0x41, 9]);
    fields.extend_from_slice(b"localhost");
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&[0, 0, fields.len() as u8, 1, 0x05, 0, 0, 0, 1]);
    out.extend_from_slice(&fields);
    c.send(&out);
    loop {
        if frames_end_of_stream_1(c.pending()).is_some() {
            return c;
        }
        assert!(matches!(c.poll_read(Duration::from_secs(10)), Ok(Some(n)) if n > 0), "no answer on stream 1");
    }
}

/// Where the frame that ends stream 1 (END_STREAM on HEADERS or DATA) finishes in `buf`.
fn frames_end_of_stream_1(buf: &[u8]) -> Option<usize> {
    let mut at = 0;
    while buf.len() >= at + 9 {
        let len = usize::from(buf[at]) << 16 | usize::from(buf[at + 1]) << 8 | usize::from(buf[at + 2]);
        let (typ, flags) = (buf[at + 3], buf[at + 4]);
        let stream = u32::from_be_bytes([buf[at + 5], buf[at + 6], buf[at + 7], buf[at + 8]]) & 0x7fff_ffff;
        if buf.len() < at + 9 + len {
            return None;
        }
        at += 9 + len;
        if stream == 1 && (typ == 0 || typ == 1) && flags & 1 == 1 {
            return Some(at);
        }
    }
    None
}

/// An idle HTTP/2 connection keeps no read buffer, stream table or room for the
/// handshake: 300 of them, each after one answered request, grow the server by
/// less than the 30 KiB each took when it kept them.
#[test]
fn idle_http2_connections_release_their_state() {
    const N: usize = 300;
    const MAX_KIB_PER_CONNECTION: u64 = 26;
    let srv = Server::builder(BIN)
        .file("small.txt", "hello\n".repeat(20))
        .workers(Some(1))
        .no_access_log()
        .bin_from_env()
        .start();
    drop((0..4).map(|_| h2_get_small(&srv)).collect::<Vec<_>>());
    let before = rss_kib(srv.pid());
    let clients: Vec<TlsClient> = (0..N).map(|_| h2_get_small(&srv)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let with = rss_kib(srv.pid());
    let per = with.saturating_sub(before) / N as u64;
    assert!(per <= MAX_KIB_PER_CONNECTION, "{per} KiB per idle HTTP/2 connection (RSS {before} -> {with} KiB)");
    drop(clients);
}

/// With `--max-connections 5` on one worker, the sixth connection is closed at
/// once (the handshake fails), counted and logged; once one connection ends, a
/// new one is served.
#[test]
fn max_connections_refuses_extra_then_admits() {
    let big = body();
    let srv = Server::builder(BIN).file("big.bin", &big).workers(Some(1)).args(["--max-connections", "5"]).start();
    let mut held = idle_clients(&srv, 5, &big);
    let refused = TlsClient::connect_with(srv.addr(), client_config(&[&rustls::version::TLS13]));
    assert!(refused.is_err(), "a sixth connection was served over --max-connections 5");
    assert!(
        srv.wait_stderr("max_connections 5", Duration::from_secs(5)).is_some(),
        "no refusal logged: {}",
        srv.stderr()
    );
    // A held connection ends; the worker notices the close and frees its slot.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    let admitted = loop {
        match TlsClient::connect_with(srv.addr(), client_config(&[&rustls::version::TLS13])) {
            Ok(mut c) => break c.get("/big.bin"),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("no connection admitted after one of five closed: {e}"),
        }
    };
    assert_eq!((admitted.status, admitted.body.len()), (200, big.len()));
    drop(held);
    let stopped = srv.stop();
    assert!(stopped.stat("connections_refused") >= 1, "refusals not counted");
}

/// A cap of 0 is refused at start-up with a one-line error.
#[test]
fn max_connections_zero_is_a_startup_error() {
    let exited = Server::builder(BIN).args(["--max-connections", "0"]).run_to_exit();
    exited.assert_startup_error(&["max_connections must be at least 1"]);
}
