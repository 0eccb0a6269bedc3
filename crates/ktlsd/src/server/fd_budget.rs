//! The process's file-descriptor budget (`RLIMIT_NOFILE`): raised once at
//! start-up, then shared out between each worker's open-file cache and its
//! connections. Not the cache or the connection cap themselves (see `files` and
//! `worker`): only the arithmetic that sizes them.

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

    /// The default connection cap per worker: the budget less each worker's
    /// open-file cache and a few for listeners, logs and files being opened,
    /// shared among the workers (a connection takes one descriptor).
    pub fn connections_per_worker(&self, workers: usize, cache_entries_per_worker: usize) -> usize {
        let workers = workers.max(1) as u64;
        let reserved = workers * cache_entries_per_worker as u64 + FD_RESERVE;
        (self.limit.saturating_sub(reserved) / workers).max(1) as usize
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
    fn connection_share_of_the_fd_budget() {
        let b = |limit| FdBudget { before: limit, hard: limit, limit };
        // (limit, workers, cache per worker, connections per worker)
        let cases = [
            (20_000, 2, 1024, 8944),
            (1024, 1, 256, 704),
            (1024, 0, 256, 704),
            (100, 2, 64, 1),
            (1 << 20, 4, 1024, 261_104),
        ];
        for (limit, workers, cache, want) in cases {
            assert_eq!(
                b(limit).connections_per_worker(workers, cache),
                want,
                "{limit} fds, {workers} workers, {cache} cached"
            );
        }
    }
}
