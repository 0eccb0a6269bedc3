//! Active health checks (`[[proxy]] health_check`): one checker per upstream for
//! the whole process, whatever the number of workers or of rules that name it. It
//! sends `GET path` every `interval` (a new connection each time, `Connection:
//! close`, the whole check within `timeout`; to an HTTP/2 upstream, one stream on
//! a new HTTP/2 connection); `fails` failures in a row (no
//! connection, a timeout, an invalid answer or a status outside 200-399) mark the
//! upstream down in its shared entry ([`super::shared`]), which every worker reads
//! when it picks an upstream: a down one gets no request until `passes` checks in a
//! row pass. Each change is logged once and counted in the metrics.
//!
//! With passive health (a worker skips an upstream whose exchange failed for
//! `fail_timeout`): either one keeps an upstream out; an upstream the checks bring
//! back up is taken back at once by every worker, its passive marks forgotten.
//!
//! [`sync`] starts, keeps and stops the checkers to match a configuration (start-up
//! and each reload): a checker whose upstream and check are unchanged goes on with
//! its count; one no configuration names any more stops, and its upstream is no
//! longer held down. The checkers run on a thread of their own.
//!
//! Not here: choosing among upstreams ([`super::pool`]) or the status page.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::shared::Shared;
use super::{parse, upstream, Rule, TlsClient, Upstream};

/// One upstream's check, as `health_check = { ... }` gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// The origin-form target asked for (`/healthz`).
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    /// Failed checks in a row that mark an upstream down.
    pub fails: u32,
    /// Passed checks in a row that bring it back up.
    pub passes: u32,
}

/// The run of check results against an upstream's current state: a pure count,
/// the checker's only memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub up: bool,
    /// Results in a row that go against `up`.
    pub run: u32,
}

impl Default for Tally {
    /// Up until checks say otherwise, as nginx and Caddy start.
    fn default() -> Tally {
        Tally { up: true, run: 0 }
    }
}

impl Tally {
    /// Counts one check; the new state when it changed.
    pub fn count(&mut self, passed: bool, fails: u32, passes: u32) -> Option<bool> {
        if passed == self.up {
            self.run = 0;
            return None;
        }
        self.run += 1;
        let needed = if self.up { fails } else { passes };
        if self.run < needed.max(1) {
            return None;
        }
        self.up = passed;
        self.run = 0;
        Some(passed)
    }
}

/// What a checker needs; two equal ones are the same checker.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Spec {
    upstream: Upstream,
    check: HealthCheck,
    tls: Option<TlsClient>,
    /// The Host the check request carries: the rule's fixed host, else the upstream's.
    host: String,
}

struct Running {
    spec: Spec,
    task: tokio::task::AbortHandle,
    /// The generation the task writes its results under ([`Shared::check_start`]).
    generation: u64,
}

static RUNNING: Mutex<BTreeMap<String, Running>> = Mutex::new(BTreeMap::new());

/// The checkers' runtime: one thread, started with the first checker.
fn runtime() -> Option<&'static tokio::runtime::Handle> {
    static HANDLE: OnceLock<Option<tokio::runtime::Handle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| match crate::sys::event_loop_thread("ktlsd-health", std::future::pending::<()>) {
            Ok((_, handle)) => Some(handle),
            Err(e) => {
                tracing::error!("health checks: no thread: {e}; upstreams are checked passively only");
                None
            }
        })
        .as_ref()
}

