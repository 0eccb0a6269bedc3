//! The TLS handshake, driven in user space with rustls' unbuffered API.
//!
//! The socket is read one TLS record at a time (header first, then exactly the
//! record's length), so the handshake never consumes bytes past the client's
//! last handshake record. Whatever the client sends right after its Finished
//! (typically the first HTTP request) stays in the kernel's receive queue, where
//! the kernel record layer, once installed, decrypts it with the right sequence number.
//!
//! Every input ends in a defined way: a completed handshake, or a
//! [`HandshakeError`] whose [`FailureKind`] says why. A handshake message may span
//! several records (rustls keeps them buffered until the message is whole), so
//! the buffer grows up to [`MAX_BUFFERED`]. When rustls refuses the client,
//! everything it queued (the alert, and any handshake records before it) is
//! sent. A plain HTTP request sent to the TLS port gets a readable 400 answer.

use std::fmt;
use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::ConnectionState;
use rustls::{AlertDescription, ServerConfig};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::client_auth::ClientAuthConfigs;
use crate::net;
use crate::vocab::HttpVersion;

use super::RECORD_HEADER_LEN as HEADER_LEN;
/// Largest record a peer may send: 2^14 plaintext plus the TLS 1.2/1.3 expansion allowance.
const MAX_RECORD_LEN: usize = 16384 + 2048;
/// rustls' limit for one handshake message: a 2^16 - 1 byte body and its 4-byte header.
const MAX_HANDSHAKE_MESSAGE: usize = 0xffff + 4;
/// Most bytes the handshake buffers: rustls keeps every record of a handshake
/// message until the message is whole, so the largest message it accepts, plus
/// one full record for the record headers in between and for complete messages
/// sharing the first record.
pub const MAX_BUFFERED: usize = MAX_HANDSHAKE_MESSAGE + HEADER_LEN + MAX_RECORD_LEN;
/// Bytes looked at to tell a plain HTTP request line from a TLS record (the
/// longest method worth recognising, `OPTIONS `, fits easily).
const SNIFF_LEN: usize = 16;
/// How long a refused client gets to take the alert or the 400 answer.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a refused client's input (after its alert, or a plain HTTP client's
/// request after the 400 answer) is drained, so that closing does not reset the
/// connection before the client has read the answer.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);
/// Most request bytes drained after the 400 answer.
const PLAIN_HTTP_LINGER_BYTES: usize = 64 * 1024;
/// Most bytes drained after an alert.
const REFUSAL_LINGER_BYTES: usize = MAX_BUFFERED;

/// The answer to a plain HTTP request on the TLS port (nginx gives the same one).
const PLAIN_HTTP_BODY: &str =
    "<html>\r\n<head><title>400 The plain HTTP request was sent to HTTPS port</title></head>\r\n\
<body>\r\n<center><h1>400 Bad Request</h1></center>\r\n\
<center>The plain HTTP request was sent to HTTPS port</center>\r\n<hr><center>ktlsd</center>\r\n</body>\r\n</html>\r\n";

/// Why a handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("handshake timed out")]
    Timeout,
    #[error("client closed the connection during the handshake")]
    Eof,
    #[error("socket error during the handshake: {0}")]
    Io(#[from] io::Error),
    #[error("TLS error: {error}; {alert}")]
    Tls { error: rustls::Error, alert: SentAlert },
    #[error("the client sent a fatal alert: {0:?}")]
    ClientAlert(AlertDescription),
    #[error("record of {0} bytes exceeds the TLS limit")]
    RecordTooLarge(usize),
    #[error(
        "handshake data of {0} bytes exceeds the {MAX_BUFFERED}-byte limit (one handshake message over many records)"
    )]
    TooLarge(usize),
    #[error("plain HTTP request on the TLS port (answered 400)")]
    PlainHttp,
    #[error("a PROXY protocol header, and the client's address is not in proxy_protocol_from")]
    ProxyHeader,
}

/// The reason a handshake failed, as counted and logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The handshake timeout passed.
    Timeout,
    /// The client broke the protocol (rustls refused it, or the records were malformed).
    Protocol,
    /// The client sent a fatal alert.
    ClientAlert,
    /// The client closed or reset the connection, or the socket failed.
    Reset,
    /// The client spoke plain HTTP.
    PlainHttp,
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureKind::Timeout => "timeout",
            FailureKind::Protocol => "protocol error",
            FailureKind::ClientAlert => "client alert",
            FailureKind::Reset => "reset",
            FailureKind::PlainHttp => "plain http",
        })
    }
}

