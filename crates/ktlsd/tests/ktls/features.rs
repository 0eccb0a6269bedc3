//! What the request phases and answers added beside plain files do on kTLS:
//! several byte ranges as one `multipart/byteranges` answer (file parts by
//! sendfile between the delimiters), bodies compressed on the fly (sent from
//! their store by sendfile), and client certificates, checked in the user-space
//! handshake before the kernel takes the session over.

use testkit::{assert_body, client_ca, client_cert, curl, fetch};

use crate::harness::*;

/// The position of `needle` in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Three ranges of a 5 MiB file, one of them 100,000 bytes long, over HTTP/1.1
/// and HTTP/2: each part's bytes follow its own Content-Range head, exactly.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn multirange_over_ktls() {
    let files = standard_files();
    let big = file(&files, "big");
    let server = KtlsServer::start(&files, &[]);
    let ranges = [(0usize, 9usize), (100_000, 199_999), (5_000_000, 5_000_009)];
    let spec: Vec<String> = ranges.iter().map(|(a, b)| format!("{a}-{b}")).collect();
    for proto in ["--http1.1", "--http2"] {
        let r = fetch(&server.url("/big"), &[proto, "-r", &spec.join(",")]);
        assert_eq!(r.status, 206, "{proto}");
        let ctype = r.header("content-type").unwrap_or_default();
        assert!(ctype.starts_with("multipart/byteranges; boundary="), "{proto}: {ctype}");
        for (from, to) in ranges {
            let head = format!("Content-Range: bytes {from}-{to}/{}\r\n\r\n", big.len());
            let at = find(&r.body, head.as_bytes()).unwrap_or_else(|| panic!("{proto}: no part {from}-{to}"));
            let part = &r.body[at + head.len()..(at + head.len() + to + 1 - from).min(r.body.len())];
            assert_body(&format!("{proto} part {from}-{to}"), part, &big[from..=to]);
        }
    }
    let s = server.stop();
    assert_ktls("multirange_over_ktls", &s, &Expect::conns(2, 2));
}

/// A text file compressed on the fly: made once, then sent from the store,
/// over HTTP/1.1 and HTTP/2; curl decodes each to the file's exact bytes.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn compressed_bodies_over_ktls() {
    let text: Vec<u8> = (0..40_000).flat_map(|i: u32| format!("line {i} of a page\n").into_bytes()).collect();
    let files = vec![("page.html", text.clone())];
    let server = KtlsServer::start(&files, &["--compress", "gzip"]);
    let mut requests = 0;
    for proto in ["--http1.1", "--http2", "--http1.1", "--http2"] {
        let r = fetch(&server.url("/page.html"), &[proto, "--compressed"]);
        assert_eq!((r.status, r.header("content-encoding")), (200, Some("gzip")), "{proto}");
        assert_body(&format!("{proto} page.html decoded"), &r.body, &text);
        requests += 1;
    }
    let s = server.stop();
    assert!(s.stat("compressed_hits") >= 1, "no answer came from the compressed-body store:\n{}", s.stderr);
    assert_ktls("compressed_bodies_over_ktls", &s, &Expect::conns(requests as u64, requests));
}

/// A server that requires client certificates: clients presenting one of its
/// CA's are served on kTLS with TLS 1.2 and 1.3; a client without one is
/// refused in the handshake and never reaches the kernel.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn client_certificates_over_ktls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (ca, issuer) = client_ca(dir.path(), "ktls");
    let (cert, key) = client_cert(dir.path(), "alice", &issuer);
    let files = standard_files();
    let server = KtlsServer::start(&files, &["--client-ca", &ca.display().to_string()]);
    let mut requests = 0;
    for version in [["--tlsv1.2", "--tls-max", "1.2"], ["--tlsv1.3", "--tls-max", "1.3"]] {
        let mut args = vec!["--http1.1", "--cert", &cert, "--key", &key];
        args.extend(version);
        let r = fetch(&server.url("/r16385"), &args);
        assert_eq!(r.status, 200, "{version:?}");
        assert_body(&format!("{version:?} /r16385"), &r.body, file(&files, "r16385"));
        requests += 1;
    }
    let refused = curl(&["-o", "/dev/null", "-w", "%{http_code}", &server.url("/one")]);
    assert!(!refused.status.success(), "served without a client certificate: {refused:?}");
    let s = server.stop();
    assert_ktls_after_refusals("client_certificates_over_ktls", &s, requests as u64, 1, requests);
}
