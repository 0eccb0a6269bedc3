//! A worker's cache of open files, like nginx's `open_file_cache`: a path that
//! resolved to a file keeps its descriptor for a short while, so a busy file costs
//! one `fstat` per request instead of `openat2` + `fstat` + `close`.
//!
//! Size, modification time and so the ETag are read afresh on every use; only
//! the name-to-file binding is cached, for at most [`VALID`]: a file replaced by
//! rename (or deleted) is noticed within that time. Each worker has its own
//! cache; nothing is shared between threads but the one setting below.
//!
//! With `open_file_cache_valid` set (nginx's directive of that name, 0 by
//! default), an entry's metadata is trusted for that long instead of read for
//! every use, and the binding lasts as long: a busy file then costs one `fstat` per
//! interval per worker, and a file changed in place may be answered with its old
//! length, times and ETag (and, when its bytes are kept, its old bytes) until the
//! interval ends.
//!
//! Every entry holds a file descriptor, so the cache must never starve the
//! process of them: it is keyed by the normalised path (`/x`, `/./x` and `/%78`
//! are one entry), holds at most the worker's share of the fd budget (see
//! [`crate::files::Options::cache_entries`]), drops expired entries as time goes
//! by, and when full evicts the oldest entry rather than refuse anything. Each
//! entry is counted in the worker's descriptor ledger ([`crate::fds`]) as held: a
//! new entry is kept only when the ledger has room, and the oldest entries are
//! given back ([`release`]) when the worker needs their descriptors.
//!
//! Beside its descriptor an entry may keep the bytes of a small regular file (at
//! most [`SMALL_FILE`]), so that the userspace record layer encrypts them from
//! memory instead of reading the file again for every request. Those bytes are
//! used only while the request's fresh `fstat` says the file is the one they were
//! read from (device, inode, size, modification and change times to the
//! nanosecond), are read only from files left alone for at least [`SETTLED`] and
//! only when already in the page cache, and the worker holds at most
//! [`CONTENT_BUDGET`] of them. They go with their entry. This is not a cache of
//! file contents beyond that: nothing is prefetched and large files are always
//! read from the page cache.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::{File, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use super::residency::{read_nowait, Nowait};
use super::Found;
use crate::fds;

/// How long a name stays bound to an open file.
pub const VALID: Duration = Duration::from_secs(1);

/// How long an entry's metadata is trusted, in milliseconds (0: read it on every
/// use): the process's `open_file_cache_valid`, set at start-up and on reload.
static METADATA_VALID_MS: AtomicU64 = AtomicU64::new(0);

