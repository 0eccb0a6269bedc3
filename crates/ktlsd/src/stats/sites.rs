//! Figures by site and for the server as a whole that the per-worker arrays do
//! not hold: requests and body bytes per site (labelled by the site's first
//! configured name, `default` or `unknown`, so the configured sites bound the
//! labels), the reloads' outcomes, and the certificates' ends per site.
//!
//! Per-site counters are a small map behind a mutex that only its worker
//! locks, except for a scrape; the reload counters are process-wide atomics
//! written by the main thread. Not the rendering of the rest (see `prometheus`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};

use super::traffic::STATUS_CLASSES;

/// Most site labels one worker keeps; a request for another counts under `other`.
/// Labels are configured names, so this is only reached by configurations of
/// more sites than this, or many reloads that rename them.
pub const MAX_SITES: usize = 256;

/// One site's requests by status class and its body bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SiteCount {
    pub requests: [u64; 5],
    pub bytes: u64,
}

/// Requests and bytes by site.
#[derive(Debug, Default)]
pub struct SiteCounters {
    by_site: Mutex<BTreeMap<String, SiteCount>>,
}

impl SiteCounters {
    /// One answered request of `site`.
    pub fn count(&self, site: &str, status: u16, bytes: u64) {
        let mut map = self.by_site.lock().unwrap_or_else(PoisonError::into_inner);
        let key = if map.contains_key(site) || map.len() < MAX_SITES { site } else { "other" };
        let c = match map.get_mut(key) {
            Some(c) => c,
            None => map.entry(key.to_string()).or_default(),
        };
        c.requests[super::traffic::class_index(status)] += 1;
        c.bytes += bytes;
    }

    /// Adds `other`'s figures to these.
    pub fn add(&self, other: &SiteCounters) {
        let theirs = other.snapshot();
        let mut mine = self.by_site.lock().unwrap_or_else(PoisonError::into_inner);
        for (site, c) in theirs {
            let m = mine.entry(site).or_default();
            for (a, b) in m.requests.iter_mut().zip(c.requests) {
                *a += b;
            }
            m.bytes += c.bytes;
        }
    }

    pub fn snapshot(&self) -> BTreeMap<String, SiteCount> {
        self.by_site.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// How the reloads went since start-up.
pub struct Reloads {
    pub succeeded: AtomicU64,
    pub failed: AtomicU64,
    /// 1 when the last reload succeeded (or none was tried), 0 when it failed.
    pub last_ok: AtomicU64,
    /// When the configuration now served was loaded (Unix seconds).
    pub last_success_at: AtomicU64,
}

/// The process's reload outcomes, written by the main thread.
pub static RELOADS: Reloads = Reloads {
    succeeded: AtomicU64::new(0),
    failed: AtomicU64::new(0),
    last_ok: AtomicU64::new(1),
    last_success_at: AtomicU64::new(0),
};

impl Reloads {
    /// Records start-up's or a reload's successful load of the configuration.
    pub fn loaded(&self, reload: bool) {
        if reload {
            self.succeeded.fetch_add(1, Relaxed);
        }
        self.last_ok.store(1, Relaxed);
        self.last_success_at.store(unix_now(), Relaxed);
    }

    pub fn failed(&self) {
        self.failed.fetch_add(1, Relaxed);
        self.last_ok.store(0, Relaxed);
    }
}

/// One load of the configuration: start-up's or a reload's.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReloadEvent {
    /// When (Unix seconds).
    pub at: u64,
    /// `start` or `reload`.
    pub kind: &'static str,
    /// Whether the configuration was loaded (a failed reload keeps the one before).
    pub ok: bool,
    /// The digest of the effective configuration loaded (`ktlsd config`'s text).
    pub config_hash: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
}

/// Most loads [`RELOAD_LOG`] keeps (the newest).
pub const RELOAD_LOG_LEN: usize = 16;

/// The latest loads of the configuration, oldest first.
pub static RELOAD_LOG: Mutex<std::collections::VecDeque<ReloadEvent>> = Mutex::new(std::collections::VecDeque::new());

/// Records a load of the configuration in [`RELOAD_LOG`].
pub fn reload_event(kind: &'static str, ok: bool, config_hash: Option<String>, error: Option<String>) {
    let mut log = RELOAD_LOG.lock().unwrap_or_else(PoisonError::into_inner);
    if log.len() == RELOAD_LOG_LEN {
        log.pop_front();
    }
    log.push_back(ReloadEvent { at: unix_now(), kind, ok, config_hash, error });
}

/// A copy of [`RELOAD_LOG`].
pub fn reload_log() -> Vec<ReloadEvent> {
    RELOAD_LOG.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect()
}

/// One ACME site's progress, as its task reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct AcmeStatus {
    /// `ordering` (no certificate from the CA yet: the placeholder is served),
    /// `valid` (a certificate from the CA is served), `failing` (the last order
    /// failed; retrying).
    pub state: &'static str,
    /// Orders that failed since start-up.
    pub errors: u64,
    /// The last failure, as logged.
    pub last_error: Option<String>,
    /// When it happened (Unix seconds).
    pub last_error_at: Option<u64>,
}

