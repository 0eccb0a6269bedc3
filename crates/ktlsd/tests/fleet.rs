//! ktlsd as members of a fleet behind a real HAProxy.
//!
//! Draining for the balancer: two members behind HAProxy in TCP mode, which checks
//! each member's `/healthz` on its admin listener. `ktlsd drain` takes a member out
//! of rotation (its `/healthz` answers 503, HAProxy sends every new connection to
//! the other) while it still serves whoever reaches it; `ktlsd drain --undo` puts
//! it back.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::haproxy::Haproxy;
use testkit::origin::free_port;
use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// A member whose `/who.txt` says `name`, with an admin listener.
fn member(name: &str) -> (Server, SocketAddr) {
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let srv = Server::builder(BIN).file("who.txt", name).config(&format!("admin = \"{admin}\"\n")).start();
    (srv, admin)
}

/// `curl` for `url`: (status, body); status 0 when it failed.
fn get(url: &str) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sk", "--max-time", "10", "-w", "\n%{http_code}", url]);
    let out = run_with_timeout(&mut cmd, None, CLIENT_TIMEOUT);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.trim().parse().unwrap_or(0), body.to_string())
}

/// `ktlsd drain --admin ADDR [--undo]`: its exit status and output.
fn drain(admin: SocketAddr, undo: bool) -> (bool, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(["drain", "--admin", &admin.to_string()]);
    if undo {
        cmd.arg("--undo");
    }
    let out = run_with_timeout(&mut cmd, None, CLIENT_TIMEOUT);
    (out.status.success(), String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Which member answered each of `n` new connections through the balancer.
fn spread(port: u16, n: usize) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        let (status, body) = get(&format!("https://127.0.0.1:{port}/who.txt"));
        assert_eq!(status, 200, "through the balancer");
        *seen.entry(body).or_insert(0) += 1;
    }
    seen
}

/// Waits until `n` connections through the balancer all reach the members of `want`.
fn wait_spread(port: u16, want: &[&str]) -> BTreeMap<String, usize> {
    let t = Instant::now();
    loop {
        let seen = spread(port, 6);
        if seen.keys().map(String::as_str).eq(want.iter().copied()) || t.elapsed() > Duration::from_secs(15) {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_drained_member_leaves_the_balancer_and_still_serves() {
    let (a, a_admin) = member("a");
    let (b, b_admin) = member("b");
    let port = free_port();
    let check = |admin: SocketAddr| format!("check port {} inter 200ms fall 1 rise 1", admin.port());
    let lb = Haproxy::start(
        "tcp",
        &format!(
            "frontend f\n  bind 127.0.0.1:{port}\n  default_backend members\nbackend members\n  balance roundrobin\n  option httpchk GET /healthz\n  server a {} {}\n  server b {} {}\n",
            a.addr(),
            check(a_admin),
            b.addr(),
            check(b_admin)
        ),
        vec![port],
    );
    assert_eq!(wait_spread(lb.ports[0], &["a", "b"]).len(), 2, "both members in rotation");

    let (ok, said) = drain(a_admin, false);
    assert!(ok && said == "draining", "ktlsd drain: {said}");
    let health = get(&format!("http://{a_admin}/healthz"));
    assert_eq!(health, (503, "draining\n".to_string()));
    let seen = wait_spread(lb.ports[0], &["b"]);
    assert_eq!(seen.keys().collect::<Vec<_>>(), ["b"], "a drained member gets no new connection: {seen:?}");
    // Still serving whoever reaches it, and saying so in the status document.
    assert_eq!(get(&a.url("/who.txt")), (200, "a".to_string()));
    let (_, doc) = get(&format!("http://{a_admin}/status.json"));
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(doc["draining"], true);
    assert!(a.stderr().contains("member drained"), "the drain is logged");
    // A browser's drain from another origin is refused.
    let (status, _) = {
        let mut cmd = Command::new("curl");
        cmd.args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-H", "Origin: http://evil.test"])
            .arg(format!("http://{b_admin}/drain"));
        let out = run_with_timeout(&mut cmd, None, CLIENT_TIMEOUT);
        (String::from_utf8_lossy(&out.stdout).to_string(), ())
    };
    assert_eq!(status, "403");
    assert_eq!(get(&format!("http://{b_admin}/healthz")).0, 200);

    let (ok, said) = drain(a_admin, true);
    assert!(ok && said == "serving", "ktlsd drain --undo: {said}");
    assert_eq!(get(&format!("http://{a_admin}/healthz")).0, 200);
    assert_eq!(wait_spread(lb.ports[0], &["a", "b"]).len(), 2, "back in rotation");
    drop(lb);
    drop(b);
}

#[test]
fn drain_without_a_server_says_why() {
    let (ok, _) = drain(format!("127.0.0.1:{}", free_port()).parse().unwrap(), false);
    assert!(!ok);
}
