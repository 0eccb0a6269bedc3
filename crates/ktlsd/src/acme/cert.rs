//! An issued certificate with its key: parsing and checking the PEM the CA sends and
//! the state directory keeps, its validity window and names, and the rustls form the
//! server presents. Pure: no files, no network (those are `store` and the parent).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::crypto::aws_lc_rs;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// A certificate chain (leaf first) and the private key of its leaf, with the leaf's
/// validity window, and the PEM they were read from (what the state directory keeps).
#[derive(Debug)]
pub struct Issued {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    pem: String,
}

impl Clone for Issued {
    fn clone(&self) -> Self {
        Issued {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
            not_before: self.not_before,
            not_after: self.not_after,
            pem: self.pem.clone(),
        }
    }
}

impl Issued {
    /// Parses a PEM holding the key and the chain (the first certificate is the leaf),
    /// checking that the leaf parses and that the key is the leaf's.
    pub fn from_pem(pem: String) -> Result<Self, String> {
        let chain = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("certificate PEM: {e}"))?;
        let key = PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| format!("private key PEM: {e}"))?;
        let Some(leaf) = chain.first() else { return Err("no certificate in it".into()) };
        let (_, parsed) = x509_parser::parse_x509_certificate(leaf.as_ref())
            .map_err(|e| format!("certificate does not parse: {e}"))?;
        let validity = parsed.validity();
        let not_before = unix_time(validity.not_before.timestamp());
        let not_after = unix_time(validity.not_after.timestamp());
        CertifiedKey::from_der(chain.clone(), key.clone_key(), &aws_lc_rs::default_provider())
            .map_err(|e| format!("key and certificate do not match ({e})"))?;
        Ok(Issued { chain, key, not_before, not_after, pem })
    }

    /// The key and the chain as PEM, as [`Issued::from_pem`] read them.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// The DNS names of the leaf's subjectAltName, lowercased and sorted.
    pub fn names(&self) -> Vec<String> {
        let Some(leaf) = self.chain.first() else { return Vec::new() };
        let Ok((_, parsed)) = x509_parser::parse_x509_certificate(leaf.as_ref()) else { return Vec::new() };
        let mut names: Vec<String> = match parsed.subject_alternative_name() {
            Ok(Some(san)) => san
                .value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_ascii_lowercase()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        names.sort();
        names.dedup();
        names
    }

    /// Whether the certificate is still valid at `now`.
    pub fn valid_at(&self, now: SystemTime) -> bool {
        self.not_before <= now && now < self.not_after
    }

    /// The leaf's serial number, as lowercase hex (for logs).
    pub fn serial(&self) -> String {
        let Some(leaf) = self.chain.first() else { return String::new() };
        match x509_parser::parse_x509_certificate(leaf.as_ref()) {
            Ok((_, parsed)) => parsed.raw_serial().iter().map(|b| format!("{b:02x}")).collect(),
            Err(_) => String::new(),
        }
    }

    /// The form a rustls resolver hands out. Cannot fail for an `Issued` built by
    /// [`Issued::from_pem`], which made the same check; the `Result` keeps that from being
    /// an assumption.
    pub fn certified_key(&self) -> Result<Arc<CertifiedKey>, rustls::Error> {
        CertifiedKey::from_der(self.chain.clone(), self.key.clone_key(), &aws_lc_rs::default_provider()).map(Arc::new)
    }
}

fn unix_time(secs: i64) -> SystemTime {
    match u64::try_from(secs) {
        Ok(s) => SystemTime::UNIX_EPOCH + Duration::from_secs(s),
        Err(_) => SystemTime::UNIX_EPOCH,
    }
}
