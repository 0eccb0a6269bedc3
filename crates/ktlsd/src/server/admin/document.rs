//! `/status.json`: the status page's document (and `ktlsd status --json`'s output),
//! built from the figures that already exist (the workers' counters summed, the
//! proxy's and the cache's own figures, the reload and ACME records), and the
//! history ring the admin thread samples once a second.
//!
//! Its field names are a stable interface, documented in `docs/operations.md`
//! (section "/status.json"): a field is added, never renamed or removed, without
//! raising [`SCHEMA`]. Serialised by serde, so every string in it is JSON-escaped;
//! the page puts them in the DOM as text. Not the HTTP of the admin listener
//! (`super`), nor the page (`super::page`).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::{Current, State};
use crate::config::KtlsMode;
use crate::handler::proxy::{self, Upstream};
use crate::stats::prometheus::CacheFigures;
use crate::stats::{sites, Metrics, Stats, TIME_BOUNDS_US};
use crate::vocab::{HttpVersion, RecordLayer};

/// The document's schema version: raised only when a field changes meaning or goes.
pub const SCHEMA: u32 = 1;

/// Samples the history keeps: 15 minutes, one a second.
pub const HISTORY_LEN: usize = 900;

/// Seconds the rates of "now" are taken over (smoother than one second, still current).
const RATE_WINDOW: usize = 3;

/// Hottest cache keys shown.
const HOTTEST: usize = 10;

/// How long the hottest keys are reused before the cache's index is walked again.
const HOTTEST_FOR: Duration = Duration::from_secs(5);

/// The `/status.json` document.
#[derive(Debug, Serialize)]
pub struct Document {
    pub schema: u32,
    pub version: &'static str,
    pub pid: u32,
    /// When the document was made (Unix seconds).
    pub time: u64,
    pub uptime_seconds: f64,
    /// Whether admin actions (drain, enable) are possible: `admin_auth` is configured.
    pub admin_actions: bool,
    /// Whether the member is drained (`ktlsd drain`): `/healthz` answers 503.
    pub draining: bool,
    /// The fleet's store; `None` without a `[cluster]`.
    pub cluster: Option<ClusterView>,
    pub now: Now,
    pub upstreams: Vec<UpstreamRow>,
    /// `None` without a `[cache]`.
    pub cache: Option<CacheView>,
    pub sites: Vec<SiteRow>,
    pub reloads: Reloads,
    pub history: HistoryView,
}

/// This member of a fleet and its store.
#[derive(Debug, Serialize)]
pub struct ClusterView {
    pub member: String,
    pub store_up: bool,
    /// Session-ticket keys from the store in use.
    pub ticket_keys: u64,
    /// Rotations of the shared ticket key this member made.
    pub ticket_rotations: u64,
    /// The members sharing the response cache (`cache_peers`), `NAME=ADDR`; empty without.
    pub cache_peers: Vec<String>,
}

/// The server now: rates over the last three seconds sampled, counts since start-up.
#[derive(Debug, Serialize)]
pub struct Now {
    pub requests_per_second: ByProtocol<f64>,
    pub requests_per_second_by_site: BTreeMap<String, f64>,
    pub requests_total: ByProtocol<u64>,
    pub requests_by_site: BTreeMap<String, u64>,
    pub connections: Connections,
    pub tls: Tls,
    pub body_bytes: BodyBytes,
    /// Errors since start-up by kind (see docs/operations.md for the kinds).
    pub errors: BTreeMap<String, u64>,
    /// Failed handshakes by reason.
    pub handshake_failures: BTreeMap<&'static str, u64>,
}

#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq)]
pub struct ByProtocol<T> {
    pub total: T,
    pub h1: T,
    pub h2: T,
    pub h3: T,
}

#[derive(Debug, Serialize)]
pub struct Connections {
    /// Connections open now (HTTPS over TCP and QUIC).
    pub open: u64,
    /// Accepted TCP connections whose handshake has not ended yet.
    pub handshaking: u64,
    /// HTTP/1.1 connections waiting for their next request (HTTP/2 and HTTP/3
    /// connections are not counted: their idleness is not tracked).
    pub idle_h1: u64,
    /// Open connections by record layer: `ktls`, `userspace`, `quic`.
    pub by_record_layer: BTreeMap<&'static str, u64>,
    /// Open connections by protocol: `h1`, `h2`, `h3`.
    pub by_protocol: BTreeMap<&'static str, u64>,
}

