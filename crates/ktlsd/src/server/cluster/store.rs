//! Where the fleet keeps what its members share: the [`Storage`] interface (load,
//! store, list; a lock held with a lease, renewed, and a store fenced by that lock:
//! certmagic's `Storage` and `Locker`, to the extent the shared state uses them) and its etcd
//! implementation ([`Etcd`], the v3 API over gRPC). Keys are paths
//! under the configured prefix; values are opaque (the callers seal them).
//!
//! Not what the records mean (`tickets`), nor retrying: every call is one attempt
//! bounded by [`CALL_TIMEOUT`], and the caller decides when to try again. A lock
//! whose holder dies expires with its lease; one without a lease (no member's) is
//! removed when found.
//!
//! Cancel safety: each call is one request; dropping its future abandons the
//! request, and a lock whose grant was under way then expires with its lease.

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, WatchOptions, WatchStream,
};

/// Longest one call to the store may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Why a call to the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the store is unreachable: {0}")]
    Unreachable(String),
    #[error("the store did not answer within {CALL_TIMEOUT:?}")]
    Timeout,
}

impl From<etcd_client::Error> for StoreError {
    fn from(e: etcd_client::Error) -> StoreError {
        StoreError::Unreachable(e.to_string())
    }
}

/// A lock held: released by [`Storage::unlock`], or when its lease expires.
#[derive(Debug, Clone)]
pub struct Lock {
    key: String,
    /// The holder's token, the lock key's value: a store fenced by this lock
    /// happens only while the key still holds it.
    token: Vec<u8>,
    lease: i64,
}

/// The store's operations, modelled on certmagic's `Storage` and `Locker`.
pub trait Storage {
    /// The value of `key`, `None` when there is none.
    async fn load(&mut self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Takes the lock `key` for `ttl` unless another holder has it (`Ok(None)`).
    async fn lock(&mut self, key: &str, token: Vec<u8>, ttl: Duration) -> Result<Option<Lock>, StoreError>;
    /// Stores `value` at `key` only while `lock` is still held: `Ok(false)` when it
    /// was lost (its lease expired and another took it).
    async fn store_fenced(&mut self, lock: &Lock, key: &str, value: Vec<u8>) -> Result<bool, StoreError>;
    async fn unlock(&mut self, lock: Lock) -> Result<(), StoreError>;

    // ACME across the fleet (`acme`): listing, records that live with a lock, and a
    // lock kept past its first lease.
    /// Every key under `prefix` with its value, at most `limit` of them.
    async fn list(&mut self, prefix: &str, limit: usize) -> Result<Vec<(String, Vec<u8>)>, StoreError>;
    /// As [`Storage::store_fenced`], the record living only as long as `lock`'s lease:
    /// it goes when the lock is released or its holder dies.
    async fn store_with_lock(&mut self, lock: &Lock, key: &str, value: Vec<u8>) -> Result<bool, StoreError>;
    /// Extends `lock`'s lease by its TTL; `Ok(false)` when the lease is gone.
    async fn renew(&mut self, lock: &Lock) -> Result<bool, StoreError>;
}

/// etcd, through one client over the configured endpoints (clones share it).
#[derive(Clone)]
pub struct Etcd {
    client: Client,
}

/// Bounds a call by [`CALL_TIMEOUT`].
async fn bounded<T>(call: impl std::future::Future<Output = Result<T, etcd_client::Error>>) -> Result<T, StoreError> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(r) => r.map_err(StoreError::from),
        Err(_) => Err(StoreError::Timeout),
    }
}