impl HandshakeError {
    pub fn kind(&self) -> FailureKind {
        match self {
            HandshakeError::Timeout => FailureKind::Timeout,
            HandshakeError::Eof | HandshakeError::Io(_) => FailureKind::Reset,
            HandshakeError::Tls { .. } | HandshakeError::RecordTooLarge(_) | HandshakeError::TooLarge(_) => {
                FailureKind::Protocol
            }
            HandshakeError::ClientAlert(_) => FailureKind::ClientAlert,
            HandshakeError::PlainHttp => FailureKind::PlainHttp,
            HandshakeError::ProxyHeader => FailureKind::Protocol,
        }
    }
}

/// The alert sent to a client rustls refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SentAlert {
    None,
    /// A plaintext alert (before the handshake keys): its description.
    Plain(AlertDescription),
    /// An encrypted record (TLS 1.3 after the ServerHello): the alert cannot be read back.
    Encrypted,
}

impl fmt::Display for SentAlert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SentAlert::None => f.write_str("no alert sent"),
            SentAlert::Plain(d) => write!(f, "sent alert {d:?} ({})", u8::from(*d)),
            SentAlert::Encrypted => f.write_str("sent an encrypted alert"),
        }
    }
}

/// A connection whose handshake has completed, positioned at a record boundary
/// in both directions and with nothing left to send.
pub struct Established {
    pub conn: UnbufferedServerConnection,
    /// The ClientHello's server name, when it was read to choose a client-certificate
    /// policy (some site asks for certificates); `None` otherwise.
    pub server_name: Option<String>,
}

impl Established {
    /// What ALPN chose; a client that offered nothing speaks HTTP/1.x.
    pub fn protocol(&self) -> HttpVersion {
        HttpVersion::from_alpn(self.conn.alpn_protocol())
    }
}

/// Runs the handshake on `stream`, bounded in total by `timeout`.
///
/// A client refused for breaking the protocol gets an alert (rustls's, or the
/// one the RFC names when rustls queued none), then FIN; its input is then
/// drained for a moment ([`REFUSAL_LINGER`]), so closing does not reset the
/// connection before the client has read the alert.
#[cfg(test)]
pub async fn accept(
    stream: &TcpStream,
    config: Arc<ServerConfig>,
    timeout: Duration,
) -> Result<Established, HandshakeError> {
    accept_choosing(stream, config, None, timeout).await
}

/// [`accept`], with the configuration chosen by the ClientHello's server name
/// among `client_auth`'s (sites that ask for client certificates), else `config`.
///
/// # Cancel safety
/// Not cancel-safe, as the handshake it runs: a dropped future leaves the
/// connection mid-handshake, and the caller drops the connection with it.
pub async fn accept_choosing(
    stream: &TcpStream,
    config: Arc<ServerConfig>,
    client_auth: Option<&ClientAuthConfigs>,
    timeout: Duration,
) -> Result<Established, HandshakeError> {
    let deadline = Instant::now() + timeout;
    let result = drive(stream, config, client_auth.filter(|c| !c.is_empty()), deadline).await;
    if let Err(e) = &result {
        let own = match e {
            HandshakeError::RecordTooLarge(_) => Some(AlertDescription::RecordOverflow),
            HandshakeError::TooLarge(_) => Some(AlertDescription::DecodeError),
            _ => None,
        };
        if let Some(alert) = own {
            let _ = net::write_all(stream, &plain_alert(alert), REFUSAL_WRITE_TIMEOUT).await;
        }
        if e.kind() == FailureKind::Protocol {
            linger_refused(stream, deadline, REFUSAL_LINGER_BYTES).await;
        }
    }
    result
}

