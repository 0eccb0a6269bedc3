//! Client certificates (mTLS) with the real binary, chosen per site by the TLS
//! server name: `openssl s_client -cert/-key` and curl `--cert` against a site
//! that requires a certificate of its CA (none: certificate_required in TLS 1.3,
//! a refusal in TLS 1.2; another CA's: unknown_ca), a site where it is optional,
//! and a site beside them that asks for none. The verified subject reaches the
//! JSON access log, on both record layers.

use std::time::Duration;

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const REQUEST: &str = "GET /f.txt HTTP/1.1\r\nHost: secure.test\r\nConnection: close\r\n\r\n";

struct Setup {
    srv: Server,
    alice: (String, String),
    mallory: (String, String),
}

/// Sites secure.test (client_auth require), opt.test (optional) and open.test (none), one listener.
fn setup(ktls: &str) -> Setup {
    let b = Server::builder(BIN).file("f.txt", "files").args(["--ktls", ktls, "--access-log-format", "json"]);
    let dir = b.dir().to_path_buf();
    let (ca_pem, issuer) = client_ca(&dir, "good");
    let (_, other) = client_ca(&dir, "other");
    let alice = client_cert(&dir, "alice", &issuer);
    let mallory = client_cert(&dir, "mallory", &other);
    let root = b.root().display().to_string();
    let ca_pem = ca_pem.display().to_string();
    let config = format!(
        "[[site]]\nnames = [\"secure.test\"]\nroot = {root:?}\nclient_ca = {ca_pem:?}\nclient_auth = \"require\"\n\
         [[site]]\nnames = [\"opt.test\"]\nroot = {root:?}\nclient_ca = {ca_pem:?}\nclient_auth = \"optional\"\n\
         [[site]]\nnames = [\"open.test\"]\nroot = {root:?}\n"
    );
    Setup { srv: b.config(&config).start(), alice, mallory }
}

/// `openssl s_client` to `name` with `extra` arguments: (success, stdout + stderr).
fn s_client_to(srv: &Server, name: &str, extra: &[&str]) -> (bool, String) {
    let mut args = vec!["-servername", name];
    args.extend_from_slice(extra);
    let (ok, out, err) = s_client(srv.addr(), &args, &REQUEST.replace("secure.test", name));
    (ok && out.contains("HTTP/1.1 200"), format!("{out}{err}"))
}

/// curl `https://NAME/f.txt` with `extra` arguments: the status (0 when the handshake failed).
fn curl_to(srv: &Server, name: &str, extra: &[&str]) -> u16 {
    let resolve = format!("{name}:{}:127.0.0.1", srv.port());
    let url = format!("https://{name}:{}/f.txt", srv.port());
    let mut args = vec!["-o", "/dev/null", "-w", "%{http_code}", "--resolve", resolve.as_str()];
    args.extend_from_slice(extra);
    args.push(&url);
    String::from_utf8_lossy(&curl(&args).stdout).trim().parse().unwrap_or(0)
}

/// The JSON access-log entries' client_subject fields, once `n` lines are there.
fn subjects(srv: &Server, n: usize) -> Vec<Option<String>> {
    srv.wait_access_log(n, Duration::from_secs(10))
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            v["client_subject"].as_str().map(String::from)
        })
        .collect()
}

#[test]
fn a_required_certificate_is_checked_and_logged_on_both_record_layers() {
    for ktls in ["auto", "off"] {
        let s = setup(ktls);
        let (cert, key) = (&s.alice.0, &s.alice.1);
        let (ok, out) = s_client_to(&s.srv, "secure.test", &["-cert", cert, "-key", key]);
        assert!(ok, "{ktls}: a good certificate was refused:\n{out}");
        assert!(out.contains("Acceptable client certificate CA names"), "{out}");
        for proto in ["--http1.1", "--http2"] {
            assert_eq!(curl_to(&s.srv, "secure.test", &[proto, "--cert", cert, "--key", key]), 200, "{ktls} {proto}");
        }
        let logged = subjects(&s.srv, 3);
        assert_eq!(logged, vec![Some("CN=alice,O=ktlsd tests".to_string()); 3], "{ktls}");
    }
}

#[test]
fn a_missing_or_foreign_certificate_ends_the_handshake() {
    let s = setup("auto");
    // TLS 1.3: certificate_required (RFC 8446 section 4.4.2.4).
    let (ok, out) = s_client_to(&s.srv, "secure.test", &["-tls1_3"]);
    assert!(!ok, "served without a certificate:\n{out}");
    assert!(out.contains("certificate required"), "no certificate_required alert:\n{out}");
    // TLS 1.2, which has no certificate_required: handshake_failure (RFC 5246 section 7.4.6).
    let (ok, out) = s_client_to(&s.srv, "secure.test", &["-tls1_2"]);
    assert!(!ok && out.contains("alert handshake failure"), "TLS 1.2 without a certificate:\n{out}");
    assert!(!out.contains("HTTP/1.1"), "{out}");
    // A certificate from another CA: unknown_ca.
    let (cert, key) = (&s.mallory.0, &s.mallory.1);
    let (ok, out) = s_client_to(&s.srv, "secure.test", &["-cert", cert, "-key", key]);
    assert!(!ok, "a foreign certificate was accepted:\n{out}");
    assert!(out.contains("unknown ca"), "no unknown_ca alert:\n{out}");
    assert_eq!(curl_to(&s.srv, "secure.test", &[]), 0);
    assert_eq!(curl_to(&s.srv, "secure.test", &["--cert", cert, "--key", key]), 0);
    assert!(s.srv.access_log().is_empty(), "refused handshakes are no requests: {:?}", s.srv.access_log());
}

