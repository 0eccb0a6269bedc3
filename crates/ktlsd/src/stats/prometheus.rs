//! Renders summed figures in the Prometheus text exposition format (0.0.4).
//!
//! Hand-written rather than through a client crate: the figures are already
//! aggregated by the server (per-worker single-writer counters summed at
//! scrape), so a registry would only be a second copy of them; what is left is
//! a few dozen lines of text. Label values here are fixed words or kernel
//! counter names, escaped anyway. Not an HTTP endpoint (see `server::admin`).

use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::traffic::{METHODS, STATUS_CLASSES};
use super::{Counter, Histogram, Metrics};
use crate::vocab::{HttpVersion, RecordLayer};

/// Appends the exposition of `m` (summed over workers) to `out`, with the
/// kernel's `tls_stat` counters when it has them.
pub fn render(out: &mut String, m: &Metrics, uptime: Duration, tls_stat: Option<&kernel_tls::TlsStat>) {
    let s = &m.stats;
    let t = &m.traffic;
    let v = |c: &Counter| c.load(Relaxed);

    family(out, "ktlsd_info", "gauge", "Build information.");
    let _ = writeln!(out, "ktlsd_info{{version=\"{}\"}} 1", escape(env!("CARGO_PKG_VERSION")));
    family(out, "ktlsd_uptime_seconds", "gauge", "Seconds since the server started.");
    let _ = writeln!(out, "ktlsd_uptime_seconds {:.3}", uptime.as_secs_f64());

    family(out, "ktlsd_accepted_connections_total", "counter", "TCP connections accepted.");
    let _ = writeln!(out, "ktlsd_accepted_connections_total {}", v(&s.connections));
    family(out, "ktlsd_connections", "gauge", "Connections open now, by record layer and protocol.");
    for l in RecordLayer::ALL {
        for p in HttpVersion::ALL.into_iter().filter(|&p| carries(l, p)) {
            let _ = writeln!(
                out,
                "ktlsd_connections{{record_layer=\"{l}\",protocol=\"{}\"}} {}",
                p.label(),
                v(&t.open[l as usize][p as usize])
            );
        }
    }
    family(
        out,
        "ktlsd_connections_total",
        "counter",
        "Connections that completed their handshake and got a record layer, by record layer and protocol.",
    );
    for l in RecordLayer::ALL {
        for p in HttpVersion::ALL.into_iter().filter(|&p| carries(l, p)) {
            let _ = writeln!(
                out,
                "ktlsd_connections_total{{record_layer=\"{l}\",protocol=\"{}\"}} {}",
                p.label(),
                v(&t.connections[l as usize][p as usize])
            );
        }
    }

    family(out, "ktlsd_handshakes_total", "counter", "Completed TLS handshakes.");
    let _ = writeln!(out, "ktlsd_handshakes_total {}", v(&t.handshakes_ok));
    family(out, "ktlsd_handshakes_resumed_total", "counter", "Completed TLS handshakes that resumed a session.");
    let _ = writeln!(out, "ktlsd_handshakes_resumed_total {}", v(&t.handshakes_resumed));
    family(out, "ktlsd_handshake_failures_total", "counter", "Failed TLS handshakes, by reason.");
    for (reason, c) in [
        ("timeout", &s.handshake_timeouts),
        ("protocol", &s.handshake_protocol_errors),
        ("client_alert", &s.handshake_client_alerts),
        ("reset", &s.handshake_resets),
        ("plain_http", &s.handshake_plain_http),
    ] {
        let _ = writeln!(out, "ktlsd_handshake_failures_total{{reason=\"{reason}\"}} {}", v(c));
    }

    family(out, "ktlsd_requests_total", "counter", "Requests answered, by status class and method.");
    for (i, class) in STATUS_CLASSES.iter().enumerate() {
        for (j, method) in METHODS.iter().enumerate() {
            let _ =
                writeln!(out, "ktlsd_requests_total{{code=\"{class}\",method=\"{method}\"}} {}", v(&t.requests[i][j]));
        }
    }
    family(
        out,
        "ktlsd_plain_http_requests_total",
        "counter",
        "Plain-HTTP answers (redirects to HTTPS, ACME HTTP-01), by status class.",
    );
    for (i, class) in STATUS_CLASSES.iter().enumerate() {
        let _ = writeln!(out, "ktlsd_plain_http_requests_total{{code=\"{class}\"}} {}", v(&t.plain_requests[i]));
    }
    family(out, "ktlsd_sent_body_bytes_total", "counter", "Response body bytes sent, by record layer.");
    for l in RecordLayer::ALL {
        let _ = writeln!(out, "ktlsd_sent_body_bytes_total{{record_layer=\"{l}\"}} {}", v(&t.body_bytes[l as usize]));
    }
    histogram(
        out,
        "ktlsd_response_seconds",
        "Time from the request head's first byte to the response's last byte handed to the socket.",
        &t.response_time,
        6,
    );
    histogram(
        out,
        "ktlsd_ttfb_seconds",
        "Time from the request head's first byte to the start of the response.",
        &t.ttfb,
        6,
    );
    histogram(out, "ktlsd_response_body_bytes", "Response body sizes.", &t.body_size, 0);
    histogram(out, "ktlsd_connection_rtt_seconds", "Smoothed RTT (TCP_INFO) of each connection at its end.", &t.rtt, 6);
    histogram(
        out,
        "ktlsd_connection_loss_ratio",
        "Retransmitted over sent segments (TCP_INFO) of each connection at its end.",
        &t.loss,
        6,
    );

    for (name, help, c) in [
        (
            "ktlsd_ktls_install_failures_total",
            "Connections lost because the kernel refused the TLS keys.",
            &s.ktls_install_failures,
        ),
        (
            "ktlsd_ktls_record_errors_total",
            "kTLS connections closed on a record the kernel rejected.",
            &s.ktls_record_errors,
        ),
        ("ktlsd_ktls_key_updates_total", "TLS 1.3 KeyUpdates installed in the kernel.", &s.key_updates),
        (
            "ktlsd_ktls_rekey_unsupported_total",
            "TLS 1.3 KeyUpdates the kernel could not install (connection closed).",
            &s.rekey_unsupported,
        ),
        ("ktlsd_timeouts_total", "Connections closed on an idle, header or send timeout.", &s.timeouts),
        ("ktlsd_connection_errors_total", "Connections cut by socket or TLS errors after the handshake.", &s.errors),
        ("ktlsd_panics_total", "Connection tasks that panicked.", &s.panics),
        (
            "ktlsd_connections_refused_total",
            "Connections closed at once because the worker held max_connections.",
            &s.connections_refused,
        ),
        (
            "ktlsd_connections_refused_per_ip_total",
            "Connections closed at once because their client address held max_connections_per_ip.",
            &s.connections_refused_per_ip,
        ),
        (
            "ktlsd_open_file_cache_hits_total",
            "Requests whose file was found in the open-file cache.",
            &s.open_file_cache_hits,
        ),
        (
            "ktlsd_open_file_cache_misses_total",
            "Requests whose path was looked up in the file system.",
            &s.open_file_cache_misses,
        ),
        (
            "ktlsd_open_file_cache_content_hits_total",
            "Open-file cache hits whose small file's bytes were kept in memory.",
            &s.open_file_cache_content_hits,
        ),
        (
            "ktlsd_cold_windows_total",
            "File windows found out of the page cache and read ahead off the event loop.",
            &s.cold_windows,
        ),
        (
            "ktlsd_readahead_waits_total",
            "Cold windows that waited for a free reader of the readahead pool.",
            &s.readahead_waits,
        ),
        ("ktlsd_compressed_hits_total", "Answers sent from a body stored compressed on the fly.", &s.compressed_hits),
        ("ktlsd_compressed_made_total", "Compressions into the compressed-body store started.", &s.compressed_made),
        (
            "ktlsd_auth_failures_total",
            "Basic-auth attempts with wrong or malformed credentials.",
            &super::AUTH_FAILURES,
        ),
        (
            "ktlsd_auth_rate_limited_total",
            "Requests refused with 429 for too many failed basic-auth attempts.",
            &super::AUTH_RATE_LIMITED,
        ),
    ] {
        family(out, name, "counter", help);
        let _ = writeln!(out, "{name} {}", v(c));
    }
    if super::CLUSTER.enabled.load(Relaxed) {
        let c = &super::CLUSTER;
        family(out, "ktlsd_cluster_store_up", "gauge", "1 while the fleet's store ([cluster] etcd) is reachable.");
        let _ = writeln!(out, "ktlsd_cluster_store_up {}", u8::from(c.store_up.load(Relaxed)));
        family(out, "ktlsd_cluster_ticket_keys", "gauge", "Session-ticket keys from the fleet's store in use.");
        let _ = writeln!(out, "ktlsd_cluster_ticket_keys {}", c.ticket_keys.load(Relaxed));
        family(
            out,
            "ktlsd_cluster_ticket_rotations_total",
            "counter",
            "Rotations of the shared session-ticket key this member made.",
        );
        let _ = writeln!(out, "ktlsd_cluster_ticket_rotations_total {}", c.ticket_rotations.load(Relaxed));
    }
    family(out, "ktlsd_open_file_cache_entries", "gauge", "Descriptors held by the open-file caches now.");
    let _ = writeln!(out, "ktlsd_open_file_cache_entries {}", v(&s.open_file_cache_entries));

    if let Some(stat) = tls_stat {
        family(out, "ktlsd_kernel_tls_stat", "gauge", "The kernel's /proc/net/tls_stat counters, by name.");
        for (name, value) in stat.iter() {
            let _ = writeln!(out, "ktlsd_kernel_tls_stat{{counter=\"{}\"}} {value}", escape(name));
        }
    }
}

