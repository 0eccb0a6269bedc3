//! The reverse proxy end to end: the real binary in front of real upstreams that
//! are not ktlsd (a small Python origin, `crates/testkit/src/origin.py`, whose answers and
//! misbehaviour the path chooses; nginx serving files), with curl as the client over
//! HTTP/1.1 and HTTP/2: methods and bodies both ways, large bodies streamed, header
//! rules, two upstreams balanced and a dead one skipped, hostile upstreams answered
//! 502/504 without a half response passed off as whole, and retries for idempotent
//! requests only.

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::Duration;

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

use testkit::origin::free_port;

/// ktlsd (one worker) with a file `/index.txt` and one `[[proxy]]` for `/api/**`.
fn proxy_server(upstreams: &[String], extra: &str) -> Server {
    proxy_server_with(upstreams, extra, &[])
}

/// [`proxy_server`] with more command-line arguments.
fn proxy_server_with(upstreams: &[String], extra: &str, args: &[&str]) -> Server {
    let list = upstreams.iter().map(|u| format!("{u:?}")).collect::<Vec<_>>().join(", ");
    let config = format!("[[proxy]]\npath = \"/api/**\"\nupstream = [{list}]\n{extra}\n");
    origin::ktlsd(BIN, &config, args)
}

const PROTOCOLS: [&str; 2] = ["--http1.1", "--http2"];

#[test]
fn get_head_and_post_reach_the_upstream_with_their_bodies() {
    let origin = Origin::start("a");
    let srv = proxy_server_with(&[origin.url()], "", &["--max-body-bytes", "4194304"]);
    for proto in PROTOCOLS {
        let r = fetch(&srv.url("/api/echo?x=1"), &[proto, "-H", "X-Custom: yes"]);
        assert_eq!(r.status, 200, "{proto}: {}", r.body_str());
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!((v["method"].as_str(), v["target"].as_str()), (Some("GET"), Some("/api/echo?x=1")), "{proto}");
        assert_eq!(r.header("cache-status"), Some("ktlsd; fwd=uri-miss"), "{proto}");
        let fields = v["fields"].as_array().unwrap();
        let field = |name: &str| {
            fields
                .iter()
                .find(|f| f[0].as_str().is_some_and(|n| n.eq_ignore_ascii_case(name)))
                .map(|f| f[1].as_str().unwrap().to_string())
        };
        assert_eq!(field("x-custom").as_deref(), Some("yes"), "{proto}: {v}");
        assert_eq!(field("x-forwarded-for").as_deref(), Some("127.0.0.1"), "{proto}");
        assert_eq!(field("x-forwarded-proto").as_deref(), Some("https"), "{proto}");
        assert_eq!(field("host"), Some(format!("127.0.0.1:{}", srv.port())), "Host is preserved ({proto})");
        assert_eq!(field("x-forwarded-host"), Some(format!("127.0.0.1:{}", srv.port())), "{proto}");
        assert!(field("forwarded").is_some_and(|f| f.starts_with("for=127.0.0.1;host=")), "{proto}: {v}");
        let via = if proto == "--http2" { "2 ktlsd" } else { "1.1 ktlsd" };
        assert_eq!(field("via").as_deref(), Some(via), "{proto}");

        let out = curl(&[proto, "-I", &srv.url("/api/echo")]);
        let (_, status, fields) = parse_head(String::from_utf8_lossy(&out.stdout).trim_end());
        assert_eq!(status, 200, "HEAD over {proto}");
        assert!(fields.iter().any(|(n, v)| n == "content-length" && v != "0"), "HEAD: {fields:?}");
        assert!(origin.requests().last().is_some_and(|l| l.starts_with("HEAD ")), "{:?}", origin.requests());

        let body: Vec<u8> = pattern(3 * 1024 * 1024 + 7, 5);
        let file = srv.write("upload.bin", &body);
        let r = fetch(&srv.url("/api/echo"), &[proto, "--data-binary", &format!("@{}", file.display())]);
        assert_eq!(r.status, 200, "{proto}: {}", r.body_str());
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["method"].as_str(), Some("POST"));
        assert_eq!(v["body_len"].as_u64(), Some(body.len() as u64), "{proto}");
        assert_eq!(v["body_sha256"].as_str(), Some(sha256(&body).as_str()), "{proto}");
    }
    // A chunked request body is decoded and sent on chunked.
    let body = pattern(1_500_000, 3);
    let file = srv.write("chunked.bin", &body);
    let chunked = ["--http1.1", "-H", "Transfer-Encoding: chunked", "--data-binary"];
    let r = fetch(&srv.url("/api/echo"), &[&chunked[..], &[&format!("@{}", file.display())]].concat());
    assert_eq!(r.status, 200, "{}", r.body_str());
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["body_sha256"].as_str(), Some(sha256(&body).as_str()));
    assert!(v["fields"].to_string().contains("\"Transfer-Encoding\",\"chunked\""), "{v}");
    let big = srv.write("big-chunked.bin", vec![b'y'; 4194305]);
    let r = fetch(&srv.url("/api/echo"), &[&chunked[..], &[&format!("@{}", big.display())]].concat());
    assert_eq!(r.status, 413, "max_body_bytes holds for chunked bodies");
    // A chunked body to a static path is still refused.
    assert_eq!(fetch(&srv.url("/index.txt"), &[&chunked[..], &["x"]].concat()).status, 411);
    // max_body_bytes holds for proxied requests too.
    let big = srv.write("big.bin", vec![b'x'; 4194305]);
    for proto in PROTOCOLS {
        let r = fetch(&srv.url("/api/echo"), &[proto, "--data-binary", &format!("@{}", big.display())]);
        assert_eq!(r.status, 413, "{proto}");
    }
    // Paths no rule takes are files.
    assert_eq!(fetch(&srv.url("/index.txt"), &[]).body_str(), "static file");
    assert!(origin.requests().iter().all(|l| l.contains("/api/")), "{:?}", origin.requests());
}

