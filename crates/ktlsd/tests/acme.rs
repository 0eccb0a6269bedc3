//! ACME end to end: the real ktlsd against a real pebble (`apt-get install
//! pebble`), pebble validating at ktlsd's own ports. tls-alpn-01 and http-01
//! issuance swap pebble's certificate in for the placeholder without a restart;
//! a validation that cannot reach ktlsd leaves the placeholder served and one
//! log line naming the retry.

mod common;

use std::collections::BTreeSet;
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::sync::Mutex;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// pebble and pebble-challtestsrv (its DNS: every name is 127.0.0.1) on loopback,
/// stopped when dropped.
struct Pebble {
    children: Vec<Child>,
    directory: String,
    ca: PathBuf,
    dir: tempfile::TempDir,
}

/// A loopback port free now and never handed out before in this process: the
/// tests' ktlsd and pebbles take theirs only later, so a port released by one
/// test must not be given to another meanwhile.
fn free_port(udp: bool) -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let tcp = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = tcp.local_addr().expect("address").port();
        let usable = !udp || UdpSocket::bind(("127.0.0.1", port)).is_ok();
        if usable && GIVEN.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return port;
        }
    }
}

impl Pebble {
    /// Validates http-01 at 127.0.0.1:`http_port` and tls-alpn-01 at 127.0.0.1:`tls_port`.
    fn start(http_port: u16, tls_port: u16) -> Pebble {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "ktlsd test CA for pebble");
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let leaf_key = rcgen::KeyPair::generate().expect("key");
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("params")
            .signed_by(&leaf_key, &issuer)
            .expect("certificate");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, ca_cert.pem()).unwrap();
        std::fs::write(dir.path().join("cert.pem"), leaf.pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), leaf_key.serialize_pem()).unwrap();
        let (listen, dns, dns_management) = (free_port(false), free_port(true), free_port(false));
        let config = serde_json::json!({"pebble": {
            "listenAddress": format!("127.0.0.1:{listen}"),
            "managementListenAddress": format!("127.0.0.1:{}", free_port(false)),
            "certificate": dir.path().join("cert.pem"),
            "privateKey": dir.path().join("key.pem"),
            "httpPort": http_port,
            "tlsPort": tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
        }});
        let config_path = dir.path().join("pebble.json");
        std::fs::write(&config_path, config.to_string()).unwrap();
        let dns_addr = format!("127.0.0.1:{dns}");
        let spawn = |program: &str, args: Vec<String>, log: &str| {
            let out = std::fs::File::create(dir.path().join(log)).expect("log");
            Command::new(program)
                .args(args)
                .env("PEBBLE_VA_NOSLEEP", "1")
                .env("PEBBLE_WFE_NONCEREJECT", "0")
                .stdin(Stdio::null())
                .stdout(out.try_clone().expect("log"))
                .stderr(out)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {program} ({e}): apt-get install pebble (scripts/test installs it)"))
        };
        let challtestsrv = [
            "-http01", "", "-https01", "", "-tlsalpn01", "", "-dns01", &dns_addr,
            "-management", &format!("127.0.0.1:{dns_management}"), "-defaultIPv4", "127.0.0.1", "-defaultIPv6", "",
        ];
        let children = vec![
            spawn("pebble-challtestsrv", challtestsrv.iter().map(|s| s.to_string()).collect(), "challtestsrv.log"),
            spawn("pebble", vec!["-config".into(), config_path.display().to_string(), "-dnsserver".into(), dns_addr.clone()], "pebble.log"),
        ];
        let pebble = Pebble { children, directory: format!("https://127.0.0.1:{listen}/dir"), ca, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        for port in [listen, dns_management] {
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(Instant::now() < deadline, "pebble not listening on {port}; logs:\n{}", pebble.logs());
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        pebble
    }

    fn logs(&self) -> String {
        ["challtestsrv.log", "pebble.log"].iter().map(|f| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default()).collect()
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The issuer of the certificate ktlsd presents for SNI `name`.
fn issuer(port: u16, name: &str) -> String {
    let out = run_with_timeout(
        Command::new("openssl").args(["s_client", "-connect", &format!("127.0.0.1:{port}"), "-servername", name]),
        Some(b""),
        Duration::from_secs(20),
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (Some(a), Some(b)) = (text.find("-----BEGIN CERTIFICATE-----"), text.find("-----END CERTIFICATE-----")) else {
        panic!("no certificate from s_client: {text}{}", String::from_utf8_lossy(&out.stderr))
    };
    use rustls::pki_types::pem::PemObject;
    let der = rustls::pki_types::CertificateDer::from_pem_slice(&text.as_bytes()[a..b + 25]).expect("PEM");
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).expect("certificate");
    cert.issuer().to_string()
}

/// ktlsd on `https_port`/`http_port` with one ACME site `acme.test` at `pebble`.
fn ktlsd(pebble: &Pebble, https_port: u16, http_port: u16, challenge: &str) -> Server {
    let b = Server::builder().listen(&[&format!("127.0.0.1:{https_port}")]).file("f.txt", "acme site");
    let cfg = b.dir().join("ktlsd.toml");
    std::fs::write(
        &cfg,
        format!(
            "http_listen = [\"127.0.0.1:{http_port}\"]\n[[site]]\nnames = [\"acme.test\"]\nroot = {:?}\n\
             acme = {{ directory = {:?}, challenge = {challenge:?}, directory_ca = {:?} }}\n",
            b.root().display().to_string(),
            pebble.directory,
            pebble.ca.display().to_string()
        ),
    )
    .unwrap();
    b.arg("--config").arg(&cfg).start()
}

fn issued(srv: &Server, pebble: &Pebble, port: u16) {
    let placeholder = issuer(port, "acme.test");
    let line = srv.wait_stderr("now serves its new certificate", Duration::from_secs(90));
    assert!(line.is_some(), "no certificate issued; ktlsd:\n{}\npebble:\n{}", srv.stderr(), pebble.logs());
    let now = issuer(port, "acme.test");
    assert!(now.contains("Pebble"), "issuer {now:?} (placeholder's {placeholder:?})");
    assert!(!placeholder.contains("Pebble"), "placeholder issued by {placeholder:?}");
    assert!(srv.dir().join("state/acme").is_dir(), "no STATE_DIR/acme");
}

#[test]
fn tls_alpn_01_issues_and_swaps_the_certificate() {
    let (https, http) = (free_port(false), free_port(false));
    let pebble = Pebble::start(http, https);
    let srv = ktlsd(&pebble, https, http, "tls-alpn-01");
    issued(&srv, &pebble, https);
    assert!(srv.stderr().contains("tls-alpn-01 validation handshake"), "{}", srv.stderr());
}

#[test]
fn http_01_issues_through_the_port_80_listener() {
    let (https, http) = (free_port(false), free_port(false));
    let pebble = Pebble::start(http, https);
    let srv = ktlsd(&pebble, https, http, "http-01");
    issued(&srv, &pebble, https);
    assert!(srv.stderr().contains("ACME challenge"), "{}", srv.stderr());
}

#[test]
fn an_unreachable_validation_keeps_the_placeholder_and_logs_the_retry() {
    let (https, http, nowhere) = (free_port(false), free_port(false), free_port(false));
    // pebble validates http-01 at a port nobody listens on.
    let pebble = Pebble::start(nowhere, nowhere);
    let srv = ktlsd(&pebble, https, http, "http-01");
    let line = srv.wait_stderr("not obtained", Duration::from_secs(90));
    let line = line.unwrap_or_else(|| panic!("no failure line; ktlsd:\n{}\npebble:\n{}", srv.stderr(), pebble.logs()));
    assert!(line.contains("acme.test") && line.contains("retrying in") && line.contains("placeholder"), "{line}");
    assert_eq!(srv.stderr().matches("not obtained").count(), 1);
    assert!(!issuer(https, "acme.test").contains("Pebble"));
}