/// The process's file-descriptor budget: descriptors open now and the limit
/// (`RLIMIT_NOFILE`'s soft value), when known.
pub fn fd_budget(out: &mut String, open: Option<u64>, limit: Option<u64>) {
    for (name, help, value) in [
        ("ktlsd_open_fds", "File descriptors the process has open now.", open),
        ("ktlsd_max_fds", "The process's file-descriptor limit (RLIMIT_NOFILE, soft).", limit),
    ] {
        if let Some(value) = value {
            family(out, name, "gauge", help);
            let _ = writeln!(out, "{name} {value}");
        }
    }
}

/// The response cache's figures, read when scraped (the cache is shared by the
/// workers, so these are its own totals, not per-worker sums).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CacheFigures {
    pub hits: u64,
    pub misses: u64,
    pub stale: u64,
    pub revalidations: u64,
    pub coalesced: u64,
    pub evictions: u64,
    pub bytes: u64,
    pub entries: u64,
}

/// Appends the response cache's figures.
pub fn cache(out: &mut String, f: &CacheFigures) {
    for (name, kind, help, value) in [
        ("ktlsd_cache_hits_total", "counter", "Lookups answered by a fresh stored response.", f.hits),
        ("ktlsd_cache_misses_total", "counter", "Lookups that found no usable stored response.", f.misses),
        (
            "ktlsd_cache_stale_total",
            "counter",
            "Stale responses served (stale-while-revalidate, stale-if-error).",
            f.stale,
        ),
        (
            "ktlsd_cache_revalidations_total",
            "counter",
            "Stored responses refreshed by a 304 from the upstream.",
            f.revalidations,
        ),
        (
            "ktlsd_cache_coalesced_total",
            "counter",
            "Lookups that waited for another request's fill of the same key.",
            f.coalesced,
        ),
        ("ktlsd_cache_evictions_total", "counter", "Entries evicted to keep the cache under max_size.", f.evictions),
        ("ktlsd_cache_bytes", "gauge", "Bytes of the stored entries (heads and bodies).", f.bytes),
        ("ktlsd_cache_entries", "gauge", "Stored entries.", f.entries),
    ] {
        family(out, name, kind, help);
        let _ = writeln!(out, "{name} {value}");
    }
}

