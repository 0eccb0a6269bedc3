//! Running as a system service: dropping root for `--user` once the listeners are
//! bound and the keys read, refusing to serve as root otherwise, socket activation
//! under the real `systemd-socket-activate`, `READY=1`/`RELOADING=1`/`STOPPING=1`
//! on `NOTIFY_SOCKET`, and the unit files in dist/ passing `systemd-analyze verify`.

use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// nobody's uid and gid on Debian.
const NOBODY: u32 = 65534;

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

/// The `Uid:`/`Gid:` lines of every thread of `pid`: (thread id, uid fields, gid fields).
fn thread_ids(pid: i32) -> Vec<(String, Vec<u32>, Vec<u32>)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("read /proc/PID/task") {
        let task = task.expect("task entry");
        let status = std::fs::read_to_string(task.path().join("status")).expect("task status");
        let field = |name: &str| -> Vec<u32> {
            let line = status.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in {status}"));
            line[name.len()..].split_whitespace().map(|n| n.parse().expect("id")).collect()
        };
        out.push((task.file_name().to_string_lossy().into_owned(), field("Uid:"), field("Gid:")));
    }
    out
}

fn status_of(server: &Server, path: &str) -> u16 {
    let r = fetch(&server.url(path), &[]);
    r.status
}

// ---------------------------------------------------------------------------
// Privileges.
// ---------------------------------------------------------------------------

/// As root with `--user nobody`: every thread runs as nobody (root cannot be
/// regained: setuid(0) is checked at start-up), so a 0600 root-owned file under
/// ROOT is refused with 403 while a world-readable one is served.
#[test]
fn user_drops_every_thread_and_root_only_files_are_refused() {
    let b = ServerBuilder::new(BIN)
        .file("public.txt", "for everyone\n")
        .file("secret.txt", "root only\n")
        .workers(Some(2))
        .args(["--user", "nobody"]);
    chmod(&b.root().join("public.txt"), 0o644);
    chmod(&b.root().join("secret.txt"), 0o600);
    if !running_as_root() {
        // Only root can change user: the same command line is refused with one line.
        b.run_to_exit().assert_startup_error(&["cannot switch to user \"nobody\"", "only root"]);
        return;
    }
    let server = b.start();
    assert!(server.stderr().contains("running as user nobody (uid 65534, gid 65534)"), "{}", server.stderr());
    // The workers start right after the `serving` line.
    let mut threads = thread_ids(server.pid());
    for _ in 0..100 {
        if threads.len() >= 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        threads = thread_ids(server.pid());
    }
    assert!(threads.len() >= 3, "expected the main thread and 2 workers: {threads:?}");
    for (tid, uid, gid) in &threads {
        assert_eq!(uid, &[NOBODY; 4], "thread {tid} uid (real, effective, saved, fs)");
        assert_eq!(gid, &[NOBODY; 4], "thread {tid} gid (real, effective, saved, fs)");
    }
    let groups = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let groups = groups.lines().find(|l| l.starts_with("Groups:")).unwrap().to_string();
    assert!(!groups.split_whitespace().any(|g| g == "0"), "root's group kept: {groups}");

    let r = fetch(&server.url("/public.txt"), &[]);
    assert_eq!((r.status, r.body_str().as_str()), (200, "for everyone\n"));
    assert_eq!(status_of(&server, "/secret.txt"), 403);
    server.stop().assert_clean_exit();
}

/// The same from the configuration file's `user`/`group` keys.
#[test]
fn user_and_group_from_the_config_file() {
    let b = ServerBuilder::new(BIN).file("a.txt", "a\n").no_allow_root();
    let b = b.config("user = \"nobody\"\ngroup = \"nogroup\"\n");
    if !running_as_root() {
        b.run_to_exit().assert_startup_error(&["only root"]);
        return;
    }
    let server = b.start();
    for (tid, uid, gid) in thread_ids(server.pid()) {
        assert_eq!((uid, gid), (vec![NOBODY; 4], vec![NOBODY; 4]), "thread {tid}");
    }
    assert_eq!(status_of(&server, "/a.txt"), 200);
    server.stop().assert_clean_exit();
}

/// Started as root with neither `--user` nor `--allow-root`: refused with one line
/// (by `serve` and by `check`); with `--allow-root` it serves, with a warning.
#[test]
fn root_without_user_is_refused_unless_allowed() {
    if !running_as_root() {
        // Not root: nothing to refuse, and no warning.
        let server = ServerBuilder::new(BIN).no_allow_root().start();
        assert!(!server.stderr().contains("running as root"), "{}", server.stderr());
        return;
    }
    let line = ServerBuilder::new(BIN).no_allow_root().run_to_exit().assert_startup_error(&[
        "refusing to serve as root",
        "--user",
        "--allow-root",
    ]);
    assert!(!line.contains('\n'));

    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["check", "--listen", "127.0.0.1:0"]).arg(dir.path()).env_remove("KTLSD_LOG");
    Exited::from(run_with_timeout(&mut cmd, None, Duration::from_secs(30)))
        .assert_startup_error(&["refusing to serve as root"]);

    let server = ServerBuilder::new(BIN).file("a.txt", "a\n").start(); // the harness passes --allow-root
    assert!(server.stderr().contains("running as root (--allow-root)"), "{}", server.stderr());
    assert_eq!(status_of(&server, "/a.txt"), 200);
    server.stop().assert_clean_exit();
}

