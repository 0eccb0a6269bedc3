//! Traffic metrics by label: connections by record layer and protocol, requests
//! by status class and method, bytes by record layer, and the histograms the
//! exporter and the advisor read (response time, time to first byte, body size,
//! and each connection's RTT and loss at its end). Fixed label sets, so every
//! series is an array slot: no map, no allocation on the hot path.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::{Counter, Stats};
use crate::vocab::{BodyPath, HttpVersion, Method, RecordLayer};

/// The initial congestion window of Linux (10 segments of 1460 bytes): a
/// response body over it needs at least one more round trip.
pub const INITIAL_WINDOW_BYTES: u64 = 14_600;

/// The methods requests are counted under, by index: the two served, and the rest.
pub const METHODS: [&str; 3] = ["GET", "HEAD", "other"];

/// `method`'s index in [`METHODS`]; a request whose head could not be read is "other".
fn method_index(method: Option<&Method>) -> usize {
    match method {
        Some(Method::Get) => 0,
        Some(Method::Head) => 1,
        _ => 2,
    }
}

/// A body path's index in [`Traffic::body_by_path`]: sendfile, copy, splice.
fn path_index(p: BodyPath) -> usize {
    match p {
        BodyPath::Sendfile => 0,
        BodyPath::Copy => 1,
        BodyPath::Splice => 2,
    }
}

/// Status classes `1xx` to `5xx`, by index.
pub const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

pub(super) fn class_index(status: u16) -> usize {
    (usize::from(status / 100)).clamp(1, 5) - 1
}

/// Counts of values at or under each bound (Prometheus `le`), one more slot
/// for values over the last bound, and their sum. Values are whole units
/// (microseconds, bytes, parts per million); the exporter scales them.
#[derive(Debug)]
pub struct Histogram {
    pub bounds: &'static [u64],
    counts: Vec<Counter>,
    sum: Counter,
}

impl Histogram {
    pub fn new(bounds: &'static [u64]) -> Histogram {
        Histogram { bounds, counts: (0..=bounds.len()).map(|_| Counter::new(0)).collect(), sum: Counter::new(0) }
    }

    pub fn record(&self, v: u64) {
        let i = self.bounds.partition_point(|&b| b < v);
        Stats::bump(&self.counts[i]);
        Stats::add_to(&self.sum, v);
    }

    /// Per-slot counts (not cumulative); the last slot is over the last bound.
    pub fn counts(&self) -> Vec<u64> {
        self.counts.iter().map(|c| c.load(Relaxed)).collect()
    }

    pub fn sum(&self) -> u64 {
        self.sum.load(Relaxed)
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// The bound at or under which a share `q` of the values fall: `Some(bound)`,
    /// or `None` when there is no value or that share reaches past the last bound.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let want = ((q * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts().into_iter().enumerate() {
            seen += c;
            if seen >= want {
                return self.bounds.get(i).copied();
            }
        }
        None
    }

    fn add(&self, other: &Histogram) {
        for (a, b) in self.counts.iter().zip(&other.counts) {
            Stats::add_to(a, b.load(Relaxed));
        }
        Stats::add_to(&self.sum, other.sum());
    }
}

/// Response and first-byte times, microseconds: 0.5 ms to 10 s.
pub const TIME_BOUNDS_US: &[u64] = &[
    500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000,
    10_000_000,
];
/// Response body sizes, bytes, with the record and window sizes the advisor decides on.
pub const SIZE_BOUNDS: &[u64] = &[
    0,
    512,
    1_024,
    2_048,
    4_096,
    8_192,
    INITIAL_WINDOW_BYTES,
    16_384,
    32_768,
    65_536,
    131_072,
    262_144,
    524_288,
    1_048_576,
    4_194_304,
    16_777_216,
    67_108_864,
];
/// Per-connection loss (retransmitted / sent segments), parts per million: 0 to 20%.
pub const LOSS_BOUNDS_PPM: &[u64] = &[0, 1_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000];
/// Per-connection smoothed RTT, microseconds: 1 ms to 1 s.
pub const RTT_BOUNDS_US: &[u64] = &[1_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000];

/// What `TCP_INFO` says of a connection when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpEnd {
    /// Smoothed round-trip time, microseconds.
    pub rtt_us: u32,
    /// Segments retransmitted over the connection's life.
    pub retransmits: u32,
    /// Segments sent over the connection's life, retransmissions included.
    pub segments: u32,
}

impl TcpEnd {
    /// Retransmitted segments per million sent.
    pub fn loss_ppm(&self) -> u64 {
        if self.segments == 0 {
            return 0;
        }
        u64::from(self.retransmits) * 1_000_000 / u64::from(self.segments)
    }
}

