//! The response cache (RFC 9111) of a reverse proxy: upstream responses kept as
//! files, so that a hit leaves by the same `sendfile` body path as a static file.
//!
//! It is not an HTTP client and serves no request by itself: the proxy asks it
//! before going upstream and hands it what comes back. What a stored response may
//! answer (freshness, Age, Vary, Authorization, heuristics) is the
//! `http-cache-semantics` crate's, with the RFC 5861 extensions added (`policy`).
//!
//! # The API the proxy calls
//!
//! - [`Cache::open`] once at start (the directory is created owner-only when
//!   missing; the index is rebuilt in the background).
//! - [`Cache::lookup`]`(&key, &request_fields)` with a [`Key`] (site host, target):
//!   - [`Lookup::Hit`]: answer with [`Hit::into_response`] (ranges and
//!     conditionals are answered from the stored full response);
//!   - [`Lookup::Stale`]: a stored response that needs validation. Send upstream
//!     with [`Stale::revalidate`]'s fields; a 304 goes to [`Cache::refresh`], which
//!     gives the refreshed hit; a 200 to the fill. When
//!     [`Stale::serve_while_revalidating`] is true, answer with the stale hit at once
//!     and revalidate in the background (only when `fill` is `Some`: else another
//!     request already does). On upstream failure [`Stale::on_error`] says whether
//!     the stale hit may answer (`stale-if-error`);
//!   - [`Lookup::Miss`]: go upstream; the [`FillGuard`] stores the answer:
//!     [`FillGuard::admit`] (storable? small enough?) gives an [`EntryWriter`]:
//!     `write` each body chunk, `commit` once the body is complete; `commit`
//!     returning `Ok` is the only sign that the response was stored. Dropping a
//!     guard or writer, or any failed write, abandons the fill (the temporary file
//!     is removed); disk errors are logged here, at most once a second.
//! - Concurrent lookups of one key while a fill runs wait for it (at most
//!   [`COALESCE_WAIT`], then each goes upstream itself), then answer from the new
//!   entry: one upstream request for many clients.
//! - [`cache_status`] builds every RFC 9211 `Cache-Status` value; [`Hit::cache_status`],
//!   [`FillGuard::cache_status`] and [`Stale::fwd`] say what each answer's is (`hit`,
//!   `fwd=miss`/`vary-miss`/`stale`/`request`, `collapsed`, and `stored` only for
//!   a head sent after its entry's commit succeeded).
//! - [`Cache::purge`] removes every variant of a key; [`Cache::figures`] gives the metrics.
//!
//! # On disk
//!
//! One file per stored response (see `entry` for its layout: a checked head,
//! then the body at a known offset). Files are named after the SHA-256 of the
//! primary key (`GET host target`): `ab/cd/<64 hex digits>.<variant>`, where the
//! variant is a digest of the request fields the response's Vary names (`0`
//! without Vary). A new entry is written to `tmp/`, its data flushed
//! (`fdatasync`) and then renamed into place, so a crash leaves either no entry or
//! a whole one; `tmp/` is emptied at start. Corrupt or truncated files are deleted
//! when met, never served: every hit checks the file's length on its open
//! descriptor, and the body's checksum is checked on an entry's first hit after
//! start and on a `verify_sample` share of the others. The index (in memory: each entry's head, about one
//! kilobyte) is rebuilt at start on a thread of its own; until it has seen a key,
//! a lookup reads that key's files straight from its directory. Eviction runs on
//! another thread, least recently used first, once the files exceed `max_size`,
//! down to 90% of it, and while the file system has less than `min_free` (or
//! than a write that found it full needed) free.

pub(crate) mod entry;
mod fill;
mod open;
pub(crate) mod policy;
mod serve;
mod store;

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

use http::HeaderMap;
use tokio::sync::watch;

pub use fill::{EntryWriter, FillGuard, Upstream};
pub use policy::NotStored;
pub use serve::{age_field, cache_status, not_modified, precondition, precondition_failed, range_of, CacheStatus, Fwd};

use crate::log::{more, Throttle};
use crate::stats::prometheus::CacheFigures;
use entry::Bad;
use policy::{Freshness, Meta};
use store::{Index, Layout, Primary};

/// Closes up to `n` of the entry files this worker holds open (all for
/// `usize::MAX`), least recently used first, and says how many: the descriptor
/// ledger's release of entry files ([`crate::fds`]).
pub fn release_entry_files(n: usize) -> usize {
    open::release(n)
}

