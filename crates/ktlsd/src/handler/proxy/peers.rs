//! Cache peers (`[cluster] cache_peers`): the fleet's members share their response
//! caches. Each cache key has one owner among the live members, chosen by
//! rendezvous (highest random weight) hashing, so a member joining or leaving moves
//! only the keys it gains or loses; a miss on a member that does not own the key is
//! asked of the owner (over its `peer_listen`, plain HTTP/1.1) instead of the
//! origin, and the owner treats it as its own request (a lookup, a coalesced fill),
//! so the origin sees one request per object for the whole fleet.
//!
//! Here: the member set as the cluster thread last learned it ([`Peers::set_members`]),
//! ownership ([`owner`]), the authentication of peer requests ([`Peers::sign`],
//! [`Peers::verify`]: an HMAC-SHA256 over method, Host, target, member name and a
//! timestamp, keyed from the fleet's secret) and the route of a miss to its owner
//! ([`route`]). Not here: membership in the store (`server::cluster::members`), the
//! listener that answers peers (`server::cluster::peer_listen`), the exchange
//! itself (`super::Exchange`).
//!
//! Loop guard: a request that arrived on `peer_listen` is served on that
//! listener's thread, which is marked ([`mark_peer_thread`]); [`route`] never sends
//! a request from it to another peer.

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use aws_lc_rs::{digest, hmac};

use super::headers::Forwarding;
use super::{Rule, Upstream};

/// The field a peer request carries: `NAME TIMESTAMP MAC`.
pub const PEER_FIELD: &str = "ktlsd-peer";
/// How far a peer request's timestamp may be from the owner's clock, in seconds.
pub const WINDOW: u64 = 30;
/// Most members kept in the set (a larger set in the store is cut, and said).
pub const MAX_MEMBERS: usize = 256;

/// A member of the fleet that answers peer fetches.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PeerMember {
    pub name: String,
    pub addr: SocketAddr,
}

/// This member's view of the fleet's caches, shared by every worker.
pub struct Peers {
    me: PeerMember,
    key: hmac::Key,
    /// The live members, this one included, sorted by name.
    members: RwLock<Vec<PeerMember>>,
}

/// Why a peer request is refused (403).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no {PEER_FIELD} field")]
    Missing,
    #[error("a malformed {PEER_FIELD} field")]
    Malformed,
    #[error("a timestamp more than {WINDOW} s from this member's clock")]
    Expired,
    #[error("a MAC that does not verify with this fleet's secret_file")]
    Forged,
}

/// The figures of cache peers, for `/metrics`.
#[derive(Debug, Default)]
pub struct PeerFigures {
    /// Misses fetched from their owner.
    pub fetches: AtomicU64,
    /// Fetches from an owner that failed (unreachable, timed out, 5xx): the origin was asked instead.
    pub failures: AtomicU64,
    /// Misses of keys this member owns, filled from the origin by itself.
    pub owner_local: AtomicU64,
    /// Requests other members fetched from this one on `peer_listen`.
    pub served: AtomicU64,
    /// Requests to `peer_listen` refused for failing authentication.
    pub refused: AtomicU64,
}

pub static FIGURES: PeerFigures = PeerFigures {
    fetches: AtomicU64::new(0),
    failures: AtomicU64::new(0),
    owner_local: AtomicU64::new(0),
    served: AtomicU64::new(0),
    refused: AtomicU64::new(0),
};

static PEERS: OnceLock<Arc<Peers>> = OnceLock::new();

thread_local! {
    static PEER_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Installs this member's peers, once at start (`[cluster]` applies at a restart only).
pub fn install(peers: Arc<Peers>) {
    let _ = PEERS.set(peers);
}

/// This member's peers, when `cache_peers` is on.
pub fn get() -> Option<&'static Arc<Peers>> {
    PEERS.get()
}

/// Marks the calling thread as the `peer_listen` listener's: nothing it forwards
/// goes to another peer.
pub fn mark_peer_thread() {
    PEER_THREAD.with(|t| t.set(true));
}

