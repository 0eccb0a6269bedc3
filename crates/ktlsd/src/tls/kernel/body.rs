//! The kernel body writer: the head goes out with `MSG_MORE`, the body with
//! `sendfile()`, and the kernel encrypts both on their way out; file pages never
//! enter user space.
//!
//! Record boundaries follow the calls: with `MSG_MORE` the kernel keeps a record
//! open; a call without it closes the record at the call's end, and a record is
//! also closed whenever it reaches 16 KiB. So a full-size policy hands the kernel
//! `sendfile` calls of several full records, and smaller policies one call per record.
//!
//! Before each window of the file is sent, its pages are checked to be in the
//! page cache, and read ahead off the event loop when they are not (see
//! [`crate::files::residency`]): `sendfile` of cold pages would block the loop.
//!
//! A body coming from another socket (a plain upstream's) takes [`splice`]:
//! socket -> pipe -> this socket with `splice(2)`, the kernel encrypting the
//! pipe's pages as it does the file's, so the body never enters user space.

use std::io;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::KernelTls;
use crate::files::residency::ColdReads;
use crate::files::FileRange;
use crate::http::Spliced;
use crate::net;
use crate::tls::error::SessionError;
use crate::tls::sizing::{RecordSizer, MAX_RECORD};

/// Largest single `sendfile`: bounds how long one connection holds the worker,
/// since the kernel encrypts everything a call moves inside the call, on this
/// thread. A 1 MiB call took 0.2-0.45 s on a software-emulated CPU (AES at a few
/// MB/s) while the worker's other connections waited; 64 KiB (four full
/// records) costs about six 10 KiB responses. Between calls the writer yields,
/// once this much has moved, so other connections on the worker run; a body up
/// to this size never yields, however many records it takes.
const MAX_SENDFILE: usize = 4 * MAX_RECORD;

/// Sends `head` then `body`; returns the body bytes sent.
///
/// # Cancel safety
/// Not cancel-safe: a response cut short leaves a record open in the kernel;
/// the connection must then be closed, not reused.
pub async fn send(
    tls: &mut KernelTls,
    stream: &TcpStream,
    sizer: &mut RecordSizer,
    cold: &mut ColdReads,
    head: &[u8],
    body: Option<FileRange<'_>>,
    timeout: Duration,
) -> Result<u64, SessionError> {
    tls.before_send(stream, timeout).await?;
    let Some(range) = body else {
        send_records(tls, stream, sizer, head, timeout).await?;
        tls.note_sent(head.len() as u64);
        return Ok(0);
    };

    // Before the head: a record left open with MSG_MORE need not wait on the disk.
    let mut warm_until = cold.ensure_warm(range.file, range.range.start, range.range.end).await;

    // The head shares the first record with the body unless it alone fills a record.
    let mut first_record_room = None;
    let now = Instant::now();
    let first = sizer.next_record(stream.as_fd(), now);
    if head.len() < first {
        send_all(stream, head, true, timeout).await?;
        first_record_room = Some(first - head.len());
    } else {
        send_all(stream, head, false, timeout).await?;
    }

    let mut offset = range.range.start;
    let end = range.range.end;
    let mut since_yield = 0;
    while offset < end {
        let now = Instant::now();
        let want = match first_record_room.take() {
            Some(room) => room,
            None => sizer.next_record(stream.as_fd(), now),
        };
        // Full records, or a size the kernel enforces itself: let the kernel cut
        // them from one large call.
        let chunk = if want >= MAX_RECORD || tls.kernel_cuts_records() { MAX_SENDFILE } else { want };
        if offset >= warm_until {
            warm_until = cold.ensure_warm(range.file, offset, end).await;
        }
        let chunk = chunk.min(usize::try_from(warm_until - offset).unwrap_or(usize::MAX));
        // One record may take several calls when the socket buffer fills;
        // the kernel keeps the record open between them.
        let target = offset + chunk as u64;
        while offset < target {
            let left = (target - offset) as usize;
            let n = net::retry(stream, Interest::WRITABLE, timeout, || {
                let r = kernel_tls::sendfile(stream.as_fd(), range.file.as_fd(), &mut offset, left);
                if r.as_ref().is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock) {
                    // Inside a sendfile the kernel hands each finished record to TCP
                    // with MSG_MORE, so TCP may hold the last one back (corked) for
                    // data that now waits on us; with TCP_NOTSENT_LOWAT those unsent
                    // bytes keep the socket unwritable and nothing moves. Setting
                    // TCP_NODELAY pushes them out.
                    let _ = stream.set_nodelay(true);
                }
                r
            })
            .await?;
            if n == 0 {
                return Err(SessionError::FileShrank);
            }
        }
        sizer.sent(now);
        since_yield += chunk;
        if offset < end && since_yield >= MAX_SENDFILE {
            // Let the worker's other connections run before the next call.
            tokio::task::yield_now().await;
            since_yield = 0;
        }
    }
    tls.note_sent(head.len() as u64 + range.len());
    Ok(range.len())
}

