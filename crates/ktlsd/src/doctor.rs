//! `ktlsd doctor`: what this machine's kernel offers for kernel TLS, and what
//! to do about each gap; with `--config FILE`, also the state of that
//! configuration's fleet (`server::cluster::probe`: the secret, the store, the
//! shared ticket record), which leaves the exit status alone (a member serves on
//! without its store).
//!
//! The facts come from [`kernel_tls::probe`] (which tries the real socket
//! options on loopback connections), `/proc/net/tls_stat` and the kernel's
//! list of congestion-control algorithms. The same
//! [`Report`] is printed either as a human-readable page or, with `--json`,
//! as one JSON object. The exit status gives the verdict to scripts: 0 when
//! kTLS is usable, 1 when it is not (the report still prints in full, since
//! ktlsd then serves with its user-space record layer); a failure to print
//! is an error.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

use kernel_tls::{Capabilities, Cipher, TlsStat, TlsVersion};
use serde::Serialize;

use crate::config::{Config, ServeArgs};
use crate::server::cluster::probe::{Facts, TicketRecord};

/// Exit status of `ktlsd doctor` when kTLS is not usable on this machine.
const EXIT_UNUSABLE: u8 = 1;

/// Prints the report for this machine (`json`: one JSON object) and returns the exit
/// status: success when kTLS is usable, [`EXIT_UNUSABLE`] when not.
pub fn run(json: bool, config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let mut report = Report::gather();
    if let Some(path) = config {
        let args = ServeArgs { config: Some(path.to_path_buf()), ..ServeArgs::default() };
        let config = Config::from_args(args)?;
        if let Some(cluster) = &config.cluster {
            let facts = crate::server::cluster::probe::probe(cluster, config.state_dir.as_deref());
            report.advice.extend(facts.advice());
            report.cluster = Some(facts);
        }
    }
    let mut text = Vec::new();
    if json {
        serde_json::to_writer_pretty(&mut text, &report)?;
        text.push(b'\n');
    } else {
        report.render(&mut text)?;
    }
    let mut stdout = io::stdout().lock();
    match stdout.write_all(&text).and_then(|()| stdout.flush()) {
        // `ktlsd doctor | head` is not an error.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
        other => other?,
    }
    Ok(if report.ktls.usable { ExitCode::SUCCESS } else { ExitCode::from(EXIT_UNUSABLE) })
}

/// Everything the doctor knows, in the shape of the JSON output.
#[derive(Debug, Serialize)]
struct Report {
    /// `uname -r`.
    kernel: Option<String>,
    ktls: Availability,
    suites: Vec<SuiteRow>,
    rekey: Rekey,
    record_size_cap: RecordSizeCap,
    congestion_control: Vec<String>,
    tls_stat: Stat,
    /// HTTP/3's UDP sockets: GSO, GRO and buffer sizes (not probed in table tests).
    udp: Option<crate::quic::socket::UdpFacts>,
    /// The fleet of `--config`'s `[cluster]`, when there is one.
    cluster: Option<Facts>,
    /// One line per gap, in the order of the report.
    advice: Vec<String>,
    probe_ms: f64,
}

#[derive(Debug, Serialize)]
struct Availability {
    usable: bool,
    /// Machine-readable reason (`not-built`, `module-not-loaded`, ...), if unusable.
    reason_kind: Option<&'static str>,
    reason: Option<String>,
    fix: Option<String>,
}

#[derive(Debug, Serialize)]
struct SuiteRow {
    version: &'static str,
    cipher: &'static str,
    tx: bool,
    rx: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    tx_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rx_error: Option<String>,
}

#[derive(Debug, Serialize)]
struct Rekey {
    /// Whether the test could run at all.
    tested: bool,
    supported: bool,
    tx: bool,
    rx: bool,
    detail: Option<String>,
}

#[derive(Debug, Serialize)]
struct RecordSizeCap {
    /// Whether the test could run at all.
    tested: bool,
    /// The kernel knows `TLS_TX_MAX_PAYLOAD_LEN`.
    supported: bool,
    /// Its value on a fresh socket (normally 16384).
    default: Option<u16>,
}

#[derive(Debug, Serialize)]
struct Stat {
    available: bool,
    error: Option<String>,
    counters: BTreeMap<String, u64>,
}

const USERSPACE_NOTE: &str = "ktlsd serves HTTPS with its user-space record layer (--ktls auto, the default)";

impl Report {
    fn gather() -> Report {
        let caps = kernel_tls::probe();
        let stat = TlsStat::read();
        let congestion = crate::server::congestion::available().unwrap_or_default();
        let mut report = Report::from_facts(&caps, stat, congestion);
        let udp = crate::quic::socket::probe();
        report.advice.extend(udp.advice());
        report.udp = Some(udp);
        report
    }

