//! The server: validated configuration in, listening workers out; reload on
//! SIGHUP, access-log reopening on SIGUSR1, and an orderly stop on SIGTERM/SIGINT.
//!
//! Like nginx, a fixed set of workers (one per CPU by default) each runs its own
//! single-threaded event loop over its own `SO_REUSEPORT` listeners; nothing is
//! handed between threads on the data path.

mod acme;
pub(crate) mod admin;
pub(crate) mod congestion;
mod listener;
mod plain;
mod privileges;
mod systemd;
mod worker;

use std::fs::File;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context};
use rustls::ServerConfig;

use tokio::signal::unix::Signal;

use crate::acme::{Challenge, Challenges};
use crate::cli::ServeArgs;
use crate::config::{AccessLogTarget, Config, KtlsMode, SiteCert};
use crate::files::{self, Root};
use crate::handler::sites::NamedSite;
use crate::handler::{Site, Sites};
use crate::stats::Stats;
use crate::tls::config::{server_config, Identity, TlsSettings};
use crate::tls::sni::SiteKey;
use crate::vocab::RecordLayer;
use acme::AcmeSites;

/// What every worker reads and nobody writes. A reload builds a new one; each
/// connection holds the `Arc` it started with, so in-flight connections finish
/// on the configuration they began with.
pub struct Shared {
    pub config: Config,
    pub root: Root,
    pub file_options: files::Options,
    pub tls: Arc<ServerConfig>,
    /// The kernel's kTLS abilities, when kTLS is to be used.
    pub ktls: Option<Arc<crate::tls::kernel::Support>>,
    /// The `[[site]]`s, opened; the fields above serve as the default site.
    pub sites: Vec<NamedSite>,
    /// ACME http-01 answers the port-80 listener serves (the same across reloads).
    pub challenges: Arc<Challenges>,
}

impl Shared {
    /// The sites a connection chooses from, by Host, for each request.
    pub fn sites(&self) -> Sites<'_> {
        let default = Site {
            root: &self.root,
            files: self.file_options,
            hsts: self.config.hsts.as_deref(),
            content: &self.config.content,
        };
        Sites { named: &self.sites, default, unknown: self.config.unknown_sni }
    }
}

/// What the workers serve with now: sent to every worker on reload and on
/// access-log reopening.
#[derive(Clone)]
pub struct Current {
    pub shared: Arc<Shared>,
    /// Where access-log lines go; `None` when logging is off.
    pub log: Option<Arc<File>>,
}

