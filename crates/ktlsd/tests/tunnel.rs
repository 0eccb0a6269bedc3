//! Tunnels through `[[proxy]]`, end to end with the real binary: WebSockets with
//! Python's `websockets` as the client (over HTTP/1.1) and as the upstream
//! (`tests/tunnel/ws_upstream.py`): echo of text, binary and 1 MB messages, ping
//! and pong, close codes both ways, an upstream that dies mid-tunnel; over HTTP/2
//! an extended CONNECT (RFC 8441) from Python's h2 frame by frame
//! (`tests/tunnel/h2_ws.py`) and from headless Chromium; upstreams that switch
//! wrongly (`tests/tunnel/hostile.py`); a client that does not read while the
//! upstream floods (the server's memory stays bounded); the idle timeout and a
//! reload ending open tunnels.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

fn script(name: &str) -> String {
    format!("{}/tests/tunnel/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A Python upstream of `tests/tunnel` (`ws_upstream.py` or `hostile.py`).
fn upstream(name: &str) -> ScriptUpstream {
    ScriptUpstream::start(&script(name))
}

/// ktlsd (one worker) proxying `/api/**` to `up`, with `extra` in the rule.
fn server(up: &ScriptUpstream, extra: &str, args: &[&str]) -> Server {
    let config = format!("[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\n{extra}\n", up.url());
    origin::ktlsd(BIN, &config, args)
}

fn wss(srv: &Server, path: &str) -> String {
    format!("wss://127.0.0.1:{}{path}", srv.port())
}

/// Runs `ws_client.py URL SCENARIO ARGS`; its output lines, after checking that it succeeded.
fn ws_client(url: &str, scenario: &str, args: &[&str], srv: &Server) -> Vec<String> {
    let out = run_with_timeout(
        Command::new("/usr/bin/python3").arg(script("ws_client.py")).args([url, scenario]).args(args),
        None,
        Duration::from_secs(90),
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ws_client.py {scenario}:\n{text}\n{}\nserver:\n{}",
        String::from_utf8_lossy(&out.stderr),
        srv.stderr()
    );
    text.lines().map(str::to_string).collect()
}

/// Runs `h2_ws.py` against `srv`; its output lines, after checking that it succeeded.
fn h2_ws(srv: &Server, path: &str, scenario: &str) -> Vec<String> {
    let out = run_with_timeout(
        Command::new("/usr/bin/python3").arg(script("h2_ws.py")).args([
            &srv.addr().ip().to_string(),
            &srv.port().to_string(),
            path,
            scenario,
        ]),
        None,
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "h2_ws.py {scenario}:\n{text}\n{}\nserver:\n{}",
        String::from_utf8_lossy(&out.stderr),
        srv.stderr()
    );
    text.lines().map(str::to_string).collect()
}

fn has(lines: &[String], line: &str) -> bool {
    lines.iter().any(|l| l == line)
}

#[test]
fn websockets_echo_through_an_http1_upgrade() {
    let up = upstream("ws_upstream.py");
    let srv = server(&up, "", &[]);
    let lines = ws_client(&wss(&srv, "/api/echo"), "echo", &[], &srv);
    for check in ["text", "binary", "1MB", "ping", "order", "close"] {
        assert!(has(&lines, &format!("ok {check}")), "{check}: {lines:?}");
    }
    // The upstream saw the client's close code: the close frames went both ways.
    assert_eq!(up.wait_line("closed /api/echo", Duration::from_secs(5)).as_deref(), Some("closed /api/echo 4000"));
    let log = srv.wait_access_log(1, Duration::from_secs(5));
    let line = log.iter().find(|l| l.contains("\"GET /api/echo HTTP/1.1\" 101 ")).unwrap_or_else(|| panic!("{log:?}"));
    // Everything the upstream sent after its 101: more than the 1 MB echo.
    let bytes: u64 = line.split("\" 101 ").nth(1).and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
    assert!(bytes > 1_000_000, "{line}");
}

#[test]
fn close_codes_and_an_upstream_that_dies_reach_the_client() {
    let up = upstream("ws_upstream.py");
    let srv = server(&up, "", &[]);
    let lines = ws_client(&wss(&srv, "/api/close"), "close", &[], &srv);
    assert!(has(&lines, "ok close"), "{lines:?}");
    let lines = ws_client(&wss(&srv, "/api/die"), "die", &[], &srv);
    assert!(has(&lines, "ok echo") && has(&lines, "ok died"), "{lines:?}");
    // A handshake the upstream refuses is its answer, not a tunnel.
    let out = curl(&[
        "--http1.1",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-H",
        "Connection: Upgrade",
        "-H",
        "Upgrade: websocket",
        "-H",
        "Sec-WebSocket-Version: 13",
        "-H",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        &srv.url("/api/nothing-here"),
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "404", "{}", srv.stderr());
    // The server is fine afterwards.
    let lines = ws_client(&wss(&srv, "/api/echo"), "echo", &[], &srv);
    assert!(has(&lines, "ok 1MB"), "{lines:?}");
}

#[test]
fn upstreams_that_switch_wrongly_get_a_502() {
    let up = upstream("hostile.py");
    let srv = server(&up, "", &[]);
    let upgrade = ["-H", "Connection: Upgrade", "-H", "Upgrade: websocket", "-H", "Sec-WebSocket-Version: 13"];
    let status = |path: &str, ask: bool| {
        let mut args = vec!["--http1.1", "-o", "/dev/null", "-w", "%{http_code}"];
        if ask {
            args.extend(upgrade);
        }
        let url = srv.url(path);
        args.push(&url);
        String::from_utf8_lossy(&curl(&args).stdout).into_owned()
    };
    // A 101 without Upgrade, one to another protocol, and one nobody asked for.
    assert_eq!(status("/api/no-upgrade", true), "502");
    assert_eq!(status("/api/h2c", true), "502");
    assert_eq!(status("/api/plain", false), "502");
    let err = srv.stderr();
    assert!(err.contains("invalid response: a 101 without Upgrade"), "{err}");
    assert!(err.contains("invalid response: a 101 that switches to another protocol"), "{err}");
    assert!(err.contains("protocol upgrade (101) is not forwarded"), "{err}");
}

/// The server's resident memory, from /proc.
fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_client_that_does_not_read_holds_the_upstream_back() {
    let up = upstream("ws_upstream.py");
    let srv = server(&up, "", &[]);
    let before = rss_kib(srv.pid());
    let url = wss(&srv, "/api/flood");
    let client = std::thread::spawn(move || {
        Command::new("/usr/bin/python3").arg(script("ws_client.py")).args([url.as_str(), "stall", "4"]).output()
    });
    std::thread::sleep(Duration::from_secs(3));
    // While the client reads nothing, the server holds what its bounded buffers hold.
    let during = rss_kib(srv.pid());
    let out = client.join().unwrap().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let read: u64 = text.lines().find_map(|l| l.strip_prefix("read ")).unwrap().parse().unwrap();
    let flooded: u64 = up
        .wait_line("flooded ", Duration::from_secs(10))
        .and_then(|l| l.strip_prefix("flooded ").map(|n| n.parse().unwrap()))
        .unwrap();
    eprintln!("rss {before} KiB before, {during} KiB while stalled; upstream sent {flooded} bytes, client read {read}");
    assert!(during < before + 8 * 1024, "the server grew from {before} KiB to {during} KiB");
    // The upstream got out no more than what the sockets on the way buffer.
    assert!(flooded < read + 64 * 1024 * 1024, "flooded {flooded}, read {read}");
}

#[test]
fn an_idle_tunnel_is_closed_and_a_reload_ends_open_ones() {
    let up = upstream("ws_upstream.py");
    let srv = server(&up, "tunnel_idle_timeout = \"1s\"", &[]);
    let lines = ws_client(&wss(&srv, "/api/echo"), "hold", &[], &srv);
    let closed = lines.iter().find_map(|l| l.strip_prefix("closed ")).unwrap_or_else(|| panic!("{lines:?}"));
    let secs: f64 = closed.split(' ').next().unwrap().parse().unwrap();
    assert!((0.8..5.0).contains(&secs), "{lines:?}");

    let srv = server(&up, "", &[]);
    let url = wss(&srv, "/api/echo");
    let started = Instant::now();
    let client = std::thread::spawn(move || {
        Command::new("/usr/bin/python3").arg(script("ws_client.py")).args([url.as_str(), "hold"]).output()
    });
    std::thread::sleep(Duration::from_secs(2));
    srv.signal(libc::SIGHUP);
    let out = client.join().unwrap().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ok first"), "{text}");
    // Retired by the reload, the tunnel went on for its grace period (10 s), then ended.
    let took = started.elapsed();
    assert!(took > Duration::from_secs(10) && took < Duration::from_secs(20), "{took:?}: {text}");
    // New tunnels work on the new configuration.
    let lines = ws_client(&wss(&srv, "/api/echo"), "echo", &[], &srv);
    assert!(has(&lines, "ok text"), "{lines:?}");
}

#[test]
fn websockets_over_http2_extended_connect() {
    let up = upstream("ws_upstream.py");
    let srv = server(&up, "", &[]);
    let lines = h2_ws(&srv, "/api/echo", "echo");
    assert!(has(&lines, "settings 1") && has(&lines, "status 200"), "{lines:?}");
    for check in ["no accept", "text", "300kB", "close", "end_stream"] {
        assert!(has(&lines, &format!("ok {check}")), "{check}: {lines:?}");
    }
    // A reset stream closes its upstream connection; the HTTP/2 connection goes on.
    let lines = h2_ws(&srv, "/api/echo", "reset");
    assert!(has(&lines, "ok first") && has(&lines, "ok second status") && has(&lines, "ok second"), "{lines:?}");
    assert!(up.wait_line("closed /api/echo 1006", Duration::from_secs(5)).is_some(), "{:?}", up.lines());
    // A handshake the upstream refuses: its status, no tunnel.
    let lines = h2_ws(&srv, "/api/none", "refused");
    assert!(has(&lines, "status 404"), "{lines:?}");
    let log = srv.wait_access_log(4, Duration::from_secs(5));
    assert!(log.iter().any(|l| l.contains("\"CONNECT /api/echo HTTP/2.0\" 200 ")), "{log:?}");
}

#[test]
fn chromium_opens_a_websocket_over_its_http2_connection() {
    let chromium = chromium();
    let up = upstream("ws_upstream.py");
    let config = format!("[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\n", up.url());
    let page = "<!doctype html><html><head><meta charset=\"utf-8\"><link rel=\"icon\" href=\"data:,\"></head><body>\
        <p id=\"result\">pending</p><script>\n\
        var ws = new WebSocket('wss://' + location.host + '/api/echo');\n\
        ws.onopen = function () { ws.send('over h2'); };\n\
        ws.onmessage = function (e) { document.getElementById('result').textContent = 'echo=' + e.data; ws.close(); };\n\
        ws.onerror = function () { document.getElementById('result').textContent = 'error'; };\n\
        </script><script src=\"/big.js\"></script></body></html>\n";
    // A script that takes a while to arrive holds the page's load (and Chromium's virtual
    // time, which a WebSocket does not hold) while the WebSocket opens and echoes.
    let big = format!("/*{}*/\n", "x".repeat(8 << 20));
    let srv =
        Server::builder(BIN).workers(Some(1)).file("index.html", page).file("big.js", big).config(&config).start();
    let profile = srv.dir().join("chromium-profile");
    let out = run_with_timeout(
        Command::new(chromium).stdin(Stdio::null()).args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--ignore-certificate-errors",
            "--no-first-run",
            "--disable-background-networking",
            &format!("--user-data-dir={}", profile.display()),
            "--virtual-time-budget=10000",
            "--dump-dom",
            &srv.url("/index.html"),
        ]),
        None,
        Duration::from_secs(120),
    );
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(dom.contains("echo=over h2"), "{dom}\n{}", String::from_utf8_lossy(&out.stderr));
    let stopped = srv.stop();
    let log = &stopped.access_log;
    assert!(log.iter().any(|l| l.contains("\"GET /index.html HTTP/2.0\" 200 ")), "{log:#?}");
    assert!(log.iter().any(|l| l.contains("\"CONNECT /api/echo HTTP/2.0\" 200 ")), "{log:#?}");
}
