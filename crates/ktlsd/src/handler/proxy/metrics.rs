//! The proxy's figures for `/metrics`: requests per upstream, failures by kind,
//! time to the upstream's response head, each upstream's health as this process last
//! saw it (passively, and by its active health checks), body bytes relayed from upstreams by how they moved (copied through user
//! space, or spliced), and the bytes of cache-hit bodies by how they left (sendfile
//! from the entry, or copied).
//!
//! Process-wide (one lock, taken once per exchange and per scrape), unlike the
//! per-worker `stats`: upstream names are only known from the configuration.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use crate::vocab::BodyPath;

/// Upper bounds of the latency histogram, in milliseconds.
const BOUNDS_MS: [u64; 10] = [1, 2, 5, 10, 25, 50, 100, 250, 1000, 5000];

#[derive(Default)]
struct Upstream {
    requests: u64,
    up: bool,
    latency: [u64; BOUNDS_MS.len() + 1],
    latency_sum_us: u64,
    /// Failed exchanges by kind.
    errors: BTreeMap<&'static str, u64>,
    /// Whether an exchange has been tried with it at all.
    seen: bool,
    /// Active health checks: `Some(up)` once one ran.
    checked_up: Option<bool>,
    /// Active health checks by result: passed, failed.
    checks: [u64; 2],
}

#[derive(Default)]
struct Figures {
    upstreams: BTreeMap<String, Upstream>,
    errors: BTreeMap<&'static str, u64>,
    body_bytes: BTreeMap<&'static str, u64>,
    hit_bytes: BTreeMap<&'static str, u64>,
}

static FIGURES: Mutex<Figures> = Mutex::new(Figures {
    upstreams: BTreeMap::new(),
    errors: BTreeMap::new(),
    body_bytes: BTreeMap::new(),
    hit_bytes: BTreeMap::new(),
});

fn with<R>(f: impl FnOnce(&mut Figures) -> R) -> R {
    // A panic elsewhere while holding the lock leaves plain counters: still usable.
    let mut g = FIGURES.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut g)
}

/// A response head arrived from `upstream` after `latency`.
pub fn answered(upstream: &str, latency: Duration) {
    with(|f| {
        let u = f.upstreams.entry(upstream.to_string()).or_default();
        u.requests += 1;
        u.up = true;
        u.seen = true;
        let ms = latency.as_millis() as u64;
        let bucket = BOUNDS_MS.iter().position(|&b| ms < b).unwrap_or(BOUNDS_MS.len());
        u.latency[bucket] += 1;
        u.latency_sum_us += latency.as_micros() as u64;
    });
}

/// An exchange with `upstream` failed with `kind`; `down`: the upstream is now skipped.
pub fn failed(upstream: &str, kind: &'static str, down: bool) {
    with(|f| {
        *f.errors.entry(kind).or_default() += 1;
        let u = f.upstreams.entry(upstream.to_string()).or_default();
        u.requests += 1;
        u.seen = true;
        *u.errors.entry(kind).or_default() += 1;
        if down {
            u.up = false;
        }
    });
}

/// An active health check of `upstream` ended (`passed`); it is now `up`.
pub fn checked(upstream: &str, passed: bool, up: bool) {
    with(|f| {
        let u = f.upstreams.entry(upstream.to_string()).or_default();
        u.checks[usize::from(!passed)] += 1;
        u.checked_up = Some(up);
    });
}

/// `upstream` is no longer checked actively: its check figures go from `/metrics`.
pub fn unchecked(upstream: &str) {
    with(|f| {
        if let Some(u) = f.upstreams.get_mut(upstream) {
            u.checked_up = None;
            u.checks = [0, 0];
        }
    });
}

/// An exchange failed with `kind` after its upstream had answered or been chosen
/// (its request already counted).
pub fn error(kind: &'static str) {
    with(|f| *f.errors.entry(kind).or_default() += 1);
}

/// `n` response body bytes relayed from an upstream by `how` (`copy` or `splice`,
/// [`BodyPath::label`]).
pub fn body_bytes(how: &'static str, n: u64) {
    with(|f| *f.body_bytes.entry(how).or_default() += n);
}