fn on_peer_thread() -> bool {
    PEER_THREAD.with(Cell::get)
}

impl Peers {
    /// `me` at its peer address, with the key derived from the fleet's secret.
    pub fn new(me: PeerMember, key: &[u8; 32]) -> Peers {
        let members = RwLock::new(vec![me.clone()]);
        Peers { me, key: hmac::Key::new(hmac::HMAC_SHA256, key), members }
    }

    pub fn me(&self) -> &PeerMember {
        &self.me
    }

    /// Replaces the live set by `members` (this member is always in it).
    pub fn set_members(&self, mut members: Vec<PeerMember>) {
        members.retain(|m| m.name != self.me.name);
        members.push(self.me.clone());
        members.sort();
        members.dedup_by(|a, b| a.name == b.name);
        members.truncate(MAX_MEMBERS);
        if let Ok(mut m) = self.members.write() {
            *m = members;
        }
    }

    /// The live members, sorted by name.
    pub fn members(&self) -> Vec<PeerMember> {
        self.members.read().map(|m| m.clone()).unwrap_or_default()
    }

    /// The owner of `key` among the live members.
    pub fn owner(&self, key: &str) -> PeerMember {
        let members = self.members.read();
        members.ok().and_then(|m| owner(&m, key).cloned()).unwrap_or_else(|| self.me.clone())
    }

    fn mac(&self, method: &str, host: &str, target: &str, name: &str, at: u64) -> hmac::Tag {
        let text = format!("{method}\n{host}\n{target}\n{name}\n{at}");
        hmac::sign(&self.key, text.as_bytes())
    }

    /// The [`PEER_FIELD`] value of a request by this member at `now` (Unix seconds).
    pub fn sign(&self, method: &str, host: &str, target: &str, now: u64) -> String {
        let tag = self.mac(method, host, target, &self.me.name, now);
        format!("{} {now} {}", self.me.name, hex(tag.as_ref()))
    }

    /// The name of the member that signed `field` for this request, if it verifies at `now`.
    pub fn verify(
        &self,
        field: Option<&str>,
        method: &str,
        host: &str,
        target: &str,
        now: u64,
    ) -> Result<String, AuthError> {
        let field = field.ok_or(AuthError::Missing)?;
        let mut parts = field.split(' ');
        let (Some(name), Some(at), Some(mac), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(AuthError::Malformed);
        };
        let at: u64 = at.parse().map_err(|_| AuthError::Malformed)?;
        let mac = unhex(mac).ok_or(AuthError::Malformed)?;
        if name.is_empty() || name.len() > 64 {
            return Err(AuthError::Malformed);
        }
        if at.abs_diff(now) > WINDOW {
            return Err(AuthError::Expired);
        }
        let text = format!("{method}\n{host}\n{target}\n{name}\n{at}");
        hmac::verify(&self.key, text.as_bytes(), &mac).map_err(|_| AuthError::Forged)?;
        Ok(name.to_string())
    }
}

/// The member of `members` with the highest weight for `key` (rendezvous hashing);
/// `None` when there is none.
pub fn owner<'m>(members: &'m [PeerMember], key: &str) -> Option<&'m PeerMember> {
    members.iter().max_by_key(|m| (weight(&m.name, key), &m.name))
}

/// The weight of `member` for `key`: the first 8 bytes of SHA-256(member NUL key).
fn weight(member: &str, key: &str) -> u64 {
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(member.as_bytes());
    ctx.update(&[0]);
    ctx.update(key.as_bytes());
    let d = ctx.finish();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d.as_ref()[..8]);
    u64::from_be_bytes(b)
}

/// A miss sent to its owner: the exchange's rule (the owner's peer address its only
/// upstream), request and fields (the client's target as it came, this hop's
/// authentication added).
pub struct Route {
    pub rule: Arc<Rule>,
    pub fwd: Forwarding,
    pub fields: Vec<(String, String)>,
    pub owner: String,
}