/// Starts the server and blocks until it has stopped.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = Config::from_args(args.clone())?;
    let plan = privileges::plan(&config)?;
    // Caught before anything else so that no signal sent during start-up kills the server.
    let mut signals = Signals::install()?;
    let fds = FdBudget::raise();
    let cache_entries = fds.cache_entries_per_worker(config.workers);
    let connections = match config.max_connections {
        Some(n) => format!("{n} per worker (--max-connections)"),
        None => format!("{} per worker", fds.connections_per_worker(config.workers, cache_entries)),
    };
    tracing::info!(
        "{}; open-file cache up to {cache_entries} per worker; connections up to {connections}",
        fds.describe()
    );
    let acme = AcmeSites::new()?;
    let mut prepared = prepare(config, None, cache_entries, Some(&acme))?;
    let access_out = open_access_log(&prepared.shared.config.access_log)?;
    let config = &prepared.shared.config;

    let passed = systemd::listen_fds().map_err(|e| anyhow!(e))?;
    let activated = passed.is_some();
    let (listeners, bound) = match passed {
        Some(sockets) => {
            tracing::info!(
                "socket activation: using the {} socket(s) passed by the service manager; listen ({}) is ignored",
                sockets.len(),
                join(&config.listen)
            );
            listener::share(sockets, config.workers)
        }
        None => listener::bind_all(&config.listen, config.workers),
    }
    .map_err(|e| anyhow!(e))?;
    let (http_listeners, http_bound) = match config.http_listen.is_empty() {
        true => (Vec::new(), Vec::new()),
        false => listener::bind_all(&config.http_listen, 1).map_err(|e| anyhow!(e))?,
    };
    let admin_bound = match &config.admin {
        Some(a) => Some(admin::bind(a)?),
        None => None,
    };
    if activated {
        prepared.shared.config.listen = bound.clone();
    }
    // Everything that needs root (ports, keys, ROOT, the access log) is open: drop it.
    let user = match &plan {
        privileges::Plan::Drop(account) => {
            privileges::drop_to(account)?;
            tracing::info!("running as user {} (uid {}, gid {})", account.user, account.uid, account.gid);
            Some(account.user.clone())
        }
        privileges::Plan::Stay { warn: true } => {
            tracing::warn!("running as root (--allow-root): any file root can read under ROOT can be served");
            None
        }
        privileges::Plan::Stay { warn: false } => None,
    };
    let started = Started { activated, user };
    let workers = prepared.shared.config.workers;
    let shared = Arc::new(prepared.shared);

    for addr in &bound {
        tracing::info!("listening on https://{addr}");
    }
    for addr in &http_bound {
        tracing::info!("listening on http://{addr} (redirects to HTTPS; ACME HTTP-01 challenges)");
    }
    let cert_note = &prepared.origin;
    tracing::info!(
        "serving {} with {} worker{}, certificate ({cert_note}) SHA-256 fingerprint {}, record size {}",
        shared.config.root.display(),
        workers,
        if workers == 1 { "" } else { "s" },
        prepared.fingerprint,
        shared.config.record_policy,
    );
    // Before any worker runs, so it is the first line on stdout even when the
    // access log goes there too.
    let tls = if shared.ktls.is_some() { RecordLayer::Kernel } else { RecordLayer::Userspace };
    let started_at = std::time::Instant::now();
    announce_ready(&ready_line(&bound, &http_bound, std::process::id(), tls));

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (current_tx, current_rx) = tokio::sync::watch::channel(Current { shared, log: access_out });
    let mut handles = Vec::new();
    let mut metrics = Vec::new();
    for (id, ls) in listeners.into_iter().enumerate() {
        let m = Arc::new(crate::stats::Metrics::default());
        metrics.push(m.clone());
        handles.push(worker::spawn(id, ls, current_rx.clone(), stop_rx.clone(), m)?);
    }
    let admin = match admin_bound {
        Some(b) => {
            if let Some(a) = &current_rx.borrow().shared.config.admin {
                tracing::info!("admin listener on {a} (/metrics, /status, /advisor)");
            }
            let state = admin::State {
                workers: metrics,
                started: started_at,
                current: current_rx.clone(),
                https: bound.clone(),
                http: http_bound.clone(),
            };
            Some(admin::spawn(b, state, stop_rx.clone())?)
        }
        None => None,
    };
    // Redirects name the first HTTPS address's port, as bound (port 0 resolved).
    let target = plain::Target { https_port: bound[0].port() };
    let plain = match http_listeners.into_iter().next() {
        Some(ls) => Some(plain::spawn(ls, target, current_rx.clone(), stop_rx.clone())?),
        None => None,
    };
    systemd::notify("READY=1");
    // Listeners are up and privileges dropped: ACME may now order and be validated.
    acme.go();

    loop {
        match signals.next() {
            Event::Stop => break,
            Event::Reload => {
                systemd::notify(&systemd::reloading_message());
                reload(&args, &current_tx, &started, &acme);
                systemd::notify("READY=1");
            }
            Event::Reopen => reopen_access_log(&current_tx),
        }
    }
    let shutdown = current_tx.borrow().shared.config.timeouts.shutdown;
    tracing::info!("stopping: no new connections; in-flight responses get {shutdown:?}");
    systemd::notify("STOPPING=1");
    let _ = stop_tx.send(true);

    if admin.is_some_and(|a| a.join().is_err()) {
        tracing::error!("the admin listener panicked");
    }
    if plain.is_some_and(|p| p.join().is_err()) {
        tracing::error!("the plain-HTTP listener panicked");
    }
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

/// The machine-readable start-up line: the bound addresses (port 0 resolved), the
/// process id, and the record layer new connections get when their suite allows
/// (`ktls`) or always (`userspace`). One JSON object on one line, e.g.
/// `{"ready":{"https":["127.0.0.1:8443"],"http":[],"pid":123,"tls":"ktls"}}`.
fn ready_line(https: &[SocketAddr], http: &[SocketAddr], pid: u32, tls: RecordLayer) -> String {
    #[derive(serde::Serialize)]
    struct Line<'a> {
        ready: Ready<'a>,
    }
    #[derive(serde::Serialize)]
    struct Ready<'a> {
        https: &'a [SocketAddr],
        http: &'a [SocketAddr],
        pid: u32,
        tls: &'static str,
    }
    let line = Line { ready: Ready { https, http, pid, tls: tls.label() } };
    // Addresses, a number and a fixed word: serializing cannot fail.
    serde_json::to_string(&line).unwrap_or_default()
}