/// One worker's traffic by label; see the module docs.
#[derive(Debug)]
pub struct Traffic {
    /// Open connections, by [`RecordLayer`] then [`HttpVersion`].
    pub open: [[Counter; 3]; 3],
    /// Connections that got a record layer, by [`RecordLayer`] then [`HttpVersion`].
    pub connections: [[Counter; 3]; 3],
    pub handshakes_ok: Counter,
    pub handshakes_resumed: Counter,
    /// Requests answered, by status class then [`METHODS`].
    pub requests: [[Counter; 3]; 5],
    /// Body bytes sent, by [`RecordLayer`].
    pub body_bytes: [Counter; 3],
    /// HTTP/1.1 connections waiting for their next request now (a gauge).
    pub idle: Counter,
    /// Requests answered, by [`HttpVersion`].
    pub requests_by_protocol: [Counter; 3],
    /// Body bytes sent, by how they left: [`BodyPath`] (sendfile, copy, splice).
    pub body_by_path: [Counter; 3],
    /// Plain-HTTP (port 80) answers: redirects, ACME HTTP-01, refusals; by status class.
    pub plain_requests: [Counter; 5],
    pub response_time: Histogram,
    pub ttfb: Histogram,
    pub body_size: Histogram,
    /// Largest response body sent.
    pub body_max: Counter,
    /// Responses whose body is larger than [`INITIAL_WINDOW_BYTES`].
    pub over_initial_window: Counter,
    /// Connections whose `TCP_INFO` was read at their end.
    pub tcp_samples: Counter,
    /// Of those, connections that retransmitted anything.
    pub lossy: Counter,
    pub loss: Histogram,
    pub rtt: Histogram,
}

