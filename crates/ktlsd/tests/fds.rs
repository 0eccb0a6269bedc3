//! The file descriptor budget end to end: the real binary run under a low
//! `RLIMIT_NOFILE` (`prlimit --nofile=256:256`, one worker) in front of the Python
//! origin (`tests/proxy/origin.py`), caching what it proxies. Cache entry files,
//! upstream connections, open-file cache entries and client connections share one
//! budget: 300 distinct cache hits in a row are all hits (held entry files are
//! released under pressure, and an entry is never dropped from the index for want
//! of a descriptor), static files never get a 5xx, connections beyond the budget
//! are refused at once (none is left hanging in the listen backlog), and the server
//! serves normally within a second of the burst. Each phase's figures go to stderr.
//!
//! The in-process accounting is tested in `fds` (the ledger) and `server::fd_budget`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// The descriptor limit the server runs under (soft and hard: it cannot raise it).
const LIMIT: u32 = 256;
/// Distinct cached entries, more than the limit.
const ENTRIES: usize = 300;
/// Distinct static files asked for among the hits.
const STATIC_FILES: usize = 30;
/// How long a connection may wait for its handshake before it counts as hanging.
const HANG: Duration = Duration::from_secs(5);
/// Connections made at once, more than the limit.
const FLOOD: usize = 300;
/// How soon a refused connection of the flood must know it (generous: 300 handshakes
/// at once on a busy machine).
const REFUSED_WITHIN: Duration = Duration::from_secs(2);

fn server(origin: &Origin, cache: &Path, args: &[&str]) -> Server {
    let config = format!(
        "[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\ncache = true\n\n[cache]\ndir = {:?}\nmax_size = \"256M\"\n",
        origin.url(),
        cache.display().to_string()
    );
    let mut b = Server::builder(BIN).bin_from_env().workers(Some(1)).wrapper([
        "prlimit".to_string(),
        format!("--nofile={LIMIT}:{LIMIT}"),
        "--".to_string(),
    ]);
    for i in 0..STATIC_FILES {
        b = b.file(&format!("s{i}.txt"), format!("static {i}\n"));
    }
    b.config(&config).args(args).start()
}

/// The cached target of entry `i` (fresh for ten minutes).
fn entry(i: usize) -> String {
    format!("/api/set/e{i}?h=Cache-Control%3Amax-age%3D600")
}

/// What one request on a new connection got.
#[derive(Debug)]
enum Outcome {
    Answered(RawResponse),
    /// Reset or closed before the handshake ended, within `HANG`: a clean refusal.
    Refused,
    /// No handshake within `HANG`: left waiting in the listen backlog.
    Hung,
    /// Anything else: a failure after the handshake, a TLS alert.
    Broken(String),
}

fn config() -> Arc<rustls::ClientConfig> {
    client_config(&[&rustls::version::TLS13, &rustls::version::TLS12])
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// Connects and completes a TLS handshake within [`HANG`].
fn handshake(addr: SocketAddr, cfg: &Arc<rustls::ClientConfig>) -> Result<Tls, Outcome> {
    let sock = match TcpStream::connect_timeout(&addr, HANG) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return Err(Outcome::Hung),
        Err(_) => return Err(Outcome::Refused),
    };
    sock.set_read_timeout(Some(HANG)).unwrap();
    sock.set_write_timeout(Some(HANG)).unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(cfg.clone(), name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    while tls.conn.is_handshaking() {
        if let Err(e) = tls.conn.complete_io(&mut tls.sock) {
            return Err(match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Outcome::Hung,
                std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::UnexpectedEof => Outcome::Refused,
                _ => Outcome::Broken(format!("handshake: {e}")),
            });
        }
    }
    Ok(tls)
}

