//! The userspace body writer: read a file chunk, encrypt it one record at a time
//! into the connection's output buffer, write several records per syscall.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use super::tcp::TcpState;
use super::{truncated, FileRange, RecordSizer, MAX_RECORD};
use crate::tls::userspace::UserspaceTls;

/// File bytes read per `pread`.
const READ_AHEAD: usize = 64 * 1024;

/// Per-connection buffers, kept between responses.
#[derive(Default)]
pub struct Buffers {
    read_ahead: Vec<u8>,
    /// Assembles a record that starts with the head and continues with file bytes.
    first: Vec<u8>,
}

/// Sends `head` then `body`; returns the body bytes sent.
pub async fn send(
    tls: &mut UserspaceTls,
    stream: &TcpStream,
    sizer: &mut RecordSizer,
    bufs: &mut Buffers,
    mut head: &[u8],
    body: Option<FileRange<'_>>,
    timeout: Duration,
) -> io::Result<u64> {
    let (file, mut offset, mut left) = match body {
        Some(r) => (Some(r.file), r.offset, r.len),
        None => (None, 0, 0),
    };
    if file.is_some() && bufs.read_ahead.len() < READ_AHEAD {
        bufs.read_ahead.resize(READ_AHEAD, 0);
    }
    // File bytes read but not yet encrypted: read_ahead[start..end].
    let (mut start, mut end) = (0usize, 0usize);
    let mut sent = 0u64;

    loop {
        let now = Instant::now();
        let tcp = if sizer.wants_tcp_state() { TcpState::read(stream.as_fd()).ok() } else { None };
        let want = sizer.next_len(now, tcp.as_ref()).clamp(1, MAX_RECORD);

        if let Some(file) = file {
            if end - start < want && left > 0 {
                bufs.read_ahead.copy_within(start..end, 0);
                end -= start;
                start = 0;
                let n = (bufs.read_ahead.len() - end).min(usize::try_from(left).unwrap_or(usize::MAX));
                read_exact_at(file, &mut bufs.read_ahead[end..end + n], offset)?;
                end += n;
                offset += n as u64;
                left -= n as u64;
            }
        }

        let record_len = if !head.is_empty() {
            if head.len() >= want || end == start {
                let n = head.len().min(want);
                tls.encrypt_record(&head[..n])?;
                head = &head[n..];
                n
            } else {
                let from_file = (want - head.len()).min(end - start);
                bufs.first.clear();
                bufs.first.extend_from_slice(head);
                bufs.first.extend_from_slice(&bufs.read_ahead[start..start + from_file]);
                tls.encrypt_record(&bufs.first)?;
                start += from_file;
                sent += from_file as u64;
                head = &[];
                bufs.first.len()
            }
        } else if end > start {
            let n = want.min(end - start);
            tls.encrypt_record(&bufs.read_ahead[start..start + n])?;
            start += n;
            sent += n as u64;
            n
        } else {
            break;
        };
        sizer.sent(now);

        // Small records are a decision about the wire right now: send them at once.
        // Full records batch up to the output buffer's size.
        if record_len < MAX_RECORD || tls.spare_plaintext() < MAX_RECORD {
            tls.flush(stream, timeout).await?;
        }
    }
    tls.flush(stream, timeout).await?;
    Ok(sent)
}

fn read_exact_at(file: &std::fs::File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match file.read_at(buf, offset) {
            Ok(0) => return Err(truncated()),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
