//! An upstream's early hints, its health, and `Via` on cached answers, end to end:
//! the real binary in front of the Python origin (`crates/testkit/src/origin.py`),
//! killed and started again for the health checks; curl (`-v`) over HTTP/1.1,
//! HTTP/1.0 and HTTP/2, Python's `h2` (`tests/proxy/h2_hints.py`) and the aioquic
//! client over HTTP/3 (`tests/h3/client.py`) as clients; `/metrics` read by the
//! reference Prometheus parser and `/status.json` from the admin socket. The pure
//! parts are table tests in `handler::proxy::health`, `handler::proxy::headers` and
//! `config::proxy`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// ktlsd (one worker, debug log) with `config`, an admin socket `admin.sock` in its directory.
fn server(config: &str) -> (Server, PathBuf) {
    server_with(config, &[])
}

/// [`server`] with more command-line arguments.
fn server_with(config: &str, args: &[&str]) -> (Server, PathBuf) {
    let b = Server::builder(BIN).workers(Some(1)).file("index.txt", "static file");
    let sock = b.dir().join("admin.sock");
    let srv = b.config(config).arg("--admin").arg(&sock).arg("--log-level").arg("debug").args(args).start();
    (srv, sock)
}

/// `curl -v` of `url` with `proto`: the transcript of what it received (stderr).
fn curl_verbose(url: &str, proto: &str) -> (String, String) {
    let out = curl(&["-v", proto, url]);
    assert!(out.status.success(), "curl {proto} {url}: {}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn early_hints_reach_http1_http2_and_http3_clients() {
    let origin = Origin::start("a");
    let config = format!("[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\n", origin.url());
    let (srv, _) = server_with(&config, &["--http3"]);
    let url = srv.url("/api/hints");

    // curl shows each head it receives, the 103 before the 200; the 102 is not relayed.
    for (proto, hints, last) in
        [("--http1.1", "< HTTP/1.1 103 Early Hints", "< HTTP/1.1 200 OK"), ("--http2", "< HTTP/2 103", "< HTTP/2 200")]
    {
        let (body, shown) = curl_verbose(&url, proto);
        assert_eq!(body, "hinted", "{shown}");
        let at = |needle: &str| shown.find(needle).unwrap_or_else(|| panic!("{needle:?} missing from\n{shown}"));
        let (hint, link, fin) = (at(hints), at("</style.css>; rel=preload; as=style"), at(last));
        assert!(hint < link && link < fin, "the hints come first, with their Link:\n{shown}");
        assert!(shown.contains("</app.js>; rel=preload; as=script"), "{shown}");
        assert!(!shown.contains("< HTTP/1.1 102") && !shown.contains("< HTTP/2 102"), "no other interim:\n{shown}");
        let heads = shown.lines().filter(|l| l.starts_with("< HTTP/")).count();
        assert_eq!(heads, 2, "one 103, one 200:\n{shown}");
    }
    // An HTTP/1.0 client knows no interim answers: it gets the final one only.
    let (body, shown) = curl_verbose(&url, "--http1.0");
    assert_eq!(body, "hinted");
    assert!(!shown.contains("< HTTP/1.1 103") && !shown.contains("Early Hints"), "{shown}");
    // A HEAD is hinted too.
    let (_, shown) = curl_verbose(&url, "--head");
    assert!(shown.contains("< HTTP/2 103") || shown.contains("< HTTP/1.1 103"), "{shown}");

    // Python's h2 sees an informational response, then the response.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/proxy/h2_hints.py");
    let out = run_with_timeout(
        Command::new("/usr/bin/python3").arg(&script).args(["127.0.0.1", &srv.port().to_string(), "/api/hints"]),
        None,
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "h2_hints.py: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["status"], 200, "{v}");
    assert_eq!(v["body"], "hinted", "{v}");
    let interim = v["interim"].as_array().cloned().unwrap_or_default();
    assert_eq!(interim.len(), 1, "one 103: {v}");
    assert_eq!(interim[0][0], 103, "{v}");
    let links: Vec<&str> = interim[0][1]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f[0] == "link")
        .filter_map(|f| f[1].as_str())
        .collect();
    assert_eq!(links, ["</style.css>; rel=preload; as=style", "</app.js>; rel=preload; as=script"], "{v}");

    // HTTP/3: the 103 comes as a HEADERS frame of its own before the response's.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h3/client.py");
    let requests = serde_json::json!([{"path": "/api/hints"}]).to_string();
    let out = run_with_timeout(
        Command::new("/usr/bin/python3").arg(&script).args([
            "127.0.0.1",
            &srv.port().to_string(),
            "--sni",
            "localhost",
            "requests",
            &requests,
        ]),
        None,
        Duration::from_secs(120),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "aioquic client: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(&text).unwrap();
    let r = &v["responses"][0];
    assert_eq!(r["status"], 200, "{v}");
    assert_eq!(r["interim"], serde_json::json!([103]), "{v}");
    assert_eq!(r["text"], "hinted", "{v}");
    assert!(
        r["headers"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|h| h[0] == "link" && h[1] == "</app.js>; rel=preload; as=script"),
        "{v}"
    );
    // Each request was one exchange with the origin.
    assert!(origin.count("/api/hints") >= 6, "{:?}", origin.requests());
}

/// Waits until `srv`'s stderr has `n` lines holding `needle`; they are returned.
fn wait_lines(srv: &Server, needle: &str, n: usize, within: Duration) -> Vec<String> {
    let t = Instant::now();
    loop {
        let found: Vec<String> = srv.stderr().lines().filter(|l| l.contains(needle)).map(String::from).collect();
        if found.len() >= n {
            return found;
        }
        assert!(t.elapsed() < within, "{n} lines with {needle:?} awaited; stderr:\n{}", srv.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `/status.json` row of `upstream`.
fn status_row(sock: &Path, upstream: &str) -> Value {
    let (status, body) = admin_get(sock, "/status.json");
    assert_eq!(status, 200, "{body}");
    let doc: Value = serde_json::from_str(&body).unwrap();
    let rows = doc["upstreams"].as_array().cloned().unwrap_or_default();
    rows.into_iter().find(|r| r["upstream"] == upstream).unwrap_or_else(|| panic!("{upstream} in {body}"))
}

fn health_config(a: &Origin, b: &Origin, check: &str) -> String {
    format!(
        "[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}, {:?}]\nfail_timeout = \"1ms\"\n{check}\n",
        a.url(),
        b.url()
    )
}

#[test]
fn active_health_checks_take_a_dead_upstream_out_and_bring_it_back() {
    let (mut a, b) = (Origin::start("a"), Origin::start("b"));
    let check =
        "health_check = { path = \"/healthz\", interval = \"200ms\", timeout = \"150ms\", fails = 2, passes = 3 }";
    let (srv, sock) = server(&health_config(&a, &b, check));
    let up_a = format!("ktlsd_upstream_up{{upstream=\"{}\"}}", a.url());
    let check_a = format!("ktlsd_upstream_check_up{{upstream=\"{}\"}}", a.url());
    let fails_a = format!("ktlsd_upstream_checks_total{{result=\"fail\",upstream=\"{}\"}}", a.url());
    let passes_a = format!("ktlsd_upstream_checks_total{{result=\"pass\",upstream=\"{}\"}}", a.url());

    // Both are checked: one checker each, however many workers.
    let t = Instant::now();
    while a.count("/healthz") < 2 || b.count("/healthz") < 2 {
        assert!(t.elapsed() < Duration::from_secs(10), "{:?} {:?}", a.requests(), b.requests());
        std::thread::sleep(Duration::from_millis(50));
    }
    let row = status_row(&sock, &a.url());
    assert_eq!((row["state"].as_str(), row["health"].as_str()), (Some("up"), Some("active")), "{row}");
    assert!(row["last_check"].as_str().unwrap_or_default().starts_with("active: passed"), "{row}");
    let m = scrape(&sock);
    assert_eq!((m.get(&check_a), m.get(&up_a)), (Some(&1.0), Some(&1.0)), "{m:?}");
    let names: Vec<String> = (0..4).map(|_| fetch(&srv.url("/api/name"), &[]).body_str()).collect();
    assert!(names.iter().any(|n| n == "a") && names.iter().any(|n| n == "b"), "{names:?}");

    // a dies: after 2 failed checks it is down, said once in the log.
    a.stop();
    let down = wait_lines(&srv, &format!("upstream {} is down", a.url()), 1, Duration::from_secs(10));
    assert!(down[0].contains("2 health checks in a row failed (GET /healthz: connect:"), "{}", down[0]);
    let row = status_row(&sock, &a.url());
    assert_eq!(row["state"], "down", "{row}");
    assert!(row["last_check"].as_str().unwrap_or_default().starts_with("active: failed"), "{row}");
    let m = scrape(&sock);
    assert_eq!((m.get(&check_a), m.get(&up_a)), (Some(&0.0), Some(&0.0)), "{m:?}");
    assert!(m.get(&fails_a).copied().unwrap_or(0.0) >= 2.0, "{m:?}");
    // Every request goes to b, none tries a first (no exchange fails on it).
    let tried_before = srv.stderr().matches("trying another upstream").count();
    for _ in 0..10 {
        let r = fetch(&srv.url("/api/name"), &[]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "b"));
    }
    assert_eq!(srv.stderr().matches("trying another upstream").count(), tried_before, "{}", srv.stderr());
    assert_eq!(wait_lines(&srv, &format!("upstream {} is down", a.url()), 1, Duration::ZERO).len(), 1);

    // a comes back: up after 3 passed checks, in every worker at once.
    let checks_before = a.count("/healthz");
    a.restart();
    let up = wait_lines(&srv, &format!("upstream {} is up again", a.url()), 1, Duration::from_secs(10));
    assert!(up[0].contains("3 health checks in a row passed"), "{}", up[0]);
    assert!(a.count("/healthz") >= checks_before + 3, "{:?}", a.requests());
    let m = scrape(&sock);
    assert_eq!((m.get(&check_a), m.get(&up_a)), (Some(&1.0), Some(&1.0)), "{m:?}");
    assert!(m.get(&passes_a).copied().unwrap_or(0.0) >= 5.0, "{m:?}");
    assert_eq!(status_row(&sock, &a.url())["state"], "up");
    let names: Vec<String> = (0..4).map(|_| fetch(&srv.url("/api/name"), &[]).body_str()).collect();
    assert!(names.iter().any(|n| n == "a"), "a is taken back: {names:?}");

    // A reload without health_check stops the checkers; one with it starts them again.
    std::fs::write(srv.dir().join("ktlsd.toml"), health_config(&a, &b, "")).unwrap();
    assert!(reload(&srv, 1).contains("reloaded configuration"));
    wait_lines(&srv, &format!("health checks of upstream {} stopped", a.url()), 1, Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(300));
    let quiet = a.count("/healthz");
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(a.count("/healthz"), quiet, "no check after the reload");
    assert_eq!(status_row(&sock, &a.url())["health"], "passive");
    std::fs::write(srv.dir().join("ktlsd.toml"), health_config(&a, &b, check)).unwrap();
    assert!(reload(&srv, 2).contains("reloaded configuration"));
    let started =
        wait_lines(&srv, &format!("health checks of upstream {}: GET /healthz", a.url()), 2, Duration::from_secs(5));
    assert_eq!(started.len(), 2, "started at start-up and after the second reload");
    let t = Instant::now();
    while a.count("/healthz") < quiet + 2 {
        assert!(t.elapsed() < Duration::from_secs(10), "checks again after the reload");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A reload that keeps the check keeps its checker (no second start line).
    assert!(reload(&srv, 3).contains("reloaded configuration"));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(srv.stderr().matches(&format!("health checks of upstream {}: GET", a.url())).count(), 2);
}

#[test]
fn every_upstream_down_by_its_checks_is_a_503() {
    let (mut a, mut b) = (Origin::start("a"), Origin::start("b"));
    let check = "health_check = { path = \"/healthz\", interval = \"100ms\", timeout = \"100ms\" }";
    let (srv, _) = server(&health_config(&a, &b, check));
    a.stop();
    b.stop();
    wait_lines(&srv, &format!("upstream {} is down", b.url()), 1, Duration::from_secs(10));
    wait_lines(&srv, &format!("upstream {} is down", a.url()), 1, Duration::from_secs(10));
    for proto in ["--http1.1", "--http2"] {
        assert_eq!(fetch(&srv.url("/api/name"), &[proto]).status, 503);
    }
    assert!(srv.stderr().contains("every upstream is down by its health checks"), "{}", srv.stderr());
}

#[test]
fn cache_hits_carry_the_via_of_misses() {
    let origin = Origin::start("a");
    let cache = tempfile::tempdir().unwrap();
    let config = format!(
        "[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\ncache = true\n\n[cache]\ndir = {:?}\n",
        origin.url(),
        cache.path().display().to_string()
    );
    let (srv, _) = server(&config);
    for (target, want) in [
        ("/api/set/plain?h=Cache-Control:max-age%3D60", "1.1 ktlsd"),
        ("/api/set/via?h=Cache-Control:max-age%3D60&h=Via:1.0%20app", "1.0 app, 1.1 ktlsd"),
    ] {
        let miss = fetch(&srv.url(target), &["--http1.1"]);
        assert!(miss.header("cache-status").unwrap_or_default().contains("fwd=miss"), "{:?}", miss.headers);
        assert_eq!(miss.header("via"), Some(want), "{:?}", miss.headers);
        for proto in ["--http1.1", "--http2"] {
            let hit = fetch(&srv.url(target), &[proto]);
            assert!(hit.header("cache-status").unwrap_or_default().contains("hit"), "{:?}", hit.headers);
            assert_eq!(hit.header("via"), Some(want), "{proto}: {:?}", hit.headers);
            assert_eq!(hit.header_count("via"), 1, "{:?}", hit.headers);
            assert_eq!(hit.body, miss.body);
        }
        assert_eq!(origin.count(target), 1, "answered from the cache");
    }
}

#[test]
fn an_h2c_upstream_down_by_its_checks_is_a_503() {
    // Nothing listens on the port: every check fails to connect.
    let url = format!("h2c://127.0.0.1:{}", origin::free_port());
    let config = format!(
        "[[proxy]]\npath = \"/api/**\"\nupstream = [{url:?}]\n\
         health_check = {{ path = \"/healthz\", interval = \"100ms\", timeout = \"100ms\", fails = 1 }}\n"
    );
    let (srv, _) = server(&config);
    wait_lines(&srv, &format!("upstream {url} is down"), 1, Duration::from_secs(10));
    for proto in ["--http1.1", "--http2"] {
        let r = fetch(&srv.url("/api/name"), &[proto]);
        assert_eq!(r.status, 503, "{proto}: {}", srv.stderr());
    }
    assert!(srv.stderr().contains("every upstream is down by its health checks"), "{}", srv.stderr());
}

#[test]
fn health_checks_of_an_h2c_upstream_speak_http2() {
    let mut up = Nghttpd::h2c(&[("healthz", b"ok"), ("api/name", b"h2")], &[]);
    let url = format!("h2c://127.0.0.1:{}", up.port);
    let config = format!(
        "[[proxy]]\npath = \"/api/**\"\nupstream = [{url:?}]\nfail_timeout = \"1ms\"\n\
         health_check = {{ path = \"/healthz\", interval = \"200ms\", timeout = \"150ms\", fails = 2, passes = 2 }}\n"
    );
    let (srv, sock) = server(&config);
    // The checks pass: the upstream stays up.
    let t = Instant::now();
    while up.count("/healthz") < 3 {
        assert!(t.elapsed() < Duration::from_secs(10), "checks awaited:\n{}", srv.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!srv.stderr().contains(&format!("upstream {url} is down")), "{}", srv.stderr());
    let row = status_row(&sock, &url);
    assert_eq!(row["state"], "up", "{row}");
    assert!(row["last_check"].as_str().unwrap_or_default().starts_with("active: passed"), "{row}");
    let r = fetch(&srv.url("/api/name"), &["--http2"]);
    assert_eq!((r.status, r.body_str().as_str()), (200, "h2"));

    // It goes down: the checks see it, and no request is tried on it.
    up.stop();
    let down = wait_lines(&srv, &format!("upstream {url} is down"), 1, Duration::from_secs(10));
    assert!(down[0].contains("(GET /healthz: connect:"), "{}", down[0]);
    for proto in ["--http1.1", "--http2"] {
        assert_eq!(fetch(&srv.url("/api/name"), &[proto]).status, 503, "{proto}");
    }

    // It comes back: up after 2 passed checks, and answers again.
    up.restart();
    let again = wait_lines(&srv, &format!("upstream {url} is up again"), 1, Duration::from_secs(10));
    assert!(again[0].contains("2 health checks in a row passed (GET /healthz: 200"), "{}", again[0]);
    for proto in ["--http1.1", "--http2"] {
        let r = fetch(&srv.url("/api/name"), &[proto]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "h2"), "{proto}");
    }
    assert!(!srv.stderr().contains("panicked"), "{}", srv.stderr());
}