/// The handshake itself (see [`accept`]).
async fn drive(
    stream: &TcpStream,
    config: Arc<ServerConfig>,
    client_auth: Option<&ClientAuthConfigs>,
    deadline: Instant,
) -> Result<Established, HandshakeError> {
    let mut incoming = Incoming::default();
    let mut outgoing: Vec<u8> = Vec::with_capacity(8192);
    let mut out_len = 0usize;

    if sniff_plain_http(stream, &mut incoming, deadline).await? {
        answer_plain_http(stream, deadline).await;
        return Err(HandshakeError::PlainHttp);
    }
    // A first record of a TLS type announcing more than a record may hold is
    // refused here with record_overflow (RFC 8446 §5.2); rustls would say decode_error.
    if (20..=24).contains(&incoming.buf[0]) {
        incoming.note_read()?;
    }
    let mut server_name = None;
    let config = match client_auth {
        Some(choices) => match read_client_hello(stream, &mut incoming, deadline).await? {
            // An ACME tls-alpn-01 validation presents no client certificate.
            Some((name, acme)) if !acme => {
                let chosen = choices.for_name(name.as_deref()).unwrap_or(config);
                server_name = name;
                chosen
            }
            _ => config,
        },
        None => config,
    };
    let mut conn = UnbufferedServerConnection::new(config)
        .map_err(|error| HandshakeError::Tls { error, alert: SentAlert::None })?;

    loop {
        let status = conn.process_tls_records(&mut incoming.buf[..incoming.filled]);
        let discard = status.discard;
        let state = match status.state {
            Ok(s) => s,
            Err(rustls::Error::AlertReceived(d)) => return Err(HandshakeError::ClientAlert(d)),
            Err(error) if super::sni::is_refused_name(&error) => {
                let _ = net::write_all(stream, &super::sni::UNRECOGNIZED_NAME_ALERT, REFUSAL_WRITE_TIMEOUT).await;
                return Err(HandshakeError::Tls { error, alert: SentAlert::Plain(AlertDescription::UnrecognisedName) });
            }
            Err(error) => {
                incoming.discard(discard);
                let alert =
                    send_pending_alert(stream, &mut conn, &mut incoming, &mut outgoing, &mut out_len, &error).await;
                return Err(HandshakeError::Tls { error, alert });
            }
        };
        // Handle the state first: it borrows `conn` and `incoming`.
        let waiting = match state {
            ConnectionState::EncodeTlsData(mut enc) => {
                super::encode_into(&mut enc, &mut outgoing, &mut out_len);
                false
            }
            ConnectionState::TransmitTlsData(tx) => {
                write_before(stream, &outgoing[..out_len], deadline).await?;
                out_len = 0;
                tx.done();
                false
            }
            // Nothing to send: either more client records are needed, or (TLS 1.3)
            // the server may already send while it waits for the client's Finished.
            ConnectionState::BlockedHandshake | ConnectionState::WriteTraffic(_) => true,
            ConnectionState::PeerClosed | ConnectionState::Closed => return Err(HandshakeError::Eof),
            // Early data is disabled and application data cannot precede the client's
            // Finished; anything else is a protocol violation.
            _ => {
                let error = rustls::Error::General("unexpected data during the handshake".into());
                let alert = AlertDescription::UnexpectedMessage;
                let _ = net::write_all(stream, &plain_alert(alert), REFUSAL_WRITE_TIMEOUT).await;
                return Err(HandshakeError::Tls { error, alert: SentAlert::Plain(alert) });
            }
        };
        incoming.discard(discard);
        if waiting {
            if !conn.is_handshaking() {
                // Reading by record means nothing past the client's Finished was consumed.
                debug_assert_eq!(incoming.filled, 0);
                return Ok(Established { conn, server_name });
            }
            if conn.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3) {
                incoming.drop_skipped_early_data();
            }
            // rustls sees each record once it is whole, not after its header alone.
            loop {
                let range = incoming.next_read()?;
                read_before(stream, &mut incoming, range, deadline).await?;
                incoming.note_read()?;
                if incoming.record_end.is_some_and(|end| incoming.filled >= end) {
                    break;
                }
            }
        }
    }
}