/// How long a lookup waits for another request's fill of the same key before it
/// goes upstream itself: long enough for a typical upstream answer, short enough
/// that a stuck upstream costs each waiter little more than its own request would.
pub const COALESCE_WAIT: Duration = Duration::from_secs(5);

/// How long a key whose cold range fill met an object too large or not storable
/// sends its ranges upstream as they are, before a range fill is tried again.
pub const DIRECT_FOR: Duration = Duration::from_secs(600);

/// Most keys remembered as [`DIRECT_FOR`]: a few dozen bytes each.
const DIRECT_KEPT: usize = 4096;

/// Where the cache keeps its entries and how much it may keep (from `[cache]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The directory of the entries (created owner-only when missing).
    pub dir: PathBuf,
    /// Bytes on disk (heads and bodies) above which the least recently used entries are evicted.
    pub max_size: u64,
    /// The largest body stored; a larger response is passed on without being stored.
    pub max_object_size: u64,
    /// The share of hits whose body is read back and checked against its checksum,
    /// in millionths (1,000,000: every hit). The first hit of an entry after start
    /// is always checked.
    pub verify_sample: u32,
    /// The free space kept on the cache's file system: below it, the least
    /// recently used entries are evicted.
    pub min_free: MinFree,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            dir: PathBuf::new(),
            max_size: 1 << 30,
            max_object_size: 64 << 20,
            verify_sample: 10_000,
            min_free: MinFree::Bytes(0),
        }
    }
}

/// Free space to keep on the cache's file system (nginx's `min_free`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinFree {
    Bytes(u64),
    /// Percent of the file system's size.
    Percent(u8),
}

impl MinFree {
    /// The bytes to keep free on a file system of `total` bytes.
    pub fn of(self, total: u64) -> u64 {
        match self {
            MinFree::Bytes(n) => n,
            MinFree::Percent(p) => total / 100 * u64::from(p),
        }
    }
}

/// The primary cache key: the host the site answers as and the request target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    text: String,
    primary: Primary,
}

impl Key {
    /// The key of a GET or HEAD for `target` (path and query, as sent). `host` is
    /// the request's host (`names::host_of`) for a `[[site]]`, and empty for the
    /// default site, whose names share its entries (as nginx's default key
    /// `$scheme$proxy_host$request_uri` shares them).
    pub fn new(host: &str, target: &str) -> Key {
        let text = format!("GET {host} {target}");
        Key { primary: store::primary_memo(&text), text }
    }

    /// The key of slice `index` of this key's object cut in slices of `size` bytes
    /// (`cache_slice`): its text is the object's with ` slice=SIZE:INDEX` after it,
    /// so slices of another size are other entries.
    pub fn slice(&self, size: u64, index: u64) -> Key {
        let text = format!("{}{index}", self.slices(size));
        Key { primary: store::primary(&text), text }
    }

    /// What the text of every slice key of this key's object in slices of `size`
    /// bytes begins with (see [`Key::slice`]).
    pub fn slices(&self, size: u64) -> String {
        format!("{} slice={size}:", self.text)
    }

    /// The key as text (`GET host target`): what cache peers hash to find its owner.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// The response cache, shared by every worker.
pub struct Cache {
    config: Settings,
    layout: Layout,
    index: Mutex<Index>,
    /// Keys being filled now, each with the channel its waiters watch.
    inflight: Mutex<std::collections::HashMap<Primary, watch::Receiver<bool>>>,
    /// The rebuild has read every file that was there at start.
    rebuilt: AtomicBool,
    /// Wakes the eviction thread.
    evict: (Mutex<bool>, Condvar),
    counters: Counters,
    /// The latest purges (a generation number each, and the key), so that a fill
    /// that began before a purge of its key does not store the purged response.
    purges: Mutex<Purges>,
    /// Bytes a fill could not write for want of space, for the eviction to free.
    short_of: AtomicU64,
    /// Keys whose ranges go upstream as the client sent them: their object was
    /// larger than `max_object_size`, or its answer was not storable, when a cold
    /// range fill last asked for it (see [`Cache::ranges_direct`]).
    direct: Mutex<std::collections::HashMap<Primary, std::time::Instant>>,
    /// Rate limits of the warnings of a full disk and of other write failures.
    disk_full: Throttle,
    write_error: Throttle,
}

/// How often a repeated disk warning is logged: once a second at most.
const WARN_EVERY: Duration = Duration::from_secs(1);

/// The last [`Purges::KEPT`] purges, numbered.
#[derive(Default)]
struct Purges {
    generation: u64,
    recent: std::collections::VecDeque<(u64, Primary)>,
}

impl Purges {
    /// Purges remembered: a fill older than all of them is refused whatever its key.
    const KEPT: usize = 1024;

