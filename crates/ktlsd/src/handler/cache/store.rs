//! Where entries live and what the cache remembers of them: file names from
//! keys, the in-memory index (each entry's parsed head and its last use), the
//! index's rebuild from the directory at start (on a thread of its own), and
//! least-recently-used eviction (on another).
//!
//! Not HTTP: what an entry may answer is `policy`'s, the file format `entry`'s.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use super::entry::{self, hex, Bad};
use super::policy::Meta;
use crate::log::{more, Throttle};

/// The SHA-256 of a primary key's text.
pub type Primary = [u8; 32];

/// The digest of `key`.
pub fn primary(key: &str) -> Primary {
    let mut out = [0u8; 32];
    out.copy_from_slice(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, key.as_bytes()).as_ref());
    out
}

/// [`primary`], remembered per worker for the last keys asked for (at most
/// [`MEMO_KEYS`]; forgotten all at once when full), so that a hit of a busy key
/// costs a hash-map lookup instead of a SHA-256.
pub fn primary_memo(key: &str) -> Primary {
    thread_local! {
        static MEMO: std::cell::RefCell<HashMap<String, Primary>> = std::cell::RefCell::default();
    }
    MEMO.with(|m| {
        let mut m = m.borrow_mut();
        if let Some(p) = m.get(key) {
            return *p;
        }
        if m.len() >= MEMO_KEYS {
            m.clear();
        }
        let p = primary(key);
        m.insert(key.to_string(), p);
        p
    })
}

/// Keys whose digest a worker remembers.
pub const MEMO_KEYS: usize = 4096;

/// The cache directory's layout: `ab/cd/<primary>.<secondary>` for an entry whose
/// primary key's digest starts `abcd` (65,536 directories, so none grows large),
/// and `tmp/` for entries still being written.
#[derive(Debug)]
pub struct Layout {
    pub dir: PathBuf,
    /// Tells temporary files of this process apart.
    next_tmp: AtomicU64,
}

impl Layout {
    pub fn new(dir: PathBuf) -> Layout {
        Layout { dir, next_tmp: AtomicU64::new(0) }
    }

    /// The directory of `p`'s entries.
    pub fn shard(&self, p: &Primary) -> PathBuf {
        let h = hex(&p[..2]);
        self.dir.join(&h[..2]).join(&h[2..])
    }

    /// The file of one variant of `p`.
    pub fn entry(&self, p: &Primary, secondary: &str) -> PathBuf {
        self.shard(p).join(format!("{}.{secondary}", hex(p)))
    }

    /// A new temporary file name.
    pub fn tmp(&self) -> PathBuf {
        let n = self.next_tmp.fetch_add(1, Relaxed);
        self.dir.join("tmp").join(format!("{}-{n}", std::process::id()))
    }

    /// Creates the directory, `tmp/` and `p`'s shard when missing, owner-only.
    pub fn create(&self, p: Option<&Primary>) -> std::io::Result<()> {
        let mut b = fs::DirBuilder::new();
        b.recursive(true).mode(0o700);
        b.create(self.dir.join("tmp"))?;
        if let Some(p) = p {
            b.create(self.shard(p))?;
        }
        Ok(())
    }