/// Starts, keeps or stops the checkers so that exactly the upstreams some rule of
/// `rules` checks have one (the first rule naming an upstream with a
/// `health_check` gives its check).
pub fn sync<'r>(rules: impl IntoIterator<Item = &'r Rule>) {
    let mut wanted: BTreeMap<String, Spec> = BTreeMap::new();
    for rule in rules {
        let Some(check) = &rule.health_check else { continue };
        for u in &rule.upstreams {
            let host = super::host_for(rule, u, None).to_string();
            let spec = Spec { upstream: u.clone(), check: check.clone(), tls: rule.tls.clone(), host };
            match wanted.get(&u.url) {
                Some(first) if first.check != spec.check => tracing::warn!(
                    "health check of upstream {}: two rules check it differently; the first one's check is used",
                    u.url
                ),
                Some(_) => {}
                None => {
                    wanted.insert(u.url.clone(), spec);
                }
            }
        }
    }
    let mut running = RUNNING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let stale: Vec<String> =
        running.iter().filter(|(url, r)| wanted.get(*url) != Some(&r.spec)).map(|(url, _)| url.clone()).collect();
    for url in stale {
        if let Some(r) = running.remove(&url) {
            r.task.abort();
            r.spec.upstream.shared.check_stop(r.generation);
            super::metrics::unchecked(&url);
            tracing::info!("health checks of upstream {url} stopped");
        }
    }
    for (url, spec) in wanted {
        if running.contains_key(&url) {
            continue;
        }
        let Some(rt) = runtime() else { return };
        let shared = spec.upstream.shared.0.clone();
        let generation = shared.check_start();
        let task = rt.spawn(checker(spec.clone(), shared, generation)).abort_handle();
        tracing::info!(
            "health checks of upstream {url}: GET {} every {:?} (down after {} failures, up after {} passes)",
            spec.check.path,
            spec.check.interval,
            spec.check.fails,
            spec.check.passes
        );
        running.insert(url, Running { spec, task, generation });
    }
}

/// Checks one upstream every interval, for ever (until aborted).
///
/// # Cancel safety
/// Cancel-safe: a check under way is dropped with its connection; results are
/// written whole under the shared entry's lock.
async fn checker(spec: Spec, shared: Arc<Shared>, generation: u64) {
    let check = &spec.check;
    let mut tally = Tally::default();
    let mut ticks = tokio::time::interval(check.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let started = Instant::now();
        let result = check_once(&spec).await;
        let passed = result.is_ok();
        let change = tally.count(passed, check.fails, check.passes);
        let detail = match &result {
            Ok(status) => format!("{status} in {} ms", started.elapsed().as_millis()),
            Err(why) => why.clone(),
        };
        if !shared.check_result(generation, passed, tally.up, &detail) {
            return; // stopped by a reload
        }
        super::metrics::checked(&spec.upstream.url, passed, tally.up);
        let url = &spec.upstream.url;
        match change {
            Some(false) => tracing::warn!(
                "upstream {url} is down: {} health checks in a row failed (GET {}: {detail}); \
                 no request goes to it until {} pass",
                check.fails,
                check.path,
                check.passes
            ),
            Some(true) => tracing::warn!(
                "upstream {url} is up again: {} health checks in a row passed (GET {}: {detail})",
                check.passes,
                check.path
            ),
            None => tracing::debug!("health check of upstream {url}: GET {}: {detail}", check.path),
        }
    }
}

