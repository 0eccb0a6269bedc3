//! Client certificates (mTLS), per site: the server configurations that ask for
//! a certificate ([`ClientAuthConfigs`]), chosen by the server name of the
//! ClientHello before the handshake goes on, so a site that asks for none never
//! asks, whatever the other sites on the listener do; and the verified
//! certificate's subject, for the access log.
//!
//! Certificates are checked by rustls' `WebPkiClientVerifier` against the site's
//! CA file. Under `Require` a client without a valid certificate ends the
//! handshake with rustls' alert: `certificate_required` (TLS 1.3) when it sent
//! none, `bad_certificate`, `unknown_ca` or the like when it sent one that fails;
//! under `Optional` a certificate is asked for and, when sent, checked the same way.
//!
//! A configuration that asks for certificates issues no stateless tickets: its
//! sessions resume only from its own memory cache, so a session resumes with the
//! certificate it was established with, never with one issued without any.
//! The site's answers are not here (the handler's); nor the ClientHello reading
//! (the handshake's).

use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use super::config::SetupError;
use crate::names::Names;

/// Whether a certificate must be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    Require,
    Optional,
}

/// A site's policy: the CA file its clients' certificates are checked against, and the mode.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Policy {
    pub ca: PathBuf,
    pub mode: Mode,
}

/// The configurations asking for certificates, by server name; `None` where the
/// listener's base configuration (no certificate asked) applies.
#[derive(Clone, Default)]
pub struct ClientAuthConfigs {
    /// The default site's: no server name, or one no site has.
    default: Option<Arc<ServerConfig>>,
    /// Each named site's.
    sites: Vec<(Names, Option<Arc<ServerConfig>>)>,
}

impl ClientAuthConfigs {
    /// Builds one configuration per distinct policy, over `base` (its certificates,
    /// versions, suites and ALPN): `default` for the default site, `sites` for the named ones.
    pub fn new(
        base: &ServerConfig,
        versions: &[&'static rustls::SupportedProtocolVersion],
        default: Option<&Policy>,
        sites: &[(Names, Option<Policy>)],
    ) -> Result<ClientAuthConfigs, SetupError> {
        let mut built: Vec<(Policy, Arc<ServerConfig>)> = Vec::new();
        let mut config_for = |policy: Option<&Policy>| -> Result<Option<Arc<ServerConfig>>, SetupError> {
            let Some(policy) = policy else { return Ok(None) };
            if let Some((_, c)) = built.iter().find(|(p, _)| p == policy) {
                return Ok(Some(c.clone()));
            }
            let c = with_client_auth(base, versions, policy)?;
            built.push((policy.clone(), c.clone()));
            Ok(Some(c))
        };
        let default = config_for(default)?;
        let mut named = Vec::with_capacity(sites.len());
        for (names, policy) in sites {
            named.push((names.clone(), config_for(policy.as_ref())?));
        }
        Ok(ClientAuthConfigs { default, sites: named })
    }

    /// Whether no site asks for certificates (then the ClientHello need not be read first).
    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.sites.iter().all(|(_, c)| c.is_none())
    }

    /// The configuration for a ClientHello naming `server_name`; `None`: the base one.
    pub fn for_name(&self, server_name: Option<&str>) -> Option<Arc<ServerConfig>> {
        let Some(name) = server_name else { return self.default.clone() };
        match crate::names::find(&self.sites, |s| &s.0, &name.to_ascii_lowercase()) {
            Some((_, c)) => c.clone(),
            None => self.default.clone(),
        }
    }
}

/// `base` asking for client certificates under `policy`.
fn with_client_auth(
    base: &ServerConfig,
    versions: &[&'static rustls::SupportedProtocolVersion],
    policy: &Policy,
) -> Result<Arc<ServerConfig>, SetupError> {
    let ca = policy.ca.display();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&policy.ca)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| SetupError::new(format!("client_ca {ca}: cannot read PEM certificates: {e}")))?;
    let mut roots = RootCertStore::empty();
    for c in certs {
        roots.add(c).map_err(|e| SetupError::new(format!("client_ca {ca}: {e}")))?;
    }
    if roots.is_empty() {
        return Err(SetupError::new(format!(
            "client_ca {ca}: no certificate in the file (expected PEM CA certificates)"
        )));
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), base.crypto_provider().clone());
    let builder = match policy.mode {
        Mode::Require => builder,
        Mode::Optional => builder.allow_unauthenticated(),
    };
    let verifier = builder.build().map_err(|e| SetupError::new(format!("client_ca {ca}: {e}")))?;
    let mut tls = ServerConfig::builder_with_provider(base.crypto_provider().clone())
        .with_protocol_versions(versions)
        .map_err(|e| SetupError::new(format!("TLS settings: {e}")))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(base.cert_resolver.clone());
    tls.alpn_protocols = base.alpn_protocols.clone();
    tls.ignore_client_order = base.ignore_client_order;
    tls.send_tls13_tickets = base.send_tls13_tickets;
    tls.enable_secret_extraction = true;
    tls.max_early_data_size = 0;
    Ok(Arc::new(tls))
}

/// The subject of a certificate (DER) as RFC 4514 writes it, as nginx's
/// `$ssl_client_s_dn` does: `CN=alice,O=Example`; `None` when it does not parse.
pub fn subject_of(der: &[u8]) -> Option<String> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let mut out = String::new();
    let rdns: Vec<_> = cert.subject().iter().collect();
    for (i, rdn) in rdns.into_iter().rev().enumerate() {
        if i > 0 {
            out.push(',');
        }
        for (j, atv) in rdn.iter().enumerate() {
            if j > 0 {
                out.push('+');
            }
            let oid = atv.attr_type();
            let name = x509_parser::objects::oid2abbrev(oid, x509_parser::objects::oid_registry())
                .map(str::to_string)
                .unwrap_or_else(|_| oid.to_id_string());
            out.push_str(&name);
            out.push('=');
            let value = atv.as_str().map(str::to_string).unwrap_or_else(|_| "#".to_string() + &hex(atv.as_slice()));
            escape_into(&mut out, &value);
        }
    }
    Some(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// RFC 4514 section 2.4: special characters escaped with a backslash, control
/// characters as `\XX`.
fn escape_into(out: &mut String, value: &str) {
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        let leading = i == 0 && (c == ' ' || c == '#');
        if leading || (i == last && c == ' ') || matches!(c, '"' | '+' | ',' | ';' | '<' | '>' | '\\') {
            out.push('\\');
            out.push(c);
        } else if c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("\\{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects() {
        let mut params = rcgen::CertificateParams::new(vec!["client.test".to_string()]).expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::CountryName, "FR");
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "Example, Inc.");
        params.distinguished_name.push(rcgen::DnType::CommonName, "alice");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        assert_eq!(subject_of(cert.der()).as_deref(), Some("CN=alice,O=Example\\, Inc.,C=FR"));
        assert_eq!(subject_of(b"not a certificate"), None);
        for (value, want) in [(" a ", "\\ a\\ "), ("#x", "\\#x"), ("a\nb", "a\\0Ab"), ("a+b;c", "a\\+b\\;c")] {
            let mut out = String::new();
            escape_into(&mut out, value);
            assert_eq!(out, want, "{value:?}");
        }
    }
}
