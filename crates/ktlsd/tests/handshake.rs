//! The TLS handshake path against every kind of input, over real sockets to the
//! real binary: malformed and mutated ClientHellos (no panic, nothing leaked, a
//! prompt shutdown), handshake messages spanning several records, the alert a
//! refused client gets, failed handshakes counted and logged by reason, and
//! plain HTTP sent to the TLS port.
//!
//! `KTLSD_BIN` runs another server binary (e.g. an older build, to see these
//! tests fail against it).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::crypto::aws_lc_rs::cipher_suite as cs;
use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const F_TXT: &str = "the quick brown fox\n";
/// A shutdown timeout long enough that a connection task left counted would show
/// as a slow stop.
const LONG_SHUTDOWN: &str = "60";
/// How fast a server with no connection left must stop.
const PROMPT: Duration = Duration::from_secs(5);

fn server(args: &[&str]) -> Server {
    Server::builder(BIN).bin_from_env().file("f.txt", F_TXT).args(args).start()
}

fn tls12_and_13() -> Arc<rustls::ClientConfig> {
    client_config(&[&rustls::version::TLS13, &rustls::version::TLS12])
}

/// Connects, writes `bytes` (the server may close before all are written), ends
/// our side, and reads the answer until the server closes.
fn send_raw(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect");
    let _ = s.write_all(bytes);
    let _ = s.shutdown(Shutdown::Write);
    let (got, closed) = read_raw_until_closed(&mut s, Duration::from_secs(10));
    assert!(closed, "the server kept the connection open after {} input bytes", bytes.len());
    got
}

/// The server still serves a normal request, then stops promptly and cleanly.
#[track_caller]
fn assert_serves_then_stops_promptly(srv: Server) -> Stopped {
    assert_eq!(fetch(&srv.url("/f.txt"), &[]).body, F_TXT.as_bytes(), "a normal request after the bad inputs");
    let st = srv.stop();
    st.assert_clean_exit();
    assert!(!st.stderr.contains("panicked"), "the server panicked:\n{}", st.stderr);
    assert_eq!(st.stat("panics"), 0, "{}", st.stderr);
    assert!(
        st.took < PROMPT,
        "SIGTERM took {:?} (shutdown timeout {LONG_SHUTDOWN} s): a connection was left counted",
        st.took
    );
    st
}

// ---------------------------------------------------------------------------
// Malformed input: no panic, nothing leaked.
// ---------------------------------------------------------------------------

/// A record holding a ClientHello header that announces 64 KiB in a 4-byte record.
const NINE_BYTES: [u8; 9] = [0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x01, 0x00, 0x00];

#[test]
fn nine_byte_client_hello_is_refused_without_panic() {
    let srv = server(&["--shutdown-timeout", LONG_SHUTDOWN]);
    for _ in 0..3 {
        send_raw(srv.addr(), &NINE_BYTES);
    }
    let st = assert_serves_then_stops_promptly(srv);
    assert_eq!(st.stat("handshake_protocol_errors"), 3, "{}", st.stderr);
    assert_eq!(st.stat("connections"), 4);
}

/// Seeded xorshift64*: the same inputs on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Offsets and widths of the length fields of a one-record ClientHello: record,
/// handshake message, session id, cipher suites, compression methods, the
/// extensions block and each extension.
fn length_fields(ch: &[u8]) -> Vec<(usize, usize)> {
    let mut f = vec![(3, 2), (6, 3)];
    let get = |at: usize, w: usize| ch.get(at..at + w).map(|b| b.iter().fold(0usize, |a, &x| a << 8 | x as usize));
    let mut at = 9 + 2 + 32;
    for w in [1, 2, 1] {
        let Some(n) = get(at, w) else { return f };
        f.push((at, w));
        at += w + n;
    }
    if get(at, 2).is_none() {
        return f;
    }
    f.push((at, 2));
    at += 2;
    while let Some(n) = get(at + 2, 2) {
        f.push((at + 2, 2));
        at += 4 + n;
    }
    f
}