impl Etcd {
    /// Connects to any of `endpoints` (URLs such as `http://10.0.0.5:2379`).
    pub async fn connect(endpoints: &[String]) -> Result<Etcd, StoreError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(CALL_TIMEOUT)
            .with_timeout(CALL_TIMEOUT)
            .with_keep_alive(Duration::from_secs(5), CALL_TIMEOUT);
        let client = bounded(Client::connect(endpoints, Some(options))).await?;
        Ok(Etcd { client })
    }

    /// Removes the lock `key` when it has no lease: no member's (theirs live with a
    /// lease), and it would never expire (certmagic removes a stale lock so). The
    /// next attempt may take it. Only the value seen is removed (by its revision).
    async fn remove_stale_lock(&mut self, key: &str) -> Result<(), StoreError> {
        let held = bounded(self.client.get(key, None)).await?;
        let Some(kv) = held.kvs().first().filter(|kv| kv.lease() == 0) else { return Ok(()) };
        let seen = Compare::mod_revision(key, CompareOp::Equal, kv.mod_revision());
        let txn = Txn::new().when([seen]).and_then([TxnOp::delete(key, None)]);
        if bounded(self.client.txn(txn)).await?.succeeded() {
            tracing::warn!(
                "cluster: the lock {key} had no lease, so no member held it (theirs expire with their lease); removed"
            );
        }
        Ok(())
    }

    /// Changes to the keys under `prefix` from now on.
    pub async fn watch(&mut self, prefix: &str) -> Result<WatchStream, StoreError> {
        bounded(self.client.watch(prefix, Some(WatchOptions::new().with_prefix()))).await
    }
}

impl Storage for Etcd {
    async fn load(&mut self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let r = bounded(self.client.get(key, None)).await?;
        Ok(r.kvs().first().map(|kv| kv.value().to_vec()))
    }

    async fn lock(&mut self, key: &str, token: Vec<u8>, ttl: Duration) -> Result<Option<Lock>, StoreError> {
        let ttl = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let lease = bounded(self.client.lease_grant(ttl, None)).await?.id();
        // Created only when absent: whoever holds it keeps it until its lease ends.
        let txn = Txn::new().when([Compare::create_revision(key, CompareOp::Equal, 0)]).and_then([TxnOp::put(
            key,
            token.clone(),
            Some(PutOptions::new().with_lease(lease)),
        )]);
        let taken = bounded(self.client.txn(txn)).await?.succeeded();
        if !taken {
            let _ = bounded(self.client.lease_revoke(lease)).await;
            self.remove_stale_lock(key).await?;
            return Ok(None);
        }
        Ok(Some(Lock { key: key.to_string(), token, lease }))
    }

    async fn store_fenced(&mut self, lock: &Lock, key: &str, value: Vec<u8>) -> Result<bool, StoreError> {
        let txn = Txn::new()
            .when([Compare::value(lock.key.as_str(), CompareOp::Equal, lock.token.clone())])
            .and_then([TxnOp::put(key, value, None)]);
        Ok(bounded(self.client.txn(txn)).await?.succeeded())
    }

    async fn unlock(&mut self, lock: Lock) -> Result<(), StoreError> {
        // Revoking the lease deletes the key it holds, ours only.
        bounded(self.client.lease_revoke(lock.lease)).await.map(drop)
    }

    async fn list(&mut self, prefix: &str, limit: usize) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let r = bounded(self.client.get(prefix, Some(GetOptions::new().with_prefix().with_limit(limit)))).await?;
        Ok(r.kvs().iter().map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.value().to_vec())).collect())
    }

    async fn store_with_lock(&mut self, lock: &Lock, key: &str, value: Vec<u8>) -> Result<bool, StoreError> {
        let txn = Txn::new()
            .when([Compare::value(lock.key.as_str(), CompareOp::Equal, lock.token.clone())])
            .and_then([TxnOp::put(key, value, Some(PutOptions::new().with_lease(lock.lease)))]);
        Ok(bounded(self.client.txn(txn)).await?.succeeded())
    }

    async fn renew(&mut self, lock: &Lock) -> Result<bool, StoreError> {
        self.renew_lease(lock.lease).await
    }
}

// Membership (cache peers, `members`): a key held by a lease kept alive.
impl Etcd {
    /// Puts `value` at `key` under a fresh lease of `ttl`; returns the lease.
    pub async fn put_leased(&mut self, key: &str, value: Vec<u8>, ttl: Duration) -> Result<i64, StoreError> {
        let ttl = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let lease = bounded(self.client.lease_grant(ttl, None)).await?.id();
        bounded(self.client.put(key, value, Some(PutOptions::new().with_lease(lease)))).await?;
        Ok(lease)
    }

    /// Renews `lease` once: `Ok(false)` when it had already expired.
    pub async fn renew_lease(&mut self, lease: i64) -> Result<bool, StoreError> {
        let (mut keeper, mut stream) = bounded(self.client.lease_keep_alive(lease)).await?;
        bounded(keeper.keep_alive()).await?;
        let answer = bounded(stream.message()).await?;
        Ok(answer.is_some_and(|a| a.ttl() > 0))
    }
}
