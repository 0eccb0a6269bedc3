//! Kernel TLS (kTLS) integration suite: the real `ktlsd` binary, its record
//! layer in the kernel, driven by `curl`, `openssl s_client` and an in-process
//! rustls client.
//!
//! Every test needs a kernel with kTLS, so all of them are `#[ignore]`d and run
//! inside throw-away VMs on real Debian kernels by `tests/ktls-vm`:
//!
//! ```text
//! tests/ktls-vm                  # both kernels (6.1 and backports)
//! tests/ktls-vm --kernel 6.1     # one kernel
//! tests/ktls-vm -- matrix_tls12  # a subset (test-name filter)
//! ```
//!
//! A test fails unless kTLS really carried its connections:
//! - `/proc/net/tls_stat`: `TlsTxSw` and `TlsRxSw` rose by one per connection,
//!   `TlsDecryptError` did not rise, and the `TlsCurr*` gauges went back to
//!   where they were once the server stopped;
//! - the server's own view: every access log line ends in `tls=ktls`, and the
//!   shutdown line reports `ktls=N userspace=0`.
//!
//! The counters are machine-wide, so run the binary with `--test-threads=1`.
//! Each test prints one `[tls_stat]` summary line of what changed.
//!
//! Environment: `KTLSD_BIN` (the server binary; default: the one cargo
//! built), `KTLSD_VM_FLAVOR` (set by the VM harness: `6.1` or `backports`,
//! cross-checked against what the kernel reports).
//!
//! The server process, curl, s_client and the rustls client configuration
//! come from the shared harness (`tests/common`); this file keeps what is
//! kTLS-specific.

mod common;
#[path = "ktls/conformance.rs"]
mod conformance;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::Deref;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{
    admin_get, assert_body, bin_from_env, client_config_with, fetch, get_request, get_request_with, parse_response,
    pattern, run_with_timeout, s_client_output, scrape, sha256, LineLog, RawResponse, Server, Stopped,
};
use kernel_tls::TlsStat;
use rustls::crypto::aws_lc_rs;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, SupportedCipherSuite};

// ============================================================== test data

const MIB: usize = 1024 * 1024;
const BIG: usize = 5 * MIB;
/// A large size that is not a multiple of the 16 KiB record size.
const ODD: usize = 3_000_000;

/// The standard file set: the sizes around a record boundary, and one large file.
fn standard_files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("empty", Vec::new()),
        ("one", pattern(1, 1)),
        ("r16384", pattern(16384, 2)),
        ("r16385", pattern(16385, 3)),
        ("big", pattern(BIG, 4)),
        ("odd", pattern(ODD, 5)),
    ]
}

fn file<'a>(files: &'a [(&str, Vec<u8>)], name: &str) -> &'a [u8] {
    &files.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("no test file {name}")).1
}

// ============================================================== tls_stat

fn read_tls_stat() -> TlsStat {
    match TlsStat::read() {
        Ok(s) => s,
        Err(e) => {
            panic!("{e}\nthis suite needs a kernel with kTLS: run it with tests/ktls-vm (it boots VMs on real kernels)")
        }
    }
}

/// Whether the running kernel can re-key kTLS sockets (TLS 1.3 KeyUpdate):
/// kernels that can also count it in tls_stat.
fn kernel_can_rekey() -> bool {
    let can = read_tls_stat().get("TlsRxRekeyOk").is_some();
    match std::env::var("KTLSD_VM_FLAVOR").as_deref() {
        Ok("backports") => assert!(can, "the backports kernel should have kTLS re-keying (TlsRxRekeyOk in tls_stat)"),
        Ok("6.1") => assert!(!can, "Linux 6.1 should not have kTLS re-keying, yet tls_stat lists TlsRxRekeyOk"),
        _ => {}
    }
    can
}

/// Counter changes between two snapshots.
struct StatDelta {
    before: TlsStat,
    after: TlsStat,
}

impl StatDelta {
    fn get(&self, name: &str) -> i64 {
        let a = self.after.get(name).unwrap_or(0) as i64;
        let b = self.before.get(name).unwrap_or(0) as i64;
        a - b
    }

    fn summary(&self) -> String {
        let mut parts = Vec::new();
        for (name, _) in self.after.iter() {
            let d = self.get(name);
            let always = matches!(name, "TlsTxSw" | "TlsRxSw" | "TlsDecryptError");
            if d != 0 || always {
                parts.push(format!("{name} {d:+}"));
            }
        }
        parts.join(" ")
    }
}

// ============================================================== the server

/// `ktlsd serve --ktls on` (the harness's [`Server`], binary from `KTLSD_BIN`)
/// and tls_stat once it listens (after its start-up probe, which installs keys
/// on loopback sockets of its own).
struct KtlsServer {
    server: Option<Server>,
    base: TlsStat,
}

/// What a stopped server left behind, and what changed in tls_stat.
struct KtlsStopped {
    stopped: Stopped,
    tls: StatDelta,
}

impl Deref for KtlsServer {
    type Target = Server;
    fn deref(&self) -> &Server {
        self.server.as_ref().expect("running")
    }
}

impl Deref for KtlsStopped {
    type Target = Stopped;
    fn deref(&self) -> &Stopped {
        &self.stopped
    }
}

impl KtlsServer {
    /// Starts `ktlsd serve ROOT --ktls on` with `files` in ROOT and `args` appended.
    fn start(files: &[(&str, Vec<u8>)], args: &[&str]) -> KtlsServer {
        let mut b = Server::builder().bin_from_env().args(["--ktls", "on"]).args(args);
        for (name, data) in files {
            b = b.file(name, data);
        }
        let server = b.start();
        let err = server.stderr();
        assert!(err.contains("kernel TLS: TX+RX for"), "the server started without announcing kernel TLS:\n{err}");
        KtlsServer { server: Some(server), base: read_tls_stat() }
    }

    /// SIGTERM, wait for the exit, collect counters, log and tls_stat delta.
    fn stop(mut self) -> KtlsStopped {
        let stopped = self.server.take().expect("running").stop();
        // Closing a kTLS socket drops the TlsCurr* gauges synchronously, but
        // give the kernel a moment anyway before calling a leak a leak.
        let mut after = read_tls_stat();
        let settle = Instant::now() + Duration::from_secs(3);
        while Instant::now() < settle && !gauges_back(&self.base, &after) {
            thread::sleep(Duration::from_millis(50));
            after = read_tls_stat();
        }
        let base = std::mem::take(&mut self.base);
        KtlsStopped { stopped, tls: StatDelta { before: base, after } }
    }
}

fn gauges_back(before: &TlsStat, after: &TlsStat) -> bool {
    before.iter().filter(|(n, _)| n.starts_with("TlsCurr")).all(|(n, v)| after.get(n) == Some(v))
}

impl Drop for KtlsServer {
    fn drop(&mut self) {
        if let Some(server) = &self.server {
            if thread::panicking() {
                println!("--- ktlsd stderr (test failed):\n{}", server.stderr());
                println!("--- access log:\n{}", server.access_log().join("\n"));
            }
        }
    }
}

/// What a test expects of the server's kTLS use.
struct Expect {
    /// Connections the server accepted (all must have run in the kernel).
    connections: u64,
    /// Access log lines (requests answered).
    requests: usize,
    /// Records the kernel must have failed to decrypt (normally 0).
    decrypt_errors: i64,
    /// Whether the connections' TX/RX key installs must equal `connections`
    /// exactly (key updates add installs on some kernels).
    exact_installs: bool,
}

impl Expect {
    fn conns(connections: u64, requests: usize) -> Expect {
        Expect { connections, requests, decrypt_errors: 0, exact_installs: true }
    }
}

/// The checks every test makes: kTLS carried every connection, in both
/// directions, and nothing failed to decrypt.
#[track_caller]
fn assert_ktls(test: &str, s: &KtlsStopped, want: &Expect) {
    let server_line = [
        "connections",
        "ktls",
        "userspace",
        "ktls_install_failures",
        "ktls_record_errors",
        "rekey_unsupported",
        "key_updates",
        "errors",
        "timeouts",
    ]
    .iter()
    .filter_map(|k| s.stats.get(*k).map(|v| format!("{k}={v}")))
    .collect::<Vec<_>>()
    .join(" ");
    println!("[tls_stat] {test}: {} | server: {server_line}", s.tls.summary());

    let ctx = || format!("\n--- server stderr:\n{}\n--- access log:\n{}", s.stderr, s.access_log.join("\n"));
    assert!(s.status.success(), "ktlsd exited with {} after SIGTERM{}", s.status, ctx());
    assert!(!s.stats.is_empty(), "no `stopped:` stats line on stderr{}", ctx());
    assert_eq!(s.stat("userspace"), 0, "connections ran in user space instead of the kernel{}", ctx());
    assert_eq!(s.stat("ktls_install_failures"), 0, "the kernel refused keys{}", ctx());
    assert_eq!(s.stat("connections"), want.connections, "connections accepted{}", ctx());
    assert_eq!(s.stat("ktls"), want.connections, "connections on kTLS (ktls=N){}", ctx());

    let (tx, rx) = (s.tls.get("TlsTxSw"), s.tls.get("TlsRxSw"));
    let n = want.connections as i64;
    if want.exact_installs {
        assert_eq!(tx, n, "TlsTxSw rose by {tx}, want one kernel TX install per connection ({n}); {}", s.tls.summary());
        assert_eq!(rx, n, "TlsRxSw rose by {rx}, want one kernel RX install per connection ({n}); {}", s.tls.summary());
    } else {
        assert!(tx >= n && n > 0, "TlsTxSw rose by {tx}, want >= {n}; {}", s.tls.summary());
        assert!(rx >= n && n > 0, "TlsRxSw rose by {rx}, want >= {n}; {}", s.tls.summary());
    }
    assert_eq!(
        s.tls.get("TlsDecryptError"),
        want.decrypt_errors,
        "TlsDecryptError changed unexpectedly; {}",
        s.tls.summary()
    );
    for gauge in ["TlsCurrTxSw", "TlsCurrRxSw"] {
        assert_eq!(
            s.tls.get(gauge),
            0,
            "{gauge} did not return to its value before the test (leaked kTLS socket?); {}",
            s.tls.summary()
        );
    }

    assert_eq!(s.access_log.len(), want.requests, "access log lines{}", ctx());
    for line in &s.access_log {
        assert!(line.ends_with(" tls=ktls"), "access log line not served by kTLS: {line}{}", ctx());
    }
}

