//! The version × cipher matrix: one server restricted to one cell, every file
//! size through curl and s_client, plus ranges; one named test per cell.

use std::collections::HashMap;

use testkit::{assert_body, get_request_with};

use crate::harness::{assert_ktls, file, logged, standard_files, Expect, KtlsServer};
use crate::suites::*;

/// One server restricted to one version and suite; every file size through
/// both clients, plus range requests; every body checked byte for byte.
fn matrix(test: &str, v: V, c: Cipher) {
    let files = standard_files();
    let server = KtlsServer::start(&files, &["--tls-versions", v.server_arg(), "--cipher-suites", openssl_name(v, c)]);
    let curl_tls = curl_tls_args(v, c);
    let ossl_tls = s_client_tls_args(v, c);
    let mut expected_log: Vec<(String, u16, u64)> = Vec::new();

    for (name, data) in &files {
        let path = format!("/{name}");
        let (code, body) = curl_get(&server.url(&path), &curl_tls, &[]);
        assert_eq!(code, 200, "curl {path}");
        assert_body(&format!("curl {path} ({test})"), &body, data);
        expected_log.push((path, 200, data.len() as u64));
    }
    for (name, data) in &files {
        let path = format!("/{name}");
        let r = s_client_get(server.addr(), &ossl_tls, &get_request_with(&path, "Connection: close\r\n"));
        assert_eq!(r.status, 200, "s_client {path}");
        assert_body(&format!("s_client {path} ({test})"), &r.body, data);
        expected_log.push((path, 200, data.len() as u64));
    }

    // Ranges: a large one inside the big file (several full records plus
    // partial ones) and a small one across the 16 KiB record boundary.
    let big = file(&files, "big");
    let (code, body) = curl_get(&server.url("/big"), &curl_tls, &["-r", "1000000-3499999"]);
    assert_eq!(code, 206, "curl range");
    assert_body(&format!("curl range ({test})"), &body, &big[1_000_000..3_500_000]);
    expected_log.push(("/big".into(), 206, 2_500_000));
    let r16385 = file(&files, "r16385");
    let r = s_client_get(
        server.addr(),
        &ossl_tls,
        &get_request_with("/r16385", "Range: bytes=16000-16384\r\nConnection: close\r\n"),
    );
    assert_eq!(r.status, 206, "s_client range");
    assert_eq!(r.header("Content-Range"), Some("bytes 16000-16384/16385"));
    assert_body(&format!("s_client range ({test})"), &r.body, &r16385[16000..]);
    expected_log.push(("/r16385".into(), 206, 385));

    let s = server.stop();
    assert_ktls(test, &s, &Expect::conns(expected_log.len() as u64, expected_log.len()));
    assert_eq!(s.stat("errors"), 0, "{}", s.stderr);
    // The server's own account of each body (catches a short body that a
    // client might not notice).
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (path, status, bytes) in &expected_log {
        let i = seen.entry(path.clone()).or_default();
        let entries = logged(&s, path);
        let (st, b) =
            entries.get(*i).copied().unwrap_or_else(|| panic!("no log line #{i} for {path}: {:?}", s.access_log));
        assert_eq!(st, *status, "access log status for GET {path} (#{i}): {:?}", s.access_log);
        assert_eq!(b, *bytes, "access log bytes for GET {path} (#{i}): {:?}", s.access_log);
        *i += 1;
    }
}

every_cell!(matrix);
