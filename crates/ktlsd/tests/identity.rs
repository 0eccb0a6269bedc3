//! The server's identity across starts and instances: the self-signed certificate
//! kept in the state directory, relative paths in the config file, and session
//! tickets that any instance given the same `--ticket-keys` files can open.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rustls::HandshakeKind;
use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// The fingerprint on the start-up line.
fn printed_fingerprint(srv: &Server) -> String {
    let err = srv.stderr();
    let line = err.lines().find(|l| l.contains(" serving ")).unwrap_or_else(|| panic!("no serving line:\n{err}"));
    line.split("fingerprint ").nth(1).and_then(|r| r.split(',').next()).unwrap_or("").trim().to_string()
}

/// The fingerprint of the certificate the server presents.
fn presented_fingerprint(addr: SocketAddr) -> String {
    use sha2::{Digest, Sha256};
    let c = TlsClient::connect(addr);
    let leaf = c.tls.conn.peer_certificates().and_then(|c| c.first()).expect("a peer certificate");
    Sha256::digest(leaf.as_ref()).iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(":")
}

/// Starts a server keeping its certificate in `state`, and returns its printed fingerprint
/// (checked against the one it presents) and its stderr.
fn start_with_state(state: &Path, extra: &[&str]) -> (String, String) {
    let srv = Server::builder(BIN).no_state_dir().arg("--state-dir").arg(state).args(extra).start();
    let fp = printed_fingerprint(&srv);
    assert_eq!(fp.len(), 95, "{fp:?}");
    assert_eq!(presented_fingerprint(srv.addr()), fp);
    let stopped = srv.stop();
    stopped.assert_clean_exit();
    (fp, stopped.stderr)
}

#[test]
fn two_starts_with_one_state_dir_present_the_same_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("nested/state");
    let (fp1, err1) = start_with_state(&state, &[]);
    assert!(err1.contains("generated and stored in"), "{err1}");
    let stored = state.join("self-signed.pem");
    let mode = std::fs::metadata(&stored).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the stored key must be private");
    let (fp2, err2) = start_with_state(&state, &[]);
    assert_eq!(fp1, fp2, "a second start must reuse the stored certificate");
    assert!(err2.contains("kept in"), "{err2}");
    // No temporary file is left beside it.
    let names: Vec<_> = std::fs::read_dir(&state).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["self-signed.pem"]);
}

#[test]
fn ephemeral_cert_is_new_at_every_start_and_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (fp1, _) = start_with_state(&state, &[]);
    let (fp2, err) = start_with_state(&state, &["--ephemeral-cert"]);
    let (fp3, _) = start_with_state(&state, &["--ephemeral-cert"]);
    assert!(err.contains("ephemeral"), "{err}");
    assert_ne!(fp1, fp2);
    assert_ne!(fp2, fp3);
    // The stored one is untouched.
    assert_eq!(start_with_state(&state, &[]).0, fp1);
}

#[test]
fn damaged_stored_pair_is_replaced_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (fp1, _) = start_with_state(&state, &[]);
    let stored = state.join("self-signed.pem");
    // Corrupt the key: flip bytes inside its base64 body.
    let pem = std::fs::read_to_string(&stored).unwrap();
    let corrupt = pem.replacen("\n", "\n!!!!", 1);
    std::fs::write(&stored, corrupt).unwrap();
    let (fp2, err) = start_with_state(&state, &[]);
    assert!(err.contains("WARN") && err.contains("replacing it with a new self-signed certificate"), "{err}");
    assert_ne!(fp1, fp2);
    // A key from another pair (the certificate no longer matches) is replaced too.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let pem = std::fs::read_to_string(&stored).unwrap();
    let cert_part = &pem[pem.find("-----BEGIN CERTIFICATE-----").unwrap()..];
    std::fs::write(&stored, format!("{}{cert_part}", other.signing_key.serialize_pem())).unwrap();
    let (fp3, err) = start_with_state(&state, &[]);
    assert!(err.contains("do not match"), "{err}");
    assert_ne!(fp3, fp2);
    // The replacement is kept.
    let (fp4, err) = start_with_state(&state, &[]);
    assert_eq!(fp4, fp3);
    assert!(!err.contains("replacing"), "{err}");
}

#[test]
fn unwritable_state_dir_is_a_one_line_startup_error() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, "not a directory").unwrap();
    let out = Server::builder(BIN).no_state_dir().arg("--state-dir").arg(blocker.join("state")).run_to_exit();
    out.assert_startup_error(&["cannot store the self-signed certificate", "--ephemeral-cert"]);
}

