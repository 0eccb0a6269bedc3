//! A worker: one thread, one single-threaded event loop, its own listeners, access
//! log and counters. Each accepted connection runs as a local task through
//! handshake -> record layer choice -> HTTP.
//!
//! A connection task is counted as active from accept to its end however it
//! ends, a panic included (a guard uncounts it while unwinding), so shutdown
//! never waits for a task that is gone. Failed handshakes are counted by reason
//! and logged, at most [`HANDSHAKE_LOG_LINES`] lines per second per worker.
//!
//! A reload retires the connections opened before it: each watches its
//! generation's signal, which turns true when a new configuration arrives (or
//! the server stops), and ends after its current response. The worker also
//! follows the HTTPS listeners a reload opens and closes.
//!
//! A worker holds at most `max_connections` connections (by default half its
//! share of the file descriptor budget): one more is accepted and closed at once,
//! counted as refused and logged at most once per second, so the listen backlog
//! does not fill with connections that would wait for a slot. So is one for which
//! the worker's descriptor ledger ([`crate::fds`]) has no room, once the held
//! descriptors (open-file cache, cache entry files, idle upstream connections) are
//! given back: client connections, upstream connections and held files share the
//! worker's budget. A client address holding `max_connections_per_ip` connections
//! over all workers (`per_ip`; by default a quarter of the server's connections)
//! has one more refused the same way, counted apart. When `accept` itself fails
//! for want of descriptors, the held ones are given back and it is tried again;
//! if that gives back none, the connections waiting are accepted and closed at
//! once with a spare descriptor kept for that, and accepting pauses for
//! [`ACCEPT_PAUSE`] (logged once a second at most) rather than spin.
//!
//! With HTTP/3 on, the worker also runs a QUIC endpoint on each of its UDP
//! sockets (`quic` below), whose connections count against the same cap.

mod quic;

use std::cell::{Cell, RefCell};
use std::net::{IpAddr, SocketAddr, TcpListener as StdListener, UdpSocket};
use std::os::fd::AsFd;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle as TaskHandle;

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::LocalSet;

use super::live_listeners::ListenerSet;
use super::per_ip::{self, PerIp};
use super::proxy_protocol;
use super::{Current, Shared};
use crate::fds;
use crate::http::{self, h1, h2, End};
use crate::log::{AccessLog, RateLimit};
use crate::stats::{Metrics, Stats, Traffic};
use crate::tls;
use crate::tls::handshake::{self, FailureKind};
use crate::tls::tcp;
use crate::vocab::{HttpVersion, RecordLayer};

/// Everything a connection task borrows from its worker.
struct Worker {
    /// The configuration new connections start with; replaced on reload. Each
    /// connection keeps its own `Arc` to the end.
    shared: RefCell<Arc<Shared>>,
    /// Where a new configuration or access log arrives from.
    current: RefCell<watch::Receiver<Current>>,
    /// This worker's index: which socket of each listener entry is its own.
    id: usize,
    /// The accept loop of each HTTPS address, by bound address.
    accepting: RefCell<Vec<(SocketAddr, TaskHandle<()>)>>,
    /// Turns true when the server stops (accept loops and connections watch it).
    stop: watch::Receiver<bool>,
    log: AccessLog,
    /// This worker's counters; the admin listener reads them (only this worker writes).
    metrics: Arc<Metrics>,
    tasks: Rc<Tasks>,
    /// Turns true when the configuration connections started with is replaced
    /// (reload) or the server stops: idle keep-alive connections end, busy ones
    /// after their current response (`Connection: close`, GOAWAY), so no client
    /// is served an old configuration for more than one request.
    retire: RefCell<watch::Sender<bool>>,
    handshake_log: RateLimit,
    /// Connections this worker holds at most when `max_connections` is not set.
    default_cap: usize,
    refusal_log: RateLimit,
    /// Pauses of accept for want of descriptors.
    accept_log: RateLimit,
    /// Connections per client address, over all workers and reloads.
    per_ip: Arc<PerIp>,
}