/// A GET of `path` on a new connection.
fn request(addr: SocketAddr, cfg: &Arc<rustls::ClientConfig>, path: &str) -> Outcome {
    let mut c = match handshake(addr, cfg) {
        Ok(c) => c,
        Err(o) => return o,
    };
    c.sock.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    if let Err(e) = c.write_all(get_request(path).as_bytes()).and_then(|()| c.flush()) {
        return Outcome::Broken(format!("send: {e}"));
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if let Some((r, _)) = parse_response(&got, false) {
            return Outcome::Answered(r);
        }
        match c.read(&mut buf) {
            Ok(0) => return Outcome::Broken(format!("closed after {} bytes", got.len())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return Outcome::Broken(format!("response: {e}")),
        }
    }
}

/// Tallies of a phase of requests.
#[derive(Debug, Default)]
struct Tally {
    hits: usize,
    ok: usize,
    refused: usize,
    hung: usize,
    /// Every other answer or failure, with its path.
    other: Vec<String>,
}

impl Tally {
    /// Counts `o`: a cached target must be a hit, a static one a 200.
    fn add(&mut self, path: &str, o: Outcome, want_hit: bool) {
        match o {
            Outcome::Answered(r) if r.status == 200 && want_hit && r.header("cache-status") == Some("ktlsd; hit") => {
                self.hits += 1
            }
            Outcome::Answered(r) if r.status == 200 && !want_hit => self.ok += 1,
            Outcome::Answered(r) => self.other.push(format!("{path}: {} {:?}", r.status, r.header("cache-status"))),
            Outcome::Refused => self.refused += 1,
            Outcome::Hung => self.hung += 1,
            Outcome::Broken(why) => self.other.push(format!("{path}: {why}")),
        }
    }

    fn summary(&self) -> String {
        let mut statuses: std::collections::BTreeMap<String, usize> = Default::default();
        for o in &self.other {
            let key = o.split_once(": ").map_or(o.as_str(), |(_, s)| s).to_string();
            *statuses.entry(key).or_default() += 1;
        }
        format!(
            "{} hits, {} static 200, {} refused, {} hung, {} other {:?}",
            self.hits,
            self.ok,
            self.refused,
            self.hung,
            self.other.len(),
            statuses
        )
    }
}

/// Asks for every entry in turn, and a static file after every tenth.
fn hits(addr: SocketAddr, cfg: &Arc<rustls::ClientConfig>) -> Tally {
    let mut t = Tally::default();
    for i in 0..ENTRIES {
        let path = entry(i);
        t.add(&path, request(addr, cfg, &path), true);
        if i % 10 == 9 {
            let path = format!("/s{}.txt", i / 10 % STATIC_FILES);
            t.add(&path, request(addr, cfg, &path), false);
        }
    }
    t
}

/// Held files of a sequential client fit any budget: every hit is a hit, every
/// static file a 200, no entry is dropped; a flood from one address is cut by the
/// default `max_connections_per_ip` (a quarter of the 96 connections of the
/// worker), at once.
#[test]
fn descriptors_run_short_without_wedging_the_server() {
    let origin = Origin::start("a");
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&origin, dir.path(), &[]);
    let addr = srv.addr();
    let cfg = config();
    let mut failures = Vec::new();

    // Fill: each entry stored once.
    let mut stored = 0;
    let mut fill_other = Vec::new();
    for i in 0..ENTRIES {
        match request(addr, &cfg, &entry(i)) {
            Outcome::Answered(r) if r.header("cache-status") == Some("ktlsd; fwd=miss; stored") => stored += 1,
            o => fill_other.push(format!("{i}: {o:?}")),
        }
    }
    eprintln!("fill: {stored} of {ENTRIES} stored; other: {:?}", &fill_other[..fill_other.len().min(5)]);
    if stored != ENTRIES {
        failures.push(format!("fill: {stored} of {ENTRIES} stored"));
    }

    // Two passes of distinct hits: one connection at a time fits any budget, so
    // every request is answered, from the cache, and no entry was dropped.
    for pass in 1..=2 {
        let t = hits(addr, &cfg);
        eprintln!("hits, pass {pass}: {}", t.summary());
        if t.hits != ENTRIES || t.ok != ENTRIES / 10 {
            failures.push(format!(
                "hits, pass {pass}: {} (first others: {:?})",
                t.summary(),
                &t.other[..t.other.len().min(3)]
            ));
        }
    }
    let refetched = (0..ENTRIES).filter(|&i| origin.count(&entry(i)) != 1).count();
    eprintln!("entries fetched from the origin more than once: {refetched}");
    if refetched != 0 {
        failures.push(format!("{refetched} entries were fetched again (dropped from the index)"));
    }

    flood(addr, &cfg, 20..=FLOOD, &mut failures);
    recovery(addr, &cfg, &mut failures);

    let log = srv.stderr();
    let accept_failures = log.lines().filter(|l| l.contains("accept failed")).count();
    eprintln!("'accept failed' lines: {accept_failures}");
    if accept_failures > 5 {
        failures.push(format!("{accept_failures} 'accept failed' lines (rate-limited to one per pause)"));
    }
    assert!(failures.is_empty(), "{failures:#?}\nserver log (tail):\n{}", tail(&log, 30));
}

