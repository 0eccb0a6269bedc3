//! TLS record-size policies, and the per-connection sizer that applies them.
//!
//! This is the one place that decides where records end, for both record layers:
//! the userspace writer encrypts one record per [`RecordSizer::next_record`], the kernel
//! writer hands the kernel one `send`/`sendfile` of that length.

use std::fmt;
use std::os::fd::BorrowedFd;
use std::str::FromStr;
use std::time::{Duration, Instant};

use super::tcp::TcpState;

/// Largest TLS record payload (2^14 bytes), for both record layers; the kernel's
/// limit is the same number.
pub const MAX_RECORD: usize = kernel_tls::TLS_MAX_PLAINTEXT;

/// How long TLS records are, chosen per listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordPolicy {
    /// Every record carries up to `SIZE` bytes (nginx's `ssl_buffer_size`).
    Static(usize),
    /// Small records at the start of a burst, growing in stages (Cloudflare's dynamic records).
    Dynamic(DynamicParams),
    /// Records sized from the connection's live TCP state.
    Adaptive,
}

impl Default for RecordPolicy {
    fn default() -> Self {
        RecordPolicy::Static(MAX_RECORD)
    }
}

/// Parameters of the dynamic policy: `lo`-sized records for `threshold` records, then
/// `hi`-sized for `threshold` more, then full records; `timeout` of idleness starts over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DynamicParams {
    pub lo: usize,
    pub hi: usize,
    pub threshold: u32,
    pub timeout: Duration,
}

impl Default for DynamicParams {
    fn default() -> Self {
        DynamicParams { lo: 1369, hi: 4229, threshold: 40, timeout: Duration::from_secs(1) }
    }
}

impl fmt::Display for RecordPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordPolicy::Static(n) => write!(f, "static:{n}"),
            RecordPolicy::Dynamic(p) => write!(
                f,
                "dynamic:lo={},hi={},threshold={},timeout={}ms",
                p.lo,
                p.hi,
                p.threshold,
                p.timeout.as_millis()
            ),
            RecordPolicy::Adaptive => f.write_str("adaptive"),
        }
    }
}

/// Parses `4096`, `4k`, `16K`.
fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (digits, mult) = match s.strip_suffix(['k', 'K']) {
        Some(d) => (d, 1024),
        None => (s, 1),
    };
    let n: usize = digits.parse().map_err(|_| format!("{s:?} is not a size (e.g. 4096 or 16k)"))?;
    let n = n.checked_mul(mult).ok_or_else(|| format!("{s:?} is too large"))?;
    if n == 0 {
        return Err("a record size must be greater than 0".into());
    }
    if n > MAX_RECORD {
        return Err(format!("{n} bytes exceeds the TLS maximum record payload of {MAX_RECORD}"));
    }
    Ok(n)
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit_ms) = if let Some(v) = s.strip_suffix("ms") {
        (v, 1.0)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1000.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num.parse().map_err(|_| format!("{s:?} is not a duration (e.g. 1s or 500ms)"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("timeout {s:?} must be greater than 0"));
    }
    Ok(Duration::from_secs_f64(v * unit_ms / 1000.0))
}

impl FromStr for RecordPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (name, args) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        match (name, args) {
            ("static", Some(size)) => Ok(RecordPolicy::Static(parse_size(size)?)),
            ("static", None) => Err("static needs a size, e.g. static:16k".into()),
            ("adaptive", None) => Ok(RecordPolicy::Adaptive),
            ("adaptive", Some(_)) => Err("adaptive takes no parameters".into()),
            ("dynamic", args) => {
                let mut p = DynamicParams::default();
                for kv in args.unwrap_or("").split(',').filter(|s| !s.trim().is_empty()) {
                    let (k, v) = kv
                        .split_once('=')
                        .ok_or_else(|| format!("{kv:?}: expected key=value (lo, hi, threshold, timeout)"))?;
                    match k.trim() {
                        "lo" | "size_lo" => p.lo = parse_size(v)?,
                        "hi" | "size_hi" => p.hi = parse_size(v)?,
                        "threshold" => {
                            p.threshold = v.trim().parse().ok().filter(|t| *t > 0).ok_or_else(|| {
                                format!("threshold {v:?} must be a whole number of records greater than 0")
                            })?
                        }
                        "timeout" => p.timeout = parse_duration(v)?,
                        other => {
                            return Err(format!("unknown dynamic parameter {other:?} (lo, hi, threshold, timeout)"))
                        }
                    }
                }
                if p.lo > p.hi {
                    return Err(format!("lo ({}) must not exceed hi ({})", p.lo, p.hi));
                }
                Ok(RecordPolicy::Dynamic(p))
            }
            _ => Err(format!("unknown record size policy {name:?}: use static:SIZE, dynamic[:k=v,...] or adaptive")),
        }
    }
}

/// Per-connection record sizing state.
#[derive(Debug)]
pub struct RecordSizer {
    policy: RecordPolicy,
    /// Records sent since the dynamic policy last started over.
    records: u32,
    last_send: Option<Instant>,
    /// What a record adds to its payload on the wire, for this connection's suite.
    expansion: usize,
    /// A size already promised to the caller for the next record (see [`RecordSizer::pin_next`]).
    pinned: Option<usize>,
}