    fn from_facts(caps: &Capabilities, stat: io::Result<TlsStat>, congestion_control: Vec<String>) -> Report {
        let mut advice = Vec::new();
        let ktls = match &caps.unavailable {
            Some(u) => {
                advice.push(format!("kernel TLS: {}; meanwhile {USERSPACE_NOTE}", u.advice()));
                Availability {
                    usable: false,
                    reason_kind: Some(u.kind()),
                    reason: Some(u.reason()),
                    fix: Some(u.advice().to_owned()),
                }
            }
            None if !caps.usable() => {
                advice.push(format!(
                    "kernel TLS: the tls ULP attaches but no cipher works in both directions \
                     (see the table); meanwhile {USERSPACE_NOTE}"
                ));
                Availability {
                    usable: false,
                    reason_kind: Some("no-usable-cipher"),
                    reason: Some("no version/cipher accepted for both TX and RX".to_owned()),
                    fix: Some("use a newer kernel with its crypto modules (gcm, chacha20poly1305)".to_owned()),
                }
            }
            None => Availability { usable: true, reason_kind: None, reason: None, fix: None },
        };

        let mut suites = Vec::new();
        for version in TlsVersion::ALL {
            for cipher in Cipher::ALL {
                let found = caps.suites.iter().find(|s| s.version == version && s.cipher == cipher);
                suites.push(SuiteRow {
                    version: version.name(),
                    cipher: cipher.name(),
                    tx: found.is_some_and(|s| s.tx),
                    rx: found.is_some_and(|s| s.rx),
                    tx_error: found.and_then(|s| s.tx_error.clone()),
                    rx_error: found.and_then(|s| s.rx_error.clone()),
                });
            }
        }
        if caps.unavailable.is_none() {
            let missing: Vec<String> =
                suites.iter().filter(|s| !(s.tx && s.rx)).map(|s| format!("{} {}", s.version, s.cipher)).collect();
            if !missing.is_empty() {
                advice.push(format!(
                    "suites: {} lack kernel support in at least one direction; connections that \
                     negotiate them use user-space TLS (TLS 1.3 needs Linux 5.1+, \
                     ChaCha20-Poly1305 5.11+; check that the gcm/chacha20poly1305 crypto modules load)",
                    missing.join(", ")
                ));
            }
        }

        let rekey = Rekey {
            tested: caps.rekey.tested,
            supported: caps.rekey_supported(),
            tx: caps.rekey.tx,
            rx: caps.rekey.rx,
            detail: caps.rekey.detail.clone(),
        };
        if rekey.tested && !rekey.supported {
            advice.push(
                "key update: this kernel cannot re-key kTLS sockets (needs Linux 6.14+); a TLS 1.3 \
                 client that sends KeyUpdate has its connection closed cleanly, and long-lived \
                 connections are closed instead of re-keyed at the cipher's record limit"
                    .to_owned(),
            );
        }

        let record_size_cap = RecordSizeCap {
            tested: caps.unavailable.is_none(),
            supported: caps.record_size_cap(),
            default: caps.tx_max_payload_len,
        };
        if caps.unavailable.is_none() && !record_size_cap.supported {
            advice.push(
                "record size cap: this kernel lacks TLS_TX_MAX_PAYLOAD_LEN; ktlsd sizes kernel TLS \
                 records by the length of each send/sendfile instead (one call per record)"
                    .to_owned(),
            );
        }

        if congestion_control.is_empty() {
            advice.push(
                "congestion control: /proc/sys/net/ipv4/tcp_available_congestion_control is unreadable".to_owned(),
            );
        } else if !congestion_control.iter().any(|c| c == "bbr") {
            advice.push("congestion control: `bbr` is not loaded; `modprobe tcp_bbr` if you want it".to_owned());
        }

        let tls_stat = match stat {
            Ok(s) => {
                Stat { available: true, error: None, counters: s.iter().map(|(n, v)| (n.to_owned(), v)).collect() }
            }
            Err(e) => {
                if caps.unavailable.is_none() {
                    advice.push(format!("tls_stat: {e}"));
                }
                Stat { available: false, error: Some(e.to_string()), counters: BTreeMap::new() }
            }
        };

        Report {
            kernel: caps.kernel_release.clone(),
            ktls,
            suites,
            rekey,
            record_size_cap,
            congestion_control,
            tls_stat,
            udp: None,
            cluster: None,
            advice,
            probe_ms: (caps.elapsed.as_secs_f64() * 10_000.0).round() / 10.0,
        }
    }