/// Reads whole records until they hold the ClientHello, and returns its server
/// name and whether it offers ACME's tls-alpn-01 protocol; `None` when they hold
/// no valid ClientHello (rustls then refuses the same bytes with its own alert).
/// Nothing past the ClientHello's last record is read, so the handshake goes on
/// over `incoming` as if it had read them itself. Not cancel-safe (see [`accept_choosing`]).
async fn read_client_hello(
    stream: &TcpStream,
    incoming: &mut Incoming,
    deadline: Instant,
) -> Result<Option<(Option<String>, bool)>, HandshakeError> {
    if !(20..=24).contains(&incoming.buf[0]) {
        return Ok(None);
    }
    let mut acceptor = rustls::server::Acceptor::default();
    let mut fed = 0;
    loop {
        if let Some(end) = incoming.record_end.filter(|&end| incoming.filled >= end) {
            let mut whole = &incoming.buf[fed..end];
            while !whole.is_empty() {
                match acceptor.read_tls(&mut whole) {
                    Ok(0) | Err(_) => return Ok(None),
                    Ok(_) => {}
                }
            }
            fed = end;
            match acceptor.accept() {
                Ok(Some(accepted)) => {
                    let hello = accepted.client_hello();
                    let acme = hello.alpn().is_some_and(|mut p| p.any(|p| p == crate::acme::ACME_TLS_ALPN));
                    return Ok(Some((hello.server_name().map(str::to_string), acme)));
                }
                Ok(None) => {}
                Err(_) => return Ok(None),
            }
        }
        let range = incoming.next_read()?;
        read_before(stream, incoming, range, deadline).await?;
        incoming.note_read()?;
    }
}

/// Bytes read from the client and not yet discarded by rustls.
///
/// `buf[..record]` holds whole records rustls has seen but keeps: the fragments
/// of a handshake message spanning records, which rustls moves together in
/// place, so record headers there are no longer valid; so is the current
/// record's once it is whole. Hence each record's end is noted as soon as its
/// header has arrived, before rustls sees it. `buf[record..filled]` is the part
/// read so far of the record being read.
#[derive(Debug)]
struct Incoming {
    buf: Vec<u8>,
    filled: usize,
    record: usize,
    /// Where the current record ends, once its header is complete.
    record_end: Option<usize>,
}

impl Default for Incoming {
    fn default() -> Self {
        Incoming { buf: vec![0; 4096], filled: 0, record: 0, record_end: None }
    }
}

impl Incoming {
    /// Drops the first `n` bytes, as rustls asks after each step (whole records only).
    fn discard(&mut self, n: usize) {
        let n = n.min(self.filled);
        if n == 0 {
            return;
        }
        self.buf.copy_within(n..self.filled, 0);
        self.filled -= n;
        self.record = self.record.saturating_sub(n);
        self.record_end = self.record_end.map(|e| e.saturating_sub(n));
    }

    /// Drops the rejected 0-RTT records rustls has skipped (TLS 1.3, after its
    /// ServerHello; ktlsd accepts no early data). rustls skips a record it cannot
    /// decrypt but does not discard it while no later record follows, so every
    /// later call would charge it against the skip budget again, and a few KB of
    /// early data would exhaust the budget (RFC 8446 §4.2.10 asks to skip up to
    /// the announced size). Once rustls is blocked, a whole record still at the
    /// front is one it skipped, unless it is the first fragment of the client's
    /// Finished split over records, which rustls keeps decrypted in place, or of
    /// the client's Certificate or CertificateVerify when its site asks for one.
    fn drop_skipped_early_data(&mut self) {
        loop {
            // Whole records rustls has seen: the current one too once complete.
            let seen = match self.record_end {
                Some(end) if self.filled >= end => end,
                _ => self.record,
            };
            let Some(len) = record_len(&self.buf[..seen]) else { return };
            let end = HEADER_LEN + len;
            let finished_fragment = self.buf.get(HEADER_LEN).is_some_and(|&t| {
                use rustls::HandshakeType::{Certificate, CertificateVerify, Finished};
                [Finished, Certificate, CertificateVerify].iter().any(|&h| t == u8::from(h))
            });
            if self.buf[0] != u8::from(rustls::ContentType::ApplicationData) || end > seen || finished_fragment {
                return;
            }
            self.discard(end);
        }
    }

    /// Notes where the current record ends once its header is complete; called
    /// after every read of a record, before rustls may rearrange the buffer.
    fn note_read(&mut self) -> Result<(), HandshakeError> {
        if self.record_end.is_none() {
            if let Some(len) = record_len(&self.buf[self.record..self.filled]) {
                if len > MAX_RECORD_LEN {
                    return Err(HandshakeError::RecordTooLarge(len));
                }
                self.record_end = Some(self.record + HEADER_LEN + len);
            }
        }
        Ok(())
    }