/// One deterministic mutation of `base`: bit flips, truncation, a length field
/// edit, inserted or deleted bytes (or two of them).
fn mutate(base: &[u8], fields: &[(usize, usize)], rng: &mut Rng) -> Vec<u8> {
    let mut m = base.to_vec();
    let rounds = 1 + rng.below(3) / 2;
    for _ in 0..rounds {
        match rng.below(5) {
            0 => {
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(m.len());
                    m[i] ^= 1 << rng.below(8);
                }
            }
            1 => m.truncate(1 + rng.below(m.len())),
            2 => {
                let (at, w) = fields[rng.below(fields.len())];
                if at + w <= m.len() {
                    let old = m[at..at + w].iter().fold(0u64, |a, &x| a << 8 | x as u64);
                    let max = (1u64 << (8 * w)) - 1;
                    let new = match rng.below(6) {
                        0 => 0,
                        1 => old.wrapping_sub(1) & max,
                        2 => (old + 1) & max,
                        3 => max,
                        4 => old / 2,
                        _ => rng.next() & max,
                    };
                    for k in 0..w {
                        m[at + k] = (new >> (8 * (w - 1 - k))) as u8;
                    }
                }
            }
            3 => {
                let i = rng.below(m.len() + 1);
                let extra: Vec<u8> = (0..1 + rng.below(8)).map(|_| rng.next() as u8).collect();
                m.splice(i..i, extra);
            }
            _ => {
                let i = rng.below(m.len());
                let end = (i + 1 + rng.below(16)).min(m.len());
                m.drain(i..end);
            }
        }
        if m.is_empty() {
            m.push(0x16);
        }
    }
    m
}