    fn record(&mut self, p: Primary) {
        self.generation += 1;
        self.recent.push_back((self.generation, p));
        if self.recent.len() > Self::KEPT {
            self.recent.pop_front();
        }
    }

    /// Whether `p` may have been purged after generation `since`.
    fn purged_since(&self, p: &Primary, since: u64) -> bool {
        let forgotten = self.recent.front().map_or(self.generation, |(g, _)| g - 1);
        since < forgotten || self.recent.iter().any(|(g, q)| *g > since && q == p)
    }
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    stale: AtomicU64,
    revalidations: AtomicU64,
    coalesced: AtomicU64,
    evictions: AtomicU64,
}

/// What a lookup found.
#[allow(clippy::large_enum_variant)] // one per request, moved once to its caller
pub enum Lookup {
    Hit(Hit),
    Stale(Stale),
    Miss(FillGuard),
}

/// A stored response that needs validation (or may be served while it gets it).
pub struct Stale {
    pub hit: Hit,
    /// Fields to add to the upstream request (If-None-Match, If-Modified-Since).
    pub revalidate: HeaderMap,
    /// `stale-while-revalidate` allows answering with `hit` now.
    pub serve_while_revalidating: bool,
    /// Stores what the upstream answers; `None` when another request is already
    /// revalidating this entry (then serve the stale hit).
    pub fill: Option<FillGuard>,
    /// `Stale`, or `Request` when the entry is fresh but the request asked for validation.
    pub fwd: Fwd,
}

impl Stale {
    /// Whether `stale-if-error` lets the stale hit answer after the upstream failed
    /// (no answer, or 500, 502, 503, 504) for a request with fields `req`.
    pub fn on_error(&self, cache: &Cache, req: &HeaderMap) -> bool {
        let ok = self.hit.meta.may_serve_on_error(req, SystemTime::now());
        if ok {
            cache.counters.stale.fetch_add(1, Relaxed);
        }
        ok
    }
}

/// A stored response: answer with [`Hit::into_response`].
pub struct Hit {
    meta: Arc<Meta>,
    /// Its file, opened for this hit; `None` when the worker that looked it up holds
    /// it open already (`open`).
    file: Option<(File, std::fs::Metadata)>,
    /// The file's device and inode.
    id: (u64, u64),
    /// Seconds the response has been stored or upstream, for Age.
    age: u64,
    /// The lookup waited for another request's fill.
    collapsed: bool,
    /// The purge generation when it was looked up.
    generation: u64,
}

impl Hit {
    /// The entry this hit reads, for [`Cache::refresh`].
    pub fn entry(&self) -> Entry {
        Entry { meta: self.meta.clone(), file: self.id, generation: self.generation }
    }

