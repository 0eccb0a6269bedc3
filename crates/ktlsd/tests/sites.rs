//! Several sites on one listener, with real clients: `openssl s_client
//! -servername` gets each site's certificate (exact names, wildcards, the default
//! site's for unknown names, an `unrecognized_name` alert with
//! `unknown_sni = "refuse"`), curl `--resolve` gets each site's files by Host,
//! a Host naming no site goes to the default site or gets 421, and a reload adds
//! a site.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// A `[[site]]` block serving DIR/LABEL (created, holding `f.txt` = LABEL) with
/// its own certificate; returns the block and the certificate's fingerprint.
fn site(dir: &Path, label: &str, names: &[&str]) -> (String, String) {
    let root = dir.join(label);
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("f.txt"), label).unwrap();
    let (c, k, fp) = cert_for(dir, label, names);
    let names: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    let block = format!(
        "[[site]]\nnames = [{}]\nroot = {:?}\ncert = {:?}\nkey = {:?}\n",
        names.join(", "),
        root.display().to_string(),
        c.display().to_string(),
        k.display().to_string()
    );
    (block, fp)
}

/// What `openssl s_client` gets for SNI `name`: the certificate's fingerprint,
/// or the client's output when the handshake failed.
fn s_client(port: u16, name: &str) -> Result<String, String> {
    let out = run_with_timeout(
        Command::new("openssl").args(["s_client", "-connect", &format!("127.0.0.1:{port}"), "-servername", name]),
        Some(b""),
        Duration::from_secs(20),
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let Some(start) = text.find("-----BEGIN CERTIFICATE-----") else { return Err(text) };
    let end = text.find("-----END CERTIFICATE-----").ok_or_else(|| text.clone())? + "-----END CERTIFICATE-----".len();
    use rustls::pki_types::pem::PemObject;
    let der = rustls::pki_types::CertificateDer::from_pem_slice(&text.as_bytes()[start..end])
        .map_err(|e| format!("{e:?}"))?;
    use sha2::{Digest, Sha256};
    Ok(Sha256::digest(der.as_ref()).iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(":"))
}

/// curl for `https://NAME:PORT/PATH` connected to the server (SNI NAME), with
/// `host` as the Host header when given; returns (status, body).
fn curl(port: u16, name: &str, path: &str, host: Option<&str>) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sk", "--max-time", "15", "-w", "\n%{http_code}", "--resolve", &format!("{name}:{port}:127.0.0.1")]);
    if let Some(h) = host {
        cmd.args(["-H", &format!("Host: {h}")]);
    }
    cmd.arg(format!("https://{name}:{port}{path}"));
    let out = run_with_timeout(&mut cmd, None, Duration::from_secs(20));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

fn start(config: &str, dir_setup: impl FnOnce(&Path) -> String) -> (Server, String) {
    let b = Server::builder(BIN).file("f.txt", "default");
    let extra = dir_setup(b.dir());
    let srv = b.config(&format!("{config}{extra}")).start();
    let default_fp = srv
        .stderr()
        .lines()
        .find_map(|l| l.split("SHA-256 fingerprint ").nth(1).map(|r| r.split(',').next().unwrap_or("").to_string()))
        .unwrap_or_default();
    (srv, default_fp)
}

#[test]
fn each_site_gets_its_certificate_and_files_by_name() {
    let mut fps = Vec::new();
    let (srv, default_fp) = start("", |d| {
        let (a, fa) = site(d, "a", &["a.test"]);
        let (w, fw) = site(d, "w", &["*.w.test", "w.test"]);
        fps.push(fa);
        fps.push(fw);
        format!("{a}{w}")
    });
    let port = srv.port();
    let (fa, fw) = (&fps[0], &fps[1]);
    assert!(!default_fp.is_empty(), "no fingerprint in the start-up line: {}", srv.stderr());
    for (name, want) in [
        ("a.test", fa),
        ("A.TEST", fa),
        ("x.w.test", fw),
        ("w.test", fw),
        ("other.test", &default_fp),
        ("x.y.w.test", &default_fp),
    ] {
        assert_eq!(&s_client(port, name).unwrap_or_else(|e| panic!("{name}: {e}")), want, "certificate for {name}");
    }
    for (name, want) in [("a.test", "a"), ("x.w.test", "w"), ("other.test", "default")] {
        assert_eq!(curl(port, name, "/f.txt", None), (200, want.to_string()), "{name}");
    }
    // Host, not SNI, picks the files; an unknown Host goes to the default site.
    assert_eq!(curl(port, "a.test", "/f.txt", Some(&format!("x.w.test:{port}"))), (200, "w".into()));
    assert_eq!(curl(port, "a.test", "/f.txt", Some("nowhere.test")), (200, "default".into()));
}

#[test]
fn unknown_names_are_refused_when_configured() {
    let (srv, _) = start("unknown_sni = \"refuse\"\n", |d| site(d, "a", &["a.test"]).0);
    let port = srv.port();
    let refused = s_client(port, "other.test").expect_err("handshake for an unknown name succeeded");
    assert!(refused.contains("unrecognized name"), "no unrecognized_name alert: {refused}");
    assert!(s_client(port, "a.test").is_ok());
    assert_eq!(curl(port, "a.test", "/f.txt", None), (200, "a".into()));
    let (status, _) = curl(port, "a.test", "/f.txt", Some("nowhere.test"));
    assert_eq!(status, 421);
    // A client that connects by address sends no server name and a Host that is an
    // address: it gets the default site, as its handshake got the default certificate.
    assert_eq!(curl(port, "127.0.0.1", "/f.txt", None), (200, "default".into()));
    assert_eq!(curl(port, "a.test", "/f.txt", Some(&format!("[::1]:{port}"))), (200, "default".into()));
}

#[test]
fn a_reload_adds_a_site() {
    let (srv, default_fp) = start("", |d| site(d, "a", &["a.test"]).0);
    let port = srv.port();
    assert_eq!(s_client(port, "b.test").as_ref(), Ok(&default_fp));
    assert_eq!(curl(port, "b.test", "/f.txt", None), (200, "default".into()));

    let cfg = srv.dir().join("ktlsd.toml");
    let (a, _) = site(srv.dir(), "a", &["a.test"]);
    let (b, fb) = site(srv.dir(), "b", &["b.test"]);
    std::fs::write(&cfg, format!("{a}{b}")).unwrap();
    srv.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !srv.stderr().contains("reloaded configuration") {
        assert!(!srv.stderr().contains("reload failed"), "{}", srv.stderr());
        assert!(Instant::now() < deadline, "no reload line: {}", srv.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(s_client(port, "b.test"), Ok(fb));
    assert_eq!(curl(port, "b.test", "/f.txt", None), (200, "b".into()));
    assert_eq!(curl(port, "a.test", "/f.txt", None), (200, "a".into()));
}

#[test]
fn check_refuses_bad_sites_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("www")).unwrap();
    let (a, _) = site(d, "a", &["a.test"]);
    let (dup, _) = site(d, "b", &["b.test", "A.test"]);
    let nokey = "[[site]]\nnames = [\"c.test\"]\nroot = \"www\"\ncert = \"a.crt\"\n";
    let badname = "[[site]]\nnames = [\"a b\"]\nroot = \"www\"\n";
    let noroot = "[[site]]\nnames = [\"d.test\"]\nroot = \"missing\"\n";
    for (body, want) in [
        (format!("{a}{dup}"), "name a.test is also in site 1"),
        (nokey.to_string(), "cert was given without key"),
        (badname.to_string(), "is not a DNS name"),
        (noroot.to_string(), "root"),
        ("unknown_sni = \"maybe\"\n".to_string(), "unknown_sni \"maybe\": expected default or refuse"),
    ] {
        let cfg = d.join("ktlsd.toml");
        std::fs::write(&cfg, &body).unwrap();
        let out = run_with_timeout(
            Command::new(BIN)
                .args(["check", "--config"])
                .arg(&cfg)
                .args(["--ephemeral-cert", "--listen", "127.0.0.1:0"])
                .args(allow_root_args())
                .arg(d.join("www")),
            None,
            Duration::from_secs(20),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{body}: accepted");
        assert!(err.contains(want), "{body}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    let cfg = d.join("ktlsd.toml");
    std::fs::write(&cfg, format!("{a}{}", site(d, "b", &["b.test", "*.b.test"]).0)).unwrap();
    let out = run_with_timeout(
        Command::new(BIN)
            .args(["check", "--config"])
            .arg(&cfg)
            .args(["--ephemeral-cert", "--listen", "127.0.0.1:0"])
            .args(allow_root_args())
            .arg(d.join("www")),
        None,
        Duration::from_secs(20),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A site without cert and key gets a self-signed certificate for its names, kept
/// in the state directory: the same fingerprint after a reload and a restart.
#[test]
fn a_sites_self_signed_certificate_is_kept() {
    let state = tempfile::tempdir().unwrap();
    let block = |d: &Path| {
        std::fs::create_dir_all(d.join("s")).unwrap();
        std::fs::write(d.join("s/f.txt"), "s").unwrap();
        format!("[[site]]\nnames = [\"s.test\", \"*.s.test\"]\nroot = {:?}\n", d.join("s").display().to_string())
    };
    let start_with_state = || {
        let b = Server::builder(BIN).file("f.txt", "default").no_state_dir();
        let text = block(b.dir());
        b.config(&text).arg("--state-dir").arg(state.path()).start()
    };
    let srv = start_with_state();
    let first = s_client(srv.port(), "x.s.test").expect("handshake");
    assert!(state.path().join("self-signed-s.test.pem").exists(), "{}", srv.stderr());
    srv.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !srv.stderr().contains("reloaded configuration") {
        assert!(Instant::now() < deadline, "no reload line: {}", srv.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(s_client(srv.port(), "s.test").as_ref(), Ok(&first), "after a reload");
    srv.stop().assert_clean_exit();
    let again = start_with_state();
    assert_eq!(s_client(again.port(), "s.test"), Ok(first), "after a restart");
    assert_eq!(curl(again.port(), "s.test", "/f.txt", None), (200, "s".into()));
}
