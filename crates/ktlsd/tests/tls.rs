//! TLS: bodies byte for byte over TLS 1.2 and 1.3, every offered suite through
//! `openssl s_client`, suites and versions turned off, RSA certificates, session
//! resumption, ALPN, and what happens to non-TLS bytes on the TLS port.

use std::io::Write;
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const REQUEST: &str = "GET /f.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
const F_TXT: &str = "the quick brown fox\n";

/// Sizes around the 16 KiB record boundary, plus larger ones.
const SIZES: &[usize] = &[0, 1, 16383, 16384, 16385, 1 << 20];

fn sized_server(extra: &[&str]) -> Server {
    let mut b = Server::builder(BIN);
    for (i, &n) in SIZES.iter().enumerate() {
        b = b.file(&format!("s{n}.bin"), pattern(n, 100 + i as u64));
    }
    b.args(extra).start()
}

/// Fetches every size with one curl (one connection) at the given TLS version and
/// compares SHA-256 of each body with the file's.
fn bodies_with_curl(version_args: &[&str], expect_version: &str) {
    let srv = sized_server(&[]);
    let tmp = tempfile::tempdir().unwrap();
    let mut args: Vec<String> = vec!["-v".into()];
    args.extend(version_args.iter().map(|s| s.to_string()));
    for &n in SIZES {
        args.push(srv.url(&format!("/s{n}.bin")));
        args.push("-o".into());
        args.push(tmp.path().join(format!("out{n}")).to_string_lossy().into_owned());
    }
    let out = curl(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("SSL connection using {expect_version}")), "expected {expect_version}:\n{stderr}");
    for &n in SIZES {
        let got = tmp.path().join(format!("out{n}"));
        let want = srv.root().join(format!("s{n}.bin"));
        assert_eq!(std::fs::metadata(&got).map(|m| m.len()).unwrap_or(u64::MAX), n as u64, "size {n}");
        assert_eq!(sha256_file(&got), sha256_file(&want), "body of {n} bytes differs over {expect_version}");
    }
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("connections"), 1);
}

#[test]
fn bodies_tls12_curl() {
    bodies_with_curl(&["--tlsv1.2", "--tls-max", "1.2"], "TLSv1.2");
}

#[test]
fn bodies_tls13_curl() {
    bodies_with_curl(&["--tlsv1.3"], "TLSv1.3");
}

/// Every size pipelined on one connection through the rustls client.
fn bodies_with_rustls(version: &'static rustls::SupportedProtocolVersion) {
    let srv = sized_server(&[]);
    let mut c = TlsClient::connect_with(srv.addr(), client_config(&[version])).expect("connect");
    assert_eq!(c.tls.conn.protocol_version(), Some(version.version));
    let reqs: String = SIZES.iter().map(|n| get_request(&format!("/s{n}.bin"))).collect();
    c.send(reqs.as_bytes());
    for (i, &n) in SIZES.iter().enumerate() {
        let r = c.read_response();
        assert_eq!(r.status, 200, "size {n}");
        assert_eq!(r.body.len(), n);
        assert_eq!(sha256(&r.body), sha256(&pattern(n, 100 + i as u64)), "size {n}");
    }
}

#[test]
fn bodies_tls12_rustls_pipelined() {
    bodies_with_rustls(&rustls::version::TLS12);
}

#[test]
fn bodies_tls13_rustls_pipelined() {
    bodies_with_rustls(&rustls::version::TLS13);
}

/// 100 MiB, downloaded with curl to a file and hashed.
fn body_100_mib(version_args: &[&str], expect_version: &str) {
    let srv = Server::builder(BIN).start();
    let path = srv.root().join("big.bin");
    let want = write_big_file(&path, 100 << 20);
    let tmp = tempfile::tempdir().unwrap();
    let out_path = tmp.path().join("big.out");
    let mut args: Vec<String> = vec!["-v".into(), "--http1.1".into()];
    args.extend(version_args.iter().map(|s| s.to_string()));
    args.extend(["-o".into(), out_path.to_string_lossy().into_owned(), srv.url("/big.bin")]);
    let t = Instant::now();
    let out = curl(&args);
    let took = t.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("SSL connection using {expect_version}")), "{stderr}");
    assert!(stderr.contains("< Content-Length: 104857600"), "{stderr}");
    assert_eq!(std::fs::metadata(&out_path).unwrap().len(), 100 << 20);
    assert_eq!(sha256_file(&out_path), want, "100 MiB body differs over {expect_version} (took {took:?})");
    let log = srv.wait_access_log(1, Duration::from_secs(10));
    assert!(log[0].contains("\"GET /big.bin HTTP/1.1\" 200 104857600 "), "{log:?}");
}

