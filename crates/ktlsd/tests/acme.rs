//! ACME end to end: the real ktlsd against a real pebble (`apt-get install
//! pebble`), pebble validating at ktlsd's own ports. tls-alpn-01 and http-01
//! issuance swap pebble's certificate in for the placeholder without a restart;
//! the running server renews before expiry; a reload keeps an issued
//! certificate; a validation that cannot reach ktlsd leaves the placeholder
//! served and one log line naming the retry. dns-01 through an operator's hook
//! (pebble-challtestsrv holds the TXT records) issues a wildcard certificate; a CA
//! requiring External Account Binding issues to sites that give `eab`, and two sites
//! of one CA register one account between them.

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

/// An executable dns-01 hook in `dir` that logs its arguments to `dir/hook.log` and sets or
/// clears the TXT record through pebble-challtestsrv's management API.
fn dns_hook(dir: &std::path::Path, pebble: &Pebble) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let hook = dir.join("dns-hook");
    let api = format!("http://127.0.0.1:{}", pebble.dns_management);
    let script = format!(
        "#!/bin/sh\nset -e\necho \"$1 $2 $3\" >> {log}\ncase $1 in\n\
         set) curl -sSf -d \"{{\\\"host\\\":\\\"$2.\\\",\\\"value\\\":\\\"$3\\\"}}\" {api}/set-txt ;;\n\
         clear) curl -sSf -d \"{{\\\"host\\\":\\\"$2.\\\"}}\" {api}/clear-txt ;;\n\
         *) exit 2 ;;\nesac\n",
        log = dir.join("hook.log").display()
    );
    std::fs::write(&hook, script).expect("write hook");
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).expect("chmod hook");
    hook
}

#[test]
fn dns_01_through_a_hook_issues_a_wildcard_certificate() {
    let (https, nowhere) = (free_port(), free_port());
    // pebble never reaches ktlsd's ports: only the DNS answer can validate.
    let pebble = Pebble::start(nowhere, nowhere, None);
    let b = Server::builder(BIN).listen(&[&format!("127.0.0.1:{https}")]).file("f.txt", "wildcard site");
    let hook = dns_hook(b.dir(), &pebble);
    let text = format!(
        "[[site]]\nnames = [\"dns.test\", \"*.dns.test\"]\nroot = {:?}\n\
         acme = {{ directory = {:?}, challenge = \"dns-01\", dns_hook = {:?}, dns_propagation = \"100ms\", directory_ca = {:?} }}\n",
        b.root().display().to_string(),
        pebble.directory,
        hook.display().to_string(),
        pebble.ca.display().to_string()
    );
    let srv = b.config(&text).start();
    let line = srv.wait_stderr("now serves its new certificate", Duration::from_secs(90));
    assert!(line.is_some(), "no certificate issued; ktlsd:\n{}\npebble:\n{}", srv.stderr(), pebble.logs());
    for name in ["dns.test", "www.dns.test", "any.dns.test"] {
        assert!(issuer(https, name).contains("Pebble"), "{name}: {}", srv.stderr());
    }
    let log = srv.dir().join("hook.log");
    let deadline = Instant::now() + Duration::from_secs(20);
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    while read().matches("clear ").count() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let calls = read();
    // One record per name, both at the base name's _acme-challenge, each cleared afterwards.
    assert_eq!(calls.matches("set _acme-challenge.dns.test ").count(), 2, "{calls}");
    assert_eq!(calls.matches("clear _acme-challenge.dns.test ").count(), 2, "{calls}");
    assert!(
        srv.dir().join("state/acme/_.dns.test.pem").is_file() || srv.dir().join("state/acme/dns.test.pem").is_file()
    );
}

