//! Which site a request is for: [`Sites`], the per-request choice the codecs
//! make by Host/:authority before calling [`super::handle`], over the
//! [`NamedSite`]s of the configuration.
//!
//! It does no I/O and knows nothing of certificates. The names themselves and
//! their matching live in [`crate::names`], which the TLS resolver uses too.

use super::Site;
use crate::files::{self, Root};
use crate::names::{find, host_of, Names};
use crate::vocab::UnknownName;

/// A `[[site]]` ready to serve: its names, its open root and its options.
pub struct NamedSite {
    pub names: Names,
    pub root: Root,
    pub files: files::Options,
    pub hsts: Option<String>,
    pub content: super::Content,
    /// Whether its handshakes ask for a client certificate (see [`Sites::pick_for`]).
    pub client_auth: bool,
}

impl NamedSite {
    pub fn site(&self) -> Site<'_> {
        Site::new(&self.root, self.files, self.hsts.as_deref(), &self.content)
    }
}

/// The sites one connection may be served from: the named ones and the default.
#[derive(Clone, Copy)]
pub struct Sites<'a> {
    pub named: &'a [NamedSite],
    pub default: Site<'a>,
    pub unknown: UnknownName,
    /// Whether the default site's handshakes ask for a client certificate.
    pub default_client_auth: bool,
    /// The response cache of `[[proxy]]` rules with `cache = true` (from `[cache]`).
    pub cache: Option<&'a std::sync::Arc<super::cache::Cache>>,
    /// The proxies whose forwarding fields name the client (`trusted_proxies`).
    pub trusted_proxies: &'a [ipnet::IpNet],
}

/// The site a request is for.
#[derive(Clone, Copy)]
pub enum Pick<'a> {
    Site(Site<'a>),
    /// No site has the name and unknown names are refused: answer 421.
    Misdirected,
}

impl<'a> Sites<'a> {
    /// One site answering every name.
    #[cfg(test)]
    pub fn single(site: Site<'a>) -> Sites<'a> {
        Sites {
            named: &[],
            default: site,
            unknown: UnknownName::Default,
            default_client_auth: false,
            cache: None,
            trusted_proxies: &[],
        }
    }

    /// The site for a request's Host/:authority. A request without one (HTTP/1.0)
    /// or naming an IP address goes to the default site: such a client sent no
    /// server name in its handshake either, so it already holds the default
    /// site's certificate, and refusing it would refuse every client that
    /// connects by address.
    pub fn pick(&self, authority: Option<&str>) -> Pick<'a> {
        let Some(authority) = authority else { return Pick::Site(self.default) };
        if self.named.is_empty() {
            // One site: nothing to look up, so the Host is not even normalised.
            return Pick::Site(self.default);
        }
        let named: &'a [NamedSite] = self.named;
        let host = host_of(authority);
        match find(named, |s| &s.names, &host) {
            Some(s) => Pick::Site(s.site()),
            None if is_ip_literal(&host) => Pick::Site(self.default),
            None => match self.unknown {
                UnknownName::Default => Pick::Site(self.default),
                UnknownName::Refuse => Pick::Misdirected,
            },
        }
    }
}

impl<'a> Sites<'a> {
    /// [`Sites::pick`] for a request on a connection whose handshake named
    /// `server_name`: a request whose Host picks a site that asks for client
    /// certificates, other than the one the handshake was made for, is
    /// misdirected (421), as nginx answers it: that handshake checked no
    /// certificate for this site.
    pub fn pick_for(&self, authority: Option<&str>, server_name: Option<&str>) -> Pick<'a> {
        if self.asks_certificate(authority) && self.index(authority) != self.index(server_name) {
            return Pick::Misdirected;
        }
        self.pick(authority)
    }

    /// Whether the site `authority` picks asks for client certificates.
    pub fn asks_certificate(&self, authority: Option<&str>) -> bool {
        self.index(authority).map_or(self.default_client_auth, |i| self.named[i].client_auth)
    }

    /// Which named site `name` (a Host or a server name) picks; `None`: the default.
    fn index(&self, name: Option<&str>) -> Option<usize> {
        let host = host_of(name?);
        let named: &[NamedSite] = self.named;
        let site = find(named, |s| &s.names, &host)?;
        named.iter().position(|s| std::ptr::eq(s, site))
    }

    /// The name the access log and the metrics know the site answering
    /// `authority` by: the site's first configured name, `default`, or `unknown`
    /// (a name no site has, refused). One of the configured names, so their
    /// number bounds the metrics' labels.
    pub fn label(&self, authority: Option<&str>) -> std::borrow::Cow<'a, str> {
        let Some(authority) = authority.filter(|_| !self.named.is_empty()) else { return "default".into() };
        let named: &'a [NamedSite] = self.named;
        match find(named, |s| &s.names, &host_of(authority)) {
            Some(s) => s.names.label(),
            None => match self.pick(Some(authority)) {
                Pick::Site(_) => "default".into(),
                Pick::Misdirected => "unknown".into(),
            },
        }
    }
}

/// `192.0.2.1` or `[2001:db8::1]`, as [`host_of`] leaves them.
fn is_ip_literal(host: &str) -> bool {
    match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => host.parse::<std::net::Ipv4Addr>().is_ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_other_sites_than_the_handshakes_are_misdirected_when_they_ask_for_certificates() {
        let root = || Root::new(&std::env::temp_dir()).expect("temp dir");
        let site = |name: &str, client_auth| NamedSite {
            names: Names::parse(&[name.to_string()]).expect("names"),
            root: root(),
            files: files::Options { dotfiles: false, autoindex: false, cache_entries: 0 },
            hsts: None,
            content: super::super::Content::default(),
            client_auth,
        };
        let named = [site("secure.test", true), site("open.test", false)];
        let default_root = root();
        let default = named[1].site();
        let default = Site { root: &default_root, ..default };
        for (default_client_auth, host, sni, misdirected) in [
            (false, Some("secure.test"), Some("secure.test"), false),
            (false, Some("SECURE.test:8443"), Some("secure.test"), false),
            (false, Some("secure.test"), Some("open.test"), true),
            (false, Some("secure.test"), None, true),
            (false, Some("secure.test"), Some("other.test"), true),
            (false, Some("open.test"), Some("secure.test"), false),
            (false, Some("other.test"), Some("secure.test"), false),
            (false, None, Some("secure.test"), false),
            (true, Some("other.test"), Some("open.test"), true),
            (true, None, None, false),
            (true, Some("other.test"), Some("another.test"), false),
        ] {
            let sites = Sites {
                named: &named,
                default,
                unknown: UnknownName::Default,
                default_client_auth,
                cache: None,
                trusted_proxies: &[],
            };
            let got = matches!(sites.pick_for(host, sni), Pick::Misdirected);
            assert_eq!(got, misdirected, "{default_client_auth} Host {host:?} SNI {sni:?}");
        }
    }
}
