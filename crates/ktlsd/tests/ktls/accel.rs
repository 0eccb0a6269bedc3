//! `X-Accel-Redirect` on kTLS: an upstream (the Python origin of the proxy tests)
//! names a file beneath the rule's `accel_root`, and the file leaves as a static
//! file does, by `sendfile` into the client's kTLS socket, whole and as a range,
//! over HTTP/1.1 and HTTP/2. Proven by the access log (`body=sendfile tls=ktls`
//! with the file's bytes), tls_stat (every connection on kTLS) and the bytes'
//! hash.

use testkit::{assert_body, fetch, pattern, Origin};

use crate::cache::LOG_FORMAT;
use crate::harness::*;

fn accel_by_sendfile(test: &str, proto: &str) {
    const N: usize = 2 * MIB + 123;
    let origin = Origin::start("a");
    let dir = tempfile::tempdir().expect("temp dir");
    let accel = dir.path().join("protected");
    std::fs::create_dir(&accel).expect("accel_root");
    let body = pattern(N, 3);
    std::fs::write(accel.join("report.bin"), &body).expect("the accel file");
    let config = dir.path().join("ktlsd.toml");
    let text = format!(
        "[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\naccel_root = {:?}\n",
        origin.url(),
        accel.display().to_string()
    );
    std::fs::write(&config, text).expect("write ktlsd.toml");
    let config = config.display().to_string();
    let args = ["--config", &config, "--access-log-format", "custom", "--access-log-custom", LOG_FORMAT];
    let server = KtlsServer::start(&[("index.txt", b"static".to_vec())], &args);

    let target = "/api/set/accel?h=X-Accel-Redirect:/report.bin";
    let r = fetch(&server.url(target), &[proto]);
    assert_eq!(r.status, 200, "{proto}: {}", r.body_str());
    assert_body(&format!("{proto}: the accel file"), &r.body, &body);
    assert_eq!(r.header("x-accel-redirect"), None, "{proto}: the field never reaches the client");
    let r = fetch(&server.url(target), &[proto, "-H", "Range: bytes=1000000-1999999"]);
    assert_eq!(r.status, 206, "{proto}");
    assert_eq!(r.body, body[1_000_000..2_000_000], "{proto}: the range");

    let s = server.stop();
    let line = |tail: &str| s.access_log.iter().filter(|l| l.contains(target) && l.ends_with(tail)).count();
    assert_eq!(line(&format!(" 200 {N} body=sendfile tls=ktls")), 1, "{proto}: the file's line:\n{:#?}", s.access_log);
    assert_eq!(line(" 206 1000000 body=sendfile tls=ktls"), 1, "{proto}: the range's line:\n{:#?}", s.access_log);
    assert_ktls(test, &s, &Expect::conns(2, 2));
}

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn x_accel_redirect_file_by_sendfile_h1() {
    accel_by_sendfile("x_accel_redirect_file_by_sendfile_h1", "--http1.1");
}

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn x_accel_redirect_file_by_sendfile_h2() {
    accel_by_sendfile("x_accel_redirect_file_by_sendfile_h2", "--http2");
}