#[test]
fn optional_and_unasked_sites_beside_a_required_one() {
    let s = setup("auto");
    let (cert, key) = (&s.alice.0, &s.alice.1);
    // open.test, and the default site (no server name), never ask.
    let (ok, out) = s_client_to(&s.srv, "open.test", &[]);
    assert!(ok, "{out}");
    assert!(!out.contains("Acceptable client certificate CA names"), "open.test asked for a certificate:\n{out}");
    let (ok, out) = s_client_to(&s.srv, "other.test", &[]);
    assert!(ok && !out.contains("Acceptable client certificate CA names"), "{out}");
    // opt.test asks; goes on without one; checks one that is sent.
    let (ok, out) = s_client_to(&s.srv, "opt.test", &[]);
    assert!(ok && out.contains("Acceptable client certificate CA names"), "{out}");
    assert_eq!(curl_to(&s.srv, "opt.test", &["--cert", cert, "--key", key]), 200);
    let (m_cert, m_key) = (&s.mallory.0, &s.mallory.1);
    assert_eq!(curl_to(&s.srv, "opt.test", &["--cert", m_cert, "--key", m_key]), 0);
    let logged = subjects(&s.srv, 4);
    assert_eq!(logged, vec![None, None, None, Some("CN=alice,O=ktlsd tests".to_string())]);
    // A Host of a site that asks for certificates, on a handshake made for another: 421.
    for proto in ["--http1.1", "--http2"] {
        assert_eq!(curl_to(&s.srv, "open.test", &[proto, "-H", "Host: secure.test"]), 421, "{proto}");
        assert_eq!(curl_to(&s.srv, "open.test", &[proto, "-H", "Host: opt.test"]), 421, "{proto}");
        let with_cert = [proto, "--cert", cert, "--key", key, "-H", "Host: open.test"];
        assert_eq!(curl_to(&s.srv, "secure.test", &with_cert), 200, "{proto}");
    }
}

#[test]
fn client_auth_without_a_ca_is_refused_at_start() {
    let b = Server::builder(BIN);
    let exited = b.config("client_auth = \"require\"\n").run_to_exit();
    assert!(!exited.status.success());
    assert!(exited.stderr.contains("client_auth = \"require\" needs client_ca"), "{}", exited.stderr);
    let b = Server::builder(BIN);
    let empty = b.dir().join("empty.pem");
    std::fs::write(&empty, "").expect("write");
    let exited = b.config(&format!("client_ca = {:?}\n", empty.display().to_string())).run_to_exit();
    assert!(!exited.status.success());
    assert!(exited.stderr.contains("no certificate in the file"), "{}", exited.stderr);
}

#[test]
fn a_client_hello_split_over_records_still_picks_its_site() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use std::io::{Read, Write};
    let s = setup("off");
    let chain = vec![CertificateDer::from_pem_file(&s.alice.0).expect("certificate")];
    let key = PrivateKeyDer::from_pem_file(&s.alice.1).expect("key");
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let algs = provider.signature_verification_algorithms;
    let mut cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(provider))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(AcceptAnyCert(algs)))
        .with_client_auth_cert(chain, key)
        .expect("client certificate");
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from("secure.test").expect("name");
    let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(cfg), name).expect("client");
    let mut first = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut first).expect("write_tls");
    }
    // The one ClientHello record sent as three.
    let records = tls_records(&first);
    assert_eq!(records.len(), 1, "one ClientHello record");
    let body = &records[0].1;
    let mut split = Vec::new();
    for chunk in body.chunks(body.len() / 3 + 1) {
        split.extend_from_slice(&first[..3]);
        split.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
        split.extend_from_slice(chunk);
    }
    let mut tcp = std::net::TcpStream::connect(s.srv.addr()).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    tcp.write_all(&split).expect("send the ClientHello");
    let mut stream = rustls::Stream::new(&mut conn, &mut tcp);
    stream.write_all(REQUEST.as_bytes()).expect("request");
    let mut got = Vec::new();
    let _ = stream.read_to_end(&mut got);
    assert!(got.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&got));
    assert_eq!(subjects(&s.srv, 1), vec![Some("CN=alice,O=ktlsd tests".to_string())]);
}
