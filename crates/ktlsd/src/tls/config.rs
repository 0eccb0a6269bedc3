//! The rustls server configuration: certificate, protocol versions, cipher suites,
//! session resumption and ALPN, built once at start-up and shared by all workers.
//!
//! Only suites that Linux kTLS can carry are offered, so that every connection
//! can move its record layer into the kernel when the kernel allows it.
//!
//! Without `--cert`/`--key` the self-signed certificate is kept in the state
//! directory, so its fingerprint survives restarts. With `--ticket-keys` session
//! tickets are sealed with keys read from files, so that every instance given the
//! same files resumes the others' sessions.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use ::aws_lc_rs as aws_lc;
use rustls::crypto::{aws_lc_rs, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ServerConfig, SupportedCipherSuite};

use super::sni::{SiteKey, SniResolver};
use crate::acme::{Challenges, ACME_TLS_ALPN};
use crate::vocab::{TlsVersion, UnknownName};

/// What this layer needs from the configuration; the server builds it from its
/// validated configuration (this module never reads the configuration itself).
#[derive(Debug, Clone)]
pub struct TlsSettings {
    /// Certificate chain and private key files; both or neither.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub versions: Vec<TlsVersion>,
    /// Cipher suite names as given (IANA, OpenSSL or rustls spelling).
    pub cipher_suites: Option<Vec<String>>,
    /// Where the generated self-signed certificate is kept; `None` when none applies.
    pub state_dir: Option<PathBuf>,
    /// Generate the self-signed certificate in memory only, never stored.
    pub ephemeral_cert: bool,
    /// Session-ticket key files; the first encrypts. Empty: a random key per process.
    pub ticket_keys: Vec<PathBuf>,
    /// The keys a fleet shares (`[cluster]`), which win over `ticket_keys`.
    pub shared_tickets: Option<Arc<Ticketer>>,
    /// Whether ALPN offers HTTP/2.
    pub http2: bool,
}

/// Why the TLS configuration could not be built. Each message names the file or
/// value at fault and what to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SetupError(String);

impl SetupError {
    pub(super) fn new(msg: impl Into<String>) -> Self {
        SetupError(msg.into())
    }
}

/// A suite ktlsd offers, with the names people know it by.
struct SuiteName {
    suite: SupportedCipherSuite,
    iana: &'static str,
    openssl: &'static str,
}

fn known_suites() -> [SuiteName; 9] {
    use aws_lc_rs::cipher_suite as cs;
    [
        SuiteName {
            suite: cs::TLS13_AES_128_GCM_SHA256,
            iana: "TLS_AES_128_GCM_SHA256",
            openssl: "TLS_AES_128_GCM_SHA256",
        },
        SuiteName {
            suite: cs::TLS13_AES_256_GCM_SHA384,
            iana: "TLS_AES_256_GCM_SHA384",
            openssl: "TLS_AES_256_GCM_SHA384",
        },
        SuiteName {
            suite: cs::TLS13_CHACHA20_POLY1305_SHA256,
            iana: "TLS_CHACHA20_POLY1305_SHA256",
            openssl: "TLS_CHACHA20_POLY1305_SHA256",
        },
        SuiteName {
            suite: cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            iana: "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            openssl: "ECDHE-ECDSA-AES128-GCM-SHA256",
        },
        SuiteName {
            suite: cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            iana: "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
            openssl: "ECDHE-ECDSA-AES256-GCM-SHA384",
        },
        SuiteName {
            suite: cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            iana: "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
            openssl: "ECDHE-ECDSA-CHACHA20-POLY1305",
        },
        SuiteName {
            suite: cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            iana: "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            openssl: "ECDHE-RSA-AES128-GCM-SHA256",
        },
        SuiteName {
            suite: cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
            iana: "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
            openssl: "ECDHE-RSA-AES256-GCM-SHA384",
        },
        SuiteName {
            suite: cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
            iana: "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
            openssl: "ECDHE-RSA-CHACHA20-POLY1305",
        },
    ]
}

