//! What every kTLS test shares: the standard file set, `/proc/net/tls_stat`
//! snapshots, the server under test with kTLS forced on ([`KtlsServer`]) and
//! the checks that prove the kernel carried every connection ([`assert_ktls`]).
//! The clients are in `suites` (curl, s_client) and `wire` (rustls).

use std::ops::Deref;
use std::thread;
use std::time::{Duration, Instant};

use kernel_tls::TlsStat;
use testkit::{pattern, Server, Stopped};

pub const MIB: usize = 1024 * 1024;
pub const BIG: usize = 5 * MIB;
/// A large size that is not a multiple of the 16 KiB record size.
pub const ODD: usize = 3_000_000;

/// The standard file set: the sizes around a record boundary, and one large file.
pub fn standard_files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("empty", Vec::new()),
        ("one", pattern(1, 1)),
        ("r16384", pattern(16384, 2)),
        ("r16385", pattern(16385, 3)),
        ("big", pattern(BIG, 4)),
        ("odd", pattern(ODD, 5)),
    ]
}

pub fn file<'a>(files: &'a [(&str, Vec<u8>)], name: &str) -> &'a [u8] {
    &files.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("no test file {name}")).1
}

pub fn read_tls_stat() -> TlsStat {
    match TlsStat::read() {
        Ok(s) => s,
        Err(e) => {
            panic!("{e}\nthis suite needs a kernel with kTLS: run it with tests/ktls-vm (it boots VMs on real kernels)")
        }
    }
}

/// Whether the running kernel can re-key kTLS sockets (TLS 1.3 KeyUpdate):
/// kernels that can also count it in tls_stat.
pub fn kernel_can_rekey() -> bool {
    let can = read_tls_stat().get("TlsRxRekeyOk").is_some();
    match std::env::var("KTLSD_VM_FLAVOR").as_deref() {
        Ok("backports") => assert!(can, "the backports kernel should have kTLS re-keying (TlsRxRekeyOk in tls_stat)"),
        Ok("6.1") => assert!(!can, "Linux 6.1 should not have kTLS re-keying, yet tls_stat lists TlsRxRekeyOk"),
        _ => {}
    }
    can
}

/// Counter changes between two snapshots.
pub struct StatDelta {
    pub before: TlsStat,
    pub after: TlsStat,
}

impl StatDelta {
    pub fn get(&self, name: &str) -> i64 {
        let a = self.after.get(name).unwrap_or(0) as i64;
        let b = self.before.get(name).unwrap_or(0) as i64;
        a - b
    }

    pub fn summary(&self) -> String {
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

/// `ktlsd serve --ktls on` (the harness's [`Server`], binary from `KTLSD_BIN`)
/// and tls_stat once it listens (after its start-up probe, which installs keys
/// on loopback sockets of its own).
pub struct KtlsServer {
    pub server: Option<Server>,
    pub base: TlsStat,
}

/// What a stopped server left behind, and what changed in tls_stat.
pub struct KtlsStopped {
    pub stopped: Stopped,
    pub tls: StatDelta,
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
    pub fn start(files: &[(&str, Vec<u8>)], args: &[&str]) -> KtlsServer {
        let mut b = Server::builder(crate::BIN).bin_from_env().args(["--ktls", "on"]).args(args);
        for (name, data) in files {
            b = b.file(name, data);
        }
        let server = b.start();
        let err = server.stderr();
        assert!(err.contains("kernel TLS: TX+RX for"), "the server started without announcing kernel TLS:\n{err}");
        KtlsServer { server: Some(server), base: read_tls_stat() }
    }

    /// SIGTERM, wait for the exit, collect counters, log and tls_stat delta.
    pub fn stop(mut self) -> KtlsStopped {
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

pub fn gauges_back(before: &TlsStat, after: &TlsStat) -> bool {
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
pub struct Expect {
    /// Connections the server accepted (all must have run in the kernel).
    pub connections: u64,
    /// Access log lines (requests answered).
    pub requests: usize,
    /// Records the kernel must have failed to decrypt (normally 0).
    pub decrypt_errors: i64,
    /// Whether the connections' TX/RX key installs must equal `connections`
    /// exactly (key updates add installs on some kernels).
    pub exact_installs: bool,
}

impl Expect {
    pub fn conns(connections: u64, requests: usize) -> Expect {
        Expect { connections, requests, decrypt_errors: 0, exact_installs: true }
    }
}

/// The checks every test makes: kTLS carried every connection, in both
/// directions, and nothing failed to decrypt.
#[track_caller]
pub fn assert_ktls(test: &str, s: &KtlsStopped, want: &Expect) {
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

/// The status and byte count an access log line reports for `GET path` (any HTTP
/// version), in log order.
pub fn logged(s: &Stopped, path: &str) -> Vec<(u16, u64)> {
    let needle = format!("\"GET {path} HTTP/");
    s.access_log
        .iter()
        .filter_map(|l| {
            let line = &l[l.find(&needle)? + needle.len()..];
            let rest = &line[line.find("\" ")? + 2..];
            let mut f = rest.split_whitespace();
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
        .collect()
}

/// kTLS for the connections that completed a handshake, after `failed` refused
/// ones: the completed ones all ran in the kernel (one TX and one RX install
/// each), the refused ones never reached it, nothing panicked, and SIGTERM was
/// prompt although `--shutdown-timeout` is long.
#[track_caller]
pub fn assert_ktls_after_refusals(test: &str, s: &KtlsStopped, ktls: u64, failed: u64, requests: usize) {
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
