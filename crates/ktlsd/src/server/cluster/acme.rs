//! ACME across the fleet: the records the members share in the store (each sealed
//! with the fleet's secret under its own key) and what each member does with them.
//!
//! - `PREFIX/acme/account/<CA>`: the fleet's one account per CA (the account file:
//!   CA, credentials and key), registered by the first member that needs it, under
//!   the lock `PREFIX/acme/account-lock/<CA>`.
//! - `PREFIX/acme/lock/<name>`: one order per certificate at a time. Its holder
//!   orders (or renews), keeps the lock's lease alive meanwhile, and stores the
//!   certificate fenced by the lock; the other members wait and watch.
//! - `PREFIX/acme/challenge/<type>/<token or name>`: the challenge answers of the
//!   order under way, living with the lock's lease. Every member mirrors them into its
//!   own [`Challenges`] by watch ([`Mirror`]), for the names it serves only, so the
//!   CA's validation is answered by whichever member it reaches.
//! - `PREFIX/acme/cert/<name>`: the certificate and its key. Every member installs it
//!   when its watch reports it and keeps a copy in its state directory, from which it
//!   starts when the store is down.
//!
//! A record that does not open, does not parse, or is for other names is logged once
//! and never used; a certificate record of another fleet (another secret) is never
//! overwritten either. Not the ACME protocol (`crate::acme`), nor the store's.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use etcd_client::WatchStream;

use super::secret::{OpenError, Secret};
use super::store::{Etcd, Lock, Storage, StoreError};
use super::Member;
use crate::acme::{renew_at, Acme, AcmeError, Backoff, Challenge, Challenges, Issued, Relay, RelayFuture};
use crate::acme::{tls_alpn01_certificate, RelayedAnswer};

/// How long an order's lock (and the challenge answers under it) outlives a holder
/// that died; its holder renews it every third of this.
const LOCK_TTL: Duration = Duration::from_secs(30);
/// How long the holder waits after storing a challenge answer before the CA is told
/// to validate: the members' watches deliver within milliseconds.
const PROPAGATION: Duration = Duration::from_secs(1);
/// How often a member looks at the store when its watch says nothing.
const LOOK: Duration = Duration::from_secs(5);
/// How soon a member waiting for another's order looks again.
const WAITING: Duration = Duration::from_secs(2);
/// Longest wait between two attempts to reach the store.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The most challenge answers a member mirrors (records listed at once).
pub const MAX_MIRRORED: usize = 64;
/// Longest token and key authorization accepted from a challenge record.
const MAX_TOKEN: usize = 128;
const MAX_KEY_AUTHORIZATION: usize = 256;

/// Why a record is not used.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("{0}")]
    Sealing(#[from] OpenError),
    #[error("{0}")]
    Garbage(String),
}

/// The record keys of the fleet's ACME state under `prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    pub certificate: String,
    pub lock: String,
    pub account: String,
    pub account_lock: String,
}

impl Keys {
    /// The keys of the certificate named by `names` (the first) from the CA at `directory`.
    pub fn new(prefix: &str, names: &[String], directory: &str) -> Keys {
        let first = names.first().map_or("site", String::as_str).replace('*', "_");
        let url = directory.strip_prefix("https://").unwrap_or(directory);
        let ca: String =
            url.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect();
        Keys {
            certificate: format!("{prefix}/acme/cert/{first}"),
            lock: format!("{prefix}/acme/lock/{first}"),
            account: format!("{prefix}/acme/account/{ca}"),
            account_lock: format!("{prefix}/acme/account-lock/{ca}"),
        }
    }
}

/// Where the challenge answers are, under `prefix`.
pub fn challenge_prefix(prefix: &str) -> String {
    format!("{prefix}/acme/challenge/")
}

/// The key of `answer`'s record.
pub fn challenge_key(prefix: &str, answer: &RelayedAnswer) -> String {
    let id = match answer.challenge {
        Challenge::Http01 => &answer.token,
        _ => &answer.name,
    };
    format!("{}{}/{id}", challenge_prefix(prefix), answer.challenge)
}

/// The certificate record: the key and chain as PEM, sealed.
pub fn seal_certificate(secret: &Secret, key: &str, issued: &Issued) -> Option<Vec<u8>> {
    secret.seal(key, issued.pem().as_bytes())
}

