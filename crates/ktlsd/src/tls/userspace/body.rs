//! The userspace body writer: read a file chunk, encrypt it one record at a time
//! into the connection's output buffer, write several records per syscall.
//! File bytes are read with `RWF_NOWAIT`; a chunk not in the page cache is read
//! ahead off the event loop first (see [`crate::files::residency`]).

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use super::UserspaceTls;
use crate::files::residency::ColdReads;
use crate::files::FileRange;
use crate::tls::sizing::{RecordSizer, MAX_RECORD};
use crate::tls::error::SessionError;

/// File bytes read per `pread`.
const READ_AHEAD: usize = 64 * 1024;

/// Per-connection plaintext buffer, kept between responses: the head and the
/// file bytes that follow it are laid out in it back to back, so every record,
/// the first (head and body) included, is encrypted straight from it.
#[derive(Default)]
pub struct Buffers {
    plain: Vec<u8>,
}

/// What follows a response on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    KeepOpen,
    /// The connection's last response: its close_notify leaves in the same
    /// write, after every record of the response.
    CloseNotify,
}

/// Sends `head` then `body`, then `ending`; returns the body bytes sent.
///
/// # Cancel safety
/// Not cancel-safe as a whole (a response cut short cannot be resumed), but the
/// records already encrypted are never sent twice: see [`UserspaceTls::flush`].
// Each argument is a separate borrow of the session's parts.
#[allow(clippy::too_many_arguments)]
pub async fn send(
    tls: &mut UserspaceTls,
    stream: &TcpStream,
    sizer: &mut RecordSizer,
    bufs: &mut Buffers,
    cold: &mut ColdReads,
    head: &[u8],
    body: Option<FileRange<'_>>,
    ending: Ending,
    timeout: Duration,
) -> Result<u64, SessionError> {
    let body = body.as_ref();
    let (mut offset, mut left) = body.map_or((0, 0), |r| (r.range.start, r.len()));
    let capacity = head.len() + if body.is_some() { READ_AHEAD } else { 0 };
    let plain = &mut bufs.plain;
    if plain.len() < capacity {
        plain.resize(capacity, 0);
    }
    plain[..head.len()].copy_from_slice(head);
    // Bytes ready to encrypt: plain[start..end].
    let (mut start, mut end) = (0usize, head.len());

    loop {
        let now = Instant::now();
        let want = sizer.next_record(stream.as_fd(), now);

        if let Some(range) = body {
            if end - start < want && left > 0 {
                plain.copy_within(start..end, 0);
                end -= start;
                start = 0;
                let n = (plain.len() - end).min(usize::try_from(left).unwrap_or(usize::MAX));
                read_exact_at(cold, range.file, &mut plain[end..end + n], offset, range.range.end).await?;
                end += n;
                offset += n as u64;
                left -= n as u64;
            }
        }
        if start == end {
            break;
        }
        let n = want.min(end - start);
        tls.encrypt_record(&plain[start..start + n])?;
        start += n;
        sizer.sent(now);

        // Small records are a decision about the wire right now: send them at once.
        // Full records batch up to the output buffer's size.
        if n < MAX_RECORD || tls.spare_plaintext() < MAX_RECORD {
            tls.flush(stream, timeout).await?;
        }
    }
    if ending == Ending::CloseNotify {
        tls.queue_close_notify();
    }
    tls.flush(stream, timeout).await?;
    Ok(body.map_or(0, |r| r.len()))
}

async fn read_exact_at(
    cold: &mut ColdReads,
    file: &std::fs::File,
    mut buf: &mut [u8],
    mut offset: u64,
    end: u64,
) -> Result<(), SessionError> {
    while !buf.is_empty() {
        match cold.read_at(file, buf, offset, end).await {
            Ok(0) => return Err(SessionError::FileShrank),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) => return Err(SessionError::Io(e)),
        }
    }
    Ok(())
}
