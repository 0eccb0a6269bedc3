//! The member's side of a fleet (`[cluster]`): state shared with the other members
//! through a store (etcd), so that a client may reach any member.
//!
//! Shared now: ACME ([`acme`]: one account per CA, one order per name at a time,
//! the challenge answers mirrored to every member, the certificates), the session-ticket keys ([`tickets`]: one member rotates them under
//! a lock, every member learns them by watch, so a ticket issued by one member
//! resumes on every other), and the fleet's secret ([`secret`]), from which the
//! records in the store are sealed and QUIC's stateless-reset and Retry token keys
//! derived (a Retry token from one member validates on another).
//!
//! The store never stops the member from serving. [`Member::new`] installs the keys
//! the member last saw (a sealed copy in its state directory) before the first
//! connection, or a key of its own when it has none; the store's thread
//! ([`Member::start`]) connects with backoff, says when the store goes up or down
//! (a log line at each change, `ktlsd_cluster_store_up`) and carries on with the keys
//! it has meanwhile. Not the store's protocol (`store`), nor what TLS does with
//! the keys (`tls::config::Ticketer`).
//!
//! With `cache_peers`, the members also share their response caches: each announces
//! itself and follows the others ([`members`]), and answers their fetches on
//! `peer_listen` ([`peer_listen`]); which member owns a key, and the fetch itself,
//! are the proxy's (`handler::proxy::peers`).

pub mod acme;
mod members;
mod peer_listen;
pub mod probe;
pub mod secret;
mod store;
mod tickets;

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;

use crate::acme::Challenges;
use crate::config::cluster::Cluster;
use crate::handler::proxy::peers::{PeerMember, Peers};
use crate::stats::CLUSTER;
use crate::tls::config::Ticketer;
pub use secret::Secret;
use store::{Etcd, Storage, StoreError};
use tickets::{KeyRecord, Tickets};

