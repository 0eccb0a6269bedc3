//! The sites section: the `[[site]]` blocks (names, root, certificate, ACME) with their
//! per-site options over the top level's, and the HSTS value they share.
//!
//! Which site answers a name is `handler::sites`' and the TLS layer's; this module only
//! validates the blocks.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::options::{FileAcme, FileSite, SiteOptions};
use super::{err, ConfigError};

/// Where a site's certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SiteCert {
    /// `cert` and `key` files.
    Files { cert: PathBuf, key: PathBuf },
    /// Neither: a self-signed certificate for the site's names, made at start-up.
    SelfSigned,
    /// From an ACME CA; a self-signed placeholder until the first is issued.
    Acme(SiteAcme),
}

/// A site's `acme = { ... }` table, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteAcme {
    pub directory: String,
    pub email: Option<String>,
    pub challenge: crate::acme::Challenge,
    pub directory_ca: Option<PathBuf>,
    /// With dns-01: the hook publishing the TXT records.
    pub dns_hook: Option<crate::acme::DnsHook>,
    pub eab: Option<crate::acme::Eab>,
}

/// One validated `[[site]]`.
#[derive(Debug, Clone)]
pub struct SiteConfig {
    /// Exact names and `*.example.com` wildcards, validated.
    pub names: crate::names::Names,
    /// Canonical path of the site's directory.
    pub root: PathBuf,
    pub cert: SiteCert,
    /// Per site; when absent, the top-level value.
    pub hsts: Option<String>,
    pub autoindex: bool,
    pub dotfiles: bool,
    /// Per site; what a site leaves out is the top level's.
    pub content: crate::handler::Content,
    /// Client certificates asked for by this site's TLS server names; `None`: none.
    pub client_auth: Option<super::tls::ClientAuth>,
    /// The site's own access log file; `None`: the top-level `access_log`.
    pub access_log: Option<PathBuf>,
}

/// How messages name the `i`th `[[site]]` block (from 0): `site 2 (b.example)`.
pub fn label(i: usize, s: &FileSite) -> String {
    format!("site {} ({})", i + 1, s.names.first().map(String::as_str).unwrap_or("no names"))
}

/// Validates the `[[site]]` blocks: names well formed and each in one site only,
/// roots directories, `cert` and `key` together. Options a site leaves out are
/// the top level's (`top`).
pub fn sites(file: Vec<FileSite>, top: &SiteOptions) -> Result<Vec<SiteConfig>, ConfigError> {
    let mut out: Vec<SiteConfig> = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for (i, s) in file.into_iter().enumerate() {
        let which = label(i, &s);
        let names = crate::names::Names::parse(&s.names).map_err(|e| ConfigError::new(format!("{which}: {e}")))?;
        for n in names.dns_names() {
            if let Some(other) = seen.insert(n.clone(), which.clone()) {
                return err(format!("{which}: name {n} is also in {other}; each name belongs to one site"));
            }
        }
        let root = match s.root.canonicalize() {
            Ok(r) if r.is_dir() => r,
            Ok(_) => return err(format!("{which}: root {} is not a directory", s.root.display())),
            Err(e) => return err(format!("{which}: root {}: {e}", s.root.display())),
        };
        let options = s.site_options(top);
        let cert = match (s.cert, s.key, s.acme) {
            (Some(_), _, Some(_)) | (_, Some(_), Some(_)) => {
                return err(format!("{which}: give either cert and key or acme, not both"))
            }
            (None, None, Some(acme)) => SiteCert::Acme(site_acme(&which, &names, acme)?),
            (Some(cert), Some(key), None) => SiteCert::Files { cert, key },
            (None, None, None) => SiteCert::SelfSigned,
            (Some(_), None, None) => return err(format!("{which}: cert was given without key")),
            (None, Some(_), None) => return err(format!("{which}: key was given without cert")),
        };
        let hsts = match &options.hsts {
            Some(v) => Some(validate_hsts(v).map_err(|e| ConfigError::new(format!("{which}: {e}")))?),
            None => None,
        };
        let canonical = super::routing::canonical(s.canonical.as_deref(), Some(names.exact()), &format!("{which}: "))?;
        let locations = super::location::locations(&options, &format!("{which}: "))?;
        super::proxy::accel_outside(options.proxy.as_deref().unwrap_or_default(), &root)
            .map_err(|e| ConfigError::new(format!("{which}: {e}")))?;
        let content = super::content::content(&options, &format!("{which}: "), canonical, locations)?;
        out.push(SiteConfig {
            content,
            client_auth: super::tls::client_auth(&options, &format!("{which}: "))?,
            names,
            root,
            cert,
            hsts,
            autoindex: options.autoindex.unwrap_or(false),
            dotfiles: options.dotfiles.unwrap_or(false),
            access_log: s.access_log,
        });
    }
    Ok(out)
}

