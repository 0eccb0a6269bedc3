//! ktlsd as members of a fleet: state shared through a real 3-member etcd cluster,
//! and a real HAProxy in front.
//!
//! Session tickets: three members with one `[cluster]` (the same `secret_file`); a
//! TLS 1.3 ticket from one (openssl `-sess_out`) resumes on the others (`-sess_in`),
//! and still does across rotations (`ticket_rotation` shortened), with the etcd
//! leader killed, and with all of etcd stopped: members serve on, a member restarted
//! while etcd is down resumes with its local copy of the keys, and on etcd's return
//! they converge. Garbage at the keys' record is logged and replaced, a lock without
//! a lease (no member's) removed; a member with
//! another secret logs the record as unusable and neither uses nor overwrites it.
//!
//! QUIC: with Retry for every client, a relay hands an aioquic client's packets to
//! one member until that member's Retry, then to another: the token validates there,
//! and the handshake completes on the second member.
//!
//! `ktlsd doctor --config`: the store up and down, the shared ticket record absent,
//! opening, or not opening with another secret, the saved copy.
//!
//! Draining for the balancer: two members behind HAProxy in TCP mode, which checks
//! each member's `/healthz` on its admin listener. `ktlsd drain` takes a member out
//! of rotation (its `/healthz` answers 503, HAProxy sends every new connection to
//! the other) while it still serves whoever reaches it; `ktlsd drain --undo` puts
//! it back.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::etcd::Etcd;
use testkit::haproxy::Haproxy;
use testkit::origin::free_port;
use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// A member whose `/who.txt` says `name`, with an admin listener.
fn member(name: &str) -> (Server, SocketAddr) {
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let srv = Server::builder(BIN).file("who.txt", name).config(&format!("admin = \"{admin}\"\n")).start();
    (srv, admin)
}

/// `ktlsd drain --admin ADDR [--undo]`: its exit status and output.
fn drain(admin: SocketAddr, undo: bool) -> (bool, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(["drain", "--admin", &admin.to_string()]);
    if undo {
        cmd.arg("--undo");
    }
    let out = run_with_timeout(&mut cmd, None, CLIENT_TIMEOUT);
    (out.status.success(), String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Which member answered each of `n` new connections through the balancer.
fn spread(port: u16, n: usize) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        let (status, body) = status_and_body(&format!("https://127.0.0.1:{port}/who.txt"));
        assert_eq!(status, 200, "through the balancer");
        *seen.entry(body).or_insert(0) += 1;
    }
    seen
}

