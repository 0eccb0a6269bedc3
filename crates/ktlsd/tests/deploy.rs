//! Safe deploys: a reload retires connections opened before it (idle keep-alive
//! connections close at once, busy ones after their current response, with
//! `Connection: close` over HTTP/1.1 and GOAWAY over HTTP/2), so under load no
//! request fails and none sent after the reload is answered from the old root.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// A server whose configuration file names its root: `a/` (holding `which.txt` = "a")
/// until the file is rewritten to name `b/`.
fn two_roots_server() -> (Server, std::path::PathBuf) {
    let b = ServerBuilder::new(BIN).bin_from_env().no_root_arg().workers(Some(2));
    let dir = b.dir().to_path_buf();
    for (name, body) in [("a", "a"), ("b", "b")] {
        write_file(&dir.join(name).join("which.txt"), body.as_bytes());
    }
    let config = b.write_config(&root_config(&dir, "a"));
    let srv = b.arg("--config").arg(&config).start();
    (srv, config)
}

fn root_config(dir: &Path, root: &str) -> String {
    format!("root = {:?}\n", dir.join(root).display().to_string())
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n")
}

#[test]
fn a_reload_closes_idle_keep_alive_connections() {
    let (srv, config) = two_roots_server();
    let mut c = TlsClient::connect(srv.addr());
    c.send(get("/which.txt").as_bytes());
    let r = c.read_response();
    assert_eq!((r.status, r.body_str().as_str()), (200, "a"));
    assert_eq!(r.header("connection"), None, "keep-alive before the reload");

    std::fs::write(&config, root_config(srv.dir(), "b")).unwrap();
    assert!(reload(&srv, 1).contains("reloaded configuration"));
    // The idle connection is closed by the server (close_notify), not left on the old root.
    match c.poll_read(Duration::from_secs(5)) {
        Ok(Some(0)) | Err(_) => {}
        other => panic!("the idle keep-alive connection stayed open after the reload: {other:?}"),
    }
    let mut fresh = TlsClient::connect(srv.addr());
    fresh.send(get("/which.txt").as_bytes());
    assert_eq!(fresh.read_response().body_str(), "b");
}

#[test]
fn a_response_under_way_at_a_reload_finishes_then_its_connection_closes() {
    let (srv, config) = two_roots_server();
    let big = pattern(64 << 20, 7);
    write_file(&srv.dir().join("a/big.bin"), &big);
    let mut c = TlsClient::connect(srv.addr());
    c.set_recv_buffer(64 * 1024);
    c.send(get("/big.bin").as_bytes());
    // The response starts and stalls on the client's small window.
    assert!(matches!(c.poll_read(Duration::from_secs(5)), Ok(Some(n)) if n > 0));
    std::fs::write(&config, root_config(srv.dir(), "b")).unwrap();
    assert!(reload(&srv, 1).contains("reloaded configuration"));
    let r = c.read_response();
    assert_eq!(r.status, 200);
    assert_body("the response under way at the reload", &r.body, &big);
    // Its head left before the reload; the connection ends right after its body.
    match c.poll_read(Duration::from_secs(5)) {
        Ok(Some(0)) | Err(_) => {}
        other => panic!("the connection stayed open after its response under way at the reload: {other:?}"),
    }
}