/// Writes the ready line to stdout and flushes it. A closed stdout only costs
/// the announcement: the server goes on.
fn announce_ready(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
        tracing::warn!("cannot write the ready line to standard output: {e}");
    }
}

/// `ktlsd check`: everything `serve` validates before it serves (configuration,
/// certificate and key, ROOT, kTLS mode, TCP options, access log, free ports),
/// without serving.
pub fn check(args: ServeArgs) -> anyhow::Result<()> {
    let config = Config::from_args(args)?;
    privileges::plan(&config)?;
    // `check` writes nothing: a missing self-signed certificate is not stored.
    let prepared = prepare(config, None, 0, None)?;
    let config = &prepared.shared.config;
    check_access_log(&config.access_log)?;
    for &addr in config.listen.iter().chain(&config.http_listen) {
        if let listener::PortState::HeldForActivation { pid, command } =
            listener::check_port(addr).map_err(|e| anyhow!(e))?
        {
            tracing::info!("{addr} is held by {command} (pid {pid}) for socket activation: serve started by it receives that socket");
        }
    }
    println!("configuration OK");
    Ok(())
}

/// A configuration turned into what workers serve with.
struct Prepared {
    shared: Shared,
    fingerprint: String,
    /// Where the certificate came from (loaded, self-signed and kept, ...).
    origin: String,
}

/// Loads the certificate and key, builds the TLS configuration, opens ROOT and
/// checks the kTLS mode and TCP options. `previous` lends its kTLS probe when
/// the kTLS mode is unchanged (a reload), so the kernel is probed once.
/// Without `acme` (`check`) nothing is written to the state directory and no ACME
/// task starts: ACME sites get a placeholder.
fn prepare(
    config: Config,
    previous: Option<&Shared>,
    cache_entries: usize,
    acme: Option<&AcmeSites>,
) -> anyhow::Result<Prepared> {
    let persist = acme.is_some();
    let settings = tls_settings(&config);
    let identity = Identity::load(&settings, persist)?;
    let fingerprint = identity.fingerprint();
    let origin = identity.origin.clone();
    if let Some(leaf) = identity.chain.first() {
        let name = config.cert.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
        if let Some(warning) = expiry_warning(&name, leaf.as_ref(), SystemTime::now()) {
            tracing::warn!("{warning}");
        }
    }
    let mut keys: Vec<Arc<SiteKey>> = Vec::new();
    let mut sites = Vec::new();
    let mut alpn01 = false;
    for site in &config.sites {
        let which = site.names.dns_names().join(", ");
        let key = match &site.cert {
            SiteCert::Files { cert, key } => {
                let id = Identity::site_files(cert, key)?;
                if let Some(warning) = id
                    .chain
                    .first()
                    .and_then(|leaf| expiry_warning(&cert.display().to_string(), leaf.as_ref(), SystemTime::now()))
                {
                    tracing::warn!("site {which}: {warning}");
                }
                Arc::new(SiteKey::new(site.names.clone(), id.certified_key(&which)?))
            }
            SiteCert::SelfSigned => {
                let id = Identity::site_self_signed(site.names.dns_names(), &settings, persist)?;
                tracing::warn!(
                    "site {which}: no cert and key; serving a self-signed certificate for its names ({})",
                    id.origin
                );
                Arc::new(SiteKey::new(site.names.clone(), id.certified_key(&which)?))
            }
            SiteCert::Acme(a) => {
                alpn01 |= a.challenge == Challenge::TlsAlpn01;
                match (acme, &config.state_dir) {
                    (Some(acme), Some(dir)) => {
                        acme.slot(&site.names, a, dir).with_context(|| format!("site {which}"))?
                    }
                    _ => Arc::new(SiteKey::new(site.names.clone(), acme::placeholder(&site.names)?)),
                }
            }
        };
        keys.push(key);
        let root =
            Root::new(&site.root).with_context(|| format!("site {which}: cannot open root {}", site.root.display()))?;
        let files = files::Options { dotfiles: site.dotfiles, autoindex: site.autoindex, cache_entries };
        sites.push(NamedSite {
            names: site.names.clone(),
            root,
            files,
            hsts: site.hsts.clone(),
            content: site.content.clone(),
        });
    }
    let challenges = acme.map_or_else(Challenges::new, |a| a.challenges.clone());
    let tls = server_config(&settings, identity, keys, config.unknown_sni, alpn01.then(|| challenges.clone()))?;
    let root = Root::new(&config.root).with_context(|| format!("cannot open root {}", config.root.display()))?;
    let ktls = match previous {
        Some(p) if p.config.ktls == config.ktls => p.ktls.clone(),
        _ => choose_ktls(&config)?.map(Arc::new),
    };
    check_tcp_options(&config)?;
    let shared = Shared {
        file_options: files::Options { dotfiles: config.dotfiles, autoindex: config.autoindex, cache_entries },
        config,
        root,
        tls,
        ktls,
        sites,
        challenges,
    };
    Ok(Prepared { shared, fingerprint, origin })
}