/// Unknown accounts and a group without a user stop start-up and `check` with one line.
#[test]
fn bad_user_or_group_is_refused_at_start_up() {
    for (args, needles) in [
        (&["--user", "no-such-user-ktlsd"][..], &["user \"no-such-user-ktlsd\" does not exist"][..]),
        (
            &["--user", "nobody", "--group", "no-such-group-ktlsd"][..],
            &["group \"no-such-group-ktlsd\" does not exist"][..],
        ),
        (&["--group", "nogroup"][..], &["group was given without user"][..]),
    ] {
        ServerBuilder::new(BIN).args(args).run_to_exit().assert_startup_error(needles);
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(BIN);
        cmd.args(["check", "--listen", "127.0.0.1:0"]).args(args).arg(dir.path()).env_remove("KTLSD_LOG");
        Exited::from(run_with_timeout(&mut cmd, None, Duration::from_secs(30))).assert_startup_error(needles);
    }
}

/// After dropping to nobody, SIGHUP reloads a key nobody can read; a key it cannot
/// read leaves the running one in place with one line saying why. The access log
/// at an unchanged path (not reopenable by nobody) stays in use.
#[test]
fn reload_after_dropping_privileges() {
    if !running_as_root() {
        ServerBuilder::new(BIN).args(["--user", "nobody"]).run_to_exit().assert_startup_error(&["only root"]);
        return;
    }
    let b = ServerBuilder::new(BIN).file("a.txt", "a\n").args(["--user", "nobody"]);
    let (cert, key) = make_cert(b.dir(), "first", "ec");
    chmod(b.dir(), 0o755);
    chmod(&cert, 0o644);
    chmod(&key, 0o644);
    let server = b.arg("--cert").arg(&cert).arg("--key").arg(&key).start();
    assert_eq!(status_of(&server, "/a.txt"), 200);

    server.signal(libc::SIGHUP);
    let ok = server.wait_stderr("reloaded configuration", Duration::from_secs(30));
    assert!(ok.is_some(), "no reload line:\n{}", server.stderr());
    assert!(server.stderr().contains("keep going to the file already open"), "{}", server.stderr());
    assert_eq!(status_of(&server, "/a.txt"), 200);

    chmod(&key, 0o600);
    server.signal(libc::SIGHUP);
    let failed =
        server.wait_stderr("reload failed", Duration::from_secs(30)).unwrap_or_else(|| panic!("{}", server.stderr()));
    assert!(failed.contains("runs as user nobody") && failed.contains("readable by it"), "{failed}");
    assert_eq!(status_of(&server, "/a.txt"), 200);
    let log = server.wait_access_log(3, Duration::from_secs(10));
    assert_eq!(log.len(), 3, "every request logged to the file opened at start-up: {log:?}");
    server.stop().assert_clean_exit();
}