/// The certificate sealed at `key`, parsed with its key checked. Whether it is for
/// the site's names and valid now is [`Acme::unusable`]'s.
pub fn open_certificate(secret: &Secret, key: &str, sealed: &[u8]) -> Result<Issued, RecordError> {
    let plain = secret.open(key, sealed)?;
    let pem = String::from_utf8(plain).map_err(|_| RecordError::Garbage("not PEM text".into()))?;
    Issued::from_pem(pem).map_err(RecordError::Garbage)
}

pub fn seal_challenge(secret: &Secret, prefix: &str, answer: &RelayedAnswer) -> Option<Vec<u8>> {
    let json = serde_json::to_vec(answer).ok()?;
    secret.seal(&challenge_key(prefix, answer), &json)
}

/// The challenge answer sealed at `key`, refused unless it is an http-01 or
/// tls-alpn-01 answer for one of `served` (lowercase names), stored at its own key.
pub fn open_challenge(
    secret: &Secret,
    prefix: &str,
    key: &str,
    sealed: &[u8],
    served: &[String],
) -> Result<RelayedAnswer, RecordError> {
    let plain = secret.open(key, sealed)?;
    let mut answer: RelayedAnswer =
        serde_json::from_slice(&plain).map_err(|e| RecordError::Garbage(format!("not a challenge answer: {e}")))?;
    answer.name = answer.name.to_ascii_lowercase();
    let garbage = |why: String| Err(RecordError::Garbage(why));
    if answer.challenge == Challenge::Dns01 {
        return garbage("a dns-01 answer is not served by the members".into());
    }
    if !served.contains(&answer.name) {
        return garbage(format!("{} is not a name this member serves with ACME", answer.name));
    }
    let base64url = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if answer.token.is_empty() || answer.token.len() > MAX_TOKEN || !base64url(&answer.token) {
        return garbage("the token is not a base64url string of 1 to 128 characters".into());
    }
    let thumbprint = answer.key_authorization.strip_prefix(&answer.token).and_then(|r| r.strip_prefix('.'));
    if answer.key_authorization.len() > MAX_KEY_AUTHORIZATION || !thumbprint.is_some_and(base64url) {
        return garbage("the key authorization is not TOKEN.THUMBPRINT".into());
    }
    if challenge_key(prefix, &answer) != key {
        return garbage("stored under another key than its own".into());
    }
    Ok(answer)
}

/// The challenge answers a member mirrors from the store into its [`Challenges`]:
/// published while their record is there, withdrawn when it goes.
#[derive(Default)]
pub struct Mirror {
    published: HashMap<String, (Vec<u8>, crate::acme::Published)>,
    /// Records refused, by key, so each is logged once.
    refused: HashMap<String, Vec<u8>>,
}

impl Mirror {
    /// Brings the published answers in line with `listed` (the records under the
    /// challenge prefix).
    pub fn reconcile(
        &mut self,
        secret: &Secret,
        prefix: &str,
        challenges: &Arc<Challenges>,
        served: &[String],
        listed: Vec<(String, Vec<u8>)>,
    ) {
        self.published.retain(|k, (v, _)| listed.iter().any(|(lk, lv)| lk == k && lv == v));
        self.refused.retain(|k, v| listed.iter().any(|(lk, lv)| lk == k && lv == v));
        for (key, sealed) in listed {
            if self.published.contains_key(&key) || self.refused.contains_key(&key) {
                continue;
            }
            let published = open_challenge(secret, prefix, &key, &sealed, served).and_then(|a| {
                Ok(match a.challenge {
                    Challenge::Http01 => challenges.publish_http01(&a.token, &a.key_authorization),
                    _ => {
                        let cert =
                            tls_alpn01_certificate(&a.name, &a.key_authorization).map_err(RecordError::Garbage)?;
                        challenges.publish_tls_alpn01(&a.name, cert)
                    }
                })
            });
            match published {
                Ok(p) => {
                    self.published.insert(key, (sealed, p));
                }
                Err(e) => {
                    tracing::warn!("cluster: the ACME challenge record at {key} is unusable ({e}); not used");
                    self.refused.insert(key, sealed);
                }
            }
        }
    }
}

