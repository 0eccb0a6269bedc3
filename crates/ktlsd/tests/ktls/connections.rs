//! A connection's life on kTLS: precompressed variants, keep-alive and
//! close_notify, requests pipelined behind the Finished, resets mid-sendfile,
//! large downloads beside small requests, and lingering close.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use testkit::{assert_body, fetch, get_request, get_request_with, pattern, sha256};

use crate::harness::*;
use crate::suites::*;
use crate::wire::*;

/// The standard files with precompressed variants of the large ones beside them
/// (bytes that differ from the originals', so a mix-up shows).
fn precompressed_files() -> Vec<(&'static str, Vec<u8>)> {
    let mut files = standard_files();
    files.push(("big.gz", pattern(BIG + 7, 11)));
    files.push(("odd.br", pattern(ODD - 3, 12)));
    files
}

/// A precompressed variant chosen by Accept-Encoding goes by sendfile over kTLS
/// like any file: the variant's bytes intact, the kernel carrying TX and RX.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn precompressed_variant_over_ktls() {
    let files = precompressed_files();
    let server = KtlsServer::start(&files, &["--precompressed", "br,gzip"]);
    let mut requests = 0;
    for proto in ["--http1.1", "--http2"] {
        for (path, accept, coding, variant) in
            [("/big", "gzip", "gzip", "big.gz"), ("/odd", "br, gzip", "br", "odd.br")]
        {
            let r = fetch(&server.url(path), &[proto, "--max-time", "90", "-H", &format!("Accept-Encoding: {accept}")]);
            assert_eq!((r.status, r.header("content-encoding")), (200, Some(coding)), "{proto} {path}");
            assert_body(&format!("{proto} {path} as {coding}"), &r.body, file(&files, variant));
            requests += 1;
        }
    }
    let s = server.stop();
    assert_ktls("precompressed_variant_over_ktls", &s, &Expect::conns(requests as u64, requests));
}

/// Several requests on one kTLS connection, then the client's close_notify:
/// the server answers with its own and closes. Then a resumed session whose
/// last request and close_notify arrive in one write.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn keepalive_requests_then_client_close_notify() {
    let files = standard_files();
    let server = KtlsServer::start(&files, &[]);
    let mut requests = 0;
    for v in [V::Tls13, V::Tls12] {
        let cfg = client_config(v, None);
        let mut c = WireClient::connect(server.addr(), &cfg);
        for name in ["one", "r16385", "big", "empty", "r16384"] {
            let r = c.get(&format!("/{name}"));
            assert_eq!(r.status, 200, "{v:?} /{name}");
            assert_body(&format!("{v:?} keep-alive /{name}"), &r.body, file(&files, name));
            requests += 1;
        }
        // HEAD: a head without body on the same connection.
        c.send(b"HEAD /big HTTP/1.1\r\nHost: localhost\r\n\r\n");
        let r = c.response(true);
        assert_eq!((r.status, r.header("Content-Length")), (200, Some("5242880")), "{v:?} HEAD");
        requests += 1;
        c.conn.send_close_notify();
        c.flush();
        let (how, stray) = c.until_closed();
        assert_eq!(how, Close::Notify, "{v:?}: the server should answer close_notify with close_notify");
        assert!(stray.is_empty(), "{v:?}: unexpected data after the last response: {stray:?}");

        // Resumption (a ticket from the first connection), and a request
        // whose close_notify follows in the same segment.
        let mut c = WireClient::start(server.addr(), &cfg);
        c.handshake();
        assert_eq!(c.conn.handshake_kind(), Some(rustls::HandshakeKind::Resumed), "{v:?}: session not resumed");
        c.queue(get_request("/r16385").as_bytes());
        c.conn.send_close_notify();
        c.flush();
        let r = c.response(false);
        assert_eq!(r.status, 200);
        assert_body(&format!("{v:?} resumed /r16385"), &r.body, file(&files, "r16385"));
        requests += 1;
        let (how, _) = c.until_closed();
        assert_eq!(how, Close::Notify, "{v:?}: resumed connection: close_notify expected after the response");
    }
    let s = server.stop();
    assert_ktls("keepalive_requests_then_client_close_notify", &s, &Expect::conns(4, requests));
    assert_eq!((s.stat("errors"), s.stat("timeouts")), (0, 0), "{}", s.stderr);
}