#[derive(Debug, Serialize)]
pub struct Tls {
    /// Whether new connections may use the kernel's record layer.
    pub ktls_enabled: bool,
    /// What the kernel offers, or why kTLS is not used.
    pub ktls_summary: String,
    /// Connections since start-up by record layer: `ktls`, `userspace`, `quic`.
    pub connections: BTreeMap<&'static str, u64>,
    /// The kernel's share of TLS-over-TCP connections since start-up (0 to 1);
    /// `None` before the first.
    pub ktls_share: Option<f64>,
    /// Connections since start-up by TLS version (rustls' names: `TLSv1_3`).
    pub by_version: BTreeMap<&'static str, u64>,
    /// Connections since start-up by cipher suite (`QUIC` for HTTP/3).
    pub by_suite: BTreeMap<&'static str, u64>,
}

#[derive(Debug, Serialize)]
pub struct BodyBytes {
    pub sendfile: u64,
    pub splice: u64,
    pub copy: u64,
    /// Each path's share of the three (0 to 1); `None` before any body byte.
    pub sendfile_share: Option<f64>,
    pub splice_share: Option<f64>,
    pub copy_share: Option<f64>,
}

/// One `[[proxy]]` upstream (once, however many rules name it).
#[derive(Debug, Serialize)]
pub struct UpstreamRow {
    /// As configured: `http://HOST:PORT`.
    pub upstream: String,
    /// `HOST:PORT`, the name drain and enable take.
    pub address: String,
    /// `up`, `down` (skipped after a failure: passive health) or `draining`.
    pub state: &'static str,
    /// The rules that use it: `SITE PATH`.
    pub used_by: Vec<String>,
    pub requests: u64,
    pub errors: BTreeMap<&'static str, u64>,
    pub errors_total: u64,
    /// Time to the response head at the 50th, 90th and 99th percentile, ms (a histogram bound).
    pub latency_ms: BTreeMap<&'static str, Option<u64>>,
    /// Pooled connections over every worker: in use by an exchange, idle.
    pub connections_in_use: u64,
    pub connections_idle: u64,
    /// How health is known: `passive` (from exchanges only) or `active` (its
    /// `health_check` too).
    pub health: &'static str,
    /// `passive`, or the last active check: `active: passed 3s ago (200 in 1 ms)`,
    /// `active: failed 1s ago (connect: Connection refused ...)`, `active: not yet`.
    pub last_check: String,
}

#[derive(Debug, Serialize)]
pub struct CacheView {
    /// Hits over hits and misses since start-up; `None` before any lookup.
    pub hit_ratio: Option<f64>,
    /// Hits, misses, stale, revalidations, coalesced waits, evictions, bytes stored
    /// now and entries: `/metrics`'s figures, under the same names.
    #[serde(flatten)]
    pub figures: CacheFigures,
    /// The limit of the bytes stored.
    pub max_size: u64,
    /// Body bytes of hits sent by sendfile from the entry (kTLS), and copied.
    pub sendfile_bytes: u64,
    pub copy_bytes: u64,
    /// The keys with the most fresh hits (`GET HOST TARGET`), most first.
    pub hottest: Vec<HotKey>,
}

#[derive(Debug, Clone, Serialize)]
pub struct HotKey {
    pub key: String,
    pub hits: u64,
}

#[derive(Debug, Serialize)]
pub struct SiteRow {
    /// The site's label: its first name, or `default`.
    pub name: String,
    /// Every name it answers (wildcards as `*.example.com`).
    pub names: Vec<String>,
    /// When the certificate it serves now ends (Unix seconds); `None` when unknown.
    pub certificate_not_after: Option<i64>,
    pub certificate_days_left: Option<f64>,
    /// The ACME state (`ordering`, `valid`, `failing`) for an ACME site.
    pub acme: Option<sites::AcmeStatus>,
}

#[derive(Debug, Serialize)]
pub struct Reloads {
    pub succeeded: u64,
    pub failed: u64,
    pub last_ok: bool,
    /// The start and the latest reloads, oldest first.
    pub recent: Vec<sites::ReloadEvent>,
}

#[derive(Debug, Serialize)]
pub struct HistoryView {
    pub interval_seconds: u64,
    /// Most samples kept.
    pub capacity: usize,
    pub samples: Vec<Sample>,
}