/// The TLS layer's share of the configuration.
fn tls_settings(config: &Config) -> TlsSettings {
    TlsSettings {
        cert: config.cert.clone(),
        key: config.key.clone(),
        versions: config.tls_versions.clone(),
        cipher_suites: config.cipher_suites.clone(),
        state_dir: config.state_dir.clone(),
        ephemeral_cert: config.ephemeral_cert,
        ticket_keys: config.ticket_keys.clone(),
        http2: config.http2,
    }
}

/// The ACME sites of `config`, for [`AcmeSites::retain`].
fn acme_sites(config: &Config) -> Vec<(&crate::names::Names, &crate::config::SiteAcme)> {
    config
        .sites
        .iter()
        .filter_map(|s| match &s.cert {
            SiteCert::Acme(a) => Some((&s.names, a)),
            _ => None,
        })
        .collect()
}

/// What start-up did that a reload cannot redo.
struct Started {
    /// The listeners came from the service manager.
    activated: bool,
    /// The user the process switched to.
    user: Option<String>,
}

/// SIGHUP: re-reads the configuration file and the certificate and key, and
/// hands the result to the workers. On any error the running configuration stays.
fn reload(args: &ServeArgs, current: &tokio::sync::watch::Sender<Current>, started: &Started, acme: &AcmeSites) {
    let source = match &args.config {
        Some(p) => format!("{} and the command line", p.display()),
        None => "the command line".to_string(),
    };
    let old = current.borrow().clone();
    let result = (|| -> anyhow::Result<(Current, String, String)> {
        let mut config = Config::from_args(args.clone())?;
        let running = &old.shared.config;
        // Listeners are bound once, at start-up; changing them needs a restart.
        // Passed sockets are the service manager's: `listen` does not apply to them.
        if started.activated {
            config.listen = running.listen.clone();
        } else {
            keep_until_restart("listen addresses", &mut config.listen, &running.listen, |a| join(a));
        }
        keep_until_restart("http_listen addresses", &mut config.http_listen, &running.http_listen, |a| join(a));
        keep_until_restart("workers", &mut config.workers, &running.workers, |n| n.to_string());
        if (&config.user, &config.group, config.allow_root) != (&running.user, &running.group, running.allow_root) {
            tracing::warn!(
                "reload: user, group or allow_root changed; privileges are dropped once, at start-up: this takes effect only after a restart"
            );
            config.user = running.user.clone();
            config.group = running.group.clone();
            config.allow_root = running.allow_root;
        }
        // After privileges are dropped the log's directory may be out of reach:
        // the file already open at the same path stays in use.
        let log = match open_access_log(&config.access_log) {
            Ok(log) => log,
            Err(e) if config.access_log == running.access_log => {
                tracing::warn!("reload: {}; access-log lines keep going to the file already open", e.root_cause());
                old.log.clone()
            }
            Err(e) => return Err(e),
        };
        let Prepared { shared, fingerprint, origin } =
            prepare(config, Some(&old.shared), old.shared.file_options.cache_entries, Some(acme))?;
        Ok((Current { shared: Arc::new(shared), log }, fingerprint, origin))
    })();
    // ACME tasks of sites the configuration now in force no longer has stop.
    let in_force = match &result {
        Ok((next, _, _)) => next.shared.clone(),
        Err(_) => old.shared.clone(),
    };
    acme.retain(&acme_sites(&in_force.config));
    match result {
        Ok((next, fingerprint, origin)) => {
            current.send_replace(next);
            tracing::info!(
                "reloaded configuration from {source}: certificate ({}) SHA-256 fingerprint {fingerprint}, record size {}",
                origin,
                current.borrow().shared.config.record_policy,
            );
        }
        Err(e) => {
            let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            let denied = e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
            }) || chain.iter().any(|c| c.contains("Permission denied"));
            let hint = match (&started.user, denied) {
                (Some(user), true) => format!(
                    " (ktlsd now runs as user {user}: the configuration, certificate and key must be readable by it)"
                ),
                _ => String::new(),
            };
            tracing::error!(
                "reload failed, still serving the previous configuration: {}{hint} (fix it and send SIGHUP again)",
                chain.join(": ")
            );
        }
    }
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

