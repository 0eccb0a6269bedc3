//! A configuration turned into what workers serve with ([`Shared`]): the
//! certificates and keys read, the TLS configuration built, ROOT and each site's
//! root opened, kTLS chosen, TCP options checked, and the per-connection settings
//! of each protocol built. Start-up, reload and `ktlsd check` all go through
//! [`prepare`]; start-up and reload also open the store of bodies compressed on
//! the fly ([`open_compressed_store`]). Not the binding of sockets or anything
//! after it (see `startup`).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context};

use super::acme::{self, AcmeSites};
use super::cluster::Member;
use super::{congestion, Http3, Shared};
use crate::acme::{Challenge, Challenges};
use crate::config::tables::ClientAuthMode;
use crate::config::{Config, KtlsMode, SiteCert};
use crate::files::{self, Root};
use crate::handler::sites::NamedSite;
use crate::http::{h1, h2};
use crate::tls::client_auth::{ClientAuthConfigs, Mode, Policy};
use crate::tls::config::{server_config, Identity, TlsSettings};
use crate::tls::sni::SiteKey;
use crate::tls::SessionSettings;
use rustls::ServerConfig;

/// A configuration turned into what workers serve with.
pub struct Prepared {
    pub shared: Shared,
    /// The default certificate's SHA-256 fingerprint, for the start-up and reload lines.
    pub fingerprint: String,
    /// Where the certificate came from (loaded, self-signed and kept, ...).
    pub origin: String,
}

/// Loads the certificate and key, builds the TLS configuration, opens ROOT and
/// checks the kTLS mode and TCP options, and builds the per-connection settings. `previous` lends its kTLS probe when
/// the kTLS mode is unchanged (a reload), so the kernel is probed once.
/// Without `acme` (`check`) nothing is written to the state directory and no ACME
/// task starts: ACME sites get a placeholder.
pub fn prepare(
    config: Config,
    previous: Option<&Shared>,
    cache_entries: usize,
    acme: Option<&AcmeSites>,
) -> anyhow::Result<Prepared> {
    let persist = acme.is_some();
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    let cluster = member(&config, previous)?;
    let settings = tls_settings(&config, cluster.as_deref());
    let identity = Identity::load(&settings, persist)?;
    let fingerprint = identity.fingerprint();
    let origin = identity.origin.clone();
    if let Some(leaf) = identity.chain.first() {
        let name = config.cert.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
        if let Some(warning) = expiry_warning(&name, leaf.as_ref(), SystemTime::now()) {
            tracing::warn!("{warning}");
        }
    }
    let default_not_after = identity.chain.first().and_then(|leaf| not_after(leaf.as_ref()));
    let (keys, sites, alpn01) = open_sites(&config, &settings, cache_entries, acme, cluster.as_ref())?;
    let certificates = Certificates {
        default: default_not_after,
        sites: keys.iter().map(|k| (k.names.label().into_owned(), k.clone())).collect(),
    };
    let challenges = acme.map_or_else(Challenges::new, |a| a.challenges.clone());
    if let (Some(member), Some(_)) = (&cluster, acme) {
        let names =
            config.sites.iter().filter(|s| matches!(s.cert, SiteCert::Acme(_))).flat_map(|s| s.names.dns_names());
        member.serve_acme(challenges.clone(), names.collect());
    }
    let tls = server_config(&settings, identity, keys, config.unknown_sni, alpn01.then(|| challenges.clone()))?;
    let client_auth = client_auth_configs(&config, &tls)?;
    let root = Root::new(&config.root).with_context(|| format!("cannot open root {}", config.root.display()))?;
    let ktls = match previous {
        Some(p) if p.config.ktls == config.ktls => p.ktls.clone(),
        _ => choose_ktls(&config)?.map(Arc::new),
    };
    check_tcp_options(&config)?;
    // At start the cache opens after the privilege drop (its files belong to the serving user).
    let cache = match previous {
        Some(p) => open_cache(&config, Some(p))?,
        None => None,
    };
    let http3 = http3(&config, &tls, cluster.as_deref())?;
    files::set_cache_valid(config.open_file_cache_valid);
    let shared = Shared {
        client_auth,
        file_options: files::Options { dotfiles: config.dotfiles, autoindex: config.autoindex, cache_entries },
        h1: h1_settings(&config),
        h2: h2_settings(&config),
        session: SessionSettings { record_policy: config.record_policy, send_timeout: config.timeouts.send },
        config,
        root,
        tls,
        ktls,
        sites,
        challenges,
        cache,
        certificates,
        http3,
        cluster,
    };
    Ok(Prepared { shared, fingerprint, origin })
}

