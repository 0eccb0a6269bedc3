//! Operations: reload on SIGHUP (certificate swap with no failed request and no
//! interrupted response, connections from before it retired, invalid
//! configurations refused, listeners opened and closed), access-log reopening on SIGUSR1, signals that must not kill
//! the server, refusing a port someone else listens on, `ktlsd check`, and the
//! ready line `serve` prints on stdout; an HTTP/2 stream stalled on its own
//! window reset at the send timeout while its connection stays busy.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// The leaf certificate's SHA-256 in the form the server logs (colon-separated hex).
fn fingerprint(der: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(der).iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(":")
}

/// The fingerprint of the certificate in a PEM file.
fn pem_fingerprint(path: &Path) -> String {
    use rustls::pki_types::pem::PemObject;
    let der = rustls::pki_types::CertificateDer::from_pem_file(path).expect("certificate PEM");
    fingerprint(der.as_ref())
}

/// Connects with a fresh client (no session to resume), does one GET and
/// returns the fingerprint of the certificate the server presented.
fn fetch_fingerprint(addr: SocketAddr, path: &str) -> Result<(String, u16), String> {
    let cfg = client_config(&[&rustls::version::TLS13, &rustls::version::TLS12]);
    let mut c = TlsClient::connect_with(addr, cfg).map_err(|e| format!("connect: {e}"))?;
    let leaf = c
        .tls
        .conn
        .peer_certificates()
        .and_then(|certs| certs.first())
        .map(|leaf| fingerprint(leaf.as_ref()))
        .ok_or("no peer certificate")?;
    c.try_send(get_request(path).as_bytes()).map_err(|e| format!("send: {e}"))?;
    let resp = c.try_read_response(false).map_err(|e| format!("read: {e}"))?;
    Ok((leaf, resp.status))
}

/// Replaces `dst` by a copy of `src` in one rename, so a reload never reads half a file.
fn replace_file(src: &Path, dst: &Path) {
    let tmp = dst.with_extension("tmp");
    std::fs::copy(src, &tmp).expect("copy");
    std::fs::rename(&tmp, dst).expect("rename");
}

