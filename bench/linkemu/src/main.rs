//! linkemu: a link emulator in user space for the benches.
//!
//! Opens two TUN devices (layer 3, no packet information header) and forwards every packet
//! read from one to the other after a fixed one-way delay, dropping each with a seeded random
//! loss probability; optionally a rate limit with a bounded queue (a packet that would wait
//! longer than the queue holds is dropped at the tail) and reordering (a share of packets held
//! back by an extra delay, so later ones overtake them). One thread per direction; each reads
//! every packet its device has ready, then writes every packet that is due, and sleeps in
//! `ppoll` until the next is due or a packet arrives. Packet buffers come from a pool per
//! direction, bounded by the queue limit: no allocation per packet once the pool is warm.
//!
//! The devices are created here and vanish when the process exits; moving them into network
//! namespaces and giving them addresses is the caller's (bench/ktlsbench/linkemu.py). Counters
//! go to `--stats FILE` as JSON every 100 ms (written to a temporary file and renamed).
//!
//! Usage: linkemu --dev-a NAME --dev-b NAME [--delay-ms F] [--loss PCT] [--rate-mbit F]
//!        [--queue PKTS] [--reorder PCT] [--reorder-ms F] [--seed N] [--stats FILE]

use std::collections::BinaryHeap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Larger than any packet a TUN device with an MTU up to 9000 hands over.
const BUF: usize = 9216;

#[derive(Debug)]
enum Error {
    Usage(String),
    Open(String, io::Error),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Usage(m) => write!(f, "{m}"),
            Error::Open(dev, e) => write!(f, "cannot create TUN device {dev}: {e}"),
        }
    }
}

#[derive(Clone, Debug)]
struct Config {
    dev_a: String,
    dev_b: String,
    delay: Duration,
    /// Loss probability, 0..=1.
    loss: f64,
    /// Bits per second; 0: no limit.
    rate: f64,
    /// Packets the delay line and the rate queue may hold per direction.
    queue: usize,
    /// Share of packets held back, 0..=1, and by how much.
    reorder: f64,
    reorder_delay: Duration,
    seed: u64,
    stats: Option<String>,
}

fn parse(args: &[String]) -> Result<Config, Error> {
    let mut c = Config {
        dev_a: String::new(),
        dev_b: String::new(),
        delay: Duration::ZERO,
        loss: 0.0,
        rate: 0.0,
        queue: 20_000,
        reorder: 0.0,
        reorder_delay: Duration::from_millis(1),
        seed: 1,
        stats: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| Error::Usage(format!("{flag} needs a value")))?;
        let num = |v: &str| -> Result<f64, Error> {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| Error::Usage(format!("{flag}: not a non-negative number: {v}")))
        };
        match flag.as_str() {
            "--dev-a" => c.dev_a = value.clone(),
            "--dev-b" => c.dev_b = value.clone(),
            "--delay-ms" => c.delay = Duration::from_secs_f64(num(value)? / 1000.0),
            "--loss" => c.loss = num(value)? / 100.0,
            "--rate-mbit" => c.rate = num(value)? * 1e6,
            "--queue" => c.queue = num(value)? as usize,
            "--reorder" => c.reorder = num(value)? / 100.0,
            "--reorder-ms" => c.reorder_delay = Duration::from_secs_f64(num(value)? / 1000.0),
            "--seed" => c.seed = num(value)? as u64,
            "--stats" => c.stats = Some(value.clone()),
            _ => return Err(Error::Usage(format!("unknown option {flag}"))),
        }
    }
    if c.dev_a.is_empty() || c.dev_b.is_empty() || c.dev_a.len() > 15 || c.dev_b.len() > 15 {
        return Err(Error::Usage("--dev-a and --dev-b name the two devices (at most 15 bytes)".into()));
    }
    if c.loss > 1.0 || c.reorder > 1.0 || c.queue == 0 {
        return Err(Error::Usage("--loss and --reorder are percentages; --queue at least 1".into()));
    }
    Ok(c)
}

/// A TUN device (IFF_TUN | IFF_NO_PI), non-blocking.
fn open_tun(name: &str) -> Result<File, Error> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/net/tun")
        .map_err(|e| Error::Open(name.into(), e))?;
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes one ifreq, which outlives the call.
    if unsafe { libc::ioctl(f.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
        return Err(Error::Open(name.into(), io::Error::last_os_error()));
    }
    Ok(f)
}