/// Longest the member waits between two looks at the store, watch or not: also how
/// soon it notices the store has gone.
const RECHECK: Duration = Duration::from_secs(5);
/// Longest wait between two attempts to reach the store.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// This member of the fleet: what it shares, built at start-up and kept across reloads.
pub struct Member {
    pub settings: Cluster,
    pub secret: Secret,
    /// The session-ticket keys TLS seals and opens tickets with, replaced as they rotate.
    pub tickets: Arc<Ticketer>,
    state_dir: Option<PathBuf>,
    /// Where the ACME challenge answers of the fleet are mirrored, and for which
    /// names (this member's ACME sites, lowercase): set by each (re)load.
    acme: Mutex<(Option<Arc<Challenges>>, Vec<String>)>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl Member {
    /// Reads the secret and installs the ticket keys last saved in `state_dir` (or a
    /// fresh key of the member's own until the store's arrive). Reads only.
    pub fn new(settings: &Cluster, state_dir: Option<PathBuf>) -> anyhow::Result<Member> {
        let secret = Secret::read(&settings.secret_file)?;
        let saved = state_dir.as_deref().and_then(|d| tickets::load_local(&secret, d));
        let tickets = match &saved {
            Some(record) => {
                tracing::info!("cluster: starting with the {} ticket key(s) saved last", record.keys.len());
                ticket_keys(record)
            }
            None => {
                let fresh = KeyRecord::rotated(None, &random_key().context("no random bytes for a ticket key")?, 0);
                ticket_keys(&fresh)
            }
        }
        .map_err(|e| anyhow::anyhow!("cluster: ticket keys: {e}"))?;
        CLUSTER.enabled.store(true, Relaxed);
        Ok(Member {
            settings: settings.clone(),
            secret,
            tickets: Arc::new(tickets),
            state_dir,
            acme: Mutex::new((None, Vec::new())),
        })
    }

    /// Mirrors the fleet's ACME challenge answers for `names` (this member's ACME
    /// sites) into `challenges` from now on.
    pub fn serve_acme(&self, challenges: Arc<Challenges>, names: Vec<String>) {
        let names = names.iter().map(|n| n.to_ascii_lowercase()).collect();
        *self.acme.lock().unwrap_or_else(PoisonError::into_inner) = (Some(challenges), names);
    }

    /// Starts the store's thread: it keeps the ticket keys in step with the fleet
    /// until `stop` turns true. With `cache_peers`, it also keeps the member set, and
    /// the peer listener's thread (joined by this one) answers the other members.
    pub fn start(
        self: &Arc<Member>,
        stop: watch::Receiver<bool>,
        current: watch::Receiver<super::Current>,
    ) -> anyhow::Result<JoinHandle<()>> {
        let member = self.clone();
        let peers = match self.settings.peer_listen {
            Some(addr) => {
                let listener = peer_listen::bind(addr)?;
                let me = PeerMember { name: self.settings.name.clone(), addr };
                let peers = Arc::new(Peers::new(me, self.secret.peers()));
                crate::handler::proxy::peers::install(peers.clone());
                let thread = peer_listen::spawn(listener, peers.clone(), current, stop.clone())?;
                tracing::info!("cache peers: answering the other members on {addr}");
                Some((peers, thread))
            }
            None => None,
        };
        crate::sys::event_loop_thread("ktlsd-cluster", move || async move {
            let s = &member.settings;
            match &peers {
                Some((p, _)) => {
                    let membership = members::run(&s.etcd, &s.prefix, &member.secret, p, stop.clone());
                    tokio::join!(member.run(stop), membership);
                }
                None => member.run(stop).await,
            }
            if let Some((_, thread)) = peers {
                let _ = thread.join();
            }
        })
        .map(|(thread, _)| thread)
        .context("cannot start the cluster thread")
    }

    /// Reaches the store and follows it, again after each loss, until `stop`.
    async fn run(&self, mut stop: watch::Receiver<bool>) {
        let mut backoff = Duration::from_secs(1);
        let mut down_said = false;
        while !*stop.borrow() {
            let mut reached = false;
            let ended = tokio::select! {
                r = self.follow(&mut reached) => r,
                _ = stop.changed() => return,
            };
            let Err(e) = ended else { return };
            if reached {
                backoff = Duration::from_secs(1);
            }
            if CLUSTER.store_up.swap(false, Relaxed) || !down_said {
                tracing::warn!(
                    "cluster: the store is down ({e}); serving on with the keys in use, trying again in {backoff:?}"
                );
                down_said = true;
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.changed() => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// One connection to the store: watches the ticket record and syncs on every
    /// change and every [`RECHECK`]; returns when the store fails. Cancel safe: it
    /// holds no lock between awaits but the rotation lock, which expires with its lease.
    async fn follow(&self, reached: &mut bool) -> Result<(), StoreError> {
        let mut etcd = Etcd::connect(&self.settings.etcd).await?;
        let tickets = Tickets {
            secret: &self.secret,
            key: format!("{}/tickets", self.settings.prefix),
            rotation: self.settings.ticket_rotation,
            member: &self.settings.name,
        };
        let mut watch = etcd.watch(&tickets.key).await?;
        let challenge_prefix = acme::challenge_prefix(&self.settings.prefix);
        let mut challenge_watch = etcd.watch(&challenge_prefix).await?;
        let mut mirror = acme::Mirror::default();
        let mut installed: Option<KeyRecord> = None;
        loop {
            let synced = tickets.sync(&mut etcd, RECHECK).await?;
            self.mirror(&mut etcd, &mut mirror, &challenge_prefix).await?;
            if !*reached {
                *reached = true;
                CLUSTER.store_up.store(true, Relaxed);
                tracing::info!(
                    "cluster: the store is up ({}), member {}",
                    self.settings.etcd.join(", "),
                    self.settings.name
                );
            }
            if synced.rotated {
                CLUSTER.ticket_rotations.fetch_add(1, Relaxed);
                tracing::info!("cluster: rotated the session-ticket key");
            }
            if let Some(record) = synced.record.filter(|r| installed.as_ref() != Some(r)) {
                self.install(&record);
                installed = Some(record);
            }
            tokio::select! {
                m = watch.message() => {
                    m?.ok_or_else(|| StoreError::Unreachable("the watch ended".into()))?;
                }
                m = challenge_watch.message() => {
                    m?.ok_or_else(|| StoreError::Unreachable("the watch ended".into()))?;
                }
                _ = tokio::time::sleep(synced.next) => {}
            }
        }
    }

    /// Mirrors the ACME challenge answers in the store into this member's.
    async fn mirror(&self, etcd: &mut Etcd, mirror: &mut acme::Mirror, prefix: &str) -> Result<(), StoreError> {
        let (challenges, served) = self.acme.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let Some(challenges) = challenges.filter(|_| !served.is_empty()) else { return Ok(()) };
        let listed = etcd.list(prefix, acme::MAX_MIRRORED).await?;
        mirror.reconcile(&self.secret, &self.settings.prefix, &challenges, &served, listed);
        Ok(())
    }

    /// Puts `record`'s keys in use and keeps a copy for a start without the store.
    fn install(&self, record: &KeyRecord) {
        match ticket_keys(record) {
            Ok(keys) => self.tickets.replace(keys),
            Err(e) => return tracing::error!("cluster: ticket keys unusable: {e}"),
        }
        CLUSTER.ticket_keys.store(record.keys.len() as u64, Relaxed);
        if let Some(dir) = &self.state_dir {
            tickets::save_local(&self.secret, dir, record);
        }
    }
}

fn ticket_keys(record: &KeyRecord) -> Result<Ticketer, String> {
    let bytes = record.key_bytes();
    Ticketer::from_keys(bytes.iter().map(Vec::as_slice))
}

fn random_key() -> Option<[u8; 48]> {
    use aws_lc_rs::rand::SecureRandom;
    let mut b = [0u8; 48];
    aws_lc_rs::rand::SystemRandom::new().fill(&mut b).ok()?;
    Some(b)
}