impl Worker {
    /// Starts accepting on addresses new in `set` (with this worker's socket of
    /// each) and stops on those no longer in it, which closes their sockets.
    fn follow_listeners(self: &Rc<Worker>, set: &ListenerSet) {
        if set.entries.is_empty() {
            return; // Passed by the service manager: fixed.
        }
        let mut accepting = self.accepting.borrow_mut();
        let keep: Vec<SocketAddr> = set.bound();
        accepting.retain(|(addr, task)| {
            let kept = keep.contains(addr);
            if !kept {
                task.abort();
            }
            kept
        });
        for entry in &set.entries {
            if accepting.iter().any(|(a, _)| *a == entry.bound) {
                continue;
            }
            let Some(socket) = entry.take(self.id) else { continue };
            match TcpListener::from_std(socket) {
                Ok(l) => {
                    let task = tokio::task::spawn_local(accept_loop(l, self.clone(), self.stop.clone()));
                    accepting.push((entry.bound, task));
                }
                Err(e) => tracing::error!("worker cannot use its listener on {}: {e}", entry.bound),
            }
        }
    }

    /// Tells every connection started so far to end after its current response;
    /// connections accepted from now on get a new signal.
    fn retire_connections(&self) {
        let old = std::mem::replace(&mut *self.retire.borrow_mut(), watch::channel(false).0);
        old.send_replace(true);
    }

    /// Copies what this worker counts outside its metrics (panicked tasks, its
    /// open-file cache, its use of the compressed-body store) into them, so a scrape sees them within a tick.
    fn publish(&self) {
        let s = &self.metrics.stats;
        Stats::set(&s.panics, self.tasks.panics.get());
        let cache = crate::files::cache_counts();
        Stats::set(&s.open_file_cache_hits, cache.hits);
        Stats::set(&s.open_file_cache_misses, cache.misses);
        Stats::set(&s.open_file_cache_entries, cache.entries);
        Stats::set(&s.open_file_cache_content_hits, cache.content_hits);
        let compressed = crate::files::compress::counts();
        Stats::set(&s.compressed_hits, compressed.hits);
        Stats::set(&s.compressed_made, compressed.made);
    }

    /// Takes a new configuration or access log if one was sent since the last look
    /// (one atomic load when nothing changed).
    fn refresh(self: &Rc<Worker>) {
        let mut rx = self.current.borrow_mut();
        if rx.has_changed().unwrap_or(false) {
            let Current { shared, log, listeners, site_logs } = rx.borrow_and_update().clone();
            self.follow_listeners(&listeners);
            self.log.switch_sites(&site_logs);
            self.log.set_format(shared.config.access_log_format);
            self.log.set_custom(shared.config.access_log_custom.clone());
            // A reopened access log keeps the configuration: connections go on.
            if !Arc::ptr_eq(&shared, &self.shared.borrow()) {
                self.retire_connections();
            }
            *self.shared.borrow_mut() = shared;
            self.log.switch(log);
        }
    }
}

/// The worker's connection tasks: how many are running, a wake-up for when none
/// is, and how many panicked.
#[derive(Default)]
struct Tasks {
    active: Cell<usize>,
    idle: Notify,
    panics: Cell<u64>,
}

/// Most failed-handshake lines a worker logs per second; a client that fails
/// handshakes in a loop must not flood the log.
const HANDSHAKE_LOG_LINES: u32 = 10;

/// Counts a connection task as active until it is dropped: when it returns,
/// when it is aborted, and when it panics (then the panic is counted and logged).
struct Active {
    tasks: Rc<Tasks>,
    peer: SocketAddr,
}

impl Active {
    fn new(tasks: Rc<Tasks>, peer: SocketAddr) -> Active {
        tasks.active.set(tasks.active.get() + 1);
        Active { tasks, peer }
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        let t = &self.tasks;
        if std::thread::panicking() {
            t.panics.set(t.panics.get() + 1);
            tracing::error!(
                "connection task for {} panicked (message above); the connection was dropped, the server goes on",
                self.peer
            );
        }
        t.active.set(t.active.get().saturating_sub(1));
        if t.active.get() == 0 {
            t.idle.notify_waiters();
        }
    }
}

