//! The certificate for a handshake, chosen by its server name (SNI): the site
//! whose names match (exact, then wildcard, as `handler::sites` matches Host, both by `crate::names`),
//! else the default site's certificate, or a refusal with `unrecognized_name`.
//!
//! Each site's certificate sits in its own slot so that a renewed one can be
//! swapped in while the server runs; handshakes under way keep the one they got.
//! It does not decide which files a request is served from: Host does that.

use std::sync::{Arc, PoisonError, RwLock};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::acme::Challenges;
use crate::names::{find, host_of, Names};
use crate::vocab::UnknownName;

/// One site's names and its current certificate.
#[derive(Debug)]
pub struct SiteKey {
    pub names: Names,
    key: RwLock<Arc<CertifiedKey>>,
}

impl SiteKey {
    pub fn new(names: Names, key: Arc<CertifiedKey>) -> SiteKey {
        SiteKey { names, key: RwLock::new(key) }
    }

    /// The certificate new handshakes get.
    pub fn current(&self) -> Arc<CertifiedKey> {
        // An Arc swap cannot leave the slot half-written: a poisoned lock is sound.
        self.key.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Swaps in a new certificate for the handshakes that follow.
    pub fn replace(&self, key: Arc<CertifiedKey>) {
        *self.key.write().unwrap_or_else(PoisonError::into_inner) = key;
    }
}

/// The server's certificate resolver.
#[derive(Debug)]
pub struct SniResolver {
    pub sites: Vec<Arc<SiteKey>>,
    pub default: Arc<CertifiedKey>,
    pub unknown: UnknownName,
    /// tls-alpn-01 answers, when a site validates that way.
    pub challenges: Option<Arc<Challenges>>,
}

impl SniResolver {
    /// The certificate for a handshake naming `server_name` (`None`: no SNI).
    pub fn pick(&self, server_name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        // Clients send no SNI for IP addresses: those go to the default site.
        let Some(name) = server_name else { return Some(self.default.clone()) };
        match find(&self.sites, |s| &s.names, &host_of(name)) {
            Some(site) => Some(site.current()),
            None if self.sites.is_empty() => Some(self.default.clone()),
            None => match self.unknown {
                UnknownName::Default => Some(self.default.clone()),
                UnknownName::Refuse => None,
            },
        }
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if let Some(answer) = self.challenges.as_ref().and_then(|c| c.for_client_hello(&hello)) {
            return Some(answer);
        }
        self.pick(hello.server_name())
    }
}

/// Whether a failed handshake is rustls's answer to a resolver that returned no
/// certificate. [`SniResolver`] returns none only for a refused name, so the
/// handshake sends `unrecognized_name` in place of rustls's `access_denied`.
pub fn is_refused_name(error: &rustls::Error) -> bool {
    matches!(error, rustls::Error::General(m) if m == "no server certificate chain resolved")
}

/// A plaintext fatal `unrecognized_name` alert record (RFC 6066 section 3). Before
/// the server's first flight no keys exist, in TLS 1.2 and 1.3 alike.
pub const UNRECOGNIZED_NAME_ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 112];

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::aws_lc_rs;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    fn key(name: &str) -> Arc<CertifiedKey> {
        let cert = rcgen::generate_simple_self_signed(vec![name.to_string()]).expect("cert");
        let der = PrivateKeyDer::try_from(cert.signing_key.serialize_der()).expect("key");
        let chain = vec![CertificateDer::from(cert.cert.der().to_vec())];
        Arc::new(CertifiedKey::from_der(chain, der, &aws_lc_rs::default_provider()).expect("pair"))
    }

    fn names(list: &[&str]) -> Names {
        Names::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("names")
    }

    #[test]
    fn picks_exact_then_wildcard_then_default_or_refuses() {
        let (a, w, d) = (key("a.test"), key("*.w.test"), key("localhost"));
        let mut r = SniResolver {
            sites: vec![
                Arc::new(SiteKey::new(names(&["*.w.test"]), w.clone())),
                Arc::new(SiteKey::new(names(&["a.test", "x.w.test"]), a.clone())),
            ],
            default: d.clone(),
            unknown: UnknownName::Default,
            challenges: None,
        };
        let same =
            |got: Option<Arc<CertifiedKey>>, want: &Arc<CertifiedKey>| got.is_some_and(|g| Arc::ptr_eq(&g, want));
        assert!(same(r.pick(Some("A.test")), &a));
        assert!(same(r.pick(Some("x.w.test")), &a), "exact before wildcard");
        assert!(same(r.pick(Some("y.w.test")), &w));
        assert!(same(r.pick(Some("other.test")), &d));
        assert!(same(r.pick(None), &d));
        r.unknown = UnknownName::Refuse;
        assert!(r.pick(Some("other.test")).is_none());
        assert!(r.pick(Some("z.y.w.test")).is_none(), "a wildcard covers one label");
        assert!(same(r.pick(None), &d), "no SNI is not an unknown name");
        let a2 = key("a.test");
        r.sites[1].replace(a2.clone());
        assert!(same(r.pick(Some("a.test")), &a2));
    }
}
