//! The status page and its document with the real binary: headless Chromium opens
//! `http://ADMIN/` while curl (HTTP/1.1, HTTP/2) and aioquic (HTTP/3) load the
//! server and a `[[proxy]]` rule with a cache has one upstream down, and the DOM
//! is checked against `/metrics`; `/status.json` against the field list of
//! docs/operations.md; the admin mode's drain and enable against two Python
//! origins' request counts; and the admin listener against hostile requests and
//! HTML-special characters in what it shows.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::origin::free_port;
use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// A cache key with every HTML-special character (the origin answers any `/api/set/` path).
const HOSTILE: &str = "/api/set/<b>bold</b>&\"'";

/// An admin listener's answer: status, head and body.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

/// Sends `raw` to the admin listener at `addr` and reads the answer.
fn admin_raw(addr: SocketAddr, raw: &[u8]) -> Answer {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("admin connects");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = s.write_all(raw);
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Answer { status, head: head.to_string(), body: body.to_string() }
}

/// `METHOD TARGET` to the admin listener, with `fields` (`Name: value` lines).
fn admin(addr: SocketAddr, method: &str, target: &str, fields: &[&str]) -> Answer {
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for f in fields {
        req.push_str(f);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    admin_raw(addr, req.as_bytes())
}

fn status_json(addr: SocketAddr) -> Value {
    let a = admin(addr, "GET", "/status.json", &[]);
    assert_eq!(a.status, 200, "{}\n{}", a.head, a.body);
    serde_json::from_str(&a.body).unwrap_or_else(|e| panic!("/status.json is not JSON ({e}): {}", a.body))
}

/// `/metrics` as `name{labels}` -> value (the labels as written).
fn metrics(addr: SocketAddr) -> Vec<(String, f64)> {
    let a = admin(addr, "GET", "/metrics", &[]);
    assert_eq!(a.status, 200);
    a.body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(k, v)| Some((k.to_string(), v.parse().ok()?))))
        .collect()
}

fn metric_sum(m: &[(String, f64)], prefix: &str) -> f64 {
    m.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| v).sum()
}

/// An htpasswd file with alice:s3cret (bcrypt, cost 5) in `dir`.
fn htpasswd(dir: &Path) -> PathBuf {
    let out = run_with_timeout(
        Command::new("htpasswd").args(["-nbB", "-C", "5", "alice", "s3cret"]),
        None,
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "htpasswd (apache2-utils) failed: {}", String::from_utf8_lossy(&out.stderr));
    let path = dir.join("admins");
    std::fs::write(&path, &out.stdout).unwrap();
    path
}

/// Basic credentials of alice:s3cret.
const ALICE: &str = "Authorization: Basic YWxpY2U6czNjcmV0";

/// A server (two workers, HTTP/3) with static files, a `[[proxy]]` rule for `/api/**`
/// over `upstreams` (cached when `cache`), an admin listener on 127.0.0.1 and `extra` config.
fn server(upstreams: &[String], cache: bool, extra: &str) -> (Server, SocketAddr) {
    let admin_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let b = Server::builder(BIN).workers(Some(2)).file("index.txt", "static file").file("big.bin", vec![7u8; 200_000]);
    let mut config = format!(
        "{extra}\n[[proxy]]\npath = \"/api/**\"\nupstream = {upstreams:?}\ncache = {cache}\nfail_timeout = \"30s\"\n"
    );
    if cache {
        config += &format!("\n[cache]\ndir = {:?}\nmax_size = \"64M\"\n", b.dir().join("cache").display().to_string());
    }
    let srv = b.config(&config).args(["--http3", "--admin"]).arg(admin_addr.to_string()).start();
    (srv, admin_addr)
}

/// `n` GETs of `path` on one curl (one connection) over `proto`, all answered 200.
fn load(srv: &Server, path: &str, proto: &str, n: usize) {
    let url = srv.url(path);
    let mut args = vec![proto.to_string(), "-w".into(), "%{http_code}\n".into()];
    for _ in 0..n {
        args.extend(["-o".to_string(), "/dev/null".into(), url.clone()]);
    }
    let out = curl(&args);
    let codes = String::from_utf8_lossy(&out.stdout);
    assert!(codes.lines().all(|c| c == "200"), "{proto} {path}: {codes}");
}