    fn render(&self, out: &mut impl Write) -> io::Result<()> {
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        writeln!(out, "ktlsd doctor: kernel TLS on this machine")?;
        writeln!(out)?;
        row(out, "kernel", self.kernel.as_deref().unwrap_or("unknown (uname failed)"))?;
        if self.ktls.usable {
            row(out, "kernel TLS", "usable")?;
        } else {
            row(out, "kernel TLS", "NOT usable")?;
            if let Some(reason) = &self.ktls.reason {
                row(out, "  why", reason)?;
            }
            if let Some(fix) = &self.ktls.fix {
                row(out, "  fix", fix)?;
            }
            row(out, "  until then", USERSPACE_NOTE)?;
        }
        writeln!(out)?;

        writeln!(out, "cipher suites (kernel record layer)")?;
        writeln!(out, "  {:<8} {:<18} {:<4} RX", "version", "cipher", "TX")?;
        for s in &self.suites {
            writeln!(out, "  {:<8} {:<18} {:<4} {}", s.version, s.cipher, yes_no(s.tx), yes_no(s.rx))?;
        }
        if self.ktls.usable {
            for s in &self.suites {
                for (dir, err) in [("TX", &s.tx_error), ("RX", &s.rx_error)] {
                    if let Some(err) = err {
                        writeln!(out, "  {} {} {dir}: {err}", s.version, s.cipher)?;
                    }
                }
            }
        } else if self.suites.iter().all(|s| !s.tx && !s.rx) {
            writeln!(out, "  (not tested: kernel TLS is unavailable)")?;
        }
        writeln!(out)?;

        let rekey = if !self.rekey.tested {
            format!("not tested ({})", self.rekey.detail.as_deref().unwrap_or("kernel TLS unavailable"))
        } else if self.rekey.supported && self.rekey.rx {
            "yes".to_owned()
        } else if self.rekey.supported {
            format!(
                "yes (TX; RX re-key refused without a pending KeyUpdate: {})",
                self.rekey.detail.as_deref().unwrap_or("?")
            )
        } else {
            format!(
                "no (TX {}, RX {}){}",
                yes_no(self.rekey.tx),
                yes_no(self.rekey.rx),
                self.rekey.detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default()
            )
        };
        row(out, "TLS 1.3 key update", &rekey)?;
        let cap = match (self.record_size_cap.tested, self.record_size_cap.default) {
            (_, Some(v)) => format!(
                "yes (TLS_TX_MAX_PAYLOAD_LEN, default {v}); ktlsd uses it for --record-size static:SIZE below 16k"
            ),
            (true, None) => "no (kernel lacks TLS_TX_MAX_PAYLOAD_LEN)".to_owned(),
            (false, None) => "not tested (kernel TLS unavailable)".to_owned(),
        };
        row(out, "record size cap", &cap)?;
        let cc =
            if self.congestion_control.is_empty() { "unknown".to_owned() } else { self.congestion_control.join(" ") };
        row(out, "congestion control", &cc)?;
        let b = crate::server::FdBudget::read();
        let fds = format!(
            "soft {}, hard {}: ktlsd serves with {} (less 64, shared among the workers: each worker's budget for connections, upstream connections and held files; connections take at most half unless --max-connections says otherwise)",
            b.before,
            b.hard,
            b.target()
        );
        row(out, "file descriptors", &fds)?;
        if let Some(u) = &self.udp {
            let n = |v: Option<u64>| v.map_or_else(|| "?".to_string(), |v| v.to_string());
            let got = |v: Option<usize>| v.map_or_else(|| "?".to_string(), |v| v.to_string());
            row(
                out,
                "UDP (HTTP/3)",
                &format!(
                    "GSO {} segments, GRO {} segments; buffers: receive {} (rmem_max {}), send {} (wmem_max {})",
                    u.gso_segments,
                    u.gro_segments,
                    got(u.recv_buffer),
                    n(u.rmem_max),
                    got(u.send_buffer),
                    n(u.wmem_max)
                ),
            )?;
        }
        writeln!(out)?;

        if let Some(c) = &self.cluster {
            render_cluster(out, c)?;
            writeln!(out)?;
        }

        if self.tls_stat.available {
            writeln!(out, "/proc/net/tls_stat (includes this probe's sockets)")?;
            for (name, value) in &self.tls_stat.counters {
                writeln!(out, "  {name:<24} {value}")?;
            }
        } else {
            row(out, "/proc/net/tls_stat", self.tls_stat.error.as_deref().unwrap_or("unreadable"))?;
        }
        writeln!(out)?;

        if self.advice.is_empty() {
            row(out, "what to do", "nothing: kernel TLS is fully available")?;
        } else {
            writeln!(out, "what to do")?;
            for a in &self.advice {
                writeln!(out, "  - {a}")?;
            }
        }
        writeln!(out, "(probe took {:.1} ms)", self.probe_ms)?;
        Ok(())
    }
}