/// The certificate the server presents, and its SHA-256 fingerprint for the start-up line.
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// Whether the certificate is a self-signed one of ktlsd's own.
    pub generated: bool,
    /// Where it came from, for the start-up and reload lines.
    pub origin: String,
}

/// The file in the state directory holding the self-signed key and certificate, in that
/// order. One file, so that the pair is replaced at once.
pub const SELF_SIGNED_FILE: &str = "self-signed.pem";

impl Identity {
    /// Loads `--cert`/`--key`, or the self-signed certificate for localhost: the one kept in
    /// the state directory, generated and stored there when missing, damaged or expired
    /// (or one in memory only with `--ephemeral-cert`). `persist` false (`ktlsd check`)
    /// never writes: a missing pair is generated in memory and the directory checked.
    pub fn load(config: &TlsSettings, persist: bool) -> Result<Self, SetupError> {
        match (&config.cert, &config.key) {
            (Some(cert), Some(key)) => Self::from_files(cert, key),
            _ if config.ephemeral_cert => {
                let (id, _) = Self::self_signed(&localhost_names(), "self-signed, generated at start-up (ephemeral)")?;
                Ok(id)
            }
            _ => match &config.state_dir {
                Some(dir) => Self::stored(&dir.join(SELF_SIGNED_FILE), &localhost_names(), None, persist),
                None => Err(SetupError::new(
                    "no state directory for the self-signed certificate (neither HOME nor XDG_STATE_HOME is set): \
                     give --state-dir DIR, --ephemeral-cert, or --cert and --key",
                )),
            },
        }
    }

    /// The self-signed pair kept at `path` (in the state directory), or a new one for
    /// `names` stored there. With `dns_names`, a stored certificate must name exactly
    /// those (a site whose names changed gets a new one).
    fn stored(path: &Path, names: &[String], dns_names: Option<&[String]>, persist: bool) -> Result<Self, SetupError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        match std::fs::read(path) {
            Ok(pem) => match Self::parse_stored(&pem, SystemTime::now(), dns_names) {
                Ok((chain, key)) => {
                    let origin = format!("self-signed, kept in {}", path.display());
                    return Ok(Identity { chain, key, generated: true, origin });
                }
                Err(why) => {
                    tracing::warn!("{}: {why}; replacing it with a new self-signed certificate", path.display())
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!("cannot read {}: {e}; replacing it with a new self-signed certificate", path.display())
            }
        }
        let fix = "give --state-dir DIR, --ephemeral-cert, or --cert and --key";
        if !persist {
            check_creatable(dir)
                .map_err(|e| SetupError::new(format!("state directory {}: {e} ({fix})", dir.display())))?;
            let (id, _) = Self::self_signed(names, &format!("self-signed, to be stored in {}", path.display()))?;
            return Ok(id);
        }
        let (id, pem) = Self::self_signed(names, &format!("self-signed, generated and stored in {}", path.display()))?;
        crate::state_file::write_private(dir, path, pem.as_bytes()).map_err(|e| {
            SetupError::new(format!("cannot store the self-signed certificate in {}: {e} ({fix})", path.display()))
        })?;
        Ok(id)
    }