/// The byte count an access log line reports for `GET path`, in log order.
fn logged(s: &Stopped, path: &str) -> Vec<(u16, u64)> {
    let needle = format!("\"GET {path} HTTP/1.1\" ");
    s.access_log
        .iter()
        .filter_map(|l| {
            let rest = &l[l.find(&needle)? + needle.len()..];
            let mut f = rest.split_whitespace();
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
        .collect()
}

// ============================================================== TLS versions and suites

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum V {
    Tls12,
    Tls13,
}

impl V {
    fn server_arg(self) -> &'static str {
        match self {
            V::Tls12 => "1.2",
            V::Tls13 => "1.3",
        }
    }

    fn rustls(self) -> &'static rustls::SupportedProtocolVersion {
        match self {
            V::Tls12 => &rustls::version::TLS12,
            V::Tls13 => &rustls::version::TLS13,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Cipher {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20,
}

/// The OpenSSL name of a suite (the names curl and s_client take; ktlsd
/// takes them too). TLS 1.2 suites are the ECDSA ones: the generated
/// certificate is ECDSA.
fn openssl_name(v: V, c: Cipher) -> &'static str {
    match (v, c) {
        (V::Tls12, Cipher::Aes128Gcm) => "ECDHE-ECDSA-AES128-GCM-SHA256",
        (V::Tls12, Cipher::Aes256Gcm) => "ECDHE-ECDSA-AES256-GCM-SHA384",
        (V::Tls12, Cipher::Chacha20) => "ECDHE-ECDSA-CHACHA20-POLY1305",
        (V::Tls13, Cipher::Aes128Gcm) => "TLS_AES_128_GCM_SHA256",
        (V::Tls13, Cipher::Aes256Gcm) => "TLS_AES_256_GCM_SHA384",
        (V::Tls13, Cipher::Chacha20) => "TLS_CHACHA20_POLY1305_SHA256",
    }
}

fn rustls_suite(v: V, c: Cipher) -> SupportedCipherSuite {
    use aws_lc_rs::cipher_suite as cs;
    match (v, c) {
        (V::Tls12, Cipher::Aes128Gcm) => cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        (V::Tls12, Cipher::Aes256Gcm) => cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        (V::Tls12, Cipher::Chacha20) => cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        (V::Tls13, Cipher::Aes128Gcm) => cs::TLS13_AES_128_GCM_SHA256,
        (V::Tls13, Cipher::Aes256Gcm) => cs::TLS13_AES_256_GCM_SHA384,
        (V::Tls13, Cipher::Chacha20) => cs::TLS13_CHACHA20_POLY1305_SHA256,
    }
}

// ============================================================== curl and s_client

fn curl_tls_args(v: V, c: Cipher) -> Vec<String> {
    let name = openssl_name(v, c).to_owned();
    match v {
        V::Tls12 => vec!["--tlsv1.2".into(), "--tls-max".into(), "1.2".into(), "--ciphers".into(), name],
        V::Tls13 => vec!["--tlsv1.3".into(), "--tls-max".into(), "1.3".into(), "--tls13-ciphers".into(), name],
    }
}

/// `curl` one URL over HTTP/1.1 on a fresh connection; returns (status, body).
fn curl_get(url: &str, tls: &[String], extra: &[&str]) -> (u16, Vec<u8>) {
    let mut args = vec!["--http1.1", "--max-time", "90"];
    args.extend(tls.iter().map(String::as_str));
    args.extend_from_slice(extra);
    let r = fetch(url, &args);
    (r.status, r.body)
}

fn s_client_tls_args(v: V, c: Cipher) -> Vec<String> {
    let name = openssl_name(v, c).to_owned();
    match v {
        V::Tls12 => vec!["-tls1_2".into(), "-cipher".into(), name],
        V::Tls13 => vec!["-tls1_3".into(), "-ciphersuites".into(), name],
    }
}

/// One request through `openssl s_client -quiet` (it reads until the server
/// closes); returns the parsed response.
fn s_client_get(addr: SocketAddr, tls: &[String], request: &str) -> RawResponse {
    let mut args = vec!["-quiet"];
    args.extend(tls.iter().map(String::as_str));
    let o = s_client_output(addr, &args, request.as_bytes(), Duration::from_secs(100));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "openssl s_client failed ({}): {err}", o.status);
    match parse_response(&o.stdout, false) {
        Some((r, used)) => {
            assert_eq!(used, o.stdout.len(), "s_client: bytes after the response; stderr: {err}");
            r
        }
        None => panic!(
            "s_client: incomplete response ({} bytes: {:?}...); stderr: {err}",
            o.stdout.len(),
            String::from_utf8_lossy(&o.stdout[..o.stdout.len().min(300)])
        ),
    }
}

// ============================================================== rustls client

fn client_config(v: V, suite: Option<SupportedCipherSuite>) -> Arc<ClientConfig> {
    client_config_with(&[v.rustls()], suite)
}

/// How a connection ended, seen from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Close {
    /// The server sent close_notify (then TCP EOF).
    Notify,
    /// TCP EOF without close_notify.
    Eof,
    /// TCP reset or another socket error.
    Reset(String),
    /// A TLS error: a fatal alert from the server, or a record rustls rejected.
    Tls(String),
}

/// A blocking rustls client whose socket writes are explicit: everything
/// rustls has to send leaves in ONE `write` per [`WireClient::flush`], and the
/// raw bytes received can be kept. The harness's `TlsClient` hides both; the
/// record-level tests here need them.
struct WireClient {
    sock: TcpStream,
    conn: ClientConnection,
    /// Decrypted bytes not yet consumed as responses.
    plain: Vec<u8>,
    /// Raw bytes received from the server, if kept.
    raw: Option<Vec<u8>>,
    closed: Option<Close>,
    /// Bytes of the last `flush`, all written by one `write_all`.
    last_flush: usize,
}

impl WireClient {
    /// TCP connection and a fresh TLS client; no handshake yet.
    fn start(addr: SocketAddr, cfg: &Arc<ClientConfig>) -> WireClient {
        let sock = TcpStream::connect(addr).unwrap();
        sock.set_nodelay(true).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        sock.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
        let conn = ClientConnection::new(cfg.clone(), ServerName::try_from("localhost").unwrap()).unwrap();
        WireClient { sock, conn, plain: Vec::new(), raw: None, closed: None, last_flush: 0 }
    }

    /// Connects and completes the handshake.
    fn connect(addr: SocketAddr, cfg: &Arc<ClientConfig>) -> WireClient {
        let mut c = WireClient::start(addr, cfg);
        c.handshake();
        c
    }

    fn handshake(&mut self) {
        loop {
            self.flush();
            if !self.conn.is_handshaking() {
                return;
            }
            if !self.pump() {
                panic!("connection ended during the handshake: {:?}", self.closed);
            }
        }
    }

    /// Sends everything rustls has queued in a single `write_all` call;
    /// returns the byte count.
    fn flush(&mut self) -> usize {
        let mut out = Vec::new();
        while self.conn.wants_write() {
            self.conn.write_tls(&mut out).unwrap();
        }
        self.last_flush = out.len();
        if !out.is_empty() {
            if let Err(e) = self.sock.write_all(&out) {
                self.closed.get_or_insert(Close::Reset(e.to_string()));
            }
        }
        out.len()
    }

    /// One socket read, fed through rustls; plaintext goes to `self.plain`.
    /// Returns false once the connection has ended (see `self.closed`).
    fn pump(&mut self) -> bool {
        if self.closed.is_some() {
            return false;
        }
        let mut buf = vec![0u8; 65536];
        let n = match self.sock.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut => {
                panic!("no data from the server within the read timeout (60s)")
            }
            Err(e) => {
                self.closed = Some(Close::Reset(e.to_string()));
                return false;
            }
        };
        if let Some(raw) = &mut self.raw {
            raw.extend_from_slice(&buf[..n]);
        }
        let mut slice = &buf[..n];
        let mut tmp = vec![0u8; 65536];
        loop {
            // read_tls takes at most its buffer's room per call, and refuses
            // more while decrypted data waits: drain it every round.
            if let Err(e) = self.conn.read_tls(&mut slice) {
                self.closed = Some(Close::Tls(e.to_string()));
                return false;
            }
            if let Err(e) = self.conn.process_new_packets() {
                self.flush();
                self.closed = Some(Close::Tls(e.to_string()));
                return false;
            }
            loop {
                match self.conn.reader().read(&mut tmp) {
                    Ok(0) => {
                        self.closed = Some(Close::Notify);
                        break;
                    }
                    Ok(k) => self.plain.extend_from_slice(&tmp[..k]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        self.closed = Some(Close::Eof);
                        break;
                    }
                    Err(e) => {
                        self.closed = Some(Close::Tls(e.to_string()));
                        break;
                    }
                }
            }
            if slice.is_empty() || self.closed.is_some() {
                break;
            }
        }
        // KeyUpdate answers and the like.
        self.flush();
        if n == 0 && self.closed.is_none() {
            self.closed = Some(Close::Eof);
        }
        self.closed.is_none()
    }

    fn queue(&mut self, data: &[u8]) {
        self.conn.writer().write_all(data).unwrap();
    }

    fn send(&mut self, data: &[u8]) {
        self.queue(data);
        self.flush();
    }

    /// The next complete response.
    fn response(&mut self, head_only: bool) -> RawResponse {
        loop {
            if let Some((r, used)) = parse_response(&self.plain, head_only) {
                self.plain.drain(..used);
                return r;
            }
            if !self.pump() {
                // Whatever arrived before the end may still hold a response.
                if let Some((r, used)) = parse_response(&self.plain, head_only) {
                    self.plain.drain(..used);
                    return r;
                }
                panic!(
                    "connection ended ({:?}) before a complete response ({} bytes buffered)",
                    self.closed,
                    self.plain.len()
                );
            }
        }
    }

    fn get(&mut self, path: &str) -> RawResponse {
        self.send(get_request(path).as_bytes());
        self.response(false)
    }

    /// Reads until the connection ends; returns how, and any stray plaintext.
    fn until_closed(&mut self) -> (Close, Vec<u8>) {
        while self.pump() {}
        (self.closed.clone().unwrap(), std::mem::take(&mut self.plain))
    }
}

