//! Tunnels through a `[[proxy]]` rule: a WebSocket (RFC 6455) asked for by an
//! HTTP/1.1 `Upgrade` or an HTTP/2 extended CONNECT (RFC 8441), always an HTTP/1.1
//! upgrade to the upstream. The upstream's 101 is checked ([`check_switch`]: its
//! `Upgrade` names the protocol asked for, and for a translated CONNECT its
//! `Sec-WebSocket-Accept` answers the key this hop made), its head made the
//! client's ([`switched_head`]: a 101 for HTTP/1.1, a 200 for an extended CONNECT),
//! then [`relay`] moves bytes both ways over the codec's [`Downstream`] until either
//! side closes, nothing moves for the rule's `tunnel_idle_timeout`, or the
//! connection is retired and [`RETIRE_GRACE`] has passed.
//!
//! Memory stays bounded whoever is slow: the relay holds at most one read from
//! each side ([`PIECE`] from the upstream, one client read towards it) and reads a
//! side again only once what it read last has been handed on, so a side that does
//! not read holds the other back (TCP's own window, HTTP/2's flow control) instead
//! of filling a buffer. On kernel TLS, bytes from a plain upstream are spliced into
//! the client's socket, those queued in the upstream socket at a time.
//!
//! Cheap per message: one timer per tunnel, set once and set again only when it
//! fires ([`on_timer`]: each read and write just notes the time), no timeout of
//! its own on a client or upstream read ([`crate::net::UNBOUNDED`]), each wait
//! parked in its socket's slot for that direction, the retirement signal's wait made once, the
//! client's bytes written up in the turn that read them, and a plain upstream
//! read that drained its socket clears its readiness, so the next wait does not
//! begin with a read that finds nothing. The upstream read buffer grows from
//! [`FIRST_READ`] as reads fill it (to [`PIECE`]), so an idle tunnel holds none
//! and one of small messages a small one.
//!
//! Not here: the exchange that opens the tunnel (`super::Exchange`), framing (the
//! codecs behind [`Downstream`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio::io::{AsyncWrite, Interest, ReadHalf, WriteHalf};
use tokio::net::TcpStream;

use super::headers::Upgrade;
use super::parse::Head;
use super::upstream::Conn;
use super::{buffers, client_fields, metrics, pool, Failure, FailureKind, PIECE};
use crate::handler::downstream::{Downstream, StreamEnd};
use crate::handler::{Body, Header, Response, Status};
use crate::net;
use crate::vocab::{BodyPath, Spliced};

/// How long an open tunnel goes on once its connection is retired by a reload or
/// a stop: long enough for a WebSocket application to say goodbye in its own
/// protocol, short enough that a reload does not keep old connections for long.
pub const RETIRE_GRACE: Duration = Duration::from_secs(10);

/// RFC 6455 section 1.3: appended to the key before hashing it into the accept value.
const WEBSOCKET_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// A new `Sec-WebSocket-Key`: 16 random bytes in base64 (RFC 6455 section 4.1).
pub fn new_key() -> String {
    let mut nonce = [0u8; 16];
    if aws_lc_rs::rand::fill(&mut nonce).is_err() {
        // The key only tells a WebSocket server from a confused one; it need not be secret.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        nonce = t.as_nanos().to_le_bytes();
    }
    base64(&nonce)
}

/// The `Sec-WebSocket-Accept` that answers `key` (RFC 6455 section 4.2.2).
pub fn accept_for(key: &str) -> String {
    let mut input = key.as_bytes().to_vec();
    input.extend_from_slice(WEBSOCKET_GUID.as_bytes());
    base64(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, &input).as_ref())
}

/// Standard base64 with padding (RFC 4648 section 4).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The first value of field `name` (any case) in `head`.
fn field<'h>(head: &'h Head, name: &str) -> Option<&'h str> {
    head.fields.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

