//! What a `[[proxy]]` rule changes of an exchange, end to end: the real binary in
//! front of the Python origin (`crates/testkit/src/origin.py`), curl as the client
//! over HTTP/1.1 and HTTP/2, the aioquic client over HTTP/3: `strip_prefix`,
//! `request_headers` and `response_headers` with variables, the request id (made,
//! kept from a trusted proxy, replaced from anyone else), `X-Accel-Redirect` (the
//! file beneath `accel_root` with ranges and 304, traversal refused, the field never
//! reaching the client), and the upstream, request-id and user variables of the
//! access log in its custom and JSON formats. The pure parts are table tests in
//! `handler::proxy::control`, `handler::accel` and `log::vars`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const PROTOCOLS: [&str; 2] = ["--http1.1", "--http2"];

/// The value of the field `name` the origin's `/api/echo` says it received, and how many it got.
fn echoed(v: &Value, name: &str) -> (Option<String>, usize) {
    let fields = v["fields"].as_array().cloned().unwrap_or_default();
    let all: Vec<String> = fields
        .iter()
        .filter(|f| f[0].as_str().is_some_and(|n| n.eq_ignore_ascii_case(name)))
        .map(|f| f[1].as_str().unwrap_or_default().to_string())
        .collect();
    (all.first().cloned(), all.len())
}

/// The access log's lines once it has at least `n` (the log is written in batches).
fn log_lines(srv: &Server, n: usize) -> Vec<String> {
    let t = Instant::now();
    loop {
        let lines = srv.access_log();
        if lines.len() >= n || t.elapsed() > Duration::from_secs(10) {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// curl from the local address `from` (the server listens on 127.0.0.1).
fn fetch_from(from: &str, url: &str, extra: &[&str]) -> Response {
    let mut args = vec!["--interface", from];
    args.extend_from_slice(extra);
    fetch(url, &args)
}

#[test]
fn strip_prefix_and_field_rules_with_variables() {
    let origin = Origin::start("a");
    let config = r#"
[[proxy]]
path = "/app/**"
upstream = ["URL"]
strip_prefix = "/app"
request_headers = { set = { X-Real-IP = "$remote_addr", X-Url = "$scheme://$host$request_uri" }, add = { X-Rule = "app $request_method $server_protocol" }, remove = ["Cookie", "X-Forwarded-Host"] }
response_headers = { set = { X-Served = "up=$upstream_addr status=$upstream_status" }, add = { X-Extra = "1" }, remove = ["X-Origin", "Set-Cookie"] }

[[proxy]]
path = "/api/**"
upstream = ["URL"]
"#
    .replace("URL", &origin.url());
    let srv = origin::ktlsd(BIN, &config, &[]);
    let port = srv.port();
    for proto in PROTOCOLS {
        let r = fetch(
            &srv.url("/app/api/echo?x=1"),
            &[proto, "-H", "Cookie: s=1", "-H", "X-Real-IP: 6.6.6.6", "-H", "X-Keep: k"],
        );
        assert_eq!(r.status, 200, "{proto}: {}", r.body_str());
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["target"].as_str(), Some("/api/echo?x=1"), "the prefix is taken off ({proto})");
        assert_eq!(echoed(&v, "x-real-ip"), (Some("127.0.0.1".into()), 1), "{proto}: {v}");
        assert_eq!(echoed(&v, "x-url").0, Some(format!("https://127.0.0.1:{port}/app/api/echo?x=1")), "{proto}");
        let version = if proto == "--http2" { "HTTP/2.0" } else { "HTTP/1.1" };
        assert_eq!(echoed(&v, "x-rule").0, Some(format!("app GET {version}")), "{proto}");
        assert_eq!((echoed(&v, "cookie").1, echoed(&v, "x-forwarded-host").1), (0, 0), "removed ({proto}): {v}");
        assert_eq!(echoed(&v, "x-keep").0.as_deref(), Some("k"), "{proto}");
        assert_eq!(echoed(&v, "x-forwarded-for").0.as_deref(), Some("127.0.0.1"), "{proto}");

        // The upstream's answer: fields removed, set with the upstream's variables, added.
        let r = fetch(&srv.url("/app/api/headers"), &[proto]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "ok"), "{proto}");
        assert_eq!((r.header("x-origin"), r.header("set-cookie")), (None, None), "{proto}: {:?}", r.headers);
        assert_eq!(r.header("x-served"), Some(format!("up=127.0.0.1:{} status=200", origin.port).as_str()), "{proto}");
        assert_eq!(r.header("x-extra"), Some("1"), "{proto}");

        // A rule without fields passes no client X-Real-IP, and no prefix is taken off.
        let r = fetch(&srv.url("/api/echo"), &[proto, "-H", "X-Real-IP: 6.6.6.6", "-H", "Cookie: s=1"]);
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["target"].as_str(), Some("/api/echo"), "{proto}");
        assert_eq!(echoed(&v, "x-real-ip").1, 0, "a client's X-Real-IP never reaches the app ({proto}): {v}");
        assert_eq!(echoed(&v, "cookie").0.as_deref(), Some("s=1"), "{proto}");
        let r = fetch(&srv.url("/api/headers"), &[proto]);
        assert_eq!((r.header("x-origin"), r.header_count("set-cookie")), (Some("kept"), 2), "{proto}");
    }
    // The prefix alone is the upstream's root; a longer name is not the prefix.
    assert_eq!(fetch(&srv.url("/app"), &[]).status, 404, "the origin has nothing at /");
    assert_eq!(fetch(&srv.url("/app?q=1"), &[]).status, 404);
    let targets: Vec<String> =
        origin.requests().iter().map(|l| l.split(' ').nth(1).unwrap_or("").to_string()).collect();
    assert!(targets.iter().any(|t| t == "/") && targets.iter().any(|t| t == "/?q=1"), "{targets:?}");
    assert!(!targets.iter().any(|t| t.starts_with("/app")), "{targets:?}");
}