/// splitmix64: small, fast, and the same sequence for the same seed.
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Default)]
struct Counters {
    packets_in: AtomicU64,
    bytes_in: AtomicU64,
    lost: AtomicU64,
    queue_drops: AtomicU64,
    reordered: AtomicU64,
    packets_out: AtomicU64,
    bytes_out: AtomicU64,
    write_errors: AtomicU64,
}

impl Counters {
    fn json(&self) -> String {
        let v = |a: &AtomicU64| a.load(Relaxed);
        format!(
            "{{\"packets_in\": {}, \"bytes_in\": {}, \"lost\": {}, \"queue_drops\": {}, \"reordered\": {}, \
             \"packets_out\": {}, \"bytes_out\": {}, \"write_errors\": {}}}",
            v(&self.packets_in),
            v(&self.bytes_in),
            v(&self.lost),
            v(&self.queue_drops),
            v(&self.reordered),
            v(&self.packets_out),
            v(&self.bytes_out),
            v(&self.write_errors)
        )
    }
}

/// A packet in the delay line: due at `due`, ties kept in arrival order by `seq`.
struct Held {
    due: Instant,
    seq: u64,
    buf: Vec<u8>,
    len: usize,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.seq) == (o.due, o.seq)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    // Reversed: BinaryHeap is a max-heap and the earliest packet must come out first.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.due, o.seq).cmp(&(self.due, self.seq))
    }
}

/// One direction: packets read from `from` are written to `to`. Runs until a read fails
/// with anything but "nothing ready" (the device is gone).
fn direction(cfg: Config, mut from: File, mut to: File, mut rng: Rng, c: Arc<Counters>) -> io::Error {
    let mut line: BinaryHeap<Held> = BinaryHeap::with_capacity(cfg.queue.min(65_536));
    let mut pool: Vec<Vec<u8>> = Vec::new();
    let mut seq = 0u64;
    // When the rate-limited link is next free; packets queue behind it.
    let mut link_free = Instant::now();
    let mut pfd = libc::pollfd { fd: from.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    loop {
        // Everything the device has ready.
        let now = Instant::now();
        loop {
            let mut buf = pool.pop().unwrap_or_else(|| vec![0u8; BUF]);
            let len = match from.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    pool.push(buf);
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    pool.push(buf);
                    continue;
                }
                Err(e) => return e,
            };
            c.packets_in.fetch_add(1, Relaxed);
            c.bytes_in.fetch_add(len as u64, Relaxed);
            if cfg.loss > 0.0 && rng.next_f64() < cfg.loss {
                c.lost.fetch_add(1, Relaxed);
                pool.push(buf);
                continue;
            }
            if line.len() >= cfg.queue {
                c.queue_drops.fetch_add(1, Relaxed);
                pool.push(buf);
                continue;
            }
            let mut leaves = now;
            if cfg.rate > 0.0 {
                // Serialised behind the packets ahead of it; dropped if that wait is longer
                // than the queue's worth of full-sized packets takes to drain.
                let start = link_free.max(now);
                let wait = start - now;
                let limit = Duration::from_secs_f64(cfg.queue as f64 * 1500.0 * 8.0 / cfg.rate);
                if wait > limit {
                    c.queue_drops.fetch_add(1, Relaxed);
                    pool.push(buf);
                    continue;
                }
                link_free = start + Duration::from_secs_f64(len as f64 * 8.0 / cfg.rate);
                leaves = link_free;
            }
            let mut due = leaves + cfg.delay;
            if cfg.reorder > 0.0 && rng.next_f64() < cfg.reorder {
                c.reordered.fetch_add(1, Relaxed);
                due += cfg.reorder_delay;
            }
            seq += 1;
            line.push(Held { due, seq, buf, len });
        }
        // Everything that is due.
        let now = Instant::now();
        while line.peek().is_some_and(|h| h.due <= now) {
            let Some(h) = line.pop() else { break };
            match to.write(&h.buf[..h.len]) {
                Ok(_) => {
                    c.packets_out.fetch_add(1, Relaxed);
                    c.bytes_out.fetch_add(h.len as u64, Relaxed);
                }
                // The device is down or its namespace's stack refused the packet: a loss too.
                Err(_) => {
                    c.write_errors.fetch_add(1, Relaxed);
                }
            }
            if pool.len() < cfg.queue {
                pool.push(h.buf);
            }
        }
        // Sleep until the next packet is due or one arrives.
        let tmo = line.peek().map(|h| {
            let d = h.due.saturating_duration_since(Instant::now());
            libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as libc::c_long }
        });
        let tp = tmo.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: one pollfd and an optional timespec, both alive across the call.
        let r = unsafe { libc::ppoll(&mut pfd, 1, tp, std::ptr::null()) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return e;
            }
        }
    }
}