/// Publishes an order's challenge answers in the store, under its lock.
struct StoreRelay<'a> {
    store: Etcd,
    lock: Lock,
    secret: &'a Secret,
    prefix: &'a str,
}

impl Relay for StoreRelay<'_> {
    fn publish(&mut self, answer: RelayedAnswer) -> RelayFuture<'_> {
        Box::pin(async move {
            if answer.challenge == Challenge::Dns01 {
                return Ok(());
            }
            let key = challenge_key(self.prefix, &answer);
            let sealed =
                seal_challenge(self.secret, self.prefix, &answer).ok_or("no random bytes to seal the answer")?;
            match self.store.store_with_lock(&self.lock, &key, sealed).await {
                Ok(true) => {}
                Ok(false) => return Err("the order's lock was lost before the answer reached the fleet".into()),
                Err(e) => return Err(format!("the answer did not reach the fleet: {e}")),
            }
            tokio::time::sleep(PROPAGATION).await;
            Ok(())
        })
    }
}

/// Keeps `lock` held until its lease cannot be renewed; returns then.
///
/// Cancel safe: dropping it stops renewing, and the lock expires with its lease.
async fn keep(mut store: Etcd, lock: Lock) {
    loop {
        tokio::time::sleep(LOCK_TTL / 3).await;
        if !matches!(store.renew(&lock).await, Ok(true)) {
            return;
        }
    }
}

/// One ACME site of a fleet member.
pub struct Site<'a> {
    member: &'a Member,
    client: &'a Acme,
    keys: Keys,
    /// What the member serves: installs a certificate in the site's slot.
    install: &'a (dyn Fn(&Issued) + Send + Sync),
    /// Reports a failed order (status page).
    failed: &'a (dyn Fn(&AcmeError) + Send + Sync),
    which: String,
    current: Option<Issued>,
    backoff: Backoff,
    /// Each said once until it changes.
    refused: Option<Vec<u8>>,
    waiting_said: bool,
}

