//! Cold files off the event loop: whether the next window of a file is in the
//! page cache, and when it is not, reading it in a small bounded blocking pool
//! so that the worker's `sendfile` or `pread` that follows finds warm pages.
//!
//! A `sendfile` or `pread` of pages that are not cached sleeps in the kernel for
//! the disk's latency, and with it every connection of the worker's event loop.
//! nginx answers this with `aio threads`; this is the same idea, decided per
//! window (see [`WINDOW`]) rather than per record, so a hot file pays nothing on
//! the userspace path and one or two 1-byte probes per window on the kTLS path.
//!
//! The check is `preadv2(RWF_NOWAIT)`: the kernel answers from the page cache or
//! refuses with `EAGAIN`, in one syscall, without a mapping. `mincore` would need
//! `mmap` + `mincore` + `munmap` per window, and `munmap` in a multi-threaded
//! process takes the address-space lock and shoots down TLBs on the other cores.
//! The userspace record layer reads its plaintext with `RWF_NOWAIT` directly, so
//! its check is free; the kTLS path, whose bytes never come to user space, reads
//! one byte of the window's first and last page.
//!
//! Not a cache of its own, and not a prefetcher for files nobody asked for: it
//! only decides, per window being sent, whether the loop may block on it.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

/// Bytes decided at once: one probe and, when cold, one readahead. A whole
/// number of the kTLS path's `sendfile` calls (64 KiB each), so windows and
/// calls line up.
pub const WINDOW: u64 = 1 << 20;

/// Cold windows being read at once, process-wide. nginx's default thread pool
/// has 32 threads; a few suffice to keep a disk busy with 1 MiB reads, and the
/// bound keeps a burst of cold downloads from growing a thread per connection.
pub const READERS: usize = 8;

/// Ranges up to this size are probed at their first page only.
pub const SMALL: u64 = 64 * 1024;

/// How long a window found warm is taken as warm without a new probe: long
/// enough that a file sent record by record (HTTP/2) or again on the same
/// keep-alive connection is probed about once, short enough that pages dropped
/// meanwhile are noticed.
const CHECKED_FOR: Duration = Duration::from_secs(1);

/// Scratch buffer of each blocking reader: the window is read through it, in
/// pieces, only to bring its pages into the cache.
const SCRATCH: usize = 128 * 1024;

static POOL: Semaphore = Semaphore::const_new(READERS);

/// Set once a filesystem refused `RWF_NOWAIT` (`EOPNOTSUPP`): from then on no
/// probe is made and every read happens on the loop, as before this module.
static NOWAIT_UNSUPPORTED: AtomicBool = AtomicBool::new(false);

/// What a read from the page cache alone found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nowait {
    /// This many bytes were cached and copied (0: end of file).
    Read(usize),
    /// The first byte asked for is not in the page cache.
    Cold,
    /// The filesystem cannot tell; read the usual way.
    Unsupported,
}

/// Reads into `buf` at `offset` from the page cache only, never waiting on the disk.
pub fn read_nowait(file: &File, buf: &mut [u8], offset: u64) -> io::Result<Nowait> {
    if NOWAIT_UNSUPPORTED.load(Ordering::Relaxed) {
        return Ok(Nowait::Unsupported);
    }
    loop {
        match crate::sys::read_nowait(file.as_fd(), buf, offset) {
            Ok(n) => return Ok(Nowait::Read(n)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Nowait::Cold),
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) || e.raw_os_error() == Some(libc::ENOSYS) => {
                if !NOWAIT_UNSUPPORTED.swap(true, Ordering::Relaxed) {
                    tracing::info!("page-cache probes are not supported here (preadv2 RWF_NOWAIT: {e}): files not in the page cache are read on the event loop");
                }
                return Ok(Nowait::Unsupported);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether a window is in the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    Resident,
    Cold,
}

/// Probes the first page of `range` and, when the range is over [`SMALL`], its
/// last page too (one byte each). Pages leave the cache oldest first and
/// readahead fills them in order, so a window that is partly cached nearly
/// always lacks its first or its last page; a small file is read in and dropped
/// whole. A probe that fails for any other reason says `Resident`: the send that
/// follows meets the same error and reports it.
pub fn probe(file: &File, range: Range<u64>) -> Residency {
    if range.is_empty() {
        return Residency::Resident;
    }
    let page = crate::sys::page_size();
    let last = (range.end - 1) / page * page;
    let mut byte = [0u8; 1];
    let mut at = |offset| matches!(read_nowait(file, &mut byte, offset), Ok(Nowait::Cold));
    if at(range.start) || (range.end - range.start > SMALL && last > range.start && at(last)) {
        Residency::Cold
    } else {
        Residency::Resident
    }
}

/// How a cold window was read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Warmed {
    /// A reader was free at once.
    Started,
    /// Every reader was busy: the window waited its turn.
    Queued,
    /// Not read ahead (no descriptor to spare for the reader): the loop reads it.
    Skipped,
}

/// Reads `range` of `file` into the page cache on the blocking pool and waits
/// for it. Read errors are not reported here: the loop's own read or
/// `sendfile` of the same bytes meets them and reports them.
///
/// # Cancel safety
/// Cancel-safe: dropped while waiting for a reader, it leaves nothing behind;
/// dropped after, the blocking read runs to its end on its own descriptor and
/// permit (it only warms pages), then frees both.
pub async fn warm(file: &File, range: Range<u64>) -> Warmed {
    let (permit, how) = match POOL.try_acquire() {
        Ok(p) => (p, Warmed::Started),
        Err(_) => match POOL.acquire().await {
            Ok(p) => (p, Warmed::Queued),
            Err(_) => return Warmed::Skipped, // never closed
        },
    };
    // The reader outlives this borrow when the caller is dropped: it gets its own descriptor.
    let Ok(file) = file.try_clone() else { return Warmed::Skipped };
    let task = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        if let Err(e) = read_through(&file, range) {
            tracing::debug!("readahead failed: {e}");
        }
    });
    let _ = task.await;
    how
}

