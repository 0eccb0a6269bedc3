//! Per-upstream state every worker shares: whether the operator drained the
//! upstream (the admin listener's `POST /upstreams/drain`), and how many pooled
//! connections the workers hold to it, in use and idle. One entry per upstream URL
//! for the life of the process, made when a configuration naming it is read, so a
//! reload keeps the drain of an upstream it still has.
//!
//! The request path reads the drain flag with one relaxed load per candidate and
//! adds to the connection counts with relaxed atomic adds; nothing here locks but
//! the making of an entry. Not the per-worker pool and balancing ([`super::pool`]),
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
}

impl Shared {
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
}
