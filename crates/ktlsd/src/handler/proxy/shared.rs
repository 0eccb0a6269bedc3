//! Per-upstream state every worker shares: whether the operator drained the
//! upstream (the admin listener's `POST /upstreams/drain`), and how many pooled
//! connections the workers hold to it, in use and idle; whether active health
//! checks hold it down ([`super::health`]). One entry per upstream URL
//! for the life of the process, made when a configuration naming it is read, so a
//! reload keeps the drain of an upstream it still has.
//!
//! The request path reads the drain and check flags with relaxed loads per
//! candidate and adds to the connection counts with relaxed atomic adds; nothing it
//! does locks but the making of an entry (a checker's result and the status page
//! take the entry's own lock). Not the per-worker pool and balancing ([`super::pool`]),
//! nor the figures of exchanges ([`super::metrics`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// What the workers share of one upstream.
#[derive(Debug, Default)]
pub struct Shared {
    drained: AtomicBool,
    /// Connections in use by an exchange, over every worker.
    in_use: AtomicU64,
    /// Idle keep-alive connections, over every worker.
    idle: AtomicU64,
    /// Active health checks marked it down ([`super::health`]).
    check_down: AtomicBool,
    /// How many times the checks brought it back up: a worker's passive mark from
    /// before the latest is forgotten.
    revivals: AtomicU64,
    /// The active checks' last result, and which checker may write it.
    check: Mutex<Check>,
}

/// The active checks' state of one upstream, for the status page.
#[derive(Debug, Default, Clone)]
struct Check {
    /// The running checker's generation (0: none runs).
    generation: u64,
    /// The last check: when, whether it passed, what it found.
    last: Option<(std::time::SystemTime, bool, String)>,
}

/// What the status page shows of an upstream's active checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckView {
    pub down: bool,
    /// The last check: seconds since the epoch, whether it passed, what it found.
    pub last: Option<(u64, bool, String)>,
}

/// Generations of checkers, over every upstream.
static GENERATIONS: AtomicU64 = AtomicU64::new(0);

impl Shared {
    /// Whether active health checks hold it down.
    pub fn check_down(&self) -> bool {
        self.check_down.load(Relaxed)
    }

    /// How many times the checks brought it back up.
    pub fn revivals(&self) -> u64 {
        self.revivals.load(Relaxed)
    }

    fn check_lock(&self) -> std::sync::MutexGuard<'_, Check> {
        self.check.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A checker starts: its generation, under which it writes results. It starts up.
    pub(super) fn check_start(&self) -> u64 {
        let generation = GENERATIONS.fetch_add(1, Relaxed) + 1;
        let mut c = self.check_lock();
        *c = Check { generation, last: None };
        self.set_check_down(false);
        generation
    }

    /// The checker of `generation` stopped: the upstream is no longer held down.
    pub(super) fn check_stop(&self, generation: u64) {
        let mut c = self.check_lock();
        if c.generation == generation {
            *c = Check::default();
            self.set_check_down(false);
        }
    }

    /// A check of the checker of `generation` ended (`passed`), and the upstream is
    /// now `up`; `false` when that checker was stopped (nothing written).
    pub(super) fn check_result(&self, generation: u64, passed: bool, up: bool, detail: &str) -> bool {
        let mut c = self.check_lock();
        if c.generation != generation {
            return false;
        }
        c.last = Some((std::time::SystemTime::now(), passed, detail.to_string()));
        self.set_check_down(!up);
        true
    }

    fn set_check_down(&self, down: bool) {
        if self.check_down.swap(down, Relaxed) && !down {
            self.revivals.fetch_add(1, Relaxed);
        }
    }

    /// The active checks' state; `None` when none runs.
    pub fn check_view(&self) -> Option<CheckView> {
        let c = self.check_lock();
        if c.generation == 0 {
            return None;
        }
        let last = c.last.as_ref().map(|(at, passed, detail)| {
            let secs = at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            (secs, *passed, detail.clone())
        });
        Some(CheckView { down: self.check_down(), last })
    }

    /// Whether new requests are kept away from it.
    pub fn drained(&self) -> bool {
        self.drained.load(Relaxed)
    }

    /// Drains it (`true`) or takes it back (`false`); says whether that changed anything.
    pub fn set_drained(&self, on: bool) -> bool {
        self.drained.swap(on, Relaxed) != on
    }

    /// Pooled connections: (in use, idle), over every worker.
    pub fn connections(&self) -> (u64, u64) {
        (self.in_use.load(Relaxed), self.idle.load(Relaxed))
    }

    pub(super) fn in_use_add(&self, n: i64) {
        add(&self.in_use, n);
    }

    pub(super) fn idle_add(&self, n: i64) {
        add(&self.idle, n);
    }
}

fn add(c: &AtomicU64, n: i64) {
    if n >= 0 {
        c.fetch_add(n.unsigned_abs(), Relaxed);
    } else {
        // Never below zero, whatever the order of two workers' updates.
        let _ = c.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(n.unsigned_abs())));
    }
}

/// The entries by upstream URL.
static ALL: Mutex<BTreeMap<String, Arc<Shared>>> = Mutex::new(BTreeMap::new());

/// The entry of upstream `url` (as configured, without a trailing slash), made on first use.
pub fn of(url: &str) -> Arc<Shared> {
    let mut all = ALL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(s) = all.get(url) {
        return s.clone();
    }
    all.entry(url.to_string()).or_default().clone()
}

/// A handle on an upstream's [`Shared`] entry, held by its configuration: two
/// configurations that differ only in it are the same.
#[derive(Clone, Default)]
pub struct Handle(pub Arc<Shared>);

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Handle(drained: {})", self.0.drained())
    }
}

impl PartialEq for Handle {
    fn eq(&self, _: &Handle) -> bool {
        true
    }
}

impl Eq for Handle {}

impl std::ops::Deref for Handle {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_entry_per_url_and_counts_stay_non_negative() {
        let (a, b) = (of("http://shared.test:1"), of("http://shared.test:1"));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(a.set_drained(true));
        assert!(!b.set_drained(true), "already drained");
        assert!(b.drained());
        assert!(a.set_drained(false));
        a.idle_add(2);
        a.idle_add(-3);
        a.in_use_add(1);
        assert_eq!(b.connections(), (1, 0));
    }

    #[test]
    fn only_the_running_checker_writes() {
        let s = of("http://shared.test:2");
        assert_eq!(s.check_view(), None);
        let old = s.check_start();
        assert!(s.check_result(old, false, false, "connect: refused"));
        assert!(s.check_down());
        let revivals = s.revivals();
        let new = s.check_start();
        assert!(!s.check_down(), "a new checker starts up");
        assert_eq!(s.revivals(), revivals + 1);
        assert!(!s.check_result(old, false, false, "late"), "the old checker is stopped");
        assert!(!s.check_down());
        s.check_stop(old);
        assert!(s.check_view().is_some(), "stopping the old one leaves the new one");
        assert!(s.check_result(new, false, false, "status 500"));
        assert_eq!(s.check_view().map(|v| v.down), Some(true));
        s.check_stop(new);
        assert!(!s.check_down());
        assert_eq!(s.check_view(), None);
    }
}