    /// Its Cache-Status: `hit`, and `collapsed` when the lookup waited for the fill.
    pub fn cache_status(&self) -> CacheStatus {
        CacheStatus { collapsed: self.collapsed, ..CacheStatus::hit() }
    }
}

/// A stored entry, for [`Cache::refresh`].
#[derive(Clone)]
pub struct Entry {
    meta: Arc<Meta>,
    /// The file's device and inode: a refresh applies to this file only, not to one
    /// that has replaced it since.
    file: (u64, u64),
    /// The purge generation when it was looked up.
    generation: u64,
}

impl Cache {
    /// Opens the cache in `config.dir` (created, owner-only, when missing), empties
    /// its `tmp/`, and starts the index rebuild and the eviction threads.
    pub fn open(config: &Settings) -> anyhow::Result<Arc<Cache>> {
        use anyhow::Context;
        let layout = Layout::new(config.dir.clone());
        layout.create(None).with_context(|| {
            format!("cannot create the cache directory {} (check its parent's owner and mode)", config.dir.display())
        })?;
        if let Ok(rd) = std::fs::read_dir(config.dir.join("tmp")) {
            for e in rd.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let cache = Arc::new(Cache {
            config: config.clone(),
            layout,
            index: Mutex::new(Index::default()),
            inflight: Mutex::new(Default::default()),
            rebuilt: AtomicBool::new(false),
            evict: (Mutex::new(false), Condvar::new()),
            counters: Counters::default(),
            purges: Mutex::new(Purges::default()),
            short_of: AtomicU64::new(0),
            direct: Mutex::new(Default::default()),
            disk_full: Throttle::new(WARN_EVERY),
            write_error: Throttle::new(WARN_EVERY),
        });
        let rebuild = Arc::downgrade(&cache);
        std::thread::Builder::new()
            .name("ktlsd-cache-index".into())
            .spawn(move || rebuild_index(rebuild))
            .context("cannot start the cache index thread")?;
        let evict = Arc::downgrade(&cache);
        std::thread::Builder::new()
            .name("ktlsd-cache-evict".into())
            .spawn(move || evict_loop(evict))
            .context("cannot start the cache eviction thread")?;
        Ok(cache)
    }

    /// What the cache holds for `key` and a request with fields `req` (Host is not
    /// looked at). Waits, at most [`COALESCE_WAIT`], while another request fills
    /// this key. Cancel safe: dropping the future leaves nothing behind.
    pub async fn lookup(self: &Arc<Self>, key: &Key, req: &HeaderMap) -> Lookup {
        // Host is not part of the match: a map with it is copied without it.
        let req = match req.contains_key(http::header::HOST) {
            true => {
                let mut r = req.clone();
                r.remove(http::header::HOST);
                std::borrow::Cow::Owned(r)
            }
            false => std::borrow::Cow::Borrowed(req),
        };
        let req = req.as_ref();
        open::release_dropped();
        let mut waited = false;
        loop {
            let now = SystemTime::now();
            let wait = match self.find(key, req, now) {
                Some((mut hit, Freshness::Fresh)) => {
                    self.counters.hits.fetch_add(1, Relaxed);
                    hit.meta.hits.fetch_add(1, Relaxed);
                    hit.collapsed = waited;
                    return Lookup::Hit(hit);
                }
                Some((hit, _)) => {
                    let swr = hit.meta.may_serve_while_revalidating(req, now);
                    // A fresh entry that needs validation: the request asked for it (no-cache, max-age).
                    let fwd = if hit.meta.is_stale(now) { Fwd::Stale } else { Fwd::Request };
                    let fill = self.lead(key, req, fwd, waited);
                    match (fill, swr || waited) {
                        (Some(fill), _) => return self.stale(hit, swr, Some(fill), fwd),
                        (None, true) => {
                            let fill = (!swr).then(|| self.follow(key, req, fwd));
                            return self.stale(hit, swr, fill, fwd);
                        }
                        (None, false) => self.inflight_of(key),
                    }
                }
                None => {
                    let fwd = match self.lock_index().variants(&key.primary) {
                        Some(v) if v.iter().any(|m| m.head.key == key.text) => Fwd::VaryMiss,
                        _ => Fwd::Miss,
                    };
                    match self.lead(key, req, fwd, waited) {
                        Some(fill) => {
                            self.counters.misses.fetch_add(1, Relaxed);
                            return Lookup::Miss(fill);
                        }
                        None if waited => {
                            self.counters.misses.fetch_add(1, Relaxed);
                            return Lookup::Miss(self.follow(key, req, fwd));
                        }
                        None => self.inflight_of(key),
                    }
                }
            };
            waited = true;
            if let Some(mut rx) = wait {
                self.counters.coalesced.fetch_add(1, Relaxed);
                let _ = tokio::time::timeout(COALESCE_WAIT, rx.wait_for(|done| *done)).await;
            }
        }
    }

    /// The age in seconds (as a hit's `Age` would say) of the fresh entry of `key`
    /// that answers a request with fields `req` (less Host), from the index: no
    /// file is opened, no fill is led, nothing is counted; `None` when no fresh
    /// entry answers it. With `wait`, a fill of the key under way is waited for
    /// first (at most [`COALESCE_WAIT`]), as a lookup would wait for it; a caller
    /// that leads a fill itself passes `false`, so that two such callers never
    /// wait for each other. A slice's answer asks it of each slice before its head
    /// leaves.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only waits.
    pub async fn fresh_age(&self, key: &Key, req: &HeaderMap, wait: bool) -> Option<u64> {
        if let Some(mut rx) = self.inflight_of(key).filter(|_| wait) {
            let _ = tokio::time::timeout(COALESCE_WAIT, rx.wait_for(|done| *done)).await;
        }
        let now = SystemTime::now();
        let variants = self.lock_index().variants(&key.primary)?;
        variants
            .iter()
            .filter(|m| m.head.key == key.text && matches!(m.freshness(req, now), Freshness::Fresh))
            .map(|m| m.age(now).as_secs())
            .min()
    }

    /// The value of the field `name` (lower case) of the most recently stored
    /// entry of `key`, from the index (or the key's files, while the index is
    /// being rebuilt); fresh or not.
    pub fn stored_field(&self, key: &Key, name: &str) -> Option<String> {
        let variants = match self.lock_index().variants(&key.primary) {
            Some(v) => v,
            None if !self.rebuilt.load(Relaxed) => self.load_from_disk(&key.primary),
            None => return None,
        };
        variants.iter().find(|m| m.head.key == key.text).and_then(|m| m.field(name)).map(str::to_string)
    }

    /// A fill for a request that `cache_bypass` sends to the upstream without a
    /// lookup: its answer may still be stored (nginx's `proxy_cache_bypass`).
    pub fn bypass(self: &Arc<Self>, key: &Key, req: &HeaderMap) -> FillGuard {
        self.counters.misses.fetch_add(1, Relaxed);
        FillGuard::new(self.clone(), key.clone(), req.clone(), None, Upstream { fwd: Fwd::Bypass, collapsed: false })
    }

    /// A fill that does not lead (another request leads one, or led one and failed).
    fn follow(self: &Arc<Self>, key: &Key, req: &HeaderMap, fwd: Fwd) -> FillGuard {
        FillGuard::new(self.clone(), key.clone(), req.clone(), None, Upstream { fwd, collapsed: true })
    }

    fn stale(&self, hit: Hit, swr: bool, fill: Option<FillGuard>, fwd: Fwd) -> Lookup {
        if swr {
            self.counters.stale.fetch_add(1, Relaxed);
        }
        Lookup::Stale(Stale { revalidate: hit.meta.revalidation(), hit, serve_while_revalidating: swr, fill, fwd })
    }

    /// The freshest usable variant of `key` for `req`, its file open.
    fn find(&self, key: &Key, req: &HeaderMap, now: SystemTime) -> Option<(Hit, Freshness)> {
        let known = self.lock_index().variants(&key.primary);
        let variants = match known {
            Some(v) => v,
            None if !self.rebuilt.load(Relaxed) => self.load_from_disk(&key.primary),
            None => return None,
        };
        let mut stale = None;
        for meta in variants.into_iter().filter(|m| m.head.key == key.text) {
            match meta.freshness(req, now) {
                Freshness::Fresh => {
                    if let Some(hit) = self.open_hit(&key.primary, meta, now) {
                        return Some((hit, Freshness::Fresh));
                    }
                }
                Freshness::Stale if stale.is_none() => stale = Some(meta),
                _ => {}
            }
        }
        let meta = stale?;
        self.open_hit(&key.primary, meta, now).map(|h| (h, Freshness::Stale))
    }

    /// Reads `p`'s entry files into the index (before the rebuild has seen them).
    fn load_from_disk(&self, p: &Primary) -> Vec<Arc<Meta>> {
        let mut found = Vec::new();
        for path in self.layout.variants_on_disk(p) {
            if let Some(meta) = store::load(&path) {
                let meta = Arc::new(meta);
                self.lock_index().insert(*p, meta.clone());
                found.push(meta);
            }
        }
        found
    }

    /// The hit of the entry's file: held open by this worker already, or opened
    /// now. Its length is checked against the open descriptor (`fstat`) on every
    /// hit, and its body against its checksum on the entry's first hit since start
    /// and on a sample of the others (`verify_sample`). A file that is gone is
    /// forgotten; one that is truncated, resized or corrupt is deleted and
    /// forgotten (logged at most once a second): `None`, and the caller goes upstream.
    fn open_hit(&self, p: &Primary, meta: Arc<Meta>, now: SystemTime) -> Option<Hit> {
        use std::os::unix::fs::MetadataExt;
        let held = open::held(&meta);
        let opened = match &held {
            Some(_) => None,
            None => match open::open(&meta.path) {
                Ok(f) => Some(f),
                Err(e) if crate::fds::is_exhaustion(&e) => {
                    // Out of descriptors: a miss, the entry kept. One line a second
                    // per worker at most: a shortage comes with many requests.
                    thread_local!(static SHORT: crate::log::RateLimit = crate::log::RateLimit::new(1));
                    if SHORT.with(|l| l.check(std::time::Instant::now()).0) {
                        tracing::warn!("cache entry {} not opened: {e}; answered as a miss", meta.path.display());
                    }
                    return None;
                }
                Err(_) => {
                    self.lock_index().remove_path(p, &meta.path);
                    return None;
                }
            },
        };
        let file = match (&held, &opened) {
            (Some(f), _) => &**f,
            (None, Some(f)) => f,
            (None, None) => return None,
        };
        let checked = entry::check_len(file, meta.file_len).and_then(|fstat| {
            if !meta.verified.load(Relaxed) || self.sampled() {
                entry::verify_body(file, meta.body_offset, meta.body_len, meta.body_sum)?;
                meta.verified.store(true, Relaxed);
            }
            Ok(fstat)
        });
        let fstat = match checked {
            Ok(fstat) => fstat,
            Err(bad) => {
                if held.is_some() {
                    open::forget(&meta);
                }
                self.lock_index().remove_path(p, &meta.path);
                match bad {
                    Bad::Corrupt(why) => store::discard(&meta.path, why),
                    Bad::Io(e) => tracing::debug!("cache entry {} not read: {e}", meta.path.display()),
                }
                return None;
            }
        };
        self.lock_index().touch(p, &meta.path);
        let age = meta.age(now).as_secs();
        let generation = self.purge_generation();
        let id = (fstat.dev(), fstat.ino());
        let file = opened.map(|f| (f, fstat));
        Some(Hit { meta, file, id, age, collapsed: false, generation })
    }

    /// Whether this hit is one of the `verify_sample` whose body is checked.
    fn sampled(&self) -> bool {
        let share = self.config.verify_sample;
        share > 0 && (share >= 1_000_000 || open::random() % 1_000_000 < u64::from(share))
    }

    /// Logs a failed write of a new entry (at most once a second for each kind)
    /// and, when the disk is full, has the eviction free `need` bytes (the entry's
    /// size, as far as it is known) more than `min_free`. The error, for the
    /// writer's caller.
    fn write_failed(&self, e: std::io::Error, need: u64) -> fill::WriteError {
        self.disk_error("a response is not stored", &e, need);
        fill::WriteError::Io(e)
    }

    fn disk_error(&self, what: &str, e: &std::io::Error, need: u64) {
        let dir = self.config.dir.display();
        if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
            self.short_of.fetch_max(need.max(entry::PREFIX), Relaxed);
            self.wake_evictor();
            if let Some(n) = self.disk_full.check() {
                tracing::warn!("cache {dir}: {what}: {e}; evicting the least recently used entries{}", more(n));
            }
        } else if let Some(n) = self.write_error.check() {
            tracing::warn!("cache {dir}: {what}: {e}{}", more(n));
        }
    }