/// Makes [`FLOOD`] connections at once and holds them: each must be served or
/// refused at once (none waits in the listen backlog), and `handshaken` of them served.
fn flood(
    addr: SocketAddr,
    cfg: &Arc<rustls::ClientConfig>,
    handshaken: std::ops::RangeInclusive<usize>,
    failures: &mut Vec<String>,
) {
    // A flood of connections held open, made at once: each is served or refused
    // at once, none waits in the listen backlog.
    let flood: Vec<_> = (0..FLOOD)
        .map(|_| {
            let cfg = cfg.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                (handshake(addr, &cfg), started.elapsed())
            })
        })
        .collect();
    let (mut held, mut refused, mut hung, mut other, mut slowest_refusal) =
        (Vec::new(), 0, 0, Vec::new(), Duration::ZERO);
    for t in flood {
        match t.join().unwrap() {
            (Ok(c), _) => held.push(c),
            (Err(Outcome::Refused), took) => {
                refused += 1;
                slowest_refusal = slowest_refusal.max(took);
            }
            (Err(Outcome::Hung), _) => hung += 1,
            (Err(o), _) => other.push(format!("{o:?}")),
        }
    }
    eprintln!(
        "flood of {FLOOD}: {} handshaken, {refused} refused (the slowest after {slowest_refusal:?}), {hung} hung, other {other:?}",
        held.len()
    );
    if hung != 0 || slowest_refusal > REFUSED_WITHIN || !other.is_empty() || !handshaken.contains(&held.len()) {
        failures.push(format!(
            "flood: {} handshaken, {refused} refused (the slowest after {slowest_refusal:?}), {hung} hung, {other:?}",
            held.len()
        ));
    }
    drop(held);
}

