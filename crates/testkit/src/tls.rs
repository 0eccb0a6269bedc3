//! The in-process rustls client, for exact bytes on the wire: client
//! configurations trusting any certificate ([`crate::verify::AcceptAnyCert`]),
//! [`TlsClient`] (requests and responses over one connection), raw
//! handshake bytes and the HTTP/1.1 request and response framing the tests
//! write and parse themselves. Records forged with the connection's keys are in
//! [`crate::forge`].

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use crate::curl::parse_head;
use crate::verify::AcceptAnyCert;

/// A client configuration that trusts any certificate, for the given versions.
pub fn client_config(versions: &[&'static rustls::SupportedProtocolVersion]) -> Arc<rustls::ClientConfig> {
    client_config_with(versions, None)
}

/// [`client_config`], offering only `suite` when given.
pub fn client_config_with(
    versions: &[&'static rustls::SupportedProtocolVersion],
    suite: Option<rustls::SupportedCipherSuite>,
) -> Arc<rustls::ClientConfig> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    if let Some(s) = suite {
        provider.cipher_suites = vec![s];
    }
    let algs = provider.signature_verification_algorithms;
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)
        .expect("client protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(algs)))
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

/// How a connection ended, seen from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closing {
    /// The server sent close_notify (a clean end).
    CloseNotify,
    /// TCP FIN without close_notify (the server cut the connection).
    Eof,
    /// TCP RST.
    Reset,
    /// Nothing within the read timeout: still open.
    TimedOut,
    /// Anything else (TLS alert, ...).
    Other(String),
}

pub(crate) fn closing_of(e: &io::Error) -> Closing {
    match e.kind() {
        io::ErrorKind::UnexpectedEof => Closing::Eof,
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::BrokenPipe => Closing::Reset,
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Closing::TimedOut,
        _ => Closing::Other(e.to_string()),
    }
}

/// One response read off the wire.
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub version: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length").map(|v| v.parse().expect("numeric Content-Length"))
    }

    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Parses one response off the front of `buf` once it is complete: the response
/// and the bytes it took; `None` while incomplete. `head`: the answer to a HEAD.
pub fn parse_response(buf: &[u8], head: bool) -> Option<(RawResponse, usize)> {
    let end = find(buf, b"\r\n\r\n")? + 4;
    let head_text = String::from_utf8_lossy(&buf[..end]);
    let (version, status, headers) = parse_head(&head_text);
    let mut resp = RawResponse { version, status, headers, body: Vec::new() };
    let len = if head || status == 304 || status == 204 || (100..200).contains(&status) {
        0
    } else {
        resp.content_length().unwrap_or_else(|| panic!("response without Content-Length: {head_text}")) as usize
    };
    if buf.len() < end + len {
        return None;
    }
    resp.body = buf[end..end + len].to_vec();
    Some((resp, end + len))
}

/// A TLS connection to the server over a std `TcpStream`, speaking raw bytes.
pub struct TlsClient {
    pub tls: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
    /// Plaintext received but not yet consumed by `read_response`.
    pending: Vec<u8>,
}

impl TlsClient {
    /// Connects with TLS 1.2 and 1.3 enabled, and completes the handshake.
    pub fn connect(addr: SocketAddr) -> TlsClient {
        Self::connect_with(addr, client_config(&[&rustls::version::TLS13, &rustls::version::TLS12]))
            .unwrap_or_else(|e| panic!("TLS connect to {addr}: {e}"))
    }