/// HTTP/3 GETs of `path`, `n` on one connection (aioquic).
fn load_h3(srv: &Server, path: &str, n: usize) {
    let reqs: Vec<Value> = (0..n)
        .map(|_| serde_json::json!({"path": path, "method": "GET", "authority": "localhost", "headers": []}))
        .collect();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h3/client.py");
    let out = run_with_timeout(
        Command::new("/usr/bin/python3")
            .arg(&script)
            .args(["127.0.0.1", &srv.port().to_string(), "requests"])
            .arg(serde_json::json!(reqs).to_string()),
        None,
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("h3 client output {text:?}: {e}"));
    for r in v["responses"].as_array().into_iter().flatten() {
        assert_eq!(r["status"], 200, "h3 {path}: {r}");
    }
}

/// Load on the static files over HTTP/1.1, HTTP/2 and HTTP/3 (three aioquic loops,
/// so that a Python start-up leaves no second without HTTP/3) until `stop`.
fn background_load(srv: &Server, stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    let mut threads = Vec::new();
    let loads = [
        ("--http1.1", "/index.txt"),
        ("--http2", "/big.bin"),
        ("h3", "/index.txt"),
        ("h3", "/index.txt"),
        ("h3", "/index.txt"),
    ];
    for (proto, path) in loads {
        let stop = stop.clone();
        let port = srv.port();
        let url = srv.url(path);
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if proto == "h3" {
                    let reqs: Vec<Value> = (0..50)
                        .map(|_| serde_json::json!({"path": path, "method": "GET", "authority": "localhost", "headers": []}))
                        .collect();
                    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h3/client.py");
                    let _ = run_with_timeout(
                        Command::new("/usr/bin/python3")
                            .arg(&script)
                            .args(["127.0.0.1", &port.to_string(), "requests"])
                            .arg(serde_json::json!(reqs).to_string()),
                        None,
                        Duration::from_secs(60),
                    );
                } else {
                    let mut args = vec![proto.to_string()];
                    for _ in 0..30 {
                        args.extend(["-o".to_string(), "/dev/null".into(), url.clone()]);
                    }
                    let _ = curl(&args);
                }
            }
        }));
    }
    threads
}

/// Chromium's DOM of `url` after `budget_ms` of virtual time (the page's timers run).
fn dump_dom(url: &str, profile: &Path, budget_ms: u32) -> String {
    let mut c = headless_chromium(profile);
    c.arg(format!("--virtual-time-budget={budget_ms}")).args(["--dump-dom", url]);
    let o = run_with_timeout(&mut c, None, Duration::from_secs(120));
    let dom = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(dom.contains("<html"), "no DOM: {}", String::from_utf8_lossy(&o.stderr));
    dom
}

/// The opening tag of the element with `id` in `dom`.
fn tag_of<'a>(dom: &'a str, id: &str) -> &'a str {
    let at = dom.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no #{id} in the DOM:\n{dom}"));
    let start = dom[..at].rfind('<').unwrap_or(0);
    let end = at + dom[at..].find('>').unwrap_or(0);
    &dom[start..=end]
}

/// The value of attribute `name` in the opening `tag`.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    Some(&tag[at..at + tag[at..].find('"')?])
}

/// The `data-value` of `#id` as a number (`None` when empty: the document had `null`).
fn data_value(dom: &str, id: &str) -> Option<f64> {
    attr(tag_of(dom, id), "data-value").filter(|v| !v.is_empty()).map(|v| v.parse().expect("a number"))
}

/// The opening tag of the upstream row of `address`.
fn upstream_row<'a>(dom: &'a str, address: &str) -> &'a str {
    let at = dom.find(&format!("data-address=\"{address}\"")).unwrap_or_else(|| panic!("no row of {address}:\n{dom}"));
    let start = dom[..at].rfind('<').unwrap_or(0);
    &dom[start..at + dom[at..].find('>').unwrap_or(0) + 1]
}