/// Where the miss of the cache key `key` goes: `Some` when another member owns it
/// (and this request did not come from a peer), `None` to fill it here.
pub fn route(rule: &Rule, fwd: &Forwarding, fields: &[(String, String)], key: &str) -> Option<Route> {
    let peers = get()?;
    if on_peer_thread() {
        return None;
    }
    let owner = peers.owner(key);
    if owner.name == peers.me.name {
        FIGURES.owner_local.fetch_add(1, Relaxed);
        return None;
    }
    let upstream = match Upstream::parse(&format!("http://{}", owner.addr)) {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!("cache peers: member {} at {}: {e}", owner.name, owner.addr);
            return None;
        }
    };
    let mut peer_rule = rule.clone();
    peer_rule.upstreams = vec![upstream];
    peer_rule.host = super::HostMode::Preserve;
    peer_rule.tls = None;
    peer_rule.health_check = None;
    let mut peer_fwd = fwd.clone();
    // The owner takes the request as the client sent it, and applies the rule itself.
    peer_fwd.strip = None;
    peer_fwd.control = Default::default();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    // The Host the owner gets (the client's; without one, the owner's address).
    let host = fwd.authority.as_deref().unwrap_or(&peer_rule.upstreams[0].authority);
    let mut fields: Vec<(String, String)> =
        fields.iter().filter(|(n, _)| !n.eq_ignore_ascii_case(PEER_FIELD)).cloned().collect();
    fields.push((PEER_FIELD.to_string(), peers.sign(&fwd.method, host, &fwd.target, now)));
    Some(Route { rule: Arc::new(peer_rule), fwd: peer_fwd, fields, owner: owner.name })
}

/// Notes a fetch from an owner that failed; the origin is asked instead.
pub fn failed(owner: &str, why: &str) {
    FIGURES.failures.fetch_add(1, Relaxed);
    tracing::warn!("cache peers: fetch from member {owner} failed ({why}); asking the origin directly");
}

/// Notes a fetch from an owner that answered.
pub fn fetched() {
    FIGURES.fetches.fetch_add(1, Relaxed);
}

