//! Per-worker counters and histograms. Each worker owns its own and is their
//! only writer: an update is a relaxed load and store on the worker's own
//! memory, no lock and no read-modify-write shared with another thread. The
//! admin listener reads them, summed over the workers, when scraped; they are
//! summed once more at exit. A leaf: any layer may add to them, and it knows
//! nothing of who does. [`prometheus`] renders them, [`advisor`] reads them;
//! neither serves them (see `server::admin`).

pub mod advisor;
pub mod prometheus;
pub mod sites;
mod traffic;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub use traffic::{Histogram, TcpEnd, Traffic, INITIAL_WINDOW_BYTES, TIME_BOUNDS_US};

/// A counter with one writer (its worker) and any number of readers.
pub type Counter = AtomicU64;

/// Basic-auth attempts with wrong or malformed credentials (all workers add to it).
pub static AUTH_FAILURES: AtomicU64 = AtomicU64::new(0);
/// Requests refused with 429 for too many failed basic-auth attempts (all workers add to it).
pub static AUTH_RATE_LIMITED: AtomicU64 = AtomicU64::new(0);

/// The fleet's store, as the cluster thread finds it (`[cluster]`).
pub struct ClusterGauges {
    /// Whether the member belongs to a fleet; the others mean nothing otherwise.
    pub enabled: std::sync::atomic::AtomicBool,
    pub store_up: std::sync::atomic::AtomicBool,
    /// Session-ticket keys in use from the store.
    pub ticket_keys: AtomicU64,
    /// Rotations of the shared session-ticket key this member made.
    pub ticket_rotations: AtomicU64,
}

pub static CLUSTER: ClusterGauges = ClusterGauges {
    enabled: std::sync::atomic::AtomicBool::new(false),
    store_up: std::sync::atomic::AtomicBool::new(false),
    ticket_keys: AtomicU64::new(0),
    ticket_rotations: AtomicU64::new(0),
};

macro_rules! counters {
    ($($name:ident: $doc:literal),* $(,)?) => {
        /// Counters of one worker (or, summed, of the server).
        #[derive(Debug, Default)]
        pub struct Stats { $(#[doc = $doc] pub $name: Counter,)* }

        impl Stats {
            /// Every counter by name, in declaration order.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.load(Relaxed)),)*]
            }

            pub fn add(&self, other: &Stats) {
                $(Stats::add_to(&self.$name, other.$name.load(Relaxed));)*
            }
        }

        impl fmt::Display for Stats {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut first = true;
                $(
                    if !first { f.write_str(" ")?; }
                    first = false;
                    write!(f, "{}={}", stringify!($name), self.$name.load(Relaxed))?;
                )*
                let _ = first;
                Ok(())
            }
        }
    };
}

counters! {
    connections: "Accepted connections.",
    handshake_failures: "Handshakes that failed, for any of the reasons below.",
    handshake_timeouts: "Handshakes that took longer than handshake_timeout.",
    handshake_protocol_errors: "Handshakes refused for a TLS protocol error (an alert was sent when rustls had one).",
    handshake_client_alerts: "Handshakes the client ended with a fatal alert.",
    handshake_resets: "Handshakes cut by the client closing or resetting the connection, or by a socket error.",
    handshake_plain_http: "Connections that sent plain HTTP to the TLS port (answered 400).",
    ktls: "Connections whose record layer ran in the kernel.",
    userspace: "Connections whose record layer ran in user space.",
    ktls_install_failures: "Connections lost because the kernel refused the keys.",
    ktls_record_errors: "kTLS connections closed on a record the kernel rejected (EBADMSG, EMSGSIZE, EINVAL).",
    rekey_unsupported: "TLS 1.3 KeyUpdates the kernel could not install (connection closed).",
    key_updates: "TLS 1.3 KeyUpdates installed in the kernel.",
    timeouts: "Connections closed on an idle, header or send timeout.",
    errors: "Connections cut by socket or TLS errors after the handshake.",
    panics: "Connection tasks that panicked (a bug; each is logged with its peer).",
    connections_refused: "Connections closed at once because the worker held max_connections.",
    connections_refused_per_ip: "Connections closed at once because their client address held max_connections_per_ip.",
    open_file_cache_hits: "Requests whose file was found in the open-file cache.",
    open_file_cache_misses: "Requests whose path was looked up in the file system.",
    open_file_cache_entries: "Descriptors held by the open-file cache now (a gauge).",
    open_file_cache_content_hits: "Open-file cache hits whose small file's bytes were kept in memory (not read again).",
    cold_windows: "File windows (up to 1 MiB) found out of the page cache and read ahead off the event loop.",
    readahead_waits: "Cold windows that waited for a free reader of the bounded readahead pool.",
    compressed_hits: "Answers sent from a body stored compressed on the fly (no compression).",
    compressed_made: "Compressions of a file into the compressed-body store started.",
}