impl RecordSizer {
    pub fn new(policy: RecordPolicy, expansion: usize) -> Self {
        RecordSizer { policy, records: 0, last_send: None, expansion, pinned: None }
    }

    /// Payload length of the next record on `socket`, reading its TCP state
    /// when the policy sizes records from it.
    pub fn next_record(&mut self, socket: BorrowedFd<'_>, now: Instant) -> usize {
        if let Some(n) = self.pinned.take() {
            return n;
        }
        let tcp = match self.policy {
            RecordPolicy::Adaptive => TcpState::read(socket).ok(),
            _ => None,
        };
        self.next_len(now, tcp.as_ref()).clamp(1, MAX_RECORD)
    }

    /// The next record's payload length, fixed until the next call to `next_record`
    /// returns it: the adaptive policy reads live TCP state, which may change
    /// between sizing a frame and sending it, and then the frame would straddle
    /// two records.
    pub fn pin_next(&mut self, socket: BorrowedFd<'_>, now: Instant) -> usize {
        self.pinned = None;
        let n = self.next_record(socket, now);
        self.pinned = Some(n);
        n
    }

    /// Payload length of the next record, given the TCP state if the policy uses it.
    fn next_len(&mut self, now: Instant, tcp: Option<&TcpState>) -> usize {
        match self.policy {
            RecordPolicy::Static(n) => n,
            RecordPolicy::Dynamic(p) => {
                if self.last_send.is_some_and(|t| now.duration_since(t) >= p.timeout) {
                    self.records = 0;
                }
                if self.records < p.threshold {
                    p.lo
                } else if self.records < p.threshold.saturating_mul(2) {
                    p.hi
                } else {
                    MAX_RECORD
                }
            }
            RecordPolicy::Adaptive => tcp.map_or(MAX_RECORD, |t| adaptive_len(t, self.expansion)),
        }
    }

    /// Records that a record went out at `now`.
    pub fn sent(&mut self, now: Instant) {
        self.records = self.records.saturating_add(1);
        self.last_send = Some(now);
    }
}

/// Adaptive sizing: each record is about an eighth of the congestion window, in
/// whole segments, between one segment and 16 KiB. A lost segment then holds back
/// at most an eighth of what is in flight, and no record waits for window the
/// connection does not have yet: a fresh connection (initial window of 10 segments)
/// starts with one-segment records, so the first bytes can be decrypted after one
/// round trip even when a later segment is lost; as slow start doubles the window
/// each round trip, records reach 16 KiB within a few round trips, which keeps the
/// per-record CPU and byte cost of large transfers at the static:16k level. A loss
/// shrinks the window, and the records with it; while the connection is recovering
/// they are halved again.
fn adaptive_len(t: &TcpState, expansion: usize) -> usize {
    let mss = (t.mss as usize).max(536);
    // A one-segment record carries exactly one segment on the wire.
    let per_segment = mss - expansion;
    let mut segments = (t.cwnd as usize / 8).max(1);
    if t.recent_loss {
        segments = (segments / 2).max(1);
    }
    (segments * per_segment).min(MAX_RECORD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_policies() {
        assert_eq!("static:16k".parse(), Ok(RecordPolicy::Static(16384)));
        assert_eq!("static:4096".parse(), Ok(RecordPolicy::Static(4096)));
        assert_eq!("dynamic".parse(), Ok(RecordPolicy::Dynamic(DynamicParams::default())));
        let tuned: RecordPolicy = "dynamic:hi=16384,threshold=10".parse().unwrap();
        assert_eq!(tuned, RecordPolicy::Dynamic(DynamicParams { hi: 16384, threshold: 10, ..Default::default() }));
        assert_eq!("adaptive".parse(), Ok(RecordPolicy::Adaptive));
    }

    #[test]
    fn rejects_bad_policies() {
        for bad in [
            "static:0",
            "static:16385",
            "static:17k",
            "static",
            "dynamic:lo=5000,hi=4000",
            "fast",
            "dynamic:threshold=0",
            "dynamic:x=1",
            "static:abc",
        ] {
            assert!(bad.parse::<RecordPolicy>().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn dynamic_ramps_and_resets_after_idle() {
        let p = DynamicParams { threshold: 2, ..Default::default() };
        let mut s = RecordSizer::new(RecordPolicy::Dynamic(p), 22);
        let t0 = Instant::now();
        let mut lens = Vec::new();
        for _ in 0..5 {
            lens.push(s.next_len(t0, None));
            s.sent(t0);
        }
        assert_eq!(lens, [1369, 1369, 4229, 4229, 16384]);
        assert_eq!(s.next_len(t0 + Duration::from_secs(2), None), 1369);
    }

    #[test]
    fn adaptive_grows_with_the_window() {
        let seg = 1448 - 22;
        let at = |cwnd, recent_loss| adaptive_len(&TcpState { mss: 1448, cwnd, recent_loss }, 22);
        assert_eq!(at(10, false), seg);
        assert_eq!(at(20, false), 2 * seg);
        assert_eq!(at(40, false), 5 * seg);
        assert_eq!(at(200, false), MAX_RECORD);
        assert_eq!(at(40, true), 2 * seg);
        assert_eq!(at(1, true), seg);
    }
}
