//! How each body left, as the access log (`"body"` in JSON) and the counters say
//! it, on the userspace record layer (`--ktls off`): a static file, a body
//! relayed from a plain upstream (the Python origin of the proxy tests) and a
//! cache hit all go by `copy` (sendfile and splice need kernel TLS: the kTLS
//! suite proves those), over HTTP/1.1 and HTTP/2.

use std::collections::HashMap;

use testkit::*;

const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

fn sample(m: &HashMap<String, f64>, key: &str) -> f64 {
    m.get(key).copied().unwrap_or(0.0)
}

#[test]
fn every_body_goes_by_copy_on_the_userspace_record_layer() {
    const N: usize = 1024 * 1024;
    let origin = Origin::start("a");
    let cache = tempfile::tempdir().unwrap();
    let config = format!(
        "[[proxy]]\npath = \"/api/set/**\"\nupstream = [{url:?}]\ncache = true\n\n\
         [[proxy]]\npath = \"/api/**\"\nupstream = [{url:?}]\n\n\
         [cache]\ndir = {:?}\nmax_size = \"64M\"\n",
        cache.path().display().to_string(),
        url = origin.url(),
    );
    let b = Server::builder(BIN).file("page.txt", pattern(100_000, 1));
    let sock = b.dir().join("admin.sock");
    let srv = b.config(&config).args(["--ktls", "off", "--access-log-format", "json", "--admin"]).arg(&sock).start();
    let hit_target = "/api/set/hit?n=200000&h=Cache-Control%3Amax-age%3D600";
    let before = scrape(&sock);
    let mut hits = 0;
    for proto in ["--http1.1", "--http2"] {
        let r = fetch(&srv.url("/page.txt"), &[proto]);
        assert_body(&format!("{proto} /page.txt"), &r.body, &pattern(100_000, 1));
        let r = fetch(&srv.url(&format!("/api/big?n={N}")), &[proto]);
        assert_eq!((r.status, r.body.len()), (200, N), "{proto}");
        let r = fetch(&srv.url(hit_target), &[proto]);
        assert_eq!(r.status, 200, "{proto}");
        if r.header("cache-status") == Some("ktlsd; hit") {
            hits += r.body.len();
        }
    }
    assert_eq!(hits, 200_000, "the second request for {hit_target} is a hit");
    let after = scrape(&sock);
    let grew = |key: &str| sample(&after, key) - sample(&before, key);
    assert_eq!(grew("ktlsd_proxy_body_bytes_total{by=\"copy\"}"), (2 * N + 200_000) as f64);
    assert_eq!(grew("ktlsd_proxy_body_bytes_total{by=\"splice\"}"), 0.0);
    assert_eq!(grew("ktlsd_cache_hit_bytes_total{by=\"copy\"}"), 200_000.0);
    assert_eq!(grew("ktlsd_cache_hit_bytes_total{by=\"sendfile\"}"), 0.0);

    let s = srv.stop();
    let lines: Vec<serde_json::Value> =
        s.access_log.iter().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    assert_eq!(lines.len(), 6, "{:#?}", s.access_log);
    for v in &lines {
        assert_eq!((v["record_layer"].as_str(), v["body"].as_str()), (Some("userspace"), Some("copy")), "{v}");
    }
}