// ============================================================== tests: doctor

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn doctor_reports_ktls_usable() {
    let before = read_tls_stat();
    let o = run_with_timeout(Command::new(bin_from_env()).args(["doctor", "--json"]), None, Duration::from_secs(60));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "ktlsd doctor --json: {}\n{text}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("doctor JSON: {e}\n{text}"));
    assert_eq!(j["ktls"]["usable"], true, "doctor says kTLS is not usable:\n{text}");
    let suites = j["suites"].as_array().expect("suites array");
    assert_eq!(suites.len(), 6, "{text}");
    for s in suites {
        assert!(s["tx"] == true && s["rx"] == true, "suite not usable in both directions: {s}");
    }
    assert_eq!(j["rekey"]["tested"], true, "{text}");
    let rekey = kernel_can_rekey();
    assert_eq!(j["rekey"]["supported"], rekey, "doctor's key-update verdict disagrees with tls_stat:\n{text}");
    assert_eq!(j["tls_stat"]["available"], true, "{text}");

    // The human report says the same.
    let o = run_with_timeout(Command::new(bin_from_env()).arg("doctor"), None, Duration::from_secs(60));
    let human = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "ktlsd doctor: {}\n{human}", o.status);
    assert!(human.contains("usable") && !human.contains("NOT usable"), "{human}");
    let after = read_tls_stat();
    println!(
        "[tls_stat] doctor_reports_ktls_usable: {} | rekey supported: {rekey}",
        StatDelta { before, after }.summary()
    );
}

// ============================================================== tests: matrix

/// One server restricted to one version and suite; every file size through
/// both clients, plus range requests; every body checked byte for byte.
fn matrix(test: &str, v: V, c: Cipher) {
    let files = standard_files();
    let server = KtlsServer::start(&files, &["--tls-versions", v.server_arg(), "--cipher-suites", openssl_name(v, c)]);
    let curl_tls = curl_tls_args(v, c);
    let ossl_tls = s_client_tls_args(v, c);
    let mut expected_log: Vec<(String, u16, u64)> = Vec::new();

    for (name, data) in &files {
        let path = format!("/{name}");
        let (code, body) = curl_get(&server.url(&path), &curl_tls, &[]);
        assert_eq!(code, 200, "curl {path}");
        assert_body(&format!("curl {path} ({test})"), &body, data);
        expected_log.push((path, 200, data.len() as u64));
    }
    for (name, data) in &files {
        let path = format!("/{name}");
        let r = s_client_get(server.addr(), &ossl_tls, &get_request_with(&path, "Connection: close\r\n"));
        assert_eq!(r.status, 200, "s_client {path}");
        assert_body(&format!("s_client {path} ({test})"), &r.body, data);
        expected_log.push((path, 200, data.len() as u64));
    }

    // Ranges: a large one inside the big file (several full records plus
    // partial ones) and a small one across the 16 KiB record boundary.
    let big = file(&files, "big");
    let (code, body) = curl_get(&server.url("/big"), &curl_tls, &["-r", "1000000-3499999"]);
    assert_eq!(code, 206, "curl range");
    assert_body(&format!("curl range ({test})"), &body, &big[1_000_000..3_500_000]);
    expected_log.push(("/big".into(), 206, 2_500_000));
    let r16385 = file(&files, "r16385");
    let r = s_client_get(
        server.addr(),
        &ossl_tls,
        &get_request_with("/r16385", "Range: bytes=16000-16384\r\nConnection: close\r\n"),
    );
    assert_eq!(r.status, 206, "s_client range");
    assert_eq!(r.header("Content-Range"), Some("bytes 16000-16384/16385"));
    assert_body(&format!("s_client range ({test})"), &r.body, &r16385[16000..]);
    expected_log.push(("/r16385".into(), 206, 385));

    let s = server.stop();
    assert_ktls(test, &s, &Expect::conns(expected_log.len() as u64, expected_log.len()));
    assert_eq!(s.stat("errors"), 0, "{}", s.stderr);
    // The server's own account of each body (catches a short body that a
    // client might not notice).
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (path, status, bytes) in &expected_log {
        let i = seen.entry(path.clone()).or_default();
        let entries = logged(&s, path);
        let (st, b) =
            entries.get(*i).copied().unwrap_or_else(|| panic!("no log line #{i} for {path}: {:?}", s.access_log));
        assert_eq!(st, *status, "access log status for GET {path} (#{i}): {:?}", s.access_log);
        assert_eq!(b, *bytes, "access log bytes for GET {path} (#{i}): {:?}", s.access_log);
        *i += 1;
    }
}

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn matrix_tls12_aes128gcm() {
    matrix("matrix_tls12_aes128gcm", V::Tls12, Cipher::Aes128Gcm);
}

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn matrix_tls12_aes256gcm() {
    matrix("matrix_tls12_aes256gcm", V::Tls12, Cipher::Aes256Gcm);
}

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn matrix_tls12_chacha20() {
    matrix("matrix_tls12_chacha20", V::Tls12, Cipher::Chacha20);
}

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn matrix_tls13_aes128gcm() {
    matrix("matrix_tls13_aes128gcm", V::Tls13, Cipher::Aes128Gcm);
}

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn matrix_tls13_aes256gcm() {
    matrix("matrix_tls13_aes256gcm", V::Tls13, Cipher::Aes256Gcm);
}

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn matrix_tls13_chacha20() {
    matrix("matrix_tls13_chacha20", V::Tls13, Cipher::Chacha20);
}

// ============================================================== tests: connection life

/// The standard files with precompressed variants of the large ones beside them
/// (bytes that differ from the originals', so a mix-up shows).
fn precompressed_files() -> Vec<(&'static str, Vec<u8>)> {
    let mut files = standard_files();
    files.push(("big.gz", pattern(BIG + 7, 11)));
    files.push(("odd.br", pattern(ODD - 3, 12)));
    files
}

/// A precompressed variant chosen by Accept-Encoding goes by sendfile over kTLS
/// like any file: the variant's bytes intact, the kernel carrying TX and RX.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn precompressed_variant_over_ktls() {
    let files = precompressed_files();
    let server = KtlsServer::start(&files, &["--precompressed", "br,gzip"]);
    let mut requests = 0;
    for proto in ["--http1.1", "--http2"] {
        for (path, accept, coding, variant) in
            [("/big", "gzip", "gzip", "big.gz"), ("/odd", "br, gzip", "br", "odd.br")]
        {
            let r = fetch(&server.url(path), &[proto, "--max-time", "90", "-H", &format!("Accept-Encoding: {accept}")]);
            assert_eq!((r.status, r.header("content-encoding")), (200, Some(coding)), "{proto} {path}");
            assert_body(&format!("{proto} {path} as {coding}"), &r.body, file(&files, variant));
            requests += 1;
        }
    }
    let s = server.stop();
    assert_ktls("precompressed_variant_over_ktls", &s, &Expect::conns(requests as u64, requests));
}

/// Several requests on one kTLS connection, then the client's close_notify:
/// the server answers with its own and closes. Then a resumed session whose
/// last request and close_notify arrive in one write.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn keepalive_requests_then_client_close_notify() {
    let files = standard_files();
    let server = KtlsServer::start(&files, &[]);
    let mut requests = 0;
    for v in [V::Tls13, V::Tls12] {
        let cfg = client_config(v, None);
        let mut c = WireClient::connect(server.addr(), &cfg);
        for name in ["one", "r16385", "big", "empty", "r16384"] {
            let r = c.get(&format!("/{name}"));
            assert_eq!(r.status, 200, "{v:?} /{name}");
            assert_body(&format!("{v:?} keep-alive /{name}"), &r.body, file(&files, name));
            requests += 1;
        }
        // HEAD: a head without body on the same connection.
        c.send(b"HEAD /big HTTP/1.1\r\nHost: localhost\r\n\r\n");
        let r = c.response(true);
        assert_eq!((r.status, r.header("Content-Length")), (200, Some("5242880")), "{v:?} HEAD");
        requests += 1;
        c.conn.send_close_notify();
        c.flush();
        let (how, stray) = c.until_closed();
        assert_eq!(how, Close::Notify, "{v:?}: the server should answer close_notify with close_notify");
        assert!(stray.is_empty(), "{v:?}: unexpected data after the last response: {stray:?}");

        // Resumption (a ticket from the first connection), and a request
        // whose close_notify follows in the same segment.
        let mut c = WireClient::start(server.addr(), &cfg);
        c.handshake();
        assert_eq!(c.conn.handshake_kind(), Some(rustls::HandshakeKind::Resumed), "{v:?}: session not resumed");
        c.queue(get_request("/r16385").as_bytes());
        c.conn.send_close_notify();
        c.flush();
        let r = c.response(false);
        assert_eq!(r.status, 200);
        assert_body(&format!("{v:?} resumed /r16385"), &r.body, file(&files, "r16385"));
        requests += 1;
        let (how, _) = c.until_closed();
        assert_eq!(how, Close::Notify, "{v:?}: resumed connection: close_notify expected after the response");
    }
    let s = server.stop();
    assert_ktls("keepalive_requests_then_client_close_notify", &s, &Expect::conns(4, requests));
    assert_eq!((s.stat("errors"), s.stat("timeouts")), (0, 0), "{}", s.stderr);
}

