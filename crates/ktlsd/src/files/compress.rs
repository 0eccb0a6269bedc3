//! The store of compressed bodies: files compressed on the fly, kept as files in a
//! directory of the state directory (`STATE_DIR/compressed/`) so that a repeated
//! request is answered by `sendfile` of the stored file, as a precompressed
//! variant is, and costs no compression.
//!
//! An entry is keyed by the original's path beneath ROOT, its identity (device,
//! inode, size, modification and change times to the nanosecond) and the coding: a
//! file changed in any way is a new key, and the old entry ages out. The store is
//! bounded in bytes; when an entry would pass the bound the least recently used
//! ones are removed (a stored file still being sent stays readable through its
//! open descriptor). Bodies are written to a temporary name and renamed into
//! place, so a reader never opens a partial one. The index lives in memory: the
//! directory is emptied when the server starts.
//!
//! Compression runs on tokio's blocking pool, never on an event loop, at most
//! [`COMPRESSORS`] at once; each key is compressed once, however many requests
//! ask for it meanwhile (they may wait for it, see [`Waiter`]). A body that does
//! not come out smaller than its original is remembered as such and sent as it is.
//!
//! It knows codings only by their Content-Encoding token (`zstd`, `br`, `gzip`);
//! which coding a request gets is the handler's choice. It is not a response
//! cache: it keeps only bodies of files beneath a site's ROOT. (A response cache
//! on disk could later hold these bodies in its own directory; the store keeps
//! to its own until then.)

use std::cell::Cell;
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter, Read};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use tokio::sync::watch;

use super::cache::{self, Stamp};
use super::Found;

/// Compressions running at once, process-wide: each takes one core while it runs,
/// and the server's cores are for serving. A request that finds every compressor
/// busy gets the file as it is.
pub const COMPRESSORS: usize = 2;

/// zstd level: zstd's own default. This repository's sources (1.7 MB of `.rs`
/// and `.md`) come out at 479 kB, against gzip's 485 kB (docs/serving.md).
pub const ZSTD_LEVEL: i32 = 3;
/// Brotli quality: 5 of 11 gives 435 kB on the same sources; the top qualities,
/// usual for precompressed files, are far slower and meant for build time.
pub const BROTLI_QUALITY: i32 = 5;
/// gzip level: zlib's and nginx's default trade-off.
pub const GZIP_LEVEL: u32 = 6;

/// Brotli window (log2 bytes): 4 MiB, the encoder's usual one.
const BROTLI_WINDOW: i32 = 22;

/// One stored body's name in the index.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    rel: PathBuf,
    stamp: Stamp,
    coding: &'static str,
}

/// An index entry.
#[derive(Debug)]
struct Entry {
    /// The stored file's number (its name is `NUMBER.CODING`); `None`: the body did
    /// not come out smaller (or could not be made), so the original is sent.
    number: Option<u64>,
    len: u64,
    /// When it was last used, in the store's own ticks.
    used: u64,
}

#[derive(Debug, Default)]
struct Index {
    entries: HashMap<Key, Entry>,
    /// Bytes of the stored files.
    total: u64,
    tick: u64,
    next_number: u64,
    /// Compressions under way; their receivers see the sender dropped when done.
    running: HashMap<Key, watch::Receiver<()>>,
}

/// The store: a directory and its index, shared by every worker.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    capacity: u64,
    index: Mutex<Index>,
    busy: AtomicUsize,
}

/// What the store holds for a file and coding.
#[allow(clippy::large_enum_variant)] // one per request, on the stack for its life, as `Body` is
pub enum Stored {
    /// The compressed body, opened: a [`Found`] with the original's `rel` and
    /// `mime` and the stored file's descriptor and metadata.
    Body(Found),
    /// Known not to be worth it: send the original.
    Original,
    /// Not there (yet).
    Missing,
}

/// A compression under way that a request may wait for.
pub struct Waiter(watch::Receiver<()>);

impl Waiter {
    /// Returns when the compression has ended, stored or not.
    ///
    /// # Cancel safety
    /// Cancel-safe: the compression goes on without its waiter.
    pub async fn done(mut self) {
        // The sender is dropped, never used: `changed` returns its error then.
        let _ = self.0.changed().await;
    }
}