fn count_lines(srv: &Server, needle: &str) -> usize {
    srv.stderr().lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn reload_swaps_the_certificate_without_a_failed_request_or_an_interrupted_download() {
    let b = Server::builder(BIN);
    let (cert_a, key_a) = make_cert(b.dir(), "a", "ec");
    let (cert_b, key_b) = make_cert(b.dir(), "b", "rsa");
    let (cert, key) = (b.dir().join("live.crt"), b.dir().join("live.key"));
    replace_file(&cert_a, &cert);
    replace_file(&key_a, &key);
    let srv = b.workers(Some(2)).arg("--cert").arg(&cert).arg("--key").arg(&key).file("small.txt", "small\n").start();
    let (fp_a, fp_b) = (pem_fingerprint(&cert_a), pem_fingerprint(&cert_b));
    assert_ne!(fp_a, fp_b);
    let want = write_big_file(&srv.root().join("big.bin"), 48 << 20);

    // One keep-alive connection downloads the large file slowly, across every reload.
    let mut big = TlsClient::connect(srv.addr());
    big.set_recv_buffer(64 * 1024);
    big.send(get_request("/big.bin").as_bytes());
    let download = std::thread::spawn(move || {
        let mut got = Vec::new();
        let mut body_left = None;
        loop {
            let chunk = big.read_exact_bytes(256 * 1024).or_else(|_| Ok::<_, ()>(big.take_pending()));
            let chunk = chunk.unwrap_or_default();
            got.extend_from_slice(&chunk);
            if body_left.is_none() {
                if let Some(end) = find(&got, b"\r\n\r\n") {
                    let (_, status, headers) = parse_head(&String::from_utf8_lossy(&got[..end + 4]));
                    assert_eq!(status, 200);
                    let len: usize = headers
                        .iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                        .unwrap()
                        .1
                        .parse()
                        .unwrap();
                    got.drain(..end + 4);
                    body_left = Some(len);
                }
            }
            if let Some(len) = body_left {
                if got.len() >= len {
                    break;
                }
            }
            if chunk.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(8));
        }
        // The reloads retired the connection: it ends after the response under way.
        let closed = matches!(big.poll_read(Duration::from_secs(10)), Ok(Some(0)) | Err(_));
        (sha256(&got), got.len(), closed)
    });

    // New connections in a loop, each remembering which certificate it saw.
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let done = Arc::new(AtomicU64::new(0));
    let addr = srv.addr();
    let looping: Vec<_> = (0..2)
        .map(|_| {
            let (stop, failures, seen, done) = (stop.clone(), failures.clone(), seen.clone(), done.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match fetch_fingerprint(addr, "/small.txt") {
                        Ok((fp, 200)) => {
                            let mut s = seen.lock().unwrap();
                            if s.last() != Some(&fp) {
                                s.push(fp);
                            }
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok((_, status)) => failures.lock().unwrap().push(format!("status {status}")),
                        Err(e) => failures.lock().unwrap().push(e),
                    }
                }
            })
        })
        .collect();

    let wait_requests = |n: u64| {
        let target = done.load(Ordering::Relaxed) + n;
        let deadline = Instant::now() + Duration::from_secs(30);
        while done.load(Ordering::Relaxed) < target {
            assert!(Instant::now() < deadline, "the client loop stalled");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    wait_requests(20);
    for (i, (c, k, fp)) in
        [(&cert_b, &key_b, &fp_b), (&cert_a, &key_a, &fp_a), (&cert_b, &key_b, &fp_b)].into_iter().enumerate()
    {
        replace_file(c, &cert);
        replace_file(k, &key);
        let line = reload(&srv, i + 1);
        assert!(line.contains("reloaded configuration") && line.contains(fp.as_str()), "reload #{}: {line}", i + 1);
        wait_requests(20);
    }
    stop.store(true, Ordering::Relaxed);
    for t in looping {
        t.join().unwrap();
    }

    let (sum, len, closed) = download.join().unwrap();
    assert_eq!(len, 48 << 20, "the download was cut short");
    assert_eq!(sum, want, "the download arrived corrupted");
    assert!(closed, "the connection opened before the reloads ends after its response");
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} failed request(s) during reloads: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= 4, "the loop saw only {seen:?} (wanted A, B, A, B in turn)");
    assert_eq!(seen.first(), Some(&fp_a));
    assert_eq!(seen.last(), Some(&fp_b));
    assert_eq!(fetch_fingerprint(addr, "/small.txt").unwrap(), (fp_b, 200));
    let stopped = srv.stop();
    stopped.assert_clean_exit();
}