impl<'a> Site<'a> {
    pub fn new(
        member: &'a Member,
        client: &'a Acme,
        directory: &str,
        current: Option<Issued>,
        install: &'a (dyn Fn(&Issued) + Send + Sync),
        failed: &'a (dyn Fn(&AcmeError) + Send + Sync),
    ) -> Site<'a> {
        Site {
            member,
            client,
            keys: Keys::new(&member.settings.prefix, client.names(), directory),
            install,
            failed,
            which: client.names().join(", "),
            current,
            backoff: Backoff::new(),
            refused: None,
            waiting_said: false,
        }
    }

    /// Follows the fleet's certificate forever: installs it as it changes, orders it
    /// when it is missing or due and no other member is ordering, and serves on with
    /// the certificate in use while the store is down.
    ///
    /// Cancel safe: an order under way is abandoned (its lock and answers expire
    /// with their lease) and the stored files stay whole.
    pub async fn run(mut self) -> std::convert::Infallible {
        let mut connection: Option<(Etcd, WatchStream)> = None;
        let mut backoff = Duration::from_secs(1);
        let mut down_said = false;
        loop {
            let next = match self.step(&mut connection).await {
                Ok(next) => {
                    if down_said {
                        tracing::info!("ACME: {}: the fleet's store is back", self.which);
                    }
                    down_said = false;
                    backoff = Duration::from_secs(1);
                    next
                }
                Err(e) => {
                    connection = None;
                    if !down_said {
                        tracing::warn!(
                            "ACME: {}: the fleet's store is unreachable ({e}); serving on with the certificate in use",
                            self.which
                        );
                        down_said = true;
                    }
                    let delay = backoff;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    delay
                }
            };
            let lost = match connection.as_mut() {
                Some((_, watch)) => tokio::select! {
                    m = watch.message() => !matches!(m, Ok(Some(_))),
                    _ = tokio::time::sleep(next) => false,
                },
                None => {
                    tokio::time::sleep(next).await;
                    false
                }
            };
            if lost {
                connection = None;
            }
        }
    }

    /// One look at the store, and an order when this member is to place it; how
    /// long until the next look.
    async fn step(&mut self, connection: &mut Option<(Etcd, WatchStream)>) -> Result<Duration, StoreError> {
        if connection.is_none() {
            let mut etcd = Etcd::connect(&self.member.settings.etcd).await?;
            let watch = etcd.watch(&self.keys.certificate).await?;
            *connection = Some((etcd, watch));
        }
        let Some((store, _)) = connection.as_mut() else { return Ok(WAITING) };
        let fleet = self.fleet_certificate(store).await?;
        let foreign = fleet == Some(false);
        let due = self.current.as_ref().is_none_or(|c| renew_at(c.not_before, c.not_after) <= SystemTime::now());
        if !due {
            self.waiting_said = false;
            return Ok(LOOK);
        }
        if foreign {
            // Another fleet's record: never overwritten; this member orders alone.
            return Ok(self.order_alone().await);
        }
        let token = format!("{} {:016x}", self.member.settings.name, rand_u64()).into_bytes();
        let Some(lock) = store.lock(&self.keys.lock, token, LOCK_TTL).await? else {
            if !self.waiting_said {
                tracing::info!("ACME: {}: another member is ordering the certificate; waiting for it", self.which);
                self.waiting_said = true;
            }
            return Ok(WAITING);
        };
        self.waiting_said = false;
        let result = self.order_locked(store, &lock).await;
        let _ = store.unlock(lock).await;
        result
    }

    /// Installs the fleet's certificate when it is newer than the one in use.
    /// `Some(true)`: there is a usable one; `Some(false)`: the record belongs to
    /// another fleet; `None`: none usable.
    async fn fleet_certificate(&mut self, store: &mut Etcd) -> Result<Option<bool>, StoreError> {
        let Some(sealed) = store.load(&self.keys.certificate).await? else { return Ok(None) };
        let opened =
            open_certificate(&self.member.secret, &self.keys.certificate, &sealed).and_then(|issued| {
                match self.client.unusable(&issued, SystemTime::now()) {
                    Some(why) => Err(RecordError::Garbage(why)),
                    None => Ok(issued),
                }
            });
        let issued = match opened {
            Ok(issued) => issued,
            Err(e) => {
                if self.refused.as_ref() != Some(&sealed) {
                    tracing::error!(
                        "ACME: the fleet's certificate record at {} is unusable ({e}); not used",
                        self.keys.certificate
                    );
                    self.refused = Some(sealed);
                }
                return Ok(match e {
                    RecordError::Sealing(OpenError::Forged) => Some(false),
                    _ => None,
                });
            }
        };
        self.refused = None;
        let newer = self.current.as_ref().is_none_or(|c| c.pem() != issued.pem() && c.not_after <= issued.not_after);
        if newer {
            self.adopt(issued);
        }
        Ok(Some(true))
    }

    /// Serves `issued` and keeps it in the state directory.
    fn adopt(&mut self, issued: Issued) {
        (self.install)(&issued);
        if let Err(e) = self.client.keep(&issued) {
            tracing::warn!("ACME: {}: {e}", self.which);
        }
        self.current = Some(issued);
    }

    /// Orders under the lock, the lease kept alive meanwhile, and stores the
    /// certificate fenced by the lock.
    async fn order_locked(&mut self, store: &mut Etcd, lock: &Lock) -> Result<Duration, StoreError> {
        // Looked at again under the lock: another member may have stored one meanwhile.
        if self.fleet_certificate(store).await? == Some(true)
            && self.current.as_ref().is_some_and(|c| renew_at(c.not_before, c.not_after) > SystemTime::now())
        {
            return Ok(LOOK);
        }
        tracing::info!(
            "ACME: {}: member {} orders the certificate for the fleet",
            self.which,
            self.member.settings.name
        );
        let obtained = tokio::select! {
            r = self.account_and_order(store.clone(), lock.clone()) => Some(r?),
            _ = keep(store.clone(), lock.clone()) => None,
        };
        let issued = match obtained {
            None => {
                tracing::warn!("ACME: {}: the order's lock was lost; the order is abandoned", self.which);
                return Ok(WAITING);
            }
            Some(Err(e)) => return Ok(self.failed_order(&e)),
            Some(Ok(issued)) => issued,
        };
        self.backoff = Backoff::new();
        let sealed = seal_certificate(&self.member.secret, &self.keys.certificate, &issued);
        (self.install)(&issued);
        self.current = Some(issued);
        let Some(sealed) = sealed else { return Ok(LOOK) };
        if store.store_fenced(lock, &self.keys.certificate, sealed).await? {
            tracing::info!("ACME: {}: the new certificate is stored for the fleet", self.which);
        } else {
            tracing::warn!(
                "ACME: {}: the order's lock expired before the certificate was stored; not stored",
                self.which
            );
        }
        Ok(LOOK)
    }

    async fn account_and_order(&self, mut store: Etcd, lock: Lock) -> Result<Result<Issued, AcmeError>, StoreError> {
        if let Err(e) = self.account(&mut store).await? {
            return Ok(Err(e));
        }
        let mut relay = StoreRelay { store, lock, secret: &self.member.secret, prefix: &self.member.settings.prefix };
        Ok(self.client.obtain_relayed(Some(&mut relay)).await)
    }

    /// Makes the fleet's account this member's: adopts the stored one, else
    /// registers (or takes this member's) under the account lock and stores it.
    async fn account(&self, store: &mut Etcd) -> Result<Result<(), AcmeError>, StoreError> {
        let key = &self.keys.account;
        loop {
            let foreign = match store.load(key).await? {
                None => false,
                Some(sealed) => match self.member.secret.open(key, &sealed) {
                    Ok(file) => match self.client.adopt_account(&file).await {
                        Ok(()) => return Ok(Ok(())),
                        Err(e) => {
                            tracing::error!("ACME: the fleet's account record at {key} is unusable ({e}); not used");
                            false
                        }
                    },
                    Err(e) => {
                        tracing::error!("ACME: the fleet's account record at {key} is unusable ({e}); not used");
                        e == OpenError::Forged
                    }
                },
            };
            if foreign {
                // Another fleet's: neither used nor overwritten; this member's own account.
                return Ok(self.client.account_file().await.map(drop));
            }
            let token = format!("{} {:016x}", self.member.settings.name, rand_u64()).into_bytes();
            let Some(lock) = store.lock(&self.keys.account_lock, token, LOCK_TTL).await? else {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            };
            let result = self.register_locked(store, &lock).await;
            let _ = store.unlock(lock).await;
            return result;
        }
    }

    async fn register_locked(&self, store: &mut Etcd, lock: &Lock) -> Result<Result<(), AcmeError>, StoreError> {
        let key = &self.keys.account;
        if let Some(sealed) = store.load(key).await? {
            if let Ok(file) = self.member.secret.open(key, &sealed) {
                if self.client.adopt_account(&file).await.is_ok() {
                    return Ok(Ok(()));
                }
            }
        }
        let file = match self.client.account_file().await {
            Ok(file) => file,
            Err(e) => return Ok(Err(e)),
        };
        if let Some(sealed) = self.member.secret.seal(key, &file) {
            if store.store_fenced(lock, key, sealed).await? {
                tracing::info!("ACME: the account is stored for the fleet at {key}");
            }
        }
        Ok(Ok(()))
    }

    /// Orders without the fleet (its certificate record belongs to another fleet).
    async fn order_alone(&mut self) -> Duration {
        match self.client.obtain().await {
            Ok(issued) => {
                self.backoff = Backoff::new();
                (self.install)(&issued);
                self.current = Some(issued);
                LOOK
            }
            Err(e) => self.failed_order(&e),
        }
    }

    fn failed_order(&mut self, e: &AcmeError) -> Duration {
        (self.failed)(e);
        let delay = self.backoff.next_delay();
        tracing::warn!(
            "ACME certificate for {} not obtained: {e}; {}; retrying in {} s",
            self.which,
            match &self.current {
                Some(_) => "the certificate in use stays",
                None => "serving the self-signed placeholder",
            },
            delay.as_secs()
        );
        delay
    }
}

