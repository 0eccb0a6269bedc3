//! The access phase: `[[access]]` blocks of allow and deny rules by client address.
//! The first block whose path matches the normalised request path decides; in it
//! the first rule (in the order written) that covers the client's address wins, as
//! in nginx's `allow`/`deny`. A deny answers 403; no matching rule lets the
//! request through.
//!
//! The address is the TCP peer's, never a header such as `X-Forwarded-For`.
//! Parsing and checking the rules is `config::routing`'s; this module only matches.

use std::net::IpAddr;

use ipnet::IpNet;

use super::pattern::PathPattern;
use super::{Request, Response, Status};

/// Addresses a rule covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addresses {
    /// `all`.
    All,
    /// An address or a CIDR range (`10.0.0.0/8`, `::1`).
    Net(IpNet),
}

impl Addresses {
    /// `all`, an address or a CIDR range.
    pub fn parse(s: &str) -> Result<Addresses, String> {
        let s = s.trim();
        if s == "all" {
            return Ok(Addresses::All);
        }
        if let Ok(net) = s.parse::<IpNet>() {
            return Ok(Addresses::Net(net.trunc()));
        }
        match s.parse::<IpAddr>() {
            Ok(ip) => Ok(Addresses::Net(IpNet::from(ip))),
            Err(_) => Err(format!("{s:?} is not an address, a CIDR range (10.0.0.0/8, 2001:db8::/32) or all")),
        }
    }

    fn covers(&self, client: Option<IpAddr>) -> bool {
        match (self, client) {
            (Addresses::All, _) => true,
            (Addresses::Net(net), Some(ip)) => net.contains(&ip.to_canonical()),
            (Addresses::Net(_), None) => false,
        }
    }
}

/// One `[[access]]` block, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessRule {
    /// The paths it guards; `None`: every path.
    pub path: Option<PathPattern>,
    /// `(allow, addresses)` in the order written.
    pub rules: Vec<(bool, Addresses)>,
}

/// 403 when `block`, the first matching the request's path (the location tree's
/// choice), denies the client; `None` to go on. A path that cannot be normalised
/// matches no block: the static answer refuses it.
pub fn phase(req: &Request, block: Option<&AccessRule>) -> Option<Response> {
    match block?.rules.iter().find(|(_, a)| a.covers(req.client)) {
        Some((false, _)) => Some(Response::refusal(Status::FORBIDDEN, "denied by an [[access]] rule")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::location::{Locations, Rules, SiteWide};
    use crate::handler::pattern::route_path;

    fn block(path: Option<&str>, rules: &[(bool, &str)]) -> AccessRule {
        AccessRule {
            path: path.map(|p| PathPattern::new(p).unwrap()),
            rules: rules.iter().map(|(a, s)| (*a, Addresses::parse(s).unwrap())).collect(),
        }
    }

    #[test]
    fn first_matching_block_then_first_matching_rule() {
        let blocks = [
            block(Some("/admin/*"), &[(true, "10.0.0.0/8"), (true, "::1"), (false, "all")]),
            block(Some("/private/*"), &[(false, "192.0.2.7"), (true, "192.0.2.0/24"), (false, "all")]),
            block(None, &[(false, "203.0.113.0/24")]),
        ];
        let tree = Locations::new(Rules { access: blocks.to_vec(), ..Rules::default() }, SiteWide::default());
        for (client, path, denied) in [
            ("10.1.2.3", "/admin/x", false),
            ("::1", "/admin/x", false),
            ("::ffff:10.0.0.1", "/admin/x", false),
            ("127.0.0.1", "/admin/x", true),
            ("127.0.0.1", "/%61dmin/x", true),
            ("127.0.0.1", "/public/../admin/x", true),
            ("127.0.0.1", "//admin//x", true),
            ("127.0.0.1", "/admin", true),
            ("127.0.0.1", "/administrator", false),
            ("192.0.2.7", "/private/a", true),
            ("192.0.2.8", "/private/a", false),
            ("198.51.100.1", "/private/a", true),
            ("203.0.113.9", "/anything", true),
            ("203.0.113.9", "/admin/x", true),
            ("198.51.100.1", "/anything", false),
        ] {
            let req =
                Request { client: Some(client.parse().unwrap()), ..Request::new(crate::vocab::Method::Get, path) };
            let got = phase(&req, tree.find(route_path(path).as_deref()).access).map(|r| r.status.0);
            assert_eq!(got, denied.then_some(403), "{client} {path}");
        }
        // No address known (no peer): only `all` covers it.
        let req = Request::new(crate::vocab::Method::Get, "/admin/x");
        assert_eq!(phase(&req, tree.find(Some("/admin/x")).access).map(|r| r.status.0), Some(403));
    }

    #[test]
    fn addresses() {
        for (s, ok) in [
            ("all", true),
            ("10.0.0.0/8", true),
            ("10.1.2.3/8", true),
            ("::1", true),
            ("2001:db8::/32", true),
            ("10.0.0.0/33", false),
            ("10.0.0", false),
            ("localhost", false),
            ("", false),
        ] {
            assert_eq!(Addresses::parse(s).is_ok(), ok, "{s}");
        }
    }
}