/// Waits until `n` connections through the balancer all reach the members of `want`.
fn wait_spread(port: u16, want: &[&str]) -> BTreeMap<String, usize> {
    let t = Instant::now();
    loop {
        let seen = spread(port, 6);
        if seen.keys().map(String::as_str).eq(want.iter().copied()) || t.elapsed() > Duration::from_secs(15) {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_drained_member_leaves_the_balancer_and_still_serves() {
    let (a, a_admin) = member("a");
    let (b, b_admin) = member("b");
    let port = free_port();
    let check = |admin: SocketAddr| format!("check port {} inter 200ms fall 1 rise 1", admin.port());
    let lb = Haproxy::start(
        "tcp",
        &format!(
            "frontend f\n  bind 127.0.0.1:{port}\n  default_backend members\nbackend members\n  balance roundrobin\n  option httpchk GET /healthz\n  server a {} {}\n  server b {} {}\n",
            a.addr(),
            check(a_admin),
            b.addr(),
            check(b_admin)
        ),
        vec![port],
    );
    assert_eq!(wait_spread(lb.ports[0], &["a", "b"]).len(), 2, "both members in rotation");

    let (ok, said) = drain(a_admin, false);
    assert!(ok && said == "draining", "ktlsd drain: {said}");
    let health = status_and_body(&format!("http://{a_admin}/healthz"));
    assert_eq!(health, (503, "draining\n".to_string()));
    let seen = wait_spread(lb.ports[0], &["b"]);
    assert_eq!(seen.keys().collect::<Vec<_>>(), ["b"], "a drained member gets no new connection: {seen:?}");
    // Still serving whoever reaches it, and saying so in the status document.
    assert_eq!(status_and_body(&a.url("/who.txt")), (200, "a".to_string()));
    let (_, doc) = status_and_body(&format!("http://{a_admin}/status.json"));
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(doc["draining"], true);
    assert!(a.stderr().contains("member drained"), "the drain is logged");
    // A browser's drain from another origin is refused.
    let (status, _) = {
        let mut cmd = Command::new("curl");
        cmd.args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-H", "Origin: http://evil.test"])
            .arg(format!("http://{b_admin}/drain"));
        let out = run_with_timeout(&mut cmd, None, CLIENT_TIMEOUT);
        (String::from_utf8_lossy(&out.stdout).to_string(), ())
    };
    assert_eq!(status, "403");
    assert_eq!(status_and_body(&format!("http://{b_admin}/healthz")).0, 200);

    let (ok, said) = drain(a_admin, true);
    assert!(ok && said == "serving", "ktlsd drain --undo: {said}");
    assert_eq!(status_and_body(&format!("http://{a_admin}/healthz")).0, 200);
    assert_eq!(wait_spread(lb.ports[0], &["a", "b"]).len(), 2, "back in rotation");
    drop(lb);
    drop(b);
}

#[test]
fn drain_without_a_server_says_why() {
    let (ok, _) = drain(format!("127.0.0.1:{}", free_port()).parse().unwrap(), false);
    assert!(!ok);
}

const REQUEST: &str = "GET /who.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

/// A fleet member: `[cluster]` on `etcd` under `prefix`, with `secret`, and an admin listener.
fn fleet_member(
    name: &str,
    etcd: &Etcd,
    prefix: &str,
    secret: &std::path::Path,
    state: Option<&std::path::Path>,
) -> (Server, SocketAddr) {
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut b = Server::builder(BIN).file("who.txt", name);
    if let Some(dir) = state {
        b = b.no_state_dir().arg("--state-dir").arg(dir);
    }
    let srv = b
        .config(&format!(
            "admin = \"{admin}\"\n[cluster]\netcd = {}\nname = \"{name}\"\nsecret_file = \"{}\"\nprefix = \"{prefix}\"\nticket_rotation = \"3s\"\n",
            etcd.toml_endpoints(),
            secret.display()
        ))
        .start();
    (srv, admin)
}

/// A metric's value from the admin listener's /metrics.
fn metric(admin: SocketAddr, name: &str) -> Option<f64> {
    let (_, text) = status_and_body(&format!("http://{admin}/metrics"));
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Waits until `admin`'s metric `name` satisfies `ok`.
fn wait_metric(admin: SocketAddr, name: &str, ok: impl Fn(f64) -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        if metric(admin, name).is_some_and(&ok) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// A new TLS 1.3 session with `srv`, saved in `file`.
fn new_session(srv: &Server, file: &std::path::Path) {
    let f = file.to_string_lossy();
    let (ok, out, err) = s_client(srv.addr(), &["-tls1_3", "-sess_out", &f], REQUEST);
    assert!(ok && out.contains("New, TLSv1.3"), "{out}\n{err}");
    assert!(std::fs::metadata(file).map(|m| m.len() > 0).unwrap_or(false), "no ticket saved:\n{out}");
}

/// Whether the session in `file` resumes on `srv` (a few tries: keys travel by watch).
fn resumes(srv: &Server, file: &std::path::Path) -> bool {
    let f = file.to_string_lossy();
    for _ in 0..20 {
        let (ok, out, _) = s_client(srv.addr(), &["-tls1_3", "-sess_in", &f], REQUEST);
        if ok && out.contains("Reused, TLSv1.3") {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

fn secret_file(dir: &std::path::Path, name: &str, byte: u8) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, [byte; 32]).unwrap();
    path
}

#[test]
fn a_ticket_from_one_member_resumes_on_every_other_through_rotations_and_etcd_failures() {
    let mut etcd = Etcd::start(3);
    let tmp = tempfile::tempdir().unwrap();
    let secret = secret_file(tmp.path(), "cluster.key", 7);
    let state_a = tmp.path().join("state-a");
    let (a, a_admin) = fleet_member("a", &etcd, "/t1", &secret, Some(&state_a));
    let (b, b_admin) = fleet_member("b", &etcd, "/t1", &secret, None);
    let (c, c_admin) = fleet_member("c", &etcd, "/t1", &secret, None);
    for admin in [a_admin, b_admin, c_admin] {
        assert!(wait_metric(admin, "ktlsd_cluster_store_up", |v| v == 1.0), "store up on {admin}");
        assert!(wait_metric(admin, "ktlsd_cluster_ticket_keys", |v| v >= 1.0), "keys on {admin}");
    }
    let (_, doc) = status_and_body(&format!("http://{b_admin}/status.json"));
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(doc["cluster"]["member"], "b");
    assert_eq!(doc["cluster"]["store_up"], true);
    let ticket = tmp.path().join("a.pem");
    new_session(&a, &ticket);
    assert!(resumes(&b, &ticket), "a ticket from a resumes on b");
    assert!(resumes(&c, &ticket), "a ticket from a resumes on c");

    // Rotations (every 3 s): a ticket from before still opens, one from after does too.
    let rotations = |admins: &[SocketAddr]| -> f64 {
        admins.iter().filter_map(|&a| metric(a, "ktlsd_cluster_ticket_rotations_total")).sum()
    };
    let before = rotations(&[a_admin, b_admin, c_admin]);
    let t = Instant::now();
    while rotations(&[a_admin, b_admin, c_admin]) < before + 2.0 {
        assert!(t.elapsed() < Duration::from_secs(30), "no rotation");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(resumes(&c, &ticket), "a ticket from before two rotations still resumes");
    let fresh = tmp.path().join("b.pem");
    new_session(&b, &fresh);
    assert!(resumes(&a, &fresh) && resumes(&c, &fresh), "a ticket from after the rotations resumes everywhere");
    let record = etcd.get("/t1/tickets").expect("the keys' record");
    assert!(record.starts_with(b"ktlsd-sealed-1\n"), "sealed in etcd");

    // The leader killed: two of three carry on, and so does the fleet.
    let leader = etcd.leader();
    etcd.kill(leader);
    let after_leader = tmp.path().join("c.pem");
    new_session(&c, &after_leader);
    assert!(resumes(&a, &after_leader), "resumption with the etcd leader killed");

    // All of etcd stopped: members serve on and say the store is down.
    etcd.kill_all();
    for admin in [a_admin, b_admin, c_admin] {
        assert!(wait_metric(admin, "ktlsd_cluster_store_up", |v| v == 0.0), "store down seen on {admin}");
    }
    assert!(b.stderr().contains("cluster: the store is down"), "{}", b.stderr());
    let (_, doc) = status_and_body(&format!("http://{b_admin}/status.json"));
    assert_eq!(serde_json::from_str::<serde_json::Value>(&doc).unwrap()["cluster"]["store_up"], false);
    assert_eq!(status_and_body(&b.url("/who.txt")), (200, "b".to_string()));
    let during = tmp.path().join("during.pem");
    new_session(&b, &during);
    assert!(resumes(&c, &during), "the keys in use stay in use without etcd");
    // A member restarted while etcd is down starts from its local copy.
    drop(a);
    let (a, a_admin) = fleet_member("a", &etcd, "/t1", &secret, Some(&state_a));
    assert!(
        a.stderr().contains("starting with the")
            || a.wait_stderr("starting with the", Duration::from_secs(5)).is_some()
    );
    assert!(resumes(&a, &during), "a restarted member resumes the fleet's tickets from its local copy");

    // etcd back: every member follows it again, and rotations reach everyone.
    etcd.restart_all();
    for admin in [a_admin, b_admin, c_admin] {
        assert!(wait_metric(admin, "ktlsd_cluster_store_up", |v| v == 1.0), "store back on {admin}");
    }
    let before = rotations(&[a_admin, b_admin, c_admin]);
    let t = Instant::now();
    while rotations(&[a_admin, b_admin, c_admin]) < before + 1.0 {
        assert!(t.elapsed() < Duration::from_secs(30), "no rotation after etcd's return");
        std::thread::sleep(Duration::from_millis(200));
    }
    let converged = tmp.path().join("converged.pem");
    new_session(&c, &converged);
    assert!(resumes(&a, &converged) && resumes(&b, &converged), "converged after etcd's return");
    drop((b, c));
}

#[test]
fn garbage_and_foreign_records_in_etcd_are_never_used() {
    let etcd = Etcd::start(3);
    let tmp = tempfile::tempdir().unwrap();
    let secret = secret_file(tmp.path(), "cluster.key", 9);
    etcd.put("/t2/tickets", b"garbage");
    // A lock without a lease (no member's): it would never expire.
    etcd.put("/t2/tickets.lock", b"foreign");
    let (a, a_admin) = fleet_member("a", &etcd, "/t2", &secret, None);
    let (b, _) = fleet_member("b", &etcd, "/t2", &secret, None);
    assert!(wait_metric(a_admin, "ktlsd_cluster_ticket_keys", |v| v >= 1.0), "keys replace the garbage");
    let record = etcd.get("/t2/tickets").unwrap();
    assert!(record.starts_with(b"ktlsd-sealed-1\n"), "the garbage was replaced");
    let logs = format!("{}{}", a.stderr(), b.stderr());
    assert!(logs.contains("are unusable (not a sealed record); they are replaced"), "{logs}");
    assert!(logs.contains("the lock /t2/tickets.lock had no lease"), "{logs}");
    let ticket = tmp.path().join("a.pem");
    new_session(&a, &ticket);
    assert!(resumes(&b, &ticket));

    // A member with another secret: the record does not open, is logged, and stays.
    let other = secret_file(tmp.path(), "other.key", 10);
    let (stranger, _) = fleet_member("stranger", &etcd, "/t2", &other, None);
    let said = stranger.wait_stderr("are unusable", Duration::from_secs(20)).unwrap_or_default();
    assert!(said.contains("does not open with this member's secret_file"), "{said}");
    assert!(!resumes(&stranger, &ticket), "the stranger cannot open the fleet's tickets");
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        !stranger.stderr().contains("rotated the session-ticket key"),
        "the stranger never rotates the fleet's keys"
    );
    let later = tmp.path().join("b.pem");
    new_session(&b, &later);
    assert!(resumes(&a, &later), "the fleet is unaffected");
}

/// `ktlsd doctor --json --config FILE` for a `[cluster]` under `prefix` on `etcd`
/// (endpoints as TOML) with `secret` and `state`: its report and exit status.
fn doctor(
    dir: &std::path::Path,
    etcd: &str,
    prefix: &str,
    secret: &std::path::Path,
    state: &std::path::Path,
) -> (serde_json::Value, Option<i32>) {
    let config = dir.join("doctor.toml");
    let text = format!(
        "state_dir = \"{}\"\n[cluster]\netcd = {etcd}\nname = \"doctor\"\nsecret_file = \"{}\"\nprefix = \"{prefix}\"\n",
        state.display(),
        secret.display()
    );
    std::fs::write(&config, text).unwrap();
    let out = Command::new(BIN).args(["doctor", "--json", "--config"]).arg(&config).output().unwrap();
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    (report, out.status.code())
}

/// `ktlsd doctor --config` tells an operator what a member would find of its fleet:
/// the store up or down, the shared ticket record absent, opening with this
/// member's secret or not (another secret), and the saved copy; its exit status
/// stays kTLS's verdict (a member serves on without its store).
#[test]
fn doctor_reports_the_fleet_a_member_would_find() {
    let etcd = Etcd::start(1);
    let tmp = tempfile::tempdir().unwrap();
    let secret = secret_file(tmp.path(), "cluster.key", 11);
    let state = tmp.path().join("state-a");
    std::fs::create_dir_all(&state).unwrap();
    let bare = Command::new(BIN).args(["doctor", "--json"]).output().unwrap().status.code();
    let endpoints = etcd.toml_endpoints();

    let (v, code) = doctor(tmp.path(), &endpoints, "/t3", &secret, &state);
    let c = &v["cluster"];
    assert_eq!((c["store_up"].as_bool(), c["tickets"]["state"].as_str()), (Some(true), Some("absent")), "{v}");
    assert!(c["saved_keys"].is_null(), "{v}");
    assert_eq!(code, bare, "the fleet leaves the exit status alone");

    let (a, a_admin) = fleet_member("a", &etcd, "/t3", &secret, Some(&state));
    assert!(wait_metric(a_admin, "ktlsd_cluster_ticket_keys", |v| v >= 1.0));
    let (v, _) = doctor(tmp.path(), &endpoints, "/t3", &secret, &state);
    let c = &v["cluster"];
    assert_eq!(c["tickets"]["state"].as_str(), Some("opens"), "{v}");
    assert!(c["tickets"]["keys"].as_u64() >= Some(1), "{v}");
    assert!(c["saved_keys"].as_u64() >= Some(1), "the member's saved copy: {v}");
    assert!(!v["advice"].to_string().contains("cluster:"), "{v}");

    // Another secret: the record does not open, and the advice says what to do.
    let other = secret_file(tmp.path(), "other.key", 12);
    let (v, _) = doctor(tmp.path(), &endpoints, "/t3", &other, &state);
    assert_eq!(v["cluster"]["tickets"]["state"].as_str(), Some("unusable"), "{v}");
    assert!(v["advice"].to_string().contains("give every member the same secret_file"), "{v}");

    // No store: said within the call bound, the exit status unchanged.
    let dead = format!("[\"http://127.0.0.1:{}\"]", free_port());
    let started = Instant::now();
    let (v, code) = doctor(tmp.path(), &dead, "/t3", &secret, &state);
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    let c = &v["cluster"];
    assert_eq!(c["store_up"].as_bool(), Some(false), "{v}");
    assert!(c["store_error"].is_string(), "{v}");
    assert!(v["advice"].to_string().contains("did not answer"), "{v}");
    assert_eq!(code, bare);
    drop(a);
}

/// A UDP relay for one client: its packets go to `first` until `first` sends a
/// QUIC Retry, then to `second`; the answers come back from the relay's port.
fn retry_relay(first: SocketAddr, second: SocketAddr) -> (u16, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::net::UdpSocket;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let front = UdpSocket::bind("127.0.0.1:0").unwrap();
    let back = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = front.local_addr().unwrap().port();
    let retried = Arc::new(AtomicBool::new(false));
    let client: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
    {
        let (front, back, retried, client) =
            (front.try_clone().unwrap(), back.try_clone().unwrap(), retried.clone(), client.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while let Ok((n, from)) = front.recv_from(&mut buf) {
                *client.lock().unwrap() = Some(from);
                let to = if retried.load(Ordering::SeqCst) { second } else { first };
                let _ = back.send_to(&buf[..n], to);
            }
        });
    }
    {
        let retried = retried.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while let Ok((n, from)) = back.recv_from(&mut buf) {
                // A long header (0x80) of type Retry (0x30), QUIC version 1.
                if from == first && n > 5 && buf[0] & 0xb0 == 0xb0 && buf[1..5] == [0, 0, 0, 1] {
                    retried.store(true, Ordering::SeqCst);
                }
                let to = *client.lock().unwrap();
                if let Some(to) = to {
                    let _ = front.send_to(&buf[..n], to);
                }
            }
        });
    }
    (port, retried)
}

#[test]
fn a_quic_retry_token_from_one_member_validates_on_another() {
    let etcd = Etcd::start(1);
    let tmp = tempfile::tempdir().unwrap();
    let secret = secret_file(tmp.path(), "cluster.key", 11);
    let h3_member = |name: &str| {
        Server::builder(BIN)
            .file("who.txt", name)
            .args(["--http3", "--quic-retry", "always"])
            .config(&format!(
                "[cluster]\netcd = {}\nname = \"{name}\"\nsecret_file = \"{}\"\nprefix = \"/t3\"\n",
                etcd.toml_endpoints(),
                secret.display()
            ))
            .start()
    };
    let (a, b) = (h3_member("a"), h3_member("b"));
    let (port, retried) = retry_relay(a.addr(), b.addr());
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h3/client.py");
    let out = run_with_timeout(
        Command::new("/usr/bin/python3").arg(&script).args([
            "127.0.0.1",
            &port.to_string(),
            "requests",
            r#"[{"path": "/who.txt"}]"#,
        ]),
        None,
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(retried.load(std::sync::atomic::Ordering::SeqCst), "member a sent a Retry");
    assert_eq!(v["retried"], true);
    assert_eq!(v["responses"][0]["status"], 200);
    assert_eq!(v["responses"][0]["len"], 1);
    let log = b.wait_access_log(1, Duration::from_secs(5));
    assert!(log.iter().any(|l| l.contains("/who.txt")), "member b served the request: {log:?}");
    assert!(a.access_log().is_empty(), "member a only sent the Retry");
}
