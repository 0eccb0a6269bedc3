//! Tunnels through `[[proxy]]`, end to end with the real binary: WebSockets with
//! Python's `websockets` as the client (over HTTP/1.1) and as the upstream
//! (`tests/tunnel/ws_upstream.py`): echo of text, binary and 1 MB messages, ping
//! and pong, close codes both ways, an upstream that dies mid-tunnel; over HTTP/2
//! an extended CONNECT (RFC 8441) from Python's h2 frame by frame
//! (`tests/tunnel/h2_ws.py`) and from headless Chromium; upstreams that switch
//! wrongly (`tests/tunnel/hostile.py`); a client that does not read while the
//! upstream floods (the server's memory stays bounded); the idle timeout and a
//! reload ending open tunnels; over HTTP/3 an extended CONNECT (RFC 9220) from
//! aioquic frame by frame (`tests/tunnel/h3_ws.py`).

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

/// Runs the test client `name` (a Python script of `tests/tunnel/`) with `args`;
/// its output lines, after checking that it succeeded (`srv`'s log otherwise).
fn run_client(srv: &Server, name: &str, args: &[&str]) -> Vec<String> {
    let out =
        run_with_timeout(Command::new("/usr/bin/python3").arg(script(name)).args(args), None, Duration::from_secs(90));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} {args:?}:\n{text}\n{}\nserver:\n{}",
        String::from_utf8_lossy(&out.stderr),
        srv.stderr()
    );
    text.lines().map(str::to_string).collect()
}

/// `ws_client.py URL SCENARIO ARGS` (Python `websockets`) against `srv`.
fn ws_client(url: &str, scenario: &str, args: &[&str], srv: &Server) -> Vec<String> {
    run_client(srv, "ws_client.py", &[&[url, scenario], args].concat())
}

/// `h3_ws.py HOST PORT SCENARIO` (aioquic) against `srv`.
fn h3_ws(srv: &Server, scenario: &str) -> Vec<String> {
    run_client(srv, "h3_ws.py", &[&srv.addr().ip().to_string(), &srv.port().to_string(), scenario])
}

/// `h2_ws.py HOST PORT PATH SCENARIO` (Python `h2`) against `srv`.
fn h2_ws(srv: &Server, path: &str, scenario: &str) -> Vec<String> {
    run_client(srv, "h2_ws.py", &[&srv.addr().ip().to_string(), &srv.port().to_string(), path, scenario])
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
    still_echoes(&srv);
}