/// The fleet's lines of the human report.
fn render_cluster(out: &mut impl Write, c: &Facts) -> io::Result<()> {
    writeln!(out, "cluster: member {} of the fleet under {}", c.member, c.prefix)?;
    row(out, "  secret_file", c.secret_error.as_deref().unwrap_or("readable"))?;
    let store = match &c.store_error {
        None => format!("up ({})", c.endpoints.join(", ")),
        Some(e) => format!("DOWN ({}): {e}", c.endpoints.join(", ")),
    };
    row(out, "  store", &store)?;
    let tickets = match &c.tickets {
        TicketRecord::Absent => "none yet (the first member to start writes it)".to_owned(),
        TicketRecord::Opens { keys } => format!("opens with this secret_file ({keys} key(s))"),
        TicketRecord::Unusable { error } => format!("does NOT open with this secret_file: {error}"),
        TicketRecord::Unknown => "not read".to_owned(),
    };
    row(out, "  ticket keys", &tickets)?;
    let saved = c.saved_keys.map_or_else(|| "none".to_owned(), |n| format!("{n} key(s)"));
    row(out, "  saved copy", &saved)
}

/// One `label  value` line of the human report.
fn row(out: &mut impl Write, label: &str, value: &str) -> io::Result<()> {
    writeln!(out, "{label:<20} {value}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_for_this_machine_renders_both_ways() {
        let report = Report::gather();
        let mut text = Vec::new();
        report.render(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("kernel TLS"));
        assert!(text.contains("TLS1.3   AES-128-GCM"));
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        assert_eq!(json["suites"].as_array().unwrap().len(), 6);
        assert!(json["ktls"]["usable"].is_boolean());
        assert!(json["congestion_control"].is_array());
        if !report.ktls.usable {
            // Unavailable must say why and what to do.
            assert!(json["ktls"]["reason"].is_string(), "{json}");
            assert!(!report.advice.is_empty());
            assert!(text.contains("user-space record layer"));
        }
    }

    /// A kernel like Debian 12's 6.1: kTLS works, no re-keying, no record cap.
    fn fake_6_1() -> Capabilities {
        let mut suites = Vec::new();
        for version in TlsVersion::ALL {
            for cipher in Cipher::ALL {
                suites.push(kernel_tls::SuiteSupport {
                    version,
                    cipher,
                    tx: true,
                    rx: true,
                    tx_error: None,
                    rx_error: None,
                });
            }
        }
        Capabilities {
            kernel_release: Some("6.1.0-18-amd64".into()),
            unavailable: None,
            suites,
            rekey: kernel_tls::RekeySupport { tested: true, tx: false, rx: false, detail: Some("EBUSY".into()) },
            tx_max_payload_len: None,
            elapsed: std::time::Duration::from_millis(3),
        }
    }

    #[test]
    fn usable_kernel_reports_gaps() {
        let congestion = vec!["reno".into(), "cubic".into()];
        let report = Report::from_facts(&fake_6_1(), TlsStat::parse("TlsTxSw 6\n"), congestion);
        assert!(report.ktls.usable);
        assert!(report.suites.iter().all(|s| s.tx && s.rx));
        assert!(!report.rekey.supported && report.rekey.tested);
        assert!(!report.record_size_cap.supported && report.record_size_cap.tested);
        let mut text = Vec::new();
        report.render(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("kernel TLS           usable"), "{text}");
        assert!(text.contains("6.14"), "{text}");
        assert!(text.contains("TLS_TX_MAX_PAYLOAD_LEN"), "{text}");
        assert!(text.contains("tcp_bbr"), "{text}");
        assert_eq!(report.advice.len(), 3, "{:?}", report.advice);
    }

    #[test]
    fn tls_stat_counters_are_reported() {
        let caps = kernel_tls::probe();
        let stat = TlsStat::parse("TlsCurrTxSw 1\nTlsTxSw 5\n");
        let report = Report::from_facts(&caps, stat, vec!["reno".into()]);
        assert!(report.tls_stat.available);
        assert_eq!(report.tls_stat.counters.get("TlsTxSw"), Some(&5));
        let mut text = Vec::new();
        report.render(&mut text).unwrap();
        assert!(String::from_utf8(text).unwrap().contains("TlsTxSw"));
    }
}