#[test]
fn h2_connections_get_goaway_at_a_reload() {
    let (srv, config) = two_roots_server();
    // nghttp keeps its connection for the second request, sent after the reload.
    let script = format!(
        r#"
import socket, ssl, sys, time
import h2.connection, h2.config, h2.events
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(["h2"])
s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", {port})), server_hostname="localhost")
c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
c.initiate_connection(); s.sendall(c.data_to_send())
def req():
    sid = c.get_next_available_stream_id()
    c.send_headers(sid, [(":method","GET"),(":path","/which.txt"),(":scheme","https"),(":authority","localhost")], end_stream=True)
    s.sendall(c.data_to_send())
    body = b""
    while True:
        data = s.recv(65536)
        if not data: return "closed"
        for e in c.receive_data(data):
            if isinstance(e, h2.events.DataReceived): body += e.data
            if isinstance(e, h2.events.StreamEnded): return body.decode()
            if isinstance(e, h2.events.ConnectionTerminated): return "goaway"
        s.sendall(c.data_to_send())
print(req(), flush=True)
sys.stdin.readline()
s.settimeout(5)
# The frames themselves: h2 takes a GOAWAY for the end of the connection and refuses
# any frame after it, such as the PING of a graceful close (RFC 9113 section 6.8).
from hyperframe.frame import Frame, GoAwayFrame
try:
    got = "open"
    data = s.recv(65536)
    if not data: got = "closed"
    while len(data) >= 9:
        f, n = Frame.parse_frame_header(memoryview(data[:9]))
        if isinstance(f, GoAwayFrame): got = "goaway"
        data = data[9 + n:]
except socket.timeout:
    got = "open"
print(got, flush=True)
"#,
        port = srv.addr().port()
    );
    use std::io::{BufRead, BufReader, Write};
    let mut child = std::process::Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(&script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("/usr/bin/python3 with the h2 package (scripts/test installs python3-h2)");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "a");
    std::fs::write(&config, root_config(srv.dir(), "b")).unwrap();
    assert!(reload(&srv, 1).contains("reloaded configuration"));
    child.stdin.take().unwrap().write_all(b"\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "goaway", "an idle HTTP/2 connection at a reload gets GOAWAY");
    assert!(child.wait().unwrap().success());
}

/// One keep-alive client: reuses its connection while the server keeps it open and
/// sends a request again on a new one only when a reused connection was closed
/// before any byte of the answer (as browsers and curl do, RFC 9112 section 9.3.1).
fn client_loop(addr: SocketAddr, stop: &AtomicBool, reloaded_at: &Mutex<Option<Instant>>, tally: &Tally) {
    let mut conn: Option<TlsClient> = None;
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        let reused = conn.is_some();
        let c = conn.get_or_insert_with(|| TlsClient::connect(addr));
        let result = c.try_send(get("/which.txt").as_bytes()).and_then(|()| c.try_read_response(false));
        match result {
            Ok(r) => {
                assert_eq!(r.status, 200);
                tally.ok.fetch_add(1, Ordering::Relaxed);
                let after = reloaded_at.lock().unwrap().is_some_and(|t| sent > t);
                if after && r.body_str() != "b" {
                    tally.stale.fetch_add(1, Ordering::Relaxed);
                }
                if r.header("connection") == Some("close") {
                    conn = None;
                }
            }
            Err(_) if reused => conn = None,
            Err(e) => {
                tally.failed.fetch_add(1, Ordering::Relaxed);
                eprintln!("a request on a new connection failed: {e}");
                conn = None;
            }
        }
    }
}

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: AtomicU64,
    stale: AtomicU64,
}

#[test]
fn reload_under_keep_alive_load_fails_no_request_and_serves_no_old_root_after() {
    let (srv, config) = two_roots_server();
    let stop = Arc::new(AtomicBool::new(false));
    let reloaded_at = Arc::new(Mutex::new(None));
    let tally = Arc::new(Tally::default());
    let clients: Vec<_> = (0..6)
        .map(|_| {
            let (addr, stop, at, tally) = (srv.addr(), stop.clone(), reloaded_at.clone(), tally.clone());
            std::thread::spawn(move || client_loop(addr, &stop, &at, &tally))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(700));
    std::fs::write(&config, root_config(srv.dir(), "b")).unwrap();
    assert!(reload(&srv, 1).contains("reloaded configuration"));
    *reloaded_at.lock().unwrap() = Some(Instant::now());
    let before = tally.ok.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("a client thread panicked");
    }
    let (ok, failed, stale) =
        (tally.ok.load(Ordering::Relaxed), tally.failed.load(Ordering::Relaxed), tally.stale.load(Ordering::Relaxed));
    eprintln!("{ok} requests answered ({before} before the reload), {failed} failed, {stale} from the old root after");
    assert!(before > 50 && ok > before + 50, "too little load to tell: {before} then {ok}");
    assert_eq!(failed, 0, "failed requests");
    assert_eq!(stale, 0, "requests sent after the reload answered from the old root");
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

/// Started as root with `--user`, the state directory and the self-signed
/// certificate written there before the switch belong to that user, so a reload
/// after the switch reads them; the warning about the access log the user cannot
/// reopen names the file.
#[test]
fn reload_after_the_switch_reads_the_state_directory_and_names_the_access_log() {
    assert!(running_as_root(), "this test starts ktlsd as root with --user nobody");
    let b = ServerBuilder::new(BIN).bin_from_env().file("a.txt", "a\n").args(["--user", "nobody"]);
    chmod(b.dir(), 0o755);
    let state = b.state_dir_path();
    let srv = b.start();
    let meta = std::fs::metadata(&state).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 65534, "the state directory belongs to nobody");
    let line = reload(&srv, 1);
    assert!(line.contains("reloaded configuration"), "{line}\n{}", srv.stderr());
    let warning = srv.stderr().lines().find(|l| l.contains("keep going to the file already open")).map(String::from);
    let log = srv.access_log_path().display().to_string();
    assert!(warning.as_deref().is_some_and(|w| w.contains(&log)), "the warning names {log}: {warning:?}");
    srv.stop().assert_clean_exit();
}

