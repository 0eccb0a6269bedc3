//! Control records a client may send after the handshake, made by hand and
//! sealed with the client's own traffic keys: renegotiation, a KeyUpdate split
//! over records, an empty alert. Each checks the record the server answers with,
//! and whether the connection goes on.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use kernel_tls::TlsVersion;
use rustls::{AlertDescription, ContentType};

use super::record::{RecordKey, HEADER_LEN};
use super::tests::test_server_config;
use super::UserspaceTls;
use crate::tls::handshake;
use crate::tls::SessionError;

/// The client's side of an established connection: its socket and both keys.
struct RawClient {
    sock: TcpStream,
    tx: RecordKey,
    rx: RecordKey,
}

impl RawClient {
    /// Completes a rustls handshake at `version` over `sock`, then takes the keys.
    fn connect(sock: TcpStream, root: rustls::pki_types::CertificateDer<'static>, version: TlsVersion) -> RawClient {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(root).unwrap();
        let v = match version {
            TlsVersion::Tls13 => &rustls::version::TLS13,
            _ => &rustls::version::TLS12,
        };
        let mut cfg = rustls::ClientConfig::builder_with_protocol_versions(&[v])
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.enable_secret_extraction = true;
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
        let mut sock = sock;
        sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        while conn.is_handshaking() {
            conn.complete_io(&mut sock).unwrap();
        }
        #[allow(deprecated)]
        let secrets = conn.dangerous_extract_secrets().unwrap();
        let key = |(seq, s): (u64, rustls::ConnectionTrafficSecrets)| RecordKey::new(version, &s, seq).ok().unwrap();
        RawClient { sock, tx: key(secrets.tx), rx: key(secrets.rx) }
    }

    /// Seals one record of `typ` holding `payload` and sends it.
    fn send(&mut self, typ: ContentType, payload: &[u8]) {
        let (prefix, len) = (self.tx.prefix_len(), payload.len());
        let mut rec = vec![0u8; prefix + len + self.tx.suffix_len()];
        rec[prefix..prefix + len].copy_from_slice(payload);
        self.tx.seal(typ, &mut rec, len);
        self.sock.write_all(&rec).unwrap();
    }

    /// The next record from the server other than a session ticket, opened;
    /// `None` once the server has closed.
    fn recv(&mut self) -> Option<(ContentType, Vec<u8>)> {
        loop {
            let mut rec = vec![0u8; HEADER_LEN];
            self.sock.read_exact(&mut rec).ok()?;
            let len = usize::from(u16::from_be_bytes([rec[3], rec[4]]));
            rec.resize(HEADER_LEN + len, 0);
            self.sock.read_exact(&mut rec[HEADER_LEN..]).unwrap();
            let (typ, plain) = self.rx.open(&mut rec).unwrap();
            if typ == ContentType::Handshake && rec.get(plain.start) == Some(&4) {
                continue;
            }
            return Some((typ, rec[plain].to_vec()));
        }
    }

    /// Sends `data` and checks the server echoes it.
    fn echo(&mut self, data: &[u8]) {
        self.send(ContentType::ApplicationData, data);
        assert_eq!(self.recv(), Some((ContentType::ApplicationData, data.to_vec())));
    }
}

/// Runs `client` against a userspace record layer that echoes every read;
/// returns what ended the server's reads (`Ok` for the peer's close).
fn against_echo_server(
    version: TlsVersion,
    client: impl FnOnce(RawClient) + Send + 'static,
) -> Result<(), SessionError> {
    let (config, root) = test_server_config(vec![crate::vocab::TlsVersion::Tls13, crate::vocab::TlsVersion::Tls12]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client =
            std::thread::spawn(move || client(RawClient::connect(TcpStream::connect(addr).unwrap(), root, version)));
        let (stream, _) = listener.accept().await.unwrap();
        let established = handshake::accept(&stream, config, Duration::from_secs(10)).await.unwrap();
        let mut tls = UserspaceTls::new(established.conn).unwrap();
        let t = Duration::from_secs(10);
        let ended = loop {
            let mut buf = Vec::new();
            match tls.read(&stream, &mut buf, t).await {
                Ok(0) => break Ok(()),
                Ok(n) => {
                    tls.begin_record(n).unwrap().copy_from_slice(&buf);
                    tls.seal_record(n);
                    tls.flush(&stream, t).await.unwrap();
                }
                Err(e) => break Err(e),
            }
        };
        tokio::task::spawn_blocking(move || client.join().unwrap()).await.unwrap();
        ended
    })
}