/// `ch` (one record) re-framed as records of at most `frag` body bytes each.
fn reframe(ch: &[u8], frag: usize) -> Vec<u8> {
    let body = &ch[5..];
    let mut out = Vec::new();
    for chunk in body.chunks(frag) {
        out.extend_from_slice(&[0x16, 0x03, 0x03]);
        out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

#[test]
fn mutated_client_hellos_never_panic_or_leak() {
    const INPUTS: usize = 4000;
    const THREADS: usize = 8;
    let srv = server(&["--shutdown-timeout", LONG_SHUTDOWN, "--handshake-timeout", "5"]);
    let ch13 = client_hello(tls12_and_13());
    let ch12 = client_hello(client_config(&[&rustls::version::TLS12]));
    assert_eq!(tls_records(&ch13).len(), 1, "the rustls ClientHello should be one record");
    /// An input to mutate and the length fields in it.
    type Base = (Vec<u8>, Vec<(usize, usize)>);
    let bases: Arc<Vec<Base>> = Arc::new(vec![
        (ch13.clone(), length_fields(&ch13)),
        (ch12.clone(), length_fields(&ch12)),
        // The same ClientHello over several records, with length fields edited in the first one.
        (reframe(&ch13, 100), length_fields(&ch13[..105])),
    ]);
    assert!(bases[0].1.len() >= 8, "ClientHello parse found only {:?}", bases[0].1);

    let addr = srv.addr();
    let started = Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let bases = bases.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(0x5EED_0000 + t as u64);
                for i in (t..INPUTS).step_by(THREADS) {
                    let (base, fields) = &bases[i % bases.len()];
                    let input = if i == t { NINE_BYTES.to_vec() } else { mutate(base, fields, &mut rng) };
                    send_raw(addr, &input);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("fuzz thread");
    }
    let took = started.elapsed();
    println!("{INPUTS} mutated ClientHellos over {THREADS} threads in {took:?}");

    let st = assert_serves_then_stops_promptly(srv);
    assert_eq!(st.stat("connections"), INPUTS as u64 + 1);
    assert!(st.stat("handshake_failures") >= INPUTS as u64 * 9 / 10, "{}", st.stderr);
}

// ---------------------------------------------------------------------------
// Handshake messages spanning records.
// ---------------------------------------------------------------------------

#[test]
fn s_client_max_send_frag_512_completes_a_request() {
    let srv = server(&[]);
    for version in ["-tls1_3", "-tls1_2"] {
        // A long ALPN list makes the ClientHello span several 512-byte records.
        let alpn = format!(
            "http/1.1,{}",
            (0..40).map(|i| format!("proto-{i:02}-{}", "x".repeat(20))).collect::<Vec<_>>().join(",")
        );
        let o = s_client_output(
            srv.addr(),
            &["-quiet", version, "-max_send_frag", "512", "-alpn", &alpn],
            b"GET /f.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            Duration::from_secs(30),
        );
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.starts_with("HTTP/1.1 200 ") && out.ends_with(F_TXT),
            "{version}: {out:?}; stderr: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let st = srv.stop();
    assert_eq!(st.stat("handshake_failures"), 0, "{}", st.stderr);
}

/// A ClientHello over 16 KiB (a long ALPN list), which rustls sends as two records.
fn big_hello_config(
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn_len: usize,
) -> Arc<rustls::ClientConfig> {
    let mut cfg = (*client_config(versions)).clone();
    cfg.alpn_protocols = (0..alpn_len).map(|i| format!("p{i:03}-{}", "y".repeat(200)).into_bytes()).collect();
    cfg.alpn_protocols.push(b"http/1.1".to_vec());
    Arc::new(cfg)
}

#[test]
fn client_hello_over_16k_completes() {
    let srv = server(&[]);
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let cfg = big_hello_config(&[version], 120);
        let ch = client_hello(cfg.clone());
        assert!(ch.len() > 16384 + 5 && tls_records(&ch).len() >= 2, "ClientHello of {} bytes", ch.len());
        let mut c = TlsClient::connect_with(srv.addr(), cfg).unwrap_or_else(|e| panic!("{:?}: {e}", version.version));
        let r = c.get("/f.txt");
        assert_eq!((r.status, r.body_str().as_str()), (200, F_TXT));
    }
    let st = srv.stop();
    assert_eq!(st.stat("handshake_failures"), 0, "{}", st.stderr);
}

/// A handshake message announced at 64 KiB and sent one byte per record: rustls
/// keeps every record until the message is whole, so the buffer bound ends it.
#[test]
fn handshake_buffer_is_bounded() {
    let srv = server(&["--shutdown-timeout", LONG_SHUTDOWN]);
    let mut input = vec![0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x00, 0xff, 0xf0];
    for i in 0..20_000u32 {
        input.extend_from_slice(&[0x16, 0x03, 0x03, 0x00, 0x01, i as u8]);
    }
    send_raw(srv.addr(), &input);
    let st = assert_serves_then_stops_promptly(srv);
    assert_eq!(st.stat("handshake_protocol_errors"), 1, "{}", st.stderr);
    assert!(st.stderr.contains("exceeds the 83976-byte limit"), "{}", st.stderr);
}

// ---------------------------------------------------------------------------
// The alert a refused client gets.
// ---------------------------------------------------------------------------

/// A server offering one TLS 1.3 and one TLS 1.2 suite.
fn narrow_server() -> Server {
    server(&["--cipher-suites", "TLS_AES_128_GCM_SHA256,ECDHE-ECDSA-AES128-GCM-SHA256"])
}

#[test]
fn no_common_suite_gets_a_plaintext_handshake_failure_alert() {
    let srv = narrow_server();
    for (version, suite) in [
        (&rustls::version::TLS12, cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384),
        (&rustls::version::TLS13, cs::TLS13_AES_256_GCM_SHA384),
    ] {
        let reply = send_raw(srv.addr(), &client_hello(client_config_with(&[version], Some(suite))));
        assert_eq!(
            tls_records(&reply),
            vec![(0x15, vec![2, 40])],
            "{:?}: want exactly one fatal handshake_failure alert, got {reply:02x?}",
            version.version
        );
    }
    let st = srv.stop();
    assert_eq!(st.stat("handshake_protocol_errors"), 2, "{}", st.stderr);
    assert!(st.stderr.contains("sent alert HandshakeFailure (40)"), "{}", st.stderr);
}

/// The client offers no protocol the server speaks. TLS 1.3 refuses it after the
/// ServerHello, so the reply is the ServerHello, ChangeCipherSpec and an
/// encrypted alert: the client can read it only if all of it arrives.
#[test]
fn alpn_mismatch_gets_a_complete_alert() {
    let srv = server(&[]);
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let mut cfg = (*client_config(&[version])).clone();
        cfg.alpn_protocols = vec![b"spdy/3.1".to_vec()];
        let cfg = Arc::new(cfg);
        let err = match TlsClient::connect_with(srv.addr(), cfg.clone()) {
            Ok(_) => panic!("{:?}: the handshake succeeded without a common protocol", version.version),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("NoApplicationProtocol"), "{:?}: the client saw {err}", version.version);
        let reply = tls_records(&send_raw(srv.addr(), &client_hello(cfg)));
        let types: Vec<u8> = reply.iter().map(|r| r.0).collect();
        if version == &rustls::version::TLS13 {
            assert_eq!(types, vec![0x16, 0x14, 0x17], "ServerHello, ChangeCipherSpec, encrypted alert");
        } else {
            assert_eq!(reply, vec![(0x15, vec![2, 120])], "a plaintext no_application_protocol alert");
        }
    }
    let st = srv.stop();
    assert_eq!(st.stat("handshake_protocol_errors"), 4, "{}", st.stderr);
    assert!(st.stderr.contains("sent an encrypted alert"), "{}", st.stderr);
}

// ---------------------------------------------------------------------------
// Failed handshakes counted and logged by reason.
// ---------------------------------------------------------------------------

#[test]
fn failed_handshakes_are_counted_and_logged_by_reason() {
    let srv = server(&[
        "--handshake-timeout",
        "1",
        "--cipher-suites",
        "TLS_AES_128_GCM_SHA256,ECDHE-ECDSA-AES128-GCM-SHA256",
    ]);
    let addr = srv.addr();
    let mut expect: Vec<(SocketAddr, &str)> = Vec::new();

    // Timeout: half a record header, then silence.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&[0x16, 0x03]).unwrap();
    assert!(read_raw_until_closed(&mut s, Duration::from_secs(10)).1);
    expect.push((s.local_addr().unwrap(), "timeout"));

    // Protocol error: no common suite.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&client_hello(client_config_with(
        &[&rustls::version::TLS12],
        Some(cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384),
    )))
    .unwrap();
    assert!(read_raw_until_closed(&mut s, Duration::from_secs(10)).1);
    expect.push((s.local_addr().unwrap(), "protocol error"));

    // Client alert: a ClientHello, then a fatal alert.
    let mut s = TcpStream::connect(addr).unwrap();
    let mut bytes = client_hello(client_config(&[&rustls::version::TLS12]));
    bytes.extend_from_slice(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 46]); // certificate_unknown
    s.write_all(&bytes).unwrap();
    assert!(read_raw_until_closed(&mut s, Duration::from_secs(10)).1);
    expect.push((s.local_addr().unwrap(), "client alert"));

    // Reset: half a ClientHello, then an orderly close; then one with a TCP reset.
    let ch = client_hello(tls12_and_13());
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&ch[..ch.len() / 2]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert!(read_raw_until_closed(&mut s, Duration::from_secs(10)).1);
    expect.push((s.local_addr().unwrap(), "reset"));
    let s = socket2::Socket::from(TcpStream::connect(addr).unwrap());
    let local = s.local_addr().unwrap().as_socket().unwrap();
    let mut s = TcpStream::from(s);
    s.write_all(&ch[..ch.len() / 2]).unwrap();
    socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO)).unwrap();
    drop(s);
    expect.push((local, "reset"));

    // Plain HTTP.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(read_raw_until_closed(&mut s, Duration::from_secs(10)).1);
    expect.push((s.local_addr().unwrap(), "plain http"));

    for (peer, reason) in &expect {
        let needle = format!("handshake with {peer} failed ({reason})");
        assert!(
            srv.wait_stderr(&needle, Duration::from_secs(10)).is_some(),
            "no INFO line {needle:?}:\n{}",
            srv.stderr()
        );
    }
    let st = srv.stop();
    st.assert_clean_exit();
    for (name, n) in [
        ("handshake_timeouts", 1),
        ("handshake_protocol_errors", 1),
        ("handshake_client_alerts", 1),
        ("handshake_resets", 2),
        ("handshake_plain_http", 1),
        ("handshake_failures", 6),
        ("connections", 6),
    ] {
        assert_eq!(st.stat(name), n, "{name}:\n{}", st.stderr);
    }
    assert!(st.stderr.contains("sent alert HandshakeFailure (40)"), "{}", st.stderr);
    assert!(st.stderr.contains("fatal alert: CertificateUnknown"), "{}", st.stderr);
}

