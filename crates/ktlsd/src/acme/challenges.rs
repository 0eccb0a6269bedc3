//! The answers to pending ACME challenges, shared between the ACME client (which
//! publishes them while an order is validated) and the listeners (which serve them):
//! http-01 key authorizations for the port-80 listener's
//! `/.well-known/acme-challenge/TOKEN`, and RFC 8737 tls-alpn-01 certificates for
//! TLS handshakes that offer ALPN `acme-tls/1`. It does not listen itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rustls::sign::CertifiedKey;

/// The ALPN protocol of tls-alpn-01 validation handshakes (RFC 8737 section 6.2).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// The URL path prefix of http-01 validation requests (RFC 8555 section 8.3).
pub const HTTP01_PATH_PREFIX: &str = "/.well-known/acme-challenge/";

/// The challenge answers currently published. Cheap to query from every handshake:
/// one short lock, no allocation on a miss.
#[derive(Default, Debug)]
pub struct Challenges {
    http01: Mutex<HashMap<String, String>>,
    tls_alpn01: Mutex<HashMap<String, Arc<CertifiedKey>>>,
}

impl Challenges {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The key authorization to answer `GET /.well-known/acme-challenge/TOKEN` with
    /// (RFC 8555 section 8.3: the body is the key authorization, nothing else).
    pub fn http01(&self, token: &str) -> Option<String> {
        lock(&self.http01).get(token).cloned()
    }

    /// The validation certificate for a handshake whose ClientHello offers ALPN
    /// `acme-tls/1` with SNI `server_name` (any case).
    pub fn tls_alpn01(&self, server_name: &str) -> Option<Arc<CertifiedKey>> {
        lock(&self.tls_alpn01).get(&server_name.to_ascii_lowercase()).cloned()
    }

    /// What a server certificate resolver returns for `hello`: the validation
    /// certificate when the ClientHello offers ALPN `acme-tls/1` and its SNI has a
    /// published answer; `None` otherwise (serve the site's certificate; a handshake
    /// offering `acme-tls/1` with no answer should be refused).
    pub fn for_client_hello(&self, hello: &rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut alpn = hello.alpn()?;
        if !alpn.any(|p| p == ACME_TLS_ALPN) {
            return None;
        }
        self.tls_alpn01(hello.server_name()?)
    }

    /// Whether no answer is published (no validation under way).
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        lock(&self.http01).is_empty() && lock(&self.tls_alpn01).is_empty()
    }

    /// Publishes an http-01 answer until the returned guard is dropped.
    pub(crate) fn publish_http01(self: &Arc<Self>, token: &str, key_authorization: &str) -> Published {
        lock(&self.http01).insert(token.to_string(), key_authorization.to_string());
        Published { challenges: Arc::clone(self), entry: Entry::Http01(token.to_string()) }
    }

    /// Publishes a tls-alpn-01 certificate for `name` until the returned guard is dropped.
    pub(crate) fn publish_tls_alpn01(self: &Arc<Self>, name: &str, cert: Arc<CertifiedKey>) -> Published {
        let name = name.to_ascii_lowercase();
        lock(&self.tls_alpn01).insert(name.clone(), Arc::clone(&cert));
        Published { challenges: Arc::clone(self), entry: Entry::TlsAlpn01(name, cert) }
    }
}

/// A challenge answer that stays published while this lives; dropping it (order done,
/// failed or cancelled) withdraws the answer.
pub struct Published {
    challenges: Arc<Challenges>,
    entry: Entry,
}

enum Entry {
    Http01(String),
    /// The certificate too, so that withdrawing never removes a newer order's answer
    /// for the same name.
    TlsAlpn01(String, Arc<CertifiedKey>),
}