    /// Where the next read goes: the rest of the current record's header or body,
    /// never past that record's end. Called only when rustls needs more, so a
    /// complete current record means the next one begins after it. Grows the
    /// buffer as needed, up to [`MAX_BUFFERED`].
    fn next_read(&mut self) -> Result<Range<usize>, HandshakeError> {
        let end = loop {
            self.note_read()?;
            match self.record_end {
                // Whole (rustls has it): the next record starts after it. Sniffed
                // bytes that are no TLS can hold several.
                Some(end) if self.filled >= end => {
                    self.record = end;
                    self.record_end = None;
                }
                Some(end) => break end,
                None => break self.record + HEADER_LEN,
            }
        };
        if end > MAX_BUFFERED {
            return Err(HandshakeError::TooLarge(end));
        }
        if self.buf.len() < end {
            self.buf.resize(end, 0);
        }
        Ok(self.filled..end)
    }
}

/// The body length a record header announces, once the header is complete.
fn record_len(part: &[u8]) -> Option<usize> {
    (part.len() >= HEADER_LEN).then(|| u16::from_be_bytes([part[3], part[4]]) as usize)
}

/// Reads the first bytes of the connection: a record header, and when it starts
/// like an HTTP request line, up to [`SNIFF_LEN`] bytes to be sure. True when the
/// client speaks plain HTTP.
async fn sniff_plain_http(
    stream: &TcpStream,
    incoming: &mut Incoming,
    deadline: Instant,
) -> Result<bool, HandshakeError> {
    // No record end is noted here: these bytes may be no TLS at all, and rustls
    // judges them first (a header alone is not a whole record it could move).
    while incoming.filled < HEADER_LEN {
        read_before(stream, incoming, incoming.filled..HEADER_LEN, deadline).await?;
    }
    // A load balancer's header where it was not expected: told apart from a
    // mistaken client, and closed without an answer.
    if crate::net::begins_with_proxy_header(&incoming.buf[..incoming.filled]) {
        return Err(HandshakeError::ProxyHeader);
    }
    // TLS content types are 20..=24; an uppercase letter is never one.
    if !incoming.buf[0].is_ascii_uppercase() {
        return Ok(false);
    }
    loop {
        match looks_like_http(&incoming.buf[..incoming.filled]) {
            Some(true) if crate::net::begins_with_proxy_header(&incoming.buf[..incoming.filled]) => {
                return Err(HandshakeError::ProxyHeader)
            }
            Some(verdict) => return Ok(verdict),
            None if incoming.filled >= SNIFF_LEN => return Ok(false),
            None => read_before(stream, incoming, incoming.filled..SNIFF_LEN, deadline).await?,
        }
    }
}

/// Whether `bytes` begin like an HTTP request line: one or more uppercase
/// letters (the method), then a space. `None` while every byte so far is an
/// uppercase letter (more bytes decide).
fn looks_like_http(bytes: &[u8]) -> Option<bool> {
    for (i, &b) in bytes.iter().enumerate() {
        if b == b' ' {
            return Some(i > 0);
        }
        if !b.is_ascii_uppercase() {
            return Some(false);
        }
    }
    None
}

/// Answers a plain HTTP request with 400 and closes: write the answer, end our
/// side, then read (and drop) what the client still sends for a moment, so the
/// close does not reset the connection before the client has read the answer.
async fn answer_plain_http(stream: &TcpStream, deadline: Instant) {
    let reply = format!(
        "HTTP/1.1 400 Bad Request\r\nServer: ktlsd\r\nDate: {}\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{PLAIN_HTTP_BODY}",
        crate::http::conn::http_date_now(),
        PLAIN_HTTP_BODY.len()
    );
    if net::write_all(stream, reply.as_bytes(), REFUSAL_WRITE_TIMEOUT).await.is_err() {
        return;
    }
    linger_refused(stream, deadline, PLAIN_HTTP_LINGER_BYTES).await;
}

/// Reads and drops a refused client's input for [`REFUSAL_LINGER`] (never past
/// the handshake's `deadline`) or until `max_bytes`, whichever comes first.
async fn linger_refused(stream: &TcpStream, deadline: Instant, max_bytes: usize) {
    let left = deadline.saturating_duration_since(Instant::now()).min(REFUSAL_LINGER);
    net::linger(stream, left, left, max_bytes).await;
}

