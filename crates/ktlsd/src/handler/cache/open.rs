//! A worker's open cache entries: the descriptor, `fstat` and, for a small entry,
//! the bytes of each entry file recently answered from, so that a hit of a busy
//! entry costs no `openat` + `fstat` + `close` and, when small, no read either (the
//! userspace record layer encrypts from memory, as for a small static file).
//!
//! An entry file never changes once it is in the index: a new response or a
//! refreshed head is a new file renamed over the old one, indexed as a new [`Meta`].
//! So the map is keyed by the [`Meta`] itself (the address of its `Arc`, which the
//! map holds, so it cannot be reused), and what it holds stays valid for as long
//! as that `Meta` is the one looked up; a replaced, purged or evicted entry is
//! never asked for again: the index marks it dropped, and every worker's slot of it
//! goes at that worker's next lookup (so that its deleted file frees its disk
//! space, which on a small cache disk the next entries need) or when the map needs
//! room.
//!
//! Each worker has its own map (nothing shared between threads), of at most
//! [`ENTRIES`] descriptors and [`CONTENT_BUDGET`] bytes. Each descriptor held is
//! counted in the worker's descriptor ledger ([`crate::fds`]): a file is held only
//! when the ledger has room, and the least recently used are given back
//! ([`release`]) when the worker needs their descriptors. A file that cannot be
//! opened for want of descriptors is opened again once every held one is given
//! back. Not here: which entry answers a request (the module above) or how its
//! answer is built (`serve`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::{File, Metadata};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::Arc;

use super::policy::Meta;
use crate::fds;

/// Descriptors one worker keeps open at most.
pub const ENTRIES: usize = 256;
/// Largest entry file (head and body) whose bytes are kept.
pub const SMALL_ENTRY: u64 = 64 * 1024;
/// Entry bytes one worker keeps at most.
pub const CONTENT_BUDGET: usize = 8 << 20;

/// An entry file as the codec sends it.
#[derive(Clone)]
pub struct Opened {
    pub file: Rc<File>,
    pub fstat: Metadata,
    /// The file's name, for the body writer's messages.
    pub rel: Rc<Path>,
    /// The whole file, for a small entry.
    pub content: Option<Rc<[u8]>>,
}

struct Slot {
    meta: Arc<Meta>,
    opened: Opened,
    used: u64,
    /// Its place in the worker's descriptor ledger.
    _fd: fds::Counted,
}

#[derive(Default)]
struct Open {
    slots: HashMap<usize, Slot>,
    content_bytes: usize,
    clock: u64,
    /// [`DROPPED`] when this worker last closed the files of dropped entries.
    seen: u64,
}

/// Counts the times entries left the index (evicted, purged, replaced, found
/// corrupt), so that each worker closes the files of those it holds at its next
/// lookup: a deleted entry frees its disk space only once no descriptor holds it,
/// which a full disk waits for.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Notes that `meta` left the index (under the index's lock). Marked on the entry
/// itself: several workers may hold its file, each slot keeping the `Meta` alive,
/// so a count of its holders cannot tell a dropped entry from an indexed one.
pub fn dropped(meta: &Meta) {
    meta.dropped.store(true, Relaxed);
    // Release: a worker that sees the new count sees the mark.
    DROPPED.fetch_add(1, Release);
}

/// Closes this worker's files of entries no longer indexed, when some left the
/// index since it last looked: one atomic load otherwise.
pub fn release_dropped() {
    let now = DROPPED.load(Acquire);
    OPEN.with(|o| {
        let o = &mut *o.borrow_mut();
        if o.seen != now {
            o.seen = now;
            o.release_unindexed();
        }
    })
}

thread_local! {
    static OPEN: RefCell<Open> = RefCell::default();
}

fn id(meta: &Arc<Meta>) -> usize {
    Arc::as_ptr(meta) as usize
}

/// `meta`'s file when this worker has it open (marked used).
pub fn held(meta: &Arc<Meta>) -> Option<Rc<File>> {
    OPEN.with(|o| {
        let o = &mut *o.borrow_mut();
        o.clock += 1;
        let s = o.slots.get_mut(&id(meta))?;
        s.used = o.clock;
        Some(s.opened.file.clone())
    })
}

/// Closes `meta`'s file if this worker holds it (its file was found corrupt).
pub fn forget(meta: &Arc<Meta>) {
    OPEN.with(|o| {
        let o = &mut *o.borrow_mut();
        if let Some(s) = o.slots.remove(&id(meta)) {
            o.content_bytes -= s.opened.content.map_or(0, |c| c.len());
        }
    })
}