    /// A fill of `key` led by this request, unless one runs already.
    fn lead(self: &Arc<Self>, key: &Key, req: &HeaderMap, fwd: Fwd, collapsed: bool) -> Option<FillGuard> {
        let mut inflight = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
        if inflight.contains_key(&key.primary) {
            return None;
        }
        let (tx, rx) = watch::channel(false);
        inflight.insert(key.primary, rx);
        Some(FillGuard::new(self.clone(), key.clone(), req.clone(), Some(tx), Upstream { fwd, collapsed }))
    }

    /// The channel of the fill of `key` running now.
    fn inflight_of(&self, key: &Key) -> Option<watch::Receiver<bool>> {
        self.inflight.lock().unwrap_or_else(|e| e.into_inner()).get(&key.primary).cloned()
    }

    /// Ends the fill of `key` that this guard led, waking its waiters.
    fn fill_done(&self, key: &Key, tx: &watch::Sender<bool>) {
        let mut inflight = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
        if inflight.get(&key.primary).is_some_and(|rx| rx.same_channel(&tx.subscribe())) {
            inflight.remove(&key.primary);
        }
        drop(inflight);
        let _ = tx.send(true);
    }

    /// Applies a 304 `response` (its fields) to the stale `entry`: the stored head
    /// takes the 304's fields and its time, and the refreshed hit is returned.
    /// `None` when the 304 does not select the entry (its validators differ), the
    /// entry was replaced or purged since the lookup, or it could not be rewritten:
    /// then ask the upstream without conditions.
    /// Blocks on the disk: the body is copied (in the kernel) under the new head.
    pub fn refresh(&self, entry: &Entry, response: &HeaderMap) -> Option<Hit> {
        use std::os::unix::fs::MetadataExt;
        let now = SystemTime::now();
        let old = &entry.meta;
        let head = old.refreshed(response, now)?;
        let p = store::primary(&head.key);
        let file = File::open(&old.path).ok()?;
        let same = file.metadata().is_ok_and(|m| (m.dev(), m.ino()) == entry.file);
        if !same {
            return None;
        }
        let written = entry::rewrite(self.layout.tmp(), &head, &file, old.body_offset, old.body_len, old.body_sum)
            .and_then(|(draft, len)| {
                match self.purged_since(&Key { text: head.key.clone(), primary: p }, entry.generation) {
                    true => Err(std::io::Error::other("the key was purged meanwhile")),
                    false => draft.publish(&old.path).map(|()| len),
                }
            });
        let len = match written {
            Ok(len) => len,
            Err(e) => {
                self.disk_error(&format!("entry {} not refreshed", old.path.display()), &e, 0);
                return None;
            }
        };
        let parsed =
            entry::Parsed { head, body_offset: len - old.body_len, body_len: old.body_len, body_sum: old.body_sum };
        let meta = Arc::new(Meta::new(parsed, len, old.path.clone())?);
        meta.verified.store(old.verified.load(Relaxed), Relaxed);
        self.lock_index().insert(p, meta.clone());
        self.counters.revalidations.fetch_add(1, Relaxed);
        self.wake_evictor();
        self.open_hit(&p, meta, now)
    }

