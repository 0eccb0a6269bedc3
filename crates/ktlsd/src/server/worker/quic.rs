//! A worker's HTTP/3 side: one quinn endpoint per UDP socket on the worker's event
//! loop, each new client admitted (or asked for a Retry, or refused) against the
//! same connection cap as TCP, its handshake bounded by the handshake timeout, and
//! its connection served by `http::h3` as a local task counted like a TCP one.
//!
//! A reload reaches new clients: each is accepted with the QUIC configuration in
//! force when its first packet is taken; connections under way keep theirs. Not
//! here: the QUIC configuration and keys (`crate::quic`).

use std::cell::Cell;
use std::net::{SocketAddr, UdpSocket};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{log_suppressed_handshakes, Active, Open, Worker};
use crate::http::{self, End};
use crate::quic::{self, Admit};
use crate::server::Shared;
use crate::stats::Stats;
use crate::vocab::{HttpVersion, RecordLayer};

/// HTTP/3's H3_NO_ERROR (RFC 9114 section 8.1), the code a connection is closed with.
const H3_NO_ERROR: quinn::VarInt = quinn::VarInt::from_u32(0x100);

/// How long a connection ended by shutdown waits for its CONNECTION_CLOSE to leave.
const CLOSE_FLUSH: Duration = Duration::from_millis(200);

/// The `Alt-Svc` value that points HTTP/1.1 and HTTP/2 clients to HTTP/3 on `port`
/// for a day (as nginx's documentation and Caddy send it).
pub(super) fn alt_svc(port: u16) -> String {
    format!("h3=\":{port}\"; ma=86400")
}

/// Starts an endpoint on each socket and its accept loop; a socket that cannot
/// become an endpoint is logged and left out (TCP still serves).
pub(super) fn start(sockets: Vec<UdpSocket>, worker: &Rc<Worker>, stop: &watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
    let shared = worker.shared.borrow().clone();
    let Some(h3) = &shared.http3 else { return Vec::new() };
    let mut loops = Vec::new();
    for socket in sockets {
        let addr = socket.local_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
        let runtime = Arc::new(quinn::TokioRuntime);
        match quinn::Endpoint::new(h3.keys.endpoint_config(), Some((*h3.quic).clone()), socket, runtime) {
            Ok(endpoint) => {
                loops.push(tokio::task::spawn_local(accept_loop(endpoint, worker.clone(), stop.clone())));
            }
            Err(e) => tracing::error!("HTTP/3 on UDP {addr}: cannot start the QUIC endpoint: {e}"),
        }
    }
    loops
}

/// Takes new clients until aborted.
async fn accept_loop(endpoint: quinn::Endpoint, worker: Rc<Worker>, stop: watch::Receiver<bool>) {
    let mut in_force: Option<Arc<quinn::ServerConfig>> = None;
    let handshaking = Rc::new(Cell::new(0usize));
    while let Some(incoming) = endpoint.accept().await {
        // A client that arrives after a reload gets it, even before the update task runs.
        worker.refresh();
        let shared = worker.shared.borrow().clone();
        let Some(h3) = &shared.http3 else {
            // HTTP/3 is on only from start-up; a configuration without it keeps the sockets idle.
            incoming.refuse();
            continue;
        };
        if !in_force.as_ref().is_some_and(|c| Arc::ptr_eq(c, &h3.quic)) {
            // Retry tokens are issued and checked with the configuration's key.
            endpoint.set_server_config(Some((*h3.quic).clone()));
            in_force = Some(h3.quic.clone());
        }
        let cap = shared.config.max_connections.map_or(worker.default_cap, |n| n.get());
        let active = worker.tasks.active.get();
        let peer = incoming.remote_address();
        let validated = incoming.remote_address_validated();
        let load = quic::Load { active, cap, handshaking: handshaking.get() };
        match quic::admit(h3.settings.retry, validated, incoming.may_retry(), load) {
            Admit::Refuse => {
                Stats::bump(&worker.metrics.stats.connections_refused);
                incoming.refuse();
                let (log, _) = worker.refusal_log.check(Instant::now());
                if log {
                    tracing::warn!("refused the HTTP/3 client {peer}: this worker holds max_connections {cap}");
                }
                continue;
            }
            Admit::Retry => {
                if let Err(e) = incoming.retry() {
                    tracing::debug!("no Retry for {peer}: {e}");
                }
                continue;
            }
            Admit::Accept => {}
        }
        let active = Active::new(worker.tasks.clone(), peer);
        let w = worker.clone();
        let stop = stop.clone();
        let endpoint = endpoint.clone();
        let handshake = Handshaking::new(&handshaking);
        tokio::task::spawn_local(async move {
            let _active = active;
            connection(incoming, peer, &w, &shared, stop.clone(), handshake).await;
            if *stop.borrow() {
                // Lets the endpoint send the connection's CONNECTION_CLOSE before the worker's loop ends.
                let _ = tokio::time::timeout(CLOSE_FLUSH, endpoint.wait_idle()).await;
            }
        });
    }
}

/// One handshake under way, counted in the accept loop's figure while it lives.
struct Handshaking(Rc<Cell<usize>>);

impl Handshaking {
    fn new(count: &Rc<Cell<usize>>) -> Handshaking {
        count.set(count.get() + 1);
        Handshaking(count.clone())
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

/// One QUIC connection: handshake, then HTTP/3 until it ends.
async fn connection(
    incoming: quinn::Incoming,
    peer: SocketAddr,
    worker: &Worker,
    shared: &Shared,
    stop: watch::Receiver<bool>,
    handshake: Handshaking,
) {
    let Some(h3) = &shared.http3 else { return };
    let stats = &worker.metrics.stats;
    let traffic = &worker.metrics.traffic;
    let done = quic::handshake(incoming, h3.quic.clone(), h3.settings.handshake_timeout).await;
    drop(handshake);
    let conn = match done {
        Ok(c) => c,
        Err(e) => {
            Stats::bump(&stats.handshake_failures);
            Stats::bump(match e {
                quic::HandshakeError::Timeout => &stats.handshake_timeouts,
                quic::HandshakeError::Connection(_) => &stats.handshake_protocol_errors,
            });
            let (log, suppressed) = worker.handshake_log.check(Instant::now());
            log_suppressed_handshakes(suppressed);
            if log {
                tracing::info!("QUIC handshake with {peer} failed: {e}");
            }
            return;
        }
    };
    Stats::bump(&traffic.handshakes_ok);
    let handle = conn.clone();
    let _open = Open::new(traffic, RecordLayer::Quic, HttpVersion::Http3);
    // QUIC is TLS 1.3 only; quinn does not name the suite it agreed.
    worker.metrics.negotiated.count("TLSv1_3", "QUIC");
    let ctx = http::Context {
        peer,
        settings: &h3.h3,
        sites: shared.sites(),
        log: &worker.log,
        shutdown: stop,
        alt_svc: None,
    };
    let end = http::h3::serve(h3_quinn::Connection::new(conn), ctx).await;
    // After GOAWAY and the last response, or a failure: the connection is closed now,
    // not when its idle timeout runs out on the client's side (a close already made,
    // such as H3_EXCESSIVE_LOAD's, stands).
    handle.close(H3_NO_ERROR, b"");
    match end {
        End::Done => {}
        End::Timeout => Stats::bump(&stats.timeouts),
        End::Error(e) => {
            tracing::debug!("HTTP/3 connection with {peer} failed: {e}");
            Stats::bump(&stats.errors);
        }
        End::Truncated | End::Aborted => Stats::bump(&stats.errors),
    }
}