/// Moves `len` bytes from the plain TCP socket `from` into the kTLS socket by
/// `splice(2)` through a pipe, at most a pipe's capacity (64 KiB) per call: the
/// kernel cuts full 16 KiB records (`SPLICE_F_MORE` keeps a record open until the
/// last call), whatever the record-size policy. Each wait for `from` is bounded by
/// `read_timeout`, each wait for the client by `send_timeout`; after each 64 KiB
/// the writer yields, as [`send`] does. Returns `len`.
///
/// # Cancel safety
/// Not cancel-safe: bytes in the pipe are lost and a record may be left open; the
/// connection must then be closed, as after any error.
pub async fn splice(
    tls: &mut KernelTls,
    stream: &TcpStream,
    from: &TcpStream,
    len: u64,
    read_timeout: Duration,
    send_timeout: Duration,
) -> Result<u64, Spliced<SessionError>> {
    tls.before_send(stream, send_timeout).await.map_err(Spliced::Peer)?;
    let mut pipe = kernel_tls::Pipe::new().map_err(|e| Spliced::Peer(SessionError::Io(e)))?;
    let (mut taken, mut moved, mut since_yield) = (0u64, 0u64, 0usize);
    while moved < len {
        if pipe.held() == 0 {
            let want = usize::try_from(len - taken).unwrap_or(usize::MAX);
            let n = match net::retry(from, Interest::READABLE, read_timeout, || pipe.fill_from(from, want)).await {
                Ok(0) => return Err(Spliced::SourceClosed { moved }),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::TimedOut => return Err(Spliced::SourceTimedOut { moved }),
                Err(error) => return Err(Spliced::Source { moved, error }),
            };
            taken += n as u64;
        }
        let more = taken < len;
        let n = net::retry(stream, Interest::WRITABLE, send_timeout, || {
            let r = pipe.drain_to(stream, more);
            if r.as_ref().is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock) {
                // As for sendfile: push out a record TCP holds back (see `send`).
                let _ = stream.set_nodelay(true);
            }
            r
        })
        .await
        .map_err(|e| Spliced::Peer(e.into()))?;
        moved += n as u64;
        since_yield += n;
        if moved < len && since_yield >= MAX_SENDFILE {
            tokio::task::yield_now().await;
            since_yield = 0;
        }
    }
    tls.note_sent(len);
    Ok(len)
}

/// Sends `head`, then `len` bytes that wait in the receive queue of the plain TCP
/// socket `from` (the caller saw them there, `kernel_tls::queued`), moved by
/// `splice` through the connection's pipe: one record for both when they fit one,
/// as `send` does for a head and a file. The caller waits for `from`, never this:
/// bytes missing from it are an error, not a wait.
///
/// # Cancel safety
/// Not cancel-safe: cut short, a record stays open and the pipe may hold bytes;
/// the connection must then be closed.
pub async fn send_queued(
    tls: &mut KernelTls,
    stream: &TcpStream,
    head: &[u8],
    from: std::os::fd::BorrowedFd<'_>,
    len: usize,
    timeout: Duration,
) -> Result<(), SessionError> {
    tls.before_send(stream, timeout).await?;
    send_all(stream, head, len > 0, timeout).await?;
    let mut pipe = match tls.pipe.take() {
        Some(pipe) => pipe,
        None => kernel_tls::Pipe::new()?,
    };
    let (mut taken, mut moved) = (0usize, 0usize);
    while moved < len {
        if pipe.held() == 0 {
            let n = match pipe.fill_from(from, len - taken) {
                Ok(0) => 0,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                let why = format!("{} of {len} bytes said to wait in the source socket were not there", len - taken);
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, why).into());
            }
            taken += n;
        }
        let more = taken < len;
        moved += net::retry(stream, Interest::WRITABLE, timeout, || pipe.drain_to(stream, more)).await?;
    }
    tls.pipe = Some(pipe);
    tls.note_sent((head.len() + len) as u64);
    Ok(())
}

/// Sends bytes in memory (heads, or a batch of frames) as the records the policy
/// allows: one call when full records are allowed or the kernel cuts records itself,
/// else one call (one record) per record size.
async fn send_records(
    tls: &KernelTls,
    stream: &TcpStream,
    sizer: &mut RecordSizer,
    mut data: &[u8],
    timeout: Duration,
) -> io::Result<()> {
    while !data.is_empty() {
        let now = Instant::now();
        let want = sizer.next_record(stream.as_fd(), now);
        let n = if want >= MAX_RECORD || tls.kernel_cuts_records() { data.len() } else { want.min(data.len()) };
        send_all(stream, &data[..n], false, timeout).await?;
        sizer.sent(now);
        data = &data[n..];
    }
    Ok(())
}

async fn send_all(stream: &TcpStream, mut data: &[u8], more: bool, timeout: Duration) -> io::Result<()> {
    while !data.is_empty() {
        let n =
            net::retry(stream, Interest::WRITABLE, timeout, || kernel_tls::send(stream.as_fd(), data, more)).await?;
        data = &data[n..];
    }
    Ok(())
}