    /// Removes every variant of `key` (from the index and the disk); how many there were.
    /// A fill of the key that is under way when it is purged stores nothing.
    pub fn purge(&self, key: &Key) -> usize {
        self.purges.lock().unwrap_or_else(|e| e.into_inner()).record(key.primary);
        self.direct.lock().unwrap_or_else(|e| e.into_inner()).remove(&key.primary);
        let mut paths = self.lock_index().remove_primary(&key.primary);
        for path in self.layout.variants_on_disk(&key.primary) {
            if !paths.contains(&path) {
                paths.push(path);
            }
        }
        paths.retain(|p| std::fs::remove_file(p).is_ok());
        paths.len()
    }

    /// Removes every entry whose key begins with `prefix` (each key as [`Cache::purge`]
    /// does); how many there were. One walk of the index, under its lock: for the
    /// slices of an object, whose keys share a prefix (see [`Key::slices`]).
    /// Entries not yet indexed while the index is rebuilt are not seen.
    pub fn purge_prefix(&self, prefix: &str) -> usize {
        let keys = self.lock_index().keys_with_prefix(prefix);
        keys.into_iter().map(|text| self.purge(&Key { primary: store::primary(&text), text })).sum()
    }

    /// The cache's figures for the metrics.
    pub fn figures(&self) -> CacheFigures {
        let c = &self.counters;
        let (bytes, entries) = {
            let i = self.lock_index();
            (i.bytes, i.entries)
        };
        CacheFigures {
            hits: c.hits.load(Relaxed),
            misses: c.misses.load(Relaxed),
            stale: c.stale.load(Relaxed),
            revalidations: c.revalidations.load(Relaxed),
            coalesced: c.coalesced.load(Relaxed),
            evictions: c.evictions.load(Relaxed),
            bytes,
            entries,
        }
    }

