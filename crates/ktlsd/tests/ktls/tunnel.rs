//! A WebSocket tunnel over kTLS: the bytes an HTTP/1.1 tunnel's plain upstream
//! sends move by `splice(2)` from its socket into the client's kTLS socket, never
//! through user space. Python's `websockets` as client and upstream (the
//! scripts of `tests/tunnel`): a 1 MB message and its echo, proven by
//! `ktlsd_proxy_body_bytes_total{by="splice"}`, the access log (`101`,
//! `body=splice tls=ktls`) and tls_stat.

use std::process::Command;
use std::time::Duration;

use testkit::{run_with_timeout, ScriptUpstream};

use crate::cache::{sample, Proxy};
use crate::harness::*;

const SPLICED: &str = "ktlsd_proxy_body_bytes_total{by=\"splice\"}";

fn script(name: &str) -> String {
    format!("{}/tests/tunnel/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn websocket_tunnel_bytes_from_the_upstream_move_by_splice() {
    let up = ScriptUpstream::start(&script("ws_upstream.py"));
    let proxy = Proxy::start_for(&up.url(), false);
    let before = proxy.metrics();
    let url = format!("wss://127.0.0.1:{}/api/echo", proxy.server.port());
    let out = run_with_timeout(
        Command::new("/usr/bin/python3").arg(script("ws_client.py")).args([url.as_str(), "echo"]),
        None,
        Duration::from_secs(180),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ws_client.py echo:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for check in ["text", "binary", "1MB", "ping", "order", "close"] {
        assert!(text.lines().any(|l| l == format!("ok {check}")), "{check}: {text}");
    }
    // The 1 MB echo (and the small ones) came from the upstream by splice.
    let after = proxy.metrics_once(&before, SPLICED, 1_000_000.0);
    let spliced = sample(&after, SPLICED) - sample(&before, SPLICED);
    assert!(spliced >= 1_000_000.0, "only {spliced} bytes of the tunnel spliced");
    let s = proxy.server.stop();
    let tunnel = logged(&s, "/api/echo");
    assert!(matches!(tunnel[..], [(101, n)] if n as f64 >= spliced), "{:#?}", s.access_log);
    assert!(s.access_log.iter().all(|l| l.ends_with(" body=splice tls=ktls")), "{:#?}", s.access_log);
    assert_ktls("websocket_tunnel_bytes_from_the_upstream_move_by_splice", &s, &Expect::conns(1, 1));
}