/// One check: the status of the answer when it passes (200 to 399), else why not.
///
/// # Cancel safety
/// Cancel-safe: dropping it closes the connection.
async fn check_once(spec: &Spec) -> Result<u16, String> {
    let check = &spec.check;
    let run = async {
        if spec.upstream.h2 {
            return check_h2(spec).await;
        }
        let mut conn = upstream::connect(&spec.upstream, spec.tls.as_ref(), check.timeout)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: ktlsd-health-check\r\nAccept: */*\r\nConnection: close\r\n\r\n",
            check.path, spec.host
        );
        conn.write_all(request.as_bytes(), check.timeout).await.map_err(|e| format!("sending the request: {e}"))?;
        let mut buf = Vec::new();
        loop {
            match parse::head_for(&buf, "GET", false) {
                Ok(Some((head, used))) if head.status < 200 => {
                    buf.drain(..used);
                    continue;
                }
                Ok(Some((head, _))) => return verdict(head.status),
                Ok(None) => {}
                Err(parse::Invalid(why)) => return Err(format!("invalid response: {why}")),
            }
            let room = parse::MAX_HEAD + 1 - buf.len().min(parse::MAX_HEAD);
            match conn.read(&mut buf, room, check.timeout).await {
                Ok(0) => return Err("closed the connection before a response head".into()),
                Ok(_) => {}
                Err(e) => return Err(format!("waiting for the response: {e}")),
            }
        }
    };
    match tokio::time::timeout(check.timeout, run).await {
        Ok(r) => r,
        Err(_) => Err(format!("timed out after {:?}", check.timeout)),
    }
}

/// One check of an HTTP/2 upstream (`h2c://`, `h2://`, `unix+h2c:`), without its
/// time limit: a new connection, the HTTP/2 preface and settings, `GET path` as one stream, its
/// final answer's status; the connection is closed after.
///
/// # Cancel safety
/// Cancel-safe: the connection and its driver are dropped together.
async fn check_h2(spec: &Spec) -> Result<u16, String> {
    let check = &spec.check;
    let conn = upstream::connect(&spec.upstream, spec.tls.as_ref(), check.timeout)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (send, driver) = h2::client::Builder::new()
        .enable_push(false)
        .max_header_list_size(64 * 1024)
        .handshake::<_, bytes::Bytes>(conn)
        .await
        .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
    let scheme = if spec.upstream.tls { "https" } else { "http" };
    let request = http::Request::get(format!("{scheme}://{}{}", spec.host, check.path))
        .header(http::header::USER_AGENT, "ktlsd-health-check")
        .header(http::header::ACCEPT, "*/*")
        .body(())
        .map_err(|e| format!("the request: {e}"))?;
    let ask = async {
        let mut send = send.ready().await?;
        let (response, _) = send.send_request(request, true)?;
        response.await
    };
    // The driver moves the connection's frames while the answer is awaited; it
    // ends only with the connection.
    tokio::select! {
        r = ask => match r {
            Ok(response) => verdict(response.status().as_u16()),
            Err(e) => Err(format!("waiting for the response: {e}")),
        },
        r = driver => Err(match r {
            Ok(()) => "closed the connection before a response head".to_string(),
            Err(e) => format!("the connection failed: {e}"),
        }),
    }
}

/// Whether an answer's status passes: 2xx and 3xx do, as nginx's and Caddy's defaults.
fn verdict(status: u16) -> Result<u16, String> {
    match status {
        200..=399 => Ok(status),
        _ => Err(format!("status {status}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tallies() {
        // (results, fails, passes): the state after each result.
        for (results, fails, passes, want) in [
            (&[true, true][..], 2, 2, &[true, true][..]),
            (&[false][..], 2, 2, &[true][..]),
            (&[false, false][..], 2, 2, &[true, false][..]),
            (&[false, true, false][..], 2, 2, &[true, true, true][..]),
            (&[false, false, true, false, true, true][..], 2, 2, &[true, false, false, false, false, true][..]),
            (&[false, true][..], 1, 1, &[false, true][..]),
            (&[false, false, false, true][..], 3, 1, &[true, true, false, true][..]),
            // 0 is taken as 1: one result always counts.
            (&[false][..], 0, 0, &[false][..]),
        ] {
            let mut t = Tally::default();
            let got: Vec<bool> = results
                .iter()
                .map(|&r| {
                    let before = t.up;
                    let change = t.count(r, fails, passes);
                    assert_eq!(change.is_some(), before != t.up, "{results:?}");
                    t.up
                })
                .collect();
            assert_eq!(got, want, "{results:?} fails {fails} passes {passes}");
        }
    }

    #[test]
    fn verdicts() {
        for (status, pass) in
            [(200, true), (204, true), (301, true), (399, true), (400, false), (404, false), (500, false), (503, false)]
        {
            assert_eq!(verdict(status).is_ok(), pass, "{status}");
        }
    }
}