/// Requests written before the handshake completes: rustls sends them right
/// after the client Finished. With TLS 1.3 they leave in the same write (and
/// TCP segment) as the Finished, so they sit in the socket when the kernel
/// takes over the record layer.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn pipelined_requests_in_the_finished_segment() {
    let files = standard_files();
    let server = KtlsServer::start(&files, &[]);
    let order = ["one", "r16385", "empty", "r16384", "one", "big", "one"];
    let mut requests = 0;
    for v in [V::Tls13, V::Tls12] {
        let mut c = WireClient::start(server.addr(), &client_config(v, None));
        let mut app_bytes = 0;
        for (i, name) in order.iter().enumerate() {
            // One writer call per request: one record each.
            let close = if i + 1 == order.len() { "Connection: close\r\n" } else { "" };
            let req = get_request_with(&format!("/{name}"), close);
            app_bytes += req.len();
            c.queue(req.as_bytes());
        }
        // Drive the handshake by hand. pump() ends with a flush, so the pump
        // that completes the handshake also makes the write that carries the
        // client Finished (TLS 1.3) or the first requests (TLS 1.2).
        c.flush();
        while c.conn.is_handshaking() {
            assert!(c.pump(), "{v:?}: connection ended during the handshake: {:?}", c.closed);
        }
        let n = c.last_flush;
        if v == V::Tls13 {
            // Finished (~58 bytes) plus one record per request, in one write.
            assert!(
                n >= app_bytes + 50 + order.len() * 22,
                "TLS 1.3: the write with the client Finished carried {n} bytes; requests alone are {app_bytes}"
            );
        }
        for name in order {
            let r = c.response(false);
            assert_eq!(r.status, 200, "{v:?} pipelined /{name}");
            assert_body(&format!("{v:?} pipelined /{name}"), &r.body, file(&files, name));
            requests += 1;
        }
        let (how, stray) = c.until_closed();
        assert_eq!(how, Close::Notify, "{v:?}: after `Connection: close` the server sends close_notify");
        assert!(stray.is_empty(), "{v:?}: {} stray bytes", stray.len());
    }
    let s = server.stop();
    assert_ktls("pipelined_requests_in_the_finished_segment", &s, &Expect::conns(2, requests));
    assert_eq!(s.stat("errors"), 0, "{}", s.stderr);
}

/// A client resets its connection in the middle of a 5 MiB sendfile; another
/// connection, open all along, and new ones are served normally.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn client_reset_mid_sendfile_keeps_serving() {
    let files = standard_files();
    let big = file(&files, "big").to_vec();
    let server = KtlsServer::start(&files, &[]);
    let cfg = client_config(V::Tls13, None);

    let mut bystander = WireClient::connect(server.addr(), &cfg);
    assert_eq!(bystander.get("/one").status, 200);

    for v in [V::Tls13, V::Tls12] {
        let mut victim = WireClient::connect(server.addr(), &client_config(v, None));
        victim.send(get_request("/big").as_bytes());
        while victim.plain.len() < 256 * 1024 {
            assert!(victim.pump(), "{v:?}: connection ended early: {:?}", victim.closed);
        }
        // SO_LINGER 0: close() sends RST instead of FIN.
        socket2::SockRef::from(&victim.sock).set_linger(Some(Duration::ZERO)).unwrap();
        drop(victim);
    }
    // Give the server a moment to hit the reset.
    thread::sleep(Duration::from_millis(300));

    let r = bystander.get("/big");
    assert_eq!(r.status, 200);
    assert_body("bystander /big after the resets", &r.body, &big);
    let (code, body) = curl_get(&server.url("/big"), &[], &[]);
    assert_eq!(code, 200);
    assert_body("new connection /big after the resets", &body, &big);
    bystander.conn.send_close_notify();
    bystander.flush();
    assert_eq!(bystander.until_closed().0, Close::Notify);

    let s = server.stop();
    // The two reset responses never complete, so they are not logged.
    assert_ktls("client_reset_mid_sendfile_keeps_serving", &s, &Expect::conns(4, 3));
    assert_eq!(s.stat("errors"), 2, "both resets count as connection errors\n{}", s.stderr);
}

/// A large download does not hold up small requests on the same worker
/// (one worker): the kernel encrypts inside each `sendfile`, on the worker's
/// thread, so a call that moves a MiB stalls every other connection of the
/// worker for as long as a MiB takes to encrypt. While one client downloads
/// 5 MiB as fast as it reads, another asks for a 1-byte file again and again;
/// its slowest answer must take less than half the download's time per MiB.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn large_download_does_not_stall_small_requests() {
    let files = standard_files();
    let big = file(&files, "big").to_vec();
    let server = KtlsServer::start(&files, &[]); // one worker, as the harness starts it
    let cfg = client_config(V::Tls13, None);
    let mut small = WireClient::connect(server.addr(), &cfg);
    assert_eq!(small.get("/one").status, 200);

    let mut downloader = WireClient::connect(server.addr(), &cfg);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let download = thread::spawn({
        let done = done.clone();
        move || {
            let start = Instant::now();
            let r = downloader.get("/big");
            let took = start.elapsed();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            (r, took)
        }
    });
    let mut slowest = Duration::ZERO;
    let mut asked = 0;
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        let start = Instant::now();
        let r = small.get("/one");
        assert_eq!(r.status, 200);
        slowest = slowest.max(start.elapsed());
        asked += 1;
    }
    let (r, took) = download.join().unwrap();
    assert_eq!(r.status, 200);
    assert_body("download beside small requests", &r.body, &big);
    let per_mib = took / (BIG / MIB) as u32;
    println!("[stall] 5 MiB in {took:?} ({per_mib:?}/MiB); {asked} small requests meanwhile, slowest {slowest:?}");
    assert!(asked >= 2, "only {asked} small requests were answered during the download ({took:?})");
    assert!(
        slowest < per_mib / 2,
        "a small request waited {slowest:?} while the download took {per_mib:?} per MiB: the worker was held by the download"
    );
    let s = server.stop();
    assert_ktls("large_download_does_not_stall_small_requests", &s, &Expect::conns(2, asked + 2));
}

// ============================================================== tests: key update

/// TLS 1.3 KeyUpdate(update_requested) from a rustls client. Kernels that can
/// re-key keep the connection going; older ones close it cleanly, and the
/// server keeps serving.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn key_update_from_rustls_client() {
    let test = "key_update_from_rustls_client";
    let files = standard_files();
    let rekey = kernel_can_rekey();
    let server = KtlsServer::start(&files, &[]);
    let cfg = client_config(V::Tls13, None);
    let mut c = WireClient::connect(server.addr(), &cfg);
    assert_body("before KeyUpdate", &c.get("/r16385").body, file(&files, "r16385"));

    c.conn.refresh_traffic_keys().unwrap();
    c.flush();
    if rekey {
        // The request follows the KeyUpdate at once, under the new key.
        let r = c.get("/big");
        assert_eq!(r.status, 200);
        assert_body("after the first KeyUpdate", &r.body, file(&files, "big"));
        c.conn.refresh_traffic_keys().unwrap();
        c.flush();
        let r = c.get("/r16384");
        assert_body("after the second KeyUpdate", &r.body, file(&files, "r16384"));
        c.conn.send_close_notify();
        c.flush();
        assert_eq!(c.until_closed().0, Close::Notify);

        let s = server.stop();
        assert_ktls(test, &s, &Expect { exact_installs: false, ..Expect::conns(1, 3) });
        assert_eq!(s.stat("key_updates"), 2, "{}", s.stderr);
        assert_eq!(s.stat("rekey_unsupported"), 0);
        assert_eq!(s.stat("errors"), 0, "{}", s.stderr);
        for (name, want) in [("TlsRxRekeyOk", 2), ("TlsTxRekeyOk", 2), ("TlsRxRekeyError", 0), ("TlsTxRekeyError", 0)] {
            assert_eq!(s.tls.get(name), want, "{name}; {}", s.tls.summary());
        }
    } else {
        // Nothing more is sent: the server must end the connection by itself.
        let (how, stray) = c.until_closed();
        assert!(stray.is_empty(), "data after KeyUpdate on a kernel that cannot re-key: {stray:?}");
        assert_eq!(how, Close::Notify, "the server should close cleanly (close_notify) when the kernel cannot re-key");
        // Another connection works.
        let mut other = WireClient::connect(server.addr(), &cfg);
        assert_body("a new connection after the refused KeyUpdate", &other.get("/r16385").body, file(&files, "r16385"));
        other.conn.send_close_notify();
        other.flush();
        assert_eq!(other.until_closed().0, Close::Notify);

        let s = server.stop();
        assert_ktls(test, &s, &Expect::conns(2, 2));
        assert_eq!(s.stat("rekey_unsupported"), 1, "{}", s.stderr);
        assert_eq!(s.stat("key_updates"), 0);
    }
}

