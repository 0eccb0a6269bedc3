//! The record-size advisor: reads the summed traffic figures (response body
//! sizes, each connection's RTT and loss at its end) and recommends a
//! `record_size` policy with a one-sentence reason, and says whether the TCP
//! connections' loss profile favours HTTP/3 when it is off. Pure: figures in,
//! advice out; it changes nothing. The rules and the evidence behind them are in
//! docs/ktls.md ("Record-size advisor") and docs/http3.md.

use serde::Serialize;

use super::{Stats, Traffic, INITIAL_WINDOW_BYTES};

/// Fewer responses than this and the advisor keeps the current policy.
pub const MIN_SAMPLES: u64 = 100;
/// A p95 body at or under this fits one small record.
const SMALL_BODY: u64 = 4_096;
/// Share of responses over the initial window from which the first record's size matters.
const LARGE_SHARE: f64 = 0.05;
/// A p95 RTT at or under this (microseconds) makes one more round trip negligible.
const NEAR_RTT_US: u64 = 1_000;
/// Responses per TCP connection from which the round trip HTTP/3 saves at a
/// connection's start is spread too thin to matter.
const WARM_RESPONSES_PER_CONNECTION: f64 = 10.0;
/// Share of TCP connections that retransmitted, and p95 body, from which large
/// transfers over lossy links are common enough to warn about HTTP/3's.
const LOSSY_SHARE_FOR_H3: f64 = 0.05;
const LARGE_BODY_FOR_H3: u64 = 1 << 20;

/// What the advisor saw and what it recommends; serialised as `/advisor`.
#[derive(Debug, Serialize, PartialEq)]
pub struct Advice {
    /// Responses seen.
    pub samples: u64,
    /// Response body size quantiles, bytes (histogram bucket upper bounds;
    /// the largest body seen when past the last bucket).
    pub body_p50: Option<u64>,
    pub body_p95: Option<u64>,
    pub body_max: u64,
    /// Share of responses whose body exceeds the initial congestion window.
    pub over_initial_window: f64,
    pub initial_window_bytes: u64,
    /// Connections whose `TCP_INFO` was read at their end.
    pub connections: u64,
    /// Share of those that retransmitted anything.
    pub lossy_connections: f64,
    /// Retransmitted / sent segments per connection, as ratios (bucket upper bounds).
    pub loss_p50: Option<f64>,
    pub loss_p95: Option<f64>,
    /// Smoothed RTT at connection end, milliseconds (bucket upper bounds).
    pub rtt_p50_ms: Option<f64>,
    pub rtt_p95_ms: Option<f64>,
    /// The policy in force.
    pub current: String,
    /// The recommended `record_size`.
    pub recommended: String,
    /// Why, in one sentence.
    pub reason: String,
    /// A line to paste into the configuration file.
    pub config: String,
    /// Whether turning HTTP/3 on is recommended (never when it is on already).
    pub http3_recommended: bool,
    /// Why, in one sentence.
    pub http3_reason: String,
}

/// The rule that decided the HTTP/3 hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum H3Rule {
    AlreadyOn,
    TooFewConnections,
    NearClients,
    WarmConnections,
    ColdOverDistance,
}

/// The rule that decided, for tests and the documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    TooFewSamples,
    SmallBodies,
    FitInitialWindow,
    NearClients,
    LargeOverDistance,
}

/// Advice from the summed `traffic` with `current` the policy in force (as
/// written in the configuration) and `http3` whether HTTP/3 is on.
pub fn advise(traffic: &Traffic, current: &str, http3: bool) -> Advice {
    advise_with_rule(traffic, current, http3).0
}

/// What the HTTP/3 hint is decided on: the TCP connections sampled, the responses
/// seen, the share of connections that retransmitted, the p95 RTT in µs and the p95
/// body in bytes.
#[derive(Debug, Clone, Copy)]
pub struct H3Figures {
    pub connections: u64,
    pub responses: u64,
    pub lossy: f64,
    pub rtt_p95_us: Option<u64>,
    pub body_p95: Option<u64>,
}

