//! `max_connections_per_ip`: how many connections each client address holds, over
//! all workers, so that one more than the limit is refused at accept (as nginx's
//! `limit_conn`). The count is kept for the life of the process, across reloads,
//! since connections outlive the configuration they started with. Without the
//! setting the limit is [`default_limit`]: a quarter of the server's connections.
//!
//! Its memory is bounded by the connections open: an address is in the table only
//! while it holds one (its [`Slot`] guard gives it back on drop, a panic included).
//! One lock for the table: it is taken twice per connection, at accept and at the
//! end, never on the data path. Not here: the per-request rate limit
//! (`handler::limit`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// The limit when `max_connections_per_ip` is not set: a quarter of the
/// connections the server holds (`workers` times each worker's cap), and at least
/// [`DEFAULT_FLOOR`] (or all of them when the server holds fewer). One address
/// then cannot take the server's connections and the descriptors behind them, nor
/// can three; yet many clients behind one address (a NAT, a company's proxy) still
/// get a large share, which a small fixed number would deny.
pub fn default_limit(workers: usize, cap_per_worker: usize) -> u32 {
    let total = u32::try_from(workers.max(1).saturating_mul(cap_per_worker)).unwrap_or(u32::MAX);
    (total / 4).max(DEFAULT_FLOOR.min(total)).max(1)
}

/// The least default limit: a browser opens up to six connections per origin, so
/// a few people behind one address are never refused by default, however small
/// `max_connections` is set.
const DEFAULT_FLOOR: u32 = 16;

/// Connections open per client address, shared by the workers.
#[derive(Debug, Default)]
pub struct PerIp {
    open: Mutex<HashMap<IpAddr, u32>>,
}

/// One counted connection; dropping it gives its place back.
#[derive(Debug)]
pub struct Slot {
    table: Arc<PerIp>,
    ip: IpAddr,
}

impl PerIp {
    /// Counts a connection from `ip` unless it already holds `limit`: `None` then.
    pub fn enter(table: &Arc<PerIp>, ip: IpAddr, limit: u32) -> Option<Slot> {
        let ip = ip.to_canonical();
        let mut open = table.open.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(ip).or_insert(0);
        if *n >= limit {
            if *n == 0 {
                open.remove(&ip);
            }
            return None;
        }
        *n += 1;
        Some(Slot { table: table.clone(), ip })
    }

    /// Addresses holding a connection now.
    #[cfg(test)]
    fn addresses(&self) -> usize {
        self.open.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.table.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_limit_is_a_quarter_of_the_connections() {
        // (workers, cap per worker, limit)
        let cases = [(1, 96, 24), (2, 4984, 2492), (0, 96, 24), (1, 40, 16), (4, 3, 12), (1, 5, 5), (1, 0, 1)];
        for (workers, cap, want) in cases {
            assert_eq!(default_limit(workers, cap), want, "{workers} workers of {cap}");
        }
        assert_eq!(default_limit(usize::MAX, usize::MAX), u32::MAX / 4);
    }

    #[test]
    fn limit_per_address_and_release() {
        let t = Arc::new(PerIp::default());
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let first = PerIp::enter(&t, a, 2).expect("first");
        let second = PerIp::enter(&t, "::ffff:192.0.2.1".parse().unwrap(), 2).expect("second, the same client");
        assert!(PerIp::enter(&t, a, 2).is_none(), "third refused");
        let other = PerIp::enter(&t, b, 2).expect("another address is not held back");
        drop(first);
        let again = PerIp::enter(&t, a, 2).expect("a place was given back");
        drop((second, other, again));
        assert_eq!(t.addresses(), 0, "no address is kept once its connections end");
        for i in 0..10_000u32 {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(i));
            drop(PerIp::enter(&t, ip, 1));
        }
        assert_eq!(t.addresses(), 0);
    }
}