    /// A stored pair, if whole, matching, not expired and (with `dns_names`) for
    /// exactly those names; else why not.
    fn parse_stored(
        pem: &[u8],
        now: SystemTime,
        dns_names: Option<&[String]>,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
        let chain: Vec<_> = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("certificate: {}", pem_error(e)))?;
        let Some(leaf) = chain.first() else { return Err("no certificate in it".into()) };
        let key = PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("private key: {}", pem_error(e)))?;
        let parsed = x509_parser::parse_x509_certificate(leaf.as_ref())
            .map_err(|e| format!("certificate does not parse: {e}"))?
            .1;
        let now = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        if parsed.validity().not_after.timestamp() < now {
            return Err(format!("the certificate expired on {}", parsed.validity().not_after));
        }
        if let Some(want) = dns_names {
            let mut have: Vec<&str> = match parsed.subject_alternative_name() {
                Ok(Some(san)) => san
                    .value
                    .general_names
                    .iter()
                    .filter_map(|n| match n {
                        x509_parser::extensions::GeneralName::DNSName(d) => Some(*d),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            };
            let mut want: Vec<&str> = want.iter().map(String::as_str).collect();
            have.sort_unstable();
            want.sort_unstable();
            if have != want {
                return Err(format!("the certificate names {have:?}, the site {want:?}"));
            }
        }
        rustls::sign::CertifiedKey::from_der(chain.clone(), key.clone_key(), &aws_lc_rs::default_provider())
            .map_err(|e| format!("key and certificate do not match ({e})"))?;
        Ok((chain, key))
    }

    /// A `[[site]]`'s certificate: its `cert` and `key` files.
    pub fn site_files(cert: &Path, key: &Path) -> Result<Self, SetupError> {
        let mut id = Self::from_files(cert, key)?;
        id.origin = format!("loaded from {}", cert.display());
        Ok(id)
    }

    /// A `[[site]]` without files: a self-signed certificate for its names (wildcards
    /// included), kept in the state directory as `self-signed-NAME.pem` (NAME: its
    /// first name) like the default one, so its fingerprint survives restarts and
    /// reloads; in memory only with `--ephemeral-cert` or no state directory.
    pub fn site_self_signed(names: Vec<String>, config: &TlsSettings, persist: bool) -> Result<Self, SetupError> {
        match &config.state_dir {
            Some(dir) if !config.ephemeral_cert => {
                let first = names.first().map_or("site", String::as_str).replace('*', "_");
                Self::stored(&dir.join(format!("self-signed-{first}.pem")), &names, Some(&names), persist)
            }
            _ => Ok(Self::self_signed(&names, "self-signed, generated at start-up (ephemeral)")?.0),
        }
    }

    /// A self-signed certificate for `names`, in memory only: what an ACME site
    /// serves until its first certificate is issued.
    pub fn placeholder(names: &[String]) -> Result<Self, SetupError> {
        Ok(Self::self_signed(names, "self-signed placeholder")?.0)
    }

    /// The form the resolver holds, the key checked against the certificate; an
    /// error names `which` site.
    pub fn certified_key(self, which: &str) -> Result<Arc<rustls::sign::CertifiedKey>, SetupError> {
        let origin = self.origin.clone();
        rustls::sign::CertifiedKey::from_der(self.chain, self.key, &aws_lc_rs::default_provider())
            .map(Arc::new)
            .map_err(|e| match e {
                rustls::Error::InconsistentKeys(_) => {
                    SetupError::new(format!("site {which}: the private key does not match the certificate ({origin})"))
                }
                other => SetupError::new(format!("site {which}: certificate/key: {other}")),
            })
    }

    fn from_files(cert: &Path, key: &Path) -> Result<Self, SetupError> {
        let chain: Vec<_> = CertificateDer::pem_file_iter(cert)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| SetupError::new(format!("certificate {}: {}", cert.display(), pem_error(e))))?;
        if chain.is_empty() {
            return Err(SetupError::new(format!("certificate {}: no CERTIFICATE block found", cert.display())));
        }
        let key = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| SetupError::new(format!("private key {}: {}", key.display(), pem_error(e))))?;
        Ok(Identity { chain, key, generated: false, origin: "loaded".to_string() })
    }

    /// A new self-signed certificate for `names`, and its key and certificate as PEM.
    fn self_signed(names: &[String], origin: &str) -> Result<(Self, String), SetupError> {
        let cert = rcgen::generate_simple_self_signed(names.to_vec())
            .map_err(|e| SetupError::new(format!("cannot generate a self-signed certificate: {e}")))?;
        let key = PrivateKeyDer::try_from(cert.signing_key.serialize_der())
            .map_err(|e| SetupError::new(format!("generated key: {e}")))?;
        let pem = format!("{}{}", cert.signing_key.serialize_pem(), cert.cert.pem());
        let id = Identity { chain: vec![cert.cert.der().clone()], key, generated: true, origin: origin.to_string() };
        Ok((id, pem))
    }

    /// SHA-256 of the leaf certificate, as colon-separated hex (the form `openssl x509 -fingerprint` prints).
    pub fn fingerprint(&self) -> String {
        let Some(leaf) = self.chain.first() else { return String::new() };
        let digest = aws_lc::digest::digest(&aws_lc::digest::SHA256, leaf.as_ref());
        digest.as_ref().iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(":")
    }
}