/// A failed reload does not tell the service manager it succeeded: `READY=1` (the
/// previous configuration is still served) comes with `RELOAD_FAILED=1` and a
/// status line saying why; a later good reload clears it.
#[test]
fn a_failed_reload_is_reported_to_the_service_manager() {
    use std::os::unix::net::UnixDatagram;
    let b = ServerBuilder::new(BIN).bin_from_env().file("a.txt", "a\n");
    let notify = b.dir().join("notify");
    let sock = UnixDatagram::bind(&notify).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let config = b.write_config("idle_timeout = \"30s\"\n");
    let srv = b.arg("--config").arg(&config).env("NOTIFY_SOCKET", &notify).start();
    let recv = || {
        let mut buf = [0u8; 1024];
        let n = sock.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    assert_eq!(recv(), "READY=1");
    std::fs::write(&config, "idle_timeout = \"soon\"\n").unwrap();
    srv.signal(libc::SIGHUP);
    assert!(recv().starts_with("RELOADING=1"));
    let after = recv();
    assert!(after.contains("RELOAD_FAILED=1") && after.contains("STATUS=reload failed"), "{after:?}");
    assert!(after.contains("idle_timeout"), "the status says why: {after:?}");
    std::fs::write(&config, "idle_timeout = \"20s\"\n").unwrap();
    srv.signal(libc::SIGHUP);
    assert!(recv().starts_with("RELOADING=1"));
    assert_eq!(recv(), "READY=1\nSTATUS=serving; last reload succeeded");
    srv.stop().assert_clean_exit();
}

/// `ktlsd check` of the running configuration, as `ktlsd check … && systemctl
/// reload ktlsd` runs it: the ports held by the running server are not a conflict.
#[test]
fn check_passes_against_the_running_server_and_refuses_a_foreign_holder() {
    let b = ServerBuilder::new(BIN).bin_from_env().file("a.txt", "a\n");
    let root = b.root().to_path_buf();
    let srv = b.start();
    let addr = srv.addr().to_string();
    let mut cmd = std::process::Command::new(bin());
    cmd.arg("check").arg(&root).args(["--listen", &addr]).args(allow_root_args()).env_remove("KTLSD_LOG");
    let out = Exited::from(run_with_timeout(&mut cmd, None, Duration::from_secs(30)));
    assert_eq!((out.status.code(), out.stdout.as_str()), (Some(0), "configuration OK\n"), "{}", out.stderr);
    assert!(out.stderr.contains(&format!("held by the running ktlsd (pid {})", srv.pid())), "{}", out.stderr);

    let foreign = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = foreign.local_addr().unwrap().to_string();
    let mut cmd = std::process::Command::new(bin());
    cmd.arg("check").arg(&root).args(["--listen", &taken]).args(allow_root_args()).env_remove("KTLSD_LOG");
    let out = Exited::from(run_with_timeout(&mut cmd, None, Duration::from_secs(30)));
    out.assert_startup_error(&[&taken, "address already in use"]);
    srv.stop().assert_clean_exit();
}

/// `check --user` refuses a key the account cannot read (certbot's 0600), which
/// the first reload after the switch would fail on, and passes once it can.
#[test]
fn check_with_user_refuses_a_key_that_user_cannot_read() {
    assert!(running_as_root(), "this test checks --user nobody as root");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    chmod(d, 0o755);
    std::fs::create_dir(d.join("www")).unwrap();
    chmod(&d.join("www"), 0o755);
    let (cert, key) = make_cert(d, "site", "ec");
    chmod(&cert, 0o644);
    chmod(&key, 0o600);
    let run = || {
        let mut cmd = std::process::Command::new(bin());
        cmd.arg("check").arg(d.join("www")).args(["--listen", "127.0.0.1:0", "--user", "nobody"]);
        cmd.arg("--cert").arg(&cert).arg("--key").arg(&key).env_remove("KTLSD_LOG");
        Exited::from(run_with_timeout(&mut cmd, None, Duration::from_secs(30)))
    };
    let refused = run();
    let message = refused.assert_startup_error(&["nobody", "cannot read", "site.key", "mode 0600"]);
    assert!(!message.contains("site.crt"), "the readable certificate is not listed: {message}");
    chmod(&key, 0o640);
    std::os::unix::fs::chown(&key, None, Some(65534)).unwrap();
    let ok = run();
    assert_eq!((ok.status.code(), ok.stdout.as_str()), (Some(0), "configuration OK\n"), "{}", ok.stderr);
}

/// The binary under test (`KTLSD_BIN` when set).
fn bin() -> std::path::PathBuf {
    bin_from_env(BIN)
}

/// What a socket unit does for ktlsd.service, in a small Python holder: it binds
/// the HTTPS and the plain-HTTP sockets once and starts each generation of the
/// server with them (`LISTEN_FDS=2`, `LISTEN_FDNAMES=https:http`). An upgrade
/// starts the new generation on the same sockets, then stops the old one.
const HOLDER: &str = r#"
import os, socket, subprocess, sys, signal
def listener():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(511)
    return s
https, http = listener(), listener()
for want, s in ((3, https), (4, http)):
    if s.fileno() != want:
        os.dup2(s.fileno(), want)
    os.set_inheritable(want, True)
print(https.getsockname()[1], http.getsockname()[1], flush=True)
argv = sys.argv[1:]
def start():
    env = dict(os.environ, LISTEN_FDS="2", LISTEN_FDNAMES="https:http")
    env.pop("LISTEN_PID", None)
    p = subprocess.Popen(["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$@"', "sh"] + argv, pass_fds=(3, 4), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    ready = p.stdout.readline().decode().strip()
    print(ready, flush=True)
    return p
old = start()
for line in sys.stdin:
    if line.strip() == "upgrade":
        new = start()
        old.send_signal(signal.SIGTERM)
        print("old exited", old.wait(), flush=True)
        old = new
    else:
        break
old.send_signal(signal.SIGTERM)
print("exited", old.wait(), flush=True)
"#;

/// A binary upgrade on socket-activated listeners under load: the new server
/// starts on the sockets the manager holds, the old one stops, and no connection
/// is refused or fails meanwhile; the plain-HTTP socket (named `http`) is passed too.
#[test]
fn socket_activated_upgrade_under_load_refuses_no_connection() {
    use std::io::{BufRead, BufReader, Write};
    let dir = tempfile::tempdir().unwrap();
    write_file(&dir.path().join("www/a.txt"), b"served\n");
    let www = dir.path().join("www");
    let state = dir.path().join("state");
    let mut holder = std::process::Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(HOLDER)
        .arg(bin())
        .arg("serve")
        .arg(&www)
        .args(["--workers", "2", "--access-log", "off", "--state-dir"])
        .arg(&state)
        .args(allow_root_args())
        .env_remove("KTLSD_LOG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("/usr/bin/python3");
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    let mut stdin = holder.stdin.take().unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let ports: Vec<u16> = line.split_whitespace().map(|p| p.parse().unwrap()).collect();
    let (https, http): (SocketAddr, SocketAddr) =
        (format!("127.0.0.1:{}", ports[0]).parse().unwrap(), format!("127.0.0.1:{}", ports[1]).parse().unwrap());
    line.clear();
    out.read_line(&mut line).unwrap();
    let ready = Ready::parse(line.trim()).unwrap_or_else(|| panic!("no ready line: {line:?}"));
    assert_eq!((ready.https, ready.http), (vec![https], vec![http]), "both passed sockets in use");
    let redirect = curl(&["-sS", "-o", "/dev/null", "-w", "%{http_code}", &format!("http://{http}/a.txt")]);
    assert_eq!(String::from_utf8_lossy(&redirect.stdout), "301", "the passed port-80 socket redirects");

    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // A new connection each time: a refused or reset one would count.
                    let result =
                        TlsClient::connect_with(https, client_config(&[&rustls::version::TLS13])).and_then(|mut c| {
                            c.try_send(get("/a.txt").as_bytes())?;
                            c.try_read_response(false)
                        });
                    match result {
                        Ok(r) if r.status == 200 && r.body_str() == "served\n" => ok.fetch_add(1, Ordering::Relaxed),
                        Ok(r) => panic!("unexpected answer {}", r.status),
                        Err(e) => {
                            eprintln!("request failed: {e}");
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let before = ok.load(Ordering::Relaxed);
    writeln!(stdin, "upgrade").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    let second = Ready::parse(line.trim()).unwrap_or_else(|| panic!("no second ready line: {line:?}"));
    assert_ne!(second.pid, ready.pid);
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "old exited 0", "the old server stopped cleanly");
    let at_upgrade = ok.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("a client thread panicked");
    }
    writeln!(stdin, "stop").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "exited 0");
    let _ = holder.wait();
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!("{ok} requests on new connections ({before} before the upgrade, {at_upgrade} when the old one exited), {failed} failed");
    assert!(before > 20 && ok > at_upgrade + 20, "too little load to tell: {before}, {at_upgrade}, {ok}");
    assert_eq!(failed, 0, "connections refused or failed during the upgrade");
}
