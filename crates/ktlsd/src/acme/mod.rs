//! Certificates from an ACME CA (RFC 8555), validated by tls-alpn-01 (RFC 8737), http-01
//! or dns-01 (through the operator's hook command, [`DnsHook`]): the account (one per CA
//! directory and state directory, shared by every site of the process, created once with
//! External Account Binding when the CA asks for it, kept in the state directory), orders,
//! the challenge answers the listeners serve ([`Challenges`]), the certificate and key per
//! site (kept in the state directory and reused while valid), and the renewal task.
//!
//! It speaks to the CA through `instant-acme`; it does not listen or serve: the
//! server's TLS resolver and port-80 listener answer from [`Challenges`], and the
//! server swaps renewed certificates into its resolver from the renewal callback.

mod cert;
mod challenges;
mod dns;
mod renew;
mod store;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use instant_acme::{
    Account, AuthorizationStatus, ChallengeType, Identifier, NewAccount, NewOrder, OrderStatus, RetryPolicy,
};

pub use cert::Issued;
pub use challenges::{tls_alpn01_certificate, Challenges, Published, ACME_TLS_ALPN, HTTP01_PATH_PREFIX};
pub use dns::DnsHook;
pub use renew::{renew_at, Backoff};
use store::StoredAccount;

/// How the CA validates control of the names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Challenge {
    /// RFC 8737: a TLS handshake to port 443 offering ALPN `acme-tls/1`.
    TlsAlpn01,
    /// RFC 8555 section 8.3: `GET /.well-known/acme-challenge/TOKEN` on port 80.
    Http01,
    /// RFC 8555 section 8.4: a TXT record `_acme-challenge.NAME`, set by the operator's hook.
    Dns01,
}

impl Challenge {
    fn acme_type(self) -> ChallengeType {
        match self {
            Challenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
            Challenge::Http01 => ChallengeType::Http01,
            Challenge::Dns01 => ChallengeType::Dns01,
        }
    }

    /// What must hold for the validation to succeed, for error messages.
    fn requirement(self) -> &'static str {
        match self {
            Challenge::TlsAlpn01 => {
                "the names must resolve to this server and its TLS port must be reachable as port 443"
            }
            Challenge::Http01 => {
                "the names must resolve to this server and its plain-HTTP listener must be reachable as port 80"
            }
            Challenge::Dns01 => {
                "the dns_hook must publish the TXT record where the CA's resolvers see it; raise dns_propagation if it needs time"
            }
        }
    }
}

impl std::fmt::Display for Challenge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Challenge::TlsAlpn01 => "tls-alpn-01",
            Challenge::Http01 => "http-01",
            Challenge::Dns01 => "dns-01",
        })
    }
}

/// What the ACME client needs to know.
#[derive(Debug, Clone)]
pub struct AcmeSettings {
    /// The CA's directory URL (`https://acme-v02.api.letsencrypt.org/directory`).
    pub directory: String,
    /// Contact address given to the CA for expiry and policy notices.
    pub email: Option<String>,
    pub challenge: Challenge,
    /// The DNS names of the certificate (one site); the first names its file.
    pub names: Vec<String>,
    /// Where the account and certificates are kept (the server gives `STATE_DIR/acme`).
    pub state_dir: PathBuf,
    /// A PEM CA certificate to trust for the directory's TLS instead of the system's
    /// roots (a private or test CA such as pebble's).
    pub directory_ca: Option<PathBuf>,
    /// dns-01: how the TXT records are published (required with [`Challenge::Dns01`]).
    pub dns_hook: Option<DnsHook>,
    /// External Account Binding for registering the account, when the CA requires it.
    pub eab: Option<Eab>,
}

/// An External Account Binding (RFC 8555 section 7.3.4): the key id and MAC key the CA
/// gave out of band (ZeroSSL, Google Trust Services). Its `Debug` hides the key.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Eab {
    pub kid: String,
    /// The MAC key, decoded from the base64url the CA shows.
    pub hmac_key: Vec<u8>,
}

impl std::fmt::Debug for Eab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Eab").field("kid", &self.kid).field("hmac_key", &"<redacted>").finish()
    }
}

