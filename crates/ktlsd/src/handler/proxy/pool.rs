//! Per-worker upstream state: idle keep-alive connections, requests in flight (for
//! least-connections), the round-robin position of each rule, and passive health (an
//! upstream that failed is skipped for the rule's `fail_timeout`). Each worker keeps
//! its own, as nginx's workers do without a shared zone: no lock on the request path.
//!
//! The choice itself ([`choose`]) is a pure function; the thread-local state lives
//! here. Connections in use and idle ones are counted in the worker's descriptor
//! ledger ([`crate::fds`]): an idle one is kept only when it has room, the oldest
//! are given back under pressure ([`release_idle`]), and held descriptors are given
//! back before a new connection is opened at a full budget. A drained upstream, or
//! one active health checks hold down ([`super::shared`]), is never picked; one the
//! checks bring back up is healthy again at once, whatever its passive mark. Not here: connecting or speaking HTTP.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::shared::Shared;
use super::upstream::Conn;
use super::{Balance, Failure, FailureKind, Rule};
use crate::fds;
use crate::handler::Status;

/// How long an idle upstream connection is kept (nginx's `keepalive_timeout` default).
const IDLE_FOR: Duration = Duration::from_secs(60);

/// One upstream's state in this worker.
#[derive(Default)]
struct State {
    idle: Vec<(Conn, Instant, fds::Counted)>,
    active: usize,
    /// The descriptor ledger's count of the connections in use (one per `active`).
    in_use: Vec<fds::Counted>,
    failed_until: Option<Instant>,
    /// The upstream's revivals by active checks when it was marked failed: a later
    /// revival clears the mark.
    failed_revivals: u64,
    /// What every worker shares of this upstream (its counts of pooled connections).
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Pools {
    upstreams: HashMap<String, State>,
    /// The next round-robin position of each rule (by its upstream list).
    turns: HashMap<String, usize>,
}

thread_local! {
    static POOLS: RefCell<Pools> = RefCell::default();
}

/// What [`choose`] knows of one upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub healthy: bool,
    pub active: usize,
    /// Already tried for this request.
    pub tried: bool,
}

/// The upstream to try next: among those not yet tried, the healthy ones (all of them
/// when none is healthy, so that a recovered upstream is found again, as nginx does);
/// by turn for round-robin (starting at `turn`), by fewest requests in flight for
/// least-connections (ties by turn). `None`: every one was tried.
pub fn choose(candidates: &[Candidate], balance: Balance, turn: usize) -> Option<usize> {
    let n = candidates.len();
    let untried: Vec<usize> = (0..n).map(|i| (turn + i) % n.max(1)).filter(|&i| !candidates[i].tried).collect();
    let healthy: Vec<usize> = untried.iter().copied().filter(|&i| candidates[i].healthy).collect();
    let pool = if healthy.is_empty() { untried } else { healthy };
    match balance {
        Balance::RoundRobin => pool.first().copied(),
        Balance::LeastConnections => pool.iter().copied().min_by_key(|&i| candidates[i].active),
    }
}

/// Picks the upstream of `rule` to try next (none of `tried`), counting the turn.
pub fn pick(rule: &Rule, tried: &[usize]) -> Option<usize> {
    let now = Instant::now();
    POOLS.with(|p| {
        let mut p = p.borrow_mut();
        // A rule of one upstream has no turn to keep (nor a key to build per request).
        let key = (rule.upstreams.len() > 1).then(|| rule.key());
        let turn = key.as_ref().and_then(|k| p.turns.get(k)).copied().unwrap_or(0);
        let candidates: Vec<Candidate> = rule
            .upstreams
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let s = p.upstreams.get(&u.url);
                let revived = |s: &State| u.shared.revivals() > s.failed_revivals;
                Candidate {
                    healthy: s.is_none_or(|s| s.failed_until.is_none_or(|t| t <= now) || revived(s)),
                    active: s.map_or(0, |s| s.active),
                    // A drained upstream, or one active checks hold down, gets no new
                    // request: as if already tried.
                    tried: tried.contains(&i) || u.shared.drained() || u.shared.check_down(),
                }
            })
            .collect();
        let chosen = choose(&candidates, rule.balance, turn)?;
        if let Some(key) = key {
            p.turns.insert(key, chosen + 1);
        }
        Some(chosen)
    })
}

/// Why [`pick`] found no upstream for a request none of whose attempts failed
/// (`upstream`, the URL the failure names): a 503 when every upstream is drained,
/// or drained or held down by its health checks (the operator's doing or the
/// checks' verdict: no upstream is there to fail); a 502 otherwise.
pub fn none_left(rule: &Rule, upstream: &str) -> Failure {
    let ups = &rule.upstreams;
    let (status, detail) = if ups.iter().all(|u| u.shared.drained()) {
        (Status::SERVICE_UNAVAILABLE, "every upstream is drained")
    } else if ups.iter().all(|u| u.shared.drained() || u.shared.check_down()) {
        (Status::SERVICE_UNAVAILABLE, "every upstream is down by its health checks")
    } else {
        (Status::BAD_GATEWAY, "no upstream left")
    };
    Failure { status, kind: FailureKind::Connect, upstream: upstream.to_string(), detail: detail.into() }
}

