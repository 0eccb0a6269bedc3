//! Proxied bodies from a plain `http://` upstream into kTLS client sockets by
//! `splice(2)`: the body moves upstream socket -> pipe -> client socket and the
//! kernel encrypts it, never through user space. Proven by the access log
//! (`body=splice tls=ktls`), `ktlsd_proxy_body_bytes_total{by="splice"}` and
//! tls_stat; the bytes by hash. Over HTTP/1.1 and HTTP/2 (each DATA frame's
//! payload spliced after its header). An upstream that closes mid-body gives
//! the client a cut response or a reset stream (never a short body passed off as
//! complete), and the next request is served.

use std::time::Duration;

use testkit::{assert_body, curl, fetch, run_with_timeout};

use crate::cache::{sample, Proxy};
use crate::harness::*;
use testkit::Origin;

/// What the origin's `/api/big?n=N` sends: 64 KiB pieces of `i % 251`.
fn big(n: usize) -> Vec<u8> {
    let piece: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    piece.iter().copied().cycle().take(n).collect()
}

const SPLICED: &str = "ktlsd_proxy_body_bytes_total{by=\"splice\"}";
const COPIED: &str = "ktlsd_proxy_body_bytes_total{by=\"copy\"}";

/// A 4.5 MiB Content-Length body: all but what arrived with the head moves by
/// splice, and arrives intact.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn proxied_body_by_splice() {
    body_by_splice("proxied_body_by_splice", "--http1.1");
}

/// The same over HTTP/2: each DATA frame's payload is spliced after its header.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn proxied_body_by_splice_over_http2() {
    body_by_splice("proxied_body_by_splice_over_http2", "--http2");
}

/// Two fetches of a body, each on its own client connection: all but what arrived
/// with the head moves by splice, both arrive intact, and the second goes over the
/// same upstream connection (the one worker pooled it once the spliced body was
/// through).
fn body_by_splice(name: &str, protocol: &str) {
    const N: usize = 4 * MIB + MIB / 2;
    let origin = Origin::start("a");
    let proxy = Proxy::start(&origin, false);
    let before = proxy.metrics();
    let target = format!("/api/big?n={N}");
    for _ in 0..2 {
        let r = fetch(&proxy.server.url(&target), &[protocol]);
        assert_eq!(r.status, 200);
        assert_body("proxied /api/big", &r.body, &big(N));
    }
    let after = proxy.metrics_once(&before, SPLICED, 2.0 * (N - 64 * 1024) as f64);
    let spliced = sample(&after, SPLICED) - sample(&before, SPLICED);
    let copied = sample(&after, COPIED) - sample(&before, COPIED);
    assert_eq!(
        spliced + copied,
        2.0 * N as f64,
        "spliced {spliced} + copied {copied} bytes, want twice the body's {N}"
    );
    assert!(spliced >= 2.0 * (N - 64 * 1024) as f64, "only {spliced} of 2 x {N} bytes spliced (copied {copied})");
    let ports: Vec<String> = origin
        .requests()
        .iter()
        .filter(|l| l.contains(&target))
        .filter_map(|l| l.rsplit(' ').next().map(str::to_string))
        .collect();
    assert!(ports.len() == 2 && ports[0] == ports[1], "upstream connections (peer ports) of the two: {ports:?}");
    let s = proxy.server.stop();
    assert_eq!(logged(&s, &target), vec![(200, N as u64); 2], "{:#?}", s.access_log);
    assert!(s.access_log.iter().all(|l| l.ends_with(" body=splice tls=ktls")), "{:#?}", s.access_log);
    assert_ktls(name, &s, &Expect::conns(2, 2));
}

/// An upstream that announces 100 bytes more than it sends, then closes: the
/// client gets a cut response (curl fails, fewer bytes than the Content-Length)
/// after the spliced part, and the next request is answered whole.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn upstream_closing_mid_splice_cuts_the_response() {
    cut_mid_splice("upstream_closing_mid_splice_cuts_the_response", "--http1.1", "response cut after");
}

/// The same over HTTP/2: the stream is reset (INTERNAL_ERROR), and the
/// connection serves the next request.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn upstream_closing_mid_splice_resets_the_http2_stream() {
    cut_mid_splice("upstream_closing_mid_splice_resets_the_http2_stream", "--http2", "response cut after");
}