/// A pseudo-random number (xorshift, seeded per worker from the standard
/// library's random hash keys): for sampling, not for secrets.
pub fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    thread_local! {
        static STATE: std::cell::Cell<u64> =
            std::cell::Cell::new(std::collections::hash_map::RandomState::new().build_hasher().finish() | 1);
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    })
}

/// `meta`'s file as the codec sends it: `file` (just opened and checked by the
/// caller) kept for the next hits, else the one this worker holds, else opened
/// now (its length checked against the index). `None`: the file is gone, or the
/// process is out of descriptors even with every held one given back.
pub fn opened(meta: &Arc<Meta>, file: Option<(File, Metadata)>) -> Option<Opened> {
    if file.is_none() {
        if let Some(o) = OPEN.with(|o| o.borrow().slots.get(&id(meta)).map(|s| s.opened.clone())) {
            return Some(o);
        }
    }
    let (file, fstat) = match file {
        Some(f) => f,
        None => {
            let f = open(&meta.path).ok()?;
            let m = f.metadata().ok().filter(|m| m.len() == meta.file_len)?;
            (f, m)
        }
    };
    // Held for the next hits only when the worker's descriptor budget has room.
    let hold = fds::make_room(1);
    Some(OPEN.with(|o| o.borrow_mut().put(meta.clone(), file, fstat, hold)))
}

/// Opens an entry file; out of descriptors, gives back every held one and tries once more.
pub fn open(path: &Path) -> std::io::Result<File> {
    match File::open(path) {
        Err(e) if fds::is_exhaustion(&e) => {
            fds::release_all();
            File::open(path)
        }
        r => r,
    }
}

/// Closes the `n` least recently used held files (all for `usize::MAX`) and says
/// how many: the descriptor ledger's release of entry files. None while the map is
/// in use on this thread.
pub fn release(n: usize) -> usize {
    OPEN.with(|o| {
        let Ok(mut o) = o.try_borrow_mut() else { return 0 };
        if n >= o.slots.len() {
            let all = o.slots.len();
            o.slots.clear();
            o.content_bytes = 0;
            return all;
        }
        let mut by_use: Vec<(u64, usize)> = o.slots.iter().map(|(k, s)| (s.used, *k)).collect();
        by_use.sort_unstable();
        for (_, k) in by_use.into_iter().take(n) {
            if let Some(s) = o.slots.remove(&k) {
                o.content_bytes -= s.opened.content.map_or(0, |c| c.len());
            }
        }
        n
    })
}

impl Open {
    /// Builds the answer from `file`, and keeps it for the next hits when `hold`.
    fn put(&mut self, meta: Arc<Meta>, file: File, fstat: Metadata, hold: bool) -> Opened {
        if hold && self.slots.len() >= ENTRIES {
            self.make_room();
        }
        let len = fstat.len();
        // Bytes are kept only with a held file: one not held is sent from the file.
        let content = (hold && len <= SMALL_ENTRY && self.content_bytes + len as usize <= CONTENT_BUDGET)
            .then(|| {
                let mut bytes = vec![0u8; len as usize];
                file.read_exact_at(&mut bytes, 0).ok().map(|()| Rc::<[u8]>::from(bytes))
            })
            .flatten();
        let rel: Rc<Path> = Rc::from(meta.path.file_name().map_or(Path::new("entry"), Path::new));
        let opened = Opened { file: Rc::new(file), fstat, rel, content };
        if !hold {
            return opened;
        }
        self.content_bytes += opened.content.as_ref().map_or(0, |c| c.len());
        self.clock += 1;
        let _fd = fds::count(fds::Kind::EntryFile);
        let slot = Slot { meta: meta.clone(), opened: opened.clone(), used: self.clock, _fd };
        if let Some(old) = self.slots.insert(id(&meta), slot) {
            self.content_bytes -= old.opened.content.map_or(0, |c| c.len());
        }
        opened
    }

    /// Drops the slots of entries no longer indexed nor answered from, and when
    /// none was, the least recently used one.
    fn make_room(&mut self) {
        let before = self.slots.len();
        self.release_unindexed();
        if self.slots.len() < before {
            return;
        }
        if let Some(k) = self.slots.iter().min_by_key(|(_, s)| s.used).map(|(k, _)| *k) {
            if let Some(s) = self.slots.remove(&k) {
                self.content_bytes -= s.opened.content.map_or(0, |c| c.len());
            }
        }
    }