/// Reads into `incoming.buf[range]` (at least one byte), within the deadline.
async fn read_before(
    stream: &TcpStream,
    incoming: &mut Incoming,
    range: Range<usize>,
    deadline: Instant,
) -> Result<(), HandshakeError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(HandshakeError::Timeout);
    }
    match net::read_some(stream, &mut incoming.buf[range], left).await {
        Ok(0) => Err(HandshakeError::Eof),
        Ok(n) => {
            incoming.filled += n;
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::TimedOut => Err(HandshakeError::Timeout),
        Err(e) => Err(e.into()),
    }
}

async fn write_before(stream: &TcpStream, buf: &[u8], deadline: Instant) -> Result<(), HandshakeError> {
    let left = deadline.saturating_duration_since(Instant::now());
    match net::write_all(stream, buf, left).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::TimedOut => Err(HandshakeError::Timeout),
        Err(e) => Err(e.into()),
    }
}

/// After rustls refused the client it has queued a fatal alert (after any
/// handshake records it had queued before); sends all of it, best effort, so the
/// client learns why instead of seeing a bare reset. rustls is driven as after
/// any other step: over the bytes it has not discarded, discarding what it says.
async fn send_pending_alert(
    stream: &TcpStream,
    conn: &mut UnbufferedServerConnection,
    incoming: &mut Incoming,
    out: &mut Vec<u8>,
    out_len: &mut usize,
    error: &rustls::Error,
) -> SentAlert {
    // A handful of queued records at most; the bound only guards against a loop.
    for _ in 0..32 {
        let status = conn.process_tls_records(&mut incoming.buf[..incoming.filled]);
        let discard = status.discard;
        let done = match status.state {
            Ok(ConnectionState::EncodeTlsData(mut enc)) => {
                super::encode_into(&mut enc, out, out_len);
                false
            }
            Ok(ConnectionState::TransmitTlsData(tx)) => {
                tx.done();
                true
            }
            _ => true,
        };
        incoming.discard(discard);
        if done {
            break;
        }
    }
    if conn.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_2) {
        tls12_alerts(&mut out[..*out_len]);
    }
    let sent = &out[..*out_len];
    if !sent.is_empty() {
        let _ = net::write_all(stream, sent, REFUSAL_WRITE_TIMEOUT).await;
    }
    match last_alert(sent) {
        // rustls queued no alert for this error: send the one the RFC names.
        SentAlert::None => {
            let alert = alert_for(error);
            let _ = net::write_all(stream, &plain_alert(alert), REFUSAL_WRITE_TIMEOUT).await;
            SentAlert::Plain(alert)
        }
        queued => queued,
    }
}

/// The alert for a handshake error rustls queued none for.
fn alert_for(error: &rustls::Error) -> AlertDescription {
    use rustls::{Error as E, PeerMisbehaved as P};
    match error {
        // A record header announcing more than the protocol allows (RFC 8446 §5.2).
        E::InvalidMessage(rustls::InvalidMessage::MessageTooLarge) => AlertDescription::RecordOverflow,
        E::InvalidMessage(_) => AlertDescription::DecodeError,
        E::InappropriateMessage { .. } | E::InappropriateHandshakeMessage { .. } => AlertDescription::UnexpectedMessage,
        // RFC 8446 §5.4: a TLS 1.3 record whose inner plaintext has no content type
        // (all zeros) is unexpected_message; so is a record that breaks into a
        // handshake message (§5.1). rustls reports both as `PeerMisbehaved`.
        E::PeerMisbehaved(
            P::IllegalTlsInnerPlaintext
            | P::MessageInterleavedWithHandshakeMessage
            | P::RejectedEarlyDataInterleavedWithHandshakeMessage,
        ) => AlertDescription::UnexpectedMessage,
        E::PeerMisbehaved(_) => AlertDescription::IllegalParameter,
        E::DecryptError => AlertDescription::BadRecordMac,
        // No certificate for the client's signature schemes, or no suite in common.
        _ => AlertDescription::HandshakeFailure,
    }
}