/// Whether the upstream's 101 switches to what was asked: its `Upgrade` names the
/// protocol (a 101 without it is refused), and when this hop made the key, its
/// `Sec-WebSocket-Accept` is the one that answers it. `Err`: why not (a 502).
pub fn check_switch(head: &Head, asked: &Upgrade) -> Result<(), &'static str> {
    let upgrade = field(head, "upgrade").ok_or("a 101 without Upgrade")?;
    let named = upgrade
        .split(',')
        .any(|p| p.split('/').next().is_some_and(|name| name.trim().eq_ignore_ascii_case(&asked.protocol)));
    if !named {
        return Err("a 101 that switches to another protocol than the one asked for");
    }
    if let Some(key) = &asked.key {
        if field(head, "sec-websocket-accept") != Some(accept_for(key).as_str()) {
            return Err("a 101 whose Sec-WebSocket-Accept does not answer the key");
        }
    }
    Ok(())
}

/// The client's head for the upstream's checked 101 (its fields moved out): for
/// an HTTP/1.1 client a 101 with `Upgrade` and `Connection: upgrade`; for an
/// extended CONNECT (`connect`) a 200 without the fields of the HTTP/1.1
/// handshake (RFC 8441 section 5: `Sec-WebSocket-Accept` belongs to the hop this
/// server made). The end-to-end fields (`Sec-WebSocket-Protocol`,
/// `-Extensions`, cookies) go on either way.
pub fn switched_head(head: &mut Head, asked: &Upgrade, connect: bool, cache_status: &str) -> Response {
    let mut fields = client_fields(head, cache_status);
    let status = if connect {
        fields.retain(|h| !h.name().eq_ignore_ascii_case("sec-websocket-accept"));
        Status::OK
    } else {
        fields.push(Header::Field("Upgrade".into(), asked.protocol.clone()));
        fields.push(Header::Field("Connection".into(), "upgrade".into()));
        Status(101)
    };
    Response { status, headers: fields, body: Body::Empty, refused: None }
}

/// The upstream connection of a tunnel, counted in flight (and against the
/// worker's descriptors) until dropped, then closed: a tunnel's connection is
/// never pooled.
pub struct Wire {
    halves: Halves,
    url: String,
    /// Bytes that came after the 101's head: the tunnel's first.
    early: Vec<u8>,
}

enum Halves {
    Plain(TcpStream),
    /// TLS or a Unix socket, split in halves (with whether bytes wait for a flush).
    Split(ReadHalf<Boxed>, WriteHalf<Boxed>, bool),
}

/// A connection read and written through its halves: TLS or a Unix socket.
trait Duplex: tokio::io::AsyncRead + AsyncWrite + Unpin {}
impl<T: tokio::io::AsyncRead + AsyncWrite + Unpin> Duplex for T {}
type Boxed = Box<dyn Duplex>;

impl Wire {
    pub(super) fn new(conn: Conn, url: String, early: Vec<u8>) -> Wire {
        let halves = match conn {
            Conn::Plain(s) => Halves::Plain(s),
            Conn::Unix(s) => {
                let (r, w) = tokio::io::split(Box::new(s) as Boxed);
                Halves::Split(r, w, false)
            }
            Conn::Tls(s) => {
                let (r, w) = tokio::io::split(s as Boxed);
                Halves::Split(r, w, false)
            }
        };
        Wire { halves, url, early }
    }

    /// The bytes that came with the 101, taken.
    pub fn take_early(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.early)
    }

    fn failure(&self, kind: FailureKind, detail: String) -> Failure {
        Failure { status: Status::BAD_GATEWAY, kind, upstream: self.url.clone(), detail }
    }

    fn split(&mut self) -> (Reader<'_>, Writer<'_>) {
        match &mut self.halves {
            Halves::Plain(s) => (Reader::Plain(s), Writer::Plain(s)),
            Halves::Split(r, w, dirty) => (Reader::Split(r), Writer::Split(w, dirty)),
        }
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        pool::finished(&self.url);
    }
}

