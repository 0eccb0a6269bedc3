//! The TLS versions and cipher suites of the kTLS tables, by the names each
//! client takes (OpenSSL names for curl, s_client and ktlsd; rustls suites), and
//! one request through curl or s_client restricted to a cell.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::aws_lc_rs;
use rustls::{ClientConfig, SupportedCipherSuite};
use testkit::{client_config_with, fetch, parse_response, s_client_output, RawResponse};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V {
    Tls12,
    Tls13,
}

impl V {
    pub fn server_arg(self) -> &'static str {
        match self {
            V::Tls12 => "1.2",
            V::Tls13 => "1.3",
        }
    }

    pub fn rustls(self) -> &'static rustls::SupportedProtocolVersion {
        match self {
            V::Tls12 => &rustls::version::TLS12,
            V::Tls13 => &rustls::version::TLS13,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Cipher {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20,
}

/// The OpenSSL name of a suite (the names curl and s_client take; ktlsd
/// takes them too). TLS 1.2 suites are the ECDSA ones: the generated
/// certificate is ECDSA.
pub fn openssl_name(v: V, c: Cipher) -> &'static str {
    match (v, c) {
        (V::Tls12, Cipher::Aes128Gcm) => "ECDHE-ECDSA-AES128-GCM-SHA256",
        (V::Tls12, Cipher::Aes256Gcm) => "ECDHE-ECDSA-AES256-GCM-SHA384",
        (V::Tls12, Cipher::Chacha20) => "ECDHE-ECDSA-CHACHA20-POLY1305",
        (V::Tls13, Cipher::Aes128Gcm) => "TLS_AES_128_GCM_SHA256",
        (V::Tls13, Cipher::Aes256Gcm) => "TLS_AES_256_GCM_SHA384",
        (V::Tls13, Cipher::Chacha20) => "TLS_CHACHA20_POLY1305_SHA256",
    }
}

pub fn rustls_suite(v: V, c: Cipher) -> SupportedCipherSuite {
    use aws_lc_rs::cipher_suite as cs;
    match (v, c) {
        (V::Tls12, Cipher::Aes128Gcm) => cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        (V::Tls12, Cipher::Aes256Gcm) => cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        (V::Tls12, Cipher::Chacha20) => cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        (V::Tls13, Cipher::Aes128Gcm) => cs::TLS13_AES_128_GCM_SHA256,
        (V::Tls13, Cipher::Aes256Gcm) => cs::TLS13_AES_256_GCM_SHA384,
        (V::Tls13, Cipher::Chacha20) => cs::TLS13_CHACHA20_POLY1305_SHA256,
    }
}

pub fn curl_tls_args(v: V, c: Cipher) -> Vec<String> {
    let name = openssl_name(v, c).to_owned();
    match v {
        V::Tls12 => vec!["--tlsv1.2".into(), "--tls-max".into(), "1.2".into(), "--ciphers".into(), name],
        V::Tls13 => vec!["--tlsv1.3".into(), "--tls-max".into(), "1.3".into(), "--tls13-ciphers".into(), name],
    }
}

/// `curl` one URL over HTTP/1.1 on a fresh connection; returns (status, body).
pub fn curl_get(url: &str, tls: &[String], extra: &[&str]) -> (u16, Vec<u8>) {
    let mut args = vec!["--http1.1", "--max-time", "90"];
    args.extend(tls.iter().map(String::as_str));
    args.extend_from_slice(extra);
    let r = fetch(url, &args);
    (r.status, r.body)
}

pub fn s_client_tls_args(v: V, c: Cipher) -> Vec<String> {
    let name = openssl_name(v, c).to_owned();
    match v {
        V::Tls12 => vec!["-tls1_2".into(), "-cipher".into(), name],
        V::Tls13 => vec!["-tls1_3".into(), "-ciphersuites".into(), name],
    }
}

/// One request through `openssl s_client -quiet` (it reads until the server
/// closes); returns the parsed response.
pub fn s_client_get(addr: SocketAddr, tls: &[String], request: &str) -> RawResponse {
    let mut args = vec!["-quiet"];
    args.extend(tls.iter().map(String::as_str));
    let o = s_client_output(addr, &args, request.as_bytes(), Duration::from_secs(100));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "openssl s_client failed ({}): {err}", o.status);
    match parse_response(&o.stdout, false) {
        Some((r, used)) => {
            assert_eq!(used, o.stdout.len(), "s_client: bytes after the response; stderr: {err}");
            r
        }
        None => panic!(
            "s_client: incomplete response ({} bytes: {:?}...); stderr: {err}",
            o.stdout.len(),
            String::from_utf8_lossy(&o.stdout[..o.stdout.len().min(300)])
        ),
    }
}

pub fn client_config(v: V, suite: Option<SupportedCipherSuite>) -> Arc<ClientConfig> {
    client_config_with(&[v.rustls()], suite)
}