/// Checks that the server serves a static file and a cache hit again within a second or so.
fn recovery(addr: SocketAddr, cfg: &Arc<rustls::ClientConfig>, failures: &mut Vec<String>) {
    // Serving again within a second or so: a static file and a cache hit.
    let started = Instant::now();
    let recovered = loop {
        let file = request(addr, cfg, "/s1.txt");
        let hit = request(addr, cfg, &entry(7));
        let ok = matches!(&file, Outcome::Answered(r) if r.status == 200)
            && matches!(&hit, Outcome::Answered(r) if r.header("cache-status") == Some("ktlsd; hit"));
        if ok {
            break Some(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(5) {
            eprintln!("after the flood: {file:?}; {hit:?}");
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("serving again after {recovered:?}");
    if recovered.is_none_or(|d| d > Duration::from_millis(1500)) {
        failures.push(format!("not serving again within 1.5 s of the flood: {recovered:?}"));
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// With the connection caps set out of the way, the descriptor budget alone
/// decides: a flood over it, after held entry files were taken, has the held files
/// given back and the connections beyond the budget (192 descriptors, less the
/// reserve's share taken by what is open) refused at once.
#[test]
fn connections_beyond_the_descriptor_budget_are_refused_at_once() {
    let origin = Origin::start("a");
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&origin, dir.path(), &["--max-connections", "100000", "--max-connections-per-ip", "100000"]);
    let addr = srv.addr();
    let cfg = config();
    let mut failures = Vec::new();
    // Entry files held: each entry stored, then answered once from its file.
    for round in ["fill", "hit"] {
        let ok = (0..150)
            .filter(|&i| matches!(request(addr, &cfg, &entry(i)), Outcome::Answered(r) if r.status == 200))
            .count();
        eprintln!("{round}: {ok} of 150 answered 200");
        if ok != 150 {
            failures.push(format!("{round}: {ok} of 150 answered 200"));
        }
    }
    flood(addr, &cfg, 150..=192, &mut failures);
    recovery(addr, &cfg, &mut failures);
    let log = srv.stderr();
    let accept_failures = log.lines().filter(|l| l.contains("accept failed")).count();
    eprintln!("'accept failed' lines: {accept_failures}");
    if accept_failures > 5 {
        failures.push(format!("{accept_failures} 'accept failed' lines (rate-limited to one per pause)"));
    }
    assert!(failures.is_empty(), "{failures:#?}\nserver log (tail):\n{}", tail(&log, 30));
}

/// Lowers (or restores) the soft descriptor limit of the running server: lowered to
/// the lowest descriptor number it has free, so that it can open none.
fn set_soft_limit(pid: u32, soft: Option<u32>) {
    let soft = soft.unwrap_or_else(|| {
        let mut open: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        open.sort_unstable();
        open.iter().enumerate().find(|&(i, &fd)| i as u32 != fd).map_or(open.len() as u32, |(i, _)| i as u32)
    });
    let out = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={soft}:{LIMIT}")])
        .output()
        .unwrap();
    assert!(out.status.success(), "prlimit: {}", String::from_utf8_lossy(&out.stderr));
}

/// When `accept` itself fails for want of descriptors (the limit lowered under the
/// running server, so that its budget no longer fits), connections are still
/// refused at once rather than left in the backlog, a static file asked for on a
/// connection already open gets 503 (not 500), the failure is logged at most once
/// a second, and once descriptors are back the server serves within a second.
#[test]
fn out_of_descriptors_accept_refuses_and_recovers() {
    let origin = Origin::start("a");
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&origin, dir.path(), &[]);
    let addr = srv.addr();
    let cfg = config();
    let mut failures = Vec::new();
    let mut open = handshake(addr, &cfg).unwrap_or_else(|o| panic!("{o:?}"));
    open.sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();

    set_soft_limit(srv.ready_pid(), None);
    let short = Instant::now();
    let attempts: Vec<_> = (0..20)
        .map(|i| {
            std::thread::sleep(Duration::from_millis(50));
            let cfg = cfg.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                let got = match handshake(addr, &cfg) {
                    Ok(_) => "handshaken".to_string(),
                    Err(o) => format!("{o:?}"),
                };
                (i, got, started.elapsed())
            })
        })
        .collect();
    let attempts: Vec<_> = attempts.into_iter().map(|t| t.join().unwrap()).collect();
    let refused = attempts.iter().filter(|(_, got, took)| got == "Refused" && *took < Duration::from_secs(1)).count();
    eprintln!("out of descriptors: {refused} of 20 refused within 1 s; {attempts:?}");
    if refused != 20 {
        failures.push(format!("out of descriptors: {refused} of 20 refused within 1 s: {attempts:?}"));
    }
    // A static file on the connection already open: it cannot be opened (the limit
    // lowered again, should the server have closed a descriptor meanwhile).
    set_soft_limit(srv.ready_pid(), None);
    open.write_all(get_request("/s3.txt").as_bytes()).and_then(|()| open.flush()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let status = loop {
        if let Some((r, _)) = parse_response(&got, false) {
            break Some(r.status);
        }
        match open.read(&mut buf) {
            Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => break None,
        }
    };
    eprintln!("a static file out of descriptors: {status:?}");
    if status != Some(503) {
        failures.push(format!("a static file out of descriptors got {status:?}, not 503"));
    }
    let lasted = short.elapsed();

    set_soft_limit(srv.ready_pid(), Some(LIMIT));
    recovery(addr, &cfg, &mut failures);
    let log = srv.stderr();
    let lines = log.lines().filter(|l| l.contains("accept failed")).count();
    let most = lasted.as_secs() as usize + 2;
    eprintln!("'accept failed' lines: {lines} in {lasted:?} (at most {most})");
    if lines == 0 || lines > most {
        failures.push(format!("{lines} 'accept failed' lines in {lasted:?}: one a second at most, and one at least"));
    }
    assert!(failures.is_empty(), "{failures:#?}\nserver log (tail):\n{}", tail(&log, 30));
}