/// The HTTP/3 hint, as the lossy-link measurement found (docs/http3.md, "Lossy
/// links"): HTTP/3 brings a new connection's first byte one round trip sooner (one
/// handshake round trip instead of two), at any loss rate, and no better tail; so it
/// is worth turning on when clients are far and connections are short. Large
/// responses over lossy links completed sooner over TCP with BBR than over HTTP/3
/// (whose congestion control is CUBIC), which the hint adds when such traffic is seen.
pub fn http3_hint(f: H3Figures, http3: bool) -> (H3Rule, bool, String) {
    let pct = |x: f64| format!("{:.0}%", x * 100.0);
    if http3 {
        return (H3Rule::AlreadyOn, false, "HTTP/3 is on".to_string());
    }
    let connections = f.connections;
    if connections < MIN_SAMPLES {
        let why = format!("only {connections} TCP connections sampled (at least {MIN_SAMPLES} are needed)");
        return (H3Rule::TooFewConnections, false, why);
    }
    let rtt_ms = f.rtt_p95_us.map_or(0.0, |r| r as f64 / 1000.0);
    if f.rtt_p95_us.is_none_or(|r| r <= NEAR_RTT_US) {
        let why = format!(
            "p95 RTT {rtt_ms:.1} ms: the round trip HTTP/3 saves at a connection's start is under a millisecond"
        );
        return (H3Rule::NearClients, false, why);
    }
    let per_connection = f.responses as f64 / connections as f64;
    if per_connection >= WARM_RESPONSES_PER_CONNECTION {
        let why = format!(
            "{per_connection:.0} responses per TCP connection: the round trip HTTP/3 saves at a connection's start is spread over many"
        );
        return (H3Rule::WarmConnections, false, why);
    }
    let mut why = format!(
        "p95 RTT {rtt_ms:.0} ms and {per_connection:.1} responses per TCP connection: over HTTP/3 a new connection's first byte comes one round trip sooner; set http3 = true and open the UDP port"
    );
    if f.lossy >= LOSSY_SHARE_FOR_H3 && f.body_p95.is_some_and(|b| b > LARGE_BODY_FOR_H3) {
        why += &format!(
            " (with {} of TCP connections retransmitting, keep tcp_congestion = \"bbr\": large responses over lossy links complete sooner over TCP with BBR than over HTTP/3)",
            pct(f.lossy)
        );
    }
    (H3Rule::ColdOverDistance, true, why)
}

