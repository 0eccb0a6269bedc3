//! Socket plumbing shared by the handshake and both record layers: bounded waits
//! for readiness and whole-buffer writes on a non-blocking `TcpStream`.

use std::io;
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::net::TcpStream;

/// Reads whatever is available into `buf`, waiting at most `timeout` for it.
/// Returns `Ok(0)` at end of stream.
pub async fn read_some(stream: &TcpStream, buf: &mut [u8], timeout: Duration) -> io::Result<usize> {
    loop {
        match try_read_draining(stream, buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            other => return other,
        }
        ready(stream, Interest::READABLE, timeout).await?;
    }
}

/// Reads what the socket holds into `buf` without waiting (`WouldBlock` when it
/// holds nothing). A short read took everything the socket had, so tokio's read
/// readiness is cleared with it: the next read waits for the next epoll edge
/// instead of first failing with EAGAIN, which saves a `recv` per request on a
/// keep-alive connection. Safe against lost wakeups: `try_io` clears only the
/// readiness it saw before the read, and bytes arriving after the read raise a
/// new edge.
pub fn try_read_draining(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    let mut short = None;
    let r = stream.try_io(Interest::READABLE, || {
        let n = io::Read::read(&mut &*socket2::SockRef::from(stream), &mut *buf)?;
        if n > 0 && n < buf.len() {
            short = Some(n);
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match short {
        Some(n) => Ok(n),
        None => r,
    }
}

/// A lingering close, as nginx's `lingering_close`: ends our side (FIN after
/// everything written), then reads and drops what the peer still sends until it
/// closes, fails, stays silent for `idle`, `total` has passed, or `max_bytes`
/// were dropped. Closing with unread input would make the kernel answer with a
/// reset, which discards response bytes still on their way to the peer.
///
/// # Cancel safety
/// Cancel-safe: dropping the future only ends the drain early.
pub async fn linger(stream: &TcpStream, total: Duration, idle: Duration, max_bytes: usize) {
    if socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Write).is_err() {
        return;
    }
    let deadline = Instant::now() + total;
    let mut sink = [0u8; 4096];
    let mut dropped = 0;
    while dropped < max_bytes {
        let wait = deadline.saturating_duration_since(Instant::now()).min(idle);
        if wait.is_zero() {
            return;
        }
        match read_some(stream, &mut sink, wait).await {
            Ok(0) | Err(_) => return,
            Ok(n) => dropped += n,
        }
    }
}

/// Writes all of `buf`. Fails with `TimedOut` when the peer accepts nothing for
/// `timeout` (a slow reader), so a stalled client cannot hold a worker's memory forever.
pub async fn write_all(stream: &TcpStream, mut buf: &[u8], timeout: Duration) -> io::Result<()> {
    while !buf.is_empty() {
        match stream.try_write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => ready(stream, Interest::WRITABLE, timeout).await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes `buf[*written..]`, advancing `*written` after every write, so that a
/// caller can resume where a cancelled call stopped. Fails with `TimedOut` as
/// [`write_all`] does.
///
/// # Cancel safety
/// Cancel-safe: `*written` counts exactly the bytes the socket took.
pub async fn write_tracked(stream: &TcpStream, buf: &[u8], written: &mut usize, timeout: Duration) -> io::Result<()> {
    while *written < buf.len() {
        match stream.try_write(&buf[*written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => *written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => ready(stream, Interest::WRITABLE, timeout).await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Runs the non-blocking operation `op` until it stops returning `WouldBlock`,
/// waiting for `interest` between attempts, each wait bounded by `timeout`.
pub async fn retry<T>(
    stream: &TcpStream,
    interest: Interest,
    timeout: Duration,
    mut op: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    loop {
        match stream.try_io(interest, &mut op) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            other => return other,
        }
        ready(stream, interest, timeout).await?;
    }
}

/// [`retry`] for an operation with its own error type `E`: `would_block` tells
/// which of its errors mean "wait for `interest`"; a timeout comes back as
/// `E::from` an `io::Error` of kind `TimedOut`.
pub async fn retry_as<T, E: From<io::Error>>(
    stream: &TcpStream,
    interest: Interest,
    timeout: Duration,
    mut op: impl FnMut() -> Result<T, E>,
    would_block: impl Fn(&E) -> bool,
) -> Result<T, E> {
    loop {
        let mut done = None;
        // `try_io` clears the readiness it saw when the closure reports WouldBlock.
        let _ = stream.try_io(interest, || match op() {
            Err(e) if would_block(&e) => Err(io::ErrorKind::WouldBlock.into()),
            other => {
                done = Some(other);
                Ok(())
            }
        });
        if let Some(r) = done {
            return r;
        }
        ready(stream, interest, timeout).await?;
    }
}

/// [`retry`] for a receive operation that must also see socket errors raised
/// alone. A kTLS socket whose record parser rejected a record may signal only
/// EPOLLERR (Linux 7.x sets the socket error without making it readable), and
/// tokio's READABLE readiness does not include errors: such a wait would last
/// until the timeout. So the wait includes ERROR, and an error-only wakeup
/// runs `op` under ERROR readiness, where the socket error is reported (and a
/// spurious one is cleared). Each readiness is tried on its own because tokio
/// attempts nothing for a combined interest.
pub async fn retry_recv<T>(
    stream: &TcpStream,
    timeout: Duration,
    mut op: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    loop {
        for interest in [Interest::READABLE, Interest::ERROR] {
            match stream.try_io(interest, &mut op) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                other => return other,
            }
        }
        ready(stream, Interest::READABLE | Interest::ERROR, timeout).await?;
    }
}

/// Waits at most `timeout` for `stream` to have bytes to read, and returns how many
/// are queued in it (`SIOCINQ`) without reading any; `Ok(0)` once the peer has
/// closed and nothing is left. Fails with `TimedOut`.
///
/// # Cancel safety
/// Cancel-safe: nothing is read.
pub async fn queued(stream: &TcpStream, timeout: Duration) -> io::Result<usize> {
    let mut one = [0u8; 1];
    match tokio::time::timeout(timeout, stream.peek(&mut one)).await {
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "peer made no progress within the timeout")),
        Ok(Ok(0)) => Ok(0),
        Ok(Ok(_)) => kernel_tls::queued(stream),
        Ok(Err(e)) => Err(e),
    }
}

/// The wait bound of a caller that bounds its waits itself (a tunnel's one
/// timer): [`ready`] then sets no timer of its own, so a wait costs no timer
/// registered and removed.
pub const UNBOUNDED: Duration = Duration::MAX;

/// Waits at most `timeout` ([`UNBOUNDED`]: without a bound of its own) for
/// `stream` to be ready for `interest`; fails with `TimedOut`.
///
/// A wait for one direction parks the task's waker in the socket's slot for
/// that direction (`poll_read_ready`, `poll_write_ready`) rather than in a
/// waiter list entry made and unlinked per wait: a socket is waited on by the
/// one task that owns it, and any waker of that task wakes it.
///
/// # Cancel safety
/// Cancel-safe: nothing is read or written.
pub async fn ready(stream: &TcpStream, interest: Interest, timeout: Duration) -> io::Result<()> {
    let wait = async {
        if interest == Interest::READABLE {
            std::future::poll_fn(|cx| stream.poll_read_ready(cx)).await
        } else if interest == Interest::WRITABLE {
            std::future::poll_fn(|cx| stream.poll_write_ready(cx)).await
        } else {
            stream.ready(interest).await.map(drop)
        }
    };
    if timeout == UNBOUNDED {
        return wait.await;
    }
    match tokio::time::timeout(timeout, wait).await {
        Ok(r) => r.map(drop),
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "peer made no progress within the timeout")),
    }
}

/// Whether `bytes`, the first of a connection, begin a PROXY protocol header (of
/// either version), so that one from a source not in `proxy_protocol_from` is
/// told apart from a mistaken client.
pub fn begins_with_proxy_header(bytes: &[u8]) -> bool {
    const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";
    bytes.starts_with(b"PROXY ") || (bytes.len() >= 5 && V2_SIGNATURE.starts_with(&bytes[..bytes.len().min(12)]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_beginnings() {
        assert!(begins_with_proxy_header(b"PROXY TCP4 "));
        assert!(begins_with_proxy_header(b"\r\n\r\n\0\r\nQUIT\n\x21"));
        assert!(begins_with_proxy_header(b"\r\n\r\n\0"));
        assert!(!begins_with_proxy_header(b"\r\n"));
        assert!(!begins_with_proxy_header(b"GET / HTTP/1.1\r\n"));
        assert!(!begins_with_proxy_header(b"\x16\x03\x01"));
    }
}