/// `n` body bytes of a response answered from a cache entry left by `how`.
pub fn hit_bytes(how: BodyPath, n: u64) {
    if n > 0 {
        with(|f| *f.hit_bytes.entry(how.label()).or_default() += n);
    }
}

/// What the status page shows of one upstream.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct UpstreamFigures {
    pub requests: u64,
    /// `false` while it is skipped after a failure (passive health).
    pub up: bool,
    /// Whether any exchange was tried with it since start-up.
    pub seen: bool,
    /// Failed exchanges by kind.
    pub errors: BTreeMap<&'static str, u64>,
    /// Latency to the response head at the 50th, 90th and 99th percentiles, in
    /// milliseconds: the histogram bound at or under which that share falls
    /// (`None`: no answer yet, or past the last bound).
    pub latency_ms: BTreeMap<&'static str, Option<u64>>,
}

/// Each upstream's figures, by its URL.
pub fn upstreams() -> BTreeMap<String, UpstreamFigures> {
    with(|f| {
        f.upstreams
            .iter()
            .map(|(name, u)| {
                let latency_ms = [("p50", 0.5), ("p90", 0.9), ("p99", 0.99)]
                    .into_iter()
                    .map(|(label, q)| (label, quantile(&u.latency, q)))
                    .collect();
                let figures = UpstreamFigures {
                    requests: u.requests,
                    up: u.up || !u.seen,
                    seen: u.seen,
                    errors: u.errors.clone(),
                    latency_ms,
                };
                (name.clone(), figures)
            })
            .collect()
    })
}

/// Failed exchanges by kind, over every upstream.
pub fn errors() -> BTreeMap<&'static str, u64> {
    with(|f| f.errors.clone())
}

/// Body bytes of cache hits by how they left, and relayed upstream bytes by how they moved.
pub fn body_paths() -> (BTreeMap<&'static str, u64>, BTreeMap<&'static str, u64>) {
    with(|f| (f.hit_bytes.clone(), f.body_bytes.clone()))
}

/// The bound (ms) of `counts` (per slot of [`BOUNDS_MS`], the last over it) at or
/// under which a share `q` falls.
fn quantile(counts: &[u64], q: f64) -> Option<u64> {
    crate::stats::bucket_quantile(counts, q).and_then(|i| BOUNDS_MS.get(i).copied())
}

/// Writes one counter family by `by`, each of `always` shown (0 until counted).
fn by_path(out: &mut String, name: &str, help: &str, counts: &BTreeMap<&'static str, u64>, always: [BodyPath; 2]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    for how in always {
        let _ = writeln!(out, "{name}{{by=\"{}\"}} {}", how.label(), counts.get(how.label()).copied().unwrap_or(0));
    }
    for (how, n) in counts.iter().filter(|(how, _)| !always.iter().any(|a| a.label() == **how)) {
        let _ = writeln!(out, "{name}{{by=\"{how}\"}} {n}");
    }
}