/// This member of the fleet: the running one on reload (a restart applies a changed
/// `[cluster]`), else a new one (its thread is started once the server runs).
fn member(config: &Config, previous: Option<&Shared>) -> anyhow::Result<Option<Arc<Member>>> {
    let Some(previous) = previous else {
        return config.cluster.as_ref().map(|c| Member::new(c, config.state_dir.clone()).map(Arc::new)).transpose();
    };
    let running = previous.cluster.clone();
    if running.as_ref().map(|m| &m.settings) != config.cluster.as_ref() {
        tracing::warn!("reload: [cluster] changed; this takes effect only after a restart");
    }
    Ok(running)
}

/// The response cache of `config`: `previous`'s when its `[cache]` is the same,
/// else opened (its directory created when missing).
pub fn open_cache(
    config: &Config,
    previous: Option<&Shared>,
) -> anyhow::Result<Option<Arc<crate::handler::cache::Cache>>> {
    let Some(c) = &config.cache else { return Ok(None) };
    if let Some(kept) = previous.and_then(|p| p.cache.clone().filter(|_| p.config.cache.as_ref() == Some(c))) {
        return Ok(Some(kept));
    }
    let cache = crate::handler::cache::Cache::open(c)?;
    tracing::info!("response cache in {} (max_size {} bytes)", c.dir.display(), c.max_size);
    Ok(Some(cache))
}

/// The configurations that ask for client certificates (mTLS), over `base`: the
/// default site's and each `[[site]]`'s, by their names; each CA file read here.
fn client_auth_configs(config: &Config, base: &ServerConfig) -> anyhow::Result<ClientAuthConfigs> {
    let policy = |c: &Option<crate::config::tls::ClientAuth>| {
        c.as_ref().map(|c| Policy {
            ca: c.ca.clone(),
            mode: match c.mode {
                ClientAuthMode::Optional => Mode::Optional,
                _ => Mode::Require,
            },
        })
    };
    let versions: Vec<_> = config.tls_versions.iter().map(|v| v.supported()).collect();
    let sites: Vec<_> = config.sites.iter().map(|s| (s.names.clone(), policy(&s.client_auth))).collect();
    Ok(ClientAuthConfigs::new(base, &versions, policy(&config.client_auth).as_ref(), &sites)?)
}

/// The `[[site]]`s of `config`: each one's certificate key for the resolver
/// (files, self-signed, or an ACME slot) and its opened ROOT; and whether any
/// ACME site answers tls-alpn-01 challenges.
fn open_sites(
    config: &Config,
    settings: &TlsSettings,
    cache_entries: usize,
    acme: Option<&AcmeSites>,
    cluster: Option<&Arc<Member>>,
) -> anyhow::Result<(Vec<Arc<SiteKey>>, Vec<NamedSite>, bool)> {
    let persist = acme.is_some();
    let mut keys: Vec<Arc<SiteKey>> = Vec::new();
    let mut sites = Vec::new();
    let mut alpn01 = false;
    for site in &config.sites {
        let which = site.names.dns_names().join(", ");
        let key = match &site.cert {
            SiteCert::Files { cert, key } => {
                let id = Identity::site_files(cert, key)?;
                if let Some(warning) = id
                    .chain
                    .first()
                    .and_then(|leaf| expiry_warning(&cert.display().to_string(), leaf.as_ref(), SystemTime::now()))
                {
                    tracing::warn!("site {which}: {warning}");
                }
                Arc::new(SiteKey::new(site.names.clone(), id.certified_key(&which)?))
            }
            SiteCert::SelfSigned => {
                let id = Identity::site_self_signed(site.names.dns_names(), settings, persist)?;
                tracing::warn!(
                    "site {which}: no cert and key; serving a self-signed certificate for its names ({})",
                    id.origin
                );
                Arc::new(SiteKey::new(site.names.clone(), id.certified_key(&which)?))
            }
            SiteCert::Acme(a) => {
                alpn01 |= a.challenge == Challenge::TlsAlpn01;
                match (acme, &config.state_dir) {
                    (Some(acme), Some(dir)) => {
                        acme.slot(&site.names, a, dir, cluster.cloned()).with_context(|| format!("site {which}"))?
                    }
                    _ => Arc::new(SiteKey::new(site.names.clone(), acme::placeholder(&site.names)?)),
                }
            }
        };
        keys.push(key);
        let root =
            Root::new(&site.root).with_context(|| format!("site {which}: cannot open root {}", site.root.display()))?;
        let files = files::Options { dotfiles: site.dotfiles, autoindex: site.autoindex, cache_entries };
        sites.push(NamedSite {
            names: site.names.clone(),
            root,
            files,
            hsts: site.hsts.clone(),
            content: site.content.clone(),
            client_auth: site.client_auth.is_some(),
        });
    }
    Ok((keys, sites, alpn01))
}