/// What ACME sites need beyond their block: a plain-HTTP listener for http-01, and a
/// state directory for the account and certificates.
pub fn check_acme(
    sites: &[SiteConfig],
    http_listen: &[SocketAddr],
    state_dir: Option<&Path>,
) -> Result<(), ConfigError> {
    for site in sites {
        let SiteCert::Acme(acme) = &site.cert else { continue };
        let which = site.names.dns_names().join(", ");
        if acme.challenge == crate::acme::Challenge::Http01 && http_listen.is_empty() {
            return err(format!(
                "site {which}: ACME http-01 needs a plain-HTTP listener: set http_listen (e.g. [\"0.0.0.0:80\"])"
            ));
        }
        if state_dir.is_none() {
            return err(format!(
                "site {which}: ACME needs a state directory for the account and certificates: set state_dir"
            ));
        }
    }
    Ok(())
}

/// A site's `acme` table: a URL directory, a challenge type, exact names only unless
/// dns-01 (a CA validates wildcards by DNS only), dns-01's hook, and the EAB key.
fn site_acme(which: &str, names: &crate::names::Names, a: FileAcme) -> Result<SiteAcme, ConfigError> {
    use crate::acme::Challenge;
    if !a.directory.starts_with("https://") {
        return err(format!(
            "{which}: acme directory {:?}: expected an https:// URL (e.g. https://acme-v02.api.letsencrypt.org/directory)",
            a.directory
        ));
    }
    let challenge = match a.challenge.as_deref() {
        None | Some("tls-alpn-01") => Challenge::TlsAlpn01,
        Some("http-01") => Challenge::Http01,
        Some("dns-01") => Challenge::Dns01,
        Some(other) => {
            return err(format!("{which}: acme challenge {other:?}: expected tls-alpn-01, http-01 or dns-01"))
        }
    };
    if challenge != Challenge::Dns01 && names.dns_names().len() != names.exact().len() {
        return err(format!(
            "{which}: ACME validates wildcard names by dns-01 only: list exact names, or set challenge = \"dns-01\" and a dns_hook"
        ));
    }
    if let Some(ca) = &a.directory_ca {
        if !ca.is_file() {
            return err(format!("{which}: acme directory_ca {}: no such file", ca.display()));
        }
    }
    let dns_hook = dns_hook(which, challenge, &a)?;
    let eab = match a.eab {
        None => None,
        Some(e) => {
            let hmac_key = base64url(&e.hmac_key).filter(|k| !k.is_empty()).ok_or_else(|| {
                ConfigError::new(format!(
                    "{which}: acme eab hmac_key: expected the base64url key the CA gave (letters, digits, - and _)"
                ))
            })?;
            if e.kid.is_empty() {
                return err(format!("{which}: acme eab kid: empty; give the key id the CA gave"));
            }
            Some(crate::acme::Eab { kid: e.kid, hmac_key })
        }
    };
    Ok(SiteAcme { directory: a.directory, email: a.email, challenge, directory_ca: a.directory_ca, dns_hook, eab })
}

