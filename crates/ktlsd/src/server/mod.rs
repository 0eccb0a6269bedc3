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

    let (listeners, bound) = listener::bind_all(&config.listen, config.workers).map_err(|e| anyhow!(e))?;
    let workers = config.workers;
    let shared = Arc::new(Shared {
        file_options: files::Options { dotfiles: config.dotfiles, autoindex: config.autoindex },
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
