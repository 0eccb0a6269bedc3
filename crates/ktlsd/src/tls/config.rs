//! The rustls server configuration: certificate, protocol versions, cipher suites,
//! session resumption and ALPN, built once at start-up and shared by all workers.
//!
//! Only suites that Linux kTLS can carry are offered, so that every connection
//! can move its record layer into the kernel when the kernel allows it.

use std::path::Path;
use std::sync::Arc;

use ::aws_lc_rs as aws_lc;
use rustls::crypto::{aws_lc_rs, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ServerConfig, SupportedCipherSuite};

use crate::config::{Config, ConfigError, TlsVersion};

/// A suite ktlsd offers, with the names people know it by.
struct SuiteName {
    suite: SupportedCipherSuite,
    iana: &'static str,
    openssl: &'static str,
}

fn known_suites() -> [SuiteName; 9] {
    use aws_lc_rs::cipher_suite as cs;
    [
        SuiteName { suite: cs::TLS13_AES_128_GCM_SHA256, iana: "TLS_AES_128_GCM_SHA256", openssl: "TLS_AES_128_GCM_SHA256" },
        SuiteName { suite: cs::TLS13_AES_256_GCM_SHA384, iana: "TLS_AES_256_GCM_SHA384", openssl: "TLS_AES_256_GCM_SHA384" },
        SuiteName { suite: cs::TLS13_CHACHA20_POLY1305_SHA256, iana: "TLS_CHACHA20_POLY1305_SHA256", openssl: "TLS_CHACHA20_POLY1305_SHA256" },
        SuiteName { suite: cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, iana: "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", openssl: "ECDHE-ECDSA-AES128-GCM-SHA256" },
        SuiteName { suite: cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, iana: "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", openssl: "ECDHE-ECDSA-AES256-GCM-SHA384" },
        SuiteName { suite: cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, iana: "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", openssl: "ECDHE-ECDSA-CHACHA20-POLY1305" },
        SuiteName { suite: cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, iana: "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", openssl: "ECDHE-RSA-AES128-GCM-SHA256" },
        SuiteName { suite: cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, iana: "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", openssl: "ECDHE-RSA-AES256-GCM-SHA384" },
        SuiteName { suite: cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256, iana: "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", openssl: "ECDHE-RSA-CHACHA20-POLY1305" },
    ]
}

/// The certificate the server presents, and its SHA-256 fingerprint for the start-up line.
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// Whether the certificate was generated at start-up.
    pub generated: bool,
}

impl Identity {
    /// Loads `--cert`/`--key`, or generates a self-signed certificate for localhost.
    pub fn load(config: &Config) -> Result<Self, ConfigError> {
        match (&config.cert, &config.key) {
            (Some(cert), Some(key)) => Self::from_files(cert, key),
            _ => Self::self_signed(),
        }
    }

    fn from_files(cert: &Path, key: &Path) -> Result<Self, ConfigError> {
        let chain: Vec<_> = CertificateDer::pem_file_iter(cert)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| ConfigError::new(format!("certificate {}: {}", cert.display(), pem_error(e))))?;
        if chain.is_empty() {
            return Err(ConfigError::new(format!(
                "certificate {}: no CERTIFICATE block found",
                cert.display()
            )));
        }
        let key = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| ConfigError::new(format!("private key {}: {}", key.display(), pem_error(e))))?;
        Ok(Identity { chain, key, generated: false })
    }

    fn self_signed() -> Result<Self, ConfigError> {
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
        let cert = rcgen::generate_simple_self_signed(names)
            .map_err(|e| ConfigError::new(format!("cannot generate a self-signed certificate: {e}")))?;
        let key = PrivateKeyDer::try_from(cert.signing_key.serialize_der())
            .map_err(|e| ConfigError::new(format!("generated key: {e}")))?;
        Ok(Identity { chain: vec![cert.cert.der().clone()], key, generated: true })
    }

    /// SHA-256 of the leaf certificate, as colon-separated hex (the form `openssl x509 -fingerprint` prints).
    pub fn fingerprint(&self) -> String {
        let Some(leaf) = self.chain.first() else { return String::new() };
        let digest = aws_lc::digest::digest(&aws_lc::digest::SHA256, leaf.as_ref());
        digest.as_ref().iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(":")
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

/// Builds the shared rustls configuration from the validated settings.
pub fn server_config(config: &Config, identity: Identity) -> Result<Arc<ServerConfig>, ConfigError> {
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
                        return Err(ConfigError::new(format!(
                            "cipher suite {name:?} is not one ktlsd offers; choose from: {}",
                            known.iter().map(|s| s.openssl).collect::<Vec<_>>().join(", ")
                        )))
                    }
                }
            }
            out
        }
    };

    let versions: Vec<&'static rustls::SupportedProtocolVersion> = config
        .tls_versions
        .iter()
        .map(|v| match v {
            TlsVersion::Tls12 => &rustls::version::TLS12,
            TlsVersion::Tls13 => &rustls::version::TLS13,
        })
        .collect();
    let usable = suites.iter().any(|s| versions.iter().any(|v| s.version() == *v));
    if !usable {
        return Err(ConfigError::new(
            "cipher_suites and tls_versions leave no suite to negotiate: add a suite of an enabled version",
        ));
    }

    let provider = CryptoProvider { cipher_suites: suites, ..aws_lc_rs::default_provider() };
    let generated = identity.generated;
    let mut tls = ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&versions)
        .map_err(|e| ConfigError::new(format!("TLS settings: {e}")))?
        .with_no_client_auth()
        .with_single_cert(identity.chain, identity.key)
        .map_err(|e| {
            let what = if generated { "generated certificate" } else { "certificate/key" };
            match e {
                rustls::Error::InconsistentKeys(_) => ConfigError::new(format!(
                    "the private key {} does not match the certificate {}",
                    config.key.as_deref().map(|p| p.display().to_string()).unwrap_or_default(),
                    config.cert.as_deref().map(|p| p.display().to_string()).unwrap_or_default(),
                )),
                other => ConfigError::new(format!("{what}: {other}")),
            }
        })?;
    // http/1.0 too: `curl --http1.0` offers only that, and refusing it would fail the handshake.
    tls.alpn_protocols = vec![b"http/1.1".to_vec(), b"http/1.0".to_vec()];
    tls.ticketer = aws_lc_rs::Ticketer::new()
        .map_err(|e| ConfigError::new(format!("session tickets: {e}")))?;
    // The kernel record layer needs the traffic secrets after the handshake.
    tls.enable_secret_extraction = true;
    tls.max_early_data_size = 0;
    Ok(Arc::new(tls))
}
