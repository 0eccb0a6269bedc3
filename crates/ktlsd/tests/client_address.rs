//! The client's address behind a load balancer, with a real HAProxy in front.
//!
//! `trusted_proxies`, HAProxy in HTTP mode (`option forwardfor`) over TLS to ktlsd,
//! HTTP/1.1 and HTTP/2: the right-most untrusted address of X-Forwarded-For in the
//! log and in `[[access]]`, a spoofed entry at the left ignored, the same field from an
//! untrusted peer never read; the upstream's X-Forwarded-For ends with the proxy.
//!
//! The PROXY protocol, HAProxy in TCP mode (`send-proxy-v2` and `send-proxy`): the client's address from the header in the access log, in
//! `[[access]]` decisions and in the `X-Forwarded-For` an upstream receives, over
//! HTTP/1.1, HTTP/2 and the plain-HTTP port; and what is refused, each closing
//! the connection before any TLS byte: no header from a balancer, a header from
//! anybody else, a malformed or lying header, a header that never ends. A header
//! split across writes is taken whole.
//!
//! Clients come from other loopback addresses (`curl --interface 127.0.0.N`), so
//! the address a header names differs from the balancer's, 127.0.0.1.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::haproxy::Haproxy;
use testkit::origin::Origin;
use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// curl from `from` (a loopback address) for `url`: (status, body); status 0 when it failed.
fn get(from: &str, url: &str, extra: &[&str]) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sk", "--max-time", "10", "--interface", from, "-w", "\n%{http_code}"]).args(extra).arg(url);
    let out = run_with_timeout(&mut cmd, None, CLIENT_TIMEOUT);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.trim().parse().unwrap_or(0), body.to_string())
}