/// What went wrong, naming the step and what to do.
#[derive(Debug, thiserror::Error)]
pub enum AcmeError {
    #[error("ACME settings: {0}")]
    Settings(String),
    #[error("ACME server {directory}: {step} failed: {source}")]
    Protocol {
        directory: String,
        step: Step,
        #[source]
        source: instant_acme::Error,
    },
    #[error("ACME {challenge} validation of {name} failed: {detail} ({requirement})", requirement = challenge.requirement())]
    Validation { challenge: Challenge, name: String, detail: String },
    #[error("ACME order for {names} ended {status}; the CA gave no reason")]
    Order { names: String, status: String },
    #[error("ACME server {directory} offers no {challenge} challenge for {name}; choose another challenge type")]
    NoChallenge { directory: String, challenge: Challenge, name: String },
    #[error("the certificate the CA issued is unusable: {0}")]
    Issued(String),
    #[error(
        "ACME state directory: {path}: {source} (check that the state directory is writable by the server's user)"
    )]
    Store {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A step of the protocol, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Directory,
    Account,
    Order,
    Authorization,
    Validation,
    Finalize,
    Download,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Step::Directory => "reading the directory",
            Step::Account => "registering the account",
            Step::Order => "placing the order",
            Step::Authorization => "fetching an authorization",
            Step::Validation => "waiting for validation",
            Step::Finalize => "finalizing the order",
            Step::Download => "downloading the certificate",
        })
    }
}

/// Where [`Acme::certificate`]'s certificate came from.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The state directory (still valid, no order placed).
    Stored,
    /// A new order.
    Issued,
}

/// A challenge answer to publish beyond this process (to the other members of a
/// fleet), so that a validation reaching any of them is answered.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RelayedAnswer {
    #[serde(with = "challenge_name")]
    pub challenge: Challenge,
    /// The DNS name validated.
    pub name: String,
    /// The http-01 token.
    pub token: String,
    pub key_authorization: String,
}

mod challenge_name {
    use super::Challenge;

    pub fn serialize<S: serde::Serializer>(c: &Challenge, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&c.to_string())
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Challenge, D::Error> {
        let name = <String as serde::Deserialize>::deserialize(d)?;
        match name.as_str() {
            "http-01" => Ok(Challenge::Http01),
            "tls-alpn-01" => Ok(Challenge::TlsAlpn01),
            "dns-01" => Ok(Challenge::Dns01),
            other => Err(serde::de::Error::custom(format!("unknown challenge {other:?}"))),
        }
    }
}

/// The future of [`Relay::publish`].
pub type RelayFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>>;

/// Where [`Acme::obtain_relayed`] publishes its challenge answers besides [`Challenges`].
/// The relay withdraws them itself once the order is done.
pub trait Relay: Send {
    /// Publishes `answer` where the CA's validation may land; returns once it is
    /// answerable there; an error (the text says why) fails the order.
    fn publish(&mut self, answer: RelayedAnswer) -> RelayFuture<'_>;
}

/// How long to wait for the CA to validate and to issue.
const POLL: RetryPolicy =
    RetryPolicy::new().initial_delay(Duration::from_millis(250)).backoff(2.0).timeout(Duration::from_secs(180));

/// The longest single sleep of the renewal task, so a wall clock jump is noticed.
const RENEW_SLEEP_STEP: Duration = Duration::from_secs(3600);

/// The ACME client of one site.
pub struct Acme {
    settings: AcmeSettings,
    /// The names sorted, as [`Issued::names`] gives a certificate's.
    sorted_names: Vec<String>,
    challenges: Arc<Challenges>,
    /// The account, once loaded or created (lazily: loading reads the directory).
    account: tokio::sync::Mutex<Option<Account>>,
    /// Held while the account is loaded or registered, by every [`Acme`] of the same CA
    /// directory and state directory ([`registration_lock`]).
    registration: RegistrationLock,
}

/// A published challenge answer (served from [`Challenges`], or a TXT record the dns-01
/// hook set), withdrawn when dropped.
type Answer = Box<dyn Send>;

type RegistrationLock = Arc<tokio::sync::Mutex<()>>;

/// The one registration lock per (state directory, CA directory) of the process: sites
/// starting together take turns, so the first registers the account and stores it, and the
/// others load the stored one instead of each registering its own.
fn registration_lock(state_dir: &std::path::Path, directory: &str) -> RegistrationLock {
    type Locks = std::collections::HashMap<(PathBuf, String), RegistrationLock>;
    static LOCKS: std::sync::Mutex<Option<Locks>> = std::sync::Mutex::new(None);
    let mut locks = LOCKS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let lock = locks.get_or_insert_with(Locks::new).entry((state_dir.to_path_buf(), directory.to_string()));
    Arc::clone(lock.or_default())
}

