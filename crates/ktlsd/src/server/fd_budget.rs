//! The process's file-descriptor budget (`RLIMIT_NOFILE`): raised once at
//! start-up, then shared out among the workers, each of which counts what it holds
//! against its share ([`crate::fds`]), and sized into each worker's open-file cache
//! and its default connection cap. Not the ledger, the cache or the connection cap
//! themselves (see `fds`, `files` and `worker`): only the arithmetic that sizes them.

use crate::sys;

/// The process's file-descriptor budget: `RLIMIT_NOFILE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdBudget {
    /// The soft limit found at start.
    pub before: u64,
    /// The hard limit.
    pub hard: u64,
    /// The soft limit in force now: the budget.
    pub limit: u64,
}

/// Descriptors kept for listeners, logs, the admin socket and files opened for a response.
const FD_RESERVE: u64 = 64;

/// Largest open-file cache per worker, however large the budget.
const MAX_CACHE_ENTRIES: u64 = 1024;

impl FdBudget {
    /// The limits as they are, without changing anything.
    pub fn read() -> FdBudget {
        let (soft, hard) = sys::nofile_limit();
        FdBudget { before: soft, hard, limit: soft }
    }

    /// The soft limit the server raises itself to: the hard limit, or the kernel's
    /// per-process ceiling (`fs.nr_open`) when the hard limit is unlimited.
    pub fn target(&self) -> u64 {
        if self.hard == libc::RLIM_INFINITY {
            std::fs::read_to_string("/proc/sys/fs/nr_open").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(1 << 20)
        } else {
            self.hard
        }
    }

    /// Raises the soft limit to [`FdBudget::target`], as nginx's `worker_rlimit_nofile`
    /// does: a busy server needs a descriptor per connection and per cached file,
    /// and the common default soft limit of 1024 is soon spent. On failure the
    /// budget stays what it was, with a warning.
    pub fn raise() -> FdBudget {
        let mut b = FdBudget::read();
        let target = b.target();
        if target > b.before {
            if let Err(e) = sys::set_nofile_limit(target, b.hard) {
                tracing::warn!("cannot raise the file descriptor limit from {} to {target}: {e}", b.before);
            } else {
                b.limit = target;
            }
        }
        b
    }

    /// Each worker's open-file cache: a quarter of the budget shared among the
    /// workers, so most descriptors stay for connections; at most 1024.
    pub fn cache_entries_per_worker(&self, workers: usize) -> usize {
        let share = self.limit / 4 / (workers.max(1) as u64);
        share.min(MAX_CACHE_ENTRIES) as usize
    }

    /// Each worker's descriptor budget ([`crate::fds`]): the limit less a few for
    /// listeners, logs and files being sent, shared among the workers. Client
    /// connections, upstream connections, held cache entry files and open-file cache
    /// entries all count in it.
    pub fn per_worker(&self, workers: usize) -> usize {
        (self.limit.saturating_sub(FD_RESERVE) / workers.max(1) as u64).max(1) as usize
    }

    /// The default connection cap per worker: half its descriptor budget, so that
    /// each client connection can have one more descriptor at once, an upstream
    /// connection or a file being sent (nginx's `worker_connections` counts
    /// upstream connections the same way, and its guidance is a descriptor limit of
    /// twice that). What the connections leave, the worker's caches hold, and give
    /// back when the connections need it.
    pub fn connections_per_worker(&self, workers: usize) -> usize {
        (self.per_worker(workers) / 2).max(1)
    }

    /// One line for the start-up log.
    pub fn describe(&self) -> String {
        if self.limit > self.before {
            format!("file descriptors: limit {} (soft limit raised from {} to the hard limit)", self.limit, self.before)
        } else if self.limit < self.hard {
            format!("file descriptors: limit {} (hard limit {}; raising failed)", self.limit, self.hard)
        } else {
            format!("file descriptors: limit {} (the hard limit)", self.limit)
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_share_of_the_fd_budget() {
        let b = |limit| FdBudget { before: limit, hard: limit, limit };
        assert_eq!(b(256).cache_entries_per_worker(1), 64);
        assert_eq!(b(1024).cache_entries_per_worker(2), 128);
        assert_eq!(b(1 << 20).cache_entries_per_worker(2), 1024);
        assert_eq!(b(7).cache_entries_per_worker(4), 0);
        assert_eq!(b(100).cache_entries_per_worker(0), 25);
    }

    #[test]
    fn worker_and_connection_shares_of_the_fd_budget() {
        let b = |limit| FdBudget { before: limit, hard: limit, limit };
        // (limit, workers, budget per worker, connections per worker)
        let cases = [
            (20_000, 2, 9968, 4984),
            (1024, 1, 960, 480),
            (1024, 0, 960, 480),
            (256, 1, 192, 96),
            (100, 2, 18, 9),
            (60, 2, 1, 1),
            (1 << 20, 4, 262_128, 131_064),
        ];
        for (limit, workers, budget, connections) in cases {
            let got = (b(limit).per_worker(workers), b(limit).connections_per_worker(workers));
            assert_eq!(got, (budget, connections), "{limit} fds, {workers} workers");
        }
    }
}