/// How HTTP/1.1 connections are served.
fn h1_settings(config: &Config) -> h1::Settings {
    h1::Settings {
        max_head_bytes: config.limits.max_header_bytes,
        max_body_bytes: config.limits.max_body_bytes,
        header_timeout: config.timeouts.header,
        idle_timeout: config.timeouts.idle,
    }
}

/// How HTTP/2 connections are served.
fn h2_settings(config: &Config) -> h2::Settings {
    h2::Settings {
        limits: config.h2_limits.clone(),
        idle_timeout: config.timeouts.idle,
        stall_timeout: config.timeouts.send,
        max_body_bytes: config.limits.max_body_bytes,
    }
}

/// What HTTP/3 connections are served with, when `http3` is on: the QUIC side of
/// `tls`, the endpoint keys and the limits.
fn http3(config: &Config, tls: &rustls::ServerConfig, cluster: Option<&Member>) -> anyhow::Result<Option<Http3>> {
    let Some(h3) = &config.http3 else { return Ok(None) };
    if !config.tls_versions.contains(&crate::vocab::TlsVersion::Tls13) {
        return Err(anyhow!("http3: QUIC needs TLS 1.3: add 1.3 to tls_versions, or leave http3 off"));
    }
    let settings = crate::quic::Settings {
        max_streams: h3.max_streams,
        idle_timeout: config.timeouts.idle,
        handshake_timeout: config.timeouts.handshake,
        retry: h3.retry,
    };
    let keys = match cluster {
        Some(member) => crate::quic::Keys::from_secret(member.secret.quic()),
        None => crate::quic::Keys::new(&config.ticket_keys).map_err(|e| anyhow!(e))?,
    };
    let quic = crate::quic::server_config(tls, &settings, &keys).map_err(|e| anyhow!(e))?;
    let h3 = crate::http::h3::Settings {
        max_field_section: config.limits.max_header_bytes as u64,
        max_resets: config.h2_limits.max_resets,
        header_timeout: config.timeouts.header,
        send_timeout: config.timeouts.send,
        max_body_bytes: config.limits.max_body_bytes,
    };
    Ok(Some(Http3 { quic: Arc::new(quic), keys, settings, h3 }))
}

/// The TLS layer's share of the configuration.
fn tls_settings(config: &Config, cluster: Option<&Member>) -> TlsSettings {
    TlsSettings {
        cert: config.cert.clone(),
        key: config.key.clone(),
        versions: config.tls_versions.clone(),
        cipher_suites: config.cipher_suites.clone(),
        state_dir: config.state_dir.clone(),
        ephemeral_cert: config.ephemeral_cert,
        ticket_keys: config.ticket_keys.clone(),
        shared_tickets: cluster.map(|m| m.tickets.clone()),
        http2: config.http2,
    }
}

fn choose_ktls(config: &Config) -> anyhow::Result<Option<crate::tls::kernel::Support>> {
    if config.ktls == KtlsMode::Off {
        tracing::info!("kernel TLS: off (--ktls off); records are protected in user space");
        return Ok(None);
    }
    let caps = crate::tls::kernel::Support::probe();
    if !caps.usable() {
        let why = caps.unavailable_reason().unwrap_or_else(|| "the kernel refused the tls ULP".into());
        if config.ktls == KtlsMode::On {
            return Err(anyhow!("kernel TLS unavailable: {why} (see `ktlsd doctor`; or start with --ktls auto)"));
        }
        tracing::info!("kernel TLS: unavailable ({why}); records are protected in user space");
        return Ok(None);
    }
    tracing::info!("kernel TLS: {}", caps.summary());
    Ok(Some(caps))
}

