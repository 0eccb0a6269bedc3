//! The userspace body writer: each record is laid out in the connection's output
//! buffer, the head and file bytes are copied straight into its slot, and it is
//! sealed where it lies; several records leave in one `write`. Full records of a
//! file body are read by one `preadv2` into the slots of as many records as the
//! output buffer holds (16, 256 KiB) and leave by one `write`.
//! File bytes are read with `RWF_NOWAIT`; a window not in the page cache is read
//! ahead off the event loop first (see [`crate::files::residency`]).

use std::io::IoSliceMut;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use super::UserspaceTls;
use crate::files::residency::ColdReads;
use crate::files::FileRange;
use crate::tls::error::SessionError;
use crate::tls::sizing::{RecordSizer, MAX_RECORD};

/// Body bytes encrypted before the writer yields to the worker's other
/// connections: encryption runs on the worker's thread, and a large body
/// encrypted in one go (a 1 MiB window takes hundreds of ms on a
/// software-emulated CPU) would hold up every other connection on the worker.
pub const YIELD_EVERY: usize = 64 * 1024;

/// What follows a response on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    KeepOpen,
    /// More follows at once: the last records may wait in the output buffer for
    /// the next write (they leave with the next flush).
    Hold,
    /// The connection's last response: its close_notify leaves in the same
    /// write, after every record of the response.
    CloseNotify,
}

/// Sends `head` then `body`, then `ending`; returns the body bytes sent.
///
/// # Cancel safety
/// Not cancel-safe as a whole (a response cut short cannot be resumed), but the
/// records already sealed are never sent twice: see [`UserspaceTls::flush`].
// Each argument is a separate borrow of the session's parts.
#[allow(clippy::too_many_arguments)]
pub async fn send(
    tls: &mut UserspaceTls,
    stream: &TcpStream,
    sizer: &mut RecordSizer,
    cold: &mut ColdReads,
    mut head: &[u8],
    body: Option<FileRange<'_>>,
    ending: Ending,
    timeout: Duration,
) -> Result<u64, SessionError> {
    let (mut offset, mut left) = body.as_ref().map_or((0, 0), |r| (r.range.start, r.len()));
    let mut since_yield = 0;
    loop {
        let total = head.len() as u64 + left;
        if total == 0 {
            break;
        }
        if since_yield >= YIELD_EVERY {
            tokio::task::yield_now().await;
            since_yield = 0;
        }
        let now = Instant::now();
        let n = usize::try_from(total).unwrap_or(usize::MAX).min(sizer.next_record(stream.as_fd(), now));
        if let Some(range) = body.as_ref().filter(|r| head.is_empty() && n == MAX_RECORD && r.cached.is_none()) {
            // Full records of file bytes alone: as many as the policy allows and the
            // output buffer holds are laid out and filled by one vectored read.
            let most = tls.spare_records(MAX_RECORD).min(usize::try_from(left / MAX_RECORD as u64).unwrap_or(1));
            let mut count = 1;
            while count < most && sizer.next_record(stream.as_fd(), now) == MAX_RECORD {
                count += 1;
            }
            if let Some(mut slots) = tls.begin_records(MAX_RECORD, count)? {
                read_records_at(cold, range, &mut slots, offset).await?;
                // Sealed a few at a time, with a yield whenever YIELD_EVERY bytes were
                // encrypted: the records read and not yet sealed wait in place.
                let mut sealed = 0;
                while sealed < count {
                    if since_yield >= YIELD_EVERY {
                        tokio::task::yield_now().await;
                        since_yield = 0;
                    }
                    let group = (count - sealed).min((YIELD_EVERY / MAX_RECORD).max(1));
                    tls.seal_records(MAX_RECORD, group);
                    (sealed, since_yield) = (sealed + group, since_yield + group * MAX_RECORD);
                }
                let read = count * MAX_RECORD;
                (offset, left) = (offset + read as u64, left - read as u64);
                for _ in 0..count {
                    sizer.sent(now);
                }
                if tls.spare_plaintext() < MAX_RECORD {
                    tls.flush(stream, timeout).await?;
                }
                continue;
            }
        }
        let slot = tls.begin_record(n)?;
        let h = head.len().min(n);
        slot[..h].copy_from_slice(&head[..h]);
        head = &head[h..];
        if let Some(range) = body.as_ref().filter(|_| n > h) {
            read_exact_at(cold, range, &mut slot[h..], offset).await?;
            let read = (n - h) as u64;
            offset += read;
            left -= read;
            since_yield += n - h;
        }
        tls.seal_record(n);
        sizer.sent(now);

        // Small records of a file body are a decision about the wire right now: send
        // them at once. Full records, and records of bytes already in memory, batch
        // up to the output buffer's size.
        if (n < MAX_RECORD && body.is_some()) || tls.spare_plaintext() < MAX_RECORD {
            tls.flush(stream, timeout).await?;
        }
    }
    match ending {
        Ending::Hold => {}
        Ending::KeepOpen => tls.flush(stream, timeout).await?,
        Ending::CloseNotify => {
            tls.queue_close_notify();
            tls.flush(stream, timeout).await?;
        }
    }
    Ok(body.map_or(0, |r| r.len()))
}