/// Whether record layer `l` can carry protocol `p`: QUIC carries HTTP/3 only, and only QUIC does.
fn carries(l: RecordLayer, p: HttpVersion) -> bool {
    (l == RecordLayer::Quic) == (p == HttpVersion::Http3)
}

pub(super) fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A histogram in whole units, exported divided by 10^`shift` (6: µs to seconds,
/// ppm to ratio) in exact decimals.
fn histogram(out: &mut String, name: &str, help: &str, h: &Histogram, shift: u32) {
    family(out, name, "histogram", help);
    let counts = h.counts();
    let mut cumulative = 0;
    for (i, c) in counts.iter().enumerate() {
        cumulative += c;
        match h.bounds.get(i) {
            Some(b) => {
                let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {cumulative}", decimal(*b, shift));
            }
            None => {
                let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
            }
        }
    }
    let _ = writeln!(out, "{name}_sum {}", decimal(h.sum(), shift));
    let _ = writeln!(out, "{name}_count {cumulative}");
}

/// `v / 10^shift` written exactly: `decimal(25_000, 6)` is `0.025`.
fn decimal(v: u64, shift: u32) -> String {
    let unit = 10u64.pow(shift);
    let (whole, frac) = (v / unit, v % unit);
    if frac == 0 {
        return whole.to_string();
    }
    let frac = format!("{frac:0width$}", width = shift as usize);
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

/// A label value with `\`, `"` and newlines escaped, as the format requires.
pub(super) fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{Stats, TcpEnd};

    fn line<'a>(text: &'a str, start: &str) -> &'a str {
        text.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("no line {start:?} in\n{text}"))
    }

    #[test]
    fn exposition() {
        let m = Metrics::default();
        Stats::bump(&m.stats.connections);
        Stats::bump(&m.stats.handshake_timeouts);
        m.traffic.opened(RecordLayer::Userspace, HttpVersion::Http1);
        let ms = Duration::from_millis(2);
        m.traffic.request(Some(&crate::vocab::Method::Get), 200, RecordLayer::Userspace, 20_000, ms, ms / 2);
        m.traffic.request(Some(&crate::vocab::Method::Post), 405, RecordLayer::Userspace, 0, ms, ms / 2);
        m.traffic.tcp_end(TcpEnd { rtt_us: 30, retransmits: 0, segments: 10 });
        let stat = kernel_tls::TlsStat::parse("TlsCurrTxSw 1\nTlsTxSw 7\n").unwrap();
        let mut out = String::new();
        render(&mut out, &m, Duration::from_millis(1500), Some(&stat));
        assert_eq!(Stats::get(&m.stats.connections), 1);
        for want in [
            "ktlsd_accepted_connections_total 1",
            "ktlsd_connections{record_layer=\"userspace\",protocol=\"http/1.1\"} 1",
            "ktlsd_connections_total{record_layer=\"ktls\",protocol=\"h2\"} 0",
            "ktlsd_handshake_failures_total{reason=\"timeout\"} 1",
            "ktlsd_requests_total{code=\"2xx\",method=\"GET\"} 1",
            "ktlsd_requests_total{code=\"4xx\",method=\"other\"} 1",
            "ktlsd_sent_body_bytes_total{record_layer=\"userspace\"} 20000",
            "ktlsd_response_body_bytes_bucket{le=\"0\"} 1",
            "ktlsd_response_body_bytes_bucket{le=\"16384\"} 1",
            "ktlsd_response_body_bytes_bucket{le=\"32768\"} 2",
            "ktlsd_response_body_bytes_bucket{le=\"+Inf\"} 2",
            "ktlsd_response_body_bytes_sum 20000",
            "ktlsd_ttfb_seconds_bucket{le=\"0.001\"} 2",
            "ktlsd_response_seconds_bucket{le=\"0.001\"} 0",
            "ktlsd_response_seconds_count 2",
            "ktlsd_connection_rtt_seconds_bucket{le=\"0.001\"} 1",
            "ktlsd_uptime_seconds 1.500",
            "ktlsd_kernel_tls_stat{counter=\"TlsTxSw\"} 7",
        ] {
            assert!(out.lines().any(|l| l == want), "missing {want:?} in\n{out}");
        }
        assert_eq!(line(&out, "# TYPE ktlsd_requests_total"), "# TYPE ktlsd_requests_total counter");
        // Every sample line names a family declared before it.
        let mut declared = Vec::new();
        for l in out.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                declared.push(rest.split(' ').next().unwrap_or_default().to_string());
            } else if !l.starts_with('#') {
                let name = l.split(['{', ' ']).next().unwrap_or_default();
                assert!(
                    declared.iter().any(|d| name == d
                        || name.strip_prefix(d.as_str()).is_some_and(|s| ["_bucket", "_sum", "_count"].contains(&s))),
                    "{l}"
                );
            }
        }
        assert!(out.lines().any(|l| l == "ktlsd_response_seconds_bucket{le=\"0.025\"} 2"), "{out}");
        for (v, shift, want) in
            [(0, 6, "0"), (25_000, 6, "0.025"), (1_500_000, 6, "1.5"), (7, 6, "0.000007"), (14_600, 0, "14600")]
        {
            assert_eq!(decimal(v, shift), want);
        }
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
