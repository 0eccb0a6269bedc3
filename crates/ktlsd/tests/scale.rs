//! Many connections on the real binary: what an idle keep-alive connection
//! costs in memory (its record-layer buffers go back to the worker after each
//! response), and the per-worker connection cap (`--max-connections`) refusing
//! extra connections and admitting new ones once others have closed.
//! Thousands of connections are the `scale` bench's job (bench/run scale); these
//! use a few hundred.

use std::time::{Duration, Instant};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("VmRSS value")
}

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
