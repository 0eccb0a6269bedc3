//! Bytes into kTLS sockets under backpressure. Proxied bodies leave by a
//! non-blocking `splice(2)` (with `SPLICE_F_MORE`) and files by `sendfile(2)`; a
//! kTLS socket that is full makes both return short or `EAGAIN`, and another
//! project reports a non-blocking splice into kTLS that said it moved bytes the peer
//! never got. Here every socket of the guest gets tiny buffers (the test sets
//! `net.ipv4.tcp_rmem` and `tcp_wmem` to 4-8 KiB: the client's receive window and
//! the server's send buffer), and clients read at full speed or slowly (curl's
//! `--limit-rate` pauses between reads), over HTTP/1.1 and HTTP/2, for bodies of 1
//! byte to 64 MiB of odd sizes; each body is compared byte for byte (SHA-256), and
//! the access log and the splice counter say how the bytes left.

use std::time::Duration;

use testkit::{assert_body, fetch};

use crate::cache::{metrics_at, sample, LOG_FORMAT};
use crate::harness::*;
use testkit::Origin;

/// What the origin's `/api/big?n=N` sends: 64 KiB pieces of `i % 251`.
fn big(n: usize) -> Vec<u8> {
    let piece: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    piece.iter().copied().cycle().take(n).collect()
}

/// `net.ipv4.tcp_rmem` and `tcp_wmem` (min default max) set small while it lives,
/// then put back.
struct TinyBuffers {
    saved: Vec<(&'static str, String)>,
}

impl TinyBuffers {
    fn set() -> TinyBuffers {
        let mut saved = Vec::new();
        for key in ["/proc/sys/net/ipv4/tcp_rmem", "/proc/sys/net/ipv4/tcp_wmem"] {
            saved.push((key, std::fs::read_to_string(key).expect("read the TCP buffer sysctl")));
            std::fs::write(key, "4096 8192 8192").expect("set the TCP buffer sysctl (root in the guest)");
        }
        TinyBuffers { saved }
    }
}

impl Drop for TinyBuffers {
    fn drop(&mut self) {
        for (key, value) in &self.saved {
            let _ = std::fs::write(key, value);
        }
    }
}

/// Sizes: 1 byte, odd sizes around the piece and record boundaries, and 64 MiB; the
/// rate (bytes/s) a client reads at (`None`: as fast as it can).
const CASES: &[(usize, Option<u32>)] = &[
    (1, None),
    (16_383, Some(200_000)),
    (65_537, None),
    (1_000_003, Some(400_000)),
    (3_333_333, None),
    (64 * MIB + 7, None),
];

const SPLICED: &str = "ktlsd_proxy_body_bytes_total{by=\"splice\"}";

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn spliced_and_sendfile_bodies_arrive_whole_under_backpressure() {
    let _tiny = TinyBuffers::set();
    let origin = Origin::start("a");
    let dir = tempfile::tempdir().expect("temp dir");
    let sock = dir.path().join("admin.sock");
    let config = dir.path().join("ktlsd.toml");
    let rule = format!("[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\n", origin.url());
    std::fs::write(&config, rule).expect("write ktlsd.toml");
    let files: Vec<(String, Vec<u8>)> = CASES.iter().map(|&(n, _)| (format!("f{n}.bin"), big(n))).collect();
    let files: Vec<(&str, Vec<u8>)> = files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    let (config, sock_arg) = (config.display().to_string(), sock.display().to_string());
    let args =
        ["--config", &config, "--admin", &sock_arg, "--access-log-format", "custom", "--access-log-custom", LOG_FORMAT];
    let server = KtlsServer::start(&files, &args);
    let metrics = || metrics_at(&sock);
    let before = metrics();
    let mut requests = 0;
    let mut spliced_want = 0usize;
    for protocol in ["--http1.1", "--http2"] {
        for &(n, rate) in CASES {
            let rate_arg = rate.map(|r| r.to_string());
            let mut flags = vec![protocol];
            if let Some(r) = &rate_arg {
                flags.extend(["--limit-rate", r.as_str()]);
            }
            let want = big(n);
            for path in [format!("/api/big?n={n}"), format!("/f{n}.bin")] {
                let r = fetch(&server.url(&path), &flags);
                assert_eq!(r.status, 200, "{protocol} {path}");
                assert_body(&format!("{protocol} {path} at {rate:?} B/s"), &r.body, &want);
                requests += 1;
            }
            if n >= MIB {
                spliced_want += n - 64 * 1024;
            }
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let spliced = sample(&metrics(), SPLICED) - sample(&before, SPLICED);
    assert!(spliced >= spliced_want as f64, "{spliced} bytes spliced, want at least {spliced_want}");
    let s = server.stop();
    // Large bodies leave by splice (proxied) and sendfile (files) on both protocols.
    for &(n, _) in CASES.iter().filter(|(n, _)| *n >= MIB) {
        for (path, how) in [(format!("/api/big?n={n}"), " body=splice "), (format!("/f{n}.bin"), " body=sendfile ")] {
            let lines = s.access_log.iter().filter(|l| l.contains(&format!("\"GET {path} HTTP/")) && l.contains(how));
            assert_eq!(lines.count(), 2, "{path}: want two lines with{how}\n{:#?}", s.access_log);
        }
    }
    assert_ktls(
        "spliced_and_sendfile_bodies_arrive_whole_under_backpressure",
        &s,
        &Expect::conns(requests as u64, requests),
    );
}
