//! Logs and metrics as an operator reads them: access-log entries of every
//! protocol with the bytes sent, the admin socket reachable by a non-root
//! scraper, per-request refusals and clients' handshake quirks kept out of the
//! error log's flood.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

fn builder() -> ServerBuilder {
    ServerBuilder::new(BIN).bin_from_env()
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

/// The bytes field of a line in the default format (`... "REQUEST" STATUS BYTES ...`).
fn logged_bytes(line: &str) -> u64 {
    let after_request = line.split('"').nth(2).unwrap_or_default();
    let bytes = after_request.split_whitespace().nth(1);
    bytes.and_then(|b| b.parse().ok()).unwrap_or_else(|| panic!("no byte count in {line:?}"))
}

/// A built-in error page over HTTP/2 is logged with the bytes of its body, as
/// over HTTP/1.1.
#[test]
fn built_in_error_pages_are_logged_with_their_bytes_over_both_protocols() {
    let srv = builder().file("a.txt", "a\n").start();
    let h2 = fetch(&srv.url("/missing"), &["--http2"]);
    let h1 = fetch(&srv.url("/missing"), &["--http1.1"]);
    assert_eq!((h2.status, h1.status), (404, 404));
    assert!(!h2.body.is_empty());
    let log = srv.wait_access_log(2, Duration::from_secs(10));
    assert_eq!(log.len(), 2, "{log:?}");
    let line = |v: &str| log.iter().find(|l| l.contains(v)).unwrap_or_else(|| panic!("no {v} line in {log:?}"));
    assert_eq!(logged_bytes(line("HTTP/2.0")), h2.body.len() as u64, "{log:?}");
    assert_eq!(logged_bytes(line("HTTP/1.1")), h1.body.len() as u64, "{log:?}");
}

/// The admin Unix socket, made by root before the switch to `--user`, accepts a
/// scraper that is not root.
#[test]
fn a_non_root_scraper_connects_to_the_admin_socket() {
    assert!(running_as_root(), "this test starts ktlsd as root with --user nobody");
    let b = builder().file("a.txt", "a\n").args(["--user", "nobody"]);
    chmod(b.dir(), 0o755);
    let sock = b.dir().join("admin.sock");
    let srv = b.arg("--admin").arg(&sock).start();
    let out = run_with_timeout(
        Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "curl", "-sS", "--unix-socket"])
            .arg(&sock)
            .arg("http://admin/status"),
        None,
        Duration::from_secs(30),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("\"uptime"), "{out:?}");
    srv.stop();
}