    /// Drops the slots of entries no longer indexed (marked dropped, or held by
    /// nothing else). A response under way keeps its own handle on the file.
    fn release_unindexed(&mut self) {
        let mut freed = 0;
        self.slots.retain(|_, s| {
            let keep = !s.meta.dropped.load(Relaxed) && Arc::strong_count(&s.meta) > 1;
            if !keep {
                freed += s.opened.content.as_ref().map_or(0, |c| c.len());
            }
            keep
        });
        self.content_bytes -= freed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::cache::entry::{Head, Parsed};

    fn meta(path: &Path, len: u64) -> Arc<Meta> {
        let head = Head {
            key: "GET  /".into(),
            request: Vec::new(),
            status: 200,
            fields: vec![("cache-control".into(), "max-age=60".into())],
            stored_ms: 0,
            response_ms: 0,
        };
        Arc::new(
            Meta::new(Parsed { head, body_offset: 0, body_len: len, body_sum: 0 }, len, path.to_path_buf()).unwrap(),
        )
    }

    #[test]
    fn entries_are_held_open_with_small_contents_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small");
        std::fs::write(&small, b"hello").unwrap();
        let m = meta(&small, 5);
        assert!(held(&m).is_none(), "nothing is held before a first answer");
        let first = opened(&m, None).expect("the file is opened");
        assert_eq!(first.content.as_deref(), Some(&b"hello"[..]));
        assert!(held(&m).is_some());
        assert!(Rc::ptr_eq(&held(&m).unwrap(), &first.file));
        // Held: the same descriptor, even once the file is gone.
        std::fs::remove_file(&small).unwrap();
        let again = opened(&m, None).expect("held open");
        assert!(Rc::ptr_eq(&first.file, &again.file));
        // Another Meta of a file that is gone, or whose length differs from the index's, is not opened.
        assert!(opened(&meta(&small, 5), None).is_none());
        let other = dir.path().join("other");
        std::fs::write(&other, b"longer than indexed").unwrap();
        assert!(opened(&meta(&other, 5), None).is_none());
        // A large entry is held without its bytes.
        let large = dir.path().join("large");
        std::fs::write(&large, vec![0u8; SMALL_ENTRY as usize + 1]).unwrap();
        let l = meta(&large, SMALL_ENTRY + 1);
        assert!(opened(&l, None).unwrap().content.is_none());
        // At most ENTRIES descriptors: those no longer indexed go first, then the least recently used.
        let kept: Vec<Arc<Meta>> = (0..ENTRIES + 10).map(|_| meta(&other, 19)).collect();
        for k in &kept {
            assert!(opened(k, None).is_some());
        }
        OPEN.with(|o| assert!(o.borrow().slots.len() <= ENTRIES));
        assert!(held(&kept[ENTRIES + 9]).is_some() && held(&kept[0]).is_none());
    }

    /// Held files are counted in the worker's descriptor ledger, the least recently
    /// used given back under pressure, and none held when the budget is spent (the
    /// hit is still answered, from a file opened for it).
    #[test]
    fn held_files_follow_the_descriptor_budget() {
        use crate::fds::{self, Kind};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e");
        std::fs::write(&path, b"entry").unwrap();
        fds::set_budget(4);
        fds::set_release(Kind::EntryFile, release);
        let metas: Vec<Arc<Meta>> = (0..4).map(|_| meta(&path, 5)).collect();
        for m in &metas {
            assert!(opened(m, None).is_some());
        }
        assert_eq!(fds::counted(Kind::EntryFile), 4);
        assert!(held(&metas[0]).is_some(), "the first is now the most recently used");
        let client = fds::admit(Kind::Client).expect("a held file given back");
        assert_eq!(fds::counted(Kind::EntryFile), 3);
        assert!(held(&metas[1]).is_none() && held(&metas[0]).is_some());
        let rest: Vec<fds::Counted> = std::iter::from_fn(|| fds::admit(Kind::Client)).collect();
        assert_eq!((rest.len(), fds::counted(Kind::EntryFile)), (3, 0));
        let o = opened(&metas[2], None).expect("answered though not held");
        assert_eq!(o.content, None, "no bytes kept for a file not held");
        assert_eq!((held(&metas[2]).is_none(), fds::total()), (true, 4));
        drop((client, rest));
    }
}
