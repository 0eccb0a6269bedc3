//! `ktlsd serve` and `ktlsd check`, stage by stage. [`run`] reads as the list of
//! start-up stages, each a function below in the order it runs; [`check`] runs
//! the stages that validate without serving. Not the stages' own details:
//! preparing a configuration is `prepare`, reloading `reload`, signals `signals`.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::anyhow;
use tokio::sync::watch;

use super::acme::AcmeSites;
use super::fd_budget::FdBudget;
use super::live_listeners::ListenerSet;
use super::prepare::{open_cache, prepare, Prepared};
use super::reload::{reload, Started};
use super::signals::{Event, Signals};
use super::{access_log, admin, listener, plain, privileges, systemd, worker, Current, Shared};
use crate::config::{Config, ServeArgs};
use crate::stats::sites::RELOADS;
use crate::stats::{Metrics, Stats};
use crate::vocab::RecordLayer;

/// Starts the server and blocks until it has stopped.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = Config::from_args(args.clone())?;
    let plan = privileges::plan(&config)?;
    // Caught before anything else so that no signal sent during start-up kills the server.
    let mut signals = Signals::install()?;
    let cache_entries = raise_fd_budget(&config);
    let acme = AcmeSites::new()?;
    let mut prepared = prepare(config, None, cache_entries, Some(&acme))?;
    let log = access_log::open(&prepared.shared.config.access_log)?;
    let site_logs = access_log::open_sites(&prepared.shared.config, &[])?;
    let sockets = bind(&mut prepared.shared.config)?;
    if let (privileges::Plan::Drop(account), Some(dir)) = (&plan, &prepared.shared.config.state_dir) {
        privileges::hand_over_state_dir(dir, account)?;
    }
    // Everything that needs root (ports, keys, ROOT, the access log) is open: drop it.
    let started = drop_privileges(&plan, sockets.activated)?;
    super::prepare::open_compressed_store(&prepared.shared.config);
    prepared.shared.cache = open_cache(&prepared.shared.config, None)?;
    let (shared, started_at) = announce_ready(prepared, &sockets);
    let listeners = match sockets.activated {
        true => ListenerSet::default(),
        false => ListenerSet::started(&shared.config.listen, &sockets.https_bound),
    };
    let current = Current { shared, log, listeners, site_logs };
    current.sync_health_checks();
    let running = spawn(sockets, current, started_at)?;
    systemd::notify("READY=1");
    RELOADS.loaded(false);
    let digest = crate::config::digest(&args, &running.current.borrow().shared.config.root);
    crate::stats::sites::reload_event("start", true, digest, None);
    // Listeners are up and privileges dropped: ACME may now order and be validated.
    acme.go();
    wait(&mut signals, &args, &running.current, &started, &acme);
    stop(running);
    Ok(())
}

/// `ktlsd check`: everything `serve` validates before it serves (configuration,
/// certificate and key, ROOT, kTLS mode, TCP options, access log, the cache
/// directory, free ports),
/// without serving.
pub fn check(args: ServeArgs) -> anyhow::Result<()> {
    let config_file = args.config.clone();
    let config = Config::from_args(args)?;
    let plan = privileges::plan(&config)?;
    // `check` writes nothing: a missing self-signed certificate is not stored.
    let prepared = prepare(config, None, 0, None)?;
    let config = &prepared.shared.config;
    access_log::check_all(config)?;
    if let Some(cache) = &config.cache {
        privileges::check_cache_dir(&cache.dir, &plan)?;
    }
    if let privileges::Plan::Drop(account) = &plan {
        // What a reload reads after the switch must be readable by that account.
        privileges::check_readable(config, config_file.as_deref(), account)?;
    }
    for &addr in config.listen.iter().chain(&config.http_listen) {
        match listener::check_port(addr).map_err(|e| anyhow!(e))? {
            listener::PortState::Free => {}
            listener::PortState::HeldForActivation { pid, command } => tracing::info!(
                "{addr} is held by {command} (pid {pid}) for socket activation: serve started by it receives that socket"
            ),
            listener::PortState::HeldByRunningServer { pid } => tracing::info!(
                "{addr} is held by the running ktlsd (pid {pid}): a reload keeps that listener"
            ),
        }
    }
    println!("configuration OK");
    Ok(())
}

/// Raises the file-descriptor limit and logs how it is shared out; returns
/// each worker's open-file cache size.
fn raise_fd_budget(config: &Config) -> usize {
    let fds = FdBudget::raise();
    let cache_entries = fds.cache_entries_per_worker(config.workers);
    let connections = match config.max_connections {
        Some(n) => format!("{n} per worker (--max-connections)"),
        None => format!("{} per worker", fds.connections_per_worker(config.workers)),
    };
    tracing::info!(
        "{}; {} per worker for connections, upstream connections and held files; open-file cache up to {cache_entries} per worker; connections up to {connections}",
        fds.describe(),
        fds.per_worker(config.workers)
    );
    cache_entries
}

