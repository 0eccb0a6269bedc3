//! The server: validated configuration in, listening workers out, and an orderly
//! stop on SIGTERM/SIGINT.
//!
//! Like nginx, a fixed set of workers (one per CPU by default) each runs its own
//! single-threaded event loop over its own `SO_REUSEPORT` listeners; nothing is
//! handed between threads on the data path.

mod listener;
pub mod stats;
mod worker;

use std::fs::File;
use std::sync::Arc;

use anyhow::{anyhow, Context};
use rustls::ServerConfig;

use crate::config::{AccessLog, Config, KtlsMode};
use crate::files::{self, Root};
use crate::tls::config::{server_config, Identity};
use stats::Stats;

/// What every worker reads and nobody writes.
pub struct Shared {
    pub config: Config,
    pub root: Root,
    pub file_options: files::Options,
    pub tls: Arc<ServerConfig>,
    /// The kernel's kTLS abilities, when kTLS is to be used.
    pub ktls: Option<crate::tls::kernel::Support>,
}

/// Starts the server and blocks until it has stopped.
pub fn run(config: Config) -> anyhow::Result<()> {
    let identity = Identity::load(&config)?;
    let fingerprint = identity.fingerprint();
    let generated = identity.generated;
    let tls = server_config(&config, identity)?;
    let root = Root::new(&config.root).with_context(|| format!("cannot open root {}", config.root.display()))?;
    let ktls = choose_ktls(&config)?;
    check_tcp_options(&config)?;

    let access_out: Option<File> = match &config.access_log {
        AccessLog::Off => None,
        AccessLog::Stdout => Some(dup_stdout()?),
        AccessLog::File(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("cannot open access log {}", p.display()))?,
        ),
    };

    let fds = FdBudget::raise();
    let cache_entries = fds.cache_entries_per_worker(config.workers);
    tracing::info!("{}; open-file cache up to {cache_entries} per worker", fds.describe());

    let (listeners, bound) = listener::bind_all(&config.listen, config.workers).map_err(|e| anyhow!(e))?;
    let workers = config.workers;
    let shared = Arc::new(Shared {
        file_options: files::Options { dotfiles: config.dotfiles, autoindex: config.autoindex, cache_entries },
        config,
        root,
        tls,
        ktls,
    });

    let signals = Signals::install()?;
    for addr in &bound {
        tracing::info!("listening on https://{addr}");
    }
    let cert_note = if generated { "self-signed, generated at start-up" } else { "loaded" };
    tracing::info!(
        "serving {} with {} worker{}, certificate ({cert_note}) SHA-256 fingerprint {fingerprint}, record size {}",
        shared.config.root.display(),
        workers,
        if workers == 1 { "" } else { "s" },
        shared.config.record_policy,
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut handles = Vec::new();
    for (id, ls) in listeners.into_iter().enumerate() {
        let out = match &access_out {
            Some(f) => Some(f.try_clone().context("cannot duplicate the access log descriptor")?),
            None => None,
        };
        handles.push(worker::spawn(id, ls, shared.clone(), stop_rx.clone(), out)?);
    }

    signals.wait()?;
    tracing::info!("stopping: no new connections; in-flight responses get {:?}", shared.config.timeouts.shutdown);
    let _ = stop_tx.send(true);

    let total = Stats::default();
    for h in handles {
        match h.join() {
            Ok(s) => total.add(&s),
            Err(_) => tracing::error!("a worker panicked"),
        }
    }
    tracing::info!("stopped: {total}");
    Ok(())
}

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

/// Largest open-file cache per worker, however large the budget.
const MAX_CACHE_ENTRIES: u64 = 1024;

impl FdBudget {
    /// The limits as they are, without changing anything.
    pub fn read() -> std::io::Result<FdBudget> {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes one rlimit into `r`, which we own.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(FdBudget { before: r.rlim_cur, hard: r.rlim_max, limit: r.rlim_cur })
    }

