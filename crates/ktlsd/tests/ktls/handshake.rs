//! Handshake inputs before kTLS takes over: handshake messages split across
//! records, malformed ClientHellos, and refused handshakes.

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use testkit::{assert_body, get_request_with};

use crate::harness::*;
use crate::suites::*;
use crate::wire::*;

/// An ALPN list long enough that `-max_send_frag 512` splits the ClientHello
/// over several records.
fn long_alpn() -> String {
    let extra: Vec<String> = (0..40).map(|i| format!("proto-{i:02}-{}", "x".repeat(20))).collect();
    format!("http/1.1,{}", extra.join(","))
}

/// Handshake messages spanning records: s_client with 512-byte records, and a
/// ClientHello over 16 KiB from rustls; each connection then runs on kTLS.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn handshake_split_across_records_then_ktls() {
    let files = standard_files();
    let server = KtlsServer::start(&files, &[]);
    let alpn = long_alpn();
    let mut requests = 0;
    for v in [V::Tls13, V::Tls12] {
        let mut tls = s_client_tls_args(v, Cipher::Aes128Gcm);
        tls.extend(["-max_send_frag".into(), "512".into(), "-alpn".into(), alpn.clone()]);
        let r = s_client_get(server.addr(), &tls, &get_request_with("/r16385", "Connection: close\r\n"));
        assert_eq!(r.status, 200, "{v:?} s_client -max_send_frag 512");
        assert_body(&format!("{v:?} split ClientHello /r16385"), &r.body, file(&files, "r16385"));
        requests += 1;

        let mut cfg = (*client_config(v, None)).clone();
        cfg.alpn_protocols = (0..120).map(|i| format!("p{i:03}-{}", "y".repeat(200)).into_bytes()).collect();
        cfg.alpn_protocols.push(b"http/1.1".to_vec());
        let cfg = Arc::new(cfg);
        let hello = testkit::client_hello(cfg.clone());
        assert!(hello.len() > 16384 + 5, "{v:?}: ClientHello of {} bytes", hello.len());
        let mut c = WireClient::connect(server.addr(), &cfg);
        let r = c.get("/big");
        assert_eq!(r.status, 200, "{v:?} ClientHello over 16 KiB");
        assert_body(&format!("{v:?} big ClientHello /big"), &r.body, file(&files, "big"));
        requests += 1;
    }
    let s = server.stop();
    assert_ktls_after_refusals("handshake_split_across_records_then_ktls", &s, 4, 0, requests);
}

/// The nine bytes that made rustls panic in the handshake error path (a
/// ClientHello header announcing 64 KiB in a 4-byte record), and a few mutated
/// ClientHellos: no panic, then a kTLS request, then a prompt exit.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn malformed_client_hello_then_ktls_and_prompt_exit() {
    let files = standard_files();
    let server = KtlsServer::start(&files, &["--shutdown-timeout", "60"]);
    let mut inputs = vec![vec![0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x01, 0x00, 0x00]];
    let hello = testkit::client_hello(client_config(V::Tls13, None));
    // The ClientHello with its handshake length field raised, and cut short.
    let mut long = hello.clone();
    long[8] = long[8].wrapping_add(1);
    inputs.push(long);
    inputs.push(hello[..hello.len() - 7].to_vec());
    for input in &inputs {
        let mut s = TcpStream::connect(server.addr()).unwrap();
        let _ = s.write_all(input);
        let _ = s.shutdown(std::net::Shutdown::Write);
        assert!(testkit::read_raw_until_closed(&mut s, Duration::from_secs(20)).1, "left open after {input:02x?}");
    }
    let (code, body) = curl_get(&server.url("/odd"), &[], &[]);
    assert_eq!(code, 200);
    assert_body("after malformed ClientHellos", &body, file(&files, "odd"));
    let s = server.stop();
    assert_ktls_after_refusals("malformed_client_hello_then_ktls_and_prompt_exit", &s, 1, inputs.len() as u64, 1);
}

/// A refused handshake gets the whole refusal: TLS 1.3 fails after the
/// ServerHello (no common ALPN protocol), so ServerHello, ChangeCipherSpec and
/// the encrypted alert must all arrive for the client to read the alert; TLS 1.2
/// gets a plaintext alert. Then a request runs on kTLS.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn refused_handshake_alert_is_complete_then_ktls() {
    let files = standard_files();
    let server = KtlsServer::start(&files, &[]);
    for v in [V::Tls13, V::Tls12] {
        let mut cfg = (*client_config(v, None)).clone();
        cfg.alpn_protocols = vec![b"spdy/3.1".to_vec()];
        match testkit::TlsClient::connect_with(server.addr(), Arc::new(cfg)) {
            Ok(_) => panic!("{v:?}: handshake succeeded without a common ALPN protocol"),
            Err(e) => assert!(e.to_string().contains("NoApplicationProtocol"), "{v:?}: the client saw {e}"),
        }
    }
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.write_all(&testkit::client_hello(client_config(V::Tls12, Some(rustls_suite(V::Tls12, Cipher::Aes128Gcm)))))
        .unwrap();
    // A fatal alert from the client after its ClientHello ends that handshake too.
    s.write_all(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 46]).unwrap();
    let (_, closed) = testkit::read_raw_until_closed(&mut s, Duration::from_secs(20));
    assert!(closed);
    let (code, body) = curl_get(&server.url("/r16384"), &[], &[]);
    assert_eq!(code, 200);
    assert_body("after refused handshakes", &body, file(&files, "r16384"));
    let s = server.stop();
    assert_ktls_after_refusals("refused_handshake_alert_is_complete_then_ktls", &s, 1, 3, 1);
    assert_eq!(s.stat("handshake_protocol_errors"), 2, "{}", s.stderr);
    assert_eq!(s.stat("handshake_client_alerts"), 1, "{}", s.stderr);
}