impl Stats {
    /// Adds one. Only the counter's own worker may call it (one writer: a load
    /// then a store loses nothing).
    pub fn bump(c: &Counter) {
        Stats::add_to(c, 1);
    }

    /// Adds `n`; the same single-writer rule as [`Stats::bump`].
    pub fn add_to(c: &Counter, n: u64) {
        c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
    }

    /// Subtracts one from a gauge; the same single-writer rule as [`Stats::bump`].
    pub fn drop_one(c: &Counter) {
        c.store(c.load(Relaxed).saturating_sub(1), Relaxed);
    }

    /// Sets a counter kept elsewhere by the same worker (a copy, published); the
    /// same single-writer rule as [`Stats::bump`].
    pub fn set(c: &Counter, v: u64) {
        c.store(v, Relaxed);
    }

    /// The current value.
    pub fn get(c: &Counter) -> u64 {
        c.load(Relaxed)
    }
}

/// The slot of `counts` (a histogram's counts per bucket) in which a share `q` of
/// them falls: the first whose running sum reaches `q` of the total. `None` when
/// the histogram is empty.
pub fn bucket_quantile(counts: &[u64], q: f64) -> Option<usize> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let want = ((q * total as f64).ceil() as u64).max(1);
    let mut seen = 0;
    counts.iter().position(|c| {
        seen += c;
        seen >= want
    })
}

/// Counts a connection in a gauge (`traffic.idle`) while it lives: its worker's own,
/// so created and dropped on that worker's thread only.
pub struct Gauged<'a>(Option<&'a Counter>);

impl<'a> Gauged<'a> {
    pub fn new(c: Option<&'a Counter>) -> Gauged<'a> {
        if let Some(c) = c {
            Stats::bump(c);
        }
        Gauged(c)
    }
}

impl Drop for Gauged<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.0 {
            Stats::drop_one(c);
        }
    }
}

/// One worker's figures: its counters and its traffic metrics, shared with the
/// admin listener (which only reads them).
#[derive(Debug, Default)]
pub struct Metrics {
    pub stats: Stats,
    pub traffic: Traffic,
    /// Requests and bytes by site.
    pub sites: sites::SiteCounters,
    /// Connections by negotiated TLS version and cipher suite.
    pub negotiated: Negotiated,
}

/// Connections by negotiated TLS version and by cipher suite (rustls' names, which
/// are fixed words: the label sets are bounded by what rustls offers). A small map
/// behind a mutex only its worker locks, once per handshake, except for a scrape.
#[derive(Debug, Default)]
pub struct Negotiated {
    by: std::sync::Mutex<std::collections::BTreeMap<(&'static str, &'static str), u64>>,
}

impl Negotiated {
    /// One connection that negotiated `version` and `suite`.
    pub fn count(&self, version: &'static str, suite: &'static str) {
        *self.by.lock().unwrap_or_else(std::sync::PoisonError::into_inner).entry((version, suite)).or_default() += 1;
    }

    /// Each (version, suite) pair's connections.
    pub fn snapshot(&self) -> std::collections::BTreeMap<(&'static str, &'static str), u64> {
        self.by.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn add(&self, other: &Negotiated) {
        let theirs = other.snapshot();
        let mut mine = self.by.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (k, n) in theirs {
            *mine.entry(k).or_default() += n;
        }
    }
}

impl Metrics {
    /// Adds `other`'s figures to these (sums over workers; only for a fresh
    /// `Metrics` owned by the caller, or at exit).
    pub fn add(&self, other: &Metrics) {
        self.stats.add(&other.stats);
        self.traffic.add(&other.traffic);
        self.sites.add(&other.sites);
        self.negotiated.add(&other.negotiated);
    }

    /// The sum over `workers`.
    pub fn sum<'a>(workers: impl IntoIterator<Item = &'a Metrics>) -> Metrics {
        let total = Metrics::default();
        for w in workers {
            total.add(w);
        }
        total
    }
}