/// One second of the server.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Sample {
    /// When the second ended (Unix seconds).
    pub t: u64,
    pub requests_per_second: f64,
    /// 5xx answers, connection errors, failed handshakes and upstream failures, per second.
    pub errors_per_second: f64,
    /// The 99th percentile of the response time in that second (a histogram bound), ms.
    pub p99_ms: Option<f64>,
    /// The kernel's share of the TLS-over-TCP connections that got a record layer in that second.
    pub ktls_share: Option<f64>,
    /// Cache hits over lookups in that second.
    pub cache_hit_ratio: Option<f64>,
}

/// The figures a sample is the difference of.
#[derive(Debug, Clone, Default)]
struct Totals {
    requests: ByProtocol<u64>,
    by_site: BTreeMap<String, u64>,
    errors: u64,
    response_time: Vec<u64>,
    ktls: u64,
    userspace: u64,
    cache_hits: u64,
    cache_misses: u64,
}

/// The history ring and the rates of the last second, written by the sampler.
#[derive(Debug, Default)]
pub struct History {
    samples: VecDeque<Sample>,
    last: Option<Totals>,
    /// The totals of the last [`RATE_WINDOW`] seconds and when each was read, oldest first.
    window: VecDeque<(Instant, ByProtocol<u64>, BTreeMap<String, u64>)>,
    rates: ByProtocol<f64>,
    site_rates: BTreeMap<String, f64>,
    hottest: Option<(Instant, Vec<HotKey>)>,
}

impl History {
    /// Takes a sample of `total` now (the sampler calls it once a second).
    pub fn sample(&mut self, total: &Metrics, current: &Current, elapsed: Duration) {
        let now = totals(total, current);
        let read_at = Instant::now();
        if let Some((then, p, sites)) = self.window.front() {
            let secs = read_at.duration_since(*then).as_secs_f64().max(0.001);
            let per = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
            let r = &now.requests;
            self.rates = ByProtocol {
                total: per(r.total, p.total),
                h1: per(r.h1, p.h1),
                h2: per(r.h2, p.h2),
                h3: per(r.h3, p.h3),
            };
            self.site_rates = now
                .by_site
                .iter()
                .map(|(site, n)| (site.clone(), per(*n, sites.get(site).copied().unwrap_or(0))))
                .collect();
        }
        if self.window.len() == RATE_WINDOW {
            self.window.pop_front();
        }
        self.window.push_back((read_at, now.requests, now.by_site.clone()));
        if let Some(before) = &self.last {
            let secs = elapsed.as_secs_f64().max(0.001);
            let per = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
            let times: Vec<u64> = now
                .response_time
                .iter()
                .zip(before.response_time.iter().chain(std::iter::repeat(&0)))
                .map(|(a, b)| a.saturating_sub(*b))
                .collect();
            let ktls = now.ktls.saturating_sub(before.ktls);
            let tcp = ktls + now.userspace.saturating_sub(before.userspace);
            let hits = now.cache_hits.saturating_sub(before.cache_hits);
            let lookups = hits + now.cache_misses.saturating_sub(before.cache_misses);
            if self.samples.len() == HISTORY_LEN {
                self.samples.pop_front();
            }
            self.samples.push_back(Sample {
                t: unix_now(),
                requests_per_second: per(now.requests.total, before.requests.total),
                errors_per_second: per(now.errors, before.errors),
                p99_ms: quantile_us(&times, 0.99).map(|us| us as f64 / 1000.0),
                ktls_share: ratio(ktls, tcp),
                cache_hit_ratio: ratio(hits, lookups),
            });
        }
        self.last = Some(now);
    }

    /// The samples after Unix second `since` (all for 0).
    fn view(&self, since: u64) -> HistoryView {
        HistoryView {
            interval_seconds: 1,
            capacity: HISTORY_LEN,
            samples: self.samples.iter().filter(|s| s.t > since).copied().collect(),
        }
    }
}

