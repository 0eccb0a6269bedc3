//! Session-ticket keys shared by the fleet: one record in the store (`PREFIX/tickets`,
//! sealed with the fleet's secret) holding the last [`KEPT`] keys, newest first. The
//! member that finds the newest older than `ticket_rotation` takes the rotation lock,
//! adds a fresh key and stores the record fenced by that lock; every member installs
//! what the record holds (sealing with the newest key, opening with any) as soon as
//! its watch reports the change, and keeps a sealed copy in its state directory to
//! start from when the store is down.
//!
//! A record that is not a sealed key list is logged and replaced by the next
//! rotation; one sealed with another secret is logged and never used nor
//! overwritten (a member with the wrong `secret_file` must not take the fleet's
//! keys away). Not the ticket format (`tls::config::Ticketer`), nor the store.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

use super::secret::{OpenError, Secret};
use super::store::{Storage, StoreError};

/// Keys a record keeps: with the default rotation of 12 hours a ticket opens for 36
/// to 48 hours after it was issued, well past its 6-hour lifetime.
pub const KEPT: usize = 4;
/// A ticket key's bytes: a 16-byte name and a 32-byte secret.
const KEY_LEN: usize = 48;
/// How long the rotation lock lasts when its holder dies.
const LOCK_TTL: Duration = Duration::from_secs(10);

/// The record as stored (sealed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    pub keys: Vec<StoredKey>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredKey {
    /// When it was made (Unix seconds).
    pub created: u64,
    /// Its 48 bytes, in hex.
    pub key: String,
}

/// Why a record is not used.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("{0}")]
    Sealing(#[from] OpenError),
    #[error("not a ticket key list: {0}")]
    Garbage(String),
}

impl KeyRecord {
    /// The record sealed in `sealed` under `name`, every key checked.
    pub fn open(secret: &Secret, name: &str, sealed: &[u8]) -> Result<KeyRecord, RecordError> {
        let plain = secret.open(name, sealed)?;
        let record: KeyRecord = serde_json::from_slice(&plain).map_err(|e| RecordError::Garbage(e.to_string()))?;
        if record.keys.is_empty() || record.keys.len() > KEPT {
            return Err(RecordError::Garbage(format!("{} keys, expected 1 to {KEPT}", record.keys.len())));
        }
        for k in &record.keys {
            if decode_hex(&k.key).is_none_or(|b| b.len() != KEY_LEN) {
                return Err(RecordError::Garbage(format!("a key is not {KEY_LEN} bytes in hex")));
            }
        }
        Ok(record)
    }

    /// The keys' bytes, newest first.
    pub fn key_bytes(&self) -> Vec<Vec<u8>> {
        self.keys.iter().filter_map(|k| decode_hex(&k.key)).collect()
    }

    /// When the newest key is due to be replaced.
    fn due(&self, rotation: Duration) -> u64 {
        self.keys.first().map_or(0, |k| k.created.saturating_add(rotation.as_secs().max(1)))
    }

    /// This record with `fresh` (made `now`) first, the oldest beyond [`KEPT`] dropped.
    pub fn rotated(previous: Option<&KeyRecord>, fresh: &[u8; KEY_LEN], now: u64) -> KeyRecord {
        let mut keys = vec![StoredKey { created: now, key: encode_hex(fresh) }];
        keys.extend(previous.into_iter().flat_map(|r| r.keys.iter().cloned()).take(KEPT - 1));
        KeyRecord { keys }
    }
}

/// What the stored record calls for `now`.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Use it; look again after this long (at most `recheck`).
    Use(Duration),
    /// Add a fresh key (none yet, the newest is due, or the record is garbage).
    Rotate,
    /// Leave it alone and keep the keys in use (sealed with another secret).
    Refuse,
}

pub fn plan(record: &Result<Option<KeyRecord>, RecordError>, now: u64, rotation: Duration, recheck: Duration) -> Plan {
    match record {
        Ok(None) | Err(RecordError::Garbage(_)) | Err(RecordError::Sealing(OpenError::Format)) => Plan::Rotate,
        Err(RecordError::Sealing(OpenError::Forged)) => Plan::Refuse,
        Ok(Some(r)) => match r.due(rotation).checked_sub(now) {
            None | Some(0) => Plan::Rotate,
            Some(left) => Plan::Use(Duration::from_secs(left).min(recheck)),
        },
    }
}

/// The member's side: loads, rotates when due, and installs the keys.
pub struct Tickets<'a> {
    pub secret: &'a Secret,
    /// The record's key in the store.
    pub key: String,
    pub rotation: Duration,
    /// This member's name, in the lock's token.
    pub member: &'a str,
}