#[test]
fn an_invalid_reload_keeps_the_running_configuration() {
    let b = Server::builder(BIN).no_root_arg();
    let (cert_a, key_a) = make_cert(b.dir(), "a", "ec");
    let (_, key_b) = make_cert(b.dir(), "b", "ec");
    let (cert, key) = (b.dir().join("live.crt"), b.dir().join("live.key"));
    replace_file(&cert_a, &cert);
    replace_file(&key_a, &key);
    let conf = b.dir().join("ktlsd.toml");
    let good = format!("root = {:?}\ncert = \"live.crt\"\nkey = \"live.key\"\n", b.root());
    std::fs::write(&conf, &good).unwrap();
    let srv = b.arg("--config").arg(&conf).file("f.txt", "old\n").start();
    let fp_a = pem_fingerprint(&cert_a);

    // An unknown key in the file.
    std::fs::write(&conf, format!("{good}colour = \"blue\"\n")).unwrap();
    let line = reload(&srv, 1);
    assert!(line.contains("reload failed") && line.contains("colour") && line.contains("ktlsd.toml"), "{line}");
    assert!(line.contains("still serving the previous configuration"), "{line}");
    assert_eq!(fetch_fingerprint(srv.addr(), "/f.txt").unwrap(), (fp_a.clone(), 200));

    // A key that does not match the certificate.
    std::fs::write(&conf, &good).unwrap();
    replace_file(&key_b, &key);
    let line = reload(&srv, 2);
    assert!(line.contains("reload failed") && line.contains("does not match"), "{line}");
    assert_eq!(fetch_fingerprint(srv.addr(), "/f.txt").unwrap(), (fp_a.clone(), 200));

    // A root that is gone.
    replace_file(&key_a, &key);
    std::fs::write(
        &conf,
        format!("{good}root = \"/nonexistent/www\"\n").replace(&format!("root = {:?}\n", srv.root()), ""),
    )
    .unwrap();
    let line = reload(&srv, 3);
    assert!(line.contains("reload failed") && line.contains("/nonexistent/www"), "{line}");
    assert_eq!(count_lines(&srv, "reload failed"), 3, "one line per failed reload:\n{}", srv.stderr());
    let mut c = TlsClient::connect(srv.addr());
    assert_eq!(c.get("/f.txt").body_str(), "old\n");

    // Fixed: the next reload takes.
    std::fs::write(&conf, &good).unwrap();
    assert!(reload(&srv, 4).contains("reloaded configuration"));
    srv.stop().assert_clean_exit();
}

#[test]
fn reload_applies_settings_to_new_connections_and_opens_and_closes_listeners() {
    let b = Server::builder(BIN).listen(&[]);
    let conf = b.write_config("listen = [\"127.0.0.1:0\"]\n");
    let srv = b.arg("--config").arg(&conf).file(".hidden", "secret\n").file("d/x.txt", "x").start();
    let mut before = TlsClient::connect(srv.addr());
    assert_eq!(before.get("/d/").status, 403);

    std::fs::write(&conf, "listen = [\"127.0.0.2:0\"]\ndotfiles = true\nautoindex = true\n").unwrap();
    let line = reload(&srv, 1);
    assert!(line.contains("reloaded configuration"), "{line}");
    let stderr = srv.stderr();
    let opened = stderr.lines().find_map(|l| l.split("reload: listening on https://").nth(1)).map(str::trim);
    let new: SocketAddr = opened.unwrap_or_else(|| panic!("no new listener line:\n{stderr}")).parse().unwrap();
    assert_eq!(new.ip().to_string(), "127.0.0.2");
    assert!(stderr.contains(&format!("no longer listening on https://{}", srv.addr())), "{stderr}");

    // The new listener serves with the new settings; the old one is closed.
    let mut after = TlsClient::connect(new);
    let r = after.get("/.hidden");
    assert_eq!((r.status, r.body_str().as_str()), (200, "secret\n"));
    let r = after.get("/d/");
    assert!(r.status == 200 && r.body_str().contains("x.txt"), "{} {}", r.status, r.body_str());
    assert!(wait_connect_refused(srv.addr(), Duration::from_secs(5)), "the removed listener still accepts");
    // A connection from before the reload, idle, is closed: it never serves the old settings again.
    assert!(matches!(before.poll_read(Duration::from_secs(5)), Ok(Some(0)) | Err(_)), "still open after the reload");
    srv.stop().assert_clean_exit();
}

