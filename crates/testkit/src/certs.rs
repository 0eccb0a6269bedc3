//! Certificates made for a test: self-signed, written beside the server's files.

use std::path::{Path, PathBuf};

/// A self-signed certificate for `names`, written as DIR/LABEL.crt and .key;
/// returns the paths and its SHA-256 fingerprint (colon-separated upper-case hex).
pub fn cert_for(dir: &Path, label: &str, names: &[&str]) -> (PathBuf, PathBuf, String) {
    use sha2::{Digest, Sha256};
    let cert = rcgen::generate_simple_self_signed(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    let (c, k) = (dir.join(format!("{label}.crt")), dir.join(format!("{label}.key")));
    std::fs::write(&c, cert.cert.pem()).unwrap();
    std::fs::write(&k, cert.signing_key.serialize_pem()).unwrap();
    let fp = Sha256::digest(cert.cert.der()).iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(":");
    (c, k, fp)
}