impl Acme {
    /// Checks the settings; does no I/O.
    pub fn new(mut settings: AcmeSettings, challenges: Arc<Challenges>) -> Result<Self, AcmeError> {
        if settings.names.is_empty() {
            return Err(AcmeError::Settings("no names to request a certificate for".into()));
        }
        for name in &mut settings.names {
            *name = name.to_ascii_lowercase();
            check_name(name, settings.challenge).map_err(AcmeError::Settings)?;
        }
        if settings.challenge == Challenge::Dns01 && settings.dns_hook.is_none() {
            return Err(AcmeError::Settings("dns-01 needs a dns_hook command to publish the TXT records".into()));
        }
        // Order kept (the first names the file); duplicates dropped.
        let mut seen = std::collections::HashSet::new();
        settings.names.retain(|n| seen.insert(n.clone()));
        let mut sorted_names = settings.names.clone();
        sorted_names.sort();
        let registration = registration_lock(&settings.state_dir, &settings.directory);
        Ok(Acme { settings, sorted_names, challenges, account: tokio::sync::Mutex::new(None), registration })
    }

    #[cfg(test)]
    pub fn settings(&self) -> &AcmeSettings {
        &self.settings
    }

    /// The stored certificate, if it is for these names and valid now; logs why not
    /// otherwise (except when there is none yet). No network.
    pub fn stored(&self) -> Option<Issued> {
        let dir = &self.settings.state_dir;
        match store::load_site(dir, &self.settings.names, &self.sorted_names, SystemTime::now()) {
            Ok(issued) => Some(issued),
            Err(store::Unusable::Missing) => None,
            Err(why) => {
                let path = store::site_path(dir, &self.settings.names);
                tracing::info!("{}: {why}; ordering a new certificate", path.display());
                None
            }
        }
    }

    /// The CA's directory URL.
    pub fn directory(&self) -> &str {
        &self.settings.directory
    }

    /// The names, in the configured order (the first names the files).
    pub fn names(&self) -> &[String] {
        &self.settings.names
    }

    /// Why `issued` cannot serve this site now (other names, expired), if it cannot.
    pub fn unusable(&self, issued: &Issued, now: SystemTime) -> Option<String> {
        let have = issued.names();
        if have != self.sorted_names {
            return Some(format!("the certificate is for other names ({})", have.join(", ")));
        }
        (!issued.valid_at(now)).then(|| "the certificate is not valid now".to_string())
    }

    /// Keeps `issued` (obtained by another member) in the state directory, as an
    /// order of this member would.
    pub fn keep(&self, issued: &Issued) -> Result<(), AcmeError> {
        let dir = &self.settings.state_dir;
        store::save_site(dir, &self.settings.names, issued)
            .map(drop)
            .map_err(|source| AcmeError::Store { path: store::site_path(dir, &self.settings.names), source })
    }

    /// The account's file (its CA and credentials, key included), registering the
    /// account first when there is none.
    pub async fn account_file(&self) -> Result<Vec<u8>, AcmeError> {
        self.account().await?;
        let path = store::account_path(&self.settings.state_dir, &self.settings.directory);
        std::fs::read(&path).map_err(|source| AcmeError::Store { path, source })
    }

    /// Uses the account in `file` (another member's [`Acme::account_file`]) from the next
    /// order on, keeping it in the state directory; refused when it is not an account of
    /// this CA.
    pub async fn adopt_account(&self, file: &[u8]) -> Result<(), String> {
        let stored: StoredAccount = serde_json::from_slice(file).map_err(|e| format!("not an account: {e}"))?;
        if stored.directory != self.settings.directory {
            return Err(format!("an account of {}, not {}", stored.directory, self.settings.directory));
        }
        let mut cached = self.account.lock().await;
        let _registering = self.registration.lock().await;
        let dir = &self.settings.state_dir;
        if std::fs::read(store::account_path(dir, &self.settings.directory)).is_ok_and(|have| have == file) {
            return Ok(());
        }
        let path = store::account_path(dir, &stored.directory);
        crate::state_file::write_private(dir, &path, file)
            .map_err(|e| format!("cannot keep it in {}: {e}", path.display()))?;
        *cached = None;
        Ok(())
    }

