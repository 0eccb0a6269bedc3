//! Request limits and misbehaving clients, through the raw rustls client: malformed
//! heads, oversized lines and headers, request bodies, slow and stalled clients,
//! clients that vanish mid-response. The table of malformed heads and body framing
//! runs in-process (`http::h1::tests`); these prove the limits on real connections.

use std::time::{Duration, Instant};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const A_TXT: &[u8] = b"alpha\n";

fn server(extra: &[&str]) -> Server {
    Server::builder(BIN).file("a.txt", A_TXT).file("b.txt", b"bravo\n").args(extra).start()
}

/// Sends `request`, expects one response with `status` followed by the server
/// closing the connection cleanly.
fn refused_then_closed(srv: &Server, request: &[u8], status: u16) -> RawResponse {
    let mut c = TlsClient::connect(srv.addr());
    c.send(request);
    let r = c.try_read_response(false).unwrap_or_else(|e| panic!("no {status} response: {e}"));
    assert_eq!(r.status, status, "request {:?}", String::from_utf8_lossy(&request[..request.len().min(200)]));
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    let (rest, how) = c.read_until_close();
    assert!(rest.is_empty(), "bytes after the {status}: {:?}", String::from_utf8_lossy(&rest));
    assert!(matches!(how, Closing::CloseNotify | Closing::Eof | Closing::Reset), "still open after {status}: {how:?}");
    r
}

fn assert_serving(srv: &Server) {
    let mut c = TlsClient::connect(srv.addr());
    let r = c.get("/a.txt");
    assert_eq!((r.status, r.body.as_slice()), (200, A_TXT));
}

// ---------------------------------------------------------------------------
// Malformed and oversized heads.
// ---------------------------------------------------------------------------

#[test]
fn malformed_header_line_is_400() {
    let srv = server(&[]);
    refused_then_closed(&srv, b"GET /a.txt HTTP/1.1\r\nHost x\r\n\r\n", 400);
    assert!(srv.wait_stderr(": 400 ", Duration::from_secs(5)).is_some(), "{}", srv.stderr());
    assert_serving(&srv);
}

#[test]
fn unsupported_http_version_is_refused() {
    let srv = server(&[]);
    let r = refused_then_closed(&srv, b"GET /a.txt HTTP/2.0\r\nHost: x\r\n\r\n", 505);
    assert_eq!(r.version, "HTTP/1.1");
}

#[test]
fn oversized_request_line_is_414() {
    let srv = server(&[]);
    let req = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(20 * 1024));
    refused_then_closed(&srv, req.as_bytes(), 414);
    assert!(srv.wait_stderr(": 414 ", Duration::from_secs(5)).is_some(), "{}", srv.stderr());
    assert_serving(&srv);
}

#[test]
fn long_request_line_within_limit_is_served() {
    let srv = server(&[]);
    // 15 KiB of query: under the 16 KiB head limit.
    let req = format!("GET /a.txt?{} HTTP/1.1\r\nHost: x\r\n\r\n", "q".repeat(15 * 1024));
    let mut c = TlsClient::connect(srv.addr());
    c.send(req.as_bytes());
    let r = c.read_response();
    assert_eq!((r.status, r.body.as_slice()), (200, A_TXT));
}

fn headers_of(total: usize) -> String {
    let mut h = String::new();
    let mut i = 0;
    while h.len() < total {
        h.push_str(&format!("X-Filler-{i}: {}\r\n", "v".repeat(900)));
        i += 1;
    }
    h
}

#[test]
fn oversized_headers_are_431() {
    let srv = server(&[]);
    let req = format!("GET /a.txt HTTP/1.1\r\nHost: x\r\n{}\r\n", headers_of(17 * 1024));
    refused_then_closed(&srv, req.as_bytes(), 431);
    // One single huge header, too.
    let req = format!("GET /a.txt HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "b".repeat(20 * 1024));
    refused_then_closed(&srv, req.as_bytes(), 431);
    assert_serving(&srv);
}

#[test]
fn max_header_bytes_is_configurable() {
    let srv = server(&["--max-header-bytes", "4096"]);
    let req = format!("GET /a.txt HTTP/1.1\r\nHost: x\r\n{}\r\n", headers_of(5 * 1024));
    refused_then_closed(&srv, req.as_bytes(), 431);
    let req = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(5000));
    refused_then_closed(&srv, req.as_bytes(), 414);
    let req = format!("GET /a.txt HTTP/1.1\r\nHost: x\r\n{}\r\n", headers_of(2 * 1024));
    let mut c = TlsClient::connect(srv.addr());
    c.send(req.as_bytes());
    assert_eq!(c.read_response().status, 200);
}

// ---------------------------------------------------------------------------
// Request bodies.
// ---------------------------------------------------------------------------