// ---------------------------------------------------------------------------
// systemd.
// ---------------------------------------------------------------------------

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Under the real `systemd-socket-activate`, ktlsd serves on the passed sockets
/// (shared by both workers) and ignores `--listen`.
#[test]
fn socket_activation_serves_on_the_passed_sockets() {
    let (p1, p2) = (free_port(), free_port());
    let a1: SocketAddr = format!("127.0.0.1:{p1}").parse().unwrap();
    let a2: SocketAddr = format!("127.0.0.1:{p2}").parse().unwrap();
    // systemd-socket-activate starts the server on the first connection, which
    // then waits in the passed socket's queue and must be served.
    let first = std::thread::spawn(move || {
        // Connection refused (curl exit 7) until systemd-socket-activate listens.
        for _ in 0..300 {
            let out = curl(&["-o", "-", "-w", " %{http_code}", &url_for(a1, "/a.txt")]);
            if out.status.code() != Some(7) {
                return String::from_utf8_lossy(&out.stdout).into_owned();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("no connection to {a1}");
    });
    let server = ServerBuilder::new(BIN)
        .file("a.txt", "activated\n")
        .workers(Some(2))
        .wrapper(["systemd-socket-activate", "-l", &a1.to_string(), "-l", &a2.to_string()])
        .start();
    assert_eq!(first.join().expect("first request"), "activated\n 200");
    let stderr = server.stderr();
    assert_eq!(server.addrs(), &[a1, a2], "{stderr}");
    assert!(
        stderr.contains("socket activation: using the 2 socket(s)")
            && stderr.contains("listen (127.0.0.1:0) is ignored"),
        "{stderr}"
    );
    for addr in [a1, a2, a1, a2, a1, a2] {
        let r = fetch(&url_for(addr, "/a.txt"), &[]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "activated\n"), "{addr}");
    }
    assert_eq!(server.wait_access_log(7, Duration::from_secs(10)).len(), 7);
    let stopped = server.stop();
    stopped.assert_clean_exit();
    assert_eq!(stopped.stat("connections"), 7, "{}", stopped.stderr);
}

fn recv(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).expect("a notification within the timeout");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// `READY=1` once serving, `RELOADING=1` (with `MONOTONIC_USEC=`) then `READY=1`
/// around a reload, `STOPPING=1` on SIGTERM, on a path or an abstract socket.
#[test]
fn notify_socket_gets_ready_reloading_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("notify");
    let abstract_name = format!("ktlsd-test-notify-{}", std::process::id());
    for (listen, env) in [
        (path.to_string_lossy().into_owned(), path.to_string_lossy().into_owned()),
        (String::new(), format!("@{abstract_name}")),
    ] {
        let sock = if listen.is_empty() {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap();
            UnixDatagram::bind_addr(&addr).unwrap()
        } else {
            UnixDatagram::bind(&listen).unwrap()
        };
        sock.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let server = ServerBuilder::new(BIN).env("NOTIFY_SOCKET", &env).start();
        assert_eq!(recv(&sock), "READY=1", "{env}");
        server.signal(libc::SIGHUP);
        let reloading = recv(&sock);
        assert!(reloading.starts_with("RELOADING=1\nMONOTONIC_USEC="), "{reloading:?}");
        assert!(reloading["RELOADING=1\nMONOTONIC_USEC=".len()..].parse::<u64>().is_ok(), "{reloading:?}");
        assert_eq!(recv(&sock), "READY=1\nSTATUS=serving; last reload succeeded");
        assert!(server.wait_stderr("reloaded configuration", Duration::from_secs(10)).is_some(), "{}", server.stderr());
        let stopped = server.stop();
        stopped.assert_clean_exit();
        assert_eq!(recv(&sock), "STOPPING=1");
    }
}

/// dist/ktlsd.service, dist/ktlsd.socket and dist/ktlsd-http.socket pass `systemd-analyze verify` with no
/// warning (ExecStart pointed at the built binary).
#[test]
fn unit_files_verify_cleanly() {
    let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist");
    let dir = tempfile::tempdir().unwrap();
    for unit in ["ktlsd.service", "ktlsd.socket", "ktlsd-http.socket"] {
        let text = std::fs::read_to_string(dist.join(unit)).unwrap_or_else(|e| panic!("{unit}: {e}"));
        std::fs::write(dir.path().join(unit), text.replace("/usr/local/bin/ktlsd", BIN)).unwrap();
    }
    let service = std::fs::read_to_string(dist.join("ktlsd.service")).unwrap();
    for line in [
        "Type=notify",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "LimitNOFILE=65536",
        "--user ",
    ] {
        assert!(service.contains(line), "ktlsd.service lacks {line:?}");
    }
    let out = run_with_timeout(
        Command::new("systemd-analyze")
            .args(["verify", "--man=no", "./ktlsd.socket", "./ktlsd-http.socket", "./ktlsd.service"])
            .current_dir(dir.path()),
        None,
        Duration::from_secs(60),
    );
    let out = Exited::from(out);
    assert!(out.status.success() && out.stderr.trim().is_empty() && out.stdout.trim().is_empty(), "{out:?}");
}

/// `ktlsd check` run while the service manager holds the port for a
/// socket-activated ktlsd (here the real `systemd-socket-activate`, waiting for
/// its first connection) passes and says who holds it; `serve` would receive
/// that socket.
#[test]
fn check_accepts_a_port_held_for_socket_activation() {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut manager = Command::new("systemd-socket-activate")
        .args(["-l", &addr.to_string(), "/bin/true"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("systemd-socket-activate");
    // Listening once the port refuses a second bind.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while TcpListener::bind(addr).is_ok() {
        assert!(std::time::Instant::now() < deadline, "systemd-socket-activate never listened on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("www")).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["check", "www", "--listen", &addr.to_string()]).current_dir(dir.path()).env_remove("KTLSD_LOG");
    if running_as_root() {
        cmd.arg("--allow-root");
    }
    let out = Exited::from(run_with_timeout(&mut cmd, None, Duration::from_secs(30)));
    let _ = manager.kill();
    let _ = manager.wait();
    assert_eq!((out.status.code(), out.stdout.as_str()), (Some(0), "configuration OK\n"), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!("{addr} is held by systemd-socket-")) && out.stderr.contains("socket activation"),
        "{}",
        out.stderr
    );
}