/// dns-01's hook: required with dns-01 (an executable file), refused with the others.
fn dns_hook(
    which: &str,
    challenge: crate::acme::Challenge,
    a: &FileAcme,
) -> Result<Option<crate::acme::DnsHook>, ConfigError> {
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;
    let given = a.dns_hook.is_some() || a.dns_hook_timeout.is_some() || a.dns_propagation.is_some();
    if challenge != crate::acme::Challenge::Dns01 {
        if given {
            return err(format!("{which}: acme dns_hook and its timings apply to challenge = \"dns-01\" only"));
        }
        return Ok(None);
    }
    let Some(command) = a.dns_hook.clone() else {
        return err(format!(
            "{which}: acme dns-01 needs dns_hook, a command run as HOOK set|clear NAME VALUE that publishes the TXT record"
        ));
    };
    match std::fs::metadata(&command) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {}
        Ok(_) => return err(format!("{which}: acme dns_hook {}: not an executable file", command.display())),
        Err(e) => return err(format!("{which}: acme dns_hook {}: {e}", command.display())),
    }
    let key = |k: &str| format!("{which}: acme {k}");
    let timeout = super::timeouts::timeout(
        &key("dns_hook_timeout"),
        a.dns_hook_timeout.as_ref(),
        None,
        Duration::from_secs(120),
    )?;
    let propagation =
        super::timeouts::timeout(&key("dns_propagation"), a.dns_propagation.as_ref(), None, Duration::ZERO)?;
    Ok(Some(crate::acme::DnsHook { command, timeout, propagation }))
}

/// Decodes base64url (RFC 4648 section 5; padding and the standard alphabet's `+/` taken
/// too, as CAs show keys either way); `None` if malformed.
fn base64url(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.trim().trim_end_matches('=').bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    // Left-over bits must be zero padding of less than a byte (not a lone sixth character).
    (bits < 6 && acc == 0).then_some(out)
}