/// Descriptors kept for listeners, logs, the admin socket and files opened for a response.
const FD_RESERVE: u64 = 64;

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
        let available = congestion::available().unwrap_or_default();
        if !available.iter().any(|a| a == cc) {
            return Err(anyhow!(
                "tcp_congestion {cc:?} is not offered by this kernel (available: {}); try `modprobe tcp_{cc}`",
                available.join(" ")
            ));
        }
    }
    Ok(())
}

/// A setting fixed at start-up (bound sockets, worker threads): when a reload
/// changes it, says so and keeps the running value.
fn keep_until_restart<T: PartialEq + Clone>(what: &str, new: &mut T, running: &T, show: impl Fn(&T) -> String) {
    if new != running {
        tracing::warn!(
            "reload: {what} changed ({} -> {}); this takes effect only after a restart; keeping {}",
            show(running),
            show(new),
            show(running)
        );
        *new = running.clone();
    }
}

fn join(addrs: &[SocketAddr]) -> String {
    addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(" ")
}

fn open_access_log(dest: &AccessLogTarget) -> anyhow::Result<Option<Arc<File>>> {
    Ok(match dest {
        AccessLogTarget::Off => None,
        AccessLogTarget::Stdout => Some(Arc::new(dup_stdout()?)),
        AccessLogTarget::File(p) => Some(Arc::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("cannot open access log {}", p.display()))?,
        )),
    })
}

/// What `check` can say about the access log without creating it: an existing
/// file must open for appending, a new one needs its directory.
fn check_access_log(dest: &AccessLogTarget) -> anyhow::Result<()> {
    let AccessLogTarget::File(p) = dest else { return Ok(()) };
    if p.exists() {
        std::fs::OpenOptions::new()
            .append(true)
            .open(p)
            .with_context(|| format!("cannot open access log {}", p.display()))?;
        return Ok(());
    }
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(anyhow!("cannot create access log {}: {} is not a directory", p.display(), dir.display()));
    }
    Ok(())
}

/// SIGUSR1: opens the access log file anew at its configured path (after it was
/// renamed by log rotation). Each worker writes out the lines it holds to the
/// old file before it switches.
fn reopen_access_log(current: &tokio::sync::watch::Sender<Current>) {
    let now = current.borrow().clone();
    let AccessLogTarget::File(path) = &now.shared.config.access_log else {
        tracing::info!("SIGUSR1: the access log is not a file; nothing to reopen");
        return;
    };
    match open_access_log(&now.shared.config.access_log) {
        Ok(log) => {
            current.send_replace(Current { shared: now.shared.clone(), log });
            tracing::info!("reopened access log {}", path.display());
        }
        Err(e) => tracing::error!(
            "cannot reopen access log {}: {}; lines keep going to the previous file",
            path.display(),
            e.root_cause()
        ),
    }
}

/// Days before a certificate's end from which start-up, reload and `check` warn.
const EXPIRY_WARNING_DAYS: i64 = 14;

/// A warning when the leaf certificate (DER) has expired or expires within
/// [`EXPIRY_WARNING_DAYS`] of `now`; `None` when it is good for longer (or
/// cannot be parsed here: rustls has accepted it, and the server goes on).
fn expiry_warning(name: &str, leaf: &[u8], now: SystemTime) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).ok()?;
    let not_after = cert.validity().not_after.timestamp();
    let now = now.duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let name = if name.is_empty() { "the certificate".to_string() } else { format!("certificate {name}") };
    let when = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(not_after.max(0) as u64));
    let left = not_after - now;
    if left <= 0 {
        Some(format!("{name} has expired (not valid after {when}); clients will refuse it: renew it and send SIGHUP"))
    } else if left < EXPIRY_WARNING_DAYS * 86_400 {
        Some(format!("{name} expires in {} day(s) ({when}); renew it and send SIGHUP", left / 86_400))
    } else {
        None
    }
}