/// What the default self-signed certificate names.
fn localhost_names() -> Vec<String> {
    vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()]
}

/// Whether `dir` exists as a writable directory or could be created (its nearest
/// existing ancestor is a writable directory), without creating anything.
fn check_creatable(dir: &Path) -> Result<(), String> {
    let mut at: PathBuf = if dir.is_relative() { PathBuf::from(".").join(dir) } else { dir.to_path_buf() };
    loop {
        match std::fs::metadata(&at) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => return Err(format!("{} is not a directory", at.display())),
            Err(_) => match at.parent() {
                Some(p) => at = p.to_path_buf(),
                None => return Err("no existing ancestor".into()),
            },
        }
    }
    let c = std::ffi::CString::new(at.as_os_str().as_encoded_bytes()).map_err(|_| "path contains NUL".to_string())?;
    if let Err(e) = crate::sys::can_write_dir(&c) {
        return Err(format!("{} is not writable: {e}", at.display()));
    }
    Ok(())
}

/// Session tickets sealed with keys from `--ticket-keys` files (nginx's
/// `ssl_session_ticket_key` format) or with the keys a fleet shares (`[cluster]`,
/// which replaces them as they rotate), for TLS 1.2 and 1.3 alike.
///
/// A ticket is `name (16) || nonce (12) || AES-256-GCM(state) || tag (16)`, the name
/// authenticated as associated data. The AES key is derived with HKDF-SHA256 from the
/// key's secret bytes (all bytes after the name), so 80- and 48-byte keys both give
/// AES-256. The first key seals; a ticket is opened with the key its name selects.
pub struct Ticketer {
    keys: std::sync::RwLock<Arc<[TicketKey]>>,
}

struct TicketKey {
    name: [u8; TICKET_NAME_LEN],
    aead: aws_lc::aead::LessSafeKey,
}

const TICKET_NAME_LEN: usize = 16;
const TICKET_NONCE_LEN: usize = 12;
/// How long a client may keep a ticket: rustls's own ticketer's lifetime.
const TICKET_LIFETIME_SECS: u32 = 6 * 60 * 60;

impl std::fmt::Debug for Ticketer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only: the keys are secret.
        let names: Vec<String> =
            self.current().iter().map(|k| k.name.iter().map(|b| format!("{b:02x}")).collect()).collect();
        f.debug_struct("Ticketer").field("names", &names).finish()
    }
}

impl Ticketer {
    /// Reads the key files; an error names the file and what is wrong with it.
    pub fn from_files(paths: &[PathBuf]) -> Result<Self, SetupError> {
        let mut keys = Vec::new();
        for path in paths {
            let bytes =
                std::fs::read(path).map_err(|e| SetupError::new(format!("ticket key {}: {e}", path.display())))?;
            let key = Self::key_from_bytes(&bytes).map_err(|why| {
                SetupError::new(format!(
                    "ticket key {}: {why}; make one with `openssl rand 80 > {}`",
                    path.display(),
                    path.display()
                ))
            })?;
            keys.push(key);
        }
        Ok(Ticketer { keys: std::sync::RwLock::new(keys.into()) })
    }