/// The cache peers' lines of `/metrics`, when `cache_peers` is on.
pub fn render(out: &mut String) {
    use std::fmt::Write;
    let Some(peers) = get() else { return };
    let f = &FIGURES;
    for (name, kind, help, v) in [
        (
            "ktlsd_cache_peers_members",
            "gauge",
            "Live members sharing the response cache, this one included.",
            peers.members().len() as u64,
        ),
        (
            "ktlsd_cache_peer_fetches_total",
            "counter",
            "Cache misses fetched from the member that owns the key.",
            f.fetches.load(Relaxed),
        ),
        (
            "ktlsd_cache_peer_failures_total",
            "counter",
            "Fetches from an owner that failed (unreachable, timed out, 5xx); the origin was asked directly.",
            f.failures.load(Relaxed),
        ),
        (
            "ktlsd_cache_peer_owner_local_total",
            "counter",
            "Cache misses of keys this member owns, filled by itself.",
            f.owner_local.load(Relaxed),
        ),
        (
            "ktlsd_cache_peer_served_total",
            "counter",
            "Requests other members fetched from this one on peer_listen.",
            f.served.load(Relaxed),
        ),
        (
            "ktlsd_cache_peer_refused_total",
            "counter",
            "Requests to peer_listen refused (403) for failing authentication.",
            f.refused.load(Relaxed),
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || s.len() > 128 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(names: &[&str]) -> Vec<PeerMember> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| PeerMember { name: n.to_string(), addr: format!("10.0.0.{}:8444", i + 1).parse().unwrap() })
            .collect()
    }

    #[test]
    fn keys_spread_evenly_and_a_leaving_member_moves_only_its_own() {
        let three = members(&["edge-1", "edge-2", "edge-3"]);
        let keys: Vec<String> = (0..10_000).map(|i| format!("GET example.com /obj/{i}")).collect();
        let owners: Vec<&str> = keys.iter().map(|k| owner(&three, k).unwrap().name.as_str()).collect();
        for m in &three {
            let n = owners.iter().filter(|o| **o == m.name).count();
            // 3,333 each; within 5% of it.
            assert!((3166..=3500).contains(&n), "{}: {n} keys", m.name);
        }
        // edge-2 leaves: only its keys move, and they spread over the others.
        let two: Vec<PeerMember> = three.iter().filter(|m| m.name != "edge-2").cloned().collect();
        let mut moved_to = std::collections::BTreeMap::new();
        for (k, before) in keys.iter().zip(&owners) {
            let after = owner(&two, k).unwrap().name.as_str();
            if *before == "edge-2" {
                *moved_to.entry(after).or_insert(0) += 1;
            } else {
                assert_eq!(after, *before, "{k} moved though its owner stayed");
            }
        }
        assert!(moved_to.values().all(|&n| n > 1400), "{moved_to:?}");
        // A fourth joins: it takes about a quarter, only from the others, nothing moves among them.
        let four = members(&["edge-1", "edge-2", "edge-3", "edge-4"]);
        let mut taken = 0;
        for (k, before) in keys.iter().zip(&owners) {
            let after = owner(&four, k).unwrap().name.as_str();
            if after == "edge-4" {
                taken += 1;
            } else {
                assert_eq!(after, *before, "{k} moved between staying members");
            }
        }
        assert!((2250..=2750).contains(&taken), "{taken}");
        // The order members are listed in does not matter, nor does an empty set panic.
        let mut reversed = three.clone();
        reversed.reverse();
        assert!(keys.iter().take(100).all(|k| owner(&three, k) == owner(&reversed, k)));
        assert_eq!(owner(&[], "k"), None);
    }

    #[test]
    fn peer_requests_verify_only_whole_in_time_and_with_the_fleets_key() {
        let me = members(&["edge-1"]).remove(0);
        let a = Peers::new(me.clone(), &[7; 32]);
        let b = Peers::new(PeerMember { name: "edge-2".into(), ..me.clone() }, &[7; 32]);
        let other = Peers::new(me, &[8; 32]);
        let field = a.sign("GET", "example.com", "/a?b", 1000);
        assert_eq!(b.verify(Some(&field), "GET", "example.com", "/a?b", 1010), Ok("edge-1".to_string()));
        assert_eq!(b.verify(Some(&field), "GET", "example.com", "/a?b", 1000 + WINDOW + 1), Err(AuthError::Expired));
        assert_eq!(b.verify(Some(&field), "GET", "example.com", "/a?c", 1000), Err(AuthError::Forged));
        assert_eq!(b.verify(Some(&field), "GET", "example.org", "/a?b", 1000), Err(AuthError::Forged));
        assert_eq!(b.verify(Some(&field), "HEAD", "example.com", "/a?b", 1000), Err(AuthError::Forged));
        assert_eq!(other.verify(Some(&field), "GET", "example.com", "/a?b", 1000), Err(AuthError::Forged));
        let renamed = field.replacen("edge-1", "edge-9", 1);
        assert_eq!(b.verify(Some(&renamed), "GET", "example.com", "/a?b", 1000), Err(AuthError::Forged));
        assert_eq!(b.verify(None, "GET", "h", "/", 0), Err(AuthError::Missing));
        for bad in ["", "edge-1", "edge-1 x 00", "edge-1 1000 zz", "edge-1 1000 0", "a b c d", " 1000 00"] {
            assert_eq!(b.verify(Some(bad), "GET", "h", "/", 1000), Err(AuthError::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn the_member_set_always_holds_this_member_once() {
        let all = members(&["b", "a", "c"]);
        let p = Peers::new(all[0].clone(), &[1; 32]);
        assert_eq!(p.members(), vec![all[0].clone()]);
        p.set_members(vec![all[2].clone(), all[1].clone(), all[2].clone()]);
        let names: Vec<String> = p.members().into_iter().map(|m| m.name).collect();
        assert_eq!(names, ["a", "b", "c"]);
        p.set_members(Vec::new());
        assert_eq!(p.members(), vec![all[0].clone()]);
        assert_eq!(p.owner("anything").name, "b");
    }
}