    /// The variant files of `p` on disk now.
    pub fn variants_on_disk(&self, p: &Primary) -> Vec<PathBuf> {
        let prefix = format!("{}.", hex(p));
        let Ok(dir) = fs::read_dir(self.shard(p)) else { return Vec::new() };
        dir.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&prefix)).map(|e| e.path()).collect()
    }

    /// The primary digest of the entry file at `path` (from its name).
    pub fn primary_of(path: &Path) -> Option<Primary> {
        let name = path.file_name()?.to_str()?;
        let (h, _) = name.split_once('.')?;
        let mut p = [0u8; 32];
        if h.len() != 64 {
            return None;
        }
        for (i, byte) in p.iter_mut().enumerate() {
            *byte = u8::from_str_radix(h.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(p)
    }
}

/// Reads the entry at `path` for the index; a corrupt one is deleted (and `None`).
pub fn load(path: &Path) -> Option<Meta> {
    match entry::open(path) {
        Ok((_, len, parsed)) => match Meta::new(parsed, len, path.to_path_buf()) {
            Some(m) => Some(m),
            None => {
                discard(path, "its fields are not valid");
                None
            }
        },
        Err(Bad::Corrupt(why)) => {
            discard(path, why);
            None
        }
        Err(Bad::Io(e)) => {
            tracing::debug!("cache entry {} not read: {e}", path.display());
            None
        }
    }
}

/// Deletes a corrupt entry file, saying so (at most once a second: a file system
/// that corrupts entries must not flood the log).
pub fn discard(path: &Path, why: &str) {
    static CORRUPT: Throttle = Throttle::new(std::time::Duration::from_secs(1));
    if let Some(n) = CORRUPT.check() {
        tracing::warn!("cache entry {} is corrupt ({why}): deleted{}", path.display(), more(n));
    }
    let _ = fs::remove_file(path);
}

/// One entry in the index.
struct Slot {
    meta: Arc<Meta>,
    /// The index's clock at its last use: the smallest is evicted first.
    used: u64,
}

/// Every entry the cache knows, by primary key, with the bytes they take.
#[derive(Default)]
pub struct Index {
    map: HashMap<Primary, Vec<Slot>>,
    pub bytes: u64,
    pub entries: u64,
    clock: u64,
}

impl Index {
    /// `p`'s variants, most recently stored first; `None` when the index has none.
    pub fn variants(&self, p: &Primary) -> Option<Vec<Arc<Meta>>> {
        let slots = self.map.get(p)?;
        let mut v: Vec<Arc<Meta>> = slots.iter().map(|s| s.meta.clone()).collect();
        v.sort_by_key(|m| std::cmp::Reverse(m.head.stored_ms));
        Some(v)
    }

    /// The `n` keys with the most hits (the variants of a key added up), most first
    /// (ties by key); keys never hit are left out.
    pub fn hottest(&self, n: usize) -> Vec<(String, u64)> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut by_key: HashMap<&str, u64> = HashMap::new();
        for s in self.map.values().flatten() {
            *by_key.entry(s.meta.head.key.as_str()).or_default() += s.meta.hits.load(Relaxed);
        }
        let mut all: Vec<(u64, &str)> = by_key.into_iter().map(|(k, h)| (h, k)).filter(|(h, _)| *h > 0).collect();
        all.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        all.into_iter().take(n).map(|(h, k)| (k.to_string(), h)).collect()
    }

    /// The distinct keys of the entries whose key begins with `prefix`.
    pub fn keys_with_prefix(&self, prefix: &str) -> Vec<String> {
        let mut keys: Vec<String> = (self.map.values().flatten())
            .filter(|s| s.meta.head.key.starts_with(prefix))
            .map(|s| s.meta.head.key.clone())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// Marks the entry at `path` used now.
    pub fn touch(&mut self, p: &Primary, path: &Path) {
        self.clock += 1;
        let clock = self.clock;
        if let Some(s) = self.map.get_mut(p).and_then(|v| v.iter_mut().find(|s| s.meta.path == path)) {
            s.used = clock;
        }
    }

    /// Adds `meta` (replacing an entry of the same file), used now.
    pub fn insert(&mut self, p: Primary, meta: Arc<Meta>) {
        self.remove_path(&p, &meta.path);
        self.clock += 1;
        self.bytes += meta.file_len;
        self.entries += 1;
        self.map.entry(p).or_default().push(Slot { meta, used: self.clock });
    }

    /// Whether the index has the file at `path`.
    pub fn has(&self, p: &Primary, path: &Path) -> bool {
        self.map.get(p).is_some_and(|v| v.iter().any(|s| s.meta.path == path))
    }

    /// Forgets the entry at `path`; whether there was one.
    pub fn remove_path(&mut self, p: &Primary, path: &Path) -> bool {
        let Some(v) = self.map.get_mut(p) else { return false };
        let Some(i) = v.iter().position(|s| s.meta.path == path) else { return false };
        let s = v.swap_remove(i);
        super::open::dropped(&s.meta);
        self.bytes = self.bytes.saturating_sub(s.meta.file_len);
        self.entries = self.entries.saturating_sub(1);
        if v.is_empty() {
            self.map.remove(p);
        }
        true
    }

    /// Forgets every variant of `p`; their files.
    pub fn remove_primary(&mut self, p: &Primary) -> Vec<PathBuf> {
        let slots = self.map.remove(p).unwrap_or_default();
        for s in &slots {
            super::open::dropped(&s.meta);
            self.bytes = self.bytes.saturating_sub(s.meta.file_len);
            self.entries = self.entries.saturating_sub(1);
        }
        slots.into_iter().map(|s| s.meta.path.clone()).collect()
    }

    /// Forgets the least recently used entries until at most `target` bytes are
    /// left; their files, for the caller to delete.
    pub fn evict_to(&mut self, target: u64) -> Vec<PathBuf> {
        if self.bytes <= target {
            return Vec::new();
        }
        let mut all: Vec<(u64, Primary, PathBuf, u64)> = self
            .map
            .iter()
            .flat_map(|(p, v)| v.iter().map(move |s| (s.used, *p, s.meta.path.clone(), s.meta.file_len)))
            .collect();
        all.sort_unstable_by_key(|e| e.0);
        let mut gone = Vec::new();
        let mut bytes = self.bytes;
        for (_, p, path, len) in all {
            if bytes <= target {
                break;
            }
            bytes = bytes.saturating_sub(len);
            self.remove_path(&p, &path);
            gone.push(path);
        }
        gone
    }
}

/// Every entry file under the cache directory (two levels of shards), for the rebuild.
pub fn walk(dir: &Path, mut each: impl FnMut(PathBuf)) {
    let level = |d: &Path| -> Vec<PathBuf> {
        let Ok(rd) = fs::read_dir(d) else { return Vec::new() };
        rd.flatten()
            .filter(|e| e.file_name().len() == 2 && e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect()
    };
    for a in level(dir) {
        for b in level(&a) {
            let Ok(rd) = fs::read_dir(&b) else { continue };
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_file()) {
                    each(e.path());
                }
            }
        }
    }
}
