//! The listener other members fetch cached objects from (`[cluster] peer_listen`):
//! plain HTTP/1.1 on a private address, one request per connection. Each request
//! must carry a valid `ktlsd-peer` field (see `handler::proxy::peers`: an HMAC over
//! method, Host, target, the member's name and a timestamp, keyed from the fleet's
//! secret); one that does not gets 403 and one log line (rate-limited), and nothing
//! else is served here. A request that passes is served as any client's would be
//! (its site by Host, its location, the cache lookup and a coalesced fill from the
//! origin), with the field taken off and `Connection: close` added, on this
//! listener's own thread, which is marked so that nothing it forwards goes to
//! another peer (the loop guard).
//!
//! Cancel safety: each connection is a task of its own; dropped at any await
//! (the server stopping), it closes its socket and leaves nothing behind.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::LocalSet;

use crate::files::FileRange;
use crate::handler::proxy::peers::{self, Peers, FIGURES, PEER_FIELD};
use crate::http::{self, h1, Transport};
use crate::log::AccessLog;
use crate::net;
use crate::server::Current;
use crate::vocab::RecordLayer;

/// Largest request head a peer may send.
const MAX_HEAD: usize = 16 * 1024;
/// Bytes of a file body read and written at a time.
const FILE_PIECE: usize = 64 * 1024;

/// Binds `addr` (at start: an address in use fails the start).
pub fn bind(addr: SocketAddr) -> anyhow::Result<StdListener> {
    let l = StdListener::bind(addr).with_context(|| format!("[cluster] peer_listen {addr}: cannot listen"))?;
    l.set_nonblocking(true).with_context(|| format!("[cluster] peer_listen {addr}"))?;
    Ok(l)
}

/// Starts the peer listener's thread; it stops accepting when `stop` turns true.
pub fn spawn(
    listener: StdListener,
    peers: Arc<Peers>,
    current: watch::Receiver<Current>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("ktlsd-peers".into())
        .spawn(move || {
            peers::mark_peer_thread();
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return tracing::error!("cache peers: the listener cannot start its event loop: {e}"),
            };
            LocalSet::new().block_on(&rt, accept_loop(listener, peers, current, stop));
        })
        .context("cannot start the cache peers' listener thread")
}

async fn accept_loop(
    listener: StdListener,
    peers: Arc<Peers>,
    current: watch::Receiver<Current>,
    mut stop: watch::Receiver<bool>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return tracing::error!("cache peers: the listener cannot use its socket: {e}"),
    };
    let log = std::rc::Rc::new(AccessLog::new(current.borrow().log.clone()).plain_http());
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let current = current.borrow().clone();
                log.switch(current.log.clone());
                let (peers, log, stop) = (peers.clone(), log.clone(), stop.clone());
                tokio::task::spawn_local(async move { connection(stream, peer, &peers, &current, &log, stop).await });
            }
            Err(e) => {
                tracing::warn!("cache peers: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The request line and the fields authentication needs, from a whole head.
struct Parsed<'a> {
    method: &'a str,
    target: &'a str,
    host: &'a str,
    field: Option<&'a str>,
    /// The head's length, its blank line included.
    len: usize,
}

fn parse(buf: &[u8]) -> Option<Parsed<'_>> {
    let len = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let text = std::str::from_utf8(&buf[..len]).ok()?;
    let mut lines = text.split("\r\n");
    let mut line = lines.next()?.split(' ');
    let (method, target) = (line.next()?, line.next()?);
    let (mut host, mut field) = ("", None);
    for l in lines {
        let Some((name, value)) = l.split_once(':') else { continue };
        if name.eq_ignore_ascii_case("host") {
            host = value.trim();
        } else if name.eq_ignore_ascii_case(PEER_FIELD) {
            field = Some(value.trim());
        }
    }
    Some(Parsed { method, target, host, field, len })
}