/// A fatal alert as a plaintext record (before the handshake keys).
fn plain_alert(alert: AlertDescription) -> [u8; HEADER_LEN + 2] {
    [0x15, 3, 3, 0, 2, 2, u8::from(alert)]
}

/// What the last record of `bytes` (whole records as sent) says about the alert.
/// Rewrites plaintext certificate_required alerts, which only TLS 1.3 defines
/// (RFC 8446 section 6.2) and rustls also sends in TLS 1.2, as handshake_failure,
/// TLS 1.2's answer to a client that sent no certificate (RFC 5246 section 7.4.6).
fn tls12_alerts(bytes: &mut [u8]) {
    let mut at = 0;
    while let Some(len) = record_len(&bytes[at..]) {
        let end = at + HEADER_LEN + len;
        if bytes[at] == 0x15 && len == 2 && end <= bytes.len() && bytes[end - 1] == 116 {
            bytes[end - 1] = u8::from(AlertDescription::HandshakeFailure);
        }
        at = end;
        if at >= bytes.len() {
            break;
        }
    }
}

fn last_alert(bytes: &[u8]) -> SentAlert {
    let mut at = 0;
    let mut last = SentAlert::None;
    while let Some(len) = record_len(&bytes[at..]) {
        let body = &bytes[at + HEADER_LEN..bytes.len().min(at + HEADER_LEN + len)];
        last = match bytes[at] {
            0x15 if body.len() == 2 => SentAlert::Plain(AlertDescription::from(body[1])),
            0x17 => SentAlert::Encrypted,
            _ => SentAlert::None,
        };
        at += HEADER_LEN + len;
        if at >= bytes.len() {
            break;
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_like_http_table() {
        let cases: &[(&[u8], Option<bool>)] = &[
            (b"GET / HTTP/1.1", Some(true)),
            (b"OPTIONS * HTTP/1.1", Some(true)),
            (b"POST ", Some(true)),
            (b"GE", None),
            (b"GET", None),
            (b"", None),
            (b" GET", Some(false)),
            (b"get / HTTP/1.1", Some(false)),
            (b"GET/", Some(false)),
            (b"\x16\x03\x01\x00\x04", Some(false)),
            (b"G\x00T ", Some(false)),
        ];
        for (bytes, want) in cases {
            assert_eq!(looks_like_http(bytes), *want, "{:?}", String::from_utf8_lossy(bytes));
        }
    }

    fn incoming(bytes: &[u8], record: usize) -> Incoming {
        let mut buf = bytes.to_vec();
        buf.resize(bytes.len().max(16), 0);
        Incoming { buf, filled: bytes.len(), record, record_end: None }
    }

    #[test]
    fn next_read_table() {
        // (buffered bytes, start of the current record) -> the read range, or the error.
        let rec = |len: u16| {
            let mut r = vec![0x16, 3, 3];
            r.extend_from_slice(&len.to_be_bytes());
            r.extend(std::iter::repeat_n(0xAA, len as usize));
            r
        };
        let two = [rec(10), rec(20)[..7].to_vec()].concat();
        let whole_then_none = [rec(10), rec(3)].concat();
        type Case = (Vec<u8>, usize, Result<Range<usize>, &'static str>);
        let cases: Vec<Case> = vec![
            (vec![], 0, Ok(0..5)),
            (vec![0x16, 3], 0, Ok(2..5)),
            (rec(10)[..5].to_vec(), 0, Ok(5..15)),
            (rec(10)[..9].to_vec(), 0, Ok(9..15)),
            // A whole record kept by rustls: the next one starts after it.
            (rec(10), 0, Ok(15..20)),
            // The second record of a message spanning two: its body, not the first's.
            (two.clone(), 15, Ok(22..40)),
            (two, 0, Ok(22..40)),
            (whole_then_none, 15, Ok(23..28)),
            // Headers claiming more than TLS allows.
            (vec![0x16, 3, 3, 0xff, 0xff], 0, Err("record")),
            (vec![0x16, 3, 3, 0x48, 0x01], 0, Err("record")),
            (vec![0x16, 3, 3, 0x48, 0x00], 0, Ok(5..5 + 0x4800)),
            // Sniffed bytes holding a whole record and part of the next.
            (vec![b'G', b'E', b'T', 0, 2, 1, 2, 3, 4, 0, 0, 1, 8], 0, Ok(13..18)),
            (vec![b'G', b'E', b'T', 0, 0, 1, 2, 3, 4, 0, 0, 1], 0, Ok(12..5 + 5 + 0x400)),
        ];
        for (bytes, record, want) in cases {
            let mut inc = incoming(&bytes, record);
            let got = inc.next_read();
            match (got, want) {
                (Ok(r), Ok(w)) => {
                    assert_eq!(r, w, "{bytes:?} at {record}");
                    assert!(inc.buf.len() >= r.end);
                }
                (Err(HandshakeError::RecordTooLarge(_)), Err("record")) => {}
                (got, want) => panic!("{bytes:?} at {record}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// rustls moves the fragments of a handshake message together in place,
    /// over the record headers: the current record's end is known from before.
    #[test]
    fn record_end_survives_rearranging() {
        let mut inc = incoming(&[0x16, 3, 3, 0, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0x16, 3, 3, 0, 4], 0);
        inc.note_read().unwrap();
        assert_eq!(inc.next_read().ok(), Some(20..20 + 4));
        assert_eq!((inc.record, inc.record_end), (15, Some(24)));
        inc.buf.resize(24, 0);
        inc.buf[20..24].copy_from_slice(&[11, 12, 13, 14]);
        inc.filled = 24;
        // The second fragment moved onto the second header.
        inc.buf.copy_within(20..24, 15);
        assert_eq!(inc.next_read().ok(), Some(24..29));
        assert_eq!(inc.record, 24);
        inc.discard(24);
        assert_eq!((inc.record, inc.record_end, inc.filled), (0, None, 0));
    }

    #[test]
    fn buffer_is_bounded() {
        // A record whose end lies past the bound.
        let mut inc = incoming(&[], 0);
        inc.buf = vec![0; MAX_BUFFERED];
        inc.record = MAX_BUFFERED - 100;
        inc.filled = inc.record + HEADER_LEN;
        inc.buf[inc.record..inc.filled].copy_from_slice(&[0x16, 3, 3, 0x01, 0x00]);
        assert!(matches!(inc.next_read(), Err(HandshakeError::TooLarge(n)) if n == MAX_BUFFERED - 100 + 5 + 256));
        inc.record_end = None;
        inc.buf[inc.record..inc.filled].copy_from_slice(&[0x16, 3, 3, 0x00, 0x5f]);
        assert_eq!(inc.next_read().ok(), Some(MAX_BUFFERED - 95..MAX_BUFFERED));
    }

    #[test]
    fn discard_moves_the_current_record() {
        let mut inc = incoming(&[1, 2, 3, 4, 5, 6, 7], 5);
        inc.discard(5);
        assert_eq!((&inc.buf[..inc.filled], inc.record), (&[6u8, 7][..], 0));
        inc.discard(100);
        assert_eq!((inc.filled, inc.record), (0, 0));
    }

    #[test]
    fn last_alert_table() {
        let cases: &[(&[u8], SentAlert)] = &[
            (b"", SentAlert::None),
            (&[0x15, 3, 3, 0, 2, 2, 40], SentAlert::Plain(AlertDescription::HandshakeFailure)),
            (
                &[0x16, 3, 3, 0, 1, 9, 0x15, 3, 3, 0, 2, 2, 120],
                SentAlert::Plain(AlertDescription::NoApplicationProtocol),
            ),
            (&[0x14, 3, 3, 0, 1, 1, 0x17, 3, 3, 0, 3, 1, 2, 3], SentAlert::Encrypted),
            (&[0x15, 3, 3, 0, 2, 2], SentAlert::None),
        ];
        for (bytes, want) in cases {
            assert_eq!(last_alert(bytes), *want, "{bytes:?}");
        }
        let mut records = [0x16, 3, 3, 0, 1, 116, 0x15, 3, 3, 0, 2, 2, 116, 0x17, 3, 3, 0, 2, 2, 116];
        tls12_alerts(&mut records);
        assert_eq!(records, [0x16, 3, 3, 0, 1, 116, 0x15, 3, 3, 0, 2, 2, 40, 0x17, 3, 3, 0, 2, 2, 116]);
    }
}

#[cfg(test)]
#[path = "handshake_conformance.rs"]
mod conformance;