#[test]
fn upstream_connections_are_kept_alive_and_reused() {
    let origin = Origin::start("a");
    let srv = proxy_server(&[origin.url()], "");
    for i in 0..5 {
        let proto = PROTOCOLS[i % 2];
        assert_eq!(fetch(&srv.url("/api/name"), &[proto]).body_str(), "a");
    }
    let ports: std::collections::HashSet<String> =
        origin.requests().iter().map(|l| l.rsplit(' ').next().unwrap().to_string()).collect();
    assert_eq!(ports.len(), 1, "five requests over one upstream connection: {:?}", origin.requests());
}

#[test]
fn large_bodies_stream_in_every_framing() {
    let origin = Origin::start("a");
    let srv = proxy_server(&[origin.url()], "");
    for proto in PROTOCOLS {
        let n = 40 * 1024 * 1024 + 3;
        let want: Vec<u8> = (0..n).map(|i| (i % 65536 % 251) as u8).collect();
        let r = fetch(&srv.url(&format!("/api/big?n={n}")), &[proto]);
        assert_eq!(r.status, 200, "{proto}");
        assert_eq!(r.header("content-length"), Some(n.to_string().as_str()), "{proto}");
        assert_body(&format!("Content-Length body over {proto}"), &r.body, &want);
        // Longer than an HTTP/2 stream would hold whole: streamed too.
        let r = fetch(&srv.url("/api/chunked?n=9000003"), &[proto]);
        assert_eq!(r.body.len(), 9000003, "chunked over {proto}");
        assert_eq!(r.body[..10], (0..10).collect::<Vec<u8>>()[..], "{proto}");
        let r = fetch(&srv.url("/api/close?n=200000"), &[proto]);
        assert_eq!(r.body, vec![b'c'; 200000], "close-delimited over {proto}");
    }
    let log = srv.stderr();
    assert!(log.contains("body bytes by copy"), "the diagnostic line says how the body moved:\n{log}");
}

#[test]
fn hop_by_hop_fields_are_removed_and_via_added() {
    let origin = Origin::start("a");
    let srv = proxy_server(&[origin.url()], "");
    for proto in PROTOCOLS {
        let r = fetch(&srv.url("/api/headers"), &[proto]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "ok"), "{proto}");
        for gone in ["x-private", "keep-alive", "proxy-authenticate"] {
            assert_eq!(r.header(gone), None, "{gone} over {proto}: {:?}", r.headers);
        }
        assert_eq!(r.header("server"), Some("ktlsd"), "{proto}");
        assert_eq!(r.header("x-origin"), Some("kept"), "{proto}");
        assert_eq!(r.header_count("set-cookie"), 2, "{proto}");
        assert_eq!(r.header("via"), Some("1.1 ktlsd"), "{proto}");
    }
}