    /// Whether a `Range` request for `key` goes upstream as sent rather than filling
    /// the whole object: a cold range fill of it met an object above
    /// `max_object_size`, or an answer that was not storable, less than
    /// [`DIRECT_FOR`] ago (and it was not purged since).
    pub fn ranges_direct(&self, key: &Key) -> bool {
        let direct = self.direct.lock().unwrap_or_else(|e| e.into_inner());
        direct.get(&key.primary).is_some_and(|at| at.elapsed() < DIRECT_FOR)
    }

    /// Notes that `key`'s ranges go upstream as sent for [`DIRECT_FOR`]. At most
    /// [`DIRECT_KEPT`] keys are remembered: past it, the expired ones are dropped,
    /// then all.
    pub fn note_ranges_direct(&self, key: &Key) {
        let mut direct = self.direct.lock().unwrap_or_else(|e| e.into_inner());
        if direct.len() >= DIRECT_KEPT {
            direct.retain(|_, at| at.elapsed() < DIRECT_FOR);
            if direct.len() >= DIRECT_KEPT {
                direct.clear();
            }
        }
        direct.insert(key.primary, std::time::Instant::now());
    }

    /// The largest body stored (`max_object_size`), bytes.
    pub fn max_object_size(&self) -> u64 {
        self.config.max_object_size
    }

    /// The stored size limit (`max_size`), bytes.
    pub fn max_size(&self) -> u64 {
        self.config.max_size
    }

    /// The `n` entries with the most fresh hits (their key text, `GET host target`,
    /// and hits), most first. Walks the index under its lock: for the admin listener,
    /// which asks at most every few seconds.
    pub fn hottest(&self, n: usize) -> Vec<(String, u64)> {
        self.lock_index().hottest(n)
    }