#[test]
fn relative_access_log_in_config_file_is_relative_to_the_file() {
    let b = Server::builder(BIN).no_access_log().no_root_arg().file("f.txt", "hello");
    let conf = b.dir().join("conf");
    std::fs::create_dir_all(conf.join("logs")).unwrap();
    let cfg = conf.join("ktlsd.toml");
    // ROOT relative too: "../root" from conf/.
    std::fs::write(&cfg, "root = \"../root\"\naccess_log = \"logs/access.log\"\n").unwrap();
    // The server's working directory is the test directory, not conf/.
    let srv = b.arg("--config").arg(&cfg).start();
    assert_eq!(fetch(&srv.url("/f.txt"), &["--http1.1"]).status, 200);
    let log = conf.join("logs/access.log");
    let stopped = srv.stop();
    stopped.assert_clean_exit();
    let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    assert!(text.contains("\"GET /f.txt HTTP/1.1\" 200"), "{text}");
    assert!(!stopped.dir.as_ref().unwrap().path().join("logs").exists());
}

// ---------------------------------------------------------------------------
// Session tickets shared through --ticket-keys.
// ---------------------------------------------------------------------------

fn key_file(dir: &Path, name: &str, seed: u64, len: usize) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, pattern(len, seed)).unwrap();
    p
}

fn server_with_keys(keys: &[&Path]) -> Server {
    let mut b = Server::builder(BIN).file("f.txt", "ticket");
    for k in keys {
        b = b.arg("--ticket-keys").arg(k);
    }
    b.start()
}

/// Connects with `cfg` (whose session store carries tickets between calls), does one
/// GET (so the tickets sent after the handshake are read) and says how it shook hands.
fn handshake(addr: SocketAddr, cfg: &Arc<rustls::ClientConfig>) -> HandshakeKind {
    let mut c = TlsClient::connect_with(addr, cfg.clone()).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    let kind = c.tls.conn.handshake_kind().expect("handshake done");
    let resp = c.get("/f.txt");
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "ticket"));
    kind
}

const VERSIONS: [(&str, &rustls::SupportedProtocolVersion); 2] =
    [("TLS 1.3", &rustls::version::TLS13), ("TLS 1.2", &rustls::version::TLS12)];

#[test]
fn session_made_on_one_instance_resumes_on_another_with_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    let k = key_file(dir.path(), "ticket.key", 1, 80);
    let (a, b) = (server_with_keys(&[&k]), server_with_keys(&[&k]));
    for (name, v) in VERSIONS {
        let cfg = client_config(&[v]);
        assert_eq!(handshake(a.addr(), &cfg), HandshakeKind::Full, "{name}");
        assert_eq!(handshake(b.addr(), &cfg), HandshakeKind::Resumed, "{name}: A's ticket must resume on B");
    }
}

#[test]
fn forty_eight_byte_key_files_work_too() {
    let dir = tempfile::tempdir().unwrap();
    let k = key_file(dir.path(), "ticket.key", 2, 48);
    let (a, b) = (server_with_keys(&[&k]), server_with_keys(&[&k]));
    let cfg = client_config(&[&rustls::version::TLS13]);
    assert_eq!(handshake(a.addr(), &cfg), HandshakeKind::Full);
    assert_eq!(handshake(b.addr(), &cfg), HandshakeKind::Resumed);
}

#[test]
fn different_keys_do_not_resume() {
    let dir = tempfile::tempdir().unwrap();
    let k1 = key_file(dir.path(), "1.key", 3, 80);
    let k2 = key_file(dir.path(), "2.key", 4, 80);
    let (a, b) = (server_with_keys(&[&k1]), server_with_keys(&[&k2]));
    for (name, v) in VERSIONS {
        let cfg = client_config(&[v]);
        assert_eq!(handshake(a.addr(), &cfg), HandshakeKind::Full, "{name}");
        assert_eq!(handshake(b.addr(), &cfg), HandshakeKind::Full, "{name}: B must not open A's ticket");
    }
    // Without --ticket-keys each process has a random key of its own.
    let (c, d) = (server_with_keys(&[]), server_with_keys(&[]));
    let cfg = client_config(&[&rustls::version::TLS13]);
    assert_eq!(handshake(c.addr(), &cfg), HandshakeKind::Full);
    assert_eq!(handshake(d.addr(), &cfg), HandshakeKind::Full);
    let fresh = client_config(&[&rustls::version::TLS13]);
    assert_eq!(handshake(d.addr(), &fresh), HandshakeKind::Full);
    assert_eq!(handshake(d.addr(), &fresh), HandshakeKind::Resumed, "resumption on one instance still works");
}

#[test]
fn rotation_older_key_still_decrypts_first_key_encrypts() {
    let dir = tempfile::tempdir().unwrap();
    let k1 = key_file(dir.path(), "1.key", 5, 80);
    let k2 = key_file(dir.path(), "2.key", 6, 80);
    let (a, b) = (server_with_keys(&[&k1]), server_with_keys(&[&k2, &k1]));
    for (name, v) in VERSIONS {
        let cfg = client_config(&[v]);
        assert_eq!(handshake(a.addr(), &cfg), HandshakeKind::Full, "{name}");
        assert_eq!(handshake(b.addr(), &cfg), HandshakeKind::Resumed, "{name}: B must open A's ticket (k1)");
        // B seals new tickets with k2, which A does not have.
        let fresh = client_config(&[v]);
        assert_eq!(handshake(b.addr(), &fresh), HandshakeKind::Full, "{name}");
        assert_eq!(handshake(a.addr(), &fresh), HandshakeKind::Full, "{name}: A cannot open a k2 ticket");
    }
}