fn log_suppressed_handshakes(n: u64) {
    if n > 0 {
        tracing::info!(
            "{n} more failed handshake(s) not logged (at most {HANDSHAKE_LOG_LINES} lines per second per worker; the counters have them all)"
        );
    }
}

pub fn spawn(
    id: usize,
    listeners: Vec<StdListener>,
    udp: Vec<UdpSocket>,
    current: watch::Receiver<Current>,
    stop: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    per_ip: Arc<PerIp>,
) -> anyhow::Result<JoinHandle<Stats>> {
    std::thread::Builder::new()
        .name(format!("ktlsd-worker-{id}"))
        .spawn(move || run(id, listeners, udp, current, stop, metrics, per_ip))
        .context("cannot start a worker thread")
}

fn run(
    id: usize,
    listeners: Vec<StdListener>,
    udp: Vec<UdpSocket>,
    mut current: watch::Receiver<Current>,
    stop: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    per_ip: Arc<PerIp>,
) -> Stats {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("worker cannot start its event loop: {e}");
            return Stats::default();
        }
    };
    let Current { shared, log, site_logs, .. } = current.borrow_and_update().clone();
    let format = shared.config.access_log_format;
    let budget = super::FdBudget::read();
    let default_cap = budget.connections_per_worker(shared.config.workers);
    fds::set_budget(budget.per_worker(shared.config.workers));
    fds::set_release(fds::Kind::OpenFile, crate::files::release_cached);
    fds::set_release(fds::Kind::EntryFile, crate::handler::cache::release_entry_files);
    fds::set_release(fds::Kind::IdleUpstream, crate::handler::proxy::pool::release_idle);
    let worker = Rc::new(Worker {
        shared: RefCell::new(shared),
        current: RefCell::new(current.clone()),
        id,
        accepting: RefCell::default(),
        stop: stop.clone(),
        log: AccessLog::new(log).counting(metrics.clone()),
        metrics,
        tasks: Rc::default(),
        retire: RefCell::new(watch::channel(false).0),
        handshake_log: RateLimit::new(HANDSHAKE_LOG_LINES),
        default_cap,
        refusal_log: RateLimit::new(1),
        accept_log: RateLimit::new(1),
        per_ip,
    });
    worker.log.set_format(format);
    worker.log.switch_sites(&site_logs);
    worker.log.set_custom(worker.shared.borrow().config.access_log_custom.clone());
    let local = LocalSet::new();
    local.block_on(&rt, {
        let worker = worker.clone();
        async move {
            for l in listeners {
                let addr = l.local_addr();
                match (TcpListener::from_std(l), addr) {
                    (Ok(l), Ok(addr)) => {
                        let task = tokio::task::spawn_local(accept_loop(l, worker.clone(), stop.clone()));
                        worker.accepting.borrow_mut().push((addr, task));
                    }
                    (Err(e), _) | (_, Err(e)) => tracing::error!("worker cannot use its listener: {e}"),
                }
            }
            let quic = quic::start(udp, &worker, &stop);
            let flusher = tokio::task::spawn_local({
                let worker = worker.clone();
                async move {
                    let mut tick = tokio::time::interval(Duration::from_millis(200));
                    loop {
                        tick.tick().await;
                        worker.log.flush();
                        worker.publish();
                        log_suppressed_handshakes(worker.handshake_log.roll(Instant::now()));
                        crate::log::report_suppressed_refusals();
                    }
                }
            });

            // A reload or reopened access log: new connections take the new
            // configuration; the access log writes out what it holds first.
            let updates = tokio::task::spawn_local({
                let worker = worker.clone();
                async move {
                    while current.changed().await.is_ok() {
                        // Marks this receiver as up to date; `refresh` reads the worker's own.
                        drop(current.borrow_and_update());
                        worker.refresh();
                    }
                }
            });

            let mut stop = stop;
            let _ = stop.wait_for(|s| *s).await;
            for a in &quic {
                a.abort();
            }
            for (_, a) in worker.accepting.borrow_mut().drain(..) {
                a.abort();
            }
            updates.abort();
            worker.retire_connections();
            let shutdown_timeout = worker.shared.borrow().config.timeouts.shutdown;
            // In-flight connections finish their current response, bounded in time.
            let drained = tokio::time::timeout(shutdown_timeout, async {
                while worker.tasks.active.get() > 0 {
                    worker.tasks.idle.notified().await;
                }
            })
            .await;
            if drained.is_err() {
                tracing::warn!(
                    "{} connection(s) still busy after the shutdown timeout; closing them",
                    worker.tasks.active.get()
                );
            }
            flusher.abort();
            log_suppressed_handshakes(worker.handshake_log.roll(Instant::now() + RateLimit::WINDOW));
        }
    });
    drop(local);
    worker.log.flush();
    worker.publish();
    let total = Stats::default();
    total.add(&worker.metrics.stats);
    total
}