/// TLS 1.3 KeyUpdate typed into an interactive `openssl s_client`: `k`
/// (update not requested), then `K` (update requested).
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn key_update_from_openssl_s_client() {
    let test = "key_update_from_openssl_s_client";
    let rekey = kernel_can_rekey();
    let bodies: Vec<(String, Vec<u8>)> = (1..=3)
        .map(|i| (format!("ku{i}.txt"), format!("key-update-body-{i}-{}\n", sha256(&[i])).into_bytes()))
        .collect();
    let files: Vec<(&str, Vec<u8>)> = bodies.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    let server = KtlsServer::start(&files, &[]);

    // Not -quiet (nor -ign_eof): s_client only takes `k`/`K` commands without
    // them. Each command must arrive as its own read from stdin.
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &server.addr().to_string(), "-servername", "localhost", "-tls1_3", "-msg"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl s_client");
    let mut stdin = child.stdin.take().unwrap();
    let (out, out_reader) = LineLog::spawn(child.stdout.take().unwrap());
    let (err, err_reader) = LineLog::spawn(child.stderr.take().unwrap());
    let t = Duration::from_secs(30);
    let diag = |out: &LineLog, err: &LineLog| {
        let out = out.text();
        let tail = out.chars().rev().take(3000).collect::<String>().chars().rev().collect::<String>();
        format!("\n--- s_client stdout (tail):\n{tail}\n--- stderr:\n{}", err.text())
    };
    let wait_for = |log: &LineLog, what: &str, pred: &dyn Fn(&[String]) -> bool| {
        assert!(log.wait_until(t, pred), "timed out waiting for {what}{}", diag(&out, &err));
    };
    // Body `i` (one line) shows up on s_client's stdout.
    let body_seen = |i: usize| {
        let line = String::from_utf8_lossy(&bodies[i].1).trim_end().to_owned();
        move |lines: &[String]| lines.iter().any(|l| l.contains(&line))
    };
    let keyupdates = |lines: &[String]| lines.iter().map(|l| l.matches("KEYUPDATE").count()).sum::<usize>();

    let request = |stdin: &mut std::process::ChildStdin, i: usize| {
        let req = get_request(&format!("/{}", bodies[i].0));
        stdin.write_all(req.as_bytes()).and_then(|()| stdin.flush())
    };
    request(&mut stdin, 0).unwrap();
    wait_for(&out, "the first response", &body_seen(0));

    stdin.write_all(b"k\n").unwrap();
    wait_for(&err, "s_client to announce KEYUPDATE", &|l| keyupdates(l) >= 1);
    let mut served = 1;
    if rekey {
        request(&mut stdin, 1).unwrap();
        wait_for(&out, "the response after `k`", &body_seen(1));
        stdin.write_all(b"K\n").unwrap();
        wait_for(&err, "the second KEYUPDATE", &|l| keyupdates(l) >= 2);
        request(&mut stdin, 2).unwrap();
        wait_for(&out, "the response after `K`", &body_seen(2));
        served = 3;
        // EOF on stdin: s_client sends close_notify and exits.
        drop(stdin);
    }
    // Without re-keying, s_client has sent the KeyUpdate at once: the server
    // must end the connection by itself, and s_client exits when it does.
    let deadline = Instant::now() + t;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("s_client did not exit (rekey={rekey}){}", diag(&out, &err));
        }
        thread::sleep(Duration::from_millis(20));
    };
    // The readers finish once the pipes close.
    let _ = out_reader.join();
    let _ = err_reader.join();
    let stdout_text = out.text();
    // -msg shows the KeyUpdate messages themselves.
    let sent_updates = stdout_text.matches(">>> TLS 1.3, Handshake [length 0005], KeyUpdate").count();
    let got_updates = stdout_text.matches("<<< TLS 1.3, Handshake [length 0005], KeyUpdate").count();

    let s = server.stop();
    if rekey {
        assert!(status.success(), "s_client: {status}{}", diag(&out, &err));
        assert_eq!(sent_updates, 2, "KeyUpdates s_client sent{}", diag(&out, &err));
        assert_eq!(
            got_updates,
            1,
            "the server answers `K` (update requested) with its own KeyUpdate{}",
            diag(&out, &err)
        );
        assert_ktls(test, &s, &Expect { exact_installs: false, ..Expect::conns(1, served) });
        assert_eq!(s.stat("key_updates"), 2, "{}", s.stderr);
        assert_eq!(s.stat("errors"), 0, "{}", s.stderr);
        assert!(s.tls.get("TlsRxRekeyOk") == 2 && s.tls.get("TlsTxRekeyOk") == 1, "{}", s.tls.summary());
    } else {
        assert_eq!(sent_updates, 1, "KeyUpdates s_client sent{}", diag(&out, &err));
        assert!(
            stdout_text.contains("<<< TLS 1.3, Alert [length 0002], warning close_notify"),
            "the server should close cleanly (close_notify) when the kernel cannot re-key{}",
            diag(&out, &err)
        );
        assert_ktls(test, &s, &Expect::conns(1, served));
        assert_eq!(s.stat("rekey_unsupported"), 1, "{}", s.stderr);
    }
}

// ============================================================== tests: records

/// TLS 1.2 AES-GCM records carry an explicit nonce: the kernel must not
/// repeat one that rustls used for the server's Finished (same key), nor any
/// other. Checked on the wire, for both GCM suites.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn tls12_gcm_explicit_nonces_never_repeat() {
    let files = standard_files();
    let server = KtlsServer::start(&files, &["--tls-versions", "1.2"]);
    let mut requests = 0;
    for c in [Cipher::Aes128Gcm, Cipher::Aes256Gcm] {
        let mut client = WireClient::start(server.addr(), &client_config(V::Tls12, Some(rustls_suite(V::Tls12, c))));
        client.raw = Some(Vec::new());
        client.handshake();
        for name in ["one", "r16385", "empty", "big"] {
            assert_eq!(client.get(&format!("/{name}")).status, 200);
            requests += 1;
        }
        client.conn.send_close_notify();
        client.flush();
        assert_eq!(client.until_closed().0, Close::Notify);

        let raw = client.raw.take().unwrap();
        let mut pos = 0;
        let mut encrypted = false;
        let mut nonces: HashMap<[u8; 8], usize> = HashMap::new();
        let mut records = 0;
        while pos + 5 <= raw.len() {
            let typ = raw[pos];
            let len = u16::from_be_bytes([raw[pos + 3], raw[pos + 4]]) as usize;
            let payload = &raw[pos + 5..(pos + 5 + len).min(raw.len())];
            assert!(len <= 16384 + 8 + 16, "{c:?}: record #{records} of {len} bytes exceeds the TLS 1.2 GCM limit");
            if encrypted {
                let nonce: [u8; 8] = payload[..8].try_into().unwrap();
                if let Some(first) = nonces.insert(nonce, records) {
                    panic!("{c:?}: explicit nonce {nonce:02x?} of record #{records} repeats record #{first}'s (AES-GCM nonce reuse)");
                }
            }
            if typ == 20 {
                encrypted = true; // ChangeCipherSpec: everything after is protected
            }
            pos += 5 + len;
            records += 1;
        }
        assert_eq!(pos, raw.len(), "{c:?}: trailing partial record");
        assert!(nonces.len() > 5, "{c:?}: only {} protected records seen", nonces.len());
    }
    let s = server.stop();
    assert_ktls("tls12_gcm_explicit_nonces_never_repeat", &s, &Expect::conns(2, requests));
}

/// Complete TLS records in `raw`: (offset, content type, length of the
/// protected payload).
fn records(raw: &[u8]) -> Vec<(usize, u8, usize)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 5 <= raw.len() {
        let len = u16::from_be_bytes([raw[pos + 3], raw[pos + 4]]) as usize;
        if pos + 5 + len > raw.len() {
            break;
        }
        out.push((pos, raw[pos], len));
        pos += 5 + len;
    }
    out
}

/// The record size policies on the kernel path: every body intact, and the
/// records on the wire as long as the policy says (`static` below 16 KiB is
/// enforced by the kernel itself where it has TLS_TX_MAX_PAYLOAD_LEN, by one
/// `sendfile` per record elsewhere). `adaptive` sets TCP_NOTSENT_LOWAT
/// (16 KiB); full records with the same low-water mark set by hand, too.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn record_size_policies() {
    let files = standard_files();
    let odd = file(&files, "odd");
    let cases: [(&str, &[&str]); 4] =
        [("static:4k", &[]), ("dynamic", &[]), ("adaptive", &[]), ("static:16k", &["--tcp-notsent-lowat", "16384"])];
    for (policy, extra) in cases {
        // A stall shows as the send timeout cutting the connection.
        let mut args = vec!["--send-timeout", "20", "--record-size", policy];
        args.extend_from_slice(extra);
        let server = KtlsServer::start(&files, &args);
        for v in [V::Tls13, V::Tls12] {
            // AES-128-GCM: 17 bytes of expansion per TLS 1.3 record, 24 per TLS 1.2 one.
            let expansion = if v == V::Tls13 { 17 } else { 24 };
            let mut c = WireClient::start(server.addr(), &client_config(v, Some(rustls_suite(v, Cipher::Aes128Gcm))));
            c.raw = Some(Vec::new());
            c.handshake();
            // A first response, so that session tickets are behind us.
            assert_eq!(c.get("/one").status, 200);
            let mark = c.raw.as_ref().unwrap().len();
            let r = c.get("/odd");
            assert_eq!(r.status, 200);
            assert_body(&format!("{policy} {v:?} /odd (rustls)"), &r.body, odd);
            c.conn.send_close_notify();
            c.flush();
            assert_eq!(c.until_closed().0, Close::Notify);

            let raw = c.raw.take().unwrap();
            let sizes: Vec<usize> = records(&raw)
                .into_iter()
                .filter(|&(off, typ, _)| off >= mark && typ == 23)
                .map(|(_, _, len)| len - expansion)
                .collect();
            // The last one or two may be the close_notify alert (TLS 1.3 hides its type).
            let body_records: Vec<usize> = sizes.iter().copied().filter(|&n| n > 2).collect();
            let total: usize = body_records.iter().sum();
            assert!(
                (ODD..ODD + 1024).contains(&total),
                "{policy} {v:?}: {total} plaintext bytes in the response records"
            );
            let max = body_records.iter().copied().max().unwrap_or(0);
            println!(
                "[record_size_policies] {policy} {v:?}: {} records, max {max}, first {:?}",
                body_records.len(),
                &body_records[..body_records.len().min(6)]
            );
            match policy {
                "static:4k" => {
                    assert!(max <= 4096, "{policy} {v:?}: a record of {max} bytes");
                    let full = body_records.iter().filter(|&&n| n == 4096).count();
                    assert!(full + 2 >= ODD / 4096, "{policy} {v:?}: only {full} records of 4096 bytes");
                }
                "dynamic" => {
                    // lo=1369 for 40 records, hi=4229 for 40 more, then full;
                    // the request for /one used the first.
                    assert!(body_records.len() > 80, "{policy} {v:?}: {} records", body_records.len());
                    assert!(body_records[..38].iter().all(|&n| n <= 1369), "{policy} {v:?}: {:?}", &body_records[..40]);
                    assert!(
                        body_records[40..78].iter().all(|&n| n <= 4229 && n > 1369),
                        "{policy} {v:?}: {:?}",
                        &body_records[38..80]
                    );
                    assert_eq!(max, 16384, "{policy} {v:?}: full records after the ramp");
                }
                _ => assert!(max <= 16384, "{policy} {v:?}: a record of {max} bytes"),
            }

            let (code, body) = curl_get(&server.url("/odd"), &curl_tls_args(v, Cipher::Aes128Gcm), &[]);
            assert_eq!(code, 200);
            assert_body(&format!("{policy} {v:?} /odd (curl)"), &body, odd);
        }
        let s = server.stop();
        assert_ktls(&format!("record_size_policies[{}]", args.join(" ")), &s, &Expect::conns(4, 6));
        assert_eq!(s.stat("errors"), 0, "{}", s.stderr);
    }
}