thread_local! {
    static SCRATCH_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Blocking: asks the kernel to read the whole range at once (`WILLNEED`, so the
/// disk sees one large request rather than a series), then reads it through a
/// scratch buffer, which returns when every page is in.
fn read_through(file: &File, range: Range<u64>) -> io::Result<()> {
    let (Ok(start), Ok(len)) = (libc::off_t::try_from(range.start), libc::off_t::try_from(range.end - range.start))
    else {
        return Err(io::ErrorKind::InvalidInput.into());
    };
    let _ = crate::sys::will_need(file, start as u64, len as u64);
    SCRATCH_BUF.with(|s| {
        let mut s = s.borrow_mut();
        s.resize(SCRATCH, 0);
        let mut at = range.start;
        while at < range.end {
            let n = s.len().min(usize::try_from(range.end - at).unwrap_or(usize::MAX));
            match file.read_at(&mut s[..n], at) {
                Ok(0) => break,
                Ok(n) => at += n as u64,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    })
}

/// A connection's view of the windows it sends: which one was last found warm
/// (so the kTLS path probes once per window, not per call, even when HTTP/2 sends
/// a file one record at a time), and how many windows were cold.
#[derive(Debug, Default)]
pub struct ColdReads {
    /// Descriptor and range last found (or made) warm, and when.
    checked: Option<(RawFd, Range<u64>, Instant)>,
    /// Windows found out of the page cache and read ahead off the loop.
    pub cold_windows: u64,
    /// Cold windows that waited for a free reader.
    pub readahead_waits: u64,
}

impl ColdReads {
    /// Makes sure the window at `offset` (up to `end`) is in the page cache,
    /// reading it ahead off the loop when it is not; returns where the checked
    /// window ends, past which the caller must not send without asking again.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`warm`]; a window not finished is checked again next time.
    pub async fn ensure_warm(&mut self, file: &File, offset: u64, end: u64) -> u64 {
        let fd = file.as_raw_fd();
        let now = Instant::now();
        if let Some((f, r, at)) = &self.checked {
            if *f == fd && r.start <= offset && offset < r.end && now.duration_since(*at) < CHECKED_FOR {
                return r.end.min(end);
            }
        }
        let window = offset..end.min(offset.saturating_add(WINDOW));
        if probe(file, window.clone()) == Residency::Cold {
            self.note(warm(file, window.clone()).await);
        }
        self.checked = Some((fd, window.clone(), Instant::now()));
        window.end
    }

    /// Reads into `buf` at `offset` (not past `end`), as `pread` does, but when the
    /// bytes are not in the page cache reads the window ahead off the loop first.
    /// Returns the bytes read (0: end of file).
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`warm`]; `buf` may then hold part of the bytes.
    pub async fn read_at(&mut self, file: &File, buf: &mut [u8], offset: u64, end: u64) -> io::Result<usize> {
        match read_nowait(file, buf, offset)? {
            Nowait::Read(n) => return Ok(n),
            Nowait::Unsupported => {}
            Nowait::Cold => {
                let window = offset..end.min(offset.saturating_add(WINDOW)).max(offset + buf.len() as u64);
                self.note(warm(file, window).await);
            }
        }
        loop {
            match file.read_at(buf, offset) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => return r,
            }
        }
    }

    fn note(&mut self, how: Warmed) {
        self.cold_windows += 1;
        if how == Warmed::Queued {
            self.readahead_waits += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A file of `len` bytes on a disk-backed filesystem, synced and dropped from
    /// the page cache; `None` (test skipped, said on stderr) where the filesystem
    /// cannot evict or cannot answer `RWF_NOWAIT`.
    fn cold_file(len: usize) -> Option<(tempfile::NamedTempFile, Vec<u8>)> {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let mut f = tempfile::NamedTempFile::new_in(std::env::temp_dir()).unwrap();
        f.write_all(&data).unwrap();
        f.as_file().sync_all().unwrap();
        evict(f.as_file());
        let mut b = [0u8; 1];
        match read_nowait(f.as_file(), &mut b, 0).unwrap() {
            Nowait::Cold => Some((f, data)),
            other => {
                eprintln!(
                    "skipped: {} keeps the file cached after DONTNEED ({other:?})",
                    std::env::temp_dir().display()
                );
                None
            }
        }
    }

    fn evict(f: &File) {
        rustix::fs::fadvise(f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
    }

    #[test]
    fn evicted_file_is_cold_and_read_file_is_resident() {
        let Some((f, data)) = cold_file(3 << 20) else { return };
        let file = f.as_file();
        assert_eq!(probe(file, 0..WINDOW), Residency::Cold);
        let mut all = vec![0u8; data.len()];
        file.read_exact_at(&mut all, 0).unwrap();
        assert_eq!(probe(file, 0..WINDOW), Residency::Resident);
        assert_eq!(probe(file, 2 * WINDOW..3 * WINDOW), Residency::Resident);
        let mut buf = vec![0u8; 4096];
        assert_eq!(read_nowait(file, &mut buf, 4096).unwrap(), Nowait::Read(4096));
        assert_eq!(buf, data[4096..8192]);
    }

    #[test]
    fn probe_sees_a_window_cached_only_in_part() {
        let Some((f, _)) = cold_file(2 << 20) else { return };
        let file = f.as_file();
        // Only the first 64 KiB read; readahead may bring more, never the whole second MiB.
        let mut head = vec![0u8; 64 * 1024];
        let _ = rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::Random);
        file.read_exact_at(&mut head, 0).unwrap();
        assert_eq!(probe(file, 0..64 * 1024), Residency::Resident);
        assert_eq!(probe(file, 0..2 * WINDOW), Residency::Cold, "the last page is not cached");
    }

    #[test]
    fn warm_brings_a_window_into_the_cache() {
        let Some((f, _)) = cold_file(2 << 20) else { return };
        let file = f.as_file();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        assert_eq!(rt.block_on(warm(file, 0..WINDOW)), Warmed::Started);
        assert_eq!(probe(file, 0..WINDOW), Residency::Resident);
        assert_eq!(probe(file, WINDOW..2 * WINDOW), Residency::Cold, "only the window asked for");
    }

    #[test]
    fn cold_reads_read_the_right_bytes_and_count_windows_once() {
        let Some((f, data)) = cold_file((2 << 20) + 5000) else { return };
        let file = f.as_file();
        let end = data.len() as u64;
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let mut cold = ColdReads::default();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        rt.block_on(async {
            let mut at = 0;
            while at < end {
                let n = cold.read_at(file, &mut buf, at, end).await.unwrap();
                assert!(n > 0);
                got.extend_from_slice(&buf[..n]);
                at += n as u64;
            }
        });
        assert!(got == data, "bytes differ");
        // Three windows, each cold once; kernel readahead may have warmed a tail early.
        assert!((2..=3).contains(&cold.cold_windows), "cold windows: {}", cold.cold_windows);

        evict(file);
        let mut cold = ColdReads::default();
        rt.block_on(async {
            assert_eq!(cold.ensure_warm(file, 0, end).await, WINDOW);
            assert_eq!(cold.ensure_warm(file, 4096, end).await, WINDOW, "same window: no new probe");
            assert_eq!(cold.ensure_warm(file, WINDOW, end).await, 2 * WINDOW);
            assert_eq!(cold.ensure_warm(file, 2 * WINDOW, end).await, end);
        });
        assert_eq!(cold.cold_windows, 3);
        assert_eq!(probe(file, 0..end), Residency::Resident);
    }
}