/// How long accepting pauses when the process is out of descriptors and holds
/// none it could give back (nginx pauses its accept for the same time): long enough
/// that a wedged worker costs no CPU, short enough that it resumes as soon as
/// connections end.
pub(super) const ACCEPT_PAUSE: Duration = Duration::from_millis(500);

/// Most connections waiting in the backlog refused at once per pause with the spare
/// descriptor; the rest wait for the next turn.
const REFUSE_PER_PAUSE: usize = 256;

async fn accept_loop(listener: TcpListener, worker: Rc<Worker>, stop: watch::Receiver<bool>) {
    // Kept for refusing connections when the process has no descriptor left for them.
    let mut spare = listener.as_fd().try_clone_to_owned().ok();
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                Stats::bump(&worker.metrics.stats.connections);
                // A connection accepted after a reload was sent gets it, even if
                // the update task has not run yet.
                worker.refresh();
                let shared = worker.shared.borrow().clone();
                let cfg = &shared.config;
                let cap = cfg.max_connections.map_or(worker.default_cap, |n| n.get());
                if worker.tasks.active.get() >= cap {
                    Stats::bump(&worker.metrics.stats.connections_refused);
                    let why = format!("this worker holds max_connections {cap} (raise --max-connections or the file descriptor limit, or add workers)");
                    refuse(stream, peer, &worker, &why);
                    continue;
                }
                let Some(fd) = fds::admit(fds::Kind::Client) else {
                    Stats::bump(&worker.metrics.stats.connections_refused);
                    let why = format!(
                        "this worker's {} descriptors are in use by connections and upstream connections (raise the file descriptor limit, or add workers)",
                        fds::budget()
                    );
                    refuse(stream, peer, &worker, &why);
                    continue;
                };
                // A load balancer's connection is counted by the client's address its
                // PROXY protocol header names, once read.
                let balanced = proxy_protocol::covers(&cfg.proxy_protocol_from, peer.ip());
                let counted = match balanced {
                    true => None,
                    false => match enter_per_ip(&worker, cfg, cap, peer.ip()) {
                        Ok(counted) => Some(counted),
                        Err(why) => {
                            refuse(stream, peer, &worker, &why);
                            continue;
                        }
                    },
                };
                let active = Active::new(worker.tasks.clone(), peer);
                let w = worker.clone();
                let signals = Signals { retire: worker.retire.borrow().subscribe(), stop: stop.clone() };
                tokio::task::spawn_local(async move {
                    let _active = active;
                    let _counted = (counted, fd);
                    let (peer, _counted_client) = match balanced {
                        false => (peer, None),
                        true => match from_balancer(&stream, peer, &w, &shared, cap).await {
                            Some((client, counted)) => (client, Some(counted)),
                            None => return,
                        },
                    };
                    connection(stream, peer, &w, &shared, signals).await;
                });
            }
            Err(e) if fds::is_exhaustion(&e) => {
                // Held descriptors first: with them given back, accept again at once.
                if fds::release_all() > 0 {
                    continue;
                }
                let refused = refuse_waiting(&listener, &mut spare, &worker).await;
                let (log, suppressed) = worker.accept_log.check(Instant::now());
                if log {
                    let more = if suppressed > 0 {
                        format!(" ({suppressed} more pause(s) not logged)")
                    } else {
                        String::new()
                    };
                    tracing::warn!("accept failed: {e}; refused {refused} waiting connection(s), accepting again in {} ms{more} (raise the file descriptor limit; see `ktlsd doctor`)", ACCEPT_PAUSE.as_millis());
                }
                tokio::time::sleep(ACCEPT_PAUSE).await;
            }
            Err(e) => {
                // A connection reset while it waited (ECONNABORTED), or the system short of memory.
                let (log, _) = worker.accept_log.check(Instant::now());
                if log {
                    tracing::warn!("accept failed: {e}; trying again in 100 ms");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Counts a connection from `ip` against `max_connections_per_ip`; `Err` says why
/// it is refused (counted here, closed by the caller).
fn enter_per_ip(worker: &Worker, cfg: &crate::config::Config, cap: usize, ip: IpAddr) -> Result<per_ip::Slot, String> {
    let per_ip = match cfg.max_connections_per_ip {
        Some(n) => n.get(),
        None => super::per_ip::default_limit(cfg.workers, cap),
    };
    PerIp::enter(&worker.per_ip, ip, per_ip).ok_or_else(|| {
        Stats::bump(&worker.metrics.stats.connections_refused_per_ip);
        let default = match cfg.max_connections_per_ip {
            None => " (the default: a quarter of the server's connections)",
            Some(_) => "",
        };
        format!("its address holds max_connections_per_ip {per_ip}{default}")
    })
}

/// Reads the PROXY protocol header a load balancer's connection begins with, within
/// the handshake timeout, and counts the client it names against
/// `max_connections_per_ip`: the client's address and its count, or `None` when
/// the connection was closed (a missing, malformed or late header is logged as
/// a failed handshake is, and counted as one: a protocol error, a timeout or a reset).
async fn from_balancer(
    stream: &TcpStream,
    peer: SocketAddr,
    worker: &Worker,
    shared: &Shared,
    cap: usize,
) -> Option<(SocketAddr, per_ip::Slot)> {
    let cfg = &shared.config;
    let client = match proxy_protocol::read_header(stream, peer, cfg.timeouts.handshake).await {
        Ok(client) => client,
        Err(e) => {
            let stats = &worker.metrics.stats;
            Stats::bump(&stats.handshake_failures);
            Stats::bump(match e {
                proxy_protocol::Refused::Timeout => &stats.handshake_timeouts,
                proxy_protocol::Refused::Closed | proxy_protocol::Refused::Io(_) => &stats.handshake_resets,
                proxy_protocol::Refused::Malformed(_) | proxy_protocol::Refused::TooLong => {
                    &stats.handshake_protocol_errors
                }
            });
            let (log, suppressed) = worker.handshake_log.check(Instant::now());
            log_suppressed_handshakes(suppressed);
            if log {
                tracing::info!("connection from the load balancer {peer} closed: {e}");
            }
            return None;
        }
    };
    match enter_per_ip(worker, cfg, cap, client.ip()) {
        Ok(counted) => Some((client, counted)),
        Err(why) => {
            let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
            let (log, _) = worker.refusal_log.check(Instant::now());
            if log {
                tracing::warn!("refused the connection from {client} (through {peer}): {why}");
            }
            None
        }
    }
}

/// Accepts and closes at once the connections waiting in `listener`'s backlog,
/// with the descriptor `spare` gives up for each (taken again afterwards), so that
/// a worker out of descriptors refuses them rather than leaves them hanging.
/// Returns how many it refused.
async fn refuse_waiting(listener: &TcpListener, spare: &mut Option<std::os::fd::OwnedFd>, worker: &Worker) -> usize {
    let mut refused = 0;
    if spare.take().is_some() {
        while refused < REFUSE_PER_PAUSE {
            // Only what waits now: a zero timeout polls the accept once.
            match tokio::time::timeout(Duration::ZERO, listener.accept()).await {
                Ok(Ok((stream, _))) => {
                    Stats::bump(&worker.metrics.stats.connections);
                    Stats::bump(&worker.metrics.stats.connections_refused);
                    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
                    drop(stream);
                    refused += 1;
                }
                Ok(Err(_)) | Err(_) => break,
            }
        }
    }
    *spare = listener.as_fd().try_clone_to_owned().ok();
    refused
}

/// Closes a connection over a cap at once (`why` says which): the client sees its
/// handshake end instead of waiting in the backlog. The caller counts it.
fn refuse(stream: TcpStream, peer: SocketAddr, worker: &Worker, why: &str) {
    // No lingering: a reset tells the client at once, and frees the descriptor now.
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
    let (log, suppressed) = worker.refusal_log.check(Instant::now());
    if suppressed > 0 {
        tracing::warn!(
            "{suppressed} more connection(s) refused in the last second (max_connections, max_connections_per_ip)"
        );
    }
    if log {
        tracing::warn!("refused the connection from {peer}: {why}");
    }
}

/// What a connection watches besides its client.
struct Signals {
    /// Its configuration was replaced or the server stops: end after the current response.
    retire: watch::Receiver<bool>,
    /// The server stops: a lingering close ends at once.
    stop: watch::Receiver<bool>,
}

async fn connection(stream: TcpStream, peer: SocketAddr, worker: &Worker, shared: &Shared, signals: Signals) {
    let Signals { retire, stop } = signals;
    let cfg = &shared.config;
    let stats = &worker.metrics.stats;
    let traffic = &worker.metrics.traffic;
    // HTTP/3 listens on the UDP port of the address this connection came to.
    let alt_svc = shared.http3.as_ref().and_then(|_| stream.local_addr().ok()).map(|a| quic::alt_svc(a.port()));
    let _ = stream.set_nodelay(true);
    if let Some(lowat) = cfg.tcp.notsent_lowat {
        let _ = tcp::set_notsent_lowat(stream.as_fd(), lowat);
    }
    if let Some(cc) = &cfg.tcp.congestion {
        let _ = tcp::set_congestion(stream.as_fd(), cc);
    }

    let (tls, client_auth) = (shared.tls.clone(), Some(&shared.client_auth));
    // Each phase's future is boxed, so that the task holds only the one running, at its own
    // size: an idle keep-alive connection keeps no room for the handshake's or HTTP/2's state.
    let accepting = Box::pin(handshake::accept_choosing(&stream, tls, client_auth, cfg.timeouts.handshake));
    let established = match accepting.await {
        Ok(e) => e,
        Err(e) => {
            let kind = e.kind();
            Stats::bump(&stats.handshake_failures);
            Stats::bump(match kind {
                FailureKind::Timeout => &stats.handshake_timeouts,
                FailureKind::Protocol => &stats.handshake_protocol_errors,
                FailureKind::ClientAlert => &stats.handshake_client_alerts,
                FailureKind::Reset => &stats.handshake_resets,
                FailureKind::PlainHttp => &stats.handshake_plain_http,
            });
            let (log, suppressed) = worker.handshake_log.check(Instant::now());
            log_suppressed_handshakes(suppressed);
            if log {
                tracing::info!("handshake with {peer} failed ({kind}): {e}");
            }
            return;
        }
    };

    Stats::bump(&traffic.handshakes_ok);
    if established.conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
        Stats::bump(&traffic.handshakes_resumed);
    }

    // An ACME tls-alpn-01 validation: the handshake was the answer (RFC 8737
    // section 3); no HTTP and no kernel record layer follow.
    if established.conn.alpn_protocol() == Some(crate::acme::ACME_TLS_ALPN) {
        tracing::info!("ACME tls-alpn-01 validation handshake from {peer} answered");
        return;
    }

    let protocol = established.protocol();
    let negotiated = (
        established.conn.protocol_version().and_then(|v| v.as_str()),
        established.conn.negotiated_cipher_suite().and_then(|s| s.suite().as_str()),
    );
    let mut session = match tls::establish(stream, established, shared.ktls.as_deref(), &shared.session) {
        Ok(s) => s,
        Err(e) => {
            Stats::bump(&stats.ktls_install_failures);
            tracing::warn!("the record layer could not take over the session of {peer}: {e}");
            return;
        }
    };
    Stats::bump(match session.mode() {
        RecordLayer::Kernel => &stats.ktls,
        // A TLS session is never QUIC's; counted with the other user-space layer if it were.
        RecordLayer::Userspace | RecordLayer::Quic => &stats.userspace,
    });
    let _open = Open::new(traffic, session.mode(), protocol);
    worker.metrics.negotiated.count(negotiated.0.unwrap_or("unknown"), negotiated.1.unwrap_or("unknown"));

    let site_table = shared.sites();
    // The one place the HTTP version is chosen: by what ALPN agreed.
    let end = match protocol {
        HttpVersion::Http2 => {
            let ctx = http::Context {
                peer,
                settings: &shared.h2,
                sites: site_table,
                log: &worker.log,
                shutdown: retire.clone(),
                alt_svc: alt_svc.as_deref(),
            };
            Box::pin(h2::serve(&mut session, ctx)).await
        }
        // ALPN over TCP never agrees on h3 (it is not offered there).
        HttpVersion::Http1 | HttpVersion::Http3 => {
            let ctx = http::Context {
                peer,
                settings: &shared.h1,
                sites: site_table,
                log: &worker.log,
                shutdown: retire,
                alt_svc: alt_svc.as_deref(),
            };
            Box::pin(h1::serve(&mut session, ctx)).await
        }
    };
    // A connection retired by a reload still lingers on close; only a stop cuts that short.
    session.linger_until(stop);
    session.count_into(stats);
    if let Ok(end) = tcp::read_end(session.socket()) {
        traffic.tcp_end(end);
    }
    match end {
        End::Done => Box::pin(session.close()).await,
        End::Timeout => Stats::bump(&stats.timeouts),
        End::Error(_) | End::Truncated | End::Aborted => Stats::bump(&stats.errors),
    }
}

/// Counts a connection as open in the worker's metrics until dropped, however
/// its task ends.
struct Open<'a> {
    traffic: &'a Traffic,
    layer: RecordLayer,
    protocol: HttpVersion,
}