/// The upstream's side towards the client.
enum Reader<'w> {
    Plain(&'w TcpStream),
    Split(&'w mut ReadHalf<Boxed>),
}

/// The upstream's side from the client.
enum Writer<'w> {
    Plain(&'w TcpStream),
    /// With whether bytes written may still wait in the TLS session for a flush.
    Split(&'w mut WriteHalf<Boxed>, &'w mut bool),
}

impl Reader<'_> {
    fn plain(&self) -> Option<&TcpStream> {
        match self {
            Reader::Plain(s) => Some(s),
            Reader::Split(_) => None,
        }
    }

    /// Waits for the upstream's next bytes: with `splice`, says how many are
    /// queued in its plain socket without reading them; else reads them into
    /// `into` (its bytes from the start; see [`room`]). `Ok(0)`: the upstream
    /// closed. No timer of its own: the relay's idle timer bounds every wait.
    ///
    /// A plain read shorter than `into` drained the socket, so its readiness is
    /// cleared then ([`crate::net::try_read_draining`]): the next wait sleeps
    /// instead of first trying a read that would only say `EAGAIN` (one system
    /// call per message less).
    ///
    /// # Cancel safety
    /// Cancel-safe: a read is done whole or not at all.
    async fn next(&mut self, into: &mut Vec<u8>, splice: bool) -> io::Result<usize> {
        match self {
            Reader::Plain(s) if splice => {
                let mut one = [0u8; 1];
                match s.peek(&mut one).await? {
                    0 => Ok(0),
                    _ => kernel_tls::queued(&**s),
                }
            }
            Reader::Plain(s) => loop {
                if into.is_empty() {
                    // An idle tunnel holds no read buffer until its upstream speaks.
                    net::ready(s, Interest::READABLE, net::UNBOUNDED).await?;
                    room(into, 0);
                }
                match net::try_read_draining(s, into) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        net::ready(s, Interest::READABLE, net::UNBOUNDED).await?
                    }
                    Ok(n) => return Ok(room(into, n)),
                    Err(e) => return Err(e),
                }
            },
            Reader::Split(r) => {
                use tokio::io::AsyncReadExt;
                if into.is_empty() {
                    room(into, 0);
                }
                match r.read(into).await {
                    Ok(n) => Ok(room(into, n)),
                    // A peer that closes without close_notify ends the tunnel as plain TCP would.
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(0),
                    Err(e) => Err(e),
                }
            }
        }
    }
}

/// The first size of a tunnel's upstream read buffer.
const FIRST_READ: usize = 4 * 1024;

/// Sizes the upstream read buffer of a tunnel after a read of `n` bytes into
/// it, and returns `n`: an empty buffer gets [`FIRST_READ`] bytes, one that a
/// read filled grows four times, up to [`PIECE`]. The buffer is zeroed as it
/// grows, once, so a tunnel of small messages keeps a small buffer and one of
/// bulk bytes reads [`PIECE`] at a time; what it held is kept.
fn room(into: &mut Vec<u8>, n: usize) -> usize {
    if into.is_empty() {
        into.resize(FIRST_READ, 0);
    } else if n == into.len() && n < PIECE {
        into.resize((n * 4).min(PIECE), 0);
    }
    n
}