#[test]
fn body_on_get_is_discarded_and_pipelining_continues() {
    let srv = server(&[]);
    let mut c = TlsClient::connect(srv.addr());
    let mut req = b"GET /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789".to_vec();
    req.extend_from_slice(get_request("/b.txt").as_bytes());
    c.send(&req);
    let r1 = c.read_response();
    assert_eq!((r1.status, r1.body.as_slice()), (200, A_TXT));
    let r2 = c.read_response();
    assert_eq!((r2.status, r2.body.as_slice()), (200, &b"bravo\n"[..]));
}

#[test]
fn body_over_max_body_bytes_is_413() {
    let srv = server(&["--max-body-bytes", "100"]);
    // At the limit: read and discarded.
    let mut c = TlsClient::connect(srv.addr());
    let mut req = b"GET /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n".to_vec();
    req.extend_from_slice(&[b'z'; 100]);
    req.extend_from_slice(get_request("/b.txt").as_bytes());
    c.send(&req);
    assert_eq!(c.read_response().body, A_TXT);
    assert_eq!(c.read_response().body, b"bravo\n");
    // One byte over.
    let mut req = b"GET /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n".to_vec();
    req.extend_from_slice(&[b'z'; 101]);
    refused_then_closed(&srv, &req, 413);
    assert!(srv.wait_stderr(": 413 ", Duration::from_secs(5)).is_some(), "{}", srv.stderr());
}

#[test]
fn body_over_default_limit_is_413() {
    let srv = server(&[]);
    // Default max_body_bytes is 1 MiB; only the head is sent.
    refused_then_closed(&srv, b"POST /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 1048577\r\n\r\n", 413);
}

#[test]
fn transfer_encoding_body_is_411() {
    let srv = server(&[]);
    refused_then_closed(
        &srv,
        b"POST /a.txt HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        411,
    );
    // TE together with Content-Length (a smuggling attempt) is refused the same way.
    refused_then_closed(
        &srv,
        b"GET /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        411,
    );
    assert_serving(&srv);
}

// ---------------------------------------------------------------------------
// Slow, idle and vanishing clients.
// ---------------------------------------------------------------------------

#[test]
fn slowloris_head_hits_header_timeout() {
    let srv = server(&["--header-timeout", "1"]);
    let mut c = TlsClient::connect(srv.addr());
    let t = Instant::now();
    c.send(b"GET /a.txt HTTP/1.1\r\n");
    let mut i = 0;
    // Trickle a header line every 200 ms; the server must give up after ~1 s.
    let ended = loop {
        if t.elapsed() > Duration::from_secs(10) {
            panic!("server still reading a trickled head after {:?}", t.elapsed());
        }
        if c.try_send(format!("X-Slow-{i}: 1\r\n").as_bytes()).is_err() {
            break t.elapsed();
        }
        i += 1;
        match c.poll_read(Duration::from_millis(200)) {
            Ok(None) => continue,
            Ok(Some(_)) | Err(_) => break t.elapsed(),
        }
    };
    assert!(ended >= Duration::from_millis(900), "gave up too early: {ended:?}");
    assert!(ended < Duration::from_secs(5), "header timeout of 1 s took {ended:?}");
    // Whatever arrived is a 408, and then the connection is closed.
    if !c.pending().is_empty() {
        let r = c.try_read_response(false).expect("a complete 408");
        assert_eq!(r.status, 408);
    }
    let (_, how) = c.read_until_close();
    assert_ne!(how, Closing::TimedOut, "connection still open");
    assert_serving(&srv);
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("timeouts"), 1, "{}", st.stderr);
}

#[test]
fn partial_head_then_silence_gets_408() {
    let srv = server(&["--header-timeout", "1"]);
    let mut c = TlsClient::connect(srv.addr());
    let t = Instant::now();
    c.send(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n");
    let r = c.try_read_response(false).expect("a 408 response");
    let took = t.elapsed();
    assert_eq!(r.status, 408);
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(5), "{took:?}");
    let (_, how) = c.read_until_close();
    assert!(matches!(how, Closing::CloseNotify | Closing::Eof | Closing::Reset), "{how:?}");
}