fn write_stats(path: &str, a: &Counters, b: &Counters, started: Instant) {
    let tmp = format!("{path}.tmp");
    let body = format!(
        "{{\"seconds\": {:.3}, \"a_to_b\": {}, \"b_to_a\": {}}}\n",
        started.elapsed().as_secs_f64(),
        a.json(),
        b.json()
    );
    if std::fs::write(&tmp, body).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

fn run() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cfg = parse(&args)?;
    let a = open_tun(&cfg.dev_a)?;
    let b = open_tun(&cfg.dev_b)?;
    let dup = |f: &File, name: &str| f.try_clone().map_err(|e| Error::Open(name.into(), e));
    let (a2, b2) = (dup(&a, &cfg.dev_a)?, dup(&b, &cfg.dev_b)?);
    let (ab, ba) = (Arc::new(Counters::default()), Arc::new(Counters::default()));
    let started = Instant::now();
    // Each direction draws from its own stream, so one direction's traffic does not shift
    // the other's losses.
    let threads = [
        {
            let (cfg, c) = (cfg.clone(), ab.clone());
            let rng = Rng(cfg.seed.wrapping_mul(2));
            std::thread::spawn(move || direction(cfg, a, b2, rng, c))
        },
        {
            let (cfg, c) = (cfg.clone(), ba.clone());
            let rng = Rng(cfg.seed.wrapping_mul(2) + 1);
            std::thread::spawn(move || direction(cfg, b, a2, rng, c))
        },
    ];
    println!("ready");
    let _ = io::stdout().flush();
    while threads.iter().all(|t| !t.is_finished()) {
        if let Some(p) = &cfg.stats {
            write_stats(p, &ab, &ba, started);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if let Some(p) = &cfg.stats {
        write_stats(p, &ab, &ba, started);
    }
    for t in threads {
        if let Ok(e) = t.join() {
            eprintln!("linkemu: a direction stopped: {e}");
        }
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("linkemu: {e}");
        std::process::exit(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_and_refuses() {
        let c = parse(&args("--dev-a x --dev-b y --delay-ms 50 --loss 1.5 --seed 7")).unwrap();
        assert_eq!(c.delay, Duration::from_millis(50));
        assert!((c.loss - 0.015).abs() < 1e-12);
        for bad in [
            "--dev-a x",
            "--dev-a x --dev-b y --loss 101",
            "--dev-a x --dev-b y --loss -1",
            "--dev-a x --dev-b y --delay-ms",
            "--dev-a x --dev-b y --frob 1",
            "--dev-a x --dev-b y --queue 0",
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn rng_is_seeded_and_uniform() {
        let draw = |seed| {
            let mut r = Rng(seed);
            (0..100_000).filter(|_| r.next_f64() < 0.03).count()
        };
        assert_eq!(draw(5), draw(5));
        let n = draw(5) as f64 / 100_000.0;
        assert!((n - 0.03).abs() < 0.002, "{n}");
    }

    #[test]
    fn heap_releases_earliest_first() {
        let t = Instant::now();
        let mut h = BinaryHeap::new();
        for (ms, seq) in [(5, 1), (1, 2), (1, 3), (3, 4)] {
            h.push(Held { due: t + Duration::from_millis(ms), seq, buf: vec![], len: 0 });
        }
        let order: Vec<u64> = std::iter::from_fn(|| h.pop().map(|x| x.seq)).collect();
        assert_eq!(order, [2, 3, 4, 1]);
    }
}