impl Writer<'_> {
    /// Whether bytes written wait in the TLS session for a flush.
    fn dirty(&self) -> bool {
        matches!(self, Writer::Split(_, d) if **d)
    }

    /// Writes what of `bytes` a plain socket takes now, without waiting: the
    /// client's bytes usually leave in the same turn of the relay that read them.
    /// `Ok(0)` when it takes none now (or for TLS and Unix upstreams, which
    /// [`Writer::push`] serves).
    fn try_push(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            Writer::Plain(s) if !bytes.is_empty() => match s.try_write(bytes) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                r => r,
            },
            _ => Ok(0),
        }
    }

    /// Writes some of `bytes` (or, when there are none, flushes what the TLS
    /// session holds); returns how many of `bytes` were taken.
    ///
    /// # Cancel safety
    /// Cancel-safe: bytes are taken only when the call returns.
    async fn push(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            Writer::Plain(s) => loop {
                net::ready(s, Interest::WRITABLE, net::UNBOUNDED).await?;
                match s.try_write(bytes) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    r => return r,
                }
            },
            Writer::Split(w, dirty) => {
                if bytes.is_empty() {
                    std::future::poll_fn(|cx| Pin::new(&mut **w).poll_flush(cx)).await?;
                    **dirty = false;
                    return Ok(0);
                }
                let n = std::future::poll_fn(|cx| Pin::new(&mut **w).poll_write(cx, bytes)).await?;
                **dirty = true;
                Ok(n)
            }
        }
    }
}

/// What a tunnel moved and how it ended.
pub struct Relayed<E> {
    /// Bytes sent to the client after the head.
    pub to_client: u64,
    /// Bytes sent to the upstream.
    pub to_upstream: u64,
    /// How the client's bytes left (splice for any part spliced).
    pub path: BodyPath,
    pub end: StreamEnd<E>,
}

/// The time limits of a tunnel.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Nothing moved either way for this long: the tunnel ends.
    pub idle: Duration,
    /// Each wait of a splice for the upstream (the bytes are queued: it does not wait).
    pub read: Duration,
}

/// What the tunnel's timer firing means.
#[derive(Debug, PartialEq)]
enum Fired {
    /// The grace after the connection was retired has passed.
    Retired,
    /// Nothing moved for the idle timeout.
    Idle,
    /// Bytes moved since it was set: it is set again, to this.
    Again(Instant),
}

/// What the tunnel's timer firing at `now` means, with bytes last moved at
/// `last` and the retirement grace ending at `retire_at`.
fn on_timer(now: Instant, last: Instant, idle: Duration, retire_at: Option<Instant>) -> Fired {
    if retire_at.is_some_and(|r| r <= now) {
        return Fired::Retired;
    }
    let idle_at = last + idle;
    if idle_at <= now {
        return Fired::Idle;
    }
    Fired::Again(retire_at.map_or(idle_at, |r| r.min(idle_at)))
}

/// What woke the relay.
enum Event<E> {
    Timer,
    Retired,
    Wrote(io::Result<usize>),
    Client(Result<bool, E>),
    Upstream(io::Result<usize>),
}