#[test]
fn a_failing_dns_hook_is_reported_and_retried() {
    use std::os::unix::fs::PermissionsExt;
    let (https, nowhere) = (free_port(), free_port());
    let pebble = Pebble::start(nowhere, nowhere, None);
    let b = Server::builder(BIN).listen(&[&format!("127.0.0.1:{https}")]).file("f.txt", "x");
    let hook = b.dir().join("failing-hook");
    std::fs::write(&hook, "#!/bin/sh\necho 'provider said no' >&2\nexit 7\n").expect("write hook");
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let text = format!(
        "[[site]]\nnames = [\"fail.test\"]\nroot = {:?}\n\
         acme = {{ directory = {:?}, challenge = \"dns-01\", dns_hook = {:?}, directory_ca = {:?} }}\n",
        b.root().display().to_string(),
        pebble.directory,
        hook.display().to_string(),
        pebble.ca.display().to_string()
    );
    let srv = b.config(&text).start();
    let line = srv.wait_stderr("not obtained", Duration::from_secs(60));
    let line = line.unwrap_or_else(|| panic!("no failure line; ktlsd:\n{}", srv.stderr()));
    assert!(line.contains("failing-hook set _acme-challenge.fail.test failed (exit status: 7)"), "{line}");
    assert!(line.contains("retrying in"), "{line}");
    assert!(srv.stderr().contains("provider said no"), "{}", srv.stderr());
}

/// pebble's EAB key for the tests (a random 256-bit key, base64url).
const EAB_KID: &str = "kid-ktlsd";
const EAB_KEY: &str = "zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W";

/// ktlsd with two http-01 sites at `pebble`, each with `eab` (`, eab = {...}` or ""); the
/// environment has the EAB key as TEST_EAB_KEY, as an operator keeps secrets out of the file.
fn two_sites(pebble: &Pebble, https: u16, http: u16, eab: &str) -> Server {
    let b = Server::builder(BIN).listen(&[&format!("127.0.0.1:{https}")]).env("TEST_EAB_KEY", EAB_KEY);
    let root = b.root().display().to_string();
    let mut text = format!("http_listen = [\"127.0.0.1:{http}\"]\n");
    for name in ["one.test", "two.test"] {
        text += &format!(
            "[[site]]\nnames = [\"{name}\"]\nroot = {root:?}\n\
             acme = {{ directory = {:?}, challenge = \"http-01\", directory_ca = {:?}{eab} }}\n",
            pebble.directory,
            pebble.ca.display().to_string()
        );
    }
    b.config(&text).start()
}

#[test]
fn external_account_binding_and_one_account_for_two_sites() {
    let (https, http) = (free_port(), free_port());
    let options = pebble::Options { eab: vec![(EAB_KID.into(), EAB_KEY.into())] };
    let pebble = Pebble::start_with(http, https, None, &options);
    let eab = format!(", eab = {{ kid = {EAB_KID:?}, hmac_key = \"${{TEST_EAB_KEY}}\" }}");
    let srv = two_sites(&pebble, https, http, &eab);
    let deadline = Instant::now() + Duration::from_secs(90);
    while srv.stderr().matches("now serves its new certificate").count() < 2 {
        assert!(Instant::now() < deadline, "not issued; ktlsd:\n{}\npebble:\n{}", srv.stderr(), pebble.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(issuer(https, "one.test").contains("Pebble") && issuer(https, "two.test").contains("Pebble"));
    // Both sites started at once; one account was registered and stored.
    assert_eq!(srv.stderr().matches("ACME: registered account").count(), 1, "{}", srv.stderr());
    assert_eq!(pebble.logs().matches("accounts in memory").count(), 1, "{}", pebble.logs());
    let accounts: Vec<_> = std::fs::read_dir(srv.dir().join("state/acme"))
        .expect("state/acme")
        .filter_map(|e| e.ok()?.file_name().into_string().ok().filter(|n| n.starts_with("account")))
        .collect();
    assert_eq!(accounts.len(), 1, "{accounts:?}");

    // The same CA without EAB refuses the account, and the error says so.
    let (https2, http2) = (free_port(), free_port());
    let other = Pebble::start_with(http2, https2, None, &options);
    let srv = two_sites(&other, https2, http2, "");
    let line = srv.wait_stderr("not obtained", Duration::from_secs(60));
    let line = line.unwrap_or_else(|| panic!("no failure line; ktlsd:\n{}", srv.stderr()));
    assert!(line.contains("registering the account failed") && line.contains("xternal"), "{line}");
}
