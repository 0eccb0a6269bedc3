//! [`WireClient`]: a blocking rustls client whose socket writes are explicit
//! and whose raw received bytes can be kept, for the record-level tests.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};
use testkit::{get_request, parse_response, RawResponse};

/// How a connection ended, seen from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Close {
    /// The server sent close_notify (then TCP EOF).
    Notify,
    /// TCP EOF without close_notify.
    Eof,
    /// TCP reset or another socket error.
    Reset(String),
    /// A TLS error: a fatal alert from the server, or a record rustls rejected.
    Tls(String),
}

/// A blocking rustls client whose socket writes are explicit: everything
/// rustls has to send leaves in ONE `write` per [`WireClient::flush`], and the
/// raw bytes received can be kept. The harness's `TlsClient` hides both; the
/// record-level tests here need them.
pub struct WireClient {
    pub sock: TcpStream,
    pub conn: ClientConnection,
    /// Decrypted bytes not yet consumed as responses.
    pub plain: Vec<u8>,
    /// Raw bytes received from the server, if kept.
    pub raw: Option<Vec<u8>>,
    pub closed: Option<Close>,
    /// Bytes of the last `flush`, all written by one `write_all`.
    pub last_flush: usize,
}

impl WireClient {
    /// TCP connection and a fresh TLS client; no handshake yet.
    pub fn start(addr: SocketAddr, cfg: &Arc<ClientConfig>) -> WireClient {
        let sock = TcpStream::connect(addr).unwrap();
        sock.set_nodelay(true).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        sock.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
        let conn = ClientConnection::new(cfg.clone(), ServerName::try_from("localhost").unwrap()).unwrap();
        WireClient { sock, conn, plain: Vec::new(), raw: None, closed: None, last_flush: 0 }
    }

    /// Connects and completes the handshake.
    pub fn connect(addr: SocketAddr, cfg: &Arc<ClientConfig>) -> WireClient {
        let mut c = WireClient::start(addr, cfg);
        c.handshake();
        c
    }

    pub fn handshake(&mut self) {
        loop {
            self.flush();
            if !self.conn.is_handshaking() {
                return;
            }
            if !self.pump() {
                panic!("connection ended during the handshake: {:?}", self.closed);
            }
        }
    }

    /// Sends everything rustls has queued in a single `write_all` call;
    /// returns the byte count.
    pub fn flush(&mut self) -> usize {
        let mut out = Vec::new();
        while self.conn.wants_write() {
            self.conn.write_tls(&mut out).unwrap();
        }
        self.last_flush = out.len();
        if !out.is_empty() {
            if let Err(e) = self.sock.write_all(&out) {
                self.closed.get_or_insert(Close::Reset(e.to_string()));
            }
        }
        out.len()
    }

    /// One socket read, fed through rustls; plaintext goes to `self.plain`.
    /// Returns false once the connection has ended (see `self.closed`).
    pub fn pump(&mut self) -> bool {
        if self.closed.is_some() {
            return false;
        }
        let mut buf = vec![0u8; 65536];
        let n = match self.sock.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut => {
                panic!("no data from the server within the read timeout (60s)")
            }
            Err(e) => {
                self.closed = Some(Close::Reset(e.to_string()));
                return false;
            }
        };
        if let Some(raw) = &mut self.raw {
            raw.extend_from_slice(&buf[..n]);
        }
        let mut slice = &buf[..n];
        let mut tmp = vec![0u8; 65536];
        loop {
            // read_tls takes at most its buffer's room per call, and refuses
            // more while decrypted data waits: drain it every round.
            if let Err(e) = self.conn.read_tls(&mut slice) {
                self.closed = Some(Close::Tls(e.to_string()));
                return false;
            }
            if let Err(e) = self.conn.process_new_packets() {
                self.flush();
                self.closed = Some(Close::Tls(e.to_string()));
                return false;
            }
            loop {
                match self.conn.reader().read(&mut tmp) {
                    Ok(0) => {
                        self.closed = Some(Close::Notify);
                        break;
                    }
                    Ok(k) => self.plain.extend_from_slice(&tmp[..k]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        self.closed = Some(Close::Eof);
                        break;
                    }
                    Err(e) => {
                        self.closed = Some(Close::Tls(e.to_string()));
                        break;
                    }
                }
            }
            if slice.is_empty() || self.closed.is_some() {
                break;
            }
        }
        // KeyUpdate answers and the like.
        self.flush();
        if n == 0 && self.closed.is_none() {
            self.closed = Some(Close::Eof);
        }
        self.closed.is_none()
    }

    pub fn queue(&mut self, data: &[u8]) {
        self.conn.writer().write_all(data).unwrap();
    }

    pub fn send(&mut self, data: &[u8]) {
        self.queue(data);
        self.flush();
    }

    /// The next complete response.
    pub fn response(&mut self, head_only: bool) -> RawResponse {
        loop {
            if let Some((r, used)) = parse_response(&self.plain, head_only) {
                self.plain.drain(..used);
                return r;
            }
            if !self.pump() {
                // Whatever arrived before the end may still hold a response.
                if let Some((r, used)) = parse_response(&self.plain, head_only) {
                    self.plain.drain(..used);
                    return r;
                }
                panic!(
                    "connection ended ({:?}) before a complete response ({} bytes buffered)",
                    self.closed,
                    self.plain.len()
                );
            }
        }
    }

    pub fn get(&mut self, path: &str) -> RawResponse {
        self.send(get_request(path).as_bytes());
        self.response(false)
    }

    /// Reads until the connection ends; returns how, and any stray plaintext.
    pub fn until_closed(&mut self) -> (Close, Vec<u8>) {
        while self.pump() {}
        (self.closed.clone().unwrap(), std::mem::take(&mut self.plain))
    }
}
