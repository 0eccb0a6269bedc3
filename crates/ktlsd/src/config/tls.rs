//! The TLS section: certificate and key, protocol versions, cipher suites, record
//! size policy, session-ticket keys, and the TCP options of accepted connections.
//!
//! Names are checked for form here; whether the provider has a suite, or a file holds
//! a usable key, is the `tls` layer's to say when it builds its configuration.

use std::path::PathBuf;

use super::options::{Options, SiteOptions};
use super::tables::ClientAuthMode;
use super::{err, ConfigError};
use crate::tls::sizing::RecordPolicy;
use crate::vocab::TlsVersion;

/// TCP_NOTSENT_LOWAT applied with the adaptive record policy unless one is configured.
pub(super) const ADAPTIVE_NOTSENT_LOWAT: u32 = 16 * 1024;

/// TCP options applied to every accepted connection.
#[derive(Debug, Clone, Default)]
pub struct TcpOptions {
    pub notsent_lowat: Option<u32>,
    pub congestion: Option<String>,
}

/// The TLS section, validated.
pub struct Tls {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub versions: Vec<TlsVersion>,
    pub cipher_suites: Option<Vec<String>>,
    pub record_policy: RecordPolicy,
    pub tcp: TcpOptions,
    pub ticket_keys: Vec<PathBuf>,
}

pub fn tls(o: &Options) -> Result<Tls, ConfigError> {
    let (cert, key) = (o.cert.clone(), o.key.clone());
    match (&cert, &key) {
        (Some(_), None) => return err("--cert was given without --key"),
        (None, Some(_)) => return err("--key was given without --cert"),
        _ => {}
    }
    let given = o.tls_versions.as_ref().map(|l| l.0.clone());
    let mut versions = Vec::new();
    for v in given.unwrap_or_else(|| vec!["1.2".into(), "1.3".into()]) {
        let parsed = match v.trim().to_ascii_lowercase().trim_start_matches("tls").trim_start_matches('v') {
            "1.2" | "12" => TlsVersion::Tls12,
            "1.3" | "13" => TlsVersion::Tls13,
            _ => return err(format!("tls_versions: {v:?} is not 1.2 or 1.3")),
        };
        if !versions.contains(&parsed) {
            versions.push(parsed);
        }
    }
    if versions.is_empty() {
        return err("tls_versions: at least one of 1.2, 1.3 is required");
    }
    let record_policy = match &o.record_size {
        Some(s) => s.parse::<RecordPolicy>().map_err(|e| ConfigError::new(format!("record_size {s:?}: {e}")))?,
        None => RecordPolicy::default(),
    };
    // Adaptive records are sized from the window at the moment they are written;
    // a small unsent queue keeps that moment close to when they leave.
    let adaptive_lowat = matches!(record_policy, RecordPolicy::Adaptive).then_some(ADAPTIVE_NOTSENT_LOWAT);
    let tcp =
        TcpOptions { notsent_lowat: o.tcp_notsent_lowat.or(adaptive_lowat), congestion: o.tcp_congestion.clone() };
    if tcp.notsent_lowat == Some(0) {
        return err("tcp_notsent_lowat must be greater than 0");
    }
    Ok(Tls {
        cert,
        key,
        versions,
        cipher_suites: o.cipher_suites.as_ref().map(|l| l.0.clone()),
        record_policy,
        tcp,
        ticket_keys: o.ticket_keys.clone().unwrap_or_default(),
    })
}

/// A site's client-certificate policy, validated (the CA file is read by the `tls` layer).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientAuth {
    pub ca: PathBuf,
    /// `Require` or `Optional`.
    pub mode: ClientAuthMode,
}