/// Moves bytes both ways between the client behind `d` and the upstream of `wire`
/// once the client has the tunnel's head, until the upstream closes, the client
/// ends its side and what it sent is through, nothing moves for `limits.idle`, or
/// [`RETIRE_GRACE`] after the connection is retired. An upstream that fails ends
/// it with [`StreamEnd::Cut`] (the codec cuts the connection or resets the stream).
///
/// # Cancel safety
/// Dropped at any await (the client reset the stream), it closes the upstream
/// connection; bytes on their way are lost, as they would be on a broken tunnel.
pub async fn relay<D: Downstream>(d: &mut D, wire: &mut Wire, limits: Limits) -> Relayed<D::Error> {
    let mut out = Relayed { to_client: 0, to_upstream: 0, path: BodyPath::Copy, end: StreamEnd::Complete };
    // The retirement signal's wait, made once (not anew per event); a signal gone
    // is as good as one turned true.
    let retired = d.retired();
    let watch_retired = retired.is_some();
    let retirement = async move {
        if let Some(mut r) = retired {
            let _ = r.wait_for(|r| *r).await;
        }
    };
    tokio::pin!(retirement);
    let url = wire.url.clone();
    let (mut reader, mut writer) = wire.split();
    let splice = d.splices_tunnel() && reader.plain().is_some();
    let mut retire_at: Option<Instant> = None;
    // Bytes from the client on their way up, and the client's next read.
    let (mut to_up, mut inbox) = (Vec::new(), Vec::new());
    // The upstream's reads, each into this one buffer, sized by `room`.
    let mut piece = buffers::take();
    let mut client_open = true;
    // One timer for the whole tunnel, not one per read or write: each event only
    // notes the time, and when the timer fires it either ends the tunnel or is
    // set again to the idle deadline that last activity gives.
    let mut last = Instant::now();
    let timer = tokio::time::sleep_until((last + limits.idle).into());
    tokio::pin!(timer);
    let failure = |kind, what: &str, e: &dyn std::fmt::Display| (kind, format!("{what}: {e}"));
    let cut: Option<(FailureKind, String)> = loop {
        if !client_open && to_up.is_empty() && !writer.dirty() {
            break None;
        }
        // Not biased: a side that always has bytes must not starve the other.
        let event = tokio::select! {
            () = &mut timer => Event::Timer,
            () = &mut retirement, if retire_at.is_none() && watch_retired => Event::Retired,
            r = writer.push(&to_up), if !to_up.is_empty() || writer.dirty() => Event::Wrote(r),
            r = d.read_tunnel(&mut inbox), if client_open && to_up.is_empty() => Event::Client(r),
            r = reader.next(&mut piece, splice) => Event::Upstream(r),
        };
        match event {
            Event::Timer => match on_timer(Instant::now(), last, limits.idle, retire_at) {
                Fired::Retired => {
                    tracing::debug!("tunnel to {url}: ended {RETIRE_GRACE:?} after its connection was retired");
                    break None;
                }
                Fired::Idle => {
                    tracing::debug!("tunnel to {url}: idle for {:?}, closed", limits.idle);
                    break None;
                }
                Fired::Again(at) => timer.as_mut().reset(at.into()),
            },
            Event::Retired => {
                let at = Instant::now() + RETIRE_GRACE;
                retire_at = Some(at);
                if at < timer.deadline().into_std() {
                    timer.as_mut().reset(at.into());
                }
            }
            Event::Wrote(Ok(n)) => {
                to_up.drain(..n);
                out.to_upstream += n as u64;
                last = Instant::now();
            }
            Event::Wrote(Err(e)) => break Some(failure(FailureKind::Send, "writing to the tunnel", &e)),
            Event::Client(Ok(true)) => {
                std::mem::swap(&mut to_up, &mut inbox);
                last = Instant::now();
                match writer.try_push(&to_up) {
                    Ok(n) => {
                        to_up.drain(..n);
                        out.to_upstream += n as u64;
                    }
                    Err(e) => break Some(failure(FailureKind::Send, "writing to the tunnel", &e)),
                }
            }
            Event::Client(Ok(false)) => client_open = false,
            Event::Client(Err(e)) => {
                out.end = StreamEnd::Client(e);
                break None;
            }
            Event::Upstream(Ok(0)) => break None,
            Event::Upstream(Ok(n)) => {
                last = Instant::now();
                let sent = if splice {
                    let Some(from) = reader.plain() else { break None };
                    let (r, wrote) = alongside(d.splice(from, n as u64, limits.read), &mut writer, &mut to_up).await;
                    out.to_upstream += wrote.0;
                    if let Some(e) = wrote.1 {
                        break Some(failure(FailureKind::Send, "writing to the tunnel", &e));
                    }
                    match r {
                        Ok(moved) => {
                            metrics::body_bytes(BodyPath::Splice.label(), moved);
                            out.path = BodyPath::Splice;
                            Ok(moved)
                        }
                        Err(Spliced::Peer(e)) => Err(e),
                        Err(Spliced::Unsupported) => break Some((FailureKind::Body, "splice unsupported".into())),
                        Err(Spliced::SourceClosed { moved }) => {
                            out.to_client += moved;
                            break None;
                        }
                        Err(Spliced::SourceTimedOut { moved }) => {
                            out.to_client += moved;
                            break Some((FailureKind::Timeout, "reading the tunnel: timed out".into()));
                        }
                        Err(Spliced::Source { moved, error }) => {
                            out.to_client += moved;
                            break Some(failure(FailureKind::Body, "reading the tunnel", &error));
                        }
                    }
                } else {
                    let bytes = &piece[..n];
                    let (r, wrote) = alongside(d.send_body(bytes, false), &mut writer, &mut to_up).await;
                    out.to_upstream += wrote.0;
                    if let Some(e) = wrote.1 {
                        break Some(failure(FailureKind::Send, "writing to the tunnel", &e));
                    }
                    metrics::body_bytes(BodyPath::Copy.label(), n as u64);
                    r.map(|()| n as u64)
                };
                match sent {
                    Ok(n) => out.to_client += n,
                    Err(e) => {
                        out.end = StreamEnd::Client(e);
                        break None;
                    }
                }
            }
            Event::Upstream(Err(e)) => break Some(failure(FailureKind::Body, "reading the tunnel", &e)),
        }
    };
    buffers::give(piece);
    if let Some((kind, detail)) = cut {
        let f = wire.failure(kind, detail);
        metrics::error(f.kind.label());
        tracing::warn!(
            "{f}; tunnel cut after {} bytes to the client, {} to the upstream",
            out.to_client,
            out.to_upstream
        );
        d.abort(&f);
        out.end = StreamEnd::Cut(f);
    } else if matches!(out.end, StreamEnd::Complete) {
        if let Err(e) = d.send_body(&[], true).await {
            out.end = StreamEnd::Client(e);
        }
    }
    out
}

