//! The bad-record table (`testkit::bad_records`) on the kernel record layer,
//! one named test per version × cipher cell.

use std::time::Duration;

use testkit::assert_body;

use crate::harness::*;
use crate::suites::*;

/// The bad-record table of `records_bad.rs` (`testkit::bad_records`) on the
/// kernel record layer: after a real handshake, each record that breaks the
/// protocol gets the kernel path's fatal alert within a couple of seconds,
/// although the idle timeout is 60 s, and the server goes on serving. A record
/// that fails authentication ends its connection with a FIN only: the kernel
/// then refuses to send the alert.
fn bad_records_on_ktls(test: &str, v: V, c: Cipher) {
    let files = standard_files();
    let server = KtlsServer::start(&files, &["--idle-timeout", "60"]);
    let prompt = Duration::from_secs(3);
    let mut failures = Vec::new();
    let (mut conns, mut requests) = (0, 0);
    for case in testkit::bad_records() {
        match case.versions {
            testkit::Versions::Tls13 if v != V::Tls13 => continue,
            testkit::Versions::Tls12 if v != V::Tls12 => continue,
            _ => {}
        }
        let mut client = testkit::ForgingClient::connect(server.addr(), v.rustls(), Some(rustls_suite(v, c)));
        conns += 1;
        assert_eq!(client.get("/one").status, 200, "{v:?} {c:?}: request before `{}`", case.name);
        requests += 1;
        let bad = (case.forge)(&mut client);
        client.send_raw(&bad);
        let end = client.read_until_end(Duration::from_secs(70));
        let alerts = end.alerts();
        println!("[{test}] {}: alerts {alerts:?}, {:?} after {:?}", case.name, end.how, end.elapsed);
        let want: Vec<(u8, u8)> = case.kernel.map(|d| (2, d)).into_iter().collect();
        if alerts != want {
            failures.push(format!("{}: alerts {alerts:?}, want {want:?} ({:?})", case.name, end.how));
        }
        if end.elapsed > prompt {
            failures.push(format!("{}: the connection ended {:?} after {:?}", case.name, end.how, end.elapsed));
        }
    }
    let (code, body) = curl_get(&server.url("/r16385"), &curl_tls_args(v, c), &[]);
    assert_eq!(code, 200);
    assert_body("after the bad records", &body, file(&files, "r16385"));
    conns += 1;
    requests += 1;
    let s = server.stop();
    assert!(failures.is_empty(), "{test}: {} cases failed:\n{}\n{}", failures.len(), failures.join("\n"), s.stderr);
    // Only the record whose tag does not authenticate counts as a decrypt
    // error; one without a content type is refused after decryption, the
    // others for their length or contents.
    let decrypt_errors = s.tls.get("TlsDecryptError");
    assert_eq!(decrypt_errors, 1, "{test}: TlsDecryptError; {}", s.tls.summary());
    assert_ktls(test, &s, &Expect { decrypt_errors, ..Expect::conns(conns, requests) });
}

cells!(bad_records_on_ktls;
    tls13_aes128gcm: Tls13 Aes128Gcm,
    tls13_chacha20: Tls13 Chacha20,
    tls12_aes128gcm: Tls12 Aes128Gcm,
    tls12_chacha20: Tls12 Chacha20,
);
