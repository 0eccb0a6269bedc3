//! ACME end to end: the real ktlsd against a real pebble (`apt-get install
//! pebble`), pebble validating at ktlsd's own ports. tls-alpn-01 and http-01
//! issuance swap pebble's certificate in for the placeholder without a restart;
//! the running server renews before expiry; a reload keeps an issued
//! certificate; a validation that cannot reach ktlsd leaves the placeholder
//! served and one log line naming the retry.

use std::process::Command;
use std::time::{Duration, Instant};

use testkit::pebble::{self, Pebble};
use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// A loopback port for a test's ktlsd, from the same never-reused set as the
/// pebbles' own ports, so a ktlsd and a pebble starting alongside never share one.
fn free_port() -> u16 {
    pebble::free_port(false)
}

/// The certificate ktlsd presents for SNI `name`: its issuer and its DER bytes.
fn served(port: u16, name: &str) -> (String, Vec<u8>) {
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
    (cert.issuer().to_string(), der.as_ref().to_vec())
}

/// The issuer of the certificate ktlsd presents for SNI `name`.
fn issuer(port: u16, name: &str) -> String {
    served(port, name).0
}

/// ktlsd on `https_port`/`http_port` with one ACME site `acme.test` at `pebble`.
fn ktlsd(pebble: &Pebble, https_port: u16, http_port: u16, challenge: &str) -> Server {
    let b = Server::builder(BIN).listen(&[&format!("127.0.0.1:{https_port}")]).file("f.txt", "acme site");
    let text = format!(
        "http_listen = [\"127.0.0.1:{http_port}\"]\n[[site]]\nnames = [\"acme.test\"]\nroot = {:?}\n\
         acme = {{ directory = {:?}, challenge = {challenge:?}, directory_ca = {:?} }}\n",
        b.root().display().to_string(),
        pebble.directory,
        pebble.ca.display().to_string()
    );
    b.config(&text).start()
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
    let (https, http) = (free_port(), free_port());
    let pebble = Pebble::start(http, https, None);
    let srv = ktlsd(&pebble, https, http, "tls-alpn-01");
    issued(&srv, &pebble, https);
    assert!(srv.stderr().contains("tls-alpn-01 validation handshake"), "{}", srv.stderr());
}

#[test]
fn http_01_issues_through_the_port_80_listener() {
    let (https, http) = (free_port(), free_port());
    let pebble = Pebble::start(http, https, None);
    let srv = ktlsd(&pebble, https, http, "http-01");
    issued(&srv, &pebble, https);
    assert!(srv.stderr().contains("ACME challenge"), "{}", srv.stderr());
}

#[test]
fn an_unreachable_validation_keeps_the_placeholder_and_logs_the_retry() {
    let (https, http, nowhere) = (free_port(), free_port(), free_port());
    // pebble validates http-01 at a port nobody listens on.
    let pebble = Pebble::start(nowhere, nowhere, None);
    let srv = ktlsd(&pebble, https, http, "http-01");
    let line = srv.wait_stderr("not obtained", Duration::from_secs(90));
    let line = line.unwrap_or_else(|| panic!("no failure line; ktlsd:\n{}\npebble:\n{}", srv.stderr(), pebble.logs()));
    assert!(line.contains("acme.test") && line.contains("retrying in") && line.contains("placeholder"), "{line}");
    assert_eq!(srv.stderr().matches("not obtained").count(), 1);
    assert!(!issuer(https, "acme.test").contains("Pebble"));
}

/// A certificate is renewed by the running server before it expires (at about
/// two thirds of its life: pebble issues 9-second certificates here), and the
/// renewed one is served without a restart.
#[test]
fn the_running_server_renews_before_expiry() {
    let (https, http) = (free_port(), free_port());
    let pebble = Pebble::start(http, https, Some(Duration::from_secs(9)));
    let srv = ktlsd(&pebble, https, http, "tls-alpn-01");
    issued(&srv, &pebble, https);
    let first = served(https, "acme.test").1;
    let deadline = Instant::now() + Duration::from_secs(60);
    while srv.stderr().matches("now serves its new certificate").count() < 2 {
        assert!(Instant::now() < deadline, "no renewal; ktlsd:\n{}\npebble:\n{}", srv.stderr(), pebble.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    let (issuer, renewed) = served(https, "acme.test");
    assert!(issuer.contains("Pebble"), "{issuer}");
    assert_ne!(renewed, first, "the renewed certificate is not the one served");
}

/// A reload that leaves an ACME site unchanged keeps serving its issued
/// certificate: no placeholder in between, no new order.
#[test]
fn a_reload_keeps_an_unchanged_acme_sites_certificate() {
    let (https, http) = (free_port(), free_port());
    let pebble = Pebble::start(http, https, None);
    let srv = ktlsd(&pebble, https, http, "http-01");
    issued(&srv, &pebble, https);
    let before = served(https, "acme.test").1;
    srv.signal(libc::SIGHUP);
    assert!(srv.wait_stderr("reloaded configuration", Duration::from_secs(20)).is_some(), "{}", srv.stderr());
    assert_eq!(served(https, "acme.test").1, before, "{}", srv.stderr());
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(srv.stderr().matches("now serves its new certificate").count(), 1, "{}", srv.stderr());
    assert_eq!(served(https, "acme.test").1, before);
}