#[test]
fn body_100_mib_tls12() {
    body_100_mib(&["--tlsv1.2", "--tls-max", "1.2"], "TLSv1.2");
}

#[test]
fn body_100_mib_tls13() {
    body_100_mib(&["--tlsv1.3"], "TLSv1.3");
}

#[test]
fn record_size_policies_serve_identical_bytes() {
    let data = pattern(300_000, 55);
    let want = sha256(&data);
    for policy in
        ["static:1k", "static:16k", "static:4096", "dynamic", "dynamic:lo=1000,hi=3000,threshold=3", "adaptive"]
    {
        let srv = Server::builder(BIN).file("d.bin", &data).args(["--record-size", policy]).start();
        assert!(srv.stderr().contains("record size "), "{}", srv.stderr());
        let r = fetch(&srv.url("/d.bin"), &[]);
        assert_eq!(r.status, 200, "{policy}");
        assert_eq!(sha256(&r.body), want, "body differs with --record-size {policy}");
        let r = fetch(&srv.url("/d.bin"), &["-r", "1000-200000"]);
        assert_eq!(sha256(&r.body), sha256(&data[1000..200001]), "range differs with --record-size {policy}");
    }
}

#[test]
fn startup_line_reports_record_size_and_fingerprint() {
    let srv = Server::builder(BIN).args(["--record-size", "static:4k"]).start();
    let line = srv.wait_stderr(" serving ", Duration::from_secs(1)).unwrap();
    assert!(line.contains("with 1 worker,"), "{line}");
    assert!(line.contains("record size static:4096"), "{line}");
    // The fingerprint printed is the certificate's (as openssl computes it).
    let fp = line.split("fingerprint ").nth(1).unwrap().split(',').next().unwrap().trim().to_string();
    assert_eq!(fp.len(), 32 * 3 - 1, "{line}");
    let (ok, stdout, _) = s_client(srv.addr(), &[], REQUEST);
    assert!(ok);
    let pem_start = stdout.find("-----BEGIN CERTIFICATE-----").expect("certificate in s_client output");
    let pem_end = stdout.find("-----END CERTIFICATE-----").unwrap() + "-----END CERTIFICATE-----".len();
    let pem = format!("{}\n", &stdout[pem_start..pem_end]);
    let out = openssl(&["x509", "-noout", "-fingerprint", "-sha256"], Some(pem.as_bytes()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.trim().ends_with(&fp), "openssl says {text:?}, ktlsd said {fp}");
    // The generated certificate names localhost, 127.0.0.1 and ::1.
    let out = openssl(&["x509", "-noout", "-ext", "subjectAltName"], Some(pem.as_bytes()));
    let san = String::from_utf8_lossy(&out.stdout);
    assert!(
        san.contains("DNS:localhost")
            && san.contains("IP Address:127.0.0.1")
            && san.contains("IP Address:0:0:0:0:0:0:0:1"),
        "{san}"
    );
    assert!(srv.stderr().contains("self-signed"), "{}", srv.stderr());
}

// ---------------------------------------------------------------------------
// openssl s_client, one suite at a time.
// ---------------------------------------------------------------------------

/// Runs s_client with `args`, asserting the response to REQUEST and the negotiated suite.
fn assert_s_client_ok(srv: &Server, args: &[&str], version: &str, suite: &str) {
    let (ok, stdout, stderr) = s_client(srv.addr(), args, REQUEST);
    assert!(ok, "s_client {args:?} failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let new_line = format!("New, {version}, Cipher is {suite}");
    assert!(stdout.contains(&new_line), "expected {new_line:?} in:\n{stdout}");
    assert!(stdout.contains("HTTP/1.1 200 OK\r\n"), "no 200 in:\n{stdout}");
    assert!(stdout.contains("Connection: close\r\n"), "{stdout}");
    assert!(stdout.contains(&format!("Content-Length: {}\r\n", F_TXT.len())), "{stdout}");
    assert!(stdout.contains(&format!("\r\n\r\n{F_TXT}")), "body missing in:\n{stdout}");
}

fn assert_s_client_refused(srv: &Server, args: &[&str]) {
    let (ok, stdout, stderr) = s_client(srv.addr(), args, REQUEST);
    assert!(!ok, "s_client {args:?} should have failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(!stdout.contains("HTTP/1.1"), "{stdout}");
    assert!(!stdout.contains(F_TXT), "{stdout}");
}

fn ecdsa_server(extra: &[&str]) -> Server {
    Server::builder(BIN).file("f.txt", F_TXT).args(extra).start()
}

fn rsa_server(extra: &[&str]) -> Server {
    let b = Server::builder(BIN).file("f.txt", F_TXT);
    let (cert, key) = make_cert(b.dir(), "rsa", "rsa");
    b.arg("--cert").arg(&cert).arg("--key").arg(&key).args(extra).start()
}

fn tls13_suite(suite: &str) {
    let srv = ecdsa_server(&[]);
    assert_s_client_ok(&srv, &["-tls1_3", "-ciphersuites", suite], "TLSv1.3", suite);
}

fn tls12_ecdsa_suite(suite: &str) {
    let srv = ecdsa_server(&[]);
    assert_s_client_ok(&srv, &["-tls1_2", "-cipher", suite], "TLSv1.2", suite);
}

fn tls12_rsa_suite(suite: &str) {
    let srv = rsa_server(&[]);
    assert_s_client_ok(&srv, &["-tls1_2", "-cipher", suite], "TLSv1.2", suite);
}

/// The server's order decides: OpenSSL lists TLS_AES_256_GCM_SHA384 first, and gets
/// AES-128-GCM unless the operator's --cipher-suites puts another suite first.
#[test]
fn server_order_chooses_the_suite() {
    let srv = ecdsa_server(&[]);
    assert_s_client_ok(&srv, &["-tls1_3"], "TLSv1.3", "TLS_AES_128_GCM_SHA256");
    assert_s_client_ok(&srv, &["-tls1_2"], "TLSv1.2", "ECDHE-ECDSA-AES128-GCM-SHA256");
    let srv = ecdsa_server(&["--cipher-suites", "TLS_CHACHA20_POLY1305_SHA256,TLS_AES_128_GCM_SHA256"]);
    assert_s_client_ok(&srv, &["-tls1_3"], "TLSv1.3", "TLS_CHACHA20_POLY1305_SHA256");
}

#[test]
fn openssl_tls13_aes128_gcm() {
    tls13_suite("TLS_AES_128_GCM_SHA256");
}

#[test]
fn openssl_tls13_aes256_gcm() {
    tls13_suite("TLS_AES_256_GCM_SHA384");
}

#[test]
fn openssl_tls13_chacha20() {
    tls13_suite("TLS_CHACHA20_POLY1305_SHA256");
}

#[test]
fn openssl_tls12_ecdhe_ecdsa_aes128_gcm() {
    tls12_ecdsa_suite("ECDHE-ECDSA-AES128-GCM-SHA256");
}

#[test]
fn openssl_tls12_ecdhe_ecdsa_aes256_gcm() {
    tls12_ecdsa_suite("ECDHE-ECDSA-AES256-GCM-SHA384");
}

#[test]
fn openssl_tls12_ecdhe_ecdsa_chacha20() {
    tls12_ecdsa_suite("ECDHE-ECDSA-CHACHA20-POLY1305");
}

#[test]
fn openssl_tls12_ecdhe_rsa_aes128_gcm() {
    tls12_rsa_suite("ECDHE-RSA-AES128-GCM-SHA256");
}

#[test]
fn openssl_tls12_ecdhe_rsa_aes256_gcm() {
    tls12_rsa_suite("ECDHE-RSA-AES256-GCM-SHA384");
}

#[test]
fn openssl_tls12_ecdhe_rsa_chacha20() {
    tls12_rsa_suite("ECDHE-RSA-CHACHA20-POLY1305");
}

#[test]
fn rsa_cert_serves_tls13_and_refuses_ecdsa_suites() {
    let srv = rsa_server(&[]);
    assert_s_client_ok(
        &srv,
        &["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256"],
        "TLSv1.3",
        "TLS_AES_128_GCM_SHA256",
    );
    assert_s_client_refused(&srv, &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"]);
    let r = fetch(&srv.url("/f.txt"), &[]);
    assert_eq!(r.body, F_TXT.as_bytes());
    let st = srv.stop();
    assert!(st.stderr.contains("certificate (loaded)"), "{}", st.stderr);
    assert!(st.stat("handshake_failures") >= 1);
}

#[test]
fn ecdsa_cert_refuses_rsa_suites() {
    let srv = ecdsa_server(&[]);
    assert_s_client_refused(&srv, &["-tls1_2", "-cipher", "ECDHE-RSA-AES128-GCM-SHA256"]);
}

#[test]
fn loaded_ecdsa_cert_is_presented() {
    let b = Server::builder(BIN).file("f.txt", F_TXT);
    let (cert, key) = make_cert(b.dir(), "ec", "ec");
    let srv = b.arg("--cert").arg(&cert).arg("--key").arg(&key).start();
    let out = openssl(
        &[
            "x509".as_ref(),
            "-noout".as_ref(),
            "-fingerprint".as_ref(),
            "-sha256".as_ref(),
            "-in".as_ref(),
            cert.as_os_str(),
        ],
        None,
    );
    let fp = String::from_utf8_lossy(&out.stdout).trim().split('=').nth(1).unwrap().to_string();
    assert!(srv.stderr().contains(&format!("fingerprint {fp}")), "expected {fp} in:\n{}", srv.stderr());
    assert_s_client_ok(
        &srv,
        &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"],
        "TLSv1.2",
        "ECDHE-ECDSA-AES128-GCM-SHA256",
    );
}

#[test]
fn cipher_suite_turned_off_is_refused() {
    let srv = ecdsa_server(&["--cipher-suites", "TLS_AES_128_GCM_SHA256,ECDHE-ECDSA-AES256-GCM-SHA384"]);
    assert_s_client_ok(
        &srv,
        &["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256"],
        "TLSv1.3",
        "TLS_AES_128_GCM_SHA256",
    );
    assert_s_client_ok(
        &srv,
        &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384"],
        "TLSv1.2",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
    );
    assert_s_client_refused(&srv, &["-tls1_3", "-ciphersuites", "TLS_AES_256_GCM_SHA384"]);
    assert_s_client_refused(&srv, &["-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"]);
    assert_s_client_refused(&srv, &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"]);
    assert_s_client_refused(&srv, &["-tls1_2", "-cipher", "ECDHE-ECDSA-CHACHA20-POLY1305"]);
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("handshake_failures"), 4, "{}", st.stderr);
}

#[test]
fn cipher_suites_accept_iana_names() {
    let srv = ecdsa_server(&["--cipher-suites", "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"]);
    assert_s_client_ok(
        &srv,
        &["-tls1_2", "-cipher", "ECDHE-ECDSA-CHACHA20-POLY1305"],
        "TLSv1.2",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
    );
    assert_s_client_refused(&srv, &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"]);
    // Only a 1.2 suite is left, so 1.3 cannot be negotiated.
    assert_s_client_refused(&srv, &["-tls1_3"]);
}

#[test]
fn tls13_only_refuses_tls12() {
    let srv = ecdsa_server(&["--tls-versions", "1.3"]);
    assert_s_client_ok(&srv, &["-tls1_3"], "TLSv1.3", "TLS_AES_128_GCM_SHA256");
    assert_s_client_refused(&srv, &["-tls1_2"]);
    let out = curl(&["--tlsv1.2".to_string(), "--tls-max".into(), "1.2".into(), srv.url("/f.txt")]);
    assert!(!out.status.success(), "curl over TLS 1.2 must fail against --tls-versions 1.3");
    let st = srv.stop();
    assert_eq!(st.stat("handshake_failures"), 2, "{}", st.stderr);
}

#[test]
fn tls12_only_refuses_tls13() {
    let srv = ecdsa_server(&["--tls-versions", "1.2"]);
    assert_s_client_ok(
        &srv,
        &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"],
        "TLSv1.2",
        "ECDHE-ECDSA-AES128-GCM-SHA256",
    );
    assert_s_client_refused(&srv, &["-tls1_3"]);
    let out = curl(&["--tlsv1.3".to_string(), srv.url("/f.txt")]);
    assert!(!out.status.success(), "curl over TLS 1.3 must fail against --tls-versions 1.2");
    // The rustls client agrees.
    assert!(TlsClient::connect_with(srv.addr(), client_config(&[&rustls::version::TLS13])).is_err());
}

// ---------------------------------------------------------------------------
// Session resumption.
// ---------------------------------------------------------------------------

fn resumption(version_flag: &str, version: &str, extra_server: &[&str], rsa: bool) {
    let srv = if rsa { rsa_server(extra_server) } else { ecdsa_server(extra_server) };
    let tmp = tempfile::tempdir().unwrap();
    let sess: PathBuf = tmp.path().join("session.pem");
    let sess_s = sess.to_string_lossy().into_owned();
    let (ok, first, err) = s_client(srv.addr(), &[version_flag, "-sess_out", &sess_s], REQUEST);
    assert!(ok, "{first}\n{err}");
    assert!(first.contains(&format!("New, {version}")), "{first}");
    assert!(first.contains("HTTP/1.1 200 OK"), "{first}");
    assert!(sess.exists() && std::fs::metadata(&sess).unwrap().len() > 0, "no session saved:\n{first}");
    let (ok, second, err) = s_client(srv.addr(), &[version_flag, "-sess_in", &sess_s], REQUEST);
    assert!(ok, "{second}\n{err}");
    assert!(second.contains(&format!("Reused, {version}")), "session was not resumed over {version}:\n{second}");
    assert!(second.contains("HTTP/1.1 200 OK"), "{second}");
    assert!(second.contains(F_TXT), "{second}");
}

#[test]
fn session_resumption_tls12() {
    resumption("-tls1_2", "TLSv1.2", &[], false);
}

#[test]
fn session_resumption_tls13() {
    resumption("-tls1_3", "TLSv1.3", &[], false);
}

#[test]
fn session_resumption_tls12_rsa() {
    resumption("-tls1_2", "TLSv1.2", &[], true);
}

#[test]
fn session_resumption_across_workers() {
    // Tickets are shared by every worker: resumption must work whichever accepts.
    let srv = Server::builder(BIN).file("f.txt", F_TXT).workers(Some(2)).start();
    let tmp = tempfile::tempdir().unwrap();
    let sess = tmp.path().join("s.pem").to_string_lossy().into_owned();
    let (ok, out, _) = s_client(srv.addr(), &["-tls1_3", "-sess_out", &sess], REQUEST);
    assert!(ok, "{out}");
    for i in 0..4 {
        let (ok, out, _) = s_client(srv.addr(), &["-tls1_3", "-sess_in", &sess], REQUEST);
        assert!(ok, "{out}");
        assert!(out.contains("Reused, TLSv1.3"), "attempt {i} not resumed:\n{out}");
    }
}

#[test]
fn rustls_client_resumes() {
    let srv = ecdsa_server(&[]);
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let cfg = client_config(&[version]);
        let mut c1 = TlsClient::connect_with(srv.addr(), cfg.clone()).unwrap();
        let r = c1.get("/f.txt");
        assert_eq!(r.body, F_TXT.as_bytes());
        assert_eq!(c1.tls.conn.handshake_kind(), Some(rustls::HandshakeKind::Full));
        drop(c1);
        let mut c2 = TlsClient::connect_with(srv.addr(), cfg).unwrap();
        let r = c2.get("/f.txt");
        assert_eq!(r.body, F_TXT.as_bytes());
        assert_eq!(c2.tls.conn.handshake_kind(), Some(rustls::HandshakeKind::Resumed), "{:?}", version.version);
    }
}

// ---------------------------------------------------------------------------
// ALPN.
// ---------------------------------------------------------------------------

#[test]
fn alpn_http11() {
    let srv = ecdsa_server(&[]);
    let c = TlsClient::connect(srv.addr());
    assert_eq!(c.tls.conn.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (ok, out, _) = s_client(srv.addr(), &["-alpn", "spdy/3.1,http/1.1"], REQUEST);
    assert!(ok, "{out}");
    assert!(out.contains("ALPN protocol: http/1.1"), "{out}");
    let (ok, out, _) = s_client(srv.addr(), &["-alpn", "http/1.0"], "GET /f.txt HTTP/1.0\r\n\r\n");
    assert!(ok, "{out}");
    assert!(out.contains("ALPN protocol: http/1.0"), "{out}");
    // The status line names the server's version (1.1) for 1.0 requests too, as nginx's does.
    assert!(out.contains("HTTP/1.1 200 OK"), "{out}");
    // No ALPN at all is fine too.
    let (ok, out, _) = s_client(srv.addr(), &[], REQUEST);
    assert!(ok && out.contains("HTTP/1.1 200 OK"), "{out}");
}

// ---------------------------------------------------------------------------
// Not TLS at all.
// ---------------------------------------------------------------------------

#[test]
fn plain_http_on_tls_port_gets_a_plain_400() {
    let srv = ecdsa_server(&[]);
    let mut s = TcpStream::connect(srv.addr()).unwrap();
    s.write_all(b"GET /f.txt HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let (got, closed) = read_raw_until_closed(&mut s, Duration::from_secs(10));
    assert!(closed, "the server kept a plain-HTTP connection open");
    assert!(got.starts_with(b"HTTP/1.1 400 Bad Request\r\n"), "expected a plain 400 answer, got {got:?}");
    assert!(!got.windows(F_TXT.len()).any(|w| w == F_TXT.as_bytes()), "leaked the file in clear");
    // Still serving.
    assert_eq!(fetch(&srv.url("/f.txt"), &[]).body, F_TXT.as_bytes());
    let st = srv.stop();
    st.assert_clean_exit();
    assert!(st.stat("handshake_failures") >= 1, "{}", st.stderr);
    assert_eq!(st.stat("connections"), 2);
}

#[test]
fn binary_garbage_on_tls_port_is_closed() {
    let srv = ecdsa_server(&[]);
    // A record header claiming a handshake record far larger than TLS allows.
    let mut s = TcpStream::connect(srv.addr()).unwrap();
    s.write_all(&[0x16, 0x03, 0x01, 0xff, 0xff]).unwrap();
    s.write_all(&pattern(4096, 9)).unwrap();
    let (_, closed) = read_raw_until_closed(&mut s, Duration::from_secs(10));
    assert!(closed);
    // Random bytes.
    let mut s = TcpStream::connect(srv.addr()).unwrap();
    s.write_all(&pattern(300, 10)).unwrap();
    let (_, closed) = read_raw_until_closed(&mut s, Duration::from_secs(10));
    assert!(closed);
    assert_eq!(fetch(&srv.url("/f.txt"), &[]).body, F_TXT.as_bytes());
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("handshake_failures"), 2, "{}", st.stderr);
}

#[test]
fn silent_client_hits_handshake_timeout() {
    let srv = ecdsa_server(&["--handshake-timeout", "1"]);
    let t = Instant::now();
    let mut s = TcpStream::connect(srv.addr()).unwrap();
    // Half a ClientHello header, then nothing.
    s.write_all(&[0x16, 0x03]).unwrap();
    let (got, closed) = read_raw_until_closed(&mut s, Duration::from_secs(15));
    let took = t.elapsed();
    assert!(closed, "still open after {took:?}");
    assert!(got.is_empty() || got[0] == 0x15, "{got:?}");
    assert!(took >= Duration::from_millis(900), "closed too early: {took:?}");
    assert!(took < Duration::from_secs(6), "handshake timeout of 1 s took {took:?}");
    assert_eq!(fetch(&srv.url("/f.txt"), &[]).body, F_TXT.as_bytes());
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("handshake_timeouts"), 1, "{}", st.stderr);
}

// ---------------------------------------------------------------------------
// Key updates and long connections.
// ---------------------------------------------------------------------------

#[test]
fn tls13_client_key_update_mid_connection() {
    let srv = ecdsa_server(&[]);
    let mut c = TlsClient::connect_with(srv.addr(), client_config(&[&rustls::version::TLS13])).unwrap();
    assert_eq!(c.get("/f.txt").body, F_TXT.as_bytes());
    for _ in 0..3 {
        // Our sending keys change, and we ask the server to change its own.
        c.tls.conn.refresh_traffic_keys().expect("KeyUpdate");
        let r = c.get("/f.txt");
        assert_eq!((r.status, r.body.as_slice()), (200, F_TXT.as_bytes()));
    }
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("errors"), 0, "{}", st.stderr);
}

#[test]
fn many_requests_on_one_connection() {
    let data = pattern(40_000, 31);
    let srv = Server::builder(BIN).file("d.bin", &data).start();
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let mut c = TlsClient::connect_with(srv.addr(), client_config(&[version])).unwrap();
        for i in 0..200 {
            let r = c.get("/d.bin");
            assert_eq!(r.status, 200, "request {i}");
            assert!(r.body == data, "request {i} body differs over {:?}", version.version);
        }
    }
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("connections"), 2);
}