/// Runs `f` (a send to the client) while writing what waits in `to_up` to the
/// upstream, so that neither direction waits on the other; returns `f`'s output,
/// the bytes written up meanwhile and a failure of the upstream's, if any.
async fn alongside<F: Future>(
    f: F,
    writer: &mut Writer<'_>,
    to_up: &mut Vec<u8>,
) -> (F::Output, (u64, Option<io::Error>)) {
    let mut f = std::pin::pin!(f);
    let (mut wrote, mut failed) = (0u64, None);
    loop {
        tokio::select! {
            biased;
            r = &mut f => return (r, (wrote, failed)),
            r = writer.push(to_up), if failed.is_none() && (!to_up.is_empty() || writer.dirty()) => match r {
                Ok(n) => {
                    to_up.drain(..n);
                    wrote += n as u64;
                }
                Err(e) => failed = Some(e),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::proxy::parse::Framing;

    fn head(status: u16, fields: &[(&str, &str)]) -> Head {
        let fields = fields.iter().map(|(n, v)| (crate::handler::response::field_name(n), v.to_string())).collect();
        Head { status, version: "1.1", fields, framing: Framing::None, reusable: false }
    }

    #[test]
    fn the_timer_ends_a_tunnel_only_when_due() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        for (now, last, retire_at, want) in [
            // Nothing moved since it was set.
            (s(60), s(0), None, Fired::Idle),
            (s(61), s(0), None, Fired::Idle),
            // Bytes moved meanwhile: the idle deadline moves with them.
            (s(60), s(30), None, Fired::Again(t0 + s(90))),
            (s(60), s(59), None, Fired::Again(t0 + s(119))),
            // Retired: the grace ends it, idle or not; before, the earlier of the two.
            (s(10), s(9), Some(s(10)), Fired::Retired),
            (s(10), s(9), Some(s(20)), Fired::Again(t0 + s(20))),
            (s(60), s(50), Some(s(200)), Fired::Again(t0 + s(110))),
            (s(60), s(0), Some(s(200)), Fired::Idle),
        ] {
            let got = on_timer(t0 + now, t0 + last, s(60), retire_at.map(|r| t0 + r));
            assert_eq!(got, want, "now {now:?}, last {last:?}, retire at {retire_at:?}");
        }
    }

    #[test]
    fn the_read_buffer_grows_only_as_reads_fill_it() {
        let mut b = Vec::new();
        assert_eq!(room(&mut b, 0), 0);
        assert_eq!(b.len(), FIRST_READ, "sized before the first read");
        assert_eq!(room(&mut b, 32), 32);
        assert_eq!(b.len(), FIRST_READ, "a short read leaves it");
        b[..4].copy_from_slice(b"abcd");
        let mut sizes = Vec::new();
        while b.len() < PIECE {
            let n = b.len();
            assert_eq!(room(&mut b, n), n);
            sizes.push(b.len());
        }
        assert_eq!(sizes, [4 * FIRST_READ, PIECE]);
        assert_eq!(&b[..4], b"abcd", "what it held is kept");
        room(&mut b, PIECE);
        assert_eq!(b.len(), PIECE, "never past a piece");
    }

    #[test]
    fn base64_and_the_accept_value() {
        for (bytes, want) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"fooba", "Zm9vYmE="),
        ] {
            assert_eq!(base64(bytes), want, "{bytes:?}");
        }
        // RFC 6455 section 1.3's example.
        assert_eq!(accept_for("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        let (a, b) = (new_key(), new_key());
        assert_eq!(a.len(), 24, "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn a_101_switches_only_to_what_was_asked() {
        let ws = Upgrade { protocol: "websocket".into(), key: None };
        let key = "dGhlIHNhbXBsZSBub25jZQ==".to_string();
        let translated = Upgrade { protocol: "websocket".into(), key: Some(key) };
        let good = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";
        for (fields, asked, want) in [
            (&[("Upgrade", "websocket"), ("Connection", "Upgrade")][..], &ws, Ok(())),
            (&[("upgrade", "WebSocket")], &ws, Ok(())),
            (&[("Connection", "Upgrade")], &ws, Err("a 101 without Upgrade")),
            (&[("Upgrade", "h2c")], &ws, Err("a 101 that switches to another protocol than the one asked for")),
            (&[("Upgrade", "websocket"), ("Sec-WebSocket-Accept", good)], &translated, Ok(())),
            (
                &[("Upgrade", "websocket"), ("Sec-WebSocket-Accept", "bm9wZQ==")],
                &translated,
                Err("a 101 whose Sec-WebSocket-Accept does not answer the key"),
            ),
            (&[("Upgrade", "websocket")], &translated, Err("a 101 whose Sec-WebSocket-Accept does not answer the key")),
            // The client checks its own key's answer.
            (&[("Upgrade", "websocket"), ("Sec-WebSocket-Accept", "bm9wZQ==")], &ws, Ok(())),
        ] {
            assert_eq!(check_switch(&head(101, fields), asked), want, "{fields:?}");
        }
    }

    /// RFC 6455 over HTTP/1.1 against RFC 8441 over HTTP/2: the same 101 becomes
    /// each client's head.
    #[test]
    fn the_101_as_each_client_gets_it() {
        let ws = Upgrade { protocol: "websocket".into(), key: None };
        let upstream = [
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
            ("Sec-WebSocket-Protocol", "chat"),
            ("Server", "app"),
        ];
        let names = |r: &Response| -> Vec<String> { r.headers.iter().map(|h| h.name().to_ascii_lowercase()).collect() };
        let h1 = switched_head(&mut head(101, &upstream), &ws, false, "ktlsd; fwd=uri-miss");
        assert_eq!(h1.status, Status(101));
        assert_eq!(
            names(&h1),
            ["sec-websocket-accept", "sec-websocket-protocol", "via", "cache-status", "upgrade", "connection"]
        );
        let h2 = switched_head(&mut head(101, &upstream), &ws, true, "ktlsd; fwd=uri-miss");
        assert_eq!(h2.status, Status::OK);
        assert_eq!(names(&h2), ["sec-websocket-protocol", "via", "cache-status"]);
    }
}