impl<'a> Open<'a> {
    fn new(traffic: &'a Traffic, layer: RecordLayer, protocol: HttpVersion) -> Open<'a> {
        traffic.opened(layer, protocol);
        Open { traffic, layer, protocol }
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.traffic.closed(self.layer, self.protocol);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task that panics is uncounted, its panic counted, and a shutdown waiting
    /// for the worker to go idle is woken.
    #[test]
    fn panicking_task_is_uncounted() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let tasks = Rc::new(Tasks::default());
        let peer: SocketAddr = "192.0.2.1:4433".parse().unwrap();
        LocalSet::new().block_on(&rt, async {
            let (ok, panics) = (Active::new(tasks.clone(), peer), Active::new(tasks.clone(), peer));
            assert_eq!(tasks.active.get(), 2);
            let a = tokio::task::spawn_local(async move {
                let _active = ok;
                tokio::task::yield_now().await;
            });
            let b = tokio::task::spawn_local(async move {
                let _active = panics;
                tokio::task::yield_now().await;
                panic!("a bug in a connection task");
            });
            let idle = tokio::time::timeout(Duration::from_secs(5), async {
                while tasks.active.get() > 0 {
                    tasks.idle.notified().await;
                }
            });
            assert!(idle.await.is_ok(), "still {} active task(s)", tasks.active.get());
            assert!(a.await.is_ok());
            assert!(b.await.unwrap_err().is_panic());
        });
        assert_eq!((tasks.active.get(), tasks.panics.get()), (0, 1));
    }
}
