//! Who shares the response cache (`[cluster] cache_peers`): each member announces
//! itself (name, `peer_listen` address) at `PREFIX/members/NAME`, a record sealed
//! with the fleet's secret and held by a lease it renews every [`RENEW`]; a member
//! that dies leaves the set when its lease expires ([`LEASE_TTL`]). Every member
//! watches the prefix and hands the set to the cache's router
//! (`handler::proxy::peers`), which picks each key's owner among them.
//!
//! The store down: the last set seen stays in use (this member always in it), and
//! a member in it that has died is found unreachable per request (its keys then go
//! to the origin directly). A record that does not open, or does not parse, is
//! logged once and left out.
//!
//! Cancel safety: [`follow`] holds nothing between awaits but the lease, which
//! expires by itself when it is dropped.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::secret::Secret;
use super::store::{Etcd, Storage, StoreError};
use crate::handler::proxy::peers::{PeerMember, Peers};

/// How long a member's record outlives the member.
pub const LEASE_TTL: Duration = Duration::from_secs(6);
/// How often the lease is renewed.
const RENEW: Duration = Duration::from_secs(2);
/// Most member records read from the store at once.
const MAX_MEMBERS: usize = 1024;
/// Longest wait between two attempts to reach the store.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// A member's record as stored (sealed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    name: String,
    addr: std::net::SocketAddr,
}

/// The members' prefix under the fleet's.
pub fn prefix(fleet: &str) -> String {
    format!("{fleet}/members/")
}

/// The set the records under the members' prefix give; `bad` gets the keys of
/// those that are unusable (not sealed with this secret, not a record, or under a
/// name that is not theirs).
fn decode(secret: &Secret, kvs: &[(String, Vec<u8>)], prefix: &str, bad: &mut Vec<String>) -> Vec<PeerMember> {
    let mut out = Vec::new();
    for (key, sealed) in kvs {
        let record = secret
            .open(key, sealed)
            .ok()
            .and_then(|plain| serde_json::from_slice::<Record>(&plain).ok())
            .filter(|r| key.strip_prefix(prefix) == Some(r.name.as_str()));
        match record {
            Some(r) => out.push(PeerMember { name: r.name, addr: r.addr }),
            None => bad.push(key.clone()),
        }
    }
    out
}

/// Announces this member and follows the set, again after each loss of the
/// store, until `stop`.
pub async fn run(etcd: &[String], fleet_prefix: &str, secret: &Secret, peers: &Peers, mut stop: watch::Receiver<bool>) {
    let mut backoff = Duration::from_secs(1);
    let mut said_bad = BTreeSet::new();
    while !*stop.borrow() {
        let ended = tokio::select! {
            r = follow(etcd, fleet_prefix, secret, peers, &mut said_bad) => r,
            _ = stop.changed() => return,
        };
        if let Err(e) = ended {
            tracing::warn!(
                "cache peers: membership lost the store ({e}); keeping the last set of {} member(s)",
                peers.members().len()
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One connection to the store: announces, renews and follows the set until the store fails.
async fn follow(
    endpoints: &[String],
    fleet_prefix: &str,
    secret: &Secret,
    peers: &Peers,
    said_bad: &mut BTreeSet<String>,
) -> Result<(), StoreError> {
    let mut etcd = Etcd::connect(endpoints).await?;
    let prefix = prefix(fleet_prefix);
    let me = peers.me().clone();
    let key = format!("{prefix}{}", me.name);
    let plain = serde_json::to_vec(&Record { name: me.name.clone(), addr: me.addr })
        .map_err(|e| StoreError::Unreachable(format!("cannot encode the member record: {e}")))?;
    let sealed = secret.seal(&key, &plain).ok_or_else(|| StoreError::Unreachable("no random bytes".into()))?;
    let mut watch = etcd.watch(&prefix).await?;
    let mut lease = etcd.put_leased(&key, sealed.clone(), LEASE_TTL).await?;
    tracing::info!("cache peers: member {} announced at {}", me.name, me.addr);
    let mut renew = tokio::time::interval(RENEW);
    let mut last: Vec<PeerMember> = Vec::new();
    loop {
        let kvs = etcd.list(&prefix, MAX_MEMBERS).await?;
        let mut bad = Vec::new();
        let set = decode(secret, &kvs, &prefix, &mut bad);
        for k in bad {
            if said_bad.insert(k.clone()) {
                tracing::error!(
                    "cache peers: the record at {k} is not a member sealed with this secret_file; left out"
                );
            }
        }
        peers.set_members(set);
        let now = peers.members();
        if now != last {
            let names: Vec<String> = now.iter().map(|m| format!("{}={}", m.name, m.addr)).collect();
            tracing::info!("cache peers: {} member(s): {}", now.len(), names.join(", "));
            last = now;
        }
        tokio::select! {
            m = watch.message() => {
                m?.ok_or_else(|| StoreError::Unreachable("the watch ended".into()))?;
            }
            _ = renew.tick() => {
                if !etcd.renew_lease(lease).await? {
                    // Expired (the store was away longer than the lease): announced again.
                    lease = etcd.put_leased(&key, sealed.clone(), LEASE_TTL).await?;
                    tracing::info!("cache peers: member {} announced again", me.name);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_decode_only_when_sealed_by_the_fleet_under_their_own_name() {
        let secret = Secret::from_test_bytes(&[3; 32]);
        let other = Secret::from_test_bytes(&[4; 32]);
        let p = prefix("/k");
        let rec = |name: &str, addr: &str| {
            serde_json::to_vec(&Record { name: name.into(), addr: addr.parse().unwrap() }).unwrap()
        };
        let kvs = vec![
            (format!("{p}a"), secret.seal(&format!("{p}a"), &rec("a", "10.0.0.1:8444")).unwrap()),
            (format!("{p}b"), other.seal(&format!("{p}b"), &rec("b", "10.0.0.2:8444")).unwrap()),
            (format!("{p}c"), secret.seal(&format!("{p}c"), &rec("d", "10.0.0.3:8444")).unwrap()),
            (format!("{p}e"), b"garbage".to_vec()),
            (format!("{p}f"), secret.seal(&format!("{p}f"), b"{}").unwrap()),
        ];
        let mut bad = Vec::new();
        let set = decode(&secret, &kvs, &p, &mut bad);
        assert_eq!(set, vec![PeerMember { name: "a".into(), addr: "10.0.0.1:8444".parse().unwrap() }]);
        assert_eq!(bad, [format!("{p}b"), format!("{p}c"), format!("{p}e"), format!("{p}f")]);
    }
}