/// Port-80 answers are logged (`tls=none`) and counted, and an HTTP-01 webroot
/// file is served from the root of the site the Host names (certbot's
/// `--webroot -w SITE_ROOT`), the default site's for any other Host.
#[test]
fn port_80_answers_are_logged_counted_and_served_from_the_hosts_site() {
    let b = builder().file(".well-known/acme-challenge/tok", "default-site");
    let site_root = b.dir().join("b-root");
    write_file(&site_root.join(".well-known/acme-challenge/tok"), b"site-b");
    let config = b.write_config(&format!(
        "http_listen = [\"127.0.0.1:0\"]\nadmin = \"./admin.sock\"\n[[site]]\nnames = [\"b.test\"]\nroot = {:?}\n",
        site_root.display().to_string()
    ));
    let sock = b.dir().join("admin.sock");
    let srv = b.arg("--config").arg(&config).start();
    let http = srv.http_addrs()[0];
    let get = |host: &str, path: &str| {
        let out = curl(&["-sS", "-H", &format!("Host: {host}"), &format!("http://{http}{path}")]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(get("b.test", "/.well-known/acme-challenge/tok"), "site-b");
    assert_eq!(get("other.test", "/.well-known/acme-challenge/tok"), "default-site");
    let redirect = curl(&["-sS", "-o", "/dev/null", "-w", "%{http_code}", &format!("http://{http}/x")]);
    assert_eq!(String::from_utf8_lossy(&redirect.stdout), "301");

    let log = srv.wait_access_log(3, Duration::from_secs(10));
    assert_eq!(log.len(), 3, "{log:?}");
    assert!(log.iter().all(|l| l.ends_with("tls=none")), "{log:?}");
    assert!(log.iter().any(|l| l.contains("\"GET /x HTTP/1.1\" 301 ")), "{log:?}");
    assert!(log.iter().any(|l| l.contains("\"GET /.well-known/acme-challenge/tok HTTP/1.1\" 200 6 ")), "{log:?}");
    let metrics = scrape(&sock);
    assert_eq!(metrics.get("ktlsd_plain_http_requests_total{code=\"2xx\"}"), Some(&2.0), "{metrics:?}");
    assert_eq!(metrics.get("ktlsd_plain_http_requests_total{code=\"3xx\"}"), Some(&1.0), "{metrics:?}");
    let https: f64 = metrics.iter().filter(|(k, _)| k.starts_with("ktlsd_requests_total")).map(|(_, v)| v).sum();
    assert_eq!(https, 0.0, "port-80 answers are not HTTPS requests");
    srv.stop();
}

/// One client sending refused requests in a loop writes a few error-log lines per
/// second and one "suppressed" line, not a line per request; the access log keeps
/// them all.
#[test]
fn refusals_are_rate_limited_per_reason_in_the_error_log() {
    let srv = builder().file("a.txt", "a\n").start();
    let url = srv.url("/a.txt");
    let urls: Vec<&str> = std::iter::repeat_n(url.as_str(), 200).collect();
    let mut args = vec!["-sS", "-o", "/dev/null", "-X", "DELETE"];
    args.extend(urls);
    let out = curl(&args);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(srv.wait_access_log(200, Duration::from_secs(20)).len(), 200);
    std::thread::sleep(Duration::from_millis(1500));
    let stderr = srv.stderr();
    let refused = stderr.lines().filter(|l| l.contains("refused 127.0.0.1")).count();
    assert!((1..=20).contains(&refused), "{refused} refusal lines for 200 refused requests:\n{stderr}");
    assert!(stderr.contains("suppressed ") && stderr.contains("similar refusal line(s) (405"), "{stderr}");
    srv.stop();
}

/// What a client puts in its handshake writes no error-log line: an IP address as
/// SNI (which RFC 6066 forbids, and wrk and some bots send) is ignored quietly.
#[test]
fn handshakes_naming_an_ip_address_leave_the_error_log_quiet() {
    let srv = builder().file("a.txt", "a\n").start();
    for _ in 0..3 {
        let (ok, out, err) = s_client(srv.addr(), &["-servername", "127.0.0.1"], "GET /a.txt HTTP/1.0\r\n\r\n");
        assert!(ok && out.contains("HTTP/1.1 200"), "{out}\n{err}");
    }
    assert_eq!(srv.wait_access_log(3, Duration::from_secs(20)).len(), 3);
    let stderr = srv.stderr();
    assert!(!stderr.contains("SNI"), "{stderr}");
    srv.stop();
}

/// Two sites: the custom format names each request's Host and site, and the
/// metrics count requests and bytes per site, give each site's certificate end,
/// and count reloads by result.
#[test]
fn custom_format_names_the_site_and_metrics_count_per_site() {
    let b = builder().file("a.txt", "default\n");
    let (cert, key) = make_cert(b.dir(), "b", "ec");
    let site_root = b.dir().join("b-root");
    write_file(&site_root.join("a.txt"), b"site b\n");
    let text = format!(
        "admin = \"./admin.sock\"\naccess_log_format = \"custom\"\naccess_log_custom = '$remote_addr \"$request\" $status $body_bytes_sent $host $site'\n\
         [[site]]\nnames = [\"b.test\"]\nroot = {:?}\ncert = {:?}\nkey = {:?}\n",
        site_root.display().to_string(),
        cert.display().to_string(),
        key.display().to_string()
    );
    let config = b.write_config(&text);
    let sock = b.dir().join("admin.sock");
    let srv = b.arg("--config").arg(&config).start();
    let port = srv.addr().port();
    let resolve = format!("b.test:{port}:127.0.0.1");
    let r = fetch(&format!("https://b.test:{port}/a.txt"), &["--resolve", &resolve, "--http1.1"]);
    assert_eq!(r.body_str(), "site b\n");
    let r = fetch(&format!("https://b.test:{port}/a.txt"), &["--resolve", &resolve, "--http2"]);
    assert_eq!(r.body_str(), "site b\n");
    assert_eq!(fetch(&srv.url("/a.txt"), &["--http1.1"]).body_str(), "default\n");
    let log = srv.wait_access_log(3, Duration::from_secs(10));
    assert_eq!(
        log,
        [
            format!("127.0.0.1 \"GET /a.txt HTTP/1.1\" 200 7 b.test:{port} b.test"),
            format!("127.0.0.1 \"GET /a.txt HTTP/2.0\" 200 7 b.test:{port} b.test"),
            format!("127.0.0.1 \"GET /a.txt HTTP/1.1\" 200 8 127.0.0.1:{port} default"),
        ]
    );

    let m = scrape(&sock);
    assert_eq!(m.get("ktlsd_site_requests_total{code=\"2xx\",site=\"b.test\"}"), Some(&2.0), "{m:?}");
    assert_eq!(m.get("ktlsd_site_requests_total{code=\"2xx\",site=\"default\"}"), Some(&1.0), "{m:?}");
    assert_eq!(m.get("ktlsd_site_sent_body_bytes_total{site=\"b.test\"}"), Some(&14.0), "{m:?}");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as f64;
    for site in ["default", "b.test"] {
        let end = m[&format!("ktlsd_certificate_expiry_timestamp_seconds{{site=\"{site}\"}}")];
        assert!(end > now + 86_400.0, "{site}: {end}");
    }
    assert_eq!(m.get("ktlsd_config_last_reload_successful"), Some(&1.0));

    std::fs::write(&config, text.replace("custom\"", "bogus\"")).unwrap();
    srv.signal(libc::SIGHUP);
    assert!(srv.wait_stderr("reload failed", Duration::from_secs(20)).is_some(), "{}", srv.stderr());
    let m = scrape(&sock);
    assert_eq!(m.get("ktlsd_reloads_total{result=\"failure\"}"), Some(&1.0), "{m:?}");
    assert_eq!(m.get("ktlsd_config_last_reload_successful"), Some(&0.0));
    std::fs::write(&config, &text).unwrap();
    srv.signal(libc::SIGHUP);
    assert!(srv.wait_stderr("reloaded configuration", Duration::from_secs(20)).is_some(), "{}", srv.stderr());
    let m = scrape(&sock);
    assert_eq!(m.get("ktlsd_reloads_total{result=\"success\"}"), Some(&1.0), "{m:?}");
    assert_eq!(m.get("ktlsd_config_last_reload_successful"), Some(&1.0));
    srv.stop();
}

/// An ACME site whose CA cannot be reached: its state is `failing` in the
/// metrics, its failures are counted, and `/status` carries the last error.
#[test]
fn acme_order_state_and_last_error_are_reported() {
    let b = builder().file("a.txt", "a\n");
    let site_root = b.dir().join("acme-root");
    std::fs::create_dir_all(&site_root).unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let config = b.write_config(&format!(
        "admin = \"./admin.sock\"\nhttp_listen = [\"127.0.0.1:0\"]\n[[site]]\nnames = [\"acme.test\"]\nroot = {:?}\n\
         acme = {{ directory = \"https://{closed}/dir\", challenge = \"http-01\" }}\n",
        site_root.display().to_string()
    ));
    let sock = b.dir().join("admin.sock");
    let srv = b.arg("--config").arg(&config).start();
    assert!(srv.wait_stderr("not obtained", Duration::from_secs(30)).is_some(), "{}", srv.stderr());
    let m = scrape(&sock);
    assert_eq!(m.get("ktlsd_acme_order_state{site=\"acme.test\",state=\"failing\"}"), Some(&1.0), "{m:?}");
    assert_eq!(m.get("ktlsd_acme_order_state{site=\"acme.test\",state=\"valid\"}"), Some(&0.0), "{m:?}");
    assert!(m["ktlsd_acme_errors_total{site=\"acme.test\"}"] >= 1.0, "{m:?}");
    assert!(m["ktlsd_acme_last_error_timestamp_seconds{site=\"acme.test\"}"] > 0.0, "{m:?}");
    let (status, body) = admin_get(&sock, "/status");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 200);
    assert_eq!(v["acme"]["acme.test"]["state"], "failing", "{v}");
    assert!(v["acme"]["acme.test"]["last_error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    srv.stop();
}

/// A `[[site]]` with its own `access_log`: its requests are logged there and not
/// in the top-level log, and SIGUSR1 reopens it after rotation.
#[test]
fn a_site_logs_to_its_own_access_log() {
    let b = builder().file("a.txt", "default\n");
    let site_root = b.dir().join("b-root");
    write_file(&site_root.join("a.txt"), b"site b\n");
    let config = b.write_config(&format!(
        "[[site]]\nnames = [\"b.test\"]\nroot = {:?}\naccess_log = \"b.log\"\n",
        site_root.display().to_string()
    ));
    let site_log = b.dir().join("b.log");
    let srv = b.arg("--config").arg(&config).start();
    let port = srv.addr().port();
    let resolve = format!("b.test:{port}:127.0.0.1");
    let b_url = format!("https://b.test:{port}/a.txt");
    assert_eq!(fetch(&b_url, &["--resolve", &resolve]).body_str(), "site b\n");
    assert_eq!(fetch(&srv.url("/a.txt"), &[]).body_str(), "default\n");
    let main = srv.wait_access_log(1, Duration::from_secs(10));
    let read_site = || std::fs::read_to_string(&site_log).unwrap_or_default();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while read_site().lines().count() < 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(main.len(), 1, "{main:?}");
    assert!(main[0].contains("GET /a.txt") && main[0].contains(" 200 8 "), "{main:?}");
    let site = read_site();
    assert_eq!(site.lines().count(), 1, "{site}");
    assert!(site.contains(" 200 7 "), "{site}");

    std::fs::rename(&site_log, site_log.with_extension("log.1")).unwrap();
    srv.signal(libc::SIGUSR1);
    assert!(
        srv.wait_stderr("reopened site b.test's access log", Duration::from_secs(10)).is_some(),
        "{}",
        srv.stderr()
    );
    assert_eq!(fetch(&b_url, &["--resolve", &resolve]).body_str(), "site b\n");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while read_site().lines().count() < 1 {
        assert!(std::time::Instant::now() < deadline, "no line in the reopened {}", site_log.display());
        std::thread::sleep(Duration::from_millis(50));
    }
    srv.stop();
}