#[test]
fn failed_handshake_lines_are_rate_limited() {
    const N: usize = 40;
    let srv = server(&[]);
    let started = Instant::now();
    for _ in 0..N {
        send_raw(srv.addr(), &NINE_BYTES);
    }
    let took = started.elapsed();
    let st = srv.stop();
    assert_eq!(st.stat("handshake_failures"), N as u64);
    let logged = st.stderr.lines().filter(|l| l.contains(" INFO handshake with ")).count();
    let suppressed: usize = st
        .stderr
        .lines()
        .filter_map(|l| l.split(" INFO ").nth(1))
        .filter(|l| l.contains("more failed handshake(s) not logged"))
        .map(|l| l.split_whitespace().next().and_then(|n| n.parse::<usize>().ok()).unwrap_or(0))
        .sum();
    assert_eq!(logged + suppressed, N, "every failure is either logged or counted as suppressed:\n{}", st.stderr);
    let windows = took.as_secs() as usize + 1;
    assert!(logged <= 10 * windows, "{logged} lines in {took:?}:\n{}", st.stderr);
    assert!(suppressed > 0, "{N} failures in {took:?} should exceed 10 lines per second:\n{}", st.stderr);
}

// ---------------------------------------------------------------------------
// Plain HTTP on the TLS port.
// ---------------------------------------------------------------------------