#[test]
fn sigusr1_reopens_the_access_log_after_rotation() {
    let srv = Server::builder(BIN).file("a.txt", "a").file("b.txt", "b").start();
    let log = srv.access_log_path().to_path_buf();
    let mut c = TlsClient::connect(srv.addr());
    assert_eq!(c.get("/a.txt").status, 200);
    // Rotated before the worker's periodic flush: the line is still buffered.
    let rotated = log.with_extension("log.1");
    std::fs::rename(&log, &rotated).unwrap();
    srv.signal(libc::SIGUSR1);
    assert!(srv.wait_stderr("reopened access log", Duration::from_secs(10)).is_some(), "{}", srv.stderr());
    // The workers take the reopened file as their next configuration, a moment after
    // the line above: requests go on until one is logged in the new file.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("/b.txt") {
        assert!(Instant::now() < deadline, "no /b.txt line in the new {}", log.display());
        let mut d = TlsClient::connect(srv.addr());
        assert_eq!(d.get("/b.txt").status, 200);
        std::thread::sleep(Duration::from_millis(250));
    }
    let (old, new) = (std::fs::read_to_string(&rotated).unwrap(), std::fs::read_to_string(&log).unwrap());
    assert!(old.contains("GET /a.txt"), "rotated file:\n{old}");
    assert!(!new.contains("/a.txt"), "new file:\n{new}");
    srv.stop().assert_clean_exit();
}