fn dup_stdout() -> anyhow::Result<File> {
    use std::os::fd::AsFd;
    let owned = std::io::stdout().as_fd().try_clone_to_owned().context("cannot duplicate standard output")?;
    Ok(File::from(owned))
}

/// What the main thread does on a signal.
enum Event {
    /// SIGTERM, SIGINT.
    Stop,
    /// SIGHUP.
    Reload,
    /// SIGUSR1.
    Reopen,
}

/// The signals ktlsd acts on, and those commonly sent that must not kill it
/// (SIGUSR2, SIGWINCH: ignored, logged the first time). SIGPIPE stays ignored
/// as the Rust runtime set it up: writes to a closed socket fail with EPIPE.
/// All are caught from before the first connection is accepted.
struct Signals {
    rt: tokio::runtime::Runtime,
    term: Signal,
    int: Signal,
    hup: Signal,
    usr1: Signal,
    usr2: Signal,
    winch: Signal,
    logged_usr2: bool,
    logged_winch: bool,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let all = rt.block_on(async {
            Ok::<_, std::io::Error>([
                signal(SignalKind::terminate())?,
                signal(SignalKind::interrupt())?,
                signal(SignalKind::hangup())?,
                signal(SignalKind::user_defined1())?,
                signal(SignalKind::user_defined2())?,
                signal(SignalKind::window_change())?,
            ])
        });
        let [term, int, hup, usr1, usr2, winch] = all.context("cannot install signal handlers")?;
        Ok(Signals { rt, term, int, hup, usr1, usr2, winch, logged_usr2: false, logged_winch: false })
    }

    /// Blocks until a signal that calls for an action arrives.
    fn next(&mut self) -> Event {
        loop {
            let got = self.rt.block_on(async {
                tokio::select! {
                    _ = self.term.recv() => Some(Event::Stop),
                    _ = self.int.recv() => Some(Event::Stop),
                    _ = self.hup.recv() => Some(Event::Reload),
                    _ = self.usr1.recv() => Some(Event::Reopen),
                    _ = self.usr2.recv() => {
                        if !std::mem::replace(&mut self.logged_usr2, true) {
                            tracing::info!("SIGUSR2 ignored (ktlsd has no action for it; this is logged once)");
                        }
                        None
                    }
                    _ = self.winch.recv() => {
                        if !std::mem::replace(&mut self.logged_winch, true) {
                            tracing::info!("SIGWINCH ignored (ktlsd has no action for it; this is logged once)");
                        }
                        None
                    }
                }
            });
            if let Some(e) = got {
                return e;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_ending(not_after: SystemTime) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = not_after.into();
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn expiry_warning_table() {
        let now = UNIX_EPOCH + Duration::from_secs(1_900_000_000);
        let day = Duration::from_secs(86_400);
        // (certificate ends at, warning expected containing)
        let table: [(SystemTime, Option<&str>); 5] = [
            (now + day * 90, None),
            (now + day * 15, None),
            (now + day * 13 + Duration::from_secs(60), Some("expires in 13 day(s)")),
            (now + Duration::from_secs(3600), Some("expires in 0 day(s)")),
            (now - day, Some("has expired")),
        ];
        for (end, want) in table {
            let got = expiry_warning("c.pem", &cert_ending(end), now);
            match want {
                None => assert_eq!(got, None, "ends {end:?}"),
                Some(w) => assert!(
                    got.as_deref().is_some_and(|g| g.contains(w) && g.contains("c.pem")),
                    "ends {end:?}: {got:?}"
                ),
            }
        }
    }

    #[test]
    fn ready_line_is_one_json_object() {
        let https: Vec<SocketAddr> = vec!["127.0.0.1:8443".parse().unwrap(), "[::1]:8443".parse().unwrap()];
        let line = ready_line(&https, &[], 42, RecordLayer::Userspace);
        assert_eq!(line, r#"{"ready":{"https":["127.0.0.1:8443","[::1]:8443"],"http":[],"pid":42,"tls":"userspace"}}"#);
        let http: Vec<SocketAddr> = vec!["0.0.0.0:80".parse().unwrap()];
        let v: serde_json::Value =
            serde_json::from_str(&ready_line(&https[..1], &http, 7, RecordLayer::Kernel)).unwrap();
        assert_eq!(v["ready"]["http"][0], "0.0.0.0:80");
        assert_eq!(v["ready"]["tls"], "ktls");
        assert!(!line.contains('\n'));
    }

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