#[test]
fn request_ids_are_made_kept_from_a_trusted_proxy_and_replaced_otherwise() {
    let origin = Origin::start("a");
    let config = format!(
        "trusted_proxies = [\"127.0.0.2\"]\naccess_log_format = \"custom\"\n\
         access_log_custom = '$remote_addr $request_uri $request_id'\n\
         [[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\n",
        origin.url()
    );
    let srv = origin::ktlsd(BIN, &config, &[]);
    let mut logged = Vec::new();
    for proto in PROTOCOLS {
        // (from, the client's X-Request-Id, kept)
        for (from, sent, kept) in [
            ("127.0.0.1", None, false),
            ("127.0.0.1", Some("client-chosen-1"), false),
            ("127.0.0.2", Some("edge-4f2a"), true),
            ("127.0.0.2", Some("not valid"), false),
            ("127.0.0.2", None, false),
        ] {
            let mut args = vec![proto];
            let field = sent.map(|s| format!("X-Request-Id: {s}"));
            if let Some(f) = &field {
                args.extend(["-H", f.as_str()]);
            }
            let target = format!("/api/echo?n={}", logged.len());
            let r = fetch_from(from, &srv.url(&target), &args);
            assert_eq!(r.status, 200, "{proto} {from} {sent:?}");
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            let (upstream, count) = echoed(&v, "x-request-id");
            let upstream = upstream.unwrap_or_default();
            assert_eq!(count, 1, "one id upstream ({proto} {from} {sent:?}): {v}");
            assert_eq!(r.header("x-request-id"), Some(upstream.as_str()), "the client gets the upstream's id");
            if kept {
                assert_eq!(Some(upstream.as_str()), sent, "{proto}: a trusted proxy's id is kept");
            } else {
                assert!(
                    upstream.len() == 32 && upstream.bytes().all(|b| b.is_ascii_hexdigit()),
                    "{proto} {from} {sent:?}: a new id, not {upstream:?}"
                );
            }
            logged.push((target, upstream));
        }
    }
    let lines = log_lines(&srv, logged.len());
    for (target, id) in &logged {
        assert!(lines.iter().any(|l| l.ends_with(&format!(" {target} {id}"))), "{target} {id} in the log:\n{lines:#?}");
    }
    let ids: std::collections::HashSet<&String> = logged.iter().map(|(_, id)| id).collect();
    assert_eq!(ids.len(), logged.len() - 1, "every id differs but the trusted one sent twice");
    // A static answer is logged with an id too (made when the log asks for it).
    assert_eq!(fetch(&srv.url("/index.txt"), &[]).status, 200);
    let lines = log_lines(&srv, logged.len() + 1);
    let last = lines.iter().find(|l| l.contains(" /index.txt ")).cloned().unwrap_or_default();
    assert_eq!(last.rsplit(' ').next().map(str::len), Some(32), "{last}");
}

