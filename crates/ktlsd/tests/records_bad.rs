//! After the handshake, the userspace record layer answers every record that
//! breaks the protocol with the fatal alert the RFCs prescribe, then closes at
//! once: no bare FIN, no wait for the idle timeout.
//!
//! A client completes a real handshake, takes the connection's keys and forges
//! the bad records itself (`testkit::ForgingClient`); it decrypts the
//! server's answer and checks the alert. The kernel record layer gets the same
//! table in the VM suite (`tests/ktls/bad_records.rs`).

use std::time::Duration;

use rustls::crypto::aws_lc_rs::cipher_suite as cs;
use testkit::{bad_records, Closing, ForgingClient, Server, Versions};

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// Far longer than any answer may take: a stall shows as a timeout, not a pass.
const IDLE: &str = "60";
/// An answer must come within this (the idle timeout is 60 s).
const PROMPT: Duration = Duration::from_secs(3);

#[test]
fn bad_records_get_their_alert_at_once() {
    let server =
        Server::builder(BIN).file("index.html", "hello\n").args(["--ktls", "off", "--idle-timeout", IDLE]).start();
    let fixtures = [
        ("TLS 1.3 AES-128-GCM", &rustls::version::TLS13, cs::TLS13_AES_128_GCM_SHA256),
        ("TLS 1.3 ChaCha20", &rustls::version::TLS13, cs::TLS13_CHACHA20_POLY1305_SHA256),
        ("TLS 1.2 AES-256-GCM", &rustls::version::TLS12, cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384),
        ("TLS 1.2 ChaCha20", &rustls::version::TLS12, cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256),
    ];
    let mut failures = Vec::new();
    let mut checked = 0;
    for (fixture, version, suite) in fixtures {
        let tls13 = version.version == rustls::ProtocolVersion::TLSv1_3;
        for case in bad_records() {
            match case.versions {
                Versions::Tls13 if !tls13 => continue,
                Versions::Tls12 if tls13 => continue,
                _ => {}
            }
            let mut c = ForgingClient::connect(server.addr(), version, Some(suite));
            // The keys work: a well-formed request is answered.
            assert_eq!(c.get("/index.html").status, 200, "{fixture}: request before `{}`", case.name);
            let bad = (case.forge)(&mut c);
            c.send_raw(&bad);
            let end = c.read_until_end(Duration::from_secs(20));
            checked += 1;
            let alerts = end.alerts();
            println!("[{fixture}] {}: alerts {alerts:?}, {:?} after {:?}", case.name, end.how, end.elapsed);
            let want = vec![(2, case.userspace)];
            if alerts != want {
                failures.push(format!("{fixture}: {}: alerts {alerts:?}, want {want:?}", case.name));
            }
            if end.how != Closing::Eof {
                failures.push(format!("{fixture}: {}: ended with {:?}, want FIN", case.name, end.how));
            }
            if end.elapsed > PROMPT {
                failures.push(format!("{fixture}: {}: ended {:?} after {:?}", case.name, end.how, end.elapsed));
            }
            if !end.data().is_empty() {
                failures.push(format!(
                    "{fixture}: {}: {} bytes of data after the bad record",
                    case.name,
                    end.data().len()
                ));
            }
        }
    }
    assert!(checked >= 30, "only {checked} cases ran");
    assert!(failures.is_empty(), "{} of {checked} cases failed:\n{}", failures.len(), failures.join("\n"));
    // A bad record costs its connection only.
    let mut c = ForgingClient::connect(server.addr(), &rustls::version::TLS13, None);
    assert_eq!(c.get("/index.html").status, 200);
}

/// A bad record that arrives while a large response is on its way: the
/// response (already read from the peer as a request) is finished, then the
/// next read finds the record and the alert follows at once.
#[test]
fn bad_record_during_a_response_gets_its_alert_after_it() {
    let big = testkit::pattern(8 << 20, 7);
    let server = Server::builder(BIN).file("big", &big).args(["--ktls", "off", "--idle-timeout", IDLE]).start();
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let v = version.version;
        let mut c = ForgingClient::connect(server.addr(), version, None);
        c.send_data(testkit::get_request("/big").as_bytes());
        // Unread, the response fills the socket buffers and the server waits to write more.
        std::thread::sleep(Duration::from_millis(300));
        let mut bad = c.seal(23, b"GET / HTTP/1.1\r\n\r\n", 0);
        let last = bad.len() - 1;
        bad[last] ^= 1;
        c.send_raw(&bad);
        let end = c.read_until_end(Duration::from_secs(20));
        let data = end.data();
        println!(
            "[{v:?}] {} response bytes, then {:?}, {:?} after {:?}",
            data.len(),
            end.alerts(),
            end.how,
            end.elapsed
        );
        let (resp, used) =
            testkit::parse_response(&data, false).unwrap_or_else(|| panic!("{v:?}: no complete response"));
        assert_eq!(resp.status, 200, "{v:?}");
        testkit::assert_body("/big before the bad record's alert", &resp.body, &big);
        assert_eq!(used, data.len(), "{v:?}: data after the response");
        assert_eq!(
            end.records.last().map(|(t, p)| (*t, p.clone())),
            Some((21, vec![2, 20])),
            "{v:?}: the last record must be bad_record_mac"
        );
        assert_eq!(end.how, Closing::Eof, "{v:?}");
        assert!(end.elapsed < PROMPT, "{v:?}: ended after {:?}", end.elapsed);
    }
}