/// A record that fails authentication: the kernel refuses it (EBADMSG), the
/// server answers bad_record_mac and drops the connection, and goes on serving.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn corrupted_record_gets_bad_record_mac() {
    let files = standard_files();
    let server = KtlsServer::start(&files, &[]);
    let mut requests = 0;
    for v in [V::Tls13, V::Tls12] {
        let mut c = WireClient::connect(server.addr(), &client_config(v, None));
        assert_eq!(c.get("/one").status, 200);
        requests += 1;
        // A well-formed application-data record whose contents are garbage.
        let mut rec = vec![23u8, 3, 3, 0, 64];
        rec.extend_from_slice(&pattern(64, 99));
        c.sock.write_all(&rec).unwrap();
        let (how, stray) = c.until_closed();
        assert!(stray.is_empty());
        // The server answers bad_record_mac; a kernel that has put the
        // socket in an error state may refuse to send it (then: EOF/reset).
        println!("[corrupted_record_gets_bad_record_mac] {v:?}: the client saw {how:?}");
        if let Close::Tls(e) = &how {
            assert!(e.to_lowercase().contains("badrecordmac"), "{v:?}: expected a bad_record_mac alert, got: {e}");
        }
        assert_ne!(how, Close::Notify, "{v:?}: a connection cut for a forged record must not end with close_notify");
    }
    let (code, body) = curl_get(&server.url("/r16385"), &[], &[]);
    assert_eq!(code, 200);
    assert_body("after the corrupted records", &body, file(&files, "r16385"));
    requests += 1;
    let s = server.stop();
    assert_ktls(
        "corrupted_record_gets_bad_record_mac",
        &s,
        &Expect { decrypt_errors: 2, ..Expect::conns(3, requests) },
    );
    assert_eq!(s.stat("ktls_record_errors"), 2, "{}", s.stderr);
}

// ============================================================== tests: handshake inputs

/// kTLS for the connections that completed a handshake, after `failed` refused
/// ones: the completed ones all ran in the kernel (one TX and one RX install
/// each), the refused ones never reached it, nothing panicked, and SIGTERM was
/// prompt although `--shutdown-timeout` is long.
#[track_caller]
fn assert_ktls_after_refusals(test: &str, s: &KtlsStopped, ktls: u64, failed: u64, requests: usize) {
    println!("[tls_stat] {test}: {} | refused handshakes: {failed}", s.tls.summary());
    let ctx = || format!("\n--- server stderr:\n{}\n--- access log:\n{}", s.stderr, s.access_log.join("\n"));
    assert!(s.status.success(), "ktlsd exited with {} after SIGTERM{}", s.status, ctx());
    assert!(!s.stderr.contains("panicked"), "the server panicked{}", ctx());
    assert_eq!(s.stat("panics"), 0, "{}", ctx());
    assert!(s.took < Duration::from_secs(5), "SIGTERM took {:?}: a connection was left counted{}", s.took, ctx());
    assert_eq!(s.stat("connections"), ktls + failed, "connections accepted{}", ctx());
    assert_eq!(s.stat("handshake_failures"), failed, "refused handshakes{}", ctx());
    assert_eq!((s.stat("ktls"), s.stat("userspace")), (ktls, 0), "connections on kTLS{}", ctx());
    let n = ktls as i64;
    assert_eq!((s.tls.get("TlsTxSw"), s.tls.get("TlsRxSw")), (n, n), "kernel installs; {}", s.tls.summary());
    assert_eq!(s.tls.get("TlsDecryptError"), 0, "{}", s.tls.summary());
    for gauge in ["TlsCurrTxSw", "TlsCurrRxSw"] {
        assert_eq!(s.tls.get(gauge), 0, "{gauge} did not return to its value; {}", s.tls.summary());
    }
    assert_eq!(s.access_log.len(), requests, "access log lines{}", ctx());
    for line in &s.access_log {
        assert!(line.ends_with(" tls=ktls"), "access log line not served by kTLS: {line}{}", ctx());
    }
}

/// An ALPN list long enough that `-max_send_frag 512` splits the ClientHello
/// over several records.
fn long_alpn() -> String {
    let extra: Vec<String> = (0..40).map(|i| format!("proto-{i:02}-{}", "x".repeat(20))).collect();
    format!("http/1.1,{}", extra.join(","))
}

/// Handshake messages spanning records: s_client with 512-byte records, and a
/// ClientHello over 16 KiB from rustls; each connection then runs on kTLS.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn handshake_split_across_records_then_ktls() {
    let files = standard_files();
    let server = KtlsServer::start(&files, &[]);
    let alpn = long_alpn();
    let mut requests = 0;
    for v in [V::Tls13, V::Tls12] {
        let mut tls = s_client_tls_args(v, Cipher::Aes128Gcm);
        tls.extend(["-max_send_frag".into(), "512".into(), "-alpn".into(), alpn.clone()]);
        let r = s_client_get(server.addr(), &tls, &get_request_with("/r16385", "Connection: close\r\n"));
        assert_eq!(r.status, 200, "{v:?} s_client -max_send_frag 512");
        assert_body(&format!("{v:?} split ClientHello /r16385"), &r.body, file(&files, "r16385"));
        requests += 1;

        let mut cfg = (*client_config(v, None)).clone();
        cfg.alpn_protocols = (0..120).map(|i| format!("p{i:03}-{}", "y".repeat(200)).into_bytes()).collect();
        cfg.alpn_protocols.push(b"http/1.1".to_vec());
        let cfg = Arc::new(cfg);
        let hello = common::client_hello(cfg.clone());
        assert!(hello.len() > 16384 + 5, "{v:?}: ClientHello of {} bytes", hello.len());
        let mut c = WireClient::connect(server.addr(), &cfg);
        let r = c.get("/big");
        assert_eq!(r.status, 200, "{v:?} ClientHello over 16 KiB");
        assert_body(&format!("{v:?} big ClientHello /big"), &r.body, file(&files, "big"));
        requests += 1;
    }
    let s = server.stop();
    assert_ktls_after_refusals("handshake_split_across_records_then_ktls", &s, 4, 0, requests);
}

/// The nine bytes that made rustls panic in the handshake error path (a
/// ClientHello header announcing 64 KiB in a 4-byte record), and a few mutated
/// ClientHellos: no panic, then a kTLS request, then a prompt exit.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn malformed_client_hello_then_ktls_and_prompt_exit() {
    let files = standard_files();
    let server = KtlsServer::start(&files, &["--shutdown-timeout", "60"]);
    let mut inputs = vec![vec![0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x01, 0x00, 0x00]];
    let hello = common::client_hello(client_config(V::Tls13, None));
    // The ClientHello with its handshake length field raised, and cut short.
    let mut long = hello.clone();
    long[8] = long[8].wrapping_add(1);
    inputs.push(long);
    inputs.push(hello[..hello.len() - 7].to_vec());
    for input in &inputs {
        let mut s = TcpStream::connect(server.addr()).unwrap();
        let _ = s.write_all(input);
        let _ = s.shutdown(std::net::Shutdown::Write);
        assert!(common::read_raw_until_closed(&mut s, Duration::from_secs(20)).1, "left open after {input:02x?}");
    }
    let (code, body) = curl_get(&server.url("/odd"), &[], &[]);
    assert_eq!(code, 200);
    assert_body("after malformed ClientHellos", &body, file(&files, "odd"));
    let s = server.stop();
    assert_ktls_after_refusals("malformed_client_hello_then_ktls_and_prompt_exit", &s, 1, inputs.len() as u64, 1);
}

/// A refused handshake gets the whole refusal: TLS 1.3 fails after the
/// ServerHello (no common ALPN protocol), so ServerHello, ChangeCipherSpec and
/// the encrypted alert must all arrive for the client to read the alert; TLS 1.2
/// gets a plaintext alert. Then a request runs on kTLS.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn refused_handshake_alert_is_complete_then_ktls() {
    let files = standard_files();
    let server = KtlsServer::start(&files, &[]);
    for v in [V::Tls13, V::Tls12] {
        let mut cfg = (*client_config(v, None)).clone();
        cfg.alpn_protocols = vec![b"spdy/3.1".to_vec()];
        match common::TlsClient::connect_with(server.addr(), Arc::new(cfg)) {
            Ok(_) => panic!("{v:?}: handshake succeeded without a common ALPN protocol"),
            Err(e) => assert!(e.to_string().contains("NoApplicationProtocol"), "{v:?}: the client saw {e}"),
        }
    }
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.write_all(&common::client_hello(client_config(V::Tls12, Some(rustls_suite(V::Tls12, Cipher::Aes128Gcm)))))
        .unwrap();
    // A fatal alert from the client after its ClientHello ends that handshake too.
    s.write_all(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 46]).unwrap();
    let (_, closed) = common::read_raw_until_closed(&mut s, Duration::from_secs(20));
    assert!(closed);
    let (code, body) = curl_get(&server.url("/r16384"), &[], &[]);
    assert_eq!(code, 200);
    assert_body("after refused handshakes", &body, file(&files, "r16384"));
    let s = server.stop();
    assert_ktls_after_refusals("refused_handshake_alert_is_complete_then_ktls", &s, 1, 3, 1);
    assert_eq!(s.stat("handshake_protocol_errors"), 2, "{}", s.stderr);
    assert_eq!(s.stat("handshake_client_alerts"), 1, "{}", s.stderr);
}