#[test]
fn bad_ticket_key_files_are_one_line_startup_errors() {
    let dir = tempfile::tempdir().unwrap();
    let short = key_file(dir.path(), "short.key", 7, 79);
    let out = Server::builder(BIN).arg("--ticket-keys").arg(&short).run_to_exit();
    out.assert_startup_error(&["ticket key", "short.key", "79 bytes", "openssl rand 80"]);
    let missing = dir.path().join("missing.key");
    let out = Server::builder(BIN).arg("--ticket-keys").arg(&missing).run_to_exit();
    out.assert_startup_error(&["ticket key", "missing.key", "No such file"]);
    // `ktlsd check` refuses it the same way.
    let mut cmd = Command::new(BIN);
    cmd.args(["check", "--ephemeral-cert", "--listen", "127.0.0.1:0", "--ticket-keys"]).arg(&short).arg(dir.path());
    cmd.args(allow_root_args());
    let out = Exited::from(run_with_timeout(cmd.env_remove("KTLSD_LOG"), None, Duration::from_secs(30)));
    out.assert_startup_error(&["ticket key", "79 bytes"]);
}

#[test]
fn ticket_keys_are_reread_on_reload() {
    let dir = tempfile::tempdir().unwrap();
    let k1 = key_file(dir.path(), "1.key", 8, 80);
    let k2 = key_file(dir.path(), "2.key", 9, 80);
    let live = dir.path().join("live.key");
    std::fs::copy(&k1, &live).unwrap();
    let a = server_with_keys(&[&k1]);
    let b = server_with_keys(&[&live]);
    let cfg = client_config(&[&rustls::version::TLS13]);
    assert_eq!(handshake(a.addr(), &cfg), HandshakeKind::Full);
    // B's key file now holds k2: after SIGHUP, A's tickets no longer open on B.
    std::fs::copy(&k2, &live).unwrap();
    b.signal(libc::SIGHUP);
    assert!(b.wait_stderr("reloaded configuration", Duration::from_secs(10)).is_some(), "{}", b.stderr());
    assert_eq!(handshake(b.addr(), &cfg), HandshakeKind::Full);
}

/// A client session store that counts the TLS 1.3 tickets it is given.
#[derive(Debug)]
struct CountingStore {
    inner: rustls::client::ClientSessionMemoryCache,
    tickets: std::sync::atomic::AtomicUsize,
}

impl rustls::client::ClientSessionStore for CountingStore {
    fn set_kx_hint(&self, name: rustls_pki_types::ServerName<'static>, group: rustls::NamedGroup) {
        self.inner.set_kx_hint(name, group)
    }
    fn kx_hint(&self, name: &rustls_pki_types::ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.inner.kx_hint(name)
    }
    fn set_tls12_session(
        &self,
        name: rustls_pki_types::ServerName<'static>,
        v: rustls::client::Tls12ClientSessionValue,
    ) {
        self.inner.set_tls12_session(name, v)
    }
    fn tls12_session(
        &self,
        name: &rustls_pki_types::ServerName<'_>,
    ) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.inner.tls12_session(name)
    }
    fn remove_tls12_session(&self, name: &rustls_pki_types::ServerName<'static>) {
        self.inner.remove_tls12_session(name)
    }
    fn insert_tls13_ticket(
        &self,
        name: rustls_pki_types::ServerName<'static>,
        v: rustls::client::Tls13ClientSessionValue,
    ) {
        self.tickets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.insert_tls13_ticket(name, v)
    }
    fn take_tls13_ticket(
        &self,
        name: &rustls_pki_types::ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        self.inner.take_tls13_ticket(name)
    }
}

/// One TLS 1.3 ticket per connection, full or resumed (rustls's default is two).
#[test]
fn one_ticket_per_tls13_connection() {
    let srv = server_with_keys(&[]);
    let store = Arc::new(CountingStore { inner: rustls::client::ClientSessionMemoryCache::new(8), tickets: 0.into() });
    let mut cfg = (*client_config(&[&rustls::version::TLS13])).clone();
    cfg.resumption = rustls::client::Resumption::store(store.clone());
    let cfg = Arc::new(cfg);
    assert_eq!(handshake(srv.addr(), &cfg), HandshakeKind::Full);
    assert_eq!(store.tickets.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(handshake(srv.addr(), &cfg), HandshakeKind::Resumed);
    assert_eq!(store.tickets.load(std::sync::atomic::Ordering::Relaxed), 2);
}