/// An idle connection to `upstream` (by its key) that still looks usable, if any.
/// When there is none (a new one is to be opened), held descriptors are given back
/// first if the worker's budget is full.
pub fn take_idle(key: &str) -> Option<Conn> {
    let found = POOLS.with(|p| {
        let mut p = p.borrow_mut();
        let s = p.upstreams.get_mut(key)?;
        let now = Instant::now();
        while let Some((conn, since, _)) = s.idle.pop() {
            s.shared.idle_add(-1);
            if now.duration_since(since) < IDLE_FOR && conn.looks_alive() {
                return Some(conn);
            }
        }
        None
    });
    if found.is_none() {
        fds::make_room(1);
    }
    found
}

/// Closes up to `n` idle connections (all for `usize::MAX`), the oldest of each
/// upstream first, and says how many: the descriptor ledger's release of idle
/// upstream connections. None while the pools are in use on this thread.
pub fn release_idle(n: usize) -> usize {
    POOLS.with(|p| {
        let Ok(mut p) = p.try_borrow_mut() else { return 0 };
        let mut closed = 0;
        for s in p.upstreams.values_mut() {
            let k = s.idle.len().min(n - closed);
            s.idle.drain(..k);
            s.shared.idle_add(-(k as i64));
            closed += k;
        }
        closed
    })
}

/// Returns a connection whose exchange completed, keeping at most `keep` idle
/// (none when the worker's descriptor budget has no room for it).
pub fn put_idle(key: &str, conn: Conn, keep: usize) {
    let room = fds::make_room(1);
    with_state(key, |s| {
        // Oldest first (connections are taken from the end): the expired ones lead.
        let now = Instant::now();
        let expired = s.idle.iter().take_while(|(_, since, _)| now.duration_since(*since) >= IDLE_FOR).count();
        s.idle.drain(..expired);
        s.shared.idle_add(-(expired as i64));
        if room && s.idle.len() < keep {
            s.idle.push((conn, now, fds::count(fds::Kind::IdleUpstream)));
            s.shared.idle_add(1);
        }
    });
}

/// Runs `f` on the state of `key`, created on first use (its name copied only then).
fn with_state<R>(key: &str, f: impl FnOnce(&mut State) -> R) -> R {
    POOLS.with(|p| {
        let mut p = p.borrow_mut();
        if let Some(s) = p.upstreams.get_mut(key) {
            return f(s);
        }
        let state = State { shared: super::shared::of(key), ..State::default() };
        f(p.upstreams.entry(key.to_string()).or_insert(state))
    })
}

/// Counts a request in flight to `key` (until [`finished`]).
pub fn started(key: &str) {
    with_state(key, |s| {
        s.active += 1;
        s.in_use.push(fds::count(fds::Kind::Upstream));
        s.shared.in_use_add(1);
    });
}

pub fn finished(key: &str) {
    POOLS.with(|p| {
        if let Some(s) = p.borrow_mut().upstreams.get_mut(key) {
            s.active = s.active.saturating_sub(1);
            if s.in_use.pop().is_some() {
                s.shared.in_use_add(-1);
            }
        }
    });
}

/// Marks `key` failed: it is skipped for `fail_timeout`; its idle connections go.
pub fn failed(key: &str, fail_timeout: Duration) {
    with_state(key, |s| {
        s.failed_until = Some(Instant::now() + fail_timeout);
        s.failed_revivals = s.shared.revivals();
        s.shared.idle_add(-(s.idle.len() as i64));
        s.idle.clear();
    });
}

/// Marks `key` healthy again after an answer.
pub fn succeeded(key: &str) {
    POOLS.with(|p| {
        if let Some(s) = p.borrow_mut().upstreams.get_mut(key) {
            s.failed_until = None;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices() {
        let c = |healthy, active, tried| Candidate { healthy, active, tried };
        let ok = c(true, 0, false);
        let rr = Balance::RoundRobin;
        let lc = Balance::LeastConnections;
        for (candidates, balance, turn, want) in [
            (vec![ok, ok, ok], rr, 0, Some(0)),
            (vec![ok, ok, ok], rr, 1, Some(1)),
            (vec![ok, ok, ok], rr, 5, Some(2)),
            (vec![ok, c(false, 0, false), ok], rr, 1, Some(2)),
            (vec![c(true, 0, true), ok], rr, 0, Some(1)),
            (vec![c(false, 0, false), c(false, 0, false)], rr, 1, Some(1)),
            (vec![c(true, 0, true), c(false, 0, false)], rr, 0, Some(1)),
            (vec![c(true, 0, true), c(false, 0, true)], rr, 0, None),
            (vec![c(true, 3, false), c(true, 1, false), c(true, 2, false)], lc, 0, Some(1)),
            (vec![c(true, 1, false), c(true, 1, false)], lc, 1, Some(1)),
            (vec![c(true, 3, false), c(false, 0, false)], lc, 0, Some(0)),
            (vec![], rr, 0, None),
        ] {
            assert_eq!(choose(&candidates, balance, turn), want, "{candidates:?} {balance:?} turn {turn}");
        }
    }
}