    /// Keys given as bytes (each as a key file holds them), the first sealing.
    pub fn from_keys<'a>(keys: impl IntoIterator<Item = &'a [u8]>) -> Result<Self, String> {
        let keys: Vec<TicketKey> = keys.into_iter().map(Self::key_from_bytes).collect::<Result<_, _>>()?;
        Ok(Ticketer { keys: std::sync::RwLock::new(keys.into()) })
    }

    /// Replaces the keys; connections see the new ones from their next ticket on.
    pub fn replace(&self, other: Ticketer) {
        let keys = other.current();
        *self.keys.write().unwrap_or_else(std::sync::PoisonError::into_inner) = keys;
    }

    fn current(&self) -> Arc<[TicketKey]> {
        self.keys.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn key_from_bytes(bytes: &[u8]) -> Result<TicketKey, String> {
        if bytes.len() != 80 && bytes.len() != 48 {
            return Err(format!("{} bytes, expected 80 (or 48) random bytes", bytes.len()));
        }
        let (name, secret) = bytes.split_at(TICKET_NAME_LEN);
        let mut n = [0u8; TICKET_NAME_LEN];
        n.copy_from_slice(name);
        let salt = aws_lc::hkdf::Salt::new(aws_lc::hkdf::HKDF_SHA256, b"ktlsd session ticket key");
        let prk = salt.extract(secret);
        let okm = prk
            .expand(&[b"aes-256-gcm"], &aws_lc::aead::AES_256_GCM)
            .map_err(|_| "key derivation failed".to_string())?;
        let aead = aws_lc::aead::LessSafeKey::new(aws_lc::aead::UnboundKey::from(okm));
        Ok(TicketKey { name: n, aead })
    }
}

impl rustls::server::ProducesTickets for Ticketer {
    fn enabled(&self) -> bool {
        !self.current().is_empty()
    }

    fn lifetime(&self) -> u32 {
        TICKET_LIFETIME_SECS
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        use aws_lc::aead::{Aad, Nonce};
        use aws_lc::rand::SecureRandom;
        let keys = self.current();
        let key = keys.first()?;
        let mut nonce = [0u8; TICKET_NONCE_LEN];
        aws_lc::rand::SystemRandom::new().fill(&mut nonce).ok()?;
        let mut sealed = plain.to_vec();
        key.aead
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(&key.name), &mut sealed)
            .ok()?;
        let mut out = Vec::with_capacity(TICKET_NAME_LEN + TICKET_NONCE_LEN + sealed.len());
        out.extend_from_slice(&key.name);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Some(out)
    }

    fn decrypt(&self, ticket: &[u8]) -> Option<Vec<u8>> {
        use aws_lc::aead::{Aad, Nonce};
        if ticket.len() < TICKET_NAME_LEN + TICKET_NONCE_LEN {
            return None;
        }
        let (name, rest) = ticket.split_at(TICKET_NAME_LEN);
        let (nonce, sealed) = rest.split_at(TICKET_NONCE_LEN);
        let keys = self.current();
        let key = keys.iter().find(|k| k.name == name)?;
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = sealed.to_vec();
        let plain_len = key.aead.open_in_place(nonce, Aad::from(&key.name), &mut buf).ok()?.len();
        buf.truncate(plain_len);
        Some(buf)
    }
}

fn pem_error(e: rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error as E;
    match e {
        E::Io(io) => io.to_string(),
        E::NoItemsFound => "no PEM item of the expected kind found".into(),
        other => format!("not valid PEM ({other:?})"),
    }
}