/// The states `ktlsd_acme_order_state` reports.
pub const ACME_STATES: [&str; 3] = ["ordering", "valid", "failing"];

/// Each ACME site's status by site label, written by the ACME tasks.
pub static ACME: Mutex<BTreeMap<String, AcmeStatus>> = Mutex::new(BTreeMap::new());

/// Records that the ACME site `site` is now in `state` (one of [`ACME_STATES`]).
pub fn acme_state(site: &str, state: &'static str) {
    let mut all = ACME.lock().unwrap_or_else(PoisonError::into_inner);
    all.entry(site.to_string()).or_default().state = state;
}

/// Records a failed order of `site`.
pub fn acme_error(site: &str, error: String) {
    let mut all = ACME.lock().unwrap_or_else(PoisonError::into_inner);
    let s = all.entry(site.to_string()).or_default();
    s.state = "failing";
    s.errors += 1;
    s.last_error = Some(error);
    s.last_error_at = Some(unix_now());
}

/// Forgets the ACME sites not in `keep` (removed by a reload).
pub fn acme_retain(keep: &[String]) {
    ACME.lock().unwrap_or_else(PoisonError::into_inner).retain(|site, _| keep.contains(site));
}

/// A copy of every ACME site's status.
pub fn acme_snapshot() -> BTreeMap<String, AcmeStatus> {
    ACME.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Appends the per-site families, the reload families and, for each site, the
/// end of the certificate it serves now (`certificates`: site label, Unix seconds).
pub fn render(out: &mut String, sites: &SiteCounters, reloads: &Reloads, certificates: &[(String, i64)]) {
    let esc = super::prometheus::escape;
    let counts = sites.snapshot();
    super::prometheus::family(
        out,
        "ktlsd_site_requests_total",
        "counter",
        "HTTPS requests answered, by site and status class.",
    );
    for (site, c) in &counts {
        for (class, n) in STATUS_CLASSES.iter().zip(c.requests) {
            let _ = writeln!(out, "ktlsd_site_requests_total{{site=\"{}\",code=\"{class}\"}} {n}", esc(site));
        }
    }
    by_site(
        out,
        ("ktlsd_site_sent_body_bytes_total", "counter", "Response body bytes sent over HTTPS, by site."),
        counts.iter().map(|(site, c)| (site.as_str(), c.bytes)),
    );
    by_site(
        out,
        (
            "ktlsd_certificate_expiry_timestamp_seconds",
            "gauge",
            "When the certificate each site serves now stops being valid (Unix seconds; notAfter).",
        ),
        certificates.iter().map(|(site, not_after)| (site.as_str(), not_after)),
    );
    render_acme(out, &acme_snapshot());
    super::prometheus::family(out, "ktlsd_reloads_total", "counter", "Reloads (SIGHUP), by result.");
    let _ = writeln!(out, "ktlsd_reloads_total{{result=\"success\"}} {}", reloads.succeeded.load(Relaxed));
    let _ = writeln!(out, "ktlsd_reloads_total{{result=\"failure\"}} {}", reloads.failed.load(Relaxed));
    super::prometheus::family(
        out,
        "ktlsd_config_last_reload_successful",
        "gauge",
        "1 when the last reload succeeded (or none was tried), 0 when it failed and the previous configuration is served.",
    );
    let _ = writeln!(out, "ktlsd_config_last_reload_successful {}", reloads.last_ok.load(Relaxed));
    super::prometheus::family(
        out,
        "ktlsd_config_last_reload_success_timestamp_seconds",
        "gauge",
        "When the configuration now served was loaded (Unix seconds).",
    );
    let _ =
        writeln!(out, "ktlsd_config_last_reload_success_timestamp_seconds {}", reloads.last_success_at.load(Relaxed));
}

/// The ACME families: each site's state (1 for the current one) and its failures.
fn render_acme(out: &mut String, acme: &BTreeMap<String, AcmeStatus>) {
    let esc = super::prometheus::escape;
    super::prometheus::family(
        out,
        "ktlsd_acme_order_state",
        "gauge",
        "Each ACME site's state: ordering (placeholder served), valid (CA certificate served), failing (last order failed; retrying).",
    );
    for (site, s) in acme {
        for state in ACME_STATES {
            let on = u8::from(s.state == state);
            let _ = writeln!(out, "ktlsd_acme_order_state{{site=\"{}\",state=\"{state}\"}} {on}", esc(site));
        }
    }
    by_site(
        out,
        ("ktlsd_acme_errors_total", "counter", "Failed ACME orders, by site (the last error is in /status)."),
        acme.iter().map(|(site, s)| (site.as_str(), s.errors)),
    );
    by_site(
        out,
        (
            "ktlsd_acme_last_error_timestamp_seconds",
            "gauge",
            "When each ACME site's last order failed (Unix seconds; 0: never).",
        ),
        acme.iter().map(|(site, s)| (site.as_str(), s.last_error_at.unwrap_or(0))),
    );
}

/// One family labelled by site: its HELP and TYPE lines (`family`: name, kind,
/// help), then one sample per `(site, value)`.
fn by_site<V: std::fmt::Display>(
    out: &mut String,
    (name, kind, help): (&str, &str, &str),
    samples: impl Iterator<Item = (impl AsRef<str>, V)>,
) {
    super::prometheus::family(out, name, kind, help);
    for (site, value) in samples {
        let _ = writeln!(out, "{name}{{site=\"{}\"}} {value}", super::prometheus::escape(site.as_ref()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sites_are_counted_and_summed() {
        let (a, b) = (SiteCounters::default(), SiteCounters::default());
        a.count("a.test", 200, 10);
        a.count("a.test", 404, 5);
        b.count("a.test", 200, 1);
        b.count("default", 301, 0);
        let total = SiteCounters::default();
        total.add(&a);
        total.add(&b);
        let s = total.snapshot();
        assert_eq!(s["a.test"], SiteCount { requests: [0, 2, 0, 1, 0], bytes: 16 });
        assert_eq!(s["default"].requests, [0, 0, 1, 0, 0]);
    }

    #[test]
    fn labels_are_bounded() {
        let c = SiteCounters::default();
        for i in 0..MAX_SITES + 10 {
            c.count(&format!("s{i}.test"), 200, 1);
        }
        let s = c.snapshot();
        assert_eq!(s.len(), MAX_SITES + 1);
        assert_eq!(s["other"].requests[1], 10);
    }

    #[test]
    fn acme_families() {
        let mut acme = BTreeMap::new();
        acme.insert(
            "a.test".to_string(),
            AcmeStatus { state: "failing", errors: 2, last_error: Some("x".into()), last_error_at: Some(7) },
        );
        let mut out = String::new();
        render_acme(&mut out, &acme);
        for line in [
            "ktlsd_acme_order_state{site=\"a.test\",state=\"failing\"} 1",
            "ktlsd_acme_order_state{site=\"a.test\",state=\"valid\"} 0",
            "ktlsd_acme_errors_total{site=\"a.test\"} 2",
            "ktlsd_acme_last_error_timestamp_seconds{site=\"a.test\"} 7",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
    }

    #[test]
    fn rendered_families() {
        let c = SiteCounters::default();
        c.count("a\"b", 500, 3);
        let r = Reloads {
            succeeded: AtomicU64::new(2),
            failed: AtomicU64::new(1),
            last_ok: AtomicU64::new(0),
            last_success_at: AtomicU64::new(1_700_000_000),
        };
        let mut out = String::new();
        render(&mut out, &c, &r, &[("default".into(), 1_800_000_000)]);
        for line in [
            "ktlsd_site_requests_total{site=\"a\\\"b\",code=\"5xx\"} 1",
            "ktlsd_site_sent_body_bytes_total{site=\"a\\\"b\"} 3",
            "ktlsd_certificate_expiry_timestamp_seconds{site=\"default\"} 1800000000",
            "ktlsd_reloads_total{result=\"success\"} 2",
            "ktlsd_reloads_total{result=\"failure\"} 1",
            "ktlsd_config_last_reload_successful 0",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
    }
}
