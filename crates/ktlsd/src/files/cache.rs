//! A worker's cache of open files, like nginx's `open_file_cache`: a path that
//! resolved to a file keeps its descriptor for a short while, so a busy file costs
//! one `fstat` per request instead of `openat2` + `fstat` + `close`.
//!
//! Size, modification time and so the ETag are read afresh on every use; only
//! the name-to-file binding is cached, for at most [`VALID`]: a file replaced by
//! rename (or deleted) is noticed within that time. Each worker has its own
//! cache; nothing is shared between threads.
//!
//! Every entry holds a file descriptor, so the cache must never starve the
//! process of them: it is keyed by the normalised path (`/x`, `/./x` and `/%78`
//! are one entry), holds at most the worker's share of the fd budget (see
//! [`crate::files::Options::cache_entries`]), drops expired entries as time goes
//! by, and when full evicts the oldest entry rather than refuse anything.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How long a name stays bound to an open file.
pub const VALID: Duration = Duration::from_secs(1);

struct Entry {
    file: Rc<File>,
    rel: PathBuf,
    opened: Instant,
}

#[derive(Default)]
struct Cache {
    entries: HashMap<Vec<u8>, Entry>,
    /// When expired entries were last dropped.
    swept: Option<Instant>,
    hits: u64,
    misses: u64,
}

/// What this worker's cache has done, for its metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub hits: u64,
    pub misses: u64,
    /// Entries (so descriptors) held now.
    pub entries: u64,
}

impl Cache {
    /// Drops expired entries, at most once per [`VALID`] (or at once when `force`).
    fn sweep(&mut self, now: Instant, force: bool) {
        if force || self.swept.is_none_or(|t| now.duration_since(t) >= VALID) {
            self.entries.retain(|_, e| now.duration_since(e.opened) < VALID);
            self.swept = Some(now);
        }
    }
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

/// The open file for normalised path `key`, if bound within the last [`VALID`].
pub fn get(key: &[u8], now: Instant) -> Option<(Rc<File>, PathBuf)> {
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        c.sweep(now, false);
        let found = c.entries.get(key).filter(|e| now.duration_since(e.opened) < VALID).map(|e| (e.file.clone(), e.rel.clone()));
        match found {
            Some(_) => c.hits += 1,
            None => c.misses += 1,
        }
        found
    })
}

/// This worker's counts so far.
pub fn counts() -> Counts {
    CACHE.with(|c| {
        let c = c.borrow();
        Counts { hits: c.hits, misses: c.misses, entries: c.entries.len() as u64 }
    })
}

/// Binds normalised path `key` to an open file, keeping at most `capacity` entries:
/// expired ones go first, then the oldest. A capacity of 0 caches nothing.
pub fn put(key: &[u8], file: Rc<File>, rel: PathBuf, now: Instant, capacity: usize) {
    if capacity == 0 {
        return;
    }
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if !c.entries.contains_key(key) && c.entries.len() >= capacity {
            c.sweep(now, true);
            while c.entries.len() >= capacity {
                let oldest = c.entries.iter().min_by_key(|(_, e)| e.opened).map(|(k, _)| k.clone());
                match oldest {
                    Some(k) => c.entries.remove(&k),
                    None => break,
                };
            }
        }
        c.entries.insert(key.to_vec(), Entry { file, rel, opened: now });
    })
}

/// Closes every cached descriptor (when the process has run out of them).
pub fn clear() {
    CACHE.with(|c| c.borrow_mut().entries.clear());
}

/// Entries held now.
#[cfg(test)]
pub fn len() -> usize {
    CACHE.with(|c| c.borrow().entries.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> Rc<File> {
        Rc::new(File::open("/dev/null").expect("open /dev/null"))
    }

    #[test]
    fn bounded_by_capacity_and_time() {
        // Each test runs on its own thread, so this cache is this test's alone.
        let t0 = Instant::now();
        for i in 0..10u8 {
            put(&[i], file(), PathBuf::from("x"), t0 + Duration::from_millis(i.into()), 4);
            assert!(len() <= 4);
        }
        // The newest four are kept; the oldest went first.
        assert!(get(&[9], t0 + Duration::from_millis(10)).is_some());
        assert!(get(&[6], t0 + Duration::from_millis(10)).is_some());
        assert!(get(&[5], t0 + Duration::from_millis(10)).is_none());
        // Re-binding a key does not evict another.
        put(&[9], file(), PathBuf::from("x"), t0 + Duration::from_millis(11), 4);
        assert_eq!(len(), 4);
        // Expired entries are dropped on the next use after VALID, not kept open.
        assert!(get(&[9], t0 + VALID + Duration::from_millis(100)).is_none());
        assert!(get(&[1], t0 + 2 * VALID + Duration::from_millis(100)).is_none());
        assert_eq!(len(), 0);
        put(&[1], file(), PathBuf::from("x"), t0, 0);
        assert_eq!(len(), 0, "capacity 0 caches nothing");
        put(&[1], file(), PathBuf::from("x"), t0, 2);
        clear();
        assert_eq!(len(), 0);
        // Two lookups above found their entry, three did not.
        assert_eq!(counts(), Counts { hits: 2, misses: 3, entries: 0 });
    }
}