    /// The stored certificate while valid, else a new one. A stored certificate past
    /// its renewal time is returned too: [`Acme::renew_forever`] renews it at once.
    #[cfg(test)]
    pub async fn certificate(&self) -> Result<(Issued, Source), AcmeError> {
        match self.stored() {
            Some(issued) => Ok((issued, Source::Stored)),
            None => Ok((self.obtain().await?, Source::Issued)),
        }
    }

    /// Orders a new certificate: publishes the challenge answers in [`Challenges`] while
    /// the CA validates, finalizes with a CSR for a new key, downloads the chain, and
    /// stores key and chain in the state directory.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future withdraws the published answers, abandons the
    /// order (the CA expires it) and leaves the stored files whole (old or new). A dns-01
    /// hook already running goes on to its end, and a record it sets then stays
    /// ([`DnsHook::set`]).
    pub async fn obtain(&self) -> Result<Issued, AcmeError> {
        self.obtain_relayed(None).await
    }

    /// As [`Acme::obtain`], each challenge answer also handed to `relay` (published to
    /// the fleet) before the CA is told to validate. Cancel safe as [`Acme::obtain`].
    pub async fn obtain_relayed<'d>(&self, mut relay: Option<&mut (dyn Relay + 'd)>) -> Result<Issued, AcmeError> {
        let account = self.account().await?;
        match self.order(&account, relay.as_deref_mut()).await {
            Err(AcmeError::Protocol { source: instant_acme::Error::Api(p), .. })
                if p.r#type.as_deref() == Some("urn:ietf:params:acme:error:accountDoesNotExist") =>
            {
                // The CA no longer knows the stored account (a reset test CA, a deactivated
                // account): register again, once.
                tracing::warn!(
                    "ACME server {} does not know the stored account; registering a new one",
                    self.settings.directory
                );
                let account = self.create_account().await?;
                self.order(&account, relay).await
            }
            other => other,
        }
    }

    async fn order<'d>(
        &self,
        account: &Account,
        mut relay: Option<&mut (dyn Relay + 'd)>,
    ) -> Result<Issued, AcmeError> {
        let directory = &self.settings.directory;
        let protocol = |step| move |source| AcmeError::Protocol { directory: directory.clone(), step, source };
        let identifiers: Vec<Identifier> = self.settings.names.iter().cloned().map(Identifier::Dns).collect();
        let mut order = account.new_order(&NewOrder::new(&identifiers)).await.map_err(protocol(Step::Order))?;

        let challenge = self.settings.challenge;
        // Kept until the order is done: dropping them withdraws the answers.
        let mut published = Vec::new();
        let mut authorizations = order.authorizations();
        while let Some(authz) = authorizations.next().await {
            let mut authz = authz.map_err(protocol(Step::Authorization))?;
            let name = authz.identifier().to_string();
            match authz.status {
                AuthorizationStatus::Pending => {}
                AuthorizationStatus::Valid => continue,
                other => {
                    return Err(AcmeError::Validation {
                        challenge,
                        name,
                        detail: format!("the authorization is {other:?} before any attempt"),
                    })
                }
            }
            let Some(mut handle) = authz.challenge(challenge.acme_type()) else {
                return Err(AcmeError::NoChallenge { directory: directory.clone(), challenge, name });
            };
            let key_authorization = handle.key_authorization();
            published.push(match challenge {
                Challenge::Http01 => {
                    Box::new(self.challenges.publish_http01(&handle.token, key_authorization.as_str())) as Answer
                }
                Challenge::TlsAlpn01 => {
                    let cert = tls_alpn01_certificate(&name, key_authorization.as_str()).map_err(AcmeError::Issued)?;
                    Box::new(self.challenges.publish_tls_alpn01(&name, cert))
                }
                Challenge::Dns01 => {
                    let Some(hook) = &self.settings.dns_hook else {
                        return Err(AcmeError::Settings("dns-01 needs a dns_hook".into()));
                    };
                    let record = hook
                        .set(&dns::record_name(&name), &key_authorization.dns_value())
                        .await
                        .map_err(|detail| AcmeError::Validation { challenge, name: name.clone(), detail })?;
                    tokio::time::sleep(hook.propagation).await;
                    Box::new(record)
                }
            });
            if let Some(relay) = relay.as_deref_mut() {
                let answer = RelayedAnswer {
                    challenge,
                    name: name.clone(),
                    token: handle.token.clone(),
                    key_authorization: key_authorization.as_str().to_string(),
                };
                relay.publish(answer).await.map_err(|detail| AcmeError::Validation { challenge, name, detail })?;
            }
            handle.set_ready().await.map_err(protocol(Step::Validation))?;
        }

        match order.poll_ready(&POLL).await {
            Ok(OrderStatus::Ready) => {}
            Ok(status) => {
                let names = self.settings.names.join(", ");
                let fallback = AcmeError::Order { names, status: format!("{status:?}") };
                return Err(self.why_invalid(&mut order, fallback).await);
            }
            // The order carries a problem: the challenge's own error names the cause.
            Err(source @ instant_acme::Error::Api(_)) => {
                let fallback = protocol(Step::Validation)(source);
                return Err(self.why_invalid(&mut order, fallback).await);
            }
            Err(source) => return Err(protocol(Step::Validation)(source)),
        }
        drop(published);

        let key = rcgen::KeyPair::generate().map_err(|e| AcmeError::Issued(format!("new key: {e}")))?;
        let mut params = rcgen::CertificateParams::new(self.settings.names.clone())
            .map_err(|e| AcmeError::Settings(format!("names: {e}")))?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        let csr = params.serialize_request(&key).map_err(|e| AcmeError::Issued(format!("CSR: {e}")))?;
        order.finalize_csr(csr.der()).await.map_err(protocol(Step::Finalize))?;
        let chain_pem = order.poll_certificate(&POLL).await.map_err(protocol(Step::Download))?;

        let issued = Issued::from_pem(format!("{}{chain_pem}", key.serialize_pem())).map_err(AcmeError::Issued)?;
        let dir = &self.settings.state_dir;
        let path = store::save_site(dir, &self.settings.names, &issued)
            .map_err(|source| AcmeError::Store { path: store::site_path(dir, &self.settings.names), source })?;
        tracing::info!(
            "ACME: new certificate for {} (serial {}, valid until {}), stored in {}",
            self.settings.names.join(", "),
            issued.serial(),
            httpdate::fmt_http_date(issued.not_after),
            path.display()
        );
        Ok(issued)
    }

    /// The reason an order did not become ready: the first failed challenge's error,
    /// else `fallback`.
    async fn why_invalid(&self, order: &mut instant_acme::Order, fallback: AcmeError) -> AcmeError {
        let challenge = self.settings.challenge;
        let mut authorizations = order.authorizations();
        while let Some(Ok(mut authz)) = authorizations.next().await {
            if authz.refresh().await.is_err() {
                continue;
            }
            let name = authz.identifier().to_string();
            let failed = authz.challenges.iter().find_map(|c| c.error.as_ref());
            if let Some(problem) = failed {
                let detail = problem.detail.clone().unwrap_or_else(|| problem.to_string());
                return AcmeError::Validation { challenge, name, detail };
            }
            if authz.status == AuthorizationStatus::Invalid {
                return AcmeError::Validation { challenge, name, detail: "the CA refused the authorization".into() };
            }
        }
        fallback
    }

    /// The account: the one in memory, else the stored one, else a new one. The
    /// registration lock is held throughout, so concurrent orders, of this site or of
    /// another of the same CA, never register two accounts.
    async fn account(&self) -> Result<Account, AcmeError> {
        let mut cached = self.account.lock().await;
        if let Some(account) = cached.as_ref() {
            return Ok(account.clone());
        }
        let _registering = self.registration.lock().await;
        let dir = &self.settings.state_dir;
        let stored = store::load_account(dir, &self.settings.directory)
            .map_err(|source| AcmeError::Store { path: store::account_path(dir, &self.settings.directory), source })?;
        let account = match stored {
            Some(stored) => self
                .builder()?
                .from_credentials(stored.credentials)
                .await
                .map_err(|source| self.protocol(Step::Directory, source))?,
            None => self.register().await?,
        };
        *cached = Some(account.clone());
        Ok(account)
    }

    /// Registers a new account in place of the one in memory.
    async fn create_account(&self) -> Result<Account, AcmeError> {
        let mut cached = self.account.lock().await;
        let _registering = self.registration.lock().await;
        let account = self.register().await?;
        *cached = Some(account.clone());
        Ok(account)
    }

    /// Registers a new account with the CA and stores its credentials.
    async fn register(&self) -> Result<Account, AcmeError> {
        let contact: Vec<String> = self.settings.email.iter().map(|e| format!("mailto:{e}")).collect();
        let contact: Vec<&str> = contact.iter().map(String::as_str).collect();
        let new = NewAccount { contact: &contact, terms_of_service_agreed: true, only_return_existing: false };
        let eab = self.settings.eab.as_ref().map(|e| instant_acme::ExternalAccountKey::new(e.kid.clone(), &e.hmac_key));
        let (account, credentials) = self
            .builder()?
            .create(&new, self.settings.directory.clone(), eab.as_ref())
            .await
            .map_err(|source| self.protocol(Step::Account, source))?;
        let dir = &self.settings.state_dir;
        let stored = StoredAccount { directory: self.settings.directory.clone(), credentials };
        store::save_account(dir, &stored)
            .map_err(|source| AcmeError::Store { path: store::account_path(dir, &self.settings.directory), source })?;
        tracing::info!("ACME: registered account {} at {}", account.id(), self.settings.directory);
        Ok(account)
    }

    fn builder(&self) -> Result<instant_acme::AccountBuilder, AcmeError> {
        match &self.settings.directory_ca {
            Some(ca) => instant_acme::Account::builder_with_root(ca).map_err(|e| {
                AcmeError::Settings(format!("directory CA {}: {e} (give a PEM CA certificate)", ca.display()))
            }),
            None => instant_acme::Account::builder().map_err(|source| self.protocol(Step::Directory, source)),
        }
    }

    fn protocol(&self, step: Step, source: instant_acme::Error) -> AcmeError {
        AcmeError::Protocol { directory: self.settings.directory.clone(), step, source }
    }

    /// The renewal task: sleeps until [`renew_at`] of `current`, orders a new
    /// certificate, hands it to `on_renewed` (the server swaps it into its resolver),
    /// and starts over with it. A failed attempt is logged in one line and retried
    /// after the [`Backoff`] delay (1 min doubling to 6 h). Never returns.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Acme::obtain`]: stop it by dropping or aborting it.
    pub async fn renew_forever<F>(&self, mut current: Issued, mut on_renewed: F) -> std::convert::Infallible
    where
        F: FnMut(&Issued),
    {
        let names = self.settings.names.join(", ");
        loop {
            let at = renew_at(current.not_before, current.not_after);
            while let Some(step) = renew::sleep_step(SystemTime::now(), at, RENEW_SLEEP_STEP) {
                tokio::time::sleep(step).await;
            }
            let mut backoff = Backoff::new();
            current = loop {
                match self.obtain().await {
                    Ok(issued) => break issued,
                    Err(e) => {
                        let delay = backoff.next_delay();
                        let still = match current.not_after.duration_since(SystemTime::now()) {
                            Ok(left) => format!(
                                "the current certificate stays in use; it expires in {} h",
                                left.as_secs() / 3600
                            ),
                            Err(_) => "the current certificate has expired and stays in use".to_string(),
                        };
                        tracing::warn!(
                            "ACME renewal of {names} failed: {e}; retrying in {} s ({still})",
                            delay.as_secs()
                        );
                        tokio::time::sleep(delay).await;
                    }
                }
            };
            on_renewed(&current);
        }
    }
}

/// A DNS name that can be ordered with `challenge` and names a file: letters, digits,
/// hyphens and dots, no empty label; a `*.` wildcard only with dns-01.
fn check_name(name: &str, challenge: Challenge) -> Result<(), String> {
    let base = match name.strip_prefix("*.") {
        Some(base) if challenge == Challenge::Dns01 => base,
        _ => name,
    };
    if crate::names::is_dns_name(base) {
        Ok(())
    } else if challenge == Challenge::Dns01 {
        Err(format!("{name:?} is not a DNS name (letters, digits, '-' and '.', or *. and such a name)"))
    } else {
        Err(format!(
            "{name:?} is not a DNS name that can be validated by {challenge} (letters, digits, '-' and '.'; a wildcard needs dns-01)"
        ))
    }
}