/// Builds the shared rustls configuration from the validated settings, with a
/// certificate per site chosen by SNI ([`SniResolver`]); `identity` is the default
/// site's. With `challenges` (tls-alpn-01 sites), ALPN `acme-tls/1` is offered and
/// validation handshakes get their answer.
pub fn server_config(
    config: &TlsSettings,
    identity: Identity,
    sites: Vec<Arc<SiteKey>>,
    unknown: UnknownName,
    challenges: Option<Arc<Challenges>>,
) -> Result<Arc<ServerConfig>, SetupError> {
    let known = known_suites();
    let suites: Vec<SupportedCipherSuite> = match &config.cipher_suites {
        None => known.iter().map(|s| s.suite).collect(),
        Some(names) => {
            let mut out = Vec::new();
            for name in names {
                let found = known.iter().find(|s| {
                    s.iana.eq_ignore_ascii_case(name)
                        || s.openssl.eq_ignore_ascii_case(name)
                        || format!("{:?}", s.suite.suite()).eq_ignore_ascii_case(name)
                });
                match found {
                    Some(s) => out.push(s.suite),
                    None => {
                        return Err(SetupError::new(format!(
                            "cipher suite {name:?} is not one ktlsd offers; choose from: {}",
                            known.iter().map(|s| s.openssl).collect::<Vec<_>>().join(", ")
                        )))
                    }
                }
            }
            out
        }
    };

    let versions: Vec<&'static rustls::SupportedProtocolVersion> =
        config.versions.iter().map(|v| v.supported()).collect();
    let usable = suites.iter().any(|s| versions.iter().any(|v| s.version() == *v));
    if !usable {
        return Err(SetupError::new(
            "cipher_suites and tls_versions leave no suite to negotiate: add a suite of an enabled version",
        ));
    }

    let provider = CryptoProvider { cipher_suites: suites, ..aws_lc_rs::default_provider() };
    let generated = identity.generated;
    let default = rustls::sign::CertifiedKey::from_der(identity.chain, identity.key, &provider).map_err(|e| {
        let what = if generated { "generated certificate" } else { "certificate/key" };
        match e {
            rustls::Error::InconsistentKeys(_) => SetupError::new(format!(
                "the private key {} does not match the certificate {}",
                config.key.as_deref().map(|p| p.display().to_string()).unwrap_or_default(),
                config.cert.as_deref().map(|p| p.display().to_string()).unwrap_or_default(),
            )),
            other => SetupError::new(format!("{what}: {other}")),
        }
    })?;
    let acme_alpn = challenges.is_some();
    let resolver = SniResolver { sites, default: Arc::new(default), unknown, challenges };
    let mut tls = ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&versions)
        .map_err(|e| SetupError::new(format!("TLS settings: {e}")))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    // http/1.0 too: `curl --http1.0` offers only that, and refusing it would fail the handshake.
    // rustls picks the first of ours the client offers, so h2 first means h2 preferred.
    tls.alpn_protocols = vec![b"http/1.1".to_vec(), b"http/1.0".to_vec()];
    if acme_alpn {
        // Offered only with tls-alpn-01 sites; such connections end after the handshake.
        tls.alpn_protocols.push(ACME_TLS_ALPN.to_vec());
    }
    if config.http2 {
        tls.alpn_protocols.insert(0, b"h2".to_vec());
    }
    tls.ticketer = match &config.shared_tickets {
        Some(shared) => shared.clone(),
        None if config.ticket_keys.is_empty() => {
            aws_lc_rs::Ticketer::new().map_err(|e| SetupError::new(format!("session tickets: {e}")))?
        }
        None => Arc::new(Ticketer::from_files(&config.ticket_keys)?),
    };
    // Our order decides, as nginx's `ssl_prefer_server_ciphers on` and Go's crypto/tls do:
    // AES-128-GCM first (known_suites, or the operator's --cipher-suites order). Clients
    // commonly list AES-256-GCM-SHA384 first; its SHA-384 key schedule and 14 AES rounds
    // cost both sides more for no practical gain.
    tls.ignore_client_order = true;
    // One TLS 1.3 ticket per connection (Go's crypto/tls sends one; rustls's default is
    // two): a client resumes one later connection per earlier one, and each connection
    // costs one ticket's sealing and record instead of two. A client that wants more
    // asks with RFC 9149's ticket_request, and gets up to four.
    tls.send_tls13_tickets = 1;
    tls.max_tls13_tickets = 4;
    // The kernel record layer needs the traffic secrets after the handshake.
    tls.enable_secret_extraction = true;
    tls.max_early_data_size = 0;
    Ok(Arc::new(tls))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::server::ProducesTickets;

    fn pair(not_after: Option<SystemTime>) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        if let Some(t) = not_after {
            params.not_before = (t - std::time::Duration::from_secs(86_400)).into();
            params.not_after = t.into();
        }
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (key.serialize_pem(), cert.pem())
    }

    #[test]
    fn stored_pairs_are_accepted_only_whole_matching_and_unexpired() {
        let now = SystemTime::now();
        let (key, cert) = pair(None);
        let (other_key, _) = pair(None);
        let (old_key, old_cert) = pair(Some(now - std::time::Duration::from_secs(60)));
        for (pem, want) in [
            (format!("{key}{cert}"), Ok(())),
            (format!("{cert}{key}"), Ok(())),
            (key.clone(), Err("no certificate")),
            (cert.clone(), Err("private key")),
            (format!("{other_key}{cert}"), Err("do not match")),
            (format!("{old_key}{old_cert}"), Err("expired")),
            (String::new(), Err("no certificate")),
            (format!("{key}{}", cert.replacen("\n", "\n!!", 1)), Err("certificate")),
        ] {
            match (Identity::parse_stored(pem.as_bytes(), now, None), want) {
                (Ok(_), Ok(())) => {}
                (Err(e), Err(w)) => assert!(e.contains(w), "{e:?} lacks {w:?}"),
                (got, want) => panic!("got {:?}, want {want:?} for\n{pem}", got.map(|_| ())),
            }
        }
    }

    #[test]
    fn a_stored_site_pair_must_name_the_site() {
        let (key, cert) = pair(None);
        let pem = format!("{key}{cert}");
        let now = SystemTime::now();
        assert!(Identity::parse_stored(pem.as_bytes(), now, Some(&["localhost".to_string()])).is_ok());
        let e = Identity::parse_stored(pem.as_bytes(), now, Some(&["localhost".to_string(), "b.test".to_string()]))
            .unwrap_err();
        assert!(e.contains("b.test"), "{e}");
    }

    #[test]
    fn tickets_open_only_unaltered_under_a_known_name() {
        let k1: Vec<u8> = (0..80u8).collect();
        let k2: Vec<u8> = (100..180u8).collect();
        let both = Ticketer::from_keys([&k2[..], &k1[..]]).unwrap();
        let only1 = Ticketer::from_keys([&k1[..]]).unwrap();
        let t1 = only1.encrypt(b"session state").unwrap();
        assert_eq!(&t1[..16], &k1[..16], "the ticket starts with the key's name");
        assert_eq!(both.decrypt(&t1).as_deref(), Some(&b"session state"[..]));
        let t2 = both.encrypt(b"session state").unwrap();
        assert_eq!(&t2[..16], &k2[..16], "the first key seals");
        assert_eq!(only1.decrypt(&t2), None);
        assert_ne!(only1.encrypt(b"x"), only1.encrypt(b"x"), "a fresh nonce per ticket");
        for i in [0, 16, 28, t1.len() - 1] {
            let mut bad = t1.clone();
            bad[i] ^= 1;
            assert_eq!(both.decrypt(&bad), None, "byte {i} altered");
        }
        for len in [0, 16, 27, 28, 43] {
            assert_eq!(both.decrypt(&t1[..len.min(t1.len())]), None, "cut to {len}");
        }
        for len in [0, 47, 49, 79, 81] {
            assert!(Ticketer::key_from_bytes(&vec![7; len]).is_err(), "{len} bytes");
        }
        assert!(Ticketer::key_from_bytes(&[7; 48]).is_ok());
        // Replaced keys: tickets of the old first key no longer open unless it stays.
        only1.replace(Ticketer::from_keys([&k2[..]]).unwrap());
        assert_eq!(only1.decrypt(&t1), None);
        assert_eq!(only1.decrypt(&t2).as_deref(), Some(&b"session state"[..]));
    }
}