/// The sockets start-up binds (or is passed) while it still has privileges.
struct Sockets {
    /// Each worker's HTTPS listeners.
    https: Vec<Vec<TcpListener>>,
    /// The HTTPS addresses as bound (port 0 resolved).
    https_bound: Vec<SocketAddr>,
    /// Each worker's HTTP/3 sockets, on the HTTPS addresses' ports; empty without `http3`.
    udp: Vec<Vec<std::net::UdpSocket>>,
    /// The plain-HTTP listeners (one listener thread).
    http: Vec<Vec<TcpListener>>,
    http_bound: Vec<SocketAddr>,
    admin: Option<admin::Bound>,
    /// The HTTPS listeners came from the service manager.
    activated: bool,
}

/// Binds the HTTPS listeners (or takes those the service manager passed, and
/// records their addresses as `listen`), the plain-HTTP ones and the admin socket.
fn bind(config: &mut Config) -> anyhow::Result<Sockets> {
    let passed = systemd::listen_fds().map_err(|e| anyhow!(e))?.unwrap_or_default();
    // UDP sockets alone (a socket unit with only ListenDatagram=): TCP binds `listen` itself.
    let activated = !passed.tcp.is_empty();
    let passed_udp = passed.udp;
    // Sockets named `http` (FileDescriptorName=http) are the plain-HTTP listener's.
    let (passed_http, passed_https): (Vec<_>, Vec<_>) =
        passed.tcp.into_iter().partition(|(_, name)| name == systemd::HTTP_FD_NAME);
    let passed_https: Vec<TcpListener> = passed_https.into_iter().map(|(l, _)| l).collect();
    let passed_http: Vec<TcpListener> = passed_http.into_iter().map(|(l, _)| l).collect();
    if activated && passed_https.is_empty() {
        return Err(anyhow!(
            "socket activation: no HTTPS socket was passed (only sockets named {:?}); give the HTTPS socket unit another FileDescriptorName=",
            systemd::HTTP_FD_NAME
        ));
    }
    let (https, https_bound) = match activated {
        true => {
            tracing::info!(
                "socket activation: using the {} socket(s) passed by the service manager; listen ({}) is ignored",
                passed_https.len(),
                listener::join(&config.listen)
            );
            listener::share(passed_https, config.workers)
        }
        false => listener::bind_all(&config.listen, config.workers),
    }
    .map_err(|e| anyhow!(e))?;
    let (http, http_bound) = if !passed_http.is_empty() {
        tracing::info!(
            "socket activation: using the {} plain-HTTP socket(s) passed by the service manager; http_listen ({}) is ignored",
            passed_http.len(),
            listener::join(&config.http_listen)
        );
        listener::share(passed_http, 1).map_err(|e| anyhow!(e))?
    } else if config.http_listen.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        listener::bind_all(&config.http_listen, 1).map_err(|e| anyhow!(e))?
    };
    let admin = match &config.admin {
        Some(a) => Some(admin::bind(a)?),
        None => None,
    };
    if activated {
        config.listen = https_bound.clone();
        config.http_listen = http_bound.clone();
    }
    if config.http3.is_none() && !passed_udp.is_empty() {
        tracing::warn!("socket activation: {} UDP socket(s) passed but http3 is off; unused", passed_udp.len());
    }
    let udp = match config.http3 {
        Some(_) => {
            if !passed_udp.is_empty() {
                tracing::info!("socket activation: HTTP/3 on the {} UDP socket(s) passed", passed_udp.len());
            }
            crate::quic::socket::with_passed(passed_udp, &https_bound, config.workers).map_err(|e| anyhow!(e))?
        }
        None => Vec::new(),
    };
    Ok(Sockets { https, https_bound, udp, http, http_bound, admin, activated })
}

