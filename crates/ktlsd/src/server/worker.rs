//! A worker: one thread, one single-threaded event loop, its own listeners, access
//! log and counters. Each accepted connection runs as a local task through
//! handshake -> record layer choice -> HTTP.

use std::cell::Cell;
use std::fs::File;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::fd::AsFd;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::LocalSet;

use super::stats::Stats;
use super::Shared;
use crate::body::{tcp, RecordSizer};
use crate::http::conn::{self, End};
use crate::log::AccessLog;
use crate::tls::handshake::{self, HandshakeError};
use crate::tls::kernel::KernelTls;
use crate::tls::userspace::UserspaceTls;
use crate::tls::{self, Session};

/// Everything a connection task borrows from its worker.
struct Worker {
    shared: Arc<Shared>,
    log: AccessLog,
    stats: Stats,
    active: Cell<usize>,
    idle: Notify,
}

pub fn spawn(
    id: usize,
    listeners: Vec<StdListener>,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
    log_out: Option<File>,
) -> anyhow::Result<JoinHandle<Stats>> {
    std::thread::Builder::new()
        .name(format!("ktlsd-worker-{id}"))
        .spawn(move || run(listeners, shared, stop, log_out))
        .context("cannot start a worker thread")
}

fn run(listeners: Vec<StdListener>, shared: Arc<Shared>, stop: watch::Receiver<bool>, log_out: Option<File>) -> Stats {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("worker cannot start its event loop: {e}");
            return Stats::default();
        }
    };
    let shutdown_timeout = shared.config.timeouts.shutdown;
    let worker = Rc::new(Worker {
        shared,
        log: AccessLog::new(log_out),
        stats: Stats::default(),
        active: Cell::new(0),
        idle: Notify::new(),
    });
    let local = LocalSet::new();
    local.block_on(&rt, {
        let worker = worker.clone();
        async move {
            let mut accepting = Vec::new();
            for l in listeners {
                match TcpListener::from_std(l) {
                    Ok(l) => accepting.push(tokio::task::spawn_local(accept_loop(l, worker.clone(), stop.clone()))),
                    Err(e) => tracing::error!("worker cannot use its listener: {e}"),
                }
            }
            let flusher = tokio::task::spawn_local({
                let worker = worker.clone();
                async move {
                    let mut tick = tokio::time::interval(Duration::from_millis(200));
                    loop {
                        tick.tick().await;
                        worker.log.flush();
                    }
                }
            });

            let mut stop = stop;
            let _ = stop.wait_for(|s| *s).await;
            for a in &accepting {
                a.abort();
            }
            // In-flight connections finish their current response, bounded in time.
            let drained = tokio::time::timeout(shutdown_timeout, async {
                while worker.active.get() > 0 {
                    worker.idle.notified().await;
                }
            })
            .await;
            if drained.is_err() {
                tracing::warn!("{} connection(s) still busy after the shutdown timeout; closing them", worker.active.get());
            }
            flusher.abort();
        }
    });
    drop(local);
    worker.log.flush();
    let total = Stats::default();
    total.add(&worker.stats);
    total
}

async fn accept_loop(listener: TcpListener, worker: Rc<Worker>, stop: watch::Receiver<bool>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                Stats::bump(&worker.stats.connections);
                worker.active.set(worker.active.get() + 1);
                let w = worker.clone();
                let stop = stop.clone();
                tokio::task::spawn_local(async move {
                    connection(stream, peer, &w, stop).await;
                    w.active.set(w.active.get() - 1);
                    if w.active.get() == 0 {
                        w.idle.notify_waiters();
                    }
                });
            }
            Err(e) => {
                // EMFILE/ENFILE and friends: back off instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn connection(stream: TcpStream, peer: SocketAddr, worker: &Worker, stop: watch::Receiver<bool>) {
    let shared = &worker.shared;
    let cfg = &shared.config;
    let stats = &worker.stats;
    let _ = stream.set_nodelay(true);
    if let Some(lowat) = cfg.tcp.notsent_lowat {
        let _ = tcp::set_notsent_lowat(stream.as_fd(), lowat);
    }
    if let Some(cc) = &cfg.tcp.congestion {
        let _ = tcp::set_congestion(stream.as_fd(), cc);
    }

    let established = match handshake::accept(&stream, shared.tls.clone(), cfg.timeouts.handshake).await {
        Ok(e) => e,
        Err(e) => {
            match e {
                HandshakeError::Timeout => Stats::bump(&stats.handshake_timeouts),
                _ => Stats::bump(&stats.handshake_failures),
            }
            tracing::debug!("handshake with {peer} failed: {e}");
            return;
        }
    };

    let conn = established.conn;
    let sizer = RecordSizer::new(cfg.record_policy, tls::record_expansion(&conn));
    let kernel_can = shared.ktls.as_ref().zip(conn.negotiated_cipher_suite()).is_some_and(|(k, s)| k.supports_both(s))
        // Attaching the ULP can still fail for this socket (e.g. the client already
        // sent FIN); then the connection simply stays in user space.
        && KernelTls::prepare(&stream, &conn).inspect_err(|e| tracing::debug!("kTLS not used for {peer}: {e}")).is_ok();
    let mut session = if kernel_can {
        let cap = shared.ktls.as_ref().and_then(|k| k.record_cap(cfg.record_policy));
        match KernelTls::install(&stream, conn, cap) {
            Ok(k) => {
                Stats::bump(&stats.ktls);
                Session::kernel(stream, k, sizer, cfg.timeouts.send)
            }
            Err(e) => {
                // The rustls state went to the kernel attempt; this connection cannot continue.
                Stats::bump(&stats.ktls_install_failures);
                tracing::warn!("kernel TLS install failed for {peer}: {e}");
                return;
            }
        }
    } else {
        Stats::bump(&stats.userspace);
        Session::userspace(stream, UserspaceTls::new(conn), sizer, cfg.timeouts.send)
    };

    let end = conn::serve(&mut session, shared, &worker.log, peer, stop).await;
    session.count_into(stats);
    match end {
        End::Done => session.close().await,
        End::Timeout => Stats::bump(&stats.timeouts),
        End::Error => Stats::bump(&stats.errors),
    }
}
