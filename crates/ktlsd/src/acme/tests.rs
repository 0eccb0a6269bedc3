//! The ACME client against a real pebble: issuance by http-01 and by tls-alpn-01
//! (with minimal responders answering from [`Challenges`]), reuse of the stored
//! account and certificate, renewal, and a validation nobody answers.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use testkit::pebble::Pebble;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// An http-01 responder on 127.0.0.1: answers `/.well-known/acme-challenge/TOKEN` from
/// `challenges`, 404 otherwise. Returns its port.
async fn http01_responder(challenges: Arc<Challenges>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else { return };
            let challenges = Arc::clone(&challenges);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let path = head.split(' ').nth(1).unwrap_or("");
                let answer = path.strip_prefix(HTTP01_PATH_PREFIX).and_then(|t| challenges.http01(t));
                let response = match answer {
                    Some(body) => {
                        format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
                    }
                    None => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string(),
                };
                let _ = sock.write_all(response.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    port
}

#[derive(Debug)]
struct AlpnResolver(Arc<Challenges>);

impl rustls::server::ResolvesServerCert for AlpnResolver {
    fn resolve(&self, hello: rustls::server::ClientHello<'_>) -> Option<Arc<rustls::sign::CertifiedKey>> {
        self.0.for_client_hello(&hello)
    }
}

/// A tls-alpn-01 responder on 127.0.0.1: a rustls listener that completes handshakes
/// offering `acme-tls/1` with the validation certificate, then closes. Returns its port.
fn tls_alpn01_responder(challenges: Arc<Challenges>) -> u16 {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(AlpnResolver(challenges)));
    config.alpn_protocols = vec![ACME_TLS_ALPN.to_vec()];
    let config = Arc::new(config);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    // Blocking handshakes on a thread of their own; it lives as long as the test process.
    std::thread::spawn(move || {
        for sock in listener.incoming() {
            let Ok(mut sock) = sock else { continue };
            let config = Arc::clone(&config);
            std::thread::spawn(move || {
                let _ = sock.set_read_timeout(Some(Duration::from_secs(10)));
                let Ok(mut conn) = rustls::ServerConnection::new(config) else { return };
                while conn.is_handshaking() {
                    if conn.complete_io(&mut sock).is_err() {
                        return;
                    }
                }
                conn.send_close_notify();
                let _ = conn.complete_io(&mut sock);
            });
        }
    });
    port
}

fn settings(pebble: &Pebble, challenge: Challenge, names: &[&str], state_dir: &Path) -> AcmeSettings {
    AcmeSettings {
        directory: pebble.directory.clone(),
        email: Some("admin@example.com".into()),
        challenge,
        names: names.iter().map(|n| n.to_string()).collect(),
        state_dir: state_dir.to_path_buf(),
        directory_ca: Some(pebble.ca.clone()),
        dns_hook: None,
        eab: None,
    }
}

/// The account file of `pebble` in `state_dir`.
fn account_file(state_dir: &Path, pebble: &Pebble) -> std::path::PathBuf {
    super::store::account_path(state_dir, &pebble.directory)
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
}

/// What every issued certificate must be: for the names, chained, valid now, stored.
fn check_issued(issued: &Issued, names: &[&str], state_dir: &Path) {
    let mut want: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    want.sort();
    assert_eq!(issued.names(), want);
    assert!(issued.chain.len() >= 2, "leaf and pebble's intermediate");
    assert!(issued.valid_at(SystemTime::now()));
    issued.certified_key().expect("usable by rustls");
    let file = state_dir.join(format!("{}.pem", names[0]));
    assert_eq!(std::fs::read_to_string(&file).expect("stored"), issued.pem());
    assert_eq!(mode(&file), 0o600);
    let accounts: Vec<_> = std::fs::read_dir(state_dir)
        .expect("state directory")
        .filter_map(|e| Some(e.ok()?.path()).filter(|p| p.to_string_lossy().ends_with(".json")))
        .collect();
    assert_eq!(accounts.len(), 1, "{accounts:?}");
    assert_eq!(mode(&accounts[0]), 0o600);
    assert_eq!(mode(state_dir), 0o700);
}

#[tokio::test]
async fn obtains_a_certificate_by_http01() {
    let challenges = Challenges::new();
    let http = http01_responder(Arc::clone(&challenges)).await;
    let pebble = Pebble::start(http, 1, None);
    let state = tempfile::tempdir().expect("tempdir");
    let dir = state.path().join("acme");
    let names = ["www.example.com", "example.com"];
    let acme =
        Acme::new(settings(&pebble, Challenge::Http01, &names, &dir), Arc::clone(&challenges)).expect("settings");
    let issued = acme.obtain().await.unwrap_or_else(|e| panic!("{e}\n{}", pebble.logs()));
    check_issued(&issued, &names, &dir);
    // The answers were withdrawn once validated.
    assert!(challenges.is_empty());
}