fn check_tcp_options(config: &Config) -> anyhow::Result<()> {
    if let Some(cc) = &config.tcp.congestion {
        let available = congestion::available().unwrap_or_default();
        if !available.iter().any(|a| a == cc) {
            return Err(anyhow!(
                "tcp_congestion {cc:?} is not offered by this kernel (available: {}); try `modprobe tcp_{cc}`",
                available.join(" ")
            ));
        }
    }
    Ok(())
}

/// The certificates the server presents, for `ktlsd_certificate_expiry_timestamp_seconds`:
/// the default one's end, fixed until a reload, and each site's slot, read when
/// scraped (ACME swaps certificates in without a reload).
pub struct Certificates {
    pub default: Option<i64>,
    pub sites: Vec<(String, Arc<SiteKey>)>,
}

impl Certificates {
    /// Each site's label and the notAfter (Unix seconds) of the certificate it serves now.
    pub fn expiry(&self) -> Vec<(String, i64)> {
        let default = self.default.map(|t| ("default".to_string(), t));
        let sites = self.sites.iter().filter_map(|(label, key)| {
            let current = key.current();
            Some((label.clone(), not_after(current.cert.first()?.as_ref())?))
        });
        default.into_iter().chain(sites).collect()
    }
}

/// A certificate's notAfter (Unix seconds), when it parses.
fn not_after(leaf: &[u8]) -> Option<i64> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// Days before a certificate's end from which start-up, reload and `check` warn.
const EXPIRY_WARNING_DAYS: i64 = 14;

/// A warning when the leaf certificate (DER) has expired or expires within
/// [`EXPIRY_WARNING_DAYS`] of `now`; `None` when it is good for longer (or
/// cannot be parsed here: rustls has accepted it, and the server goes on).
fn expiry_warning(name: &str, leaf: &[u8], now: SystemTime) -> Option<String> {
    let not_after = not_after(leaf)?;
    let now = now.duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let name = if name.is_empty() { "the certificate".to_string() } else { format!("certificate {name}") };
    let when = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(not_after.max(0) as u64));
    let left = not_after - now;
    if left <= 0 {
        Some(format!("{name} has expired (not valid after {when}); clients will refuse it: renew it and send SIGHUP"))
    } else if left < EXPIRY_WARNING_DAYS * 86_400 {
        Some(format!("{name} expires in {} day(s) ({when}); renew it and send SIGHUP", left / 86_400))
    } else {
        None
    }
}

/// Opens the store of bodies compressed on the fly, as the serving user, when a
/// site compresses; without one every answer goes out as it is (logged).
pub fn open_compressed_store(config: &Config) {
    let compresses =
        config.content.locations.compresses() || config.sites.iter().any(|s| s.content.locations.compresses());
    if !compresses {
        return;
    }
    let Some(state_dir) = &config.state_dir else {
        tracing::warn!(
            "compress: no state directory to keep compressed bodies in (give --state-dir); files go out uncompressed"
        );
        return;
    };
    let dir = state_dir.join("compressed");
    if let Err(e) = crate::files::compress::install(&dir, config.compress_cache_size) {
        tracing::warn!(
            "compress: cannot use {} ({e}); files go out uncompressed (make it writable by the serving user, or give another --state-dir)",
            dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_ending(not_after: SystemTime) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = not_after.into();
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn expiry_warning_table() {
        let now = UNIX_EPOCH + Duration::from_secs(1_900_000_000);
        let day = Duration::from_secs(86_400);
        // (certificate ends at, warning expected containing)
        let table: [(SystemTime, Option<&str>); 5] = [
            (now + day * 90, None),
            (now + day * 15, None),
            (now + day * 13 + Duration::from_secs(60), Some("expires in 13 day(s)")),
            (now + Duration::from_secs(3600), Some("expires in 0 day(s)")),
            (now - day, Some("has expired")),
        ];
        for (end, want) in table {
            let got = expiry_warning("c.pem", &cert_ending(end), now);
            match want {
                None => assert_eq!(got, None, "ends {end:?}"),
                Some(w) => assert!(
                    got.as_deref().is_some_and(|g| g.contains(w) && g.contains("c.pem")),
                    "ends {end:?}: {got:?}"
                ),
            }
        }
    }
}