/// Sets how long a cached file's metadata is trusted (`open_file_cache_valid`).
pub fn set_metadata_valid(valid: Duration) {
    METADATA_VALID_MS.store(valid.as_millis().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
}

fn metadata_valid() -> Duration {
    Duration::from_millis(METADATA_VALID_MS.load(Ordering::Relaxed))
}

/// How long a name stays bound: [`VALID`], or the metadata interval when longer.
fn lifetime(metadata_valid: Duration) -> Duration {
    VALID.max(metadata_valid)
}

/// Largest file whose bytes an entry keeps.
pub const SMALL_FILE: u64 = 64 * 1024;

/// File bytes one worker keeps at most.
pub const CONTENT_BUDGET: usize = 8 << 20;

/// How long a file must have been left alone before its bytes are kept: file
/// times tick in steps of milliseconds, so a write in the same tick as the one
/// before would leave the times as they were; one that long after cannot.
pub const SETTLED: Duration = Duration::from_secs(1);

/// What a file's bytes were read under; a fresh `fstat` that differs means they
/// may be stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Stamp {
    dev: u64,
    ino: u64,
    pub(super) size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    pub(super) fn of(meta: &Metadata) -> Stamp {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

struct Entry {
    file: Rc<File>,
    /// Its place in the worker's descriptor ledger.
    _fd: fds::Counted,
    rel: Rc<Path>,
    mime: &'static str,
    opened: Instant,
    /// The metadata last read, and when; trusted for the metadata interval.
    meta: Metadata,
    checked: Instant,
    /// The whole file as read when it had this stamp.
    content: Option<(Stamp, Rc<[u8]>)>,
}

impl Entry {
    fn content_len(&self) -> usize {
        self.content.as_ref().map_or(0, |(_, b)| b.len())
    }
}

#[derive(Default)]
struct Cache {
    entries: HashMap<Vec<u8>, Entry>,
    /// When expired entries were last dropped.
    swept: Option<Instant>,
    /// File bytes held by the entries.
    content_bytes: usize,
    hits: u64,
    misses: u64,
    content_hits: u64,
}

/// What this worker's cache has done, for its metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub hits: u64,
    pub misses: u64,
    /// Entries (so descriptors) held now.
    pub entries: u64,
    /// Hits whose file bytes were served from memory.
    pub content_hits: u64,
    /// File bytes held now.
    pub content_bytes: u64,
}

impl Cache {
    /// Drops entries older than `lifetime`, at most once per [`VALID`] (or at once when `force`).
    fn sweep(&mut self, now: Instant, lifetime: Duration, force: bool) {
        if force || self.swept.is_none_or(|t| now.duration_since(t) >= VALID) {
            let mut freed = 0;
            self.entries.retain(|_, e| {
                let keep = now.duration_since(e.opened) < lifetime;
                if !keep {
                    freed += e.content_len();
                }
                keep
            });
            self.content_bytes -= freed;
            self.swept = Some(now);
        }
    }

    fn remove(&mut self, key: &[u8]) {
        if let Some(e) = self.entries.remove(key) {
            self.content_bytes -= e.content_len();
        }
    }
}

/// Reads `file`'s bytes for keeping, when it may be kept and fits in the worker's
/// budget beside the `held` bytes kept already.
fn keepable(file: &File, meta: &Metadata, held: usize) -> Option<(Stamp, Rc<[u8]>)> {
    let size = meta.size();
    if !meta.is_file() || size == 0 || size > SMALL_FILE || size as usize > CONTENT_BUDGET.saturating_sub(held) {
        return None;
    }
    let settled = SystemTime::now().checked_sub(SETTLED)?;
    let (Ok(m), Ok(c)) = (meta.modified(), ctime(meta)) else { return None };
    if m > settled || c > settled {
        return None;
    }
    let mut bytes = vec![0u8; size as usize];
    // From the page cache only: a cold file is served as any other, from disk
    // off the loop, and not kept.
    let n = match read_nowait(file, &mut bytes, 0) {
        Ok(Nowait::Read(n)) => n,
        // The filesystem cannot tell: read it as the body writer would.
        Ok(Nowait::Unsupported) => std::os::unix::fs::FileExt::read_at(file, &mut bytes, 0).ok()?,
        Ok(Nowait::Cold) | Err(_) => return None,
    };
    if n as u64 != size {
        return None;
    }
    Some((Stamp::of(meta), bytes.into()))
}

fn ctime(meta: &Metadata) -> Result<SystemTime, ()> {
    let secs = u64::try_from(meta.ctime()).map_err(|_| ())?;
    let nanos = u32::try_from(meta.ctime_nsec()).map_err(|_| ())?;
    Ok(SystemTime::UNIX_EPOCH + Duration::new(secs, nanos))
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

/// The open file for normalised path `key`, if bound within its lifetime, with
/// its metadata (read now, or within the metadata interval) and, for a small file,
/// its bytes when they are still the file's. `None` also when the `fstat` fails
/// (look the path up again).
pub fn get(key: &[u8], now: Instant) -> Option<Found> {
    get_within(key, now, metadata_valid())
}

fn get_within(key: &[u8], now: Instant, valid: Duration) -> Option<Found> {
    CACHE.with(|c| {
        let c = &mut *c.borrow_mut();
        let lifetime = lifetime(valid);
        c.sweep(now, lifetime, false);
        let Some(e) = c.entries.get_mut(key).filter(|e| now.duration_since(e.opened) < lifetime) else {
            c.misses += 1;
            return None;
        };
        c.hits += 1;
        // The binding is cached; the file's size and times only within the interval.
        let meta = if valid.is_zero() {
            e.file.metadata().ok()?
        } else if now.duration_since(e.checked) < valid {
            e.meta.clone()
        } else {
            let meta = e.file.metadata().ok()?;
            (e.meta, e.checked) = (meta.clone(), now);
            meta
        };
        if e.content.as_ref().is_none_or(|(s, _)| *s != Stamp::of(&meta)) {
            // Never kept, or changed since it was read: forget any old bytes and keep
            // the file's bytes now if they may be kept.
            c.content_bytes -= e.content_len();
            e.content = keepable(&e.file, &meta, c.content_bytes);
            c.content_bytes += e.content_len();
        }
        let content = e.content.as_ref().map(|(_, b)| b.clone());
        if content.is_some() {
            c.content_hits += 1;
        }
        Some(Found { file: e.file.clone(), meta, rel: e.rel.clone(), mime: e.mime, content })
    })
}

/// This worker's counts so far.
pub fn counts() -> Counts {
    CACHE.with(|c| {
        let c = c.borrow();
        Counts {
            hits: c.hits,
            misses: c.misses,
            entries: c.entries.len() as u64,
            content_hits: c.content_hits,
            content_bytes: c.content_bytes as u64,
        }
    })
}

/// Binds normalised path `key` to a file just opened (its metadata just read),
/// keeping at most `capacity` entries: expired ones go first, then the oldest. A
/// capacity of 0 caches nothing. Returns the file's bytes when they are kept.
pub fn put(key: &[u8], found: &Found, now: Instant, capacity: usize) -> Option<Rc<[u8]>> {
    // Held only when the worker's descriptor budget has room (others held are given back first).
    if capacity == 0 || !fds::make_room(1) {
        return None;
    }
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        c.remove(key);
        if c.entries.len() >= capacity {
            c.sweep(now, lifetime(metadata_valid()), true);
            while c.entries.len() >= capacity {
                let oldest = c.entries.iter().min_by_key(|(_, e)| e.opened).map(|(k, _)| k.clone());
                match oldest {
                    Some(k) => c.remove(&k),
                    None => break,
                };
            }
        }
        let content = keepable(&found.file, &found.meta, c.content_bytes);
        let bytes = content.as_ref().map(|(_, b)| b.clone());
        let (file, rel, mime) = (found.file.clone(), found.rel.clone(), found.mime);
        let _fd = fds::count(fds::Kind::OpenFile);
        let entry = Entry { file, _fd, rel, mime, opened: now, meta: found.meta.clone(), checked: now, content };
        c.content_bytes += entry.content_len();
        c.entries.insert(key.to_vec(), entry);
        bytes
    })
}