/// Fills `slots`, in order, with the file's bytes from `offset`: one `preadv2` for
/// all of them when the bytes are in the page cache; what it leaves unfilled (a cold
/// window, a short read) is read slot by slot as [`read_exact_at`] does.
async fn read_records_at(
    cold: &mut ColdReads,
    range: &FileRange<'_>,
    slots: &mut [&mut [u8]],
    offset: u64,
) -> Result<(), SessionError> {
    let mut filled = {
        let mut iov: Vec<IoSliceMut<'_>> = slots.iter_mut().map(|s| IoSliceMut::new(s)).collect();
        // Any failure here is met again, and reported, by the reads below.
        crate::sys::read_nowait_vectored(range.file.as_fd(), &mut iov, offset).unwrap_or(0)
    };
    let mut at = offset;
    for slot in slots.iter_mut() {
        let len = slot.len();
        if filled < len {
            read_exact_at(cold, range, &mut slot[filled..], at + filled as u64).await?;
        }
        filled = filled.saturating_sub(len);
        at += len as u64;
    }
    Ok(())
}

async fn read_exact_at(
    cold: &mut ColdReads,
    range: &FileRange<'_>,
    mut buf: &mut [u8],
    mut offset: u64,
) -> Result<(), SessionError> {
    // A small file the worker keeps in memory, checked for this request: no read.
    if let Some(bytes) = range.cached_at(offset, buf.len()) {
        buf.copy_from_slice(bytes);
        return Ok(());
    }
    while !buf.is_empty() {
        match cold.read_at(range.file, buf, offset, range.range.end).await {
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

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::io::{Read, Write};
    use std::rc::Rc;

    use super::*;
    use crate::tls::handshake;
    use crate::tls::sizing::RecordPolicy;
    use crate::tls::userspace::tests::{test_client, test_server_config};
    use crate::vocab::TlsVersion;

    /// A large body on a socket that never fills: without yields of its own the
    /// writer would encrypt all of it without letting the worker's other tasks
    /// run (its only awaits are for a full socket or a cold window). With them,
    /// another task on the same event loop runs about once per [`YIELD_EVERY`].
    #[test]
    fn large_body_lets_other_tasks_run_between_reads() {
        const BODY: usize = 16 * YIELD_EVERY;
        let (config, root) = test_server_config(vec![TlsVersion::Tls13]);
        let data: Vec<u8> = (0..BODY).map(|i| (i % 251) as u8).collect();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&data).unwrap();
        let head = b"HTTP/1.1 200 OK\r\n\r\n";

        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let local = tokio::task::LocalSet::new();
        let (ran, got) = local.block_on(&rt, async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            // The client reads as fast as it can, so the server's writes rarely if ever block.
            let client = std::thread::spawn(move || {
                let sock = std::net::TcpStream::connect(addr).unwrap();
                sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut tls = test_client(sock, root);
                let mut got = vec![0u8; head.len() + BODY];
                tls.read_exact(&mut got).map(|_| got).map_err(|e| format!("client read: {e}"))
            });
            let (stream, _) = listener.accept().await.unwrap();
            socket2::SockRef::from(&stream).set_send_buffer_size(4 << 20).unwrap();
            let established = handshake::accept(&stream, config, Duration::from_secs(10)).await.unwrap();
            let mut tls = UserspaceTls::new(established.conn).unwrap();

            let ticks = Rc::new(Cell::new(0u64));
            let ticker = tokio::task::spawn_local({
                let ticks = ticks.clone();
                async move {
                    loop {
                        ticks.set(ticks.get() + 1);
                        tokio::task::yield_now().await;
                    }
                }
            });
            tokio::task::yield_now().await; // the ticker is running
            let before = ticks.get();
            let mut sizer = RecordSizer::new(RecordPolicy::Static(MAX_RECORD), 22);
            let mut cold = ColdReads::default();
            let body = FileRange { file: &file, range: 0..BODY as u64, cached: None };
            let sent = send(
                &mut tls,
                &stream,
                &mut sizer,
                &mut cold,
                head,
                Some(body),
                Ending::KeepOpen,
                Duration::from_secs(10),
            )
            .await
            .unwrap();
            let ran = ticks.get() - before;
            ticker.abort();
            assert_eq!(sent, BODY as u64);
            (ran, tokio::task::spawn_blocking(move || client.join().unwrap()).await.unwrap())
        });
        let got = got.unwrap();
        assert!(got[..head.len()] == head[..] && got[head.len()..] == data[..], "the client received other bytes");
        let reads = (BODY / YIELD_EVERY) as u64;
        assert!(ran >= reads - 1, "another task ran {ran} times while {reads} reads of the body were encrypted");
    }
}