#[test]
fn idle_keep_alive_connection_is_closed() {
    let srv = server(&["--idle-timeout", "1"]);
    let mut c = TlsClient::connect(srv.addr());
    assert_eq!(c.get("/a.txt").body, A_TXT);
    let t = Instant::now();
    let (rest, how) = c.read_until_close();
    let took = t.elapsed();
    assert!(rest.is_empty());
    assert!(matches!(how, Closing::CloseNotify | Closing::Eof), "{how:?} after {took:?}");
    assert!(took >= Duration::from_millis(800), "closed too early: {took:?}");
    assert!(took < Duration::from_secs(5), "idle timeout of 1 s took {took:?}");
    // A connection that never sends a request is idle too.
    let mut c = TlsClient::connect(srv.addr());
    let t = Instant::now();
    let (_, how) = c.read_until_close();
    assert!(matches!(how, Closing::CloseNotify | Closing::Eof), "{how:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("timeouts"), 2, "{}", st.stderr);
}

#[test]
fn activity_keeps_connection_alive() {
    let srv = server(&["--idle-timeout", "1"]);
    let mut c = TlsClient::connect(srv.addr());
    // Requests every 400 ms for 2.4 s: never idle for a whole second.
    for _ in 0..6 {
        assert_eq!(c.get("/a.txt").body, A_TXT);
        std::thread::sleep(Duration::from_millis(400));
    }
    assert_eq!(c.get("/b.txt").body, b"bravo\n");
}

/// Starts a server with a 48 MiB file and `--send-timeout 1`; a client requests it
/// and reads only the head, then stops reading.
fn stalled_download() -> (Server, TlsClient, u64) {
    let srv = server(&["--send-timeout", "1"]);
    let size = 48u64 << 20;
    write_big_file(&srv.root().join("big.bin"), size);
    let mut c = TlsClient::connect(srv.addr());
    c.set_recv_buffer(64 * 1024);
    c.send(get_request("/big.bin").as_bytes());
    let head = c.read_exact_bytes(200).unwrap();
    assert!(head.starts_with(b"HTTP/1.1 200 OK\r\n"), "{:?}", String::from_utf8_lossy(&head));
    (srv, c, size)
}

#[test]
fn slow_reader_is_dropped_after_send_timeout() {
    let (srv, mut c, size) = stalled_download();
    // While that client stalls, others are served.
    std::thread::sleep(Duration::from_millis(300));
    assert_serving(&srv);
    assert_eq!(fetch(&srv.url("/b.txt"), &[]).body, b"bravo\n");
    // Give the 1 s send timeout time to fire, then read what is left: the response
    // must end early, and not with close_notify (the client must see a truncation).
    std::thread::sleep(Duration::from_secs(3));
    let t = Instant::now();
    let (data, how) = c.read_until_close();
    let received = data.len() as u64 + 200;
    assert!(received < size, "the whole {size} bytes arrived: the slow reader was not dropped");
    assert!(matches!(how, Closing::Eof | Closing::Reset), "ended with {how:?} after {received} bytes");
    assert!(t.elapsed() < Duration::from_secs(20));
    assert_serving(&srv);
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("timeouts") + st.stat("errors"), 1, "{}", st.stderr);
}

#[test]
fn slow_reader_counts_as_timeout() {
    // The `timeouts` counter is documented as "connections closed on an idle,
    // header or send timeout"; a slow reader dropped by --send-timeout is one.
    let (srv, mut c, _) = stalled_download();
    std::thread::sleep(Duration::from_secs(3));
    let _ = c.read_until_close();
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(
        (st.stat("timeouts"), st.stat("errors")),
        (1, 0),
        "a send timeout must count as a timeout, not an error:\n{}",
        st.stderr
    );
}

#[test]
fn client_vanishing_mid_response_does_not_hurt_the_server() {
    let srv = server(&[]);
    write_big_file(&srv.root().join("big.bin"), 48 << 20);
    for _ in 0..3 {
        let mut c = TlsClient::connect(srv.addr());
        c.send(get_request("/big.bin").as_bytes());
        let got = c.read_exact_bytes(100_000).unwrap();
        assert_eq!(got.len(), 100_000);
        drop(c); // unread data pending: the kernel resets the connection
    }
    assert_serving(&srv);
    let r = fetch(&srv.url("/b.txt"), &[]);
    assert_eq!(r.body, b"bravo\n");
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("connections"), 5);
    assert_eq!(st.stat("errors"), 3, "{}", st.stderr);
}

#[test]
fn client_closing_after_request_does_not_hurt_the_server() {
    let srv = server(&[]);
    write_big_file(&srv.root().join("big.bin"), 8 << 20);
    // Half-close right after the request: the response must still arrive in full.
    let mut c = TlsClient::connect(srv.addr());
    c.send(get_request("/big.bin").as_bytes());
    c.tls.sock.shutdown(std::net::Shutdown::Write).unwrap();
    let r = c.try_read_response(false);
    match r {
        Ok(r) => assert_eq!(r.body.len(), 8 << 20),
        Err(e) => panic!("response cut after the client half-closed: {e}"),
    }
    assert_serving(&srv);
}

#[test]
fn concurrent_clients_are_all_served() {
    let srv = Server::builder(BIN).file("a.txt", A_TXT).workers(Some(2)).start();
    let data = pattern(200_000, 77);
    srv.write("m.bin", &data);
    let want = sha256(&data);
    let addr = srv.addr();
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let want = want.clone();
            std::thread::spawn(move || {
                let mut c = TlsClient::connect(addr);
                for _ in 0..3 {
                    let r = c.get("/m.bin");
                    assert_eq!(r.status, 200);
                    assert_eq!(sha256(&r.body), want);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("connections"), 16);
    assert_eq!(st.stat("errors"), 0);
}