/// Waits until `f` holds of `/status.json`, or panics naming `what`.
fn wait_status(addr: SocketAddr, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = status_json(addr);
        if f(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: {v:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Warms the cache: five keys fetched three times each (5 misses, 10 hits) and the
/// hostile key twice, over HTTP/1.1 and HTTP/2.
fn warm_cache(srv: &Server) {
    for i in 0..5 {
        let path = format!("/api/set/hot{i}?h=Cache-Control:max-age%3D600");
        load(srv, &path, "--http1.1", 2);
        load(srv, &path, "--http2", 1);
    }
    let hostile = format!("{HOSTILE}?h=Cache-Control:max-age%3D600");
    // curl sends the path as given (it does not encode < > " ' &).
    load(srv, &hostile, "--http1.1", 2);
}

#[test]
fn chromium_shows_the_server_under_load() {
    let origin = Origin::start("a");
    let closed = format!("http://127.0.0.1:{}", free_port());
    let (srv, addr) = server(&[origin.url(), closed.clone()], true, "");
    warm_cache(&srv);
    let closed_addr = closed.trim_start_matches("http://").to_string();
    let origin_addr = format!("127.0.0.1:{}", origin.port);
    wait_status(addr, "the closed upstream is down", |v| {
        v["upstreams"].as_array().into_iter().flatten().any(|u| u["address"] == closed_addr && u["state"] == "down")
    });
    // The hostile key is a hit: it has a place among the hottest keys.
    load_h3(&srv, "/index.txt", 3);

    let stop = Arc::new(AtomicBool::new(false));
    let loaders = background_load(&srv, &stop);
    // Rates over a second of load on every protocol.
    let v = wait_status(addr, "every protocol has a rate", |v| {
        let r = &v["now"]["requests_per_second"];
        ["h1", "h2", "h3"].iter().all(|p| r[p].as_f64().unwrap_or(0.0) > 0.0)
    });
    assert!(v["history"]["samples"].as_array().is_some_and(|s| !s.is_empty()), "{v:#}");

    let profile = srv.dir().join("chromium-profile");
    let page = format!("http://{addr}/");
    let dom = dump_dom(&page, &profile, 5000);
    let m = metrics(addr);
    let refreshes: u32 = dom
        .split("data-refreshes=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    assert!(refreshes >= 2, "the page refreshed {refreshes} time(s)");
    for id in ["rps-total", "rps-h1", "rps-h2", "rps-h3"] {
        let rate = data_value(&dom, id).unwrap_or(0.0);
        assert!(rate > 0.0, "#{id} is {rate} under load");
    }
    assert_eq!(attr(upstream_row(&dom, &closed_addr), "data-state"), Some("down"), "{closed_addr}");
    assert_eq!(attr(upstream_row(&dom, &origin_addr), "data-state"), Some("up"), "{origin_addr}");
    assert!(dom.contains("state state-down"), "the down upstream is coloured");
    // The cache was warmed before and is not asked now: the ratio is still.
    let (hits, misses) = (metric_sum(&m, "ktlsd_cache_hits_total"), metric_sum(&m, "ktlsd_cache_misses_total"));
    assert!(hits >= 10.0, "{hits} hits");
    let page_ratio = data_value(&dom, "cache-hit-ratio").expect("a hit ratio");
    assert!((page_ratio - hits / (hits + misses)).abs() < 1e-9, "page {page_ratio}, /metrics {hits}/{misses}");
    let (ktls, user) = (
        metric_sum(&m, "ktlsd_connections_total{record_layer=\"ktls\""),
        metric_sum(&m, "ktlsd_connections_total{record_layer=\"userspace\""),
    );
    let share = data_value(&dom, "ktls-share").expect("a kTLS share");
    assert!(ktls + user > 0.0);
    assert!((share - ktls / (ktls + user)).abs() < 0.05, "page {share}, /metrics {ktls}/{user}");
    let kernel = kernel_tls_available();
    if !kernel {
        assert_eq!(share, 0.0, "no kTLS on this host");
    }
    // HTML-special characters of a cache key are text, not markup.
    assert!(dom.contains("&lt;b&gt;bold&lt;/b&gt;&amp;\"'"), "the hostile key, escaped, in:\n{dom}");
    assert!(!dom.contains("<b>bold</b>"), "the hostile key became markup");
    // The rates move: a second look sees more requests.
    let before = data_value(&dom, "requests-total").expect("a request count");
    let again = dump_dom(&page, &profile, 3000);
    let after = data_value(&again, "requests-total").expect("a request count");
    assert!(after > before, "requests since start: {before} then {after}");
    let points: u32 = again
        .split("id=\"chart-rps\"")
        .next()
        .and_then(|s| s.rsplit("data-points=\"").next())
        .and_then(|s| s.split('"').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    assert!(points >= 2, "the requests/s chart has {points} point(s)");

    // The screenshot, under load (for the docs, with a minute of history).
    if std::env::var_os("KTLSD_BLESS").is_some() {
        std::thread::sleep(Duration::from_secs(60));
    }
    let shot = srv.dir().join("status-page.png");
    let mut cap = headless_chromium(&profile);
    cap.arg(format!("--screenshot={}", shot.display())).args([
        "--window-size=1280,2000",
        "--virtual-time-budget=4000",
        &page,
    ]);
    let o = run_with_timeout(&mut cap, None, Duration::from_secs(120));
    stop.store(true, Ordering::Relaxed);
    for t in loaders {
        let _ = t.join();
    }
    let png = std::fs::read(&shot).unwrap_or_else(|_| panic!("no screenshot: {}", String::from_utf8_lossy(&o.stderr)));
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 20_000, "{} bytes", png.len());
    let kept = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    std::fs::write(&kept, &png).unwrap();
    println!("status page screenshot: {}", kept.display());
    if std::env::var_os("KTLSD_BLESS").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/status-page.png");
        std::fs::write(&docs, &png).unwrap();
        println!("written to {}", docs.display());
    }
}

/// Whether this host's kernel offers kTLS (the `tls` module answers `tls_stat`).
fn kernel_tls_available() -> bool {
    Path::new("/proc/net/tls_stat").exists()
}

/// The dotted field paths of the `/status.json` table in docs/operations.md.
fn documented_fields() -> Vec<String> {
    let docs = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md")).unwrap();
    let begin = docs.find("<!-- status.json fields: begin -->").expect("the field table's begin marker");
    let end = docs.find("<!-- status.json fields: end -->").expect("the field table's end marker");
    let fields: Vec<String> = docs[begin..end]
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect();
    assert!(fields.len() > 50, "{fields:?}");
    fields
}

/// Whether `v` has the field at `path` (`a.b[].c`, `NAME` for any key).
fn has(v: &Value, path: &[&str]) -> Result<(), String> {
    let Some((first, rest)) = path.split_first() else { return Ok(()) };
    if *first == "NAME" {
        return match v.as_object() {
            Some(_) => Ok(()),
            None => Err(format!("{v} is not an object")),
        };
    }
    let (name, each) = match first.strip_suffix("[]") {
        Some(n) => (n, true),
        None => (*first, false),
    };
    let field = v.get(name).ok_or_else(|| format!("no {name:?} in {v}"))?;
    if each {
        let items = field.as_array().ok_or_else(|| format!("{name} is not a list"))?;
        if items.is_empty() {
            return Err(format!("{name} is empty: nothing to check"));
        }
        return items.iter().try_for_each(|i| has(i, rest));
    }
    match (rest.is_empty(), field.is_null()) {
        (true, _) => Ok(()),
        (false, true) => Err(format!("{name} is null")),
        (false, false) => has(field, rest),
    }
}

#[test]
fn status_json_has_every_documented_field() {
    let origin = Origin::start("a");
    let (srv, addr) = server(&[origin.url()], true, "");
    warm_cache(&srv);
    load_h3(&srv, "/index.txt", 2);
    wait_status(addr, "a history sample", |v| v["history"]["samples"].as_array().is_some_and(|s| !s.is_empty()));
    // `ktlsd status --json` prints the document.
    let out = run_with_timeout(
        Command::new(BIN).args(["status", "--json", "--admin", &addr.to_string()]),
        None,
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("ktlsd status --json prints JSON");
    assert_eq!(v["schema"], 1);
    let mut missing = Vec::new();
    for field in documented_fields() {
        let path: Vec<&str> = field.split('.').collect();
        if let Err(e) = has(&v, &path) {
            missing.push(format!("{field}: {e}"));
        }
    }
    assert!(missing.is_empty(), "documented but missing from /status.json:\n{}", missing.join("\n"));
    let _ = srv;
}

/// How many `/api/name` requests each origin has read.
fn counts(a: &Origin, b: &Origin) -> (usize, usize) {
    (a.count("/api/name"), b.count("/api/name"))
}

#[test]
fn drain_and_enable_need_credentials_and_reach_every_worker() {
    let (a, b) = (Origin::start("a"), Origin::start("b"));
    let dir = tempfile::tempdir().unwrap();
    let users = htpasswd(dir.path());
    let extra = format!("admin_auth = {:?}", users.display().to_string());
    let (srv, addr) = server(&[a.url(), b.url()], false, &extra);
    let a_addr = format!("127.0.0.1:{}", a.port);
    let drain = format!("/upstreams/drain?upstream={a_addr}");
    let enable = format!("/upstreams/enable?upstream={a_addr}");

    // Refusals.
    let r = admin(addr, "POST", &drain, &[]);
    assert_eq!(r.status, 401, "{}", r.head);
    assert!(r.head.contains("WWW-Authenticate: Basic realm=\"ktlsd admin\""), "{}", r.head);
    let r = admin(addr, "POST", &drain, &["Authorization: Basic YWxpY2U6d3Jvbmc="]);
    assert_eq!(r.status, 401, "wrong password: {}", r.head);
    let r = admin(addr, "POST", &drain, &[ALICE, "Origin: http://evil.test"]);
    assert_eq!(r.status, 403, "another origin: {}", r.head);
    let r = admin(addr, "GET", &drain, &[ALICE]);
    assert_eq!(r.status, 405, "{}", r.head);
    let r = admin(addr, "POST", "/upstreams/drain?upstream=127.0.0.1:1", &[ALICE]);
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(status_json(addr)["admin_actions"], true);

    // Both upstreams take requests from both workers (several connections).
    for _ in 0..4 {
        load(&srv, "/api/name", "--http1.1", 10);
    }
    let (a0, b0) = counts(&a, &b);
    assert!(a0 > 0 && b0 > 0, "round robin: {a0} and {b0}");

    // Requests in flight to both; the drain does not cut them.
    let holds: Vec<_> = (0..4)
        .map(|_| {
            let url = srv.url("/api/hold?s=2");
            std::thread::spawn(move || curl(&["--http1.1", "-o", "/dev/null", "-w", "%{http_code}", &url]))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.requests().iter().chain(b.requests().iter()).filter(|l| l.contains("/api/hold")).count() < 4 {
        assert!(Instant::now() < deadline, "the holds did not reach the origins");
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = admin(addr, "POST", &drain, &[ALICE]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains(&format!("drained {}", a.url())), "{}", r.body);
    let drained_at = Instant::now();
    for _ in 0..4 {
        load(&srv, "/api/name", "--http1.1", 10);
        load(&srv, "/api/name", "--http2", 5);
    }
    let (a1, b1) = counts(&a, &b);
    assert_eq!(a1, a0, "the drained upstream got new requests");
    assert_eq!(b1, b0 + 60, "every request went to the other upstream");
    assert!(drained_at.elapsed() < Duration::from_secs(30));
    for h in holds {
        let out = h.join().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "a request in flight to a drained upstream finishes");
    }
    assert!(
        a.requests().iter().any(|l| l.starts_with("! answered"))
            || b.requests().iter().any(|l| l.starts_with("! answered"))
    );
    let v = status_json(addr);
    let row = v["upstreams"].as_array().unwrap().iter().find(|u| u["address"] == a_addr.as_str()).unwrap().clone();
    assert_eq!(row["state"], "draining", "{row:#}");
    assert!(srv
        .wait_stderr(&format!("admin: user \"alice\" drained upstream {}", a.url()), Duration::from_secs(5))
        .is_some());

    // Enabled again: it takes its turn at once.
    let r = admin(addr, "POST", &enable, &[ALICE]);
    assert_eq!(r.status, 200, "{}", r.body);
    for _ in 0..4 {
        load(&srv, "/api/name", "--http1.1", 10);
    }
    let (a2, _) = counts(&a, &b);
    assert!(a2 > a1, "the enabled upstream gets requests again");
    assert!(srv
        .wait_stderr(&format!("admin: user \"alice\" enabled upstream {}", a.url()), Duration::from_secs(5))
        .is_some());

    // Both drained: 503, and the drain is kept across a reload.
    let b_addr = format!("127.0.0.1:{}", b.port);
    for up in [&a_addr, &b_addr] {
        assert_eq!(admin(addr, "POST", &format!("/upstreams/drain?upstream={up}"), &[ALICE]).status, 200);
    }
    let r = fetch(&srv.url("/api/name"), &["--http1.1"]);
    assert_eq!(r.status, 503, "every upstream drained");
    srv.signal(libc_sighup());
    assert!(srv.wait_stderr("reloaded configuration", Duration::from_secs(10)).is_some());
    let r = fetch(&srv.url("/api/name"), &["--http1.1"]);
    assert_eq!(r.status, 503, "still drained after a reload");
}

/// SIGHUP's number.
fn libc_sighup() -> i32 {
    1
}

#[test]
fn without_admin_auth_actions_are_refused_and_the_page_is_read_only() {
    let a = Origin::start("a");
    let (_srv, addr) = server(&[a.url()], false, "");
    let r = admin(addr, "POST", &format!("/upstreams/drain?upstream=127.0.0.1:{}", a.port), &[ALICE]);
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("admin_auth"), "{}", r.body);
    let v = status_json(addr);
    assert_eq!(v["admin_actions"], false);
    assert_eq!(v["upstreams"][0]["state"], "up");
}

#[test]
fn hostile_admin_requests_are_refused_not_panicked_on() {
    let a = Origin::start("a");
    let dir = tempfile::tempdir().unwrap();
    let users = htpasswd(dir.path());
    let (mut srv, addr) = server(&[a.url()], false, &format!("admin_auth = {:?}", users.display().to_string()));
    let huge = "A".repeat(20_000);
    for (what, raw, want) in [
        ("a huge query", format!("GET /status.json?since={huge} HTTP/1.1\r\n\r\n"), 414),
        ("a huge drain", format!("POST /upstreams/drain?upstream={huge} HTTP/1.1\r\n{ALICE}\r\n\r\n"), 414),
        ("a huge field", format!("GET / HTTP/1.1\r\nX: {huge}\r\n\r\n"), 431),
        ("a negative since", "GET /status.json?since=-1 HTTP/1.1\r\n\r\n".into(), 400),
        ("an odd query", "GET /status.json?since=1&x=<script> HTTP/1.1\r\n\r\n".into(), 400),
        ("a NUL", "GET /status.json?since=%00 HTTP/1.1\r\n\r\n".into(), 400),
        ("no target", "GET  HTTP/1.1\r\n\r\n".into(), 400),
        ("a relative target", "GET status.json HTTP/1.1\r\n\r\n".into(), 400),
        ("HTTP/2 prior knowledge", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".into(), 400),
        ("a field without a colon", "GET / HTTP/1.1\r\nnonsense\r\n\r\n".into(), 400),
        ("bad UTF-8 upstream", format!("POST /upstreams/drain?upstream=%ff%fe HTTP/1.1\r\n{ALICE}\r\n\r\n"), 400),
        ("two upstreams", format!("POST /upstreams/drain?upstream=a&upstream=b HTTP/1.1\r\n{ALICE}\r\n\r\n"), 400),
        ("an unknown parameter", format!("POST /upstreams/enable?x=1 HTTP/1.1\r\n{ALICE}\r\n\r\n"), 400),
        ("no upstream", format!("POST /upstreams/enable? HTTP/1.1\r\n{ALICE}\r\n\r\n"), 400),
        ("a script upstream", format!("POST /upstreams/drain?upstream=%3Cscript%3E HTTP/1.1\r\n{ALICE}\r\n\r\n"), 404),
    ] {
        let r = admin_raw(addr, raw.as_bytes());
        assert_eq!(r.status, want, "{what}: {}\n{}", r.head, r.body);
        assert!(!r.body.contains("<script>"), "{what}: the answer echoes markup: {}", r.body);
    }
    // Bytes that are not text, and a TLS ClientHello's first bytes.
    for raw in [&b"GET /\xff\xfe HTTP/1.1\r\n\r\n"[..], b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"] {
        let r = admin_raw(addr, raw);
        assert_eq!(r.status, 400, "{raw:?}: {}", r.head);
    }
    // Many page loads at once.
    let loads: Vec<_> = (0..64)
        .map(|i| {
            std::thread::spawn(move || {
                let path = ["/", "/status.js", "/status.css", "/status.json"][i % 4];
                admin(addr, "GET", path, &[]).status
            })
        })
        .collect();
    for l in loads {
        assert_eq!(l.join().unwrap(), 200);
    }
    let page = admin(addr, "GET", "/", &[]);
    assert!(page.head.contains("Content-Security-Policy: default-src 'none'"), "{}", page.head);
    assert!(srv.is_running(), "the server survived");
    assert_eq!(admin(addr, "GET", "/status.json", &[]).status, 200);
    assert!(!srv.stderr().contains("panicked"), "{}", srv.stderr());
}
