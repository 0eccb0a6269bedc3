//! The rate-limit phase: requests per client address, `requests` per `per` with
//! room for `burst` at once, answered `429 Too Many Requests` with `Retry-After`
//! beyond that, as nginx's `limit_req` (HTTP/1.1 requests, HTTP/2 and HTTP/3 streams
//! alike, since every codec enters [`super::pipeline`], which asks it once a request).
//!
//! The state is a [`Limiter`]: a fixed-size table, allocated once when the
//! configuration is loaded and shared by all workers (connections from one client
//! are spread over the workers by `SO_REUSEPORT`, so a table per worker would let
//! it through once per worker). Its memory does not grow with the number of
//! addresses: each address hashes (with a per-process random key) to one bucket of
//! [`WAYS`] slots, and a new address takes the slot with the most credit, which is
//! the one whose loss changes least (a slot with full credit is as good as empty).
//! A client being held back has the least credit, so a flood of other addresses
//! evicts it only for addresses held back as far. Each bucket has its own lock,
//! held for a few instructions.
//!
//! The limit counts in the algorithm of a token bucket written as the GCRA: one
//! time per slot, the theoretical arrival time of the next request.

use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{Header, Response, Status};

/// Slots of each bucket.
pub const WAYS: usize = 8;

/// Addresses a table tracks at once: 2,048 buckets of 200 bytes, 400 KiB.
pub const SLOTS: usize = 16_384;

/// One address's state.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// The address, IPv4 as its IPv4-mapped IPv6 form.
    key: [u8; 16],
    /// Nanoseconds after the table's epoch when the address's credit is full
    /// again; at or before now the slot is free.
    full_at: u64,
}

/// The table of one site's `rate_limit`.
pub struct Limiter {
    /// Time one request costs, in nanoseconds (`per / requests`).
    interval: u64,
    /// Credit an idle address has, in nanoseconds (`burst * interval`).
    capacity: u64,
    buckets: Box<[Mutex<[Slot; WAYS]>]>,
    hasher: RandomState,
    epoch: Instant,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Limiter {{ interval: {}ns, capacity: {}ns, slots: {} }}", self.interval, self.capacity, self.slots())
    }
}

impl PartialEq for Limiter {
    fn eq(&self, other: &Limiter) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for Limiter {}

impl Limiter {
    /// `requests` per `per`, up to `burst` at once, over a table of `slots` addresses
    /// (rounded up to a multiple of [`WAYS`]). All three counts are at least 1.
    pub fn new(requests: u32, per: Duration, burst: u32, slots: usize) -> Limiter {
        let interval = (per.as_nanos() / u128::from(requests.max(1))).clamp(1, u128::from(u64::MAX / 2)) as u64;
        let capacity = interval.saturating_mul(u64::from(burst.max(1)));
        let buckets = (0..slots.div_ceil(WAYS).max(1)).map(|_| Mutex::new([Slot::default(); WAYS])).collect();
        Limiter { interval, capacity, buckets, hasher: RandomState::new(), epoch: Instant::now() }
    }

    /// Addresses the table holds at most.
    pub fn slots(&self) -> usize {
        self.buckets.len() * WAYS
    }

    /// Counts one request from `ip` at `now`: `Ok` to serve it, or how long until
    /// one more would be let through.
    pub fn check(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        let key = match ip.to_canonical() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        };
        // Never 0: a slot at 0 is an empty one.
        let now = now.saturating_duration_since(self.epoch).as_nanos().min(u128::from(u64::MAX / 4)) as u64 + 1;
        let at = (self.hasher.hash_one(key) % self.buckets.len() as u64) as usize;
        // A poisoned lock held only plain numbers: they are still consistent.
        let mut bucket = self.buckets[at].lock().unwrap_or_else(PoisonError::into_inner);
        let slot = match bucket.iter().position(|s| s.key == key && s.full_at > now) {
            Some(i) => &mut bucket[i],
            None => {
                // The slot with the most credit: a free one, or the least-held address.
                let i = (0..WAYS).min_by_key(|&i| bucket[i].full_at).unwrap_or(0);
                bucket[i] = Slot { key, full_at: now };
                &mut bucket[i]
            }
        };
        let next = slot.full_at.max(now).saturating_add(self.interval);
        if next - now > self.capacity {
            return Err(Duration::from_nanos(next - now - self.capacity));
        }
        slot.full_at = next;
        Ok(())
    }