#[tokio::test]
async fn obtains_a_certificate_by_tls_alpn01() {
    let challenges = Challenges::new();
    let tls = tls_alpn01_responder(Arc::clone(&challenges));
    let pebble = Pebble::start(1, tls, None);
    let state = tempfile::tempdir().expect("tempdir");
    let dir = state.path().join("acme");
    let names = ["alpn.example.com"];
    let acme =
        Acme::new(settings(&pebble, Challenge::TlsAlpn01, &names, &dir), Arc::clone(&challenges)).expect("settings");
    let issued = acme.obtain().await.unwrap_or_else(|e| panic!("{e}\n{}", pebble.logs()));
    check_issued(&issued, &names, &dir);
    assert!(challenges.is_empty());
}

#[tokio::test]
async fn a_second_run_reuses_the_stored_account_and_certificate() {
    let challenges = Challenges::new();
    let http = http01_responder(Arc::clone(&challenges)).await;
    let pebble = Pebble::start(http, 1, None);
    let state = tempfile::tempdir().expect("tempdir");
    let names = ["kept.example.com"];
    let first = Acme::new(settings(&pebble, Challenge::Http01, &names, state.path()), Arc::clone(&challenges))
        .expect("settings");
    let (issued, source) = first.certificate().await.unwrap_or_else(|e| panic!("{e}\n{}", pebble.logs()));
    assert_eq!(source, Source::Issued);
    let account = std::fs::read(account_file(state.path(), &pebble)).expect("account stored");

    // A new start: the valid certificate comes from the state directory, no order.
    let second = Acme::new(settings(&pebble, Challenge::Http01, &names, state.path()), Arc::clone(&challenges))
        .expect("settings");
    let (again, source) = second.certificate().await.expect("stored certificate");
    assert_eq!(source, Source::Stored);
    assert_eq!(again.chain, issued.chain);
    assert_eq!(again.pem(), issued.pem());

    // An order from the second start uses the stored account: the file is unchanged
    // (a new registration would write a new key), and the certificate is a new one.
    let renewed = second.obtain().await.unwrap_or_else(|e| panic!("{e}\n{}", pebble.logs()));
    assert_eq!(std::fs::read(account_file(state.path(), &pebble)).expect("account"), account);
    assert_ne!(renewed.serial(), issued.serial());

    // Other names do not take the stored certificate.
    let other = Acme::new(
        settings(&pebble, Challenge::Http01, &["kept.example.com", "more.example.com"], state.path()),
        Arc::clone(&challenges),
    )
    .expect("settings");
    assert!(other.stored().is_none());
}

#[tokio::test]
async fn an_account_the_ca_does_not_know_is_registered_again() {
    let challenges = Challenges::new();
    let http = http01_responder(Arc::clone(&challenges)).await;
    let mut pebble = Pebble::start(http, 1, None);
    let state = tempfile::tempdir().expect("tempdir");
    let names = ["forgotten.example.com"];
    let make =
        |pebble: &Pebble| Acme::new(settings(pebble, Challenge::Http01, &names, state.path()), Arc::clone(&challenges));
    make(&pebble).expect("settings").obtain().await.unwrap_or_else(|e| panic!("{e}\n{}", pebble.logs()));
    let account = std::fs::read(account_file(state.path(), &pebble)).expect("account stored");

    // The same directory URL, but the CA has lost its accounts.
    pebble.restart();
    let acme = make(&pebble).expect("settings");
    acme.obtain().await.unwrap_or_else(|e| panic!("{e}\n{}", pebble.logs()));
    assert_ne!(
        std::fs::read(account_file(state.path(), &pebble)).expect("account"),
        account,
        "a new account is stored"
    );

    // Another CA: its own account, and the file says which CA it belongs to.
    let other = Pebble::start(http, 1, None);
    let acme = make(&other).expect("settings");
    acme.obtain().await.unwrap_or_else(|e| panic!("{e}\n{}", other.logs()));
    let stored: serde_json::Value =
        serde_json::from_slice(&std::fs::read(account_file(state.path(), &other)).expect("account")).expect("json");
    assert_eq!(stored["directory"], other.directory.as_str());
}