/// Switches to the planned account, or says why the process stays as it is.
fn drop_privileges(plan: &privileges::Plan, activated: bool) -> anyhow::Result<Started> {
    let user = match plan {
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
    Ok(Started { activated, user })
}

/// Logs what is served where, then writes the ready line. Before any worker
/// runs, so it is the first line on stdout even when the access log goes there
/// too. Returns what the workers serve with and the moment the server was ready.
fn announce_ready(prepared: Prepared, sockets: &Sockets) -> (Arc<Shared>, Instant) {
    let Prepared { shared, fingerprint, origin } = prepared;
    let h3 = if sockets.udp.is_empty() { "" } else { " and HTTP/3 on UDP" };
    for addr in &sockets.https_bound {
        tracing::info!("listening on https://{addr}{h3}");
    }
    for addr in &sockets.http_bound {
        tracing::info!("listening on http://{addr} (redirects to HTTPS; ACME HTTP-01 challenges)");
    }
    let workers = shared.config.workers;
    tracing::info!(
        "serving {} with {} worker{}, certificate ({origin}) SHA-256 fingerprint {}, record size {}",
        shared.config.root.display(),
        workers,
        if workers == 1 { "" } else { "s" },
        fingerprint,
        shared.config.record_policy,
    );
    let tls = if shared.ktls.is_some() { RecordLayer::Kernel } else { RecordLayer::Userspace };
    let started_at = Instant::now();
    write_ready_line(&ready_line(&sockets.https_bound, &sockets.http_bound, std::process::id(), tls));
    (Arc::new(shared), started_at)
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
fn write_ready_line(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
        tracing::warn!("cannot write the ready line to standard output: {e}");
    }
}

/// The threads of a running server and the channels that steer them.
struct Running {
    stop: watch::Sender<bool>,
    current: watch::Sender<Current>,
    workers: Vec<JoinHandle<Stats>>,
    admin: Option<JoinHandle<()>>,
    plain: Option<JoinHandle<()>>,
    /// The thread that follows the fleet's store (`[cluster]`).
    cluster: Option<JoinHandle<()>>,
}

/// Starts the workers on their listeners, then the admin and plain-HTTP listeners.
fn spawn(sockets: Sockets, current: Current, started_at: Instant) -> anyhow::Result<Running> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let (current_tx, current_rx) = watch::channel(current);
    let mut workers = Vec::new();
    let mut metrics = Vec::new();
    // One table for every worker, kept across reloads: connections outlive configurations.
    let per_ip = Arc::new(super::per_ip::PerIp::default());
    let mut udp = sockets.udp.into_iter();
    for (id, ls) in sockets.https.into_iter().enumerate() {
        let m = Arc::new(Metrics::default());
        metrics.push(m.clone());
        let udp = udp.next().unwrap_or_default();
        workers.push(worker::spawn(id, ls, udp, current_rx.clone(), stop_rx.clone(), m, per_ip.clone())?);
    }
    // The port-80 listener counts its answers too; the admin listener sums it with the workers.
    let plain_metrics = Arc::new(Metrics::default());
    metrics.push(plain_metrics.clone());
    let admin = match sockets.admin {
        Some(b) => {
            if let Some(a) = &current_rx.borrow().shared.config.admin {
                tracing::info!(
                    "admin listener on {a} (/ the status page, /status.json, /metrics, /status, /advisor, /healthz)"
                );
            }
            let state = admin::State {
                workers: metrics,
                started: started_at,
                current: current_rx.clone(),
                https: sockets.https_bound.clone(),
                http: sockets.http_bound.clone(),
                history: Default::default(),
                drain: Default::default(),
            };
            Some(admin::spawn(b, state, stop_rx.clone())?)
        }
        None => None,
    };
    // Redirects name the first HTTPS address's port, as bound (port 0 resolved).
    let target = plain::Target { https_port: sockets.https_bound[0].port() };
    let plain = match sockets.http.into_iter().next() {
        Some(ls) => Some(plain::spawn(ls, target, current_rx.clone(), stop_rx.clone(), plain_metrics)?),
        None => None,
    };
    let cluster = match current_rx.borrow().shared.cluster.clone() {
        Some(member) => Some(member.start(stop_rx.clone(), current_rx.clone())?),
        None => None,
    };
    Ok(Running { stop: stop_tx, current: current_tx, workers, admin, plain, cluster })
}

/// Acts on signals until one says stop: SIGHUP reloads, SIGUSR1 reopens the access log.
fn wait(
    signals: &mut Signals,
    args: &ServeArgs,
    current: &watch::Sender<Current>,
    started: &Started,
    acme: &AcmeSites,
) {
    loop {
        match signals.next() {
            Event::Stop => return,
            Event::Reload => {
                systemd::notify(&systemd::reloading_message());
                match reload(args, current, started, acme) {
                    Ok(()) => systemd::notify("READY=1\nSTATUS=serving; last reload succeeded"),
                    Err(why) => systemd::notify(&systemd::reload_failed_message(&why)),
                }
            }
            Event::Reopen => access_log::reopen(current),
        }
    }
}

/// Stops accepting, lets in-flight responses finish within the shutdown
/// timeout, joins every thread and logs the totals.
fn stop(running: Running) {
    let shutdown = running.current.borrow().shared.config.timeouts.shutdown;
    tracing::info!("stopping: no new connections; in-flight responses get {shutdown:?}");
    systemd::notify("STOPPING=1");
    let _ = running.stop.send(true);

    if running.admin.is_some_and(|a| a.join().is_err()) {
        tracing::error!("the admin listener panicked");
    }
    if running.plain.is_some_and(|p| p.join().is_err()) {
        tracing::error!("the plain-HTTP listener panicked");
    }
    if running.cluster.is_some_and(|c| c.join().is_err()) {
        tracing::error!("the cluster thread panicked");
    }
    let total = Stats::default();
    for h in running.workers {
        match h.join() {
            Ok(s) => total.add(&s),
            Err(_) => tracing::error!("a worker panicked"),
        }
    }
    tracing::info!("stopped: {total}");
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