/// A Strict-Transport-Security value: `max-age=SECONDS` first (RFC 6797 section 6.1),
/// then any directives, in characters a header value may hold.
pub fn validate_hsts(v: &str) -> Result<String, ConfigError> {
    let v = v.trim();
    let age = v.get(..8).filter(|p| p.eq_ignore_ascii_case("max-age=")).map(|_| &v[8..]);
    let digits = age.map_or(0, |a| a.bytes().take_while(u8::is_ascii_digit).count());
    let rest_ok = age.is_some_and(|a| a[digits..].is_empty() || a[digits..].trim_start().starts_with(';'));
    if digits == 0 || !rest_ok {
        return err(format!(
            "hsts {v:?}: expected max-age=SECONDS first, e.g. \"max-age=31536000; includeSubDomains\""
        ));
    }
    if !v.bytes().all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic()) {
        return err(format!("hsts {v:?}: only printable ASCII may appear in a header value"));
    }
    Ok(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hsts_values() {
        for (v, ok) in [
            ("max-age=31536000; includeSubDomains", true),
            ("max-age=0", true),
            ("MAX-AGE=63072000; includeSubDomains; preload", true),
            (" max-age=1 ", true),
            ("max-age=1 ;preload", true),
            ("includeSubDomains; max-age=1", false),
            ("max-age=", false),
            ("max-age=abc", false),
            ("max-age=1x", false),
            ("max-age=\"1\"", false),
            ("max-age=1; a\r\nSet-Cookie: x", false),
            ("", false),
        ] {
            let got = validate_hsts(v);
            assert_eq!(got.is_ok(), ok, "{v:?}: {got:?}");
            if let Err(e) = got {
                assert!(e.to_string().starts_with("hsts "), "{e}");
            }
        }
    }

    #[test]
    fn site_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let site = |names: &[&str]| FileSite {
            names: names.iter().map(|s| s.to_string()).collect(),
            root: root.clone(),
            ..Default::default()
        };
        let acme = |dir: &str| Some(FileAcme { directory: dir.into(), ..Default::default() });
        let table: Vec<(Vec<FileSite>, Result<(), &str>)> = vec![
            (vec![site(&["a.test"]), site(&["*.b.test"])], Ok(())),
            (vec![site(&["a.test"]), site(&["a.test"])], Err("name a.test is also in site 1")),
            (vec![FileSite { root: root.join("nope"), ..site(&["a.test"]) }], Err("site 1 (a.test): root")),
            (vec![FileSite { cert: Some("c".into()), ..site(&["a.test"]) }], Err("cert was given without key")),
            (vec![FileSite { acme: acme("http://x"), ..site(&["a.test"]) }], Err("expected an https:// URL")),
            (vec![FileSite { acme: acme("https://x"), ..site(&["*.a.test"]) }], Err("wildcard names by dns-01 only")),
            (
                vec![FileSite { acme: acme("https://x"), key: Some("k".into()), ..site(&["a.test"]) }],
                Err("either cert and key or acme"),
            ),
            (vec![FileSite { hsts: Some("x".into()), ..site(&["a.test"]) }], Err("site 1 (a.test): hsts \"x\"")),
        ];
        for (blocks, want) in table {
            let shown = format!("{blocks:?}");
            match (sites(blocks, &SiteOptions::default()), want) {
                (Ok(_), Ok(())) => {}
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{shown}: {e}"),
                (Ok(_), Err(w)) => panic!("{shown}: accepted, want {w:?}"),
                (Err(e), Ok(())) => panic!("{shown}: {e}"),
            }
        }
    }

    #[test]
    fn acme_tables() {
        use crate::acme::Challenge;
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let hook = dir.path().join("hook");
        std::fs::write(&hook, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "").expect("write");
        let base = || FileAcme { directory: "https://ca.test/dir".into(), ..Default::default() };
        let dns = |h: &std::path::Path| FileAcme {
            challenge: Some("dns-01".into()),
            dns_hook: Some(h.to_path_buf()),
            ..base()
        };
        let eab = |k: &str| Some(crate::config::options::FileEab { kid: "kid-1".into(), hmac_key: k.into() });
        let dur = |s: &str| Some(crate::config::options::RawDuration::File(toml::Value::String(s.into())));
        let table: Vec<(FileAcme, &[&str], Result<Challenge, &str>)> = vec![
            (base(), &["a.test"], Ok(Challenge::TlsAlpn01)),
            (dns(&hook), &["a.test", "*.a.test"], Ok(Challenge::Dns01)),
            (FileAcme { challenge: Some("dns-01".into()), ..base() }, &["a.test"], Err("dns-01 needs dns_hook")),
            (dns(&plain), &["a.test"], Err("not an executable file")),
            (dns(&dir.path().join("nope")), &["a.test"], Err("acme dns_hook")),
            (FileAcme { dns_hook: Some(hook.clone()), ..base() }, &["a.test"], Err("dns-01\" only")),
            (
                FileAcme { dns_propagation: dur("soon"), ..dns(&hook) },
                &["a.test"],
                Err("acme dns_propagation \"soon\""),
            ),
            (FileAcme { dns_propagation: dur("30s"), ..dns(&hook) }, &["a.test"], Ok(Challenge::Dns01)),
            (
                FileAcme { eab: eab("zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W"), ..base() },
                &["a.test"],
                Ok(Challenge::TlsAlpn01),
            ),
            (FileAcme { eab: eab("not base64!"), ..base() }, &["a.test"], Err("acme eab hmac_key")),
            (
                FileAcme { challenge: Some("dns-1".into()), ..base() },
                &["a.test"],
                Err("expected tls-alpn-01, http-01 or dns-01"),
            ),
        ];
        for (acme, names, want) in table {
            let shown = format!("{acme:?} {names:?}");
            let parsed = crate::names::Names::parse(&names.iter().map(|s| s.to_string()).collect::<Vec<_>>());
            let got = site_acme("site 1", &parsed.expect("names"), acme);
            match (got, want) {
                (Ok(a), Ok(c)) => assert_eq!(a.challenge, c, "{shown}"),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{shown}: {e}"),
                (got, w) => panic!("{shown}: got {got:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn base64url_keys() {
        for (text, want) in [
            ("", Some(&b""[..])),
            ("YQ", Some(b"a")),
            ("YQ==", Some(b"a")),
            ("YWI", Some(b"ab")),
            ("YWJj", Some(b"abc")),
            ("-_8", Some(&[0xfb, 0xff][..])),
            ("+/8=", Some(&[0xfb, 0xff][..])),
            ("Y", None),
            ("YR", None),
            ("a b", None),
        ] {
            assert_eq!(base64url(text).as_deref(), want, "{text:?}");
        }
    }
}