/// Requests written before the handshake completes: rustls sends them right
/// after the client Finished. With TLS 1.3 they leave in the same write (and
/// TCP segment) as the Finished, so they sit in the socket when the kernel
/// takes over the record layer.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn pipelined_requests_in_the_finished_segment() {
    let files = standard_files();
    let server = KtlsServer::start(&files, &[]);
    let order = ["one", "r16385", "empty", "r16384", "one", "big", "one"];
    let mut requests = 0;
    for v in [V::Tls13, V::Tls12] {
        let mut c = WireClient::start(server.addr(), &client_config(v, None));
        let mut app_bytes = 0;
        for (i, name) in order.iter().enumerate() {
            // One writer call per request: one record each.
            let close = if i + 1 == order.len() { "Connection: close\r\n" } else { "" };
            let req = get_request_with(&format!("/{name}"), close);
            app_bytes += req.len();
            c.queue(req.as_bytes());
        }
        // Drive the handshake by hand. pump() ends with a flush, so the pump
        // that completes the handshake also makes the write that carries the
        // client Finished (TLS 1.3) or the first requests (TLS 1.2).
        c.flush();
        while c.conn.is_handshaking() {
            assert!(c.pump(), "{v:?}: connection ended during the handshake: {:?}", c.closed);
        }
        let n = c.last_flush;
        if v == V::Tls13 {
            // Finished (~58 bytes) plus one record per request, in one write.
            assert!(
                n >= app_bytes + 50 + order.len() * 22,
                "TLS 1.3: the write with the client Finished carried {n} bytes; requests alone are {app_bytes}"
            );
        }
        for name in order {
            let r = c.response(false);
            assert_eq!(r.status, 200, "{v:?} pipelined /{name}");
            assert_body(&format!("{v:?} pipelined /{name}"), &r.body, file(&files, name));
            requests += 1;
        }
        let (how, stray) = c.until_closed();
        assert_eq!(how, Close::Notify, "{v:?}: after `Connection: close` the server sends close_notify");
        assert!(stray.is_empty(), "{v:?}: {} stray bytes", stray.len());
    }
    let s = server.stop();
    assert_ktls("pipelined_requests_in_the_finished_segment", &s, &Expect::conns(2, requests));
    assert_eq!(s.stat("errors"), 0, "{}", s.stderr);
}

/// A client resets its connection in the middle of a 5 MiB sendfile; another
/// connection, open all along, and new ones are served normally.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn client_reset_mid_sendfile_keeps_serving() {
    let files = standard_files();
    let big = file(&files, "big").to_vec();
    let server = KtlsServer::start(&files, &[]);
    let cfg = client_config(V::Tls13, None);

    let mut bystander = WireClient::connect(server.addr(), &cfg);
    assert_eq!(bystander.get("/one").status, 200);

    for v in [V::Tls13, V::Tls12] {
        let mut victim = WireClient::connect(server.addr(), &client_config(v, None));
        victim.send(get_request("/big").as_bytes());
        while victim.plain.len() < 256 * 1024 {
            assert!(victim.pump(), "{v:?}: connection ended early: {:?}", victim.closed);
        }
        // SO_LINGER 0: close() sends RST instead of FIN.
        socket2::SockRef::from(&victim.sock).set_linger(Some(Duration::ZERO)).unwrap();
        drop(victim);
    }
    // Give the server a moment to hit the reset.
    thread::sleep(Duration::from_millis(300));

    let r = bystander.get("/big");
    assert_eq!(r.status, 200);
    assert_body("bystander /big after the resets", &r.body, &big);
    let (code, body) = curl_get(&server.url("/big"), &[], &[]);
    assert_eq!(code, 200);
    assert_body("new connection /big after the resets", &body, &big);
    bystander.conn.send_close_notify();
    bystander.flush();
    assert_eq!(bystander.until_closed().0, Close::Notify);

    let s = server.stop();
    // The two reset responses never complete, so they are not logged.
    assert_ktls("client_reset_mid_sendfile_keeps_serving", &s, &Expect::conns(4, 3));
    assert_eq!(s.stat("errors"), 2, "both resets count as connection errors\n{}", s.stderr);
}