fn rand_u64() -> u64 {
    use aws_lc_rs::rand::SecureRandom;
    let mut b = [0u8; 8];
    let _ = aws_lc_rs::rand::SystemRandom::new().fill(&mut b);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issued(names: &[&str]) -> Issued {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        let cert = params.self_signed(&key).unwrap();
        Issued::from_pem(format!("{}{}", key.serialize_pem(), cert.pem())).unwrap()
    }

    fn client(names: &[&str]) -> Acme {
        let settings = crate::acme::AcmeSettings {
            directory: "https://ca.test/dir".into(),
            email: None,
            challenge: Challenge::Http01,
            names: names.iter().map(|n| n.to_string()).collect(),
            state_dir: std::env::temp_dir(),
            directory_ca: None,
            dns_hook: None,
            eab: None,
        };
        Acme::new(settings, Challenges::new()).unwrap()
    }

    #[test]
    fn keys_name_the_site_and_the_ca() {
        let k = Keys::new("/p", &["*.a.test".into(), "b.test".into()], "https://ca.test:14000/dir");
        assert_eq!(k.certificate, "/p/acme/cert/_.a.test");
        assert_eq!(k.lock, "/p/acme/lock/_.a.test");
        assert_eq!(k.account, "/p/acme/account/ca.test_14000_dir");
        assert_eq!(k.account_lock, "/p/acme/account-lock/ca.test_14000_dir");
    }

    #[test]
    fn certificate_records_open_only_whole_for_their_site() {
        let secret = Secret::from_test_bytes(&[1; 32]);
        let key = "/p/acme/cert/a.test";
        let cert = issued(&["a.test"]);
        let sealed = seal_certificate(&secret, key, &cert).unwrap();
        assert!(!sealed.windows(5).any(|w| w == b"BEGIN"), "the key is sealed");
        let opened = open_certificate(&secret, key, &sealed).unwrap();
        assert_eq!(opened.pem(), cert.pem());
        assert_eq!(client(&["a.test"]).unusable(&opened, SystemTime::now()), None);
        // For other names, or not valid now: refused by the site.
        let why = client(&["b.test"]).unusable(&opened, SystemTime::now()).unwrap();
        assert!(why.contains("other names (a.test)"), "{why}");
        // rcgen's certificates are valid until 4096.
        let later = SystemTime::now() + Duration::from_secs(3000 * 365 * 86400);
        assert!(client(&["a.test"]).unusable(&opened, later).is_some());
        // Another fleet's, another key's, garbage, a PEM that does not parse.
        let other = Secret::from_test_bytes(&[2; 32]);
        assert_eq!(open_certificate(&other, key, &sealed).err(), Some(RecordError::Sealing(OpenError::Forged)));
        assert_eq!(
            open_certificate(&secret, "/p/acme/cert/b.test", &sealed).err(),
            Some(RecordError::Sealing(OpenError::Forged))
        );
        assert_eq!(open_certificate(&secret, key, b"garbage").err(), Some(RecordError::Sealing(OpenError::Format)));
        for plain in [&b"-----BEGIN CERTIFICATE-----\nxx\n"[..], b"", &[0xff, 0xfe]] {
            let bad = secret.seal(key, plain).unwrap();
            assert!(matches!(open_certificate(&secret, key, &bad), Err(RecordError::Garbage(_))), "{plain:?}");
        }
        // A certificate with another certificate's key.
        let mismatched = format!(
            "{}{}",
            issued(&["a.test"]).pem().split("-----BEGIN CERTIFICATE").next().unwrap(),
            &cert.pem()[cert.pem().find("-----BEGIN CERTIFICATE").unwrap()..]
        );
        let bad = secret.seal(key, mismatched.as_bytes()).unwrap();
        assert!(
            matches!(open_certificate(&secret, key, &bad), Err(RecordError::Garbage(e)) if e.contains("do not match"))
        );
    }

    #[test]
    fn challenge_records_are_checked_and_bounded_to_the_names_served() {
        let secret = Secret::from_test_bytes(&[1; 32]);
        let served = vec!["a.test".to_string()];
        let answer = |challenge, name: &str, token: &str, ka: &str| RelayedAnswer {
            challenge,
            name: name.into(),
            token: token.into(),
            key_authorization: ka.into(),
        };
        let good = answer(Challenge::Http01, "a.test", "tok-1_x", "tok-1_x.thumb");
        let key = challenge_key("/p", &good);
        assert_eq!(key, "/p/acme/challenge/http-01/tok-1_x");
        let sealed = seal_challenge(&secret, "/p", &good).unwrap();
        assert_eq!(open_challenge(&secret, "/p", &key, &sealed, &served), Ok(good.clone()));
        let alpn = answer(Challenge::TlsAlpn01, "A.test", "t", "t.th");
        assert_eq!(challenge_key("/p", &alpn), "/p/acme/challenge/tls-alpn-01/A.test");
        for (bad, why) in [
            (answer(Challenge::Http01, "b.test", "t", "t.th"), "not a name this member serves"),
            (answer(Challenge::Dns01, "a.test", "t", "t.th"), "dns-01"),
            (answer(Challenge::Http01, "a.test", "../x", "../x.th"), "token"),
            (answer(Challenge::Http01, "a.test", "", ".th"), "token"),
            (answer(Challenge::Http01, "a.test", &"t".repeat(129), "t.th"), "token"),
            (answer(Challenge::Http01, "a.test", "t", "u.th"), "key authorization"),
            (answer(Challenge::Http01, "a.test", "t", "t.th\r\nX: y"), "key authorization"),
            (answer(Challenge::Http01, "a.test", "t", &format!("t.{}", "h".repeat(300))), "key authorization"),
        ] {
            let k = challenge_key("/p", &bad);
            let s = seal_challenge(&secret, "/p", &bad).unwrap();
            match open_challenge(&secret, "/p", &k, &s, &served) {
                Err(RecordError::Garbage(e)) => assert!(e.contains(why), "{e} for {bad:?}"),
                other => panic!("{other:?} for {bad:?}"),
            }
        }
        // Copied under another key, sealed by another fleet, not JSON.
        let elsewhere = "/p/acme/challenge/http-01/other";
        assert_eq!(
            open_challenge(&secret, "/p", elsewhere, &sealed, &served),
            Err(RecordError::Sealing(OpenError::Forged))
        );
        let moved = secret.seal(elsewhere, &serde_json::to_vec(&good).unwrap()).unwrap();
        assert!(matches!(open_challenge(&secret, "/p", elsewhere, &moved, &served), Err(RecordError::Garbage(_))));
        let other = Secret::from_test_bytes(&[2; 32]);
        assert_eq!(open_challenge(&other, "/p", &key, &sealed, &served), Err(RecordError::Sealing(OpenError::Forged)));
        let junk = secret.seal(&key, b"{\"challenge\":\"http-99\"}").unwrap();
        assert!(matches!(open_challenge(&secret, "/p", &key, &junk, &served), Err(RecordError::Garbage(_))));
    }

    #[test]
    fn the_mirror_publishes_while_the_record_is_there() {
        let secret = Secret::from_test_bytes(&[1; 32]);
        let served = vec!["a.test".to_string()];
        let challenges = Challenges::new();
        let http = RelayedAnswer {
            challenge: Challenge::Http01,
            name: "a.test".into(),
            token: "tok".into(),
            key_authorization: "tok.th".into(),
        };
        let alpn = RelayedAnswer { challenge: Challenge::TlsAlpn01, ..http.clone() };
        let listed = |answers: &[&RelayedAnswer]| {
            answers.iter().map(|a| (challenge_key("/p", a), seal_challenge(&secret, "/p", a).unwrap())).collect()
        };
        let mut mirror = Mirror::default();
        let both = listed(&[&http, &alpn]);
        mirror.reconcile(&secret, "/p", &challenges, &served, both);
        assert_eq!(challenges.http01("tok").as_deref(), Some("tok.th"));
        assert!(challenges.tls_alpn01("a.test").is_some());
        let mut garbage: Vec<(String, Vec<u8>)> = listed(&[&http]);
        garbage.push(("/p/acme/challenge/http-01/x".into(), b"garbage".to_vec()));
        mirror.reconcile(&secret, "/p", &challenges, &served, garbage);
        assert_eq!(challenges.http01("tok").as_deref(), Some("tok.th"));
        assert!(challenges.tls_alpn01("a.test").is_none(), "withdrawn with its record");
        assert!(challenges.http01("x").is_none());
        mirror.reconcile(&secret, "/p", &challenges, &served, Vec::new());
        assert!(challenges.is_empty());
    }
}
