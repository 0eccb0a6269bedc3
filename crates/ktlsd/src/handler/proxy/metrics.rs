//! The proxy's figures for `/metrics`: requests per upstream, failures by kind,
//! time to the upstream's response head, each upstream's health as this process last
//! saw it, and body bytes by how they moved (copied through user space, or spliced).
//!
//! Process-wide (one lock, taken once per exchange and per scrape), unlike the
//! per-worker `stats`: upstream names are only known from the configuration.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the latency histogram, in milliseconds.
const BOUNDS_MS: [u64; 10] = [1, 2, 5, 10, 25, 50, 100, 250, 1000, 5000];

#[derive(Default)]
struct Upstream {
    requests: u64,
    up: bool,
    latency: [u64; BOUNDS_MS.len() + 1],
    latency_sum_us: u64,
}

#[derive(Default)]
struct Figures {
    upstreams: BTreeMap<String, Upstream>,
    errors: BTreeMap<&'static str, u64>,
    body_bytes: BTreeMap<&'static str, u64>,
}

static FIGURES: Mutex<Figures> =
    Mutex::new(Figures { upstreams: BTreeMap::new(), errors: BTreeMap::new(), body_bytes: BTreeMap::new() });

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
        if down {
            u.up = false;
        }
    });
}

/// An exchange failed with `kind` after its upstream had answered or been chosen
/// (its request already counted).
pub fn error(kind: &'static str) {
    with(|f| *f.errors.entry(kind).or_default() += 1);
}

/// `n` response body bytes moved by `how` (`copy` or `splice`).
pub fn body_bytes(how: &'static str, n: u64) {
    with(|f| *f.body_bytes.entry(how).or_default() += n);
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
            "1 while an upstream answers, 0 while it is skipped after a failure.",
        );
        for (name, u) in &f.upstreams {
            let _ = writeln!(out, "ktlsd_upstream_up{{upstream=\"{}\"}} {}", label(name), u8::from(u.up));
        }
        family(out, "ktlsd_upstream_errors_total", "counter", "Failed upstream exchanges by kind.");
        for (kind, n) in &f.errors {
            let _ = writeln!(out, "ktlsd_upstream_errors_total{{kind=\"{kind}\"}} {n}");
        }
        family(out, "ktlsd_proxy_body_bytes_total", "counter", "Proxied response body bytes by how they moved.");
        for (how, n) in &f.body_bytes {
            let _ = writeln!(out, "ktlsd_proxy_body_bytes_total{{method=\"{how}\"}} {n}");
        }
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
        body_bytes("copy", 10);
        let mut out = String::new();
        render(&mut out);
        for line in [
            "ktlsd_upstream_requests_total{upstream=\"http://metrics.test:1\"} 1",
            "ktlsd_upstream_up{upstream=\"http://metrics.test:1\"} 1",
            "ktlsd_upstream_up{upstream=\"http://metrics.test:2\"} 0",
            "ktlsd_upstream_response_seconds_bucket{upstream=\"http://metrics.test:1\",le=\"0.002\"} 0",
            "ktlsd_upstream_response_seconds_bucket{upstream=\"http://metrics.test:1\",le=\"0.005\"} 1",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
        assert!(out.contains("ktlsd_upstream_errors_total{kind=\"connect\"} "), "{out}");
    }
}
