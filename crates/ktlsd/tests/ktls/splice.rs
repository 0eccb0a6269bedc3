//! Proxied bodies from a plain `http://` upstream into kTLS client sockets by
//! `splice(2)`: the body moves upstream socket -> pipe -> client socket and the
//! kernel encrypts it, never through user space. Proven by the access log
//! (`body=splice tls=ktls`), `ktlsd_proxy_body_bytes_total{by="splice"}` and
//! tls_stat; the bytes by hash. An upstream that closes mid-body gives the
//! client a cut response (never a short body passed off as complete), and the
//! next request is served.

use testkit::{assert_body, curl, fetch};

use crate::cache::{sample, Proxy};
use crate::harness::*;
use crate::origin::Origin;

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
    const N: usize = 4 * MIB + MIB / 2;
    let origin = Origin::start("a");
    let proxy = Proxy::start(&origin, false);
    let before = proxy.metrics();
    let target = format!("/api/big?n={N}");
    let r = fetch(&proxy.server.url(&target), &["--http1.1"]);
    assert_eq!(r.status, 200);
    assert_body("proxied /api/big", &r.body, &big(N));
    let after = proxy.metrics_once(&before, SPLICED, (N - 64 * 1024) as f64);
    let spliced = sample(&after, SPLICED) - sample(&before, SPLICED);
    let copied = sample(&after, COPIED) - sample(&before, COPIED);
    assert_eq!(spliced + copied, N as f64, "spliced {spliced} + copied {copied} bytes, want the body's {N}");
    assert!(spliced >= (N - 64 * 1024) as f64, "only {spliced} of {N} bytes spliced (copied {copied})");
    let s = proxy.server.stop();
    assert_eq!(logged(&s, &target), vec![(200, N as u64)], "{:#?}", s.access_log);
    assert!(s.access_log[0].ends_with(" body=splice tls=ktls"), "{}", s.access_log[0]);
    assert_ktls("proxied_body_by_splice", &s, &Expect::conns(1, 1));
}

/// An upstream that announces 100 bytes more than it sends, then closes: the
/// client gets a cut response (curl fails, fewer bytes than the Content-Length)
/// after the spliced part, and the next request is answered whole.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn upstream_closing_mid_splice_cuts_the_response() {
    const N: usize = 3_000_000;
    let origin = Origin::start("a");
    let proxy = Proxy::start(&origin, false);
    let before = proxy.metrics();
    let target = format!("/api/set/cut?n={N}&short=1");
    let write_out = "%{http_code} %header{content-length} %{size_download}";
    let out = curl(&["--http1.1", "-o", "/dev/null", "-w", write_out, &proxy.server.url(&target)]);
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

    let next = fetch(&proxy.server.url("/api/big?n=100000"), &["--http1.1"]);
    assert_eq!(next.status, 200);
    assert_body("the next request", &next.body, &big(100_000));
    let s = proxy.server.stop();
    assert!(
        s.stderr.contains("response cut after") && s.stderr.contains("before the end of the body"),
        "no log line of the cut response:\n{}",
        s.stderr
    );
    let cut = logged(&s, &target);
    assert_eq!(cut.len(), 1, "{:#?}", s.access_log);
    assert!(cut[0].1 <= N as u64, "{:?}", cut);
    assert_ktls("upstream_closing_mid_splice_cuts_the_response", &s, &Expect::conns(2, 2));
}