impl Default for Traffic {
    fn default() -> Traffic {
        Traffic {
            open: Default::default(),
            connections: Default::default(),
            handshakes_ok: Counter::new(0),
            handshakes_resumed: Counter::new(0),
            requests: Default::default(),
            body_bytes: Default::default(),
            idle: Counter::new(0),
            requests_by_protocol: Default::default(),
            body_by_path: Default::default(),
            plain_requests: Default::default(),
            response_time: Histogram::new(TIME_BOUNDS_US),
            ttfb: Histogram::new(TIME_BOUNDS_US),
            body_size: Histogram::new(SIZE_BOUNDS),
            body_max: Counter::new(0),
            over_initial_window: Counter::new(0),
            tcp_samples: Counter::new(0),
            lossy: Counter::new(0),
            loss: Histogram::new(LOSS_BOUNDS_PPM),
            rtt: Histogram::new(RTT_BOUNDS_US),
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Traffic {
    /// A connection got its record layer: it is counted, and open until [`Traffic::closed`].
    pub fn opened(&self, layer: RecordLayer, protocol: HttpVersion) {
        Stats::bump(&self.connections[layer as usize][protocol as usize]);
        Stats::bump(&self.open[layer as usize][protocol as usize]);
    }

    pub fn closed(&self, layer: RecordLayer, protocol: HttpVersion) {
        Stats::drop_one(&self.open[layer as usize][protocol as usize]);
    }

    /// One answered request: `bytes` of body sent over `layer`, the whole exchange
    /// taking `total`, the response starting after `ttfb`.
    pub fn request(
        &self,
        method: Option<&Method>,
        status: u16,
        layer: RecordLayer,
        bytes: u64,
        total: Duration,
        ttfb: Duration,
    ) {
        Stats::bump(&self.requests[class_index(status)][method_index(method)]);
        Stats::add_to(&self.body_bytes[layer as usize], bytes);
        self.response_time.record(micros(total));
        self.ttfb.record(micros(ttfb));
        self.body_size.record(bytes);
        if bytes > self.body_max.load(Relaxed) {
            self.body_max.store(bytes, Relaxed);
        }
        if bytes > INITIAL_WINDOW_BYTES {
            Stats::bump(&self.over_initial_window);
        }
    }

    /// The protocol and body path of one answered request (beside [`Traffic::request`]).
    pub fn carried(&self, protocol: HttpVersion, body: Option<BodyPath>, bytes: u64) {
        Stats::bump(&self.requests_by_protocol[protocol as usize]);
        if let Some(path) = body {
            Stats::add_to(&self.body_by_path[path_index(path)], bytes);
        }
    }

    /// One plain-HTTP answer with `status`.
    pub fn plain_request(&self, status: u16) {
        Stats::bump(&self.plain_requests[class_index(status)]);
    }

    /// A connection's TCP state at its end.
    pub fn tcp_end(&self, end: TcpEnd) {
        Stats::bump(&self.tcp_samples);
        if end.retransmits > 0 {
            Stats::bump(&self.lossy);
        }
        self.loss.record(end.loss_ppm());
        self.rtt.record(u64::from(end.rtt_us));
    }

    /// Adds `other`'s figures to these (see [`super::Metrics::add`]).
    pub fn add(&self, other: &Traffic) {
        let pairs = |a: &[[Counter; 3]; 3], b: &[[Counter; 3]; 3]| {
            for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
                Stats::add_to(x, y.load(Relaxed));
            }
        };
        pairs(&self.open, &other.open);
        pairs(&self.connections, &other.connections);
        for (x, y) in self.requests.iter().flatten().zip(other.requests.iter().flatten()) {
            Stats::add_to(x, y.load(Relaxed));
        }
        for (x, y) in self.body_bytes.iter().zip(&other.body_bytes) {
            Stats::add_to(x, y.load(Relaxed));
        }
        for (x, y) in self.requests_by_protocol.iter().zip(&other.requests_by_protocol) {
            Stats::add_to(x, y.load(Relaxed));
        }
        for (x, y) in self.body_by_path.iter().zip(&other.body_by_path) {
            Stats::add_to(x, y.load(Relaxed));
        }
        for (x, y) in self.plain_requests.iter().zip(&other.plain_requests) {
            Stats::add_to(x, y.load(Relaxed));
        }
        for (x, y) in [
            (&self.handshakes_ok, &other.handshakes_ok),
            (&self.handshakes_resumed, &other.handshakes_resumed),
            (&self.over_initial_window, &other.over_initial_window),
            (&self.tcp_samples, &other.tcp_samples),
            (&self.lossy, &other.lossy),
            (&self.idle, &other.idle),
        ] {
            Stats::add_to(x, y.load(Relaxed));
        }
        self.body_max.store(self.body_max.load(Relaxed).max(other.body_max.load(Relaxed)), Relaxed);
        self.response_time.add(&other.response_time);
        self.ttfb.add(&other.ttfb);
        self.body_size.add(&other.body_size);
        self.loss.add(&other.loss);
        self.rtt.add(&other.rtt);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_and_quantiles() {
        static B: &[u64] = &[10, 100, 1000];
        let h = Histogram::new(B);
        assert_eq!(h.quantile(0.5), None, "empty");
        // (value, slot): a value equal to a bound is in that bound's slot (Prometheus `le`).
        for (v, slot) in [(0, 0), (10, 0), (11, 1), (100, 1), (101, 2), (5000, 3)] {
            let before = h.counts()[slot];
            h.record(v);
            assert_eq!(h.counts()[slot], before + 1, "value {v}");
        }
        assert_eq!(h.count(), 6);
        assert_eq!(h.sum(), 10 + 11 + 100 + 101 + 5000);
        assert_eq!(h.quantile(0.33), Some(10));
        assert_eq!(h.quantile(0.5), Some(100));
        assert_eq!(h.quantile(0.8), Some(1000));
        assert_eq!(h.quantile(0.95), None, "past the last bound");
    }

    #[test]
    fn sums_over_workers() {
        let (a, b) = (Traffic::default(), Traffic::default());
        a.opened(RecordLayer::Kernel, HttpVersion::Http1);
        b.opened(RecordLayer::Kernel, HttpVersion::Http1);
        b.closed(RecordLayer::Kernel, HttpVersion::Http1);
        a.request(
            Some(&Method::Get),
            200,
            RecordLayer::Kernel,
            20_000,
            Duration::from_millis(3),
            Duration::from_millis(1),
        );
        b.request(
            Some(&Method::Head),
            404,
            RecordLayer::Userspace,
            100,
            Duration::from_millis(3),
            Duration::from_millis(1),
        );
        b.tcp_end(TcpEnd { rtt_us: 40_000, retransmits: 1, segments: 100 });
        let t = Traffic::default();
        t.add(&a);
        t.add(&b);
        assert_eq!(Stats::get(&t.connections[0][0]), 2);
        assert_eq!(Stats::get(&t.open[0][0]), 1);
        assert_eq!(Stats::get(&t.requests[1][0]), 1);
        assert_eq!(Stats::get(&t.requests[3][1]), 1);
        assert_eq!((Stats::get(&t.body_bytes[0]), Stats::get(&t.body_bytes[1])), (20_000, 100));
        assert_eq!((Stats::get(&t.body_max), Stats::get(&t.over_initial_window)), (20_000, 1));
        assert_eq!((Stats::get(&t.tcp_samples), Stats::get(&t.lossy)), (1, 1));
        assert_eq!(t.loss.quantile(1.0), Some(10_000), "1% loss");
        assert_eq!(t.body_size.count(), 2);
    }
}
