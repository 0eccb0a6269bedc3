//! What the codecs share around one connection: the [`Context`] a connection
//! loop is given (peer, settings, sites, access log, shutdown signal), how the
//! loop [`End`]s, the access-log entry of one answered request ([`Context::log`]),
//! and the Date field value.
//!
//! Not here: framing (each codec's own), or what a response says (the handler).

use std::cell::RefCell;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use super::Transport;
use crate::handler::{Body, Header, Response, Sites};
use crate::log::{AccessEntry, AccessLog, RequestLine, TlsInfo};
use crate::vocab::{BodyPath, RecordLayer};

/// One connection's surroundings, as its loop (`h1::serve`, `h2::serve`) takes
/// them; `S` is the codec's own settings.
pub struct Context<'a, S> {
    /// The client's address, for the access log and diagnostics.
    pub peer: SocketAddr,
    /// The codec's limits and timeouts.
    pub settings: &'a S,
    /// The sites requests are served from, chosen per request by Host/:authority.
    pub sites: Sites<'a>,
    /// Where each answered request is logged (and counted).
    pub log: &'a AccessLog,
    /// Turns true when the server stops: requests under way are answered, then
    /// the connection ends.
    pub shutdown: watch::Receiver<bool>,
    /// The `Alt-Svc` value answers carry (HTTP/3 on this port), or `None`.
    pub alt_svc: Option<&'a str>,
}

/// How the connection ended, for the caller's counters.
#[derive(Debug)]
pub enum End<E> {
    /// The client closed, or we close after `Connection: close`, a final error
    /// response or GOAWAY: the caller closes gracefully.
    Done,
    /// Idle keep-alive, slow request head, or a client that stopped reading (send timeout).
    Timeout,
    /// The transport failed mid-connection; the caller must not close gracefully.
    Error(E),
    /// The peer closed in the middle of a request body it had announced.
    Truncated,
    /// A response was cut after its head (its upstream failed): the caller must not
    /// close gracefully, so that the client cannot take the part for the whole.
    Aborted,
}

/// A request as the access log names it: its request line and the two fields logged.
#[derive(Debug, Clone, Copy)]
pub struct Logged<'a> {
    pub line: RequestLine<'a>,
    pub referer: Option<&'a str>,
    pub user_agent: Option<&'a str>,
    /// The client's address as the pipeline found it (behind a trusted proxy, the one
    /// its forwarding fields name); `None`: the connection's peer.
    pub client: Option<std::net::IpAddr>,
    /// What the handler noted of the request (request id, user, upstreams).
    pub notes: Option<&'a crate::log::Notes>,
}

/// The client of a request as the pipeline found it, and what the handler noted of
/// the request: what a codec keeps of it for the log line.
#[derive(Debug, Clone, Default)]
pub struct Who {
    pub ip: Option<std::net::IpAddr>,
    pub notes: crate::log::Notes,
}

impl Who {
    pub fn of(req: &crate::handler::Request) -> Who {
        Who { ip: req.client, notes: req.notes.clone() }
    }

    /// The connection's peer, for a request that could not be read.
    pub fn peer(ip: std::net::IpAddr) -> Who {
        Who { ip: Some(ip), notes: Default::default() }
    }
}

/// What one answer sent, and when.
#[derive(Debug, Clone, Copy)]
pub struct Sent {
    pub status: u16,
    /// Body bytes sent (the head not counted, as nginx's `$body_bytes_sent`).
    pub bytes: u64,
    /// When the request began to arrive.
    pub started: Instant,
    /// From `started` until the response began to be sent.
    pub ttfb: Duration,
    /// How the body left; `None` when no body byte was sent.
    pub body: Option<BodyPath>,
}

impl<S> Context<'_, S> {
    /// Writes the access-log entry of one answer sent on `conn`; `request` is
    /// `None` when no request head could be read.
    pub fn log(&self, conn: &impl Transport, request: Option<Logged<'_>>, sent: Sent) {
        self.log_host(conn, request, sent, None);
    }

    /// [`Context::log`] naming the Host or :authority the request gave, which
    /// also names the site that answered.
    pub fn log_host(&self, conn: &impl Transport, request: Option<Logged<'_>>, sent: Sent, host: Option<&str>) {
        self.log_over(conn.layer(), conn.tls(), conn.client_subject(), request, sent, host);
    }

    /// [`Context::log_host`] for a connection that is no [`Transport`] (HTTP/3's QUIC).
    pub fn log_over(
        &self,
        layer: RecordLayer,
        tls: Option<TlsInfo>,
        client_subject: Option<&str>,
        request: Option<Logged<'_>>,
        sent: Sent,
        host: Option<&str>,
    ) {
        let site = self.sites.label(host);
        let peer = match request.and_then(|r| r.client) {
            Some(ip) => SocketAddr::new(ip, self.peer.port()),
            None => self.peer,
        };
        self.log.write(&AccessEntry {
            peer,
            request: request.map(|r| r.line),
            status: sent.status,
            bytes: sent.bytes,
            started: sent.started,
            ttfb: sent.ttfb,
            body: sent.body.filter(|_| sent.bytes > 0),
            layer,
            referer: request.and_then(|r| r.referer),
            user_agent: request.and_then(|r| r.user_agent),
            tls,
            client_subject,
            host,
            site: &site,
            notes: request.and_then(|r| r.notes),
        });
    }

    /// `response` with the connection's `Alt-Svc` field, when it has one.
    pub fn advertise(&self, mut response: Response) -> Response {
        if let Some(v) = self.alt_svc {
            response.headers.push(Header::Field("Alt-Svc".into(), v.to_string()));
        }
        response
    }

    /// Whether the server is stopping.
    pub fn stopping(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// How `body` leaves through `conn`: a file's bytes as the transport sends
/// files, bytes in memory by copy; `None` without a body.
pub fn body_path(conn: &impl Transport, body: &Body) -> Option<BodyPath> {
    match body {
        Body::Empty => None,
        Body::Bytes(_) => Some(BodyPath::Copy),
        Body::File { .. } | Body::Parts { .. } => Some(conn.file_path()),
    }
}

thread_local! {
    /// The Date header value, formatted at most once a second per worker.
    static DATE: RefCell<(u64, String)> = const { RefCell::new((0, String::new())) };
}

/// The Date field value for a response sent now.
pub fn http_date_now() -> String {
    with_http_date_now(str::to_string)
}

/// Hands the Date field value for a response sent now to `use_it`, without a copy.
pub fn with_http_date_now<R>(use_it: impl FnOnce(&str) -> R) -> R {
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != secs || d.1.is_empty() {
            *d = (secs, httpdate::fmt_http_date(now));
        }
        use_it(&d.1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn date_is_now() {
        let d = httpdate::parse_http_date(&http_date_now()).unwrap();
        let now = SystemTime::now();
        assert!(d <= now && now.duration_since(d).unwrap().as_secs() < 5);
    }
}