thread_local! {
    static HITS: Cell<u64> = const { Cell::new(0) };
    static MADE: Cell<u64> = const { Cell::new(0) };
}

/// What this worker's thread has done with the store, for its metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Answers sent from a stored body.
    pub hits: u64,
    /// Compressions started.
    pub made: u64,
}

/// This thread's counts.
pub fn counts() -> Counts {
    Counts { hits: HITS.with(Cell::get), made: MADE.with(Cell::get) }
}

static STORE: OnceLock<Store> = OnceLock::new();

/// Opens the process's store in `dir` (created, mode 0700, emptied) holding at most
/// `capacity` bytes. A later call (a reload) keeps the store opened first.
pub fn install(dir: &Path, capacity: u64) -> io::Result<()> {
    if STORE.get().is_some() {
        return Ok(());
    }
    let store = Store::open(dir, capacity)?;
    let _ = STORE.set(store);
    Ok(())
}

/// The process's store, when one was installed.
pub fn store() -> Option<&'static Store> {
    STORE.get()
}

impl Store {
    /// A store in `dir` (created, mode 0700); files left there by an earlier run
    /// are removed, since the index starts empty.
    pub fn open(dir: &Path, capacity: u64) -> io::Result<Store> {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                std::fs::remove_file(entry.path())?;
            }
        }
        Ok(Store { dir: dir.to_path_buf(), capacity, index: Mutex::new(Index::default()), busy: AtomicUsize::new(0) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn path_of(&self, number: u64, coding: &str) -> PathBuf {
        self.dir.join(format!("{number}.{coding}"))
    }

    /// What the store holds for `original` in `coding`, the body opened when there
    /// is one. Each body found counts as a hit of this thread. An opened body is
    /// kept in the worker's open-file cache (of `cache_entries`, with the bytes of
    /// a small one), as a file beneath ROOT is: a stored file never changes, and one
    /// evicted stays readable, and right, through a descriptor still held.
    pub fn get(&self, original: &Found, coding: &'static str, cache_entries: usize) -> Stored {
        let key = Key { rel: original.rel.to_path_buf(), stamp: Stamp::of(&original.meta), coding };
        let (number, len) = {
            let mut index = self.lock();
            index.tick += 1;
            let tick = index.tick;
            match index.entries.get_mut(&key) {
                None => return Stored::Missing,
                Some(Entry { number: None, .. }) => return Stored::Original,
                Some(Entry { number: Some(n), len, used }) => {
                    *used = tick;
                    (*n, *len)
                }
            }
        };
        let now = Instant::now();
        let cache_key = cache_key(number, coding);
        if let Some(body) = cache::get(&cache_key, now).filter(|b| b.meta.len() == len) {
            HITS.with(|h| h.set(h.get() + 1));
            return Stored::Body(body);
        }
        match File::open(self.path_of(number, coding)).and_then(|f| f.metadata().map(|m| (f, m))) {
            Ok((file, meta)) if meta.len() == len => {
                HITS.with(|h| h.set(h.get() + 1));
                let mut body =
                    Found { file: Rc::new(file), meta, rel: original.rel.clone(), mime: original.mime, content: None };
                body.content = cache::put(&cache_key, &body, now, cache_entries);
                Stored::Body(body)
            }
            _ => {
                // Removed or changed behind the store's back: forget it, make it again.
                let mut index = self.lock();
                if let Some(e) = index.entries.remove(&key) {
                    index.total = index.total.saturating_sub(e.len);
                }
                Stored::Missing
            }
        }
    }

    /// Starts compressing `original` in `coding` on the blocking pool unless it is
    /// under way already; either way returns its [`Waiter`]. `None` when no
    /// compression can run: every compressor busy, no tokio runtime, or no
    /// descriptor to give the compressor. Must be called on the thread that counts it.
    pub fn start(&'static self, original: &Found, coding: &'static str) -> Option<Waiter> {
        let key = Key { rel: original.rel.to_path_buf(), stamp: Stamp::of(&original.meta), coding };
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (tx, rx) = {
            let mut index = self.lock();
            if let Some(rx) = index.running.get(&key) {
                return Some(Waiter(rx.clone()));
            }
            if index.entries.contains_key(&key) {
                return None;
            }
            if self.busy.fetch_add(1, Ordering::AcqRel) >= COMPRESSORS {
                self.busy.fetch_sub(1, Ordering::AcqRel);
                return None;
            }
            let (tx, rx) = watch::channel(());
            index.running.insert(key.clone(), rx.clone());
            (tx, rx)
        };
        let Ok(file) = original.file.try_clone() else {
            // Out of descriptors for now: nothing recorded, a later request tries again.
            self.lock().running.remove(&key);
            self.busy.fetch_sub(1, Ordering::AcqRel);
            return None;
        };
        MADE.with(|m| m.set(m.get() + 1));
        let mut job = Job { store: self, key, made: None, _done: tx };
        runtime.spawn_blocking(move || job.run(&file));
        Some(Waiter(rx))
    }

    /// Blocking: compresses `file` into a temporary file and renames it into place;
    /// `(number, len)` of the stored body, or `None` when it is not worth keeping.
    fn make(&self, file: &File, key: &Key) -> Option<(u64, u64)> {
        let number = {
            let mut index = self.lock();
            index.next_number += 1;
            index.next_number
        };
        let tmp = self.dir.join(format!("tmp.{number}"));
        let made = (|| {
            let out = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            let len = encode(file, key.stamp.size, key.coding, out)?;
            // A file changed while it was read is not what the key names.
            if Stamp::of(&file.metadata()?) != key.stamp {
                return Err(io::Error::other("the file changed while it was compressed"));
            }
            Ok(len)
        })();
        match made {
            Ok(len) if len < key.stamp.size && len <= self.capacity => {
                match std::fs::rename(&tmp, self.path_of(number, key.coding)) {
                    Ok(()) => return Some((number, len)),
                    Err(e) => tracing::warn!("compressed store {}: {e}", self.dir.display()),
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("compressing {} ({}): {e}", key.rel.display(), key.coding),
        }
        let _ = std::fs::remove_file(&tmp);
        None
    }

    /// Records what a compression made, evicting the least recently used bodies
    /// beyond the capacity, and lets its waiters go.
    fn finish(&self, key: &Key, made: Option<(u64, u64)>) {
        let mut evicted = Vec::new();
        {
            let mut index = self.lock();
            index.running.remove(key);
            index.tick += 1;
            let (number, len) = match made {
                Some((n, len)) => (Some(n), len),
                None => (None, 0),
            };
            let used = index.tick;
            if let Some(old) = index.entries.insert(key.clone(), Entry { number, len, used }) {
                index.total = index.total.saturating_sub(old.len);
            }
            index.total += len;
            while index.total > self.capacity {
                // The least recently used body; entries without one hold no bytes.
                let Some(oldest) = index.entries.iter().filter(|(_, e)| e.number.is_some()).min_by_key(|(_, e)| e.used)
                else {
                    break;
                };
                let oldest = oldest.0.clone();
                if let Some(e) = index.entries.remove(&oldest) {
                    index.total = index.total.saturating_sub(e.len);
                    evicted.extend(e.number.map(|n| self.path_of(n, oldest.coding)));
                }
            }
            // Entries that hold no body are small; they go too when they far
            // outnumber what the bound allows, oldest first.
            if index.entries.len() > MAX_ENTRIES {
                let mut ages: Vec<u64> = index.entries.values().map(|e| e.used).collect();
                ages.sort_unstable();
                let cut = ages[index.entries.len() - MAX_ENTRIES];
                let mut gone = Vec::new();
                index.entries.retain(|k, e| {
                    let keep = e.used >= cut;
                    if !keep {
                        gone.extend(e.number.map(|n| (self.path_of(n, k.coding), e.len)));
                    }
                    keep
                });
                for (path, len) in gone {
                    index.total = index.total.saturating_sub(len);
                    evicted.push(path);
                }
            }
        }
        self.busy.fetch_sub(1, Ordering::AcqRel);
        for path in evicted {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Bytes of the bodies stored now.
    #[cfg(test)]
    fn total(&self) -> u64 {
        self.lock().total
    }
}

/// A compression under way. However it ends (done, panicked, or never run
/// because the runtime shut down), dropping it records the result and frees its
/// compressor, then lets its waiters go.
struct Job {
    store: &'static Store,
    key: Key,
    made: Option<(u64, u64)>,
    /// Dropped after [`Drop::drop`] has recorded the result: waiters wake to find it.
    _done: watch::Sender<()>,
}

impl Job {
    /// Blocking: makes the body; dropping the job then records it.
    fn run(&mut self, file: &File) {
        self.made = self.store.make(file, &self.key);
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.store.finish(&self.key, self.made.take());
    }
}

/// A stored body's key in the open-file cache: where a file beneath ROOT has its
/// ROOT's id, one no ROOT has (ids count up from 0), then the stored file's name.
fn cache_key(number: u64, coding: &str) -> Vec<u8> {
    let mut key = u64::MAX.to_be_bytes().to_vec();
    key.extend_from_slice(format!("/{number}.{coding}").as_bytes());
    key
}

/// Most index entries, whatever their size: bounds the index's memory (about 200
/// bytes each) when many files are not worth compressing.
const MAX_ENTRIES: usize = 100_000;

/// Reads a file from its start by `pread`, so that the descriptor's offset, shared
/// with the serving side's duplicate, is never moved.
struct ReadAt<'a> {
    file: &'a File,
    at: u64,
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// Blocking: writes the first `len` bytes of `file` compressed in `coding` to
/// `out`; returns the compressed length. A file shorter than `len` is an error.
pub fn encode(file: &File, len: u64, coding: &str, out: File) -> io::Result<u64> {
    let mut input = ReadAt { file, at: 0 }.take(len);
    let mut out = BufWriter::with_capacity(64 * 1024, out);
    match coding {
        "zstd" => {
            let mut e = zstd::stream::write::Encoder::new(&mut out, ZSTD_LEVEL)?;
            io::copy(&mut input, &mut e)?;
            e.finish()?;
        }
        "br" => {
            let params = brotli::enc::BrotliEncoderParams {
                quality: BROTLI_QUALITY,
                lgwin: BROTLI_WINDOW,
                ..Default::default()
            };
            brotli::BrotliCompress(&mut input, &mut out, &params)?;
        }
        "gzip" => {
            let mut e = flate2::write::GzEncoder::new(&mut out, flate2::Compression::new(GZIP_LEVEL));
            io::copy(&mut input, &mut e)?;
            e.finish()?;
        }
        other => return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("no encoder for {other}"))),
    }
    if input.get_ref().at != len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the file is shorter than its size"));
    }
    let out = out.into_inner().map_err(|e| e.into_error())?;
    Ok(out.metadata()?.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(coding: &str, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match coding {
            "zstd" => out = zstd::stream::decode_all(bytes).unwrap(),
            "br" => {
                brotli::Decompressor::new(bytes, 4096).read_to_end(&mut out).unwrap();
            }
            "gzip" => {
                flate2::read::GzDecoder::new(bytes).read_to_end(&mut out).unwrap();
            }
            _ => unreachable!(),
        }
        out
    }

    #[test]
    fn each_coding_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let text: Vec<u8> = (0..3000).flat_map(|i| format!("line {i}\n").into_bytes()).collect();
        let src = dir.path().join("src");
        std::fs::write(&src, &text).unwrap();
        let file = File::open(&src).unwrap();
        for coding in ["zstd", "br", "gzip"] {
            let dst = dir.path().join(coding);
            let len = encode(&file, text.len() as u64, coding, File::create(&dst).unwrap()).unwrap();
            let bytes = std::fs::read(&dst).unwrap();
            assert_eq!(len, bytes.len() as u64, "{coding}");
            assert!(len < text.len() as u64 / 3, "{coding}: {len}");
            assert_eq!(decode(coding, &bytes), text, "{coding}");
        }
        let out = File::create(dir.path().join("x")).unwrap();
        assert!(encode(&file, text.len() as u64, "deflate", out).is_err());
        let out = File::create(dir.path().join("y")).unwrap();
        assert!(encode(&file, text.len() as u64 + 1, "gzip", out).is_err(), "a file shorter than its size");
    }

    fn found(dir: &Path, name: &str, bytes: &[u8]) -> Found {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        let file = File::open(&p).unwrap();
        let meta = file.metadata().unwrap();
        Found::new(file, meta, PathBuf::from(name))
    }

    /// Runs `start` to its end on a runtime of the test's own.
    fn compress(store: &'static Store, f: &Found, coding: &'static str) -> bool {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            match store.start(f, coding) {
                Some(w) => {
                    w.done().await;
                    true
                }
                None => false,
            }
        })
    }

    #[test]
    fn bodies_are_kept_and_evicted_least_recently_used_first() {
        let root = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        let dir = state.path().join("compressed");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("7.gzip"), b"left by an earlier run").unwrap();
        let text = |seed: u32| -> Vec<u8> { (0..2000).flat_map(|i| format!("{seed} {i}\n").into_bytes()).collect() };
        let (a, b, c) =
            (found(root.path(), "a", &text(1)), found(root.path(), "b", &text(2)), found(root.path(), "c", &text(3)));
        // Room for about two bodies.
        let store: &'static Store = Box::leak(Box::new(Store::open(&dir, 9000).unwrap()));
        assert!(!dir.join("7.gzip").exists(), "emptied at start");
        assert!(matches!(store.get(&a, "gzip", 0), Stored::Missing));
        assert!(compress(store, &a, "gzip"));
        let Stored::Body(body) = store.get(&a, "gzip", 0) else { panic!("stored") };
        let mut bytes = Vec::new();
        (&*body.file).read_to_end(&mut bytes).unwrap();
        assert_eq!(decode("gzip", &bytes), text(1));
        assert_eq!(body.meta.len(), bytes.len() as u64);
        assert_eq!(&*body.rel, Path::new("a"), "the original's path, for its type and rules");
        assert!(!compress(store, &a, "gzip"), "once stored, not made again");
        assert!(compress(store, &b, "gzip"));
        // a is used again, so b is the least recently used when c comes.
        assert!(matches!(store.get(&a, "gzip", 0), Stored::Body(_)));
        assert!(compress(store, &c, "gzip"));
        assert!(store.total() <= 9000, "{}", store.total());
        assert!(matches!(store.get(&b, "gzip", 0), Stored::Missing), "b evicted");
        assert!(matches!(store.get(&a, "gzip", 0), Stored::Body(_)));
        assert!(matches!(store.get(&c, "gzip", 0), Stored::Body(_)));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "b's file is gone, no temporary left");
        // Another coding is another entry.
        assert!(matches!(store.get(&a, "zstd", 0), Stored::Missing));

        // A body that does not shrink is remembered and never made again.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let noise: Vec<u8> = (0..4000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        let n = found(root.path(), "noise", &noise);
        assert!(compress(store, &n, "zstd"));
        assert!(matches!(store.get(&n, "zstd", 0), Stored::Original));
        assert!(!compress(store, &n, "zstd"));

        // A changed file is another key; a stored file removed behind the store's back is made again.
        let a2 = found(root.path(), "a", &text(4));
        assert!(matches!(store.get(&a2, "gzip", 0), Stored::Missing));
        for e in std::fs::read_dir(&dir).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
        assert!(matches!(store.get(&c, "gzip", 0), Stored::Missing));
        assert!(compress(store, &c, "gzip"));
        assert!(matches!(store.get(&c, "gzip", 0), Stored::Body(_)));

        // A body kept in the open-file cache is sent from its descriptor, even once evicted.
        let d = found(root.path(), "d", &text(5));
        assert!(compress(store, &d, "gzip"));
        assert!(matches!(store.get(&d, "gzip", 8), Stored::Body(_)));
        for e in std::fs::read_dir(&dir).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
        let Stored::Body(body) = store.get(&d, "gzip", 8) else { panic!("from the open-file cache") };
        let mut bytes = Vec::new();
        (&*body.file).read_to_end(&mut bytes).unwrap();
        assert_eq!(decode("gzip", &bytes), text(5));
        assert_eq!(&*body.rel, Path::new("d"));
    }

    #[test]
    fn no_runtime_no_compression() {
        let root = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        let store: &'static Store = Box::leak(Box::new(Store::open(state.path(), 1 << 20).unwrap()));
        let a = found(root.path(), "a", &[b'a'; 5000]);
        assert!(store.start(&a, "gzip").is_none());
        assert_eq!(store.busy.load(Ordering::Acquire), 0);
    }
}