pub fn advise_with_rule(t: &Traffic, current: &str, http3: bool) -> (Advice, Rule) {
    let samples = t.body_size.count();
    let body_max = Stats::get(&t.body_max);
    // A histogram bucket's bound may lie above every body seen: no quantile exceeds the maximum.
    let body_q = |q| t.body_size.quantile(q).map(|b| b.min(body_max)).or((samples > 0).then_some(body_max));
    let (body_p50, body_p95) = (body_q(0.5), body_q(0.95));
    let share = |n: u64, of: u64| if of == 0 { 0.0 } else { n as f64 / of as f64 };
    let over = share(Stats::get(&t.over_initial_window), samples);
    let connections = Stats::get(&t.tcp_samples);
    let lossy = share(Stats::get(&t.lossy), connections);
    let rtt_p95_us = t.rtt.quantile(0.95);
    let pct = |x: f64| format!("{:.0}%", x * 100.0);

    let (rule, recommended, reason) = if samples < MIN_SAMPLES {
        (
            Rule::TooFewSamples,
            current.to_string(),
            format!("only {samples} responses seen (at least {MIN_SAMPLES} are needed): keep the current policy"),
        )
    } else if body_p95.is_some_and(|p| p <= SMALL_BODY) {
        (
            Rule::SmallBodies,
            "static:4k".to_string(),
            "p95 body fits in 4 KiB: one small record carries nearly every response".to_string(),
        )
    } else if over < LARGE_SHARE {
        (
            Rule::FitInitialWindow,
            "static:16k".to_string(),
            format!(
                "only {} of responses exceed the initial window ({INITIAL_WINDOW_BYTES} bytes): full records cost no extra round trip and make the fewest records",
                pct(over)
            ),
        )
    } else if connections > 0 && rtt_p95_us.is_some_and(|r| r <= NEAR_RTT_US) {
        (
            Rule::NearClients,
            "static:16k".to_string(),
            format!(
                "{} of responses exceed the initial window but the p95 RTT is under 1 ms: the round trip a 16 KiB first record adds is negligible",
                pct(over)
            ),
        )
    } else {
        (
            Rule::LargeOverDistance,
            "adaptive".to_string(),
            format!(
                "{} of responses exceed the initial window and {} of connections lose packets: adaptive's first record fits the window and its records shrink while a loss is recovered",
                pct(over),
                pct(lossy)
            ),
        )
    };
    let figures = H3Figures { connections, responses: samples, lossy, rtt_p95_us, body_p95 };
    let (_, http3_recommended, http3_reason) = http3_hint(figures, http3);
    let ms = |us: Option<u64>| us.map(|u| u as f64 / 1000.0);
    let ratio = |ppm: Option<u64>| ppm.map(|p| p as f64 / 1e6);
    let advice = Advice {
        samples,
        body_p50,
        body_p95,
        body_max,
        over_initial_window: over,
        initial_window_bytes: INITIAL_WINDOW_BYTES,
        connections,
        lossy_connections: lossy,
        loss_p50: ratio(t.loss.quantile(0.5)),
        loss_p95: ratio(t.loss.quantile(0.95)),
        rtt_p50_ms: ms(t.rtt.quantile(0.5)),
        rtt_p95_ms: ms(rtt_p95_us),
        current: current.to_string(),
        config: format!("record_size = \"{recommended}\""),
        recommended,
        reason,
        http3_recommended,
        http3_reason,
    };
    (advice, rule)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::stats::TcpEnd;
    use crate::vocab::{Method, RecordLayer};

    /// `n` responses of each size, and `conns` connections of (rtt µs, retransmits of 100 segments).
    fn mix(sizes: &[(u64, u32)], conns: &[(u32, u32, u32)]) -> Traffic {
        let t = Traffic::default();
        let ms = Duration::from_millis(1);
        for &(size, n) in sizes {
            for _ in 0..n {
                t.request(Some(&Method::Get), 200, RecordLayer::Kernel, size, ms, ms);
            }
        }
        for &(rtt_us, retransmits, n) in conns {
            for _ in 0..n {
                t.tcp_end(TcpEnd { rtt_us, retransmits, segments: 100 });
            }
        }
        t
    }

    #[test]
    fn rules_on_synthetic_mixes() {
        // (traffic, current, rule, recommended)
        let table = [
            (mix(&[(2_000, 50)], &[]), "static:16384", Rule::TooFewSamples, "static:16384"),
            (
                mix(&[(300, 500), (3_000, 480), (100_000, 20)], &[(50_000, 0, 100)]),
                "static:16384",
                Rule::SmallBodies,
                "static:4k",
            ),
            (
                mix(&[(8_000, 500), (12_000, 480), (100_000, 20)], &[(50_000, 2, 100)]),
                "adaptive",
                Rule::FitInitialWindow,
                "static:16k",
            ),
            (mix(&[(8_000, 500), (100_000, 300)], &[(200, 0, 100)]), "static:16384", Rule::NearClients, "static:16k"),
            (
                mix(&[(8_000, 500), (100_000, 300), (1_000_000, 100)], &[(100_000, 0, 92), (100_000, 3, 8)]),
                "static:16384",
                Rule::LargeOverDistance,
                "adaptive",
            ),
            // Large responses over a distance with no connection sampled yet: still adaptive.
            (mix(&[(1_000_000, 200)], &[]), "static:16384", Rule::LargeOverDistance, "adaptive"),
        ];
        for (i, (t, current, rule, rec)) in table.iter().enumerate() {
            let (a, r) = advise_with_rule(t, current, false);
            assert_eq!((r, a.recommended.as_str()), (*rule, *rec), "mix {i}: {a:?}");
            assert_eq!(a.config, format!("record_size = \"{rec}\""));
            assert!(!a.reason.is_empty() && !a.reason.contains('\n'));
        }
    }

    #[test]
    fn figures() {
        let t = mix(&[(8_000, 500), (100_000, 300), (1_000_000, 100)], &[(100_000, 0, 92), (100_000, 3, 8)]);
        let a = advise(&t, "static:16384", false);
        assert_eq!(a.samples, 900);
        assert_eq!(a.body_p50, Some(8_192));
        assert_eq!(a.body_p95, Some(1_000_000), "never above the maximum, whatever the bucket's bound");
        assert_eq!(a.body_max, 1_000_000);
        assert!((a.over_initial_window - 400.0 / 900.0).abs() < 1e-9);
        assert_eq!(a.connections, 100);
        assert!((a.lossy_connections - 0.08).abs() < 1e-9);
        assert_eq!((a.loss_p50, a.loss_p95), (Some(0.0), Some(0.05)));
        assert_eq!((a.rtt_p50_ms, a.rtt_p95_ms), (Some(100.0), Some(100.0)));
        assert!(a.http3_recommended, "{a:?}");
        assert_eq!(a.reason, "44% of responses exceed the initial window and 8% of connections lose packets: adaptive's first record fits the window and its records shrink while a loss is recovered");
    }

    #[test]
    fn http3_hint_on_traffic_profiles() {
        use H3Rule::*;
        // (responses as (body size, count), TCP connections as (rtt µs, retransmits
        // of 100 segments, count), http3 on, rule, words the reason must hold)
        type Sizes = &'static [(u64, u32)];
        type Conns = &'static [(u32, u32, u32)];
        let table: [(Sizes, Conns, bool, H3Rule, &str); 9] = [
            (&[(50_000, 200)], &[(80_000, 2, 100)], true, AlreadyOn, "is on"),
            (&[(50_000, 200)], &[(80_000, 2, 99)], false, TooFewConnections, "99 TCP"),
            (&[(50_000, 200)], &[(300, 5, 100)], false, NearClients, "under a millisecond"),
            (&[(50_000, 2_000)], &[(80_000, 0, 100)], false, WarmConnections, "20 responses per"),
            // Far and short: recommended with or without loss.
            (&[(50_000, 200)], &[(80_000, 0, 100)], false, ColdOverDistance, "2.0 responses per"),
            (&[(50_000, 200)], &[(80_000, 0, 95), (80_000, 2, 5)], false, ColdOverDistance, "one round trip sooner"),
            (&[(50_000, 950)], &[(80_000, 0, 100)], false, ColdOverDistance, "9.5 responses"),
            // Large bodies over lossy links: recommended, with BBR kept for TCP.
            (&[(4_000_000, 200)], &[(80_000, 0, 95), (80_000, 2, 5)], false, ColdOverDistance, "keep tcp_congestion"),
            (&[(4_000_000, 200)], &[(80_000, 2, 100)], true, AlreadyOn, "is on"),
        ];
        for (i, (sizes, conns, on, want, words)) in table.iter().enumerate() {
            let t = mix(sizes, conns);
            let lossy = Stats::get(&t.lossy) as f64 / Stats::get(&t.tcp_samples).max(1) as f64;
            let figures = H3Figures {
                connections: Stats::get(&t.tcp_samples),
                responses: t.body_size.count(),
                lossy,
                rtt_p95_us: t.rtt.quantile(0.95),
                body_p95: t.body_size.quantile(0.95),
            };
            let (rule, recommended, why) = http3_hint(figures, *on);
            assert_eq!(rule, *want, "case {i}: {why}");
            assert_eq!(recommended, *want == ColdOverDistance, "case {i}");
            assert!(why.contains(words) && !why.contains('\n'), "case {i}: {why}");
            if *want == ColdOverDistance && !words.contains("tcp_congestion") {
                assert!(!why.contains("tcp_congestion"), "case {i}: {why}");
            }
            let a = advise(&t, "adaptive", *on);
            assert_eq!((a.http3_recommended, a.http3_reason), (recommended, why), "advise carries the hint");
        }
    }
}