/// Appends the proxy's families in Prometheus text format.
pub fn render(out: &mut String) {
    with(|f| {
        let family = |out: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        let label = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        family(out, "ktlsd_upstream_requests_total", "counter", "Requests sent to each upstream.");
        for (name, u) in &f.upstreams {
            let _ = writeln!(out, "ktlsd_upstream_requests_total{{upstream=\"{}\"}} {}", label(name), u.requests);
        }
        family(
            out,
            "ktlsd_upstream_up",
            "gauge",
            "1 while an upstream answers, 0 while it is skipped after a failure or held down by its health checks.",
        );
        for (name, u) in &f.upstreams {
            let up = (u.up || !u.seen) && u.checked_up != Some(false);
            let _ = writeln!(out, "ktlsd_upstream_up{{upstream=\"{}\"}} {}", label(name), u8::from(up));
        }
        family(
            out,
            "ktlsd_upstream_check_up",
            "gauge",
            "1 while an upstream's active health checks say up, 0 while they hold it down.",
        );
        for (name, u) in &f.upstreams {
            if let Some(up) = u.checked_up {
                let _ = writeln!(out, "ktlsd_upstream_check_up{{upstream=\"{}\"}} {}", label(name), u8::from(up));
            }
        }
        family(out, "ktlsd_upstream_checks_total", "counter", "Active health checks of each upstream by result.");
        for (name, u) in &f.upstreams {
            if u.checked_up.is_some() {
                for (result, n) in ["pass", "fail"].into_iter().zip(u.checks) {
                    let _ = writeln!(
                        out,
                        "ktlsd_upstream_checks_total{{upstream=\"{}\",result=\"{result}\"}} {n}",
                        label(name)
                    );
                }
            }
        }
        family(out, "ktlsd_upstream_errors_total", "counter", "Failed upstream exchanges by kind.");
        for (kind, n) in &f.errors {
            let _ = writeln!(out, "ktlsd_upstream_errors_total{{kind=\"{kind}\"}} {n}");
        }
        by_path(
            out,
            "ktlsd_proxy_body_bytes_total",
            "Response body bytes relayed from upstreams, by how they moved (splice: never through user space).",
            &f.body_bytes,
            [BodyPath::Splice, BodyPath::Copy],
        );
        by_path(
            out,
            "ktlsd_cache_hit_bytes_total",
            "Body bytes of responses answered from the cache, by how they left (sendfile: from the entry over kTLS).",
            &f.hit_bytes,
            [BodyPath::Sendfile, BodyPath::Copy],
        );
        let name = "ktlsd_upstream_response_seconds";
        family(out, name, "histogram", "Time from sending a request to an upstream to its response head.");
        for (up, u) in &f.upstreams {
            let up = label(up);
            let mut cumulative = 0;
            for (i, c) in u.latency.iter().enumerate() {
                cumulative += c;
                let le = BOUNDS_MS.get(i).map_or("+Inf".to_string(), |b| format!("{}", *b as f64 / 1000.0));
                let _ = writeln!(out, "{name}_bucket{{upstream=\"{up}\",le=\"{le}\"}} {cumulative}");
            }
            let _ = writeln!(out, "{name}_sum{{upstream=\"{up}\"}} {}", u.latency_sum_us as f64 / 1e6);
            let _ = writeln!(out, "{name}_count{{upstream=\"{up}\"}} {cumulative}");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition() {
        answered("http://metrics.test:1", Duration::from_millis(3));
        failed("http://metrics.test:2", "connect", true);
        checked("http://metrics.test:3", false, true);
        checked("http://metrics.test:3", false, false);
        body_bytes("copy", 10);
        hit_bytes(BodyPath::Sendfile, 7);
        let mut out = String::new();
        render(&mut out);
        for line in [
            "ktlsd_upstream_requests_total{upstream=\"http://metrics.test:1\"} 1",
            "ktlsd_upstream_up{upstream=\"http://metrics.test:1\"} 1",
            "ktlsd_upstream_up{upstream=\"http://metrics.test:2\"} 0",
            "ktlsd_upstream_up{upstream=\"http://metrics.test:3\"} 0",
            "ktlsd_upstream_check_up{upstream=\"http://metrics.test:3\"} 0",
            "ktlsd_upstream_checks_total{upstream=\"http://metrics.test:3\",result=\"fail\"} 2",
            "ktlsd_upstream_checks_total{upstream=\"http://metrics.test:3\",result=\"pass\"} 0",
            "ktlsd_upstream_response_seconds_bucket{upstream=\"http://metrics.test:1\",le=\"0.002\"} 0",
            "ktlsd_upstream_response_seconds_bucket{upstream=\"http://metrics.test:1\",le=\"0.005\"} 1",
            "# TYPE ktlsd_cache_hit_bytes_total counter",
            "# TYPE ktlsd_proxy_body_bytes_total counter",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
        assert!(out.contains("ktlsd_upstream_errors_total{kind=\"connect\"} "), "{out}");
        // Other tests of the process count too: the figures only grow.
        let value = |name: &str| -> u64 {
            let line = out.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} in\n{out}"));
            line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0)
        };
        assert!(value("ktlsd_cache_hit_bytes_total{by=\"sendfile\"} ") >= 7, "{out}");
        assert!(value("ktlsd_proxy_body_bytes_total{by=\"copy\"} ") >= 10, "{out}");
        assert!(out.contains("ktlsd_proxy_body_bytes_total{by=\"splice\"} "), "{out}");
        assert!(out.contains("ktlsd_cache_hit_bytes_total{by=\"copy\"} "), "{out}");
    }
}