#[tokio::test]
async fn renewal_replaces_a_short_lived_certificate() {
    let challenges = Challenges::new();
    let http = http01_responder(Arc::clone(&challenges)).await;
    // Six-second certificates: renewal is due four seconds after issuance.
    let pebble = Pebble::start(http, 1, Some(Duration::from_secs(6)));
    let state = tempfile::tempdir().expect("tempdir");
    let dir = state.path().join("acme");
    let names = ["renew.example.com"];
    let acme =
        Acme::new(settings(&pebble, Challenge::Http01, &names, &dir), Arc::clone(&challenges)).expect("settings");
    let first = acme.obtain().await.unwrap_or_else(|e| panic!("{e}\n{}", pebble.logs()));
    let due = renew_at(first.not_before, first.not_after);
    assert!(due < first.not_after && due > first.not_before);

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let renewing = acme.renew_forever(first.clone(), move |issued: &Issued| {
        let _ = tx.send(issued.clone());
    });
    let renewed = tokio::select! {
        _ = renewing => unreachable!("the renewal task never returns"),
        got = rx.recv() => got.expect("a renewed certificate"),
        _ = tokio::time::sleep(Duration::from_secs(30)) => panic!("no renewal within 30 s\n{}", pebble.logs()),
    };
    assert!(SystemTime::now() >= due, "renewed before it was due");
    assert_ne!(renewed.serial(), first.serial());
    assert!(renewed.not_after > first.not_after);
    check_issued(&renewed, &names, &dir);
}

#[tokio::test]
async fn an_unanswered_challenge_fails_with_the_name_and_what_to_check() {
    let challenges = Challenges::new();
    // Answers 404: the key authorization is never served.
    let http = http01_responder(Challenges::new()).await;
    let pebble = Pebble::start(http, 1, None);
    let state = tempfile::tempdir().expect("tempdir");
    let names = ["unanswered.example.com"];
    let acme = Acme::new(settings(&pebble, Challenge::Http01, &names, state.path()), Arc::clone(&challenges))
        .expect("settings");
    let err = acme.obtain().await.expect_err("validation must fail");
    let AcmeError::Validation { challenge, ref name, ref detail } = err else {
        panic!("not a validation error: {err}")
    };
    assert_eq!((challenge, name.as_str()), (Challenge::Http01, "unanswered.example.com"));
    assert!(detail.contains("404"), "{detail}");
    let message = err.to_string();
    assert!(
        message.contains("http-01 validation of unanswered.example.com failed") && message.contains("port 80"),
        "{message}"
    );
    assert!(!state.path().join("unanswered.example.com.pem").exists());
    assert!(challenges.is_empty());
}

#[test]
fn settings_refuse_names_that_cannot_be_validated_or_stored() {
    let base = AcmeSettings {
        directory: "https://ca.invalid/dir".into(),
        email: None,
        challenge: Challenge::Http01,
        names: vec![],
        state_dir: "/nonexistent".into(),
        directory_ca: None,
        dns_hook: None,
        eab: None,
    };
    for bad in [vec![], vec!["*.example.com"], vec!["../etc"], vec!["a..b"], vec!["-a.example.com"], vec!["a/b"]] {
        let s = AcmeSettings { names: bad.iter().map(|n| n.to_string()).collect(), ..base.clone() };
        assert!(matches!(Acme::new(s, Challenges::new()), Err(AcmeError::Settings(_))), "{bad:?}");
    }
    let s = AcmeSettings {
        names: vec!["WWW.Example.com".into(), "a.example.com".into(), "www.example.com".into()],
        ..base.clone()
    };
    let acme = Acme::new(s, Challenges::new()).expect("valid names");
    assert_eq!(acme.settings().names, ["www.example.com", "a.example.com"]);

    // dns-01 validates wildcards, and needs its hook.
    let dns = AcmeSettings { challenge: Challenge::Dns01, names: vec!["*.example.com".into()], ..base.clone() };
    assert!(matches!(Acme::new(dns.clone(), Challenges::new()), Err(AcmeError::Settings(_))), "no hook");
    let hook =
        super::DnsHook { command: "/bin/true".into(), timeout: Duration::from_secs(1), propagation: Duration::ZERO };
    let dns = AcmeSettings { dns_hook: Some(hook), ..dns };
    assert!(Acme::new(dns.clone(), Challenges::new()).is_ok());
    let bad = AcmeSettings { names: vec!["*.*.example.com".into()], ..dns };
    assert!(matches!(Acme::new(bad, Challenges::new()), Err(AcmeError::Settings(_))));
}

#[tokio::test]
async fn sites_of_one_ca_share_one_account() {
    // Two sites starting together on one state directory register one account between them.
    let challenges = Challenges::new();
    let http = http01_responder(Arc::clone(&challenges)).await;
    let pebble = Pebble::start(http, 1, None);
    let state = tempfile::tempdir().expect("tempdir");
    let a =
        Acme::new(settings(&pebble, Challenge::Http01, &["one.example.com"], state.path()), Arc::clone(&challenges))
            .expect("settings");
    let b =
        Acme::new(settings(&pebble, Challenge::Http01, &["two.example.com"], state.path()), Arc::clone(&challenges))
            .expect("settings");
    let (x, y) = tokio::join!(a.obtain(), b.obtain());
    x.unwrap_or_else(|e| panic!("{e}\n{}", pebble.logs()));
    y.unwrap_or_else(|e| panic!("{e}\n{}", pebble.logs()));
    let registered = pebble.logs().matches("accounts in memory").count();
    assert_eq!(registered, 1, "accounts registered:\n{}", pebble.logs());
}