    /// Addresses held back or with credit spent now (for tests and diagnostics).
    #[cfg(test)]
    fn tracked(&self, now: Instant) -> usize {
        let now = now.saturating_duration_since(self.epoch).as_nanos() as u64 + 1;
        self.buckets
            .iter()
            .map(|b| b.lock().unwrap_or_else(PoisonError::into_inner).iter().filter(|s| s.full_at > now).count())
            .sum()
    }
}

/// 429 with Retry-After (whole seconds, at least 1) when `client` is over the limit.
pub fn phase(client: Option<IpAddr>, limiter: Option<&Limiter>) -> Option<Response> {
    let (Some(ip), Some(limiter)) = (client, limiter) else { return None };
    let wait = limiter.check(ip, Instant::now()).err()?;
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    Some(
        Response::refusal(Status::TOO_MANY_REQUESTS, "over the rate_limit for this client address")
            .with(Header::Field("Retry-After".into(), secs.max(1).to_string())),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn rate_burst_and_refill() {
        // 2 per second, bursts of 4.
        let l = Limiter::new(2, Duration::from_secs(1), 4, 64);
        let t0 = Instant::now();
        let a = ip("192.0.2.1");
        for i in 0..4 {
            assert_eq!(l.check(a, t0), Ok(()), "request {i} of the burst");
        }
        let wait = l.check(a, t0).unwrap_err();
        assert!(wait > Duration::from_millis(400) && wait <= Duration::from_millis(500), "{wait:?}");
        // Others are not held back by a's use.
        assert_eq!(l.check(ip("192.0.2.2"), t0), Ok(()));
        // Refused requests cost nothing: after 500 ms one more goes through, then not.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(l.check(a, t1), Ok(()));
        assert!(l.check(a, t1).is_err());
        // After two idle seconds the whole burst is back.
        let t2 = t1 + Duration::from_secs(2);
        for _ in 0..4 {
            assert_eq!(l.check(a, t2), Ok(()));
        }
        assert!(l.check(a, t2).is_err());
        // An IPv4-mapped IPv6 address is the IPv4 client.
        assert!(l.check(ip("::ffff:192.0.2.1"), t2).is_err());
    }

    #[test]
    fn ten_thousand_addresses_stay_within_the_table() {
        let l = Limiter::new(1, Duration::from_secs(60), 2, 1024);
        assert_eq!(l.slots(), 1024);
        let t0 = Instant::now();
        let victim = ip("198.51.100.1");
        for _ in 0..2 {
            assert_eq!(l.check(victim, t0), Ok(()));
        }
        assert!(l.check(victim, t0).is_err(), "held back");
        for i in 0..10_000u32 {
            let addr = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            let _ = l.check(addr, t0);
        }
        for i in 0..10_000u32 {
            let addr = IpAddr::V6(std::net::Ipv6Addr::from(0x2001_0db8_u128 << 96 | u128::from(i)));
            let _ = l.check(addr, t0);
        }
        // The table holds no more than its slots, whatever the number of addresses...
        assert!(l.tracked(t0) <= l.slots(), "{} > {}", l.tracked(t0), l.slots());
        // ...and the flood evicted those with more credit than the held-back client.
        assert!(l.check(victim, t0).is_err(), "the held-back client was evicted by the flood");
        // Its memory is the table's, allocated once.
        assert_eq!(std::mem::size_of::<Slot>(), 24);
        assert_eq!(std::mem::size_of::<Mutex<[Slot; WAYS]>>(), 200);
        let full = Limiter::new(1, Duration::from_secs(1), 1, SLOTS);
        assert_eq!((full.slots(), full.buckets.len() * 200), (16_384, 409_600), "400 KiB per site");
    }

    #[test]
    fn phase_answers_429_with_retry_after() {
        let l = Limiter::new(1, Duration::from_secs(10), 1, 8);
        let a = Some(ip("192.0.2.1"));
        assert!(phase(a, Some(&l)).is_none());
        let r = phase(a, Some(&l)).expect("over the limit");
        assert_eq!(r.status, Status::TOO_MANY_REQUESTS);
        let after: u64 = r.header("Retry-After").unwrap().to_string().parse().unwrap();
        assert!((9..=10).contains(&after), "{after}");
        assert!(phase(None, Some(&l)).is_none(), "no address: nothing to count");
        assert!(phase(a, None).is_none());
    }
}