// ============================================================== tests: lingering close

/// The server ends a connection while the client has sent bytes it has not
/// read (after `Connection: close`, after an HTTP/1.0 request, and after an
/// error on a pipelined request). Closing with unread input would make the
/// kernel reset the connection and drop the tail of the response; the server
/// shuts down its write side and drains the kTLS socket instead, so the 1 MiB
/// response arrives whole, followed by close_notify.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn lingering_close_delivers_whole_responses() {
    let mut files = standard_files();
    files.push(("mib", pattern(MIB, 7)));
    let mib = file(&files, "mib").to_vec();
    let server = KtlsServer::start(&files, &[]);
    // (request, statuses, whether the extra bytes follow only once the server has
    // answered and closed: a socket already closed would answer them with a reset).
    let cases: [(&str, &[u16], bool); 4] = [
        ("GET /mib HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", &[200], false),
        ("GET /mib HTTP/1.0\r\n\r\n", &[200], false),
        ("GET /mib HTTP/1.1\r\nHost: localhost\r\n\r\nGET /one HTTP/1.1\r\nHost x\r\n\r\n", &[200, 400], false),
        ("GET /mib HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", &[200], true),
    ];
    let (mut connections, mut requests) = (0, 0);
    for v in [V::Tls13, V::Tls12] {
        for (request, statuses, later) in cases {
            let what = format!("{v:?} {:?} (extra bytes later: {later})", request.lines().next().unwrap_or(""));
            let mut c = WireClient::connect(server.addr(), &client_config(v, None));
            let extra = vec![b'z'; 20_000];
            if later {
                c.send(request.as_bytes());
                thread::sleep(Duration::from_millis(500));
                c.send(&extra);
            } else {
                c.send(&[request.as_bytes(), &extra].concat());
            }
            // Let the server write its answer and close before anything is read.
            thread::sleep(Duration::from_millis(500));
            for status in statuses {
                let r = c.response(false);
                assert_eq!(r.status, *status, "{what}");
                if *status == 200 {
                    assert_eq!(sha256(&r.body), sha256(&mib), "{what}: {} of {} bytes", r.body.len(), mib.len());
                }
            }
            let (how, stray) = c.until_closed();
            assert_eq!(how, Close::Notify, "{what}: close_notify expected after the response");
            assert!(stray.is_empty(), "{what}: {} stray bytes", stray.len());
            connections += 1;
            requests += statuses.len();
        }
    }
    let s = server.stop();
    assert_ktls("lingering_close_delivers_whole_responses", &s, &Expect::conns(connections, requests));
    assert_eq!((s.stat("errors"), s.stat("timeouts")), (0, 0), "{}", s.stderr);
}

// ============================================================== tests: bad records

/// The bad-record table of `records_bad.rs` (tests/common `bad_records`) on the
/// kernel record layer: after a real handshake, each record that breaks the
/// protocol gets the kernel path's fatal alert within a couple of seconds,
/// although the idle timeout is 60 s, and the server goes on serving. A record
/// that fails authentication ends its connection with a FIN only: the kernel
/// then refuses to send the alert.
fn bad_records_on_ktls(test: &str, v: V, c: Cipher) {
    let files = standard_files();
    let server = KtlsServer::start(&files, &["--idle-timeout", "60"]);
    let prompt = Duration::from_secs(3);
    let mut failures = Vec::new();
    let (mut conns, mut requests) = (0, 0);
    for case in common::bad_records() {
        match case.versions {
            common::Versions::Tls13 if v != V::Tls13 => continue,
            common::Versions::Tls12 if v != V::Tls12 => continue,
            _ => {}
        }
        let mut client = common::ForgingClient::connect(server.addr(), v.rustls(), Some(rustls_suite(v, c)));
        conns += 1;
        assert_eq!(client.get("/one").status, 200, "{v:?} {c:?}: request before `{}`", case.name);
        requests += 1;
        let bad = (case.forge)(&mut client);
        client.send_raw(&bad);
        let end = client.read_until_end(Duration::from_secs(70));
        let alerts = end.alerts();
        println!("[{test}] {}: alerts {alerts:?}, {:?} after {:?}", case.name, end.how, end.elapsed);
        let want: Vec<(u8, u8)> = case.kernel.map(|d| (2, d)).into_iter().collect();
        if alerts != want {
            failures.push(format!("{}: alerts {alerts:?}, want {want:?} ({:?})", case.name, end.how));
        }
        if end.elapsed > prompt {
            failures.push(format!("{}: the connection ended {:?} after {:?}", case.name, end.how, end.elapsed));
        }
    }
    let (code, body) = curl_get(&server.url("/r16385"), &curl_tls_args(v, c), &[]);
    assert_eq!(code, 200);
    assert_body("after the bad records", &body, file(&files, "r16385"));
    conns += 1;
    requests += 1;
    let s = server.stop();
    assert!(failures.is_empty(), "{test}: {} cases failed:\n{}\n{}", failures.len(), failures.join("\n"), s.stderr);
    // Only the record whose tag does not authenticate counts as a decrypt
    // error; one without a content type is refused after decryption, the
    // others for their length or contents.
    let decrypt_errors = s.tls.get("TlsDecryptError");
    assert_eq!(decrypt_errors, 1, "{test}: TlsDecryptError; {}", s.tls.summary());
    assert_ktls(test, &s, &Expect { decrypt_errors, ..Expect::conns(conns, requests) });
}

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn bad_records_tls13_aes128gcm() {
    bad_records_on_ktls("bad_records_tls13_aes128gcm", V::Tls13, Cipher::Aes128Gcm);
}

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn bad_records_tls13_chacha20() {
    bad_records_on_ktls("bad_records_tls13_chacha20", V::Tls13, Cipher::Chacha20);
}

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn bad_records_tls12_aes128gcm() {
    bad_records_on_ktls("bad_records_tls12_aes128gcm", V::Tls12, Cipher::Aes128Gcm);
}

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn bad_records_tls12_chacha20() {
    bad_records_on_ktls("bad_records_tls12_chacha20", V::Tls12, Cipher::Chacha20);
}

// ============================================================== HTTP/2

/// Relays one client connection to `to` and returns the length field of every TLS
/// record the server sent (header type 23, application data), in order.
fn record_lengths_proxy(to: SocketAddr) -> (SocketAddr, thread::JoinHandle<Vec<(u8, usize)>>) {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").expect("proxy listener");
    let addr = listener.local_addr().expect("proxy address");
    let handle = thread::spawn(move || {
        let (mut client, _) = listener.accept().expect("proxy accept");
        let mut server = TcpStream::connect(to).expect("proxy connect");
        let (mut c2, mut s2) = (client.try_clone().expect("clone"), server.try_clone().expect("clone"));
        let up = thread::spawn(move || {
            let _ = std::io::copy(&mut c2, &mut s2);
            let _ = s2.shutdown(std::net::Shutdown::Write);
        });
        let mut records = Vec::new();
        let mut header = [0u8; 5];
        while server.read_exact(&mut header).is_ok() {
            let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
            let mut body = vec![0u8; len];
            if server.read_exact(&mut body).is_err() {
                break;
            }
            records.push((header[0], len));
            if client.write_all(&header).and_then(|_| client.write_all(&body)).is_err() {
                break;
            }
        }
        let _ = client.shutdown(std::net::Shutdown::Write);
        let _ = up.join();
        records
    });
    (addr, handle)
}

/// HTTP/2 over kTLS: curl `--http2` bodies intact (SHA-256), every connection in
/// the kernel both ways, the access log says `HTTP/2.0` and `tls=ktls`; and on
/// the wire each full DATA frame is exactly one TLS record.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn h2_bodies_and_one_frame_per_record() {
    let test = "h2_bodies_and_one_frame_per_record";
    let files = standard_files();
    let server = KtlsServer::start(&files, &["--tls-versions", "1.3", "--cipher-suites", "TLS_AES_128_GCM_SHA256"]);
    for (name, data) in &files {
        let r = fetch(&server.url(&format!("/{name}")), &["--http2", "--max-time", "90"]);
        assert_eq!((r.version.as_str(), r.status), ("HTTP/2", 200), "/{name}");
        assert_eq!(sha256(&r.body), sha256(data), "/{name} over HTTP/2 ({test})");
    }

    // nghttp through a proxy that notes the record lengths; large windows, so
    // that flow control does not cut frames short.
    let (proxy, records) = record_lengths_proxy(server.addr());
    let url = format!("https://{proxy}/big");
    let out = run_with_timeout(
        std::process::Command::new("nghttp").args(["-nv", "-w", "30", "-W", "30", &url]),
        None,
        Duration::from_secs(90),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "nghttp failed: {}", String::from_utf8_lossy(&out.stderr));
    let frames: Vec<usize> = text
        .lines()
        .filter(|l| l.contains("recv DATA frame"))
        .filter_map(|l| l.split("length=").nth(1)?.split(',').next()?.parse().ok())
        .collect();
    assert_eq!(frames.iter().sum::<usize>(), BIG, "DATA bytes");
    let records = records.join().expect("proxy");
    // TLS 1.3 AES-GCM: a record's length field is its plaintext + 1 (content type) + 16 (tag).
    let full_frames = frames.iter().filter(|&&n| n == 16384 - 9).count();
    let full_records = records.iter().filter(|&&(t, n)| t == 23 && n == 16384 + 17).count();
    assert!(full_frames >= BIG / 16375 - 2, "full DATA frames: {full_frames} of {}", frames.len());
    // The response's HEADERS share the first record with a shorter first DATA frame,
    // which fills that record too: one full record more than full frames at most.
    assert!(
        full_records == full_frames || full_records == full_frames + 1,
        "one full record per full DATA frame: {full_records} full records, {full_frames} full frames; records: {:?}",
        &records[..records.len().min(40)]
    );
    assert!(records.iter().all(|&(_, n)| n <= 16384 + 17 + 256), "no record over the maximum");
    // A frame header sent as a record of its own (9 + 17) would mean the header and
    // its payload were split.
    let lone_headers = records.iter().filter(|&&(t, n)| t == 23 && n == 9 + 17).count();
    assert!(lone_headers <= 2, "{lone_headers} records of a lone frame header");

    frames_one_per_record(&frames, &records, "large windows");

    // Small windows (64 KiB - 1) cut frames at odd sizes wherever the window
    // runs out, so frame edges no longer fall on the record size: a writer that
    // filled full records regardless of frames would show 16384-byte records where
    // these frames are shorter, and one that sent each frame header as a record of
    // its own would show twice as many records.
    let (proxy, records) = record_lengths_proxy(server.addr());
    let out = run_with_timeout(
        std::process::Command::new("nghttp").args(["-nv", "-w", "16", "-W", "16", &format!("https://{proxy}/big")]),
        None,
        Duration::from_secs(90),
    );
    assert!(out.status.success(), "nghttp failed: {}", String::from_utf8_lossy(&out.stderr));
    let frames = data_frames(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(frames.iter().sum::<usize>(), BIG, "DATA bytes");
    assert!(
        frames.iter().any(|&n| n != 16384 - 9 && n != *frames.last().unwrap_or(&0)),
        "no odd-sized frame: {frames:?}"
    );
    frames_one_per_record(&frames, &records.join().expect("proxy"), "small windows");

    let s = server.stop();
    assert_ktls(test, &s, &Expect::conns(files.len() as u64 + 2, files.len() + 2));
    assert_eq!(s.stat("errors"), 0, "{}", s.stderr);
    for line in &s.access_log {
        assert!(line.contains(" HTTP/2.0\" 200 ") && line.ends_with(" tls=ktls"), "{line}");
    }
}