/// ktlsd with `/api/**` proxied to `origin` with `accel_root` at `accel`.
fn accel_server(origin: &Origin, accel: &Path, extra: &str, args: &[&str]) -> Server {
    let config = format!(
        "[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\naccel_root = {:?}\n{extra}\n",
        origin.url(),
        accel.to_str().unwrap()
    );
    origin::ktlsd(BIN, &config, args)
}

/// The accel root: a file, a directory, a dot-file and symbolic links out of it.
fn accel_dir() -> (tempfile::TempDir, Vec<u8>) {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let body = pattern(300_000, 7);
    std::fs::write(dir.path().join("report.bin"), &body).unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join(".secret"), "dot").unwrap();
    symlink("/etc/passwd", dir.path().join("abs")).unwrap();
    symlink("../../../../../../../../etc/passwd", dir.path().join("rel")).unwrap();
    (dir, body)
}

/// The origin's path that answers with `fields` (`Name:Value`, query-encoded as the origin decodes them).
fn answering(fields: &[&str]) -> String {
    let query: Vec<String> =
        fields.iter().map(|f| format!("h={}", f.replace('%', "%25").replace(' ', "%20").replace(';', "%3B"))).collect();
    format!("/api/set/accel?{}", query.join("&"))
}

#[test]
fn x_accel_redirect_serves_the_file_beneath_accel_root() {
    let origin = Origin::start("a");
    let (accel, body) = accel_dir();
    let srv = accel_server(&origin, accel.path(), "", &[]);
    let path = answering(&["X-Accel-Redirect:/report.bin", "Content-Disposition:attachment; filename=r.bin"]);
    for proto in PROTOCOLS {
        let r = fetch(&srv.url(&path), &[proto]);
        assert_eq!(r.status, 200, "{proto}: {}", r.body_str());
        assert_body(&format!("the accel file over {proto}"), &r.body, &body);
        assert_eq!(r.header("x-accel-redirect"), None, "the field never reaches the client ({proto})");
        assert_eq!(r.header("content-disposition"), Some("attachment; filename=r.bin"), "{proto}");
        assert!(r.header("x-request-id").is_some() && r.header("etag").is_some(), "{proto}: {:?}", r.headers);
        assert_eq!(r.header("content-length"), Some("300000"));

        let r = fetch(&srv.url(&path), &[proto, "-H", "Range: bytes=1000-1999"]);
        assert_eq!(r.status, 206, "{proto}");
        assert_eq!(r.header("content-range"), Some("bytes 1000-1999/300000"), "{proto}");
        assert_eq!(r.body, body[1000..2000], "{proto}");

        let etag = fetch(&srv.url(&path), &[proto]).header("etag").unwrap_or_default().to_string();
        let r = fetch(&srv.url(&path), &[proto, "-H", &format!("If-None-Match: {etag}")]);
        assert_eq!((r.status, r.body.len()), (304, 0), "{proto}");
        assert_eq!(r.header("x-accel-redirect"), None, "{proto}");
        let r = fetch(&srv.url(&path), &[proto, "-I"]);
        assert_eq!((r.status, r.header("content-length")), (200, Some("300000")), "HEAD over {proto}");

        // Each way out of accel_root is refused as a file that is not there.
        for value in ["/../etc/passwd", "/%2e%2e/etc/passwd", "/sub/%2E%2E/%2e%2e/etc/passwd", "/abs", "/rel"] {
            let r = fetch(&srv.url(&answering(&[&format!("X-Accel-Redirect:{value}")])), &[proto]);
            assert_eq!(r.status, 404, "{value} over {proto}");
            assert!(!r.body_str().contains("root:"), "{value}: {}", r.body_str());
            assert_eq!(r.header("x-accel-redirect"), None, "{value}");
        }
        for value in ["/.secret", "/sub", "/missing", "relative.bin"] {
            let r = fetch(&srv.url(&answering(&[&format!("X-Accel-Redirect:{value}")])), &[proto]);
            assert_eq!(r.status, 404, "{value} over {proto}");
        }
    }
    // accel_root is not the site's: its files are no client's to ask for.
    assert_eq!(fetch(&srv.url("/report.bin"), &[]).status, 404);
    let log = srv.stderr();
    for why in ["climbs out of accel_root", "leads out of accel_root", "names a dot-file", "names no file"] {
        assert!(log.contains(why), "the refusal is logged ({why}):\n{log}");
    }
    assert!(log.contains("\"/%2e%2e/etc/passwd\""), "the value is named:\n{log}");

    // Over HTTP/3 too.
    let srv = accel_server(&origin, accel.path(), "", &["--http3"]);
    let rs = h3_requests(
        &srv,
        &serde_json::json!([
            {"path": path},
            {"path": path, "headers": [["range", "bytes=0-9"]]},
            {"path": answering(&["X-Accel-Redirect:/../etc/passwd"])},
        ]),
    );
    let rs = &rs["responses"];
    assert_eq!((rs[0]["status"].as_u64(), rs[0]["sha256"].as_str()), (Some(200), Some(sha256(&body).as_str())), "{rs}");
    assert!(h3_header(&rs[0], "x-accel-redirect").is_none(), "{rs}");
    assert_eq!((rs[1]["status"].as_u64(), rs[1]["sha256"].as_str()), (Some(206), Some(sha256(&body[..10]).as_str())));
    assert_eq!(rs[2]["status"].as_u64(), Some(404), "{rs}");

    // Without accel_root the field is dropped and the upstream's answer passes.
    let plain = origin::ktlsd(BIN, &format!("[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\n", origin.url()), &[]);
    let r = fetch(&plain.url(&answering(&["X-Accel-Redirect:/report.bin"])), &[]);
    assert_eq!((r.status, r.header("x-accel-redirect")), (200, None), "{:?}", r.headers);
    assert!(r.body_str().starts_with("a "), "{}", r.body_str());
}