    /// The soft limit the server raises itself to: the hard limit, or the kernel's
    /// per-process ceiling (`fs.nr_open`) when the hard limit is unlimited.
    pub fn target(&self) -> u64 {
        if self.hard == libc::RLIM_INFINITY {
            std::fs::read_to_string("/proc/sys/fs/nr_open")
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(1 << 20)
        } else {
            self.hard
        }
    }

    /// Raises the soft limit to [`FdBudget::target`], as nginx's `worker_rlimit_nofile`
    /// does: a busy server needs a descriptor per connection and per cached file,
    /// and the common default soft limit of 1024 is soon spent. On failure the
    /// budget stays what it was, with a warning.
    pub fn raise() -> FdBudget {
        let mut b = match FdBudget::read() {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!("cannot read the file descriptor limit (RLIMIT_NOFILE): {e}; assuming 1024");
                return FdBudget { before: 1024, hard: 1024, limit: 1024 };
            }
        };
        let target = b.target();
        if target > b.before {
            let r = libc::rlimit { rlim_cur: target, rlim_max: b.hard };
            // SAFETY: setrlimit reads one fully initialised rlimit.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } == 0 {
                b.limit = target;
            } else {
                let e = std::io::Error::last_os_error();
                tracing::warn!("cannot raise the file descriptor limit from {} to {target}: {e}", b.before);
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

fn choose_ktls(config: &Config) -> anyhow::Result<Option<crate::tls::kernel::Support>> {
    if config.ktls == KtlsMode::Off {
        tracing::info!("kernel TLS: off (--ktls off); records are protected in user space");
        return Ok(None);
    }
    let caps = crate::tls::kernel::Support::probe();
    if !caps.usable() {
        let why = caps.unavailable_reason().unwrap_or_else(|| "the kernel refused the tls ULP".into());
        if config.ktls == KtlsMode::On {
            return Err(anyhow!("kernel TLS unavailable: {why} (see `ktlsd doctor`; or start with --ktls auto)"));
        }
        tracing::info!("kernel TLS: unavailable ({why}); records are protected in user space");
        return Ok(None);
    }
    tracing::info!("kernel TLS: {}", caps.summary());
    Ok(Some(caps))
}

fn check_tcp_options(config: &Config) -> anyhow::Result<()> {
    if let Some(cc) = &config.tcp.congestion {
        let available = kernel_tls::available_congestion_control().unwrap_or_default();
        if !available.iter().any(|a| a == cc) {
            return Err(anyhow!(
                "tcp_congestion {cc:?} is not offered by this kernel (available: {}); try `modprobe tcp_{cc}`",
                available.join(" ")
            ));
        }
    }
    Ok(())
}

fn dup_stdout() -> anyhow::Result<File> {
    use std::os::fd::AsFd;
    let owned = std::io::stdout().as_fd().try_clone_to_owned().context("cannot duplicate standard output")?;
    Ok(File::from(owned))
}

/// SIGTERM and SIGINT, caught from before the first connection is accepted.
struct Signals {
    rt: tokio::runtime::Runtime,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (term, int) = rt.block_on(async {
            Ok::<_, std::io::Error>((signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?))
        })?;
        Ok(Signals { rt, term, int })
    }

    /// Blocks until one of the signals arrives.
    fn wait(mut self) -> anyhow::Result<()> {
        self.rt.block_on(async {
            tokio::select! {
                _ = self.term.recv() => {}
                _ = self.int.recv() => {}
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::FdBudget;

    #[test]
    fn cache_share_of_the_fd_budget() {
        let b = |limit| FdBudget { before: limit, hard: limit, limit };
        assert_eq!(b(256).cache_entries_per_worker(1), 64);
        assert_eq!(b(1024).cache_entries_per_worker(2), 128);
        assert_eq!(b(1 << 20).cache_entries_per_worker(2), 1024);
        assert_eq!(b(7).cache_entries_per_worker(4), 0);
        assert_eq!(b(100).cache_entries_per_worker(0), 25);
    }
}