/// What one [`Tickets::sync`] came to.
#[derive(Debug)]
pub struct Synced {
    /// The keys to use; `None`: keep those in use.
    pub record: Option<KeyRecord>,
    /// Whether this member rotated them.
    pub rotated: bool,
    /// When to look again, at the latest.
    pub next: Duration,
}

impl Tickets<'_> {
    /// One look at the store: the record, rotated first when due.
    pub async fn sync(&self, store: &mut impl Storage, recheck: Duration) -> Result<Synced, StoreError> {
        let loaded = self.load(store).await?;
        match plan(&loaded, now(), self.rotation, recheck) {
            Plan::Use(next) => Ok(Synced { record: loaded.ok().flatten(), rotated: false, next }),
            Plan::Refuse => {
                if let Err(e) = &loaded {
                    tracing::error!(
                        "cluster: the ticket keys at {} are unusable ({e}); the keys in use are kept",
                        self.key
                    );
                }
                Ok(Synced { record: None, rotated: false, next: recheck })
            }
            Plan::Rotate => {
                if let Err(e) = &loaded {
                    tracing::warn!("cluster: the ticket keys at {} are unusable ({e}); they are replaced", self.key);
                }
                self.rotate(store, recheck).await
            }
        }
    }

    async fn load(&self, store: &mut impl Storage) -> Result<Result<Option<KeyRecord>, RecordError>, StoreError> {
        Ok(match store.load(&self.key).await? {
            None => Ok(None),
            Some(sealed) => KeyRecord::open(self.secret, &self.key, &sealed).map(Some),
        })
    }

    /// Rotates under the lock; when another member holds it, that member rotates
    /// and the watch brings its record.
    async fn rotate(&self, store: &mut impl Storage, recheck: Duration) -> Result<Synced, StoreError> {
        let lock_key = format!("{}.lock", self.key);
        let token = format!("{} {}", self.member, encode_hex(&random::<8>().unwrap_or_default())).into_bytes();
        let Some(lock) = store.lock(&lock_key, token, LOCK_TTL).await? else {
            return Ok(Synced { record: None, rotated: false, next: Duration::from_secs(1) });
        };
        let result = self.rotate_locked(store, &lock, recheck).await;
        let _ = store.unlock(lock).await;
        result
    }

    async fn rotate_locked(
        &self,
        store: &mut impl Storage,
        lock: &super::store::Lock,
        recheck: Duration,
    ) -> Result<Synced, StoreError> {
        // Looked at again under the lock: another member may have rotated meanwhile.
        let loaded = self.load(store).await?;
        let now = now();
        match plan(&loaded, now, self.rotation, recheck) {
            Plan::Rotate => {}
            Plan::Use(next) => return Ok(Synced { record: loaded.ok().flatten(), rotated: false, next }),
            Plan::Refuse => return Ok(Synced { record: None, rotated: false, next: recheck }),
        }
        let Some(fresh) = random::<KEY_LEN>() else {
            tracing::error!("cluster: no random bytes for a ticket key; rotation waits");
            return Ok(Synced { record: None, rotated: false, next: recheck });
        };
        let record = KeyRecord::rotated(loaded.ok().flatten().as_ref(), &fresh, now);
        let Some(sealed) = serde_json::to_vec(&record).ok().and_then(|j| self.secret.seal(&self.key, &j)) else {
            return Ok(Synced { record: None, rotated: false, next: recheck });
        };
        if !store.store_fenced(lock, &self.key, sealed).await? {
            tracing::warn!("cluster: the ticket rotation lock expired before the new key was stored; not stored");
            return Ok(Synced { record: None, rotated: false, next: Duration::from_secs(1) });
        }
        Ok(Synced { record: Some(record), rotated: true, next: self.rotation.min(recheck) })
    }
}

/// The member's sealed copy of the last record it used, in its state directory.
pub fn local_path(state_dir: &Path) -> PathBuf {
    state_dir.join("cluster-tickets.sealed")
}

/// The name local copies are sealed under.
const LOCAL_NAME: &str = "local copy of the ticket keys";

/// The last record this member saved, if it opens; an unusable copy is logged.
pub fn load_local(secret: &Secret, state_dir: &Path) -> Option<KeyRecord> {
    let path = local_path(state_dir);
    let bytes = std::fs::read(&path).ok()?;
    match KeyRecord::open(secret, LOCAL_NAME, &bytes) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!("cluster: {} is unusable ({e}); starting without it", path.display());
            None
        }
    }
}