/// The access log's lines once it has at least `n` (the log is written in batches).
fn log_lines(srv: &Server, n: usize) -> Vec<String> {
    let path = srv.dir().join("access.log");
    let t = Instant::now();
    loop {
        let lines: Vec<String> =
            std::fs::read_to_string(&path).unwrap_or_default().lines().map(str::to_string).collect();
        if lines.len() >= n || t.elapsed() > Duration::from_secs(10) {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn server(origin: &Origin) -> Server {
    server_with(origin, r#"proxy_protocol_from = ["127.0.0.1"]"#)
}

fn server_with(origin: &Origin, trust: &str) -> Server {
    Server::builder(BIN)
        .file("index.txt", "static file")
        .file("private/x.txt", "private")
        .config(&format!(
            r#"
{trust}
handshake_timeout = "2s"
http_listen = ["127.0.0.1:0"]

[[access]]
path = "/private/*"
deny = ["127.0.0.5"]

[[proxy]]
path = "/api/*"
upstream = ["{}"]
"#,
            origin.url()
        ))
        .start()
}

#[test]
fn behind_an_http_proxy_the_client_is_the_right_most_untrusted_address() {
    let origin = Origin::start("o");
    let srv = server_with(&origin, r#"trusted_proxies = ["127.0.0.1"]"#);
    let lb = Haproxy::start_in(
        "http",
        &[("ssl verify none alpn http/1.1", srv.addr()), ("ssl verify none alpn h2", srv.addr())],
    );
    let mut requests = 0;
    for port in &lb.ports {
        let url = |p: &str| format!("http://127.0.0.1:{port}{p}");
        assert_eq!(get("127.0.0.5", &url("/index.txt"), &[]), (200, "static file".into()), "{port}");
        assert_eq!(get("127.0.0.5", &url("/private/x.txt"), &[]).0, 403, "{port}");
        // A client naming another address at the left of the list is not believed.
        assert_eq!(get("127.0.0.5", &url("/private/x.txt"), &["-H", "X-Forwarded-For: 127.0.0.6"]).0, 403, "{port}");
        assert_eq!(get("127.0.0.6", &url("/private/x.txt"), &[]).0, 200, "{port}");
        // The upstream gets the list as received, then the proxy the request came from.
        let (status, echo) = get("127.0.0.7", &url("/api/echo"), &[]);
        assert_eq!(status, 200, "{port}");
        assert!(echo.contains("127.0.0.7, 127.0.0.1"), "{echo}");
        requests += 5;
        let lines = log_lines(&srv, requests);
        let last: Vec<&str> = lines[lines.len() - 5..].iter().map(|l| l.split(' ').next().unwrap_or("")).collect();
        assert_eq!(last, ["127.0.0.5", "127.0.0.5", "127.0.0.5", "127.0.0.6", "127.0.0.7"], "{port}: {lines:?}");
    }
    // From a peer that is not trusted the field is never read, over either protocol.
    for proto in ["--http1.1", "--http2"] {
        let spoof = ["-H", "X-Forwarded-For: 127.0.0.9", proto];
        assert_eq!(get("127.0.0.5", &srv.url("/private/x.txt"), &spoof).0, 403, "{proto}");
        assert_eq!(get("127.0.0.2", &srv.url("/index.txt"), &spoof).0, 200, "{proto}");
    }
    let lines = log_lines(&srv, requests + 4);
    assert!(lines.iter().all(|l| !l.starts_with("127.0.0.9 ")), "{lines:?}");
    assert!(lines.last().is_some_and(|l| l.starts_with("127.0.0.2 ")), "{lines:?}");
}

#[test]
fn the_client_address_comes_from_haproxys_header() {
    let origin = Origin::start("o");
    let srv = server(&origin);
    let lb = Haproxy::start_in(
        "tcp",
        &[("send-proxy-v2", srv.addr()), ("send-proxy", srv.addr()), ("send-proxy-v2", srv.http_addrs()[0])],
    );
    let mut requests = 0;
    for port in &lb.ports[..2] {
        for proto in ["--http1.1", "--http2"] {
            let url = |p: &str| format!("https://127.0.0.1:{port}{p}");
            assert_eq!(get("127.0.0.5", &url("/index.txt"), &[proto]), (200, "static file".into()), "{port} {proto}");
            // [[access]] decides by the header's address: 127.0.0.5 is denied, 127.0.0.6 is not.
            assert_eq!(get("127.0.0.5", &url("/private/x.txt"), &[proto]).0, 403, "{port} {proto}");
            assert_eq!(get("127.0.0.6", &url("/private/x.txt"), &[proto]).0, 200, "{port} {proto}");
            // The upstream is told the client's address, not the balancer's.
            let (status, echo) = get("127.0.0.7", &url("/api/echo"), &[proto]);
            assert_eq!(status, 200, "{port} {proto}");
            assert!(echo.contains("127.0.0.7"), "{echo}");
            assert!(!echo.contains("127.0.0.1\""), "the balancer's address went upstream: {echo}");
            requests += 4;
            let lines = log_lines(&srv, requests);
            let last: Vec<&str> = lines[lines.len() - 4..].iter().map(|l| l.split(' ').next().unwrap_or("")).collect();
            assert_eq!(last, ["127.0.0.5", "127.0.0.5", "127.0.0.6", "127.0.0.7"], "{port} {proto}: {lines:?}");
        }
    }
    // The plain-HTTP port takes the header too.
    let plain = format!("http://127.0.0.1:{}/index.txt", lb.ports[2]);
    assert_eq!(get("127.0.0.8", &plain, &[]).0, 301);
    let lines = log_lines(&srv, requests + 1);
    assert!(lines.iter().any(|l| l.starts_with("127.0.0.8 ")), "{lines:?}");
}

/// Connects from `from` to `addr`, writes `pieces` with `pause` between them, then
/// reads what comes back until the server closes (or 5 s): the bytes and whether it closed.
fn exchange(from: &str, addr: SocketAddr, pieces: &[&[u8]], pause: Duration) -> (Vec<u8>, bool) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.bind(&format!("{from}:0").parse::<SocketAddr>().unwrap().into()).unwrap();
    socket.connect(&addr.into()).unwrap();
    let mut s: TcpStream = socket.into();
    for (i, p) in pieces.iter().enumerate() {
        if i > 0 {
            std::thread::sleep(pause);
        }
        let _ = s.write_all(p);
    }
    read_raw_until_closed(&mut s, Duration::from_secs(5))
}

/// A TLS 1.3 ClientHello's first record, enough for the server to answer with its own.
fn client_hello() -> Vec<u8> {
    let out = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(
            "import ssl,sys\nc=ssl.create_default_context();c.check_hostname=False;c.verify_mode=ssl.CERT_NONE\n\
             i,o=ssl.MemoryBIO(),ssl.MemoryBIO();s=c.wrap_bio(i,o,server_hostname='localhost')\n\
             try: s.do_handshake()\nexcept ssl.SSLWantReadError: pass\nsys.stdout.buffer.write(o.read())",
        )
        .output()
        .unwrap();
    assert!(out.stdout.len() > 100 && out.stdout[0] == 0x16, "{:?}", out.stdout);
    out.stdout
}

#[test]
fn headers_out_of_place_or_broken_close_the_connection() {
    let origin = Origin::start("o");
    let srv = server(&origin);
    let hello = client_hello();
    let tcp4 = |src: &str| format!("PROXY TCP4 {src} 127.0.0.1 40000 {}\r\n", srv.port()).into_bytes();
    let v1 = tcp4("192.0.2.9");
    // A server hello (a TLS handshake record) answers a well-formed header and hello,
    // its header split over two writes.
    let (got, _) = exchange("127.0.0.1", srv.addr(), &[&v1[..10], &v1[10..], &hello], Duration::from_millis(60));
    assert_eq!(got.first(), Some(&0x16), "{got:?}");
    let mut lying = b"\r\n\r\n\0\r\nQUIT\n\x21\x11\x00\x34\xc0\x00\x02\x09\x7f\x00\x00\x01\x9c\x40\x01\xbb".to_vec();
    lying.extend(b"GET / HTTP/1.1\r\nHost: a\r\nX-Pad: aaaaaaaaaaaaaa\r\n\r\n");
    let started = Instant::now();
    for (from, pieces, why) in [
        ("127.0.0.1", vec![hello.clone()], "no header from the balancer"),
        ("127.0.0.2", vec![v1.clone(), hello.clone()], "a header from a client not in proxy_protocol_from"),
        ("127.0.0.1", vec![b"PROXY TCP4 192.0.2.300 127.0.0.1 1 2\r\n".to_vec(), hello.clone()], "a malformed header"),
        ("127.0.0.1", vec![b"PROXY TCP4 192.0.2.9".to_vec()], "a header that never ends"),
        ("127.0.0.1", vec![lying], "a v2 header whose length takes in what follows"),
    ] {
        let (got, closed) =
            exchange(from, srv.addr(), &pieces.iter().map(Vec::as_slice).collect::<Vec<_>>(), Duration::ZERO);
        assert!(closed, "{why}: not closed");
        assert!(got.is_empty(), "{why}: the server answered {got:?}");
    }
    // The incomplete headers were given the handshake timeout (2 s), not more.
    assert!(started.elapsed() < Duration::from_secs(12), "{:?}", started.elapsed());
    // A client not in the list is served as ever.
    assert_eq!(get("127.0.0.2", &srv.url("/index.txt"), &[]).0, 200);
    for said in ["not in proxy_protocol_from", "malformed PROXY protocol header", "no whole PROXY protocol header"] {
        let t = Instant::now();
        while !srv.stderr().contains(said) {
            assert!(t.elapsed() < Duration::from_secs(5), "no log line says {said:?}:\n{}", srv.stderr());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