const PLAIN_HTTP_TEXT: &str = "The plain HTTP request was sent to HTTPS port";

#[test]
fn plain_http_gets_a_readable_400() {
    let srv = server(&[]);
    let r = fetch(&format!("http://{}/f.txt", srv.addr()), &[]);
    assert_eq!(r.status, 400, "{}", r.stderr);
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(r.header("content-type"), Some("text/html"));
    assert!(r.body_str().contains(PLAIN_HTTP_TEXT), "{}", r.body_str());

    for request in [
        &b"GET /f.txt HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HEAD / HTTP/1.0\r\n\r\n",
    ] {
        let got = send_raw(srv.addr(), request);
        let (resp, used) = parse_response(&got, false).unwrap_or_else(|| panic!("no complete response: {got:?}"));
        assert_eq!(used, got.len(), "bytes after the 400");
        assert_eq!(resp.status, 400);
        assert!(resp.header("date").is_some_and(|d| httpdate::parse_http_date(d).is_ok()), "no Date: {got:?}");
        assert!(resp.body_str().contains(PLAIN_HTTP_TEXT));
        assert!(!got.windows(F_TXT.len()).any(|w| w == F_TXT.as_bytes()), "leaked the file in clear");
    }
    // Not an HTTP request line: no HTTP answer.
    for other in [&b"get / HTTP/1.1\r\n\r\n"[..], b"\x00\x01\x02\x03\x04\x05", b"GETX"] {
        let mut s = TcpStream::connect(srv.addr()).unwrap();
        s.write_all(other).unwrap();
        let _ = s.shutdown(Shutdown::Write);
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        assert!(!got.starts_with(b"HTTP"), "{other:?} got an HTTP answer: {got:?}");
    }
    let st = assert_serves_then_stops_promptly(srv);
    assert_eq!(st.stat("handshake_plain_http"), 4, "{}", st.stderr);
}