/// A large download does not hold up small requests on the same worker
/// (one worker): the kernel encrypts inside each `sendfile`, on the worker's
/// thread, so a call that moves a MiB stalls every other connection of the
/// worker for as long as a MiB takes to encrypt. While one client downloads
/// 5 MiB as fast as it reads, another asks for a 1-byte file again and again;
/// its slowest answer must take less than half the download's time per MiB.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn large_download_does_not_stall_small_requests() {
    let files = standard_files();
    let big = file(&files, "big").to_vec();
    let server = KtlsServer::start(&files, &[]); // one worker, as the harness starts it
    let cfg = client_config(V::Tls13, None);
    let mut small = WireClient::connect(server.addr(), &cfg);
    assert_eq!(small.get("/one").status, 200);

    let mut downloader = WireClient::connect(server.addr(), &cfg);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let download = thread::spawn({
        let done = done.clone();
        move || {
            let start = Instant::now();
            let r = downloader.get("/big");
            let took = start.elapsed();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            (r, took)
        }
    });
    let mut slowest = Duration::ZERO;
    let mut asked = 0;
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        let start = Instant::now();
        let r = small.get("/one");
        assert_eq!(r.status, 200);
        slowest = slowest.max(start.elapsed());
        asked += 1;
    }
    let (r, took) = download.join().unwrap();
    assert_eq!(r.status, 200);
    assert_body("download beside small requests", &r.body, &big);
    let per_mib = took / (BIG / MIB) as u32;
    println!("[stall] 5 MiB in {took:?} ({per_mib:?}/MiB); {asked} small requests meanwhile, slowest {slowest:?}");
    assert!(asked >= 2, "only {asked} small requests were answered during the download ({took:?})");
    assert!(
        slowest < per_mib / 2,
        "a small request waited {slowest:?} while the download took {per_mib:?} per MiB: the worker was held by the download"
    );
    let s = server.stop();
    assert_ktls("large_download_does_not_stall_small_requests", &s, &Expect::conns(2, asked + 2));
}

/// The server ends a connection while the client has sent bytes it has not
/// read (after `Connection: close`, after an HTTP/1.0 request, and after an
/// error on a pipelined request). Closing with unread input would make the
/// kernel reset the connection and drop the tail of the response; the server
/// shuts down its write side and drains the kTLS socket instead, so the 1 MiB
/// response arrives whole, followed by close_notify.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn lingering_close_delivers_whole_responses() {
    let mut files = standard_files();
    files.push(("mib", pattern(MIB, 7)));
    let mib = file(&files, "mib").to_vec();
    let server = KtlsServer::start(&files, &[]);
    // (request, statuses, whether the extra bytes follow only once the server has
    // answered and closed: a socket already closed would answer them with a reset).
    let cases: [(&str, &[u16], bool); 4] = [
        ("GET /mib HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", &[200], false),
        ("GET /mib HTTP/1.0\r\n\r\n", &[200], false),
        ("GET /mib HTTP/1.1\r\nHost: localhost\r\n\r\nGET /one HTTP/1.1\r\nHost x\r\n\r\n", &[200, 400], false),
        ("GET /mib HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", &[200], true),
    ];
    let (mut connections, mut requests) = (0, 0);
    for v in [V::Tls13, V::Tls12] {
        for (request, statuses, later) in cases {
            let what = format!("{v:?} {:?} (extra bytes later: {later})", request.lines().next().unwrap_or(""));
            let mut c = WireClient::connect(server.addr(), &client_config(v, None));
            let extra = vec![b'z'; 20_000];
            if later {
                c.send(request.as_bytes());
                thread::sleep(Duration::from_millis(500));
                c.send(&extra);
            } else {
                c.send(&[request.as_bytes(), &extra].concat());
            }
            // Let the server write its answer and close before anything is read.
            thread::sleep(Duration::from_millis(500));
            for status in statuses {
                let r = c.response(false);
                assert_eq!(r.status, *status, "{what}");
                if *status == 200 {
                    assert_eq!(sha256(&r.body), sha256(&mib), "{what}: {} of {} bytes", r.body.len(), mib.len());
                }
            }
            let (how, stray) = c.until_closed();
            assert_eq!(how, Close::Notify, "{what}: close_notify expected after the response");
            assert!(stray.is_empty(), "{what}: {} stray bytes", stray.len());
            connections += 1;
            requests += statuses.len();
        }
    }
    let s = server.stop();
    assert_ktls("lingering_close_delivers_whole_responses", &s, &Expect::conns(connections, requests));
    assert_eq!((s.stat("errors"), s.stat("timeouts")), (0, 0), "{}", s.stderr);
}