#[test]
fn two_upstreams_are_balanced_and_a_dead_one_is_skipped() {
    let (a, b) = (Origin::start("a"), Origin::start("b"));
    let dead = format!("http://127.0.0.1:{}", free_port());
    let admin = tempfile::tempdir().unwrap();
    let sock = admin.path().join("admin.sock");
    let sock_arg = sock.to_str().unwrap();
    let srv = proxy_server_with(&[a.url(), b.url(), dead.clone()], "fail_timeout = \"60s\"", &["--admin", sock_arg]);
    let mut names = Vec::new();
    for _ in 0..8 {
        let r = fetch(&srv.url("/api/name"), &[]);
        assert_eq!(r.status, 200, "the dead upstream is never the answer: {}", srv.stderr());
        names.push(r.body_str());
    }
    let count = |n: &str| names.iter().filter(|x| *x == n).count();
    assert!(count("a") >= 3 && count("b") >= 3, "round-robin over both live upstreams: {names:?}");
    let warned = srv.stderr().lines().filter(|l| l.contains("connect:")).count();
    assert_eq!(warned, 1, "the dead upstream is tried once, then skipped:\n{}", srv.stderr());
    let m = scrape(&sock);
    let get = |k: &str| m.get(k).copied().unwrap_or_else(|| panic!("{k} missing from /metrics: {m:?}"));
    assert_eq!(get(&format!("ktlsd_upstream_up{{upstream=\"{dead}\"}}")), 0.0);
    assert_eq!(get(&format!("ktlsd_upstream_up{{upstream=\"{}\"}}", a.url())), 1.0);
    assert!(get(&format!("ktlsd_upstream_requests_total{{upstream=\"{}\"}}", a.url())) >= 3.0);
    assert_eq!(get("ktlsd_upstream_errors_total{kind=\"connect\"}"), 1.0);
    assert!(get("ktlsd_proxy_body_bytes_total{by=\"copy\"}") >= 8.0);
    assert!(get(&format!("ktlsd_upstream_response_seconds_count{{upstream=\"{}\"}}", b.url())) >= 3.0);

    let srv = proxy_server(&[a.url(), b.url()], "balance = \"least-connections\"");
    for _ in 0..4 {
        assert_eq!(fetch(&srv.url("/api/name"), &[]).status, 200);
    }
}

#[test]
fn hostile_upstreams_get_502_or_504() {
    let origin = Origin::start("a");
    let admin = tempfile::tempdir().unwrap();
    let sock = admin.path().join("admin.sock");
    let config = "read_timeout = \"1s\"\nfail_timeout = \"1ms\"";
    let srv = proxy_server_with(&[origin.url()], config, &["--admin", sock.to_str().unwrap()]);
    for (path, status) in [
        ("/api/garbage", 502),
        ("/api/endless", 502),
        ("/api/huge-head", 502),
        ("/api/slow-head", 504),
        ("/api/close-early", 502),
    ] {
        for proto in PROTOCOLS {
            let r = fetch(&srv.url(path), &[proto]);
            assert_eq!(r.status, status, "{path} over {proto}: {}", srv.stderr());
            assert!(r.header("cache-status").is_some_and(|c| c.starts_with("ktlsd; fwd=uri-miss")), "{path}");
        }
    }
    // Once the head is out, a failure cuts the response (over HTTP/2 the stream is
    // reset): curl sees it incomplete. A body that fails in the bytes that came with
    // the head is answered 502 instead: nothing was sent yet.
    for (path, why) in [
        ("/api/short", "closed the connection before the end"),
        ("/api/slow-body", "timed out"),
        ("/api/bad-chunk", "invalid chunked body"),
    ] {
        for proto in PROTOCOLS {
            let out = curl(&["-o", "/dev/null", "-w", "%{http_code}", proto, &srv.url(path)]);
            let status = String::from_utf8_lossy(&out.stdout).to_string();
            assert!(!out.status.success() || status == "502", "{path} over {proto} must not look complete: {status}");
        }
        assert!(srv.stderr().contains(why), "{path}: no log line saying {why:?}:\n{}", srv.stderr());
    }
    let m = scrape(&sock);
    for (kind, at_least) in [("invalid", 3.0), ("timeout", 2.0), ("closed", 2.0), ("body", 3.0)] {
        let got = m.get(&format!("ktlsd_upstream_errors_total{{kind=\"{kind}\"}}")).copied().unwrap_or(0.0);
        assert!(got >= at_least, "{kind}: {got} errors counted: {m:?}");
    }
    // The server still answers.
    assert_eq!(fetch(&srv.url("/api/name"), &[]).body_str(), "a");
}