#[test]
fn an_accel_root_beneath_the_root_stops_start_up() {
    let b = Server::builder(BIN).file("protected/a.bin", "x");
    let inside = b.root().join("protected");
    let e = b
        .config(&format!(
            "[[proxy]]\npath = \"/api/**\"\nupstream = [\"http://127.0.0.1:9\"]\naccel_root = {inside:?}\n"
        ))
        .run_to_exit();
    e.assert_startup_error(&["accel_root", "beneath the root"]);
}

/// Sends `requests` to `srv` over HTTP/3 (the aioquic client of `tests/h3`).
fn h3_requests(srv: &Server, requests: &Value) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h3/client.py");
    let out = run_with_timeout(
        Command::new("/usr/bin/python3").arg(&script).args([
            &srv.addr().ip().to_string(),
            &srv.port().to_string(),
            "--sni",
            "localhost",
            "requests",
            &requests.to_string(),
        ]),
        None,
        Duration::from_secs(120),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "aioquic client failed: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("client output {text:?}: {e}"))
}

fn h3_header<'a>(r: &'a Value, name: &str) -> Option<&'a str> {
    r["headers"].as_array()?.iter().find(|h| h[0] == name).and_then(|h| h[1].as_str())
}

#[test]
fn upstream_request_id_and_user_variables_in_the_custom_and_json_logs() {
    let origin = Origin::start("a");
    let dead = format!("http://127.0.0.1:{}", origin::free_port());
    let rules = |cache: &Path| {
        format!(
            "[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\n\n[[proxy]]\npath = \"/cached/**\"\nupstream = [{:?}]\n\
         cache = true\nstrip_prefix = \"/cached\"\n\n[[proxy]]\npath = \"/dead/**\"\nupstream = [{dead:?}]\n\
         strip_prefix = \"/dead\"\n\n[cache]\ndir = {:?}\n",
            origin.url(),
            origin.url(),
            cache.to_str().unwrap()
        )
    };
    let custom = "access_log_format = \"custom\"\naccess_log_custom = '$request_uri|$status|$request_id|$remote_user|\
                  $upstream_addr|$upstream_status|$upstream_connect_time|$upstream_header_time|\
                  $upstream_response_time|$upstream_cache_status'\n";
    let json = "access_log_format = \"json\"\n";
    let up = format!("127.0.0.1:{}", origin.port);
    for (format, proto) in [(custom, "--http1.1"), (json, "--http2")] {
        // A cache of its own: each server's first request is a miss.
        let cache = tempfile::tempdir().unwrap();
        let srv = origin::ktlsd(BIN, &format!("{format}{}", rules(cache.path())), &[]);
        let requests = [
            "/api/name",
            "/cached/api/set/c?h=Cache-Control:max-age%3D60",
            "/cached/api/set/c?h=Cache-Control:max-age%3D60",
            "/dead/api/name",
            "/index.txt",
        ];
        let mut ids = Vec::new();
        for (i, target) in requests.iter().enumerate() {
            let mut args = vec![proto];
            if i == 0 {
                args.extend(["-u", "alice:secret"]);
            }
            let r = fetch(&srv.url(target), &args);
            let status = if target.starts_with("/dead/") { 502 } else { 200 };
            assert_eq!(r.status, status, "{target} over {proto}: {}", r.body_str());
            ids.push(r.header("x-request-id").unwrap_or("-").to_string());
        }
        let lines = log_lines(&srv, requests.len());
        assert_eq!(lines.len(), requests.len(), "{lines:#?}");
        // (status, user, addrs, statuses, cache status)
        let want = [
            ("200", "alice", vec![up.clone()], vec!["200"], "-"),
            ("200", "-", vec![up.clone()], vec!["200"], "MISS"),
            ("200", "-", vec![], vec![], "HIT"),
            ("502", "-", vec![dead.trim_start_matches("http://").to_string()], vec!["502"], "-"),
            ("200", "-", vec![], vec![], "-"),
        ];
        for (i, (line, (status, user, addrs, statuses, cache_status))) in lines.iter().zip(&want).enumerate() {
            let uri = requests[i];
            if format == json {
                let v: Value = serde_json::from_str(line).unwrap();
                assert_eq!((v["target"].as_str(), v["status"].to_string().as_str()), (Some(uri), *status), "{line}");
                assert_eq!(v["remote_user"].as_str().unwrap_or("-"), *user, "{line}");
                let list = |k: &str| -> Vec<String> {
                    v[k].as_array()
                        .map_or(Vec::new(), |a| a.iter().map(|x| x.to_string().trim_matches('"').to_string()).collect())
                };
                assert_eq!(list("upstream_addr"), *addrs, "{line}");
                assert_eq!(list("upstream_status"), *statuses, "{line}");
                assert_eq!(v["upstream_cache_status"].as_str().unwrap_or("-"), *cache_status, "{line}");
                for k in ["upstream_connect_time", "upstream_header_time", "upstream_response_time"] {
                    assert_eq!(v[k].as_array().map_or(0, Vec::len), addrs.len(), "{k}: {line}");
                }
                if *status == "200" && !addrs.is_empty() {
                    assert!(v["upstream_header_time"][0].as_f64().is_some_and(|t| t < 5.0), "{line}");
                    assert!(v["upstream_response_time"][0].is_f64(), "{line}");
                }
                let id = v["request_id"].as_str().unwrap_or_default();
                assert_eq!(id.len(), 32, "{line}");
                if ids[i] != "-" {
                    assert_eq!(id, ids[i], "the logged id is the one the client got: {line}");
                }
            } else {
                let f: Vec<&str> = line.split('|').collect();
                assert_eq!(f.len(), 10, "{line}");
                assert_eq!((f[0], f[1], f[3]), (uri, *status, *user), "{line}");
                assert_eq!(f[2].len(), 32, "{line}");
                if ids[i] != "-" {
                    assert_eq!(f[2], ids[i], "{line}");
                }
                let joined = |v: &[String]| if v.is_empty() { "-".to_string() } else { v.join(", ") };
                assert_eq!(f[4], joined(addrs), "{line}");
                assert_eq!(f[5], joined(&statuses.iter().map(|s| s.to_string()).collect::<Vec<_>>()), "{line}");
                assert_eq!(f[9], *cache_status, "{line}");
                for t in &f[6..9] {
                    assert_eq!(t.split(", ").count(), addrs.len().max(1), "{line}");
                }
                if *status == "200" && !addrs.is_empty() {
                    let header: f64 = f[7].rsplit(", ").next().unwrap_or("x").parse().unwrap_or(99.0);
                    assert!(header < 5.0, "{line}");
                    let response: f64 = f[8].rsplit(", ").next().unwrap_or("x").parse().unwrap_or(-1.0);
                    assert!(response >= header, "{line}");
                }
            }
        }
    }
}