/// A site's `client_ca` and `client_auth`; errors start with `which`.
pub fn client_auth(o: &SiteOptions, which: &str) -> Result<Option<ClientAuth>, ConfigError> {
    match (&o.client_ca, o.client_auth) {
        (_, Some(ClientAuthMode::None)) | (None, None) => Ok(None),
        (None, Some(mode)) => err(format!(
            "{which}client_auth = {:?} needs client_ca, the CA certificates (PEM) client certificates are checked against",
            if mode == ClientAuthMode::Require { "require" } else { "optional" }
        )),
        (Some(ca), mode) => Ok(Some(ClientAuth { ca: ca.clone(), mode: mode.unwrap_or(ClientAuthMode::Require) })),
    }
}

#[cfg(test)]
mod tests {
    use super::super::options::List;
    use super::*;

    #[test]
    fn tls_section() {
        let list = |s: &str| Some(List(super::super::options::split_list(s)));
        let base = Options::default;
        // (options, Ok(versions) or Err(part of the message))
        type Want = Result<Vec<TlsVersion>, &'static str>;
        let table: Vec<(Options, Want)> = vec![
            (base(), Ok(vec![TlsVersion::Tls12, TlsVersion::Tls13])),
            (
                Options { tls_versions: list("TLSv1.3, 1.3,12"), ..base() },
                Ok(vec![TlsVersion::Tls13, TlsVersion::Tls12]),
            ),
            (Options { tls_versions: list("1.1"), ..base() }, Err("tls_versions: \"1.1\" is not 1.2 or 1.3")),
            (Options { tls_versions: list(""), ..base() }, Err("at least one of 1.2, 1.3")),
            (Options { cert: Some("c".into()), ..base() }, Err("--cert was given without --key")),
            (Options { key: Some("k".into()), ..base() }, Err("--key was given without --cert")),
            (Options { record_size: Some("static:0".into()), ..base() }, Err("record_size \"static:0\"")),
            (Options { tcp_notsent_lowat: Some(0), ..base() }, Err("greater than 0")),
        ];
        for (o, want) in table {
            match (tls(&o), want) {
                (Ok(t), Ok(w)) => assert_eq!(t.versions, w, "{o:?}"),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{o:?}: {e}"),
                (Ok(_), Err(w)) => panic!("{o:?}: accepted, want {w:?}"),
                (Err(e), Ok(_)) => panic!("{o:?}: {e}"),
            }
        }
        let adaptive = tls(&Options { record_size: Some("adaptive".into()), ..base() }).map(|t| t.tcp.notsent_lowat);
        assert_eq!(adaptive.ok(), Some(Some(ADAPTIVE_NOTSENT_LOWAT)));
    }

    #[test]
    fn client_auth_policies() {
        use ClientAuthMode::{Optional, Require};
        let ca = || Some(PathBuf::from("ca.pem"));
        let policy = |mode| Ok(Some(ClientAuth { ca: "ca.pem".into(), mode }));
        type Want = Result<Option<ClientAuth>, &'static str>;
        let table: Vec<(Option<PathBuf>, Option<ClientAuthMode>, Want)> = vec![
            (None, None, Ok(None)),
            (ca(), None, policy(Require)),
            (ca(), Some(Require), policy(Require)),
            (ca(), Some(Optional), policy(Optional)),
            (ca(), Some(ClientAuthMode::None), Ok(None)),
            (None, Some(ClientAuthMode::None), Ok(None)),
            (None, Some(Require), Err("site 1: client_auth = \"require\" needs client_ca")),
            (None, Some(Optional), Err("client_auth = \"optional\" needs client_ca")),
        ];
        for (client_ca, mode, want) in table {
            let o = SiteOptions { client_ca: client_ca.clone(), client_auth: mode, ..Default::default() };
            match (client_auth(&o, "site 1: "), want) {
                (Ok(got), Ok(w)) => assert_eq!(got, w, "{client_ca:?} {mode:?}"),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e}"),
                (got, w) => panic!("{client_ca:?} {mode:?}: got {got:?}, want {w:?}"),
            }
        }
    }
}