    /// The purge generation now, for a fill starting.
    fn purge_generation(&self) -> u64 {
        self.purges.lock().unwrap_or_else(|e| e.into_inner()).generation
    }

    /// Whether `key` may have been purged since generation `since`.
    fn purged_since(&self, key: &Key, since: u64) -> bool {
        self.purges.lock().unwrap_or_else(|e| e.into_inner()).purged_since(&key.primary, since)
    }

    fn lock_index(&self) -> MutexGuard<'_, Index> {
        // The index stays consistent across a panic elsewhere: every update is one call.
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the eviction thread when the entries exceed `max_size`, a write
    /// found the disk full, or the file system has less than `min_free` free.
    fn wake_evictor(&self) {
        let over = self.lock_index().bytes > self.config.max_size;
        if over || self.short_of.load(Relaxed) > 0 || self.free_deficit() > 0 {
            let (flag, cv) = &self.evict;
            *flag.lock().unwrap_or_else(|e| e.into_inner()) = true;
            cv.notify_one();
        }
    }

    /// The bytes missing on the cache's file system for `min_free` to be free, and
    /// for what a write could not store for want of space.
    fn free_deficit(&self) -> u64 {
        let short_of = self.short_of.load(Relaxed);
        if self.config.min_free == MinFree::Bytes(0) && short_of == 0 {
            return 0;
        }
        let Ok(fs) = rustix::fs::statvfs(&self.config.dir) else { return 0 };
        let (free, total) = (fs.f_bavail.saturating_mul(fs.f_frsize), fs.f_blocks.saturating_mul(fs.f_frsize));
        (self.config.min_free.of(total) + short_of).saturating_sub(free)
    }

    /// Evicts the least recently used entries down to 90% of `max_size`, and
    /// further while the file system lacks free space; how many.
    fn evict_now(&self) -> usize {
        let mut target = self.config.max_size / 10 * 9;
        let deficit = self.free_deficit();
        self.short_of.store(0, Relaxed);
        if deficit > 0 {
            let bytes = self.lock_index().bytes;
            target = target.min(bytes.saturating_sub(deficit));
        }
        let gone = self.lock_index().evict_to(target);
        for path in &gone {
            let _ = std::fs::remove_file(path);
        }
        self.counters.evictions.fetch_add(gone.len() as u64, Relaxed);
        if deficit > 0 && !gone.is_empty() {
            tracing::info!(
                "cache {}: {} entries evicted to free {deficit} bytes (min_free, or a write that found the disk full)",
                self.config.dir.display(),
                gone.len()
            );
        }
        gone.len()
    }
}

/// The index rebuild: every entry file read once (corrupt ones deleted), added
/// unless the index already has it. Ends early when the cache is dropped.
fn rebuild_index(cache: Weak<Cache>) {
    let Some(dir) = cache.upgrade().map(|c| c.config.dir.clone()) else { return };
    let started = std::time::Instant::now();
    let mut n = 0u64;
    store::walk(&dir, |path: PathBuf| {
        let Some(c) = cache.upgrade() else { return };
        let Some(p) = Layout::primary_of(&path) else { return };
        if c.lock_index().has(&p, &path) {
            return;
        }
        if let Some(meta) = store::load(&path) {
            c.lock_index().insert(p, Arc::new(meta));
            n += 1;
        }
    });
    if let Some(c) = cache.upgrade() {
        c.rebuilt.store(true, Relaxed);
        tracing::info!("cache {}: index rebuilt, {n} entries read in {:?}", dir.display(), started.elapsed());
        c.wake_evictor();
    }
}

/// Evicts whenever woken (and every few seconds); ends when the cache is dropped.
fn evict_loop(cache: Weak<Cache>) {
    loop {
        let Some(c) = cache.upgrade() else { return };
        {
            let (flag, cv) = &c.evict;
            let guard = flag.lock().unwrap_or_else(|e| e.into_inner());
            let (mut guard, _) = cv
                .wait_timeout_while(guard, Duration::from_secs(5), |woken| !*woken)
                .unwrap_or_else(|e| e.into_inner());
            *guard = false;
        }
        if c.lock_index().bytes > c.config.max_size || c.short_of.load(Relaxed) > 0 || c.free_deficit() > 0 {
            let n = c.evict_now();
            tracing::debug!("cache {}: {n} entries evicted", c.config.dir.display());
        }
    }
}

#[cfg(test)]
mod tests;
