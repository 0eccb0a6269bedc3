//! A worker's cache of open files, like nginx's `open_file_cache`: a path that
//! resolved to a file keeps its descriptor for a short while, so a busy file costs
//! one `fstat` per request instead of `openat2` + `fstat` + `close`.
//!
//! Size, modification time and so the ETag are read afresh on every use; only
//! the name-to-file binding is cached, for at most [`VALID`]: a file replaced by
//! rename (or deleted) is noticed within that time. Each worker has its own
//! cache; nothing is shared between threads.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How long a name stays bound to an open file.
pub const VALID: Duration = Duration::from_secs(1);
/// Entries per worker before stale ones are dropped.
const CAPACITY: usize = 1024;

struct Entry {
    file: Rc<File>,
    rel: PathBuf,
    opened: Instant,
}

thread_local! {
    static CACHE: RefCell<HashMap<String, Entry>> = RefCell::new(HashMap::new());
}

/// The open file for request path `key`, if bound within the last [`VALID`].
pub fn get(key: &str, now: Instant) -> Option<(Rc<File>, PathBuf)> {
    CACHE.with(|c| {
        let c = c.borrow();
        let e = c.get(key)?;
        (now.duration_since(e.opened) < VALID).then(|| (e.file.clone(), e.rel.clone()))
    })
}

/// Binds request path `key` to an open file.
pub fn put(key: &str, file: Rc<File>, rel: PathBuf, now: Instant) {
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= CAPACITY {
            c.retain(|_, e| now.duration_since(e.opened) < VALID);
            if c.len() >= CAPACITY {
                c.clear();
            }
        }
        c.insert(key.to_string(), Entry { file, rel, opened: now });
    })
}