/// Closes every cached descriptor (when the process has run out of them).
pub fn clear() {
    release(usize::MAX);
}

/// Closes the `n` oldest cached descriptors (all of them for `usize::MAX`) and
/// says how many: the descriptor ledger's release of open files. None while the
/// cache is in use on this thread.
pub fn release(n: usize) -> usize {
    CACHE.with(|c| {
        let Ok(mut c) = c.try_borrow_mut() else { return 0 };
        if n >= c.entries.len() {
            let all = c.entries.len();
            c.entries.clear();
            c.content_bytes = 0;
            return all;
        }
        let mut by_age: Vec<(Instant, Vec<u8>)> = c.entries.iter().map(|(k, e)| (e.opened, k.clone())).collect();
        by_age.sort_unstable_by_key(|(opened, _)| *opened);
        for (_, k) in by_age.iter().take(n) {
            c.remove(k);
        }
        n
    })
}

/// Entries held now.
#[cfg(test)]
pub fn len() -> usize {
    CACHE.with(|c| c.borrow().entries.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::FileTimes;
    use std::os::unix::fs::FileExt;
    use std::path::PathBuf;

    fn open(p: &Path) -> Found {
        let f = File::open(p).unwrap();
        let meta = f.metadata().unwrap();
        Found { file: Rc::new(f), meta, rel: Rc::from(PathBuf::from("x")), mime: "x/y", content: None }
    }

    #[test]
    fn bounded_by_capacity_and_time() {
        // Each test runs on its own thread, so this cache is this test's alone.
        let t0 = Instant::now();
        let put = |k: &[u8], at: Instant, cap: usize| {
            assert!(put(k, &open(Path::new("/dev/null")), at, cap).is_none(), "no bytes of a device");
        };
        for i in 0..10u8 {
            put(&[i], t0 + Duration::from_millis(i.into()), 4);
            assert!(len() <= 4);
        }
        // The newest four are kept; the oldest went first.
        assert!(get(&[9], t0 + Duration::from_millis(10)).is_some());
        assert!(get(&[6], t0 + Duration::from_millis(10)).is_some());
        assert!(get(&[5], t0 + Duration::from_millis(10)).is_none());
        // Re-binding a key does not evict another.
        put(&[9], t0 + Duration::from_millis(11), 4);
        assert_eq!(len(), 4);
        // Expired entries are dropped on the next use after VALID, not kept open.
        assert!(get(&[9], t0 + VALID + Duration::from_millis(100)).is_none());
        assert!(get(&[1], t0 + 2 * VALID + Duration::from_millis(100)).is_none());
        assert_eq!(len(), 0);
        put(&[1], t0, 0);
        assert_eq!(len(), 0, "capacity 0 caches nothing");
        put(&[1], t0, 2);
        clear();
        assert_eq!(len(), 0);
        // Two lookups above found their entry, three did not.
        assert_eq!(counts(), Counts { hits: 2, misses: 3, entries: 0, content_hits: 0, content_bytes: 0 });
    }

    /// Entries are held in the worker's descriptor ledger: the oldest are given
    /// back when the budget runs short, and none is kept when nothing can be.
    #[test]
    fn entries_are_given_back_under_descriptor_pressure() {
        use crate::fds::{self, Kind};
        fds::set_budget(8);
        fds::set_release(Kind::OpenFile, release);
        let t0 = Instant::now();
        let at = |i: u8| t0 + Duration::from_millis(i.into());
        for i in 0..6u8 {
            put(&[i], &open(Path::new("/dev/null")), at(i), 100);
        }
        assert_eq!((len(), fds::counted(Kind::OpenFile)), (6, 6));
        let mut clients: Vec<fds::Counted> = (0..2).map(|_| fds::admit(Kind::Client).unwrap()).collect();
        // The budget is full: a new connection has the oldest entry given back.
        clients.push(fds::admit(Kind::Client).expect("an entry given back"));
        assert_eq!((len(), fds::counted(Kind::OpenFile)), (5, 5));
        assert!(get(&[0], at(10)).is_none() && get(&[1], at(10)).is_some());
        // Connections take the rest; then a new file is served uncached.
        while let Some(c) = fds::admit(Kind::Client) {
            clients.push(c);
        }
        assert_eq!((len(), clients.len()), (0, 8));
        put(&[9], &open(Path::new("/dev/null")), at(11), 100);
        assert_eq!((len(), fds::total()), (0, 8));
        drop(clients);
        put(&[9], &open(Path::new("/dev/null")), at(12), 100);
        assert_eq!((len(), fds::total()), (1, 1));
    }

    /// With an interval, a file changed in place keeps its old metadata until the
    /// interval ends, and its entry lasts that long; without one, the next use sees it.
    #[test]
    fn metadata_is_trusted_for_the_interval_only() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("v");
        std::fs::write(&p, [b'a'; 10]).unwrap();
        let secs = Duration::from_secs;
        let t0 = Instant::now();
        put(b"v", &open(&p), t0, 8);
        std::fs::write(&p, [b'b'; 20]).unwrap();
        let len = |at: Duration, valid: Duration| get_within(b"v", t0 + at, valid).map(|f| f.meta.len());
        let cases = [
            (secs(0), secs(5), Some(10)),
            (Duration::from_millis(4900), secs(5), Some(10)),
            // Past the interval the entry is gone: the path is looked up and stat-ed anew.
            (secs(5), secs(5), None),
        ];
        for (at, valid, want) in cases {
            assert_eq!(len(at, valid), want, "{at:?} into an interval of {valid:?}");
        }
        put(b"v", &open(&p), t0, 8);
        std::fs::write(&p, [b'c'; 30]).unwrap();
        assert_eq!(len(secs(0), Duration::ZERO), Some(30), "no interval: read on every use");
        assert_eq!(len(secs(2), Duration::ZERO), None, "no interval: bound for VALID only");
    }

    /// A file of `len` bytes last changed `age` ago as far as its mtime goes
    /// (its ctime is now: setting times changes it).
    fn aged(dir: &Path, name: &str, len: usize, age: Duration) -> PathBuf {
        let p = dir.join(name);
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, bytes).unwrap();
        let past = SystemTime::now() - age;
        File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_times(FileTimes::new().set_modified(past).set_accessed(past))
            .unwrap();
        p
    }

    /// Waits until times set now are [`SETTLED`].
    fn settle() {
        std::thread::sleep(SETTLED + Duration::from_millis(100));
    }

    #[test]
    fn kept_bytes_follow_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = aged(dir.path(), "f", 1000, Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(put(b"f", &open(&p), t0, 8).is_none(), "its ctime is less than a second old");
        settle();
        let t0 = Instant::now();
        let kept = put(b"f", &open(&p), t0, 8).expect("a settled small file is kept");
        assert_eq!(&kept[..], &std::fs::read(&p).unwrap()[..]);
        let hit = get(b"f", t0).unwrap();
        assert!(hit.content.is_some_and(|c| Rc::ptr_eq(&c, &kept)), "the same bytes, not read again");

        // Rewritten in place, same size, new bytes: the fresh fstat differs, the bytes go.
        File::options().write(true).open(&p).unwrap().write_all_at(&[b'z'; 1000], 0).unwrap();
        let hit = get(b"f", t0).unwrap();
        assert!(hit.content.is_none(), "stale bytes served after a rewrite");
        assert_eq!(counts().content_bytes, 0);
        // Settled again: the new bytes are read and kept.
        settle();
        let hit = get(b"f", t0).unwrap();
        assert_eq!(hit.content.as_deref(), Some(&[b'z'; 1000][..]));
        assert_eq!(counts().content_bytes, 1000);
        assert_eq!(counts().content_hits, 2);
        // The bytes go with their entry.
        assert!(get(b"f", t0 + VALID).is_none());
        assert_eq!(counts().content_bytes, 0);
    }

    #[test]
    fn only_small_settled_files_are_kept_within_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let max = SMALL_FILE as usize;
        let big = aged(dir.path(), "big", max + 1, Duration::from_secs(10));
        let files = CONTENT_BUDGET / max + 2;
        let small: Vec<PathBuf> =
            (0..files).map(|i| aged(dir.path(), &i.to_string(), max, Duration::from_secs(10))).collect();
        settle();
        let recent = aged(dir.path(), "recent", 10, Duration::ZERO);
        let t0 = Instant::now();
        assert!(put(b"big", &open(&big), t0, 1000).is_none(), "over SMALL_FILE");
        assert!(put(b"recent", &open(&recent), t0, 1000).is_none(), "changed just now");
        let mut kept = 0;
        for (i, p) in small.iter().enumerate() {
            kept += usize::from(put(i.to_string().as_bytes(), &open(p), t0, 1000).is_some());
            assert!(counts().content_bytes as usize <= CONTENT_BUDGET);
        }
        assert_eq!(kept, CONTENT_BUDGET / max, "as many as the budget holds");
        assert_eq!(len(), files + 2, "files not kept in memory are still cached open");
        clear();
        assert_eq!(counts().content_bytes, 0);
    }
}