pub fn save_local(secret: &Secret, state_dir: &Path, record: &KeyRecord) {
    let path = local_path(state_dir);
    let Some(sealed) = serde_json::to_vec(record).ok().and_then(|j| secret.seal(LOCAL_NAME, &j)) else { return };
    if let Err(e) = crate::state_file::write_private(state_dir, &path, &sealed) {
        tracing::warn!("cluster: cannot keep the ticket keys in {}: {e}", path.display());
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn random<const N: usize>() -> Option<[u8; N]> {
    let mut b = [0u8; N];
    SystemRandom::new().fill(&mut b).ok()?;
    Some(b)
}

fn encode_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(created: &[u64]) -> KeyRecord {
        KeyRecord { keys: created.iter().map(|&c| StoredKey { created: c, key: encode_hex(&[c as u8; 48]) }).collect() }
    }

    #[test]
    fn plans() {
        let (h, recheck) = (Duration::from_secs(3600), Duration::from_secs(5));
        let garbage = Err(RecordError::Garbage("x".into()));
        for (loaded, now, want) in [
            (Ok(None), 100, Plan::Rotate),
            (Ok(Some(record(&[1000]))), 1000, Plan::Use(recheck)),
            (Ok(Some(record(&[1000]))), 4598, Plan::Use(Duration::from_secs(2))),
            (Ok(Some(record(&[1000]))), 4600, Plan::Rotate),
            (Ok(Some(record(&[1000, 10]))), 9000, Plan::Rotate),
            // A key from the future (a member's clock ahead) is used, not rotated in a loop.
            (Ok(Some(record(&[9000]))), 1000, Plan::Use(recheck)),
            (garbage, 1000, Plan::Rotate),
            (Err(RecordError::Sealing(OpenError::Format)), 1000, Plan::Rotate),
            (Err(RecordError::Sealing(OpenError::Forged)), 1000, Plan::Refuse),
        ] {
            assert_eq!(plan(&loaded, now, h, recheck), want, "{loaded:?} at {now}");
        }
    }

    #[test]
    fn rotation_keeps_the_newest_few() {
        let fresh = [9u8; 48];
        let one = KeyRecord::rotated(None, &fresh, 50);
        assert_eq!(one.keys.len(), 1);
        let full = KeyRecord::rotated(Some(&record(&[40, 30, 20, 10])), &fresh, 50);
        assert_eq!(full.keys.iter().map(|k| k.created).collect::<Vec<_>>(), [50, 40, 30, 20]);
        assert_eq!(full.key_bytes()[0], fresh);
    }

    #[test]
    fn records_are_checked_when_opened() {
        let secret = Secret::from_test_bytes(&[3; 32]);
        let seal = |r: &serde_json::Value| secret.seal("k", r.to_string().as_bytes()).unwrap();
        let good = serde_json::to_value(record(&[5, 4])).unwrap();
        assert_eq!(KeyRecord::open(&secret, "k", &seal(&good)), Ok(record(&[5, 4])));
        for bad in [
            serde_json::json!({"keys": []}),
            serde_json::json!({"keys": [{"created": 1, "key": "abc"}]}),
            serde_json::json!({"keys": [{"created": 1, "key": "zz".repeat(48)}]}),
            serde_json::json!({"keys": [{"created": 1, "key": "00".repeat(47)}]}),
            serde_json::to_value(record(&[5, 4, 3, 2, 1])).unwrap(),
            serde_json::json!("not a record"),
        ] {
            assert!(matches!(KeyRecord::open(&secret, "k", &seal(&bad)), Err(RecordError::Garbage(_))), "{bad}");
        }
        let other = Secret::from_test_bytes(&[4; 32]);
        assert_eq!(KeyRecord::open(&other, "k", &seal(&good)), Err(RecordError::Sealing(OpenError::Forged)));
        assert_eq!(KeyRecord::open(&secret, "k", b"garbage"), Err(RecordError::Sealing(OpenError::Format)));
    }

    #[test]
    fn local_copies_survive_a_restart_and_refuse_damage() {
        let dir = tempfile::tempdir().unwrap();
        let secret = Secret::from_test_bytes(&[3; 32]);
        assert_eq!(load_local(&secret, dir.path()), None);
        save_local(&secret, dir.path(), &record(&[7]));
        assert_eq!(load_local(&secret, dir.path()), Some(record(&[7])));
        std::fs::write(local_path(dir.path()), b"garbage").unwrap();
        assert_eq!(load_local(&secret, dir.path()), None);
    }
}