/// An upstream that accepts connections and closes each at once, counting them.
fn closing_upstream() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = count.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut s = s;
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut s, &mut buf);
            drop(s);
        }
    });
    (url, count)
}

#[test]
fn only_idempotent_requests_are_retried() {
    let origin = Origin::start("b");
    let (closer, accepted) = closing_upstream();
    // Round-robin starts with the first upstream: the one that closes.
    let srv = proxy_server(&[closer.clone(), origin.url()], "");
    let r = fetch(&srv.url("/api/name"), &[]);
    assert_eq!((r.status, r.body_str().as_str()), (200, "b"), "a GET goes to the next upstream");
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    drop(srv);

    let srv = proxy_server(&[closer.clone(), origin.url()], "");
    let r = fetch(&srv.url("/api/echo"), &["--http1.1", "--data-binary", "payload"]);
    assert_eq!(r.status, 502, "a POST that reached an upstream is not sent again");
    assert!(!origin.requests().iter().any(|l| l.starts_with("POST")), "{:?}", origin.requests());
    // The upstream closes before its head, or already while the body is being sent.
    let logged = srv.stderr().lines().any(|l| l.contains("\"POST /api/echo\": 502 upstream") && l.contains(&closer));
    assert!(logged, "one line names the upstream and why:\n{}", srv.stderr());
}

#[test]
fn nginx_as_the_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("www");
    std::fs::create_dir_all(root.join("api")).unwrap();
    let body = pattern(300_000, 9);
    std::fs::write(root.join("api/file.bin"), &body).unwrap();
    let (port, tls_port) = (free_port(), free_port());
    let (ca, cert, key) = upstream_certificates(dir.path());
    let conf = dir.path().join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off; pid {pid}; error_log {err} info; worker_processes 1;\n\
             events {{}}\n\
             http {{ access_log off; client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp};\n\
             uwsgi_temp_path {tmp}; scgi_temp_path {tmp};\n\
             server {{ listen 127.0.0.1:{port}; root {root}; add_header X-Upstream nginx; }}\n\
             server {{ listen 127.0.0.1:{tls_port} ssl; ssl_certificate {cert}; ssl_certificate_key {key};\n\
             root {root}; add_header X-Upstream nginx-tls; }} }}\n",
            pid = dir.path().join("nginx.pid").display(),
            err = dir.path().join("error.log").display(),
            tmp = dir.path().display(),
            root = root.display(),
            cert = cert.display(),
            key = key.display(),
        ),
    )
    .unwrap();
    let mut nginx = Command::new("/usr/sbin/nginx")
        .arg("-c")
        .arg(&conf)
        .arg("-p")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("/usr/sbin/nginx (nginx-light)");
    let ready = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    assert!(
        ready,
        "nginx did not start: {}",
        std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default()
    );
    let srv = proxy_server(&[format!("http://127.0.0.1:{port}")], "host = \"upstream\"");
    for proto in PROTOCOLS {
        for _ in 0..3 {
            let r = fetch(&srv.url("/api/file.bin"), &[proto]);
            assert_eq!((r.status, r.header("x-upstream")), (200, Some("nginx")), "{proto}");
            assert_body("nginx's file", &r.body, &body);
            assert!(r.header("etag").is_some() && r.header("last-modified").is_some());
        }
        let r = fetch(&srv.url("/api/missing"), &[proto]);
        assert_eq!(r.status, 404, "the upstream's status passes through");
    }
    // An https:// upstream, verified against upstream_ca.
    let ca = format!("upstream_ca = {:?}", ca.display().to_string());
    let srv = proxy_server(&[format!("https://localhost:{tls_port}")], &ca);
    for proto in PROTOCOLS {
        let r = fetch(&srv.url("/api/file.bin"), &[proto]);
        assert_eq!((r.status, r.header("x-upstream")), (200, Some("nginx-tls")), "{proto}: {}", srv.stderr());
        assert_body("nginx's file over TLS", &r.body, &body);
    }
    // Without it, the system roots do not know the upstream's certificate: 502.
    let srv = proxy_server(&[format!("https://localhost:{tls_port}")], "");
    assert_eq!(fetch(&srv.url("/api/file.bin"), &[]).status, 502);
    assert!(srv.stderr().contains("certificate"), "the log says why: {}", srv.stderr());
    // SIGQUIT: the master stops its workers too (a SIGKILL would leave them running).
    let _ = Command::new("kill").args(["-QUIT", &nginx.id().to_string()]).status();
    let _ = nginx.wait();
}