impl Drop for Published {
    fn drop(&mut self) {
        match &self.entry {
            Entry::Http01(token) => {
                lock(&self.challenges.http01).remove(token);
            }
            Entry::TlsAlpn01(name, cert) => {
                let mut map = lock(&self.challenges.tls_alpn01);
                if map.get(name).is_some_and(|c| Arc::ptr_eq(c, cert)) {
                    map.remove(name);
                }
            }
        }
    }
}

/// The maps hold plain data that no panic can leave half-updated, so a poisoned lock
/// is still sound to use.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The RFC 8737 validation certificate for `name`: self-signed, the name as its only
/// subjectAltName, and the critical acmeIdentifier extension holding the SHA-256 of
/// the key authorization. A new key each time (it is never reused for serving).
pub fn tls_alpn01_certificate(name: &str, key_authorization: &str) -> Result<Arc<CertifiedKey>, String> {
    use rustls::crypto::aws_lc_rs;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

    let digest = ::aws_lc_rs::digest::digest(&::aws_lc_rs::digest::SHA256, key_authorization.as_bytes());
    let mut params = rcgen::CertificateParams::new(vec![name.to_string()])
        .map_err(|e| format!("validation certificate for {name}: {e}"))?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest.as_ref())];
    let key = rcgen::KeyPair::generate().map_err(|e| format!("validation key: {e}"))?;
    let cert = params.self_signed(&key).map_err(|e| format!("validation certificate for {name}: {e}"))?;
    let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let chain = vec![CertificateDer::from(cert.der().to_vec())];
    // Not `CertifiedKey::from_der`: its key check parses the certificate with webpki,
    // which refuses the critical acmeIdentifier extension it does not know.
    let signing_key = aws_lc_rs::sign::any_supported_type(&key_der).map_err(|e| format!("validation key: {e}"))?;
    Ok(Arc::new(CertifiedKey::new(chain, signing_key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_answers_are_withdrawn_when_the_guard_drops() {
        let c = Challenges::new();
        let cert = tls_alpn01_certificate("a.example.com", "tok.thumb").expect("certificate");
        {
            let _h = c.publish_http01("tok", "tok.thumb");
            let _t = c.publish_tls_alpn01("A.example.com", Arc::clone(&cert));
            assert_eq!(c.http01("tok").as_deref(), Some("tok.thumb"));
            assert!(c.http01("other").is_none());
            assert!(c.tls_alpn01("a.EXAMPLE.com").is_some_and(|k| Arc::ptr_eq(&k, &cert)));
        }
        assert!(c.http01("tok").is_none());
        assert!(c.tls_alpn01("a.example.com").is_none());
    }

    #[test]
    fn withdrawing_an_old_answer_keeps_a_newer_one_for_the_same_name() {
        let c = Challenges::new();
        let old = c.publish_tls_alpn01("a.example.com", tls_alpn01_certificate("a.example.com", "1").expect("cert"));
        let newer = tls_alpn01_certificate("a.example.com", "2").expect("cert");
        let _new = c.publish_tls_alpn01("a.example.com", Arc::clone(&newer));
        drop(old);
        assert!(c.tls_alpn01("a.example.com").is_some_and(|k| Arc::ptr_eq(&k, &newer)));
    }

    #[test]
    fn validation_certificate_carries_the_critical_acme_identifier() {
        let cert = tls_alpn01_certificate("a.example.com", "token.thumbprint").expect("certificate");
        let (_, parsed) = x509_parser::parse_x509_certificate(cert.cert[0].as_ref()).expect("parses");
        let ext = parsed
            .extensions()
            .iter()
            .find(|e| e.oid.to_id_string() == "1.3.6.1.5.5.7.1.31")
            .expect("acmeIdentifier extension");
        assert!(ext.critical);
        let digest = ::aws_lc_rs::digest::digest(&::aws_lc_rs::digest::SHA256, b"token.thumbprint");
        // The value is an OCTET STRING (tag 4, length 32) holding the digest.
        assert_eq!(&ext.value[..2], &[0x04, 0x20]);
        assert_eq!(&ext.value[2..], digest.as_ref());
    }
}