/// The head as the codec gets it: the peer field and any `Connection` field taken
/// off, `Connection: close` added.
fn rewritten(head: &str) -> Vec<u8> {
    let mut out = String::with_capacity(head.len() + 20);
    for l in head.trim_end_matches("\r\n").split("\r\n") {
        let name = l.split_once(':').map_or("", |(n, _)| n.trim());
        if name.eq_ignore_ascii_case(PEER_FIELD) || name.eq_ignore_ascii_case("connection") {
            continue;
        }
        out.push_str(l);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    out.into_bytes()
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    peers: &Peers,
    current: &Current,
    log: &AccessLog,
    stop: watch::Receiver<bool>,
) {
    let shared = &current.shared;
    let timeout = shared.config.timeouts.header;
    let mut buf = vec![0u8; MAX_HEAD];
    let mut len = 0;
    let deadline = tokio::time::Instant::now() + timeout;
    let head = loop {
        if let Some(p) = parse(&buf[..len]) {
            break p;
        }
        if len == buf.len() {
            return refuse(&stream, peer, "a request head larger than 16 KiB", timeout).await;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match net::read_some(&stream, &mut buf[len..], left).await {
            Ok(0) | Err(_) => return,
            Ok(n) => len += n,
        }
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let member = match peers.verify(head.field, head.method, head.host, head.target, now) {
        Ok(m) => m,
        Err(e) => return refuse(&stream, peer, &e.to_string(), timeout).await,
    };
    tracing::debug!("cache peers: {} {} for member {member} ({peer})", head.method, head.target);
    FIGURES.served.fetch_add(1, Relaxed);
    let text = String::from_utf8_lossy(&buf[..head.len]).into_owned();
    let mut pending = rewritten(&text);
    pending.extend_from_slice(&buf[head.len..len]);
    let mut conn = PeerConn { stream, pending, send_timeout: shared.config.timeouts.send };
    let ctx = http::Context { peer, settings: &shared.h1, sites: shared.sites(), log, shutdown: stop, alt_svc: None };
    let _ = Box::pin(h1::serve(&mut conn, ctx)).await;
    log.flush();
}

/// A 403 for a request that failed authentication, and one log line (rate-limited).
async fn refuse(stream: &TcpStream, peer: SocketAddr, why: &str, timeout: Duration) {
    FIGURES.refused.fetch_add(1, Relaxed);
    crate::log::refusal(403, "cache peer authentication", || {
        format!("cache peers: refused a request from {peer} on peer_listen: {why}")
    });
    let answer = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 10\r\nConnection: close\r\n\r\nforbidden\n";
    let _ = net::write_all(stream, answer, timeout).await;
}

/// A peer's connection as the HTTP/1.1 codec sees it: plain TCP, the head already
/// read (and rewritten) first.
struct PeerConn {
    stream: TcpStream,
    pending: Vec<u8>,
    send_timeout: Duration,
}

impl Transport for PeerConn {
    type Error = std::io::Error;

    fn timed_out(err: &std::io::Error) -> bool {
        err.kind() == std::io::ErrorKind::TimedOut
    }

    async fn read(&mut self, buf: &mut Vec<u8>, timeout: Duration) -> std::io::Result<usize> {
        if !self.pending.is_empty() {
            let n = self.pending.len();
            buf.append(&mut self.pending);
            return Ok(n);
        }
        let mut piece = [0u8; 4096];
        let n = net::read_some(&self.stream, &mut piece, timeout).await?;
        buf.extend_from_slice(&piece[..n]);
        Ok(n)
    }

    async fn send(&mut self, head: &[u8], body: Option<FileRange<'_>>) -> std::io::Result<u64> {
        net::write_all(&self.stream, head, self.send_timeout).await?;
        let Some(body) = body else { return Ok(0) };
        let mut piece = vec![0u8; FILE_PIECE];
        let mut at = body.range.start;
        while at < body.range.end {
            let want = usize::try_from(body.range.end - at).unwrap_or(FILE_PIECE).min(FILE_PIECE);
            let bytes = match body.cached_at(at, want) {
                Some(b) => b,
                None => {
                    let n = body.file.read_at(&mut piece[..want], at)?;
                    if n == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    &piece[..n]
                }
            };
            net::write_all(&self.stream, bytes, self.send_timeout).await?;
            at += bytes.len() as u64;
        }
        Ok(body.len())
    }

    fn next_record(&mut self) -> usize {
        16 * 1024
    }

    fn linger_on_close(&mut self, _stop: watch::Receiver<bool>) {}

    fn layer(&self) -> RecordLayer {
        RecordLayer::Userspace
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_read_and_rewritten_for_the_codec() {
        let raw = b"GET /a?b HTTP/1.1\r\nHost: example.com\r\nKtlsd-Peer: edge-1 5 00\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\nrest";
        let p = parse(raw).unwrap();
        assert_eq!((p.method, p.target, p.host, p.field), ("GET", "/a?b", "example.com", Some("edge-1 5 00")));
        assert_eq!(&raw[p.len..], b"rest");
        let text = std::str::from_utf8(&raw[..p.len]).unwrap();
        assert_eq!(
            rewritten(text),
            b"GET /a?b HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\nConnection: close\r\n\r\n".to_vec()
        );
        assert!(parse(b"GET / HTTP/1.1\r\nHost: x\r\n").is_none(), "not whole yet");
        let p = parse(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!((p.host, p.field), ("", None));
    }
}