#[test]
fn a_site_has_its_own_proxy_rules() {
    let origin = Origin::start("site");
    let b = Server::builder(BIN).workers(Some(1)).file("api/name", "a file of the default site");
    let config = format!(
        "[[site]]\nnames = [\"proxied.test\"]\nroot = {:?}\n[[site.proxy]]\npath = \"/api/*\"\nupstream = [{:?}]\n",
        b.root().display().to_string(),
        origin.url()
    );
    let srv = b.config(&config).start();
    let resolve = format!("proxied.test:{}:127.0.0.1", srv.port());
    let url = format!("https://proxied.test:{}/api/name", srv.port());
    for proto in PROTOCOLS {
        let r = fetch(&url, &[proto, "--resolve", &resolve]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "site"), "{proto}");
        let r = fetch(&srv.url("/api/name"), &[proto]);
        assert_eq!(r.body_str(), "a file of the default site", "the default site has no rule ({proto})");
    }
}

#[test]
fn proxied_paths_pass_redirects_and_basic_auth_before_forwarding() {
    let origin = Origin::start("a");
    let b = Server::builder(BIN).workers(Some(1)).file("index.txt", "static file");
    let out = Command::new("htpasswd").args(["-nbB", "-C", "5", "alice", "s3cret"]).output();
    let out = out.expect("htpasswd (apache2-utils) runs");
    assert!(out.status.success(), "htpasswd failed: {}", String::from_utf8_lossy(&out.stderr));
    let users = b.dir().join("users");
    std::fs::write(&users, &out.stdout).unwrap();
    let config = format!(
        "[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\n\n[[redirect]]\npath = \"/api/name\"\nto = \"/index.txt\"\n\n\
         [[auth]]\npath = \"/api/echo\"\nusers = {:?}\nrealm = \"Staff only\"\n",
        origin.url(),
        users.display().to_string()
    );
    let srv = b.config(&config).start();
    for proto in PROTOCOLS {
        let r = fetch(&srv.url("/api/name"), &[proto]);
        assert_eq!(r.status, 301, "[[redirect]] ({proto})");
        assert_eq!(r.header("location"), Some("/index.txt"), "{proto}");
        let r = fetch(&srv.url("/api/name"), &[proto, "--data-binary", "a body that is never read"]);
        assert!(matches!(r.status, 301 | 308), "[[redirect]] with a request body ({proto}): {}", r.status);
        let r = fetch(&srv.url("/api/echo"), &[proto]);
        assert_eq!(r.status, 401, "[[auth]] without credentials ({proto})");
        assert!(r.header("www-authenticate").is_some_and(|v| v.contains("Staff only")), "{proto}");
        let r = fetch(&srv.url("/api/echo"), &[proto, "-u", "alice:wrong"]);
        assert_eq!(r.status, 401, "[[auth]] with a wrong password ({proto})");
        let r = fetch(&srv.url("/api/echo"), &[proto, "-u", "alice:s3cret"]);
        assert_eq!(r.status, 200, "[[auth]] with credentials ({proto}): {}", r.body_str());
    }
    let seen = origin.requests();
    assert_eq!(seen.len(), 2, "only the authorised requests reach the upstream: {seen:?}");
    assert!(seen.iter().all(|l| l.starts_with("GET /api/echo ")), "{seen:?}");
}