/// The lengths of the DATA frames `nghttp -v` received, in order.
fn data_frames(text: &str) -> Vec<usize> {
    text.lines()
        .filter(|l| l.contains("recv DATA frame"))
        .filter_map(|l| l.split("length=").nth(1)?.split(',').next()?.parse().ok())
        .collect()
}

/// The server's application records carry the DATA frames one to one, in order:
/// after the record the first frame shares (with HEADERS and control frames),
/// each following frame is exactly one record whose plaintext is its 9-byte header
/// and payload (TLS 1.3 AES-GCM: length field = plaintext + 1 + 16).
fn frames_one_per_record(frames: &[usize], records: &[(u8, usize)], what: &str) {
    let plain: Vec<usize> = records.iter().filter(|&&(t, _)| t == 23).map(|&(_, n)| n - 17).collect();
    let want: Vec<usize> = frames.iter().skip(1).map(|n| n + 9).collect();
    let first = frames.first().map_or(0, |n| n + 9);
    let found = (1..plain.len().saturating_sub(want.len()) + 1)
        .any(|j| plain[j..j + want.len()] == want[..] && plain[j - 1] >= first);
    assert!(
        found,
        "{what}: the {} DATA frames after the first are not one record each, in order;\nframes + 9: {:?}\nrecords:    {:?}",
        want.len(),
        &want[..want.len().min(60)],
        &plain[..plain.len().min(70)]
    );
}

// ============================================================== metrics and advisor

/// A server with `files` and an admin socket (in a directory kept with it).
fn ktls_with_admin(files: &[(&str, Vec<u8>)], args: &[&str]) -> (KtlsServer, tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let sock = dir.path().join("admin.sock");
    let sock_arg = sock.display().to_string();
    let mut all = vec!["--admin", sock_arg.as_str()];
    all.extend_from_slice(args);
    (KtlsServer::start(files, &all), dir, sock)
}

fn sample(m: &HashMap<String, f64>, key: &str) -> f64 {
    *m.get(key).unwrap_or_else(|| panic!("no sample {key} in /metrics"))
}

/// `/metrics` counts kTLS connections and their bytes under record_layer="ktls"
/// (none under userspace), and relays the kernel's own tls_stat, which rose by
/// one TX and one RX per connection.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn metrics_count_ktls_connections_and_relay_tls_stat() {
    let test = "metrics_count_ktls_connections_and_relay_tls_stat";
    let files = standard_files();
    let (server, _dir, sock) = ktls_with_admin(&files, &[]);
    let before = scrape(&sock);
    let names = ["one", "r16385", "big"];
    for name in names {
        let r = fetch(&server.url(&format!("/{name}")), &["--http1.1"]);
        assert_eq!(r.status, 200, "/{name}");
    }
    let want_bytes: usize = names.iter().map(|n| file(&files, n).len()).sum();
    let layer = |l: &str| format!("ktlsd_connections_total{{protocol=\"http/1.1\",record_layer=\"{l}\"}}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        let m = scrape(&sock);
        if sample(&m, &layer("ktls")) - before.get(&layer("ktls")).copied().unwrap_or(0.0) >= 3.0
            || Instant::now() > deadline
        {
            break m;
        }
        thread::sleep(Duration::from_millis(100));
    };
    let d = |k: &str| sample(&after, k) - before.get(k).copied().unwrap_or(0.0);
    assert_eq!(d(&layer("ktls")), 3.0, "{test}");
    assert_eq!(d(&layer("userspace")), 0.0, "{test}");
    assert_eq!(d("ktlsd_sent_body_bytes_total{record_layer=\"ktls\"}"), want_bytes as f64, "{test}");
    assert_eq!(d("ktlsd_sent_body_bytes_total{record_layer=\"userspace\"}"), 0.0, "{test}");
    assert_eq!(d("ktlsd_ktls_install_failures_total"), 0.0, "{test}");
    for c in ["TlsTxSw", "TlsRxSw"] {
        let key = format!("ktlsd_kernel_tls_stat{{counter=\"{c}\"}}");
        assert!(d(&key) >= 3.0, "{test}: {key} rose by {}", d(&key));
    }
    let stopped = server.stop();
    assert_ktls(test, &stopped, &Expect::conns(3, 3));
}

/// Runs `ktlsd` over kTLS with `files`, fetches `urls` on `connections` kept-alive
/// curl connections (through netem's `link` on lo if given, set up once the
/// server has started), and returns `/advisor`'s recommendation and reason.
fn advice_after(
    files: &[(&str, Vec<u8>)],
    urls: &[&str],
    connections: usize,
    link: Option<&[&str]>,
) -> (String, String) {
    let (server, _dir, sock) = ktls_with_admin(files, &["--record-size", "dynamic"]);
    let netem = link.map(Netem::on);
    for _ in 0..connections {
        let mut args: Vec<String> = vec!["-sk".into(), "--http1.1".into(), "--max-time".into(), "120".into()];
        for u in urls {
            args.extend(["-o".into(), "/dev/null".into(), server.url(u)]);
        }
        let out = run_with_timeout(Command::new("curl").args(&args), None, Duration::from_secs(150));
        assert!(out.status.success(), "curl: {}", String::from_utf8_lossy(&out.stderr));
    }
    let want = (urls.len() * connections) as u64;
    let deadline = Instant::now() + Duration::from_secs(20);
    let advice = loop {
        let (status, body) = admin_get(&sock, "/advisor");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("advisor JSON");
        if v["samples"].as_u64() >= Some(want) && v["connections"].as_u64() >= Some(connections as u64)
            || Instant::now() > deadline
        {
            break v;
        }
        thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(advice["samples"].as_u64(), Some(want), "{advice}");
    assert!(advice["current"].as_str().is_some_and(|c| c.starts_with("dynamic")), "{advice}");
    drop(netem);
    server.stop();
    (
        advice["recommended"].as_str().unwrap_or_default().to_string(),
        advice["reason"].as_str().unwrap_or_default().to_string(),
    )
}

/// `tc qdisc` on lo for the life of the guard.
struct Netem;

impl Netem {
    fn on(spec: &[&str]) -> Netem {
        // None may be there yet: the deletion's complaint is expected.
        let _ = Command::new("tc").args(["qdisc", "del", "dev", "lo", "root"]).stderr(Stdio::null()).status();
        let mut args = vec!["qdisc", "add", "dev", "lo", "root", "netem"];
        args.extend_from_slice(spec);
        let st = Command::new("tc").args(&args).status().expect("tc");
        assert!(st.success(), "tc {args:?} failed: netem (sch_netem) is needed");
        Netem
    }
}

impl Drop for Netem {
    fn drop(&mut self) {
        let _ = Command::new("tc").args(["qdisc", "del", "dev", "lo", "root"]).status();
    }
}

/// The advisor on three real traffic mixes over kTLS: all small bodies
/// (static:4k), mostly small with a few large on a near link (static:16k), and
/// large bodies over a link with 20 ms RTT and 1% loss made by netem (adaptive).
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn advisor_recommends_from_three_traffic_mixes() {
    let files = vec![("small", pattern(1_000, 1)), ("mid", pattern(10_000, 2)), ("large", pattern(100_000, 3))];
    let small: Vec<&str> = vec!["/small"; 60];
    let (rec, why) = advice_after(&files, &small, 2, None);
    assert_eq!(rec, "static:4k", "all small: {why}");

    // 2 of 60 (3%) exceed the initial window: fewer than the 5% that matter.
    let mut mixed: Vec<&str> = vec!["/mid"; 58];
    mixed.extend(["/large", "/large"]);
    let (rec, why) = advice_after(&files, &mixed, 2, None);
    assert_eq!(rec, "static:16k", "mixed: {why}");

    let large: Vec<&str> = vec!["/large"; 40];
    let (rec, why) = advice_after(&files, &large, 3, Some(&["delay", "10ms", "loss", "1%"]));
    assert_eq!(rec, "adaptive", "large over a lossy link: {why}");
    assert!(why.contains("exceed the initial window"), "{why}");
}