/// `part / whole`, `None` for an empty whole.
fn ratio(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

/// The response-time bound (µs) at or under which a share `q` of `counts` falls
/// (`counts` per slot of [`TIME_BOUNDS_US`], the last over it: then the last bound).
fn quantile_us(counts: &[u64], q: f64) -> Option<u64> {
    let i = crate::stats::bucket_quantile(counts, q)?;
    TIME_BOUNDS_US.get(i).or(TIME_BOUNDS_US.last()).copied()
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn by_protocol(total: &Metrics) -> ByProtocol<u64> {
    let t = &total.traffic;
    let get = |p: HttpVersion| Stats::get(&t.requests_by_protocol[p as usize]);
    let (h1, h2, h3) = (get(HttpVersion::Http1), get(HttpVersion::Http2), get(HttpVersion::Http3));
    ByProtocol { total: h1 + h2 + h3, h1, h2, h3 }
}

/// Errors by kind since start-up (the page's "errors" and the history's error rate).
fn errors(total: &Metrics) -> BTreeMap<String, u64> {
    let s = &total.stats;
    let t = &total.traffic;
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for (class, i) in [("status_4xx", 3), ("status_5xx", 4)] {
        out.insert(class.into(), t.requests[i].iter().map(Stats::get).sum());
    }
    for (kind, c) in [
        ("timeouts", &s.timeouts),
        ("connection_errors", &s.errors),
        ("panics", &s.panics),
        ("connections_refused", &s.connections_refused),
        ("connections_refused_per_ip", &s.connections_refused_per_ip),
        ("ktls_install_failures", &s.ktls_install_failures),
        ("ktls_record_errors", &s.ktls_record_errors),
        ("rekey_unsupported", &s.rekey_unsupported),
        ("handshake_failures", &s.handshake_failures),
        ("auth_failures", &crate::stats::AUTH_FAILURES),
    ] {
        out.insert(kind.into(), Stats::get(c));
    }
    for (kind, n) in proxy::metrics::errors() {
        out.insert(format!("upstream_{kind}"), n);
    }
    out
}

/// The errors the history's error rate counts (4xx are the clients' own).
fn error_count(e: &BTreeMap<String, u64>) -> u64 {
    e.iter()
        .filter(|(k, _)| {
            k.as_str() == "status_5xx"
                || k.as_str() == "connection_errors"
                || k.as_str() == "handshake_failures"
                || k.starts_with("upstream_")
        })
        .map(|(_, n)| n)
        .sum()
}

fn totals(total: &Metrics, current: &Current) -> Totals {
    let s = &total.stats;
    let cache = current.shared.cache.as_ref().map(|c| c.figures()).unwrap_or_default();
    Totals {
        requests: by_protocol(total),
        by_site: total.sites.snapshot().into_iter().map(|(site, c)| (site, c.requests.iter().sum())).collect(),
        errors: error_count(&errors(total)),
        response_time: total.traffic.response_time.counts(),
        ktls: Stats::get(&s.ktls),
        userspace: Stats::get(&s.userspace),
        cache_hits: cache.hits,
        cache_misses: cache.misses,
    }
}

/// Every `[[proxy]]` upstream of `current` with the rules that use it (`SITE PATH`),
/// in configuration order, each once.
pub fn upstreams(current: &Current) -> Vec<(Upstream, Vec<String>)> {
    let shared = &current.shared;
    let sites = std::iter::once(("default".to_string(), &shared.config.content))
        .chain(shared.sites.iter().map(|s| (s.names.label().into_owned(), &s.content)));
    let mut out: Vec<(Upstream, Vec<String>)> = Vec::new();
    for (label, content) in sites {
        for rule in &content.locations.rules().proxy {
            for u in &rule.upstreams {
                let user = format!("{label} {}", rule.path.as_str());
                match out.iter_mut().find(|(o, _)| o.url == u.url) {
                    Some((_, users)) => users.push(user),
                    None => out.push((u.clone(), vec![user])),
                }
            }
        }
    }
    out
}

/// The document for `since` (history samples after that Unix second; 0: all).
pub fn document(state: &State, current: &Current, history: &mut History, since: u64) -> Document {
    let total = Metrics::sum(state.workers.iter().map(|m| &**m));
    let t = &total.traffic;
    let s = &total.stats;
    let c = &current.shared.config;
    let (ktls_enabled, ktls_summary) = match &current.shared.ktls {
        Some(k) => (true, k.summary()),
        None if c.ktls == KtlsMode::Off => (false, "off (--ktls off)".into()),
        None => (false, "unavailable in this kernel (see `ktlsd doctor`)".into()),
    };
    let open_by = |l: RecordLayer| t.open[l as usize].iter().map(Stats::get).sum::<u64>();
    let conns_by = |l: RecordLayer| t.connections[l as usize].iter().map(Stats::get).sum::<u64>();
    let open_proto = |p: HttpVersion| t.open.iter().map(|row| Stats::get(&row[p as usize])).sum::<u64>();
    let (ktls, userspace) = (Stats::get(&s.ktls), Stats::get(&s.userspace));
    let negotiated = total.negotiated.snapshot();
    let mut by_version = BTreeMap::new();
    let mut by_suite = BTreeMap::new();
    for ((v, suite), n) in negotiated {
        *by_version.entry(v).or_default() += n;
        *by_suite.entry(suite).or_default() += n;
    }
    let paths: Vec<u64> = t.body_by_path.iter().map(Stats::get).collect();
    let body_total: u64 = paths.iter().sum();
    // Accepted TCP connections, less those refused at once and those whose handshake
    // ended either way (handshakes counted include QUIC's, whose connections are added back).
    let handshaking = (i128::from(Stats::get(&s.connections)) + i128::from(conns_by(RecordLayer::Quic))
        - i128::from(Stats::get(&s.connections_refused))
        - i128::from(Stats::get(&s.connections_refused_per_ip))
        - i128::from(Stats::get(&s.handshake_failures))
        - i128::from(Stats::get(&t.handshakes_ok)))
    .clamp(0, i128::from(u64::MAX)) as u64;
    let now = Now {
        requests_per_second: history.rates,
        requests_per_second_by_site: history.site_rates.clone(),
        requests_total: by_protocol(&total),
        requests_by_site: total.sites.snapshot().into_iter().map(|(site, c)| (site, c.requests.iter().sum())).collect(),
        connections: Connections {
            open: RecordLayer::ALL.into_iter().map(open_by).sum(),
            handshaking,
            idle_h1: Stats::get(&t.idle),
            by_record_layer: RecordLayer::ALL.into_iter().map(|l| (l.label(), open_by(l))).collect(),
            by_protocol: [("h1", HttpVersion::Http1), ("h2", HttpVersion::Http2), ("h3", HttpVersion::Http3)]
                .into_iter()
                .map(|(name, p)| (name, open_proto(p)))
                .collect(),
        },
        tls: Tls {
            ktls_enabled,
            ktls_summary,
            connections: RecordLayer::ALL.into_iter().map(|l| (l.label(), conns_by(l))).collect(),
            ktls_share: ratio(ktls, ktls + userspace),
            by_version,
            by_suite,
        },
        body_bytes: BodyBytes {
            sendfile: paths[0],
            copy: paths[1],
            splice: paths[2],
            sendfile_share: ratio(paths[0], body_total),
            copy_share: ratio(paths[1], body_total),
            splice_share: ratio(paths[2], body_total),
        },
        errors: errors(&total),
        handshake_failures: [
            ("timeout", &s.handshake_timeouts),
            ("protocol", &s.handshake_protocol_errors),
            ("client_alert", &s.handshake_client_alerts),
            ("reset", &s.handshake_resets),
            ("plain_http", &s.handshake_plain_http),
        ]
        .into_iter()
        .map(|(reason, c)| (reason, Stats::get(c)))
        .collect(),
    };
    let figures = proxy::metrics::upstreams();
    let now_secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let upstreams = upstreams(current)
        .into_iter()
        .map(|(u, used_by)| {
            let f = figures.get(&u.url).cloned().unwrap_or_default();
            let (in_use, idle) = u.shared.connections();
            let check = u.shared.check_view();
            let checked_down = check.as_ref().is_some_and(|c| c.down);
            let state = match (u.shared.drained(), (f.up || !f.seen) && !checked_down) {
                (true, _) => "draining",
                (false, true) => "up",
                (false, false) => "down",
            };
            let last_check = match &check {
                None => "passive".to_string(),
                Some(c) => match &c.last {
                    None => "active: not yet".to_string(),
                    Some((at, passed, detail)) => {
                        let ago = now_secs.saturating_sub(*at);
                        let verdict = if *passed { "passed" } else { "failed" };
                        format!("active: {verdict} {ago}s ago ({detail})")
                    }
                },
            };
            UpstreamRow {
                address: u.address(),
                upstream: u.url.clone(),
                state,
                used_by,
                requests: f.requests,
                errors_total: f.errors.values().sum(),
                errors: f.errors,
                latency_ms: f.latency_ms,
                connections_in_use: in_use,
                connections_idle: idle,
                health: if check.is_some() { "active" } else { "passive" },
                last_check,
            }
        })
        .collect();
    let cache = current.shared.cache.as_ref().map(|cache| {
        let f = cache.figures();
        let hottest = match &history.hottest {
            Some((at, keys)) if at.elapsed() < HOTTEST_FOR => keys.clone(),
            _ => {
                let keys: Vec<HotKey> =
                    cache.hottest(HOTTEST).into_iter().map(|(key, hits)| HotKey { key, hits }).collect();
                history.hottest = Some((Instant::now(), keys.clone()));
                keys
            }
        };
        let (hit_bytes, _) = proxy::metrics::body_paths();
        CacheView {
            hit_ratio: ratio(f.hits, f.hits + f.misses),
            figures: f,
            max_size: cache.max_size(),
            sendfile_bytes: hit_bytes.get("sendfile").copied().unwrap_or(0),
            copy_bytes: hit_bytes.get("copy").copied().unwrap_or(0),
            hottest,
        }
    });
    let expiry: BTreeMap<String, i64> = current.shared.certificates.expiry().into_iter().collect();
    let acme = sites::acme_snapshot();
    let now_s = unix_now();
    let site_row = |name: String, names: Vec<String>| {
        let not_after = expiry.get(&name).copied();
        SiteRow {
            certificate_days_left: not_after.map(|n| (n - now_s as i64) as f64 / 86_400.0),
            certificate_not_after: not_after,
            acme: acme.get(&name).cloned(),
            names,
            name,
        }
    };
    let sites = std::iter::once(site_row("default".into(), Vec::new()))
        .chain(current.shared.sites.iter().map(|s| site_row(s.names.label().into_owned(), s.names.dns_names())))
        .collect();
    let r = &sites::RELOADS;
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    Document {
        schema: SCHEMA,
        version: env!("CARGO_PKG_VERSION"),
        pid: std::process::id(),
        time: now_s,
        uptime_seconds: state.started.elapsed().as_secs_f64(),
        admin_actions: c.admin_auth.is_some(),
        draining: state.drain.drained(),
        cluster: current.shared.cluster.as_ref().map(|m| {
            let g = &crate::stats::CLUSTER;
            ClusterView {
                member: m.settings.name.clone(),
                store_up: g.store_up.load(relaxed),
                ticket_keys: g.ticket_keys.load(relaxed),
                ticket_rotations: g.ticket_rotations.load(relaxed),
                cache_peers: crate::handler::proxy::peers::get().map_or_else(Vec::new, |p| {
                    p.members().into_iter().map(|m| format!("{}={}", m.name, m.addr)).collect()
                }),
            }
        }),
        now,
        upstreams,
        cache,
        sites,
        reloads: Reloads {
            succeeded: r.succeeded.load(relaxed),
            failed: r.failed.load(relaxed),
            last_ok: r.last_ok.load(relaxed) == 1,
            recent: sites::reload_log(),
        },
        history: history.view(since),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_ratios() {
        let mut counts = vec![0u64; TIME_BOUNDS_US.len() + 1];
        assert_eq!(quantile_us(&counts, 0.99), None);
        counts[0] = 98;
        counts[3] = 2;
        assert_eq!(quantile_us(&counts, 0.5), Some(TIME_BOUNDS_US[0]));
        assert_eq!(quantile_us(&counts, 0.99), Some(TIME_BOUNDS_US[3]));
        counts[TIME_BOUNDS_US.len()] = 1000;
        assert_eq!(quantile_us(&counts, 0.99), TIME_BOUNDS_US.last().copied(), "past the last bound: the last");
        assert_eq!(ratio(1, 0), None);
        assert_eq!(ratio(1, 4), Some(0.25));
    }

    #[test]
    fn the_error_rate_counts_server_side_errors_only() {
        let mut e = BTreeMap::new();
        for (k, n) in [("status_4xx", 100), ("status_5xx", 1), ("connection_errors", 2), ("upstream_connect", 4)] {
            e.insert(k.to_string(), n);
        }
        assert_eq!(error_count(&e), 7);
    }
}