fn cut_mid_splice(name: &str, protocol: &str, logged_as: &str) {
    const N: usize = 3_000_000;
    let origin = Origin::start("a");
    let proxy = Proxy::start(&origin, false);
    let before = proxy.metrics();
    let target = format!("/api/set/cut?n={N}&short=1");
    let write_out = "%{http_code} %header{content-length} %{size_download}";
    let out = curl(&[protocol, "-o", "/dev/null", "-w", write_out, &proxy.server.url(&target)]);
    let (said, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "curl took a cut body for a whole one: {said}\n{err}");
    let fields: Vec<usize> = said.split_whitespace().filter_map(|f| f.parse().ok()).collect();
    assert!(
        matches!(fields[..], [200, length, got] if length == N + 100 && got <= N),
        "want 200, Content-Length {} and at most the {N} bytes the upstream sent; curl says {said}\n{err}",
        N + 100
    );
    let spliced = sample(&proxy.metrics_once(&before, SPLICED, 1.0), SPLICED) - sample(&before, SPLICED);
    assert!(spliced > 0.0, "nothing moved by splice before the upstream closed");

    let next = fetch(&proxy.server.url("/api/big?n=100000"), &[protocol]);
    assert_eq!(next.status, 200);
    assert_body("the next request", &next.body, &big(100_000));
    let s = proxy.server.stop();
    assert!(
        s.stderr.contains(logged_as) && s.stderr.contains("before the end of the body"),
        "no log line of the cut response:\n{}",
        s.stderr
    );
    let cut = logged(&s, &target);
    assert_eq!(cut.len(), 1, "{:#?}", s.access_log);
    assert!(cut[0].1 <= N as u64, "{:?}", cut);
    assert_ktls(name, &s, &Expect::conns(2, 2));
}

/// Over HTTP/2 each spliced DATA frame shares its record with its header: nghttp
/// through a relay that notes the server's records gets the whole body, with no
/// record holding a frame header alone and none over the maximum.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn spliced_http2_frames_share_a_record_with_their_header() {
    const N: usize = 2 * MIB;
    let origin = Origin::start("a");
    let proxy = Proxy::start(&origin, false);
    let before = proxy.metrics();
    let (relay, records) = crate::h2::record_lengths_proxy(proxy.server.addr());
    let url = format!("https://{relay}/api/big?n={N}");
    let out = run_with_timeout(
        std::process::Command::new("nghttp").args(["-nv", "-w", "30", "-W", "30", &url]),
        None,
        Duration::from_secs(90),
    );
    assert!(out.status.success(), "nghttp failed: {}", String::from_utf8_lossy(&out.stderr));
    let frames = crate::h2::data_frames(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(frames.iter().sum::<usize>(), N, "DATA bytes");
    let spliced =
        sample(&proxy.metrics_once(&before, SPLICED, (N - 64 * 1024) as f64), SPLICED) - sample(&before, SPLICED);
    assert!(spliced >= (N - 64 * 1024) as f64, "only {spliced} of {N} bytes spliced");
    let records = records.join().expect("relay");
    // TLS 1.3 AES-GCM: a record's length field is its plaintext + 1 (content type) + 16 (tag).
    let lone_headers = records.iter().filter(|&&(t, n)| t == 23 && n == 9 + 17).count();
    assert!(
        lone_headers <= 2,
        "{lone_headers} records of a lone frame header: {:?}",
        &records[..records.len().min(40)]
    );
    assert!(records.iter().all(|&(_, n)| n <= 16384 + 17 + 256), "no record over the maximum");
    let full_frames = frames.iter().filter(|&&n| n == 16384 - 9).count();
    let full_records = records.iter().filter(|&&(t, n)| t == 23 && n == 16384 + 17).count();
    assert!(full_records + 8 >= full_frames, "{full_records} full records for {full_frames} full DATA frames");
    let s = proxy.server.stop();
    assert_eq!(logged(&s, "/api/big?n=2097152"), vec![(200, N as u64)], "{:#?}", s.access_log);
    assert_ktls("spliced_http2_frames_share_a_record_with_their_header", &s, &Expect::conns(1, 1));
}