#[test]
fn common_signals_without_an_action_do_not_stop_the_server() {
    let srv = Server::builder(BIN).file("a.txt", "a").start();
    for sig in [libc::SIGUSR2, libc::SIGWINCH, libc::SIGPIPE, libc::SIGUSR2, libc::SIGWINCH] {
        srv.signal(sig);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(srv.wait_stderr("SIGWINCH ignored", Duration::from_secs(10)).is_some(), "{}", srv.stderr());
    let mut c = TlsClient::connect(srv.addr());
    assert_eq!(c.get("/a.txt").body_str(), "a");
    assert_eq!(count_lines(&srv, "SIGUSR2 ignored"), 1, "{}", srv.stderr());
    assert_eq!(count_lines(&srv, "SIGWINCH ignored"), 1, "{}", srv.stderr());
    let stopped = srv.stop();
    stopped.assert_clean_exit();
}

#[test]
fn sighup_keeps_serving_and_keeps_access_log_lines() {
    let srv = Server::builder(BIN).file("a.txt", "a").start();
    let mut c = TlsClient::connect(srv.addr());
    assert_eq!(c.get("/a.txt").status, 200);
    // The line is still in the worker's buffer when the signal arrives.
    assert!(reload(&srv, 1).contains("reloaded configuration"));
    assert_eq!(TlsClient::connect(srv.addr()).get("/a.txt").status, 200);
    let log = srv.wait_access_log(2, Duration::from_secs(10));
    assert_eq!(log.len(), 2, "{log:?}");
    srv.stop().assert_clean_exit();
}

#[test]
fn a_second_server_on_the_same_port_refuses_to_start() {
    let first = Server::builder(BIN).file("a.txt", "first").start();
    let addr = first.addr().to_string();
    let second = Server::builder(BIN).listen(&[&addr]).run_to_exit();
    second.assert_startup_error(&[&addr, "address already in use"]);
    // The first still gets every connection.
    for _ in 0..20 {
        let mut c = TlsClient::connect(first.addr());
        assert_eq!(c.get("/a.txt").body_str(), "first");
    }
    first.stop().assert_clean_exit();
}

#[test]
fn a_port_held_by_another_listener_refuses_start_up() {
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = holder.local_addr().unwrap().to_string();
    let out = Server::builder(BIN).listen(&[&addr]).run_to_exit();
    out.assert_startup_error(&[&addr, "address already in use"]);

    // The same from a listener that set SO_REUSEPORT itself (as a second ktlsd does).
    let python = Command::new("python3")
        .args(["-c", "import socket,sys,time\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEPORT,1)\ns.bind(('127.0.0.1',0))\ns.listen()\nprint(s.getsockname()[1],flush=True)\nsys.stdin.read()"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut python = KillOnDrop(python);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(python.0.stdout.as_mut().unwrap()), &mut line).unwrap();
    let addr = format!("127.0.0.1:{}", line.trim());
    let out = Server::builder(BIN).listen(&[&addr]).run_to_exit();
    out.assert_startup_error(&[&addr, "address already in use"]);
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---------------------------------------------------------------------------
// ktlsd check
// ---------------------------------------------------------------------------

fn check(dir: &Path, args: &[&std::ffi::OsStr]) -> Exited {
    let mut cmd = Command::new(BIN);
    cmd.arg("check").args(args).current_dir(dir).env_remove("KTLSD_LOG");
    if running_as_root() {
        cmd.arg("--allow-root");
    }
    Exited::from(run_with_timeout(&mut cmd, None, Duration::from_secs(30)))
}

/// A self-signed certificate ending `days` from now (negative: already ended).
fn cert_ending_in(dir: &Path, name: &str, days: i64) -> (PathBuf, PathBuf) {
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let now = std::time::SystemTime::now();
    // An hour short of whole days, so the warning's day count is exact.
    let end = if days > 0 {
        now + Duration::from_secs(days as u64 * 86_400 - 3600)
    } else {
        now - Duration::from_secs(days.unsigned_abs() * 86_400)
    };
    params.not_before = (now - Duration::from_secs(400 * 86_400)).into();
    params.not_after = end.into();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let (c, k) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

#[test]
fn check_reports_each_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("www")).unwrap();
    let (cert, key) = cert_ending_in(d, "good", 90);
    let (_, other_key) = cert_ending_in(d, "other", 90);
    let os = |s: &str| std::ffi::OsString::from(s);
    let base = |cert: &Path, key: &Path| -> Vec<std::ffi::OsString> {
        vec![os("www"), os("--listen"), os("127.0.0.1:0"), os("--cert"), cert.into(), os("--key"), key.into()]
    };
    let run = |args: Vec<std::ffi::OsString>| check(d, &args.iter().map(|a| a.as_os_str()).collect::<Vec<_>>());

    let ok = run(base(&cert, &key));
    assert_eq!((ok.status.code(), ok.stdout.as_str()), (Some(0), "configuration OK\n"), "{}", ok.stderr);
    assert!(!ok.stderr.contains("WARN"), "{}", ok.stderr);

    run(base(&cert, &other_key)).assert_startup_error(&["does not match"]);
    let mut missing_root = base(&cert, &key);
    missing_root[0] = os("nowhere");
    run(missing_root).assert_startup_error(&["nowhere"]);
    let mut bad_policy = base(&cert, &key);
    bad_policy.extend([os("--record-size"), os("static:0")]);
    run(bad_policy).assert_startup_error(&["record_size"]);
    std::fs::write(d.join("bad.toml"), "listen = 8443\n").unwrap();
    let mut bad_file = base(&cert, &key);
    bad_file.extend([os("--config"), os("bad.toml")]);
    run(bad_file).assert_startup_error(&["bad.toml", "line 1"]);

    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = holder.local_addr().unwrap().to_string();
    let mut busy = base(&cert, &key);
    busy[2] = os(&taken);
    // The message names the holder (this test process) from /proc.
    run(busy).assert_startup_error(&[&taken, "address already in use", &format!("pid {})", std::process::id())]);
    drop(holder);

    // Certificates near or past their end: valid configuration, with a warning.
    for (days, warning) in [(5, "expires in 4 day(s)"), (-3, "has expired")] {
        let (c, k) = cert_ending_in(d, &format!("end{days}"), days);
        let out = run(base(&c, &k));
        assert_eq!((out.status.code(), out.stdout.as_str()), (Some(0), "configuration OK\n"), "{}", out.stderr);
        assert!(out.stderr.contains(warning) && out.stderr.contains("WARN"), "{days} days: {}", out.stderr);
    }
}

#[test]
fn start_up_warns_about_a_certificate_about_to_expire() {
    let b = Server::builder(BIN);
    let (cert, key) = cert_ending_in(b.dir(), "soon", 3);
    let srv = b.arg("--cert").arg(&cert).arg("--key").arg(&key).start();
    assert!(srv.stderr().contains("expires in 2 day(s)"), "{}", srv.stderr());
    srv.stop().assert_clean_exit();
}

/// `serve` announces itself with one JSON line, the first on stdout, naming the
/// bound addresses (port 0 resolved), its pid and the record layer; access-log
/// lines sent to stdout follow it and stay whole.
#[test]
fn the_ready_line_comes_first_on_stdout_and_names_what_was_bound() {
    let srv = Server::builder(BIN)
        .file("a.txt", "hello\n")
        .no_access_log()
        .args(["--http-listen", "127.0.0.1:0", "--access-log", "-"])
        .start();
    assert_eq!(srv.ready_pid(), srv.pid() as u32);
    assert!(["ktls", "userspace"].contains(&srv.ready_tls()), "tls: {}", srv.ready_tls());
    let (https, http) = (srv.addr(), srv.http_addrs()[0]);
    assert!(https.port() != 0 && http.port() != 0 && https.port() != http.port(), "{https} {http}");
    let stderr = srv.stderr();
    assert!(stderr.contains(&format!("listening on https://{https}")), "{stderr}");
    assert!(stderr.contains(&format!("listening on http://{http}")), "{stderr}");

    assert_eq!(fetch(&srv.url("/a.txt"), &[]).body_str(), "hello\n");
    let access = srv.wait_stdout("GET /a.txt", Duration::from_secs(10)).expect("access log line on stdout");
    let lines = srv.stdout_lines();
    assert_eq!(Ready::parse(&lines[0]).map(|r| r.https), Some(vec![https]), "first stdout line: {lines:?}");
    assert_eq!(lines.iter().filter(|l| l.contains("\"ready\"")).count(), 1, "{lines:?}");
    assert!(lines[1..].contains(&access), "{lines:?}");
}

/// HTTP/2 send timeout per stream: a stream stalled on its own flow-control
/// window (the client never opens it) is reset at the send timeout while other
/// streams keep the connection busy, and those go on being answered.
#[test]
fn h2_stream_stalled_on_its_window_is_reset_while_the_connection_stays_busy() {
    let srv = Server::builder(BIN)
        .file("small.txt", "small\n")
        .file("big.bin", vec![7u8; 100_000])
        .args(["--send-timeout", "1s"])
        .start();
    let script = format!(
        r#"
import socket, ssl, time
import h2.connection, h2.config, h2.events, h2.settings
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(["h2"])
s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", {port})), server_hostname="localhost")
s.settimeout(10)
c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
c.initiate_connection()
c.update_settings({{h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000}})
c.increment_flow_control_window(10_000_000)
s.sendall(c.data_to_send())
def get(path):
    sid = c.get_next_available_stream_id()
    c.send_headers(sid, [(":method","GET"),(":path",path),(":scheme","https"),(":authority","localhost")], end_stream=True)
    s.sendall(c.data_to_send())
    return sid
big = get("/big.bin")
start = time.time()
reset_at = None
small_done = 0
pending = get("/small.txt")
while time.time() - start < 6 and reset_at is None:
    for e in c.receive_data(s.recv(65536)):
        if isinstance(e, h2.events.StreamReset) and e.stream_id == big:
            reset_at = time.time() - start
        if isinstance(e, h2.events.StreamEnded) and e.stream_id == pending:
            small_done += 1
            time.sleep(0.1)
            pending = get("/small.txt")
    s.sendall(c.data_to_send())
print("reset" if reset_at else "no-reset", round(reset_at or 0, 1), small_done, flush=True)
"#,
        port = srv.addr().port()
    );
    let out = run_with_timeout(Command::new("/usr/bin/python3").args(["-c", &script]), None, Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<&str> = text.split_whitespace().collect();
    assert!(out.status.success() && f.len() == 3, "{out:?}");
    assert_eq!(f[0], "reset", "the stalled stream was never reset: {text}");
    let at: f64 = f[1].parse().unwrap();
    let served: u32 = f[2].parse().unwrap();
    assert!((0.9..3.0).contains(&at), "reset after {at} s with a 1 s send timeout");
    assert!(served >= 5, "the connection stopped serving its other streams: {served}");
    srv.stop().assert_clean_exit();
}