/// An upstream that answers `ok` with keep-alive, counting its connections: when
/// `idle_close`, each connection is closed 100 ms after its first answer (as a short
/// keepalive_timeout would); otherwise a second request on a connection is read and
/// the connection closed without an answer (the race of a keep-alive timeout).
fn keep_alive_upstream(idle_close: bool) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = count.clone();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
                let length = text.split("content-length:").nth(1).and_then(|v| v.lines().next());
                let mut body = vec![0u8; length.and_then(|v| v.trim().parse().ok()).unwrap_or(0)];
                let _ = s.read_exact(&mut body);
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
                if idle_close {
                    std::thread::sleep(Duration::from_millis(100));
                } else {
                    let _ = s.read(&mut [0u8; 4096]);
                }
            });
        }
    });
    (url, count)
}

#[test]
fn idle_upstream_connections_closed_by_the_upstream_are_not_used_or_are_retried() {
    use std::sync::atomic::Ordering::SeqCst;
    // Closed while idle: seen before use, so even a POST (never sent twice) goes on a fresh connection.
    let (url, accepted) = keep_alive_upstream(true);
    let srv = proxy_server(&[url], "");
    for (i, args) in [&[][..], &["--data-binary", "payload"], &[]].iter().enumerate() {
        let r = fetch(&srv.url("/api/x"), &[&["--http1.1"][..], args].concat());
        assert_eq!((r.status, r.body_str().as_str()), (200, "ok"), "request {i}:\n{}", srv.stderr());
        std::thread::sleep(Duration::from_millis(400));
    }
    assert_eq!(accepted.load(SeqCst), 3, "one connection per request");
    drop(srv);

    // Closed as the next request arrives: a GET is sent again on a new connection.
    let (url, accepted) = keep_alive_upstream(false);
    let srv = proxy_server(&[url], "");
    for i in 0..3 {
        let r = fetch(&srv.url("/api/x"), &["--http1.1"]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "ok"), "request {i}:\n{}", srv.stderr());
    }
    assert_eq!(accepted.load(SeqCst), 3, "each stale connection replaced by a new one");
    assert!(!srv.stderr().contains("skipped"), "a stale connection does not mark the upstream failed");
}

/// `upstream = ["unix:/PATH"]`: HTTP/1.1 over a Unix socket, bodies both ways and
/// in every framing, its connections kept alive and reused as TCP ones are.
#[test]
fn an_origin_on_a_unix_socket_is_proxied_and_its_connections_reused() {
    let origin = Origin::start_unix("unix");
    let srv = proxy_server_with(&[origin.unix_url()], "", &["--max-body-bytes", "4194304"]);
    for proto in PROTOCOLS {
        assert_eq!(fetch(&srv.url("/api/name"), &[proto]).body_str(), "unix", "{proto}");
        let r = fetch(&srv.url("/api/echo"), &[proto, "--data-binary", "posted body"]);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["body_len"].as_u64(), Some(11), "{proto}: {v}");
        for path in ["/api/big?n=3000000", "/api/chunked?n=3000000", "/api/close?n=3000000"] {
            let r = fetch(&srv.url(path), &[proto]);
            assert_eq!((r.status, r.body.len()), (200, 3_000_000), "{proto} {path}");
        }
    }
    // Requests answered by length or chunks leave their connection to the pool.
    let conns: std::collections::HashSet<String> = origin
        .requests()
        .iter()
        .filter(|l| !l.contains("/api/close"))
        .map(|l| l.rsplit(' ').next().unwrap().to_string())
        .collect();
    assert!(conns.len() <= 3, "requests over few Unix connections: {:?}", origin.requests());
    // An upstream socket nobody listens on: 502, as a refused TCP connection.
    drop(origin);
    let dead = Origin::start_unix("x");
    let url = dead.unix_url();
    drop(dead);
    let srv2 = proxy_server(&[url], "");
    assert_eq!(fetch(&srv2.url("/api/name"), &[]).status, 502);
}