    pub fn connect_with(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>) -> io::Result<TlsClient> {
        let sock = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
        sock.set_read_timeout(Some(Duration::from_secs(30)))?;
        sock.set_write_timeout(Some(Duration::from_secs(30)))?;
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let conn = rustls::ClientConnection::new(cfg, name).map_err(io::Error::other)?;
        let mut tls = rustls::StreamOwned::new(conn, sock);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock)?;
        }
        Ok(TlsClient { tls, pending: Vec::new() })
    }

    pub fn set_read_timeout(&self, t: Duration) {
        self.tls.sock.set_read_timeout(Some(t)).expect("set_read_timeout");
    }

    /// Shrinks the socket's receive buffer (before much data arrives).
    pub fn set_recv_buffer(&self, bytes: usize) {
        socket2::SockRef::from(&self.tls.sock).set_recv_buffer_size(bytes).expect("SO_RCVBUF");
    }

    /// Writes `bytes` as application data, in one TLS write, and flushes.
    pub fn send(&mut self, bytes: &[u8]) {
        self.try_send(bytes).unwrap_or_else(|e| panic!("send: {e}"));
    }

    pub fn try_send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.tls.write_all(bytes)?;
        self.tls.flush()
    }

    /// Reads more plaintext into the pending buffer; `Ok(0)` on close_notify.
    fn fill(&mut self) -> io::Result<usize> {
        let mut buf = [0u8; 64 * 1024];
        let n = self.tls.read(&mut buf)?;
        self.pending.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    /// Waits up to `timeout` for more plaintext: `Ok(Some(n))` read (0: close_notify),
    /// `Ok(None)` nothing yet, `Err` the connection ended otherwise. Restores a 30 s
    /// read timeout afterwards.
    pub fn poll_read(&mut self, timeout: Duration) -> io::Result<Option<usize>> {
        self.set_read_timeout(timeout);
        let r = self.fill();
        self.set_read_timeout(Duration::from_secs(30));
        match r {
            Ok(n) => Ok(Some(n)),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads one response to a GET (or to a HEAD when `head` is true).
    pub fn try_read_response(&mut self, head: bool) -> io::Result<RawResponse> {
        loop {
            if let Some((resp, used)) = parse_response(&self.pending, head) {
                self.pending.drain(..used);
                return Ok(resp);
            }
            if self.fill()? == 0 {
                let why = match find(&self.pending, b"\r\n\r\n") {
                    None => format!(
                        "closed before a complete response head; got {:?}",
                        String::from_utf8_lossy(&self.pending)
                    ),
                    Some(i) => format!(
                        "closed after {} body bytes; head {:?}",
                        self.pending.len() - (i + 4),
                        String::from_utf8_lossy(&self.pending[..i])
                    ),
                };
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, why));
            }
        }
    }

    pub fn read_response(&mut self) -> RawResponse {
        self.try_read_response(false).unwrap_or_else(|e| panic!("reading a response: {e}"))
    }

    pub fn read_head_response(&mut self) -> RawResponse {
        self.try_read_response(true).unwrap_or_else(|e| panic!("reading a HEAD response: {e}"))
    }

    /// Sends a GET for `path` and reads its response.
    pub fn get(&mut self, path: &str) -> RawResponse {
        self.send(get_request(path).as_bytes());
        self.read_response()
    }

    /// Reads exactly `n` body bytes (or fewer if the connection ends), returning them.
    pub fn read_exact_bytes(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.pending.len() < n {
            if self.fill()? == 0 {
                break;
            }
        }
        let take = n.min(self.pending.len());
        Ok(self.pending.drain(..take).collect())
    }

    /// Reads until the connection ends (or the read timeout passes); returns the
    /// bytes received (including any pending) and how it ended.
    pub fn read_until_close(&mut self) -> (Vec<u8>, Closing) {
        let mut data = std::mem::take(&mut self.pending);
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match self.tls.read(&mut buf) {
                Ok(0) => return (data, Closing::CloseNotify),
                Ok(n) => data.extend_from_slice(&buf[..n]),
                Err(e) => return (data, closing_of(&e)),
            }
        }
    }

    /// Plaintext already received and not consumed.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    pub fn take_pending(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.pending)
    }
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

pub fn get_request(path: &str) -> String {
    get_request_with(path, "")
}

/// A GET for `path` with `headers` (each ending in CRLF) after `Host`.
pub fn get_request_with(path: &str, headers: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n")
}

/// The ClientHello (its records, as they go on the wire) the rustls client
/// sends first with `cfg`.
pub fn client_hello(cfg: Arc<rustls::ClientConfig>) -> Vec<u8> {
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut conn = rustls::ClientConnection::new(cfg, name).expect("rustls client");
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).expect("write_tls to a Vec");
    }
    out
}

/// Reads a raw socket until the peer closes (true; a reset counts as closed) or
/// `limit` passes without data (false). Returns what arrived.
pub fn read_raw_until_closed(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    s.set_read_timeout(Some(limit)).expect("set_read_timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return (got, true),
            Err(_) => return (got, false),
        }
    }
}

/// The TLS records in `bytes`: (content type, body). Stops at an incomplete record.
pub fn tls_records(bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 5 <= bytes.len() {
        let len = u16::from_be_bytes([bytes[at + 3], bytes[at + 4]]) as usize;
        if at + 5 + len > bytes.len() {
            break;
        }
        out.push((bytes[at], bytes[at + 5..at + 5 + len].to_vec()));
        at += 5 + len;
    }
    out
}