/// The server is fine afterwards: a new tunnel echoes, 1 MB messages and all, and nothing panicked.
fn still_echoes(srv: &Server) {
    let lines = ws_client(&wss(srv, "/api/echo"), "echo", &[], srv);
    assert!(has(&lines, "ok 1MB"), "{lines:?}");
    assert!(!srv.stderr().contains("panicked"), "{}", srv.stderr());
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

/// WebSocket over HTTP/3 (RFC 9220): the server announces extended CONNECT, the
/// tunnel echoes text, binary, 1 MB messages and a ping, the client's close code
/// comes back and the stream ends; another `:protocol` is refused without harm to
/// the connection; an upstream that dies mid-tunnel ends the client's stream.
#[test]
fn websockets_over_http3_extended_connect() {
    let up = upstream("ws_upstream.py");
    let srv = server(&up, "", &["--http3"]);
    let lines = h3_ws(&srv, "echo");
    assert!(has(&lines, "settings 1") && has(&lines, "status 200"), "{lines:?}");
    for check in ["no accept", "text", "binary", "1MB", "ping", "close", "end"] {
        assert!(has(&lines, &format!("ok {check}")), "{check}: {lines:?}");
    }
    assert_eq!(up.wait_line("closed /api/echo", Duration::from_secs(5)).as_deref(), Some("closed /api/echo 4000"));
    let lines = h3_ws(&srv, "refused");
    for check in ["webtransport 400", "unknown reset", "after text", "after"] {
        assert!(has(&lines, &format!("ok {check}")), "{check}: {lines:?}");
    }
    let lines = h3_ws(&srv, "die");
    assert!(has(&lines, "status 200") && has(&lines, "ok echo") && has(&lines, "ok died"), "{lines:?}");
    eprintln!("an upstream that died: {:?}", lines.last());
    let log = srv.wait_access_log(4, Duration::from_secs(5));
    let line =
        log.iter().find(|l| l.contains("\"CONNECT /api/echo HTTP/3.0\" 200 ")).unwrap_or_else(|| panic!("{log:?}"));
    // Everything the upstream sent after its 101: more than the 1 MB echo.
    let bytes: u64 = line.split("\" 200 ").nth(1).and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
    assert!(bytes > 1_000_000, "{line}");
    assert!(log.iter().any(|l| l.contains("\"CONNECT /api/echo HTTP/3.0\" 400 ")), "{log:?}");
    assert!(!srv.stderr().contains("panicked"), "{}", srv.stderr());
}

/// An idle HTTP/3 tunnel is ended by the rule's `tunnel_idle_timeout`, with a FIN:
/// not by the header or send timeouts, which are shorter here.
#[test]
fn an_idle_http3_tunnel_ends_at_the_tunnel_idle_timeout() {
    let up = upstream("ws_upstream.py");
    let args = ["--http3", "--header-timeout", "1s", "--send-timeout", "1s"];
    let srv = server(&up, "tunnel_idle_timeout = \"2s\"", &args);
    let lines = h3_ws(&srv, "idle");
    assert!(has(&lines, "ok text"), "{lines:?}");
    let idle = lines.iter().find_map(|l| l.strip_prefix("idle ")).unwrap_or_else(|| panic!("{lines:?}"));
    let (secs, how) = idle.split_once(' ').unwrap();
    let secs: f64 = secs.parse().unwrap();
    assert!((1.8..5.0).contains(&secs) && how == "fin", "{lines:?}\n{}", srv.stderr());
}

#[test]
fn chromium_opens_a_websocket_over_its_http2_connection() {
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
        headless_chromium(&profile).args(["--virtual-time-budget=10000", "--dump-dom", &srv.url("/index.html")]),
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

/// Frames after a WebSocket close are only bytes to the tunnel: over HTTP/1.1 a
/// close and two frames behind it reach the upstream, whose close comes back
/// before the end of the connection; over HTTP/2, DATA after the client's
/// END_STREAM resets that stream (STREAM_CLOSED) while the connection goes on.
#[test]
fn frames_after_the_close() {
    let up = upstream("ws_upstream.py");
    let srv = server(&up, "", &[]);
    let lines = ws_client(&wss(&srv, "/api/echo"), "after", &[], &srv);
    for check in ["switched", "close", "end"] {
        assert!(has(&lines, &format!("ok {check}")), "{check}: {lines:?}");
    }
    assert_eq!(up.wait_line("closed /api/echo", Duration::from_secs(5)).as_deref(), Some("closed /api/echo 1000"));
    let lines = h2_ws(&srv, "/api/sink", "after");
    for check in ["reset after end", "after status", "after"] {
        assert!(has(&lines, &format!("ok {check}")), "{check}: {lines:?}");
    }
    still_echoes(&srv);
}

/// HTTP/2 flow control on the upload side: a tunnel whose upstream reads nothing
/// gets no more credit than its upstream takes, so its client stalls on the
/// stream's window while a second tunnel on the same connection keeps echoing.
#[test]
fn a_slow_upstream_stalls_only_its_own_http2_tunnel() {
    let up = upstream("ws_upstream.py");
    let srv = server(&up, "", &[]);
    let before = rss_kib(srv.pid());
    let lines = h2_ws(&srv, "/api/sink", "slow");
    for check in ["sink status", "stalled", "other status", "other text", "other 300kB", "sink still shut"] {
        assert!(has(&lines, &format!("ok {check}")), "{check}: {lines:?}\n{}", srv.stderr());
    }
    let after = rss_kib(srv.pid());
    let sent: u64 = lines.iter().find_map(|l| l.strip_prefix("sent ")).and_then(|n| n.parse().ok()).unwrap_or(0);
    eprintln!("sent {sent} bytes into the stalled tunnel; rss {before} KiB before, {after} KiB after");
    // What was sent waits in the sockets to the upstream, not in the server.
    assert!(after < before + 8 * 1024, "the server grew from {before} KiB to {after} KiB");
}

/// `idle.py client` holding `n` tunnels to `path` on `srv`, once it said how it went.
struct Holder {
    child: std::process::Child,
    first: String,
}

impl Holder {
    fn open(srv: &Server, path: &str, n: usize) -> Holder {
        use std::io::BufRead;
        let mut child = Command::new("/usr/bin/python3")
            .arg(script("idle.py"))
            .args(["client", "127.0.0.1", &srv.port().to_string(), path, &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut first = String::new();
        let _ = std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first);
        Holder { child, first: first.trim().to_string() }
    }

    /// Closes the tunnels (a line on stdin), and waits for the client to exit.
    fn close(mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tunnel is its client's connection for `max_connections_per_ip`: with a limit
/// of 2, a third tunnel from the same address is refused, and one more is
/// admitted once one of the two has closed.
#[test]
fn the_per_ip_limit_counts_tunnels() {
    let up = upstream("idle.py");
    let srv = server(&up, "", &["--max-connections-per-ip", "2"]);
    let two = Holder::open(&srv, "/api/idle", 2);
    assert_eq!(two.first, "open 2", "{}", srv.stderr());
    let third = Holder::open(&srv, "/api/idle", 1);
    assert!(third.first.starts_with("fail 1 of 1"), "{}", third.first);
    two.close();
    // The count drops as the server sees the two connections end.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let again = Holder::open(&srv, "/api/idle", 1);
        if again.first == "open 1" {
            break;
        }
        assert!(Instant::now() < deadline, "no tunnel admitted after the others closed: {}", again.first);
        std::thread::sleep(Duration::from_millis(200));
    }
    let stopped = srv.stop();
    assert!(stopped.stat("connections_refused_per_ip") >= 1, "{:?}", stopped.stats);
}

/// 10,000 idle WebSocket tunnels: each holds two of the server's descriptors (its
/// client's connection and its upstream's), and this machine's descriptor limit
/// (20,000, which the test cannot raise) keeps one process below 10,000 tunnels,
/// so two servers of one worker hold 5,000 each. All open; what each costs its
/// server in resident memory once idle is printed, and bounded here.
#[test]
fn ten_thousand_idle_tunnels() {
    const SERVERS: usize = 2;
    const EACH: usize = 5_000;
    const MAX_BYTES_PER_TUNNEL: u64 = 48 * 1024;
    let up = upstream("idle.py");
    // Without the debug log of `server`: thousands of tunnels would write much of it.
    let config = format!("[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\n", up.url());
    let servers: Vec<Server> = (0..SERVERS)
        .map(|_| {
            Server::builder(BIN)
                .workers(Some(1))
                .no_access_log()
                .config(&config)
                .args(["--max-connections-per-ip", "20000"])
                .start()
        })
        .collect();
    let mut before = Vec::new();
    for srv in &servers {
        // Warm up: the worker's pools exist before the baseline.
        Holder::open(srv, "/api/idle", 16).close();
    }
    std::thread::sleep(Duration::from_millis(500));
    for srv in &servers {
        before.push(rss_kib(srv.pid()));
    }
    let started = Instant::now();
    let holders: Vec<Holder> = servers.iter().map(|srv| Holder::open(srv, "/api/idle", EACH)).collect();
    let took = started.elapsed();
    for (h, srv) in holders.iter().zip(&servers) {
        assert_eq!(
            h.first,
            format!("open {EACH}"),
            "{}",
            srv.stderr().lines().rev().take(20).collect::<Vec<_>>().join("\n")
        );
    }
    std::thread::sleep(Duration::from_secs(1));
    let mut per = Vec::new();
    for (srv, before) in servers.iter().zip(&before) {
        let with = rss_kib(srv.pid());
        let bytes = (with.saturating_sub(*before) * 1024) / EACH as u64;
        eprintln!("{EACH} idle tunnels: server RSS {before} KiB -> {with} KiB: {bytes} bytes per tunnel");
        per.push(bytes);
    }
    eprintln!("{} idle tunnels opened in {took:.1?}; bytes of server RSS per tunnel: {per:?}", SERVERS * EACH);
    for bytes in &per {
        assert!(*bytes <= MAX_BYTES_PER_TUNNEL, "{bytes} bytes per idle tunnel");
    }
    for h in holders {
        h.close();
    }
    // All of them ended, and each server answers as before.
    for srv in &servers {
        let again = Holder::open(srv, "/api/idle", 1);
        assert_eq!(again.first, "open 1", "{}", srv.stderr());
        assert!(!srv.stderr().contains("panicked"));
    }
}