const NO_RENEGOTIATION: [u8; 2] = [1, 100];

/// RFC 5746 §4.4 / RFC 5246 §7.2.2: a TLS 1.2 ClientHello after the handshake
/// gets the warning no_renegotiation, and the connection goes on, whole or
/// split over records.
#[test]
fn renegotiation_gets_a_warning_and_the_connection_goes_on() {
    let ended = against_echo_server(TlsVersion::Tls12, |mut c| {
        c.echo(b"before");
        let mut hello = vec![1, 0, 0, 40, 3, 3];
        hello.resize(44, 0x5a);
        c.send(ContentType::Handshake, &hello);
        assert_eq!(c.recv(), Some((ContentType::Alert, NO_RENEGOTIATION.to_vec())));
        c.echo(b"between");
        c.send(ContentType::Handshake, &hello[..3]);
        c.send(ContentType::Handshake, &hello[3..]);
        assert_eq!(c.recv(), Some((ContentType::Alert, NO_RENEGOTIATION.to_vec())));
        c.echo(b"after");
        c.send(ContentType::Alert, &[1, 0]);
    });
    ended.unwrap();
}

/// RFC 8446 §5.1: a KeyUpdate split over two records is one KeyUpdate; the
/// server answers update_requested with its own KeyUpdate under its old key.
#[test]
fn key_update_split_over_two_records_is_applied() {
    let ended = against_echo_server(TlsVersion::Tls13, |mut c| {
        c.echo(b"before");
        c.send(ContentType::Handshake, &[24, 0]);
        c.send(ContentType::Handshake, &[0, 1, 1]);
        assert_eq!(c.recv(), Some((ContentType::Handshake, vec![24, 0, 0, 1, 0])));
        // The client keeps its old key (it cannot derive the next one here): the
        // server, now on the next key, must refuse the record.
        c.send(ContentType::ApplicationData, b"old key");
        let _ = c.sock.read_to_end(&mut Vec::new());
    });
    assert!(matches!(ended, Err(SessionError::Protocol { alert: AlertDescription::BadRecordMac, .. })), "{ended:?}");
}

/// RFC 8446 §5.1: nothing may come between the records of a split handshake message.
#[test]
fn data_inside_a_split_key_update_is_unexpected() {
    let ended = against_echo_server(TlsVersion::Tls13, |mut c| {
        c.send(ContentType::Handshake, &[24, 0]);
        c.send(ContentType::ApplicationData, b"interleaved");
        assert_eq!(c.recv(), Some((ContentType::Alert, vec![2, 10])));
    });
    assert!(
        matches!(ended, Err(SessionError::Protocol { alert: AlertDescription::UnexpectedMessage, .. })),
        "{ended:?}"
    );
}

/// RFC 8446 §5.4 (and nginx): an empty alert record is unexpected_message, on both versions.
#[test]
fn empty_alert_is_unexpected_message() {
    for version in [TlsVersion::Tls13, TlsVersion::Tls12] {
        let ended = against_echo_server(version, |mut c| {
            c.echo(b"hello");
            c.send(ContentType::Alert, &[]);
            assert_eq!(c.recv(), Some((ContentType::Alert, vec![2, 10])));
            assert_eq!(c.recv(), None);
        });
        assert!(
            matches!(ended, Err(SessionError::Protocol { alert: AlertDescription::UnexpectedMessage, .. })),
            "{version:?}: {ended:?}"
        );
    }
}
