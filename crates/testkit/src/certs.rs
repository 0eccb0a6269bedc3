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

/// A CA written as DIR/LABEL-ca.pem, and its issuer for client certificates.
pub fn client_ca(dir: &Path, label: &str) -> (PathBuf, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let key = rcgen::KeyPair::generate().expect("CA key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, format!("{label} client CA"));
    let cert = params.self_signed(&key).expect("CA certificate");
    let path = dir.join(format!("{label}-ca.pem"));
    std::fs::write(&path, cert.pem()).expect("write CA");
    (path, rcgen::Issuer::new(params, key))
}

/// A client certificate for CN=`cn`, O=ktlsd tests, issued by `issuer`: (cert, key) paths.
pub fn client_cert(dir: &Path, cn: &str, issuer: &rcgen::Issuer<'_, rcgen::KeyPair>) -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::OrganizationName, "ktlsd tests");
    params.distinguished_name.push(rcgen::DnType::CommonName, cn);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, issuer).expect("client certificate");
    let (c, k) = (dir.join(format!("{cn}.crt")), dir.join(format!("{cn}.key")));
    std::fs::write(&c, cert.pem()).expect("write");
    std::fs::write(&k, key.serialize_pem()).expect("write");
    (c.display().to_string(), k.display().to_string())
}

/// A CA (its PEM file) and a certificate it issued for `localhost`, with its key, for a TLS upstream.
pub fn upstream_certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "proxy test CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf =
        rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&leaf_key, &issuer).unwrap();
    let paths = (dir.join("ca.pem"), dir.join("upstream.pem"), dir.join("upstream.key"));
    std::fs::write(&paths.0, ca_cert.pem()).unwrap();
    std::fs::write(&paths.1, leaf.pem()).unwrap();
    std::fs::write(&paths.2, leaf_key.serialize_pem()).unwrap();
    paths
}
