//! ACME across a fleet: three ktlsd members with the same ACME site and one
//! `[cluster]` on a real 3-member etcd cluster, against a real pebble.
//!
//! Exactly one order is placed for the name (one member logs that it orders, pebble
//! sees one order), every member then serves the same certificate (the leaf's bytes
//! through each, by openssl s_client), and pebble's http-01 validation, sent to a
//! member that did not place the order, is answered from the fleet's store. With
//! all of etcd stopped, a member restarted serves the certificate from its local
//! copy; a corrupt certificate record in etcd is logged and not used.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use testkit::etcd::Etcd;
use testkit::pebble::{self, Pebble};
use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// A loopback port from the set pebble's own ports come from (never reused).
fn free_port() -> u16 {
    pebble::free_port(false)
}

/// The leaf certificate ktlsd presents for SNI `name`: its issuer and DER bytes.
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

/// A member `name` on `https`/`http` with the ACME site `acme.test` (http-01 at
/// `pebble`) and `[cluster]` on `etcd` under `/fa`, its state in `state`.
fn member(name: &str, etcd: &Etcd, pebble: &Pebble, secret: &Path, state: &Path, https: u16, http: u16) -> Server {
    let b = Server::builder(BIN)
        .listen(&[&format!("127.0.0.1:{https}")])
        .file("f.txt", name)
        .no_state_dir()
        .arg("--state-dir")
        .arg(state);
    let text = format!(
        "http_listen = [\"127.0.0.1:{http}\"]\n[[site]]\nnames = [\"acme.test\"]\nroot = {:?}\n\
         acme = {{ directory = {:?}, challenge = \"http-01\", directory_ca = {:?} }}\n\
         [cluster]\netcd = {}\nname = \"{name}\"\nsecret_file = {:?}\nprefix = \"/fa\"\n",
        b.root().display().to_string(),
        pebble.directory,
        pebble.ca.display().to_string(),
        etcd.toml_endpoints(),
        secret.display().to_string(),
    );
    b.config(&text).start()
}

fn serves_new(srv: &Server, what: &str, pebble: &Pebble) {
    let line = srv.wait_stderr("now serves its new certificate", Duration::from_secs(90));
    assert!(line.is_some(), "{what}: no certificate; ktlsd:\n{}\npebble:\n{}", srv.stderr(), pebble.logs());
}

#[test]
fn one_order_for_the_fleet_any_member_answers_and_each_serves_it() {
    let mut etcd = Etcd::start(3);
    let tmp = tempfile::tempdir().unwrap();
    let secret = tmp.path().join("cluster.key");
    std::fs::write(&secret, [5u8; 32]).unwrap();
    let state = |n: &str| tmp.path().join(n);
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    // pebble validates http-01 at member a's plain-HTTP port.
    let pebble = Pebble::start(ports[0].1, ports[0].0, None);

    // b starts a moment first and so takes the order; a and c start right after.
    let b = member("b", &etcd, &pebble, &secret, &state("b"), ports[1].0, ports[1].1);
    let a = member("a", &etcd, &pebble, &secret, &state("a"), ports[0].0, ports[0].1);
    let mut c = member("c", &etcd, &pebble, &secret, &state("c"), ports[2].0, ports[2].1);
    for (srv, what) in [(&b, "b"), (&a, "a"), (&c, "c")] {
        serves_new(srv, what, &pebble);
    }
    let all3 = |c: &Server| format!("a:\n{}\nb:\n{}\nc:\n{}", a.stderr(), b.stderr(), c.stderr());
    let ordering = [&a, &b, &c].iter().filter(|s| s.stderr().contains("orders the certificate for the fleet")).count();
    assert_eq!(ordering, 1, "exactly one member orders: {}", all3(&c));
    assert!(b.stderr().contains("member b orders the certificate for the fleet"), "{}", all3(&c));
    assert!(b.stderr().contains("the new certificate is stored for the fleet"), "{}", all3(&c));
    assert_eq!(all3(&c).matches("ACME: registered account").count(), 1, "one account: {}", all3(&c));
    let logs = pebble.logs();
    assert_eq!(logs.matches("accounts in memory").count(), 1, "one account at the CA: {logs}");
    assert_eq!(logs.matches("Issued certificate serial").count(), 1, "one certificate issued: {logs}");
    // The validation reached a, which did not order: it answered from the store.
    assert!(!a.stderr().contains("orders the certificate"), "{}", all3(&c));
    assert!(a.stderr().contains("ACME challenge ") && a.stderr().contains(" answered for "), "{}", all3(&c));
    assert!(!b.stderr().contains(" answered for "), "the validation went to a only: {}", all3(&c));

    let (issuer, leaf) = served(ports[1].0, "acme.test");
    assert!(issuer.contains("Pebble"), "issuer {issuer}");
    for (port, who) in [(ports[0].0, "a"), (ports[2].0, "c")] {
        assert_eq!(served(port, "acme.test").1, leaf, "{who} serves the fleet's certificate");
    }
    assert!(etcd.get("/fa/acme/cert/acme.test").is_some_and(|v| !v.windows(5).any(|w| w == b"BEGIN")));

    // All of etcd down: c restarted serves the certificate from its local copy.
    etcd.kill_all();
    drop(c);
    c = member("c", &etcd, &pebble, &secret, &state("c"), ports[2].0, ports[2].1);
    assert_eq!(served(ports[2].0, "acme.test").1, leaf, "c restarted without etcd: {}", c.stderr());
    assert_eq!(served(ports[0].0, "acme.test").1, leaf, "a serves on without etcd");
    assert!(c.wait_stderr("the fleet's store is unreachable", Duration::from_secs(20)).is_some(), "{}", c.stderr());

    // etcd back, with a corrupt certificate record: logged, not used.
    etcd.restart_all();
    etcd.put("/fa/acme/cert/acme.test", b"-----BEGIN CERTIFICATE-----\ngarbage\n");
    let said =
        c.wait_stderr("the fleet's certificate record at /fa/acme/cert/acme.test is unusable", Duration::from_secs(40));
    assert!(said.is_some(), "{}", c.stderr());
    for (port, who) in [(ports[0].0, "a"), (ports[1].0, "b"), (ports[2].0, "c")] {
        assert_eq!(served(port, "acme.test").1, leaf, "{who} keeps the certificate in use");
    }
    assert_eq!(c.stderr().matches("is unusable").count(), 1, "said once: {}", c.stderr());
    assert!(!all3(&c).contains("panicked"), "{}", all3(&c));
}
