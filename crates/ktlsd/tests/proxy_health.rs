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
use std::time::Duration;

use serde_json::Value;
use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// ktlsd (one worker, debug log) with `config`, an admin socket `admin.sock` in its directory.
fn server(config: &str) -> (Server, PathBuf) {
    let b = Server::builder(BIN).workers(Some(1)).file("index.txt", "static file");
    let sock = b.dir().join("admin.sock");
    let srv = b.config(config).arg("--admin").arg(&sock).arg("--log-level").arg("debug").start();
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
    let (srv, _) = server(&config);
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
        r["headers"].as_array().into_iter().flatten().any(|h| h[0] == "link" && h[1] == "</app.js>; rel=preload; as=script"),
        "{v}"
    );
    // Each request was one exchange with the origin.
    assert!(origin.count("/api/hints") >= 6, "{:?}", origin.requests());
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
