//! The client's address behind an HTTP load balancer (`trusted_proxies`): when the
//! peer the request came from (its TCP or PROXY protocol address) is a trusted proxy,
//! the client is the right-most address of `X-Forwarded-For` (or, without it, of
//! RFC 7239 `Forwarded`'s `for=`) that is not itself trusted, as nginx's
//! `set_real_ip_from` with `real_ip_recursive on` and Caddy's `trusted_proxies`. What a
//! client writes at the left of the list is never believed: the walk stops at the first
//! address no trusted proxy vouches for. An entry that is no address (`unknown`, an
//! obfuscated identifier, garbage) stops the walk where it is.
//!
//! Pure: no I/O, the lists come from [`super::Request`]'s fields.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

/// Whether `peer` is one of the `trusted` proxies (whose forwarding fields and
/// `X-Request-Id` are believed).
pub fn trusts(peer: IpAddr, trusted: &[IpNet]) -> bool {
    trusted.iter().any(|n| n.contains(&peer.to_canonical()))
}

/// The client of a request from `peer` with these `X-Forwarded-For` and `Forwarded`
/// values (each the field's lines joined), given the `trusted` proxies.
pub fn real_client(peer: IpAddr, forwarded_for: Option<&str>, forwarded: Option<&str>, trusted: &[IpNet]) -> IpAddr {
    let trusts = |ip: &IpAddr| trusts(*ip, trusted);
    if !trusts(&peer) {
        return peer;
    }
    let entries: Vec<&str> = match (forwarded_for, forwarded) {
        (Some(xff), _) => xff.split(',').collect(),
        (None, Some(fwd)) => fwd.split(',').map(for_value).collect(),
        (None, None) => return peer,
    };
    let mut client = peer;
    for entry in entries.iter().rev() {
        if !trusts(&client) {
            break;
        }
        match address(entry) {
            Some(ip) => client = ip,
            None => break,
        }
    }
    client
}

/// The `for=` value of one `Forwarded` element (`for=192.0.2.60;proto=http`), or ""
/// when it has none.
fn for_value(element: &str) -> &str {
    element
        .split(';')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("for"))
        .map_or("", |(_, v)| v.trim())
}

/// An address as a list entry writes it: `192.0.2.1`, `192.0.2.1:8080`, `2001:db8::1`,
/// `[2001:db8::1]:8080`, each perhaps quoted (`Forwarded` quotes IPv6).
fn address(entry: &str) -> Option<IpAddr> {
    let s = entry.trim().trim_matches('"');
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Some(a.ip().to_canonical());
    }
    let inner = s.strip_prefix('[')?.strip_suffix(']')?;
    inner.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_right_most_untrusted_address() {
        let trusted: Vec<IpNet> = ["10.0.0.0/8", "2001:db8:ffff::/48"].iter().map(|s| s.parse().unwrap()).collect();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for (peer, xff, fwd, want) in [
            // An untrusted peer's fields are never read.
            ("192.0.2.9", Some("203.0.113.7"), None, "192.0.2.9"),
            ("10.0.0.1", None, None, "10.0.0.1"),
            ("10.0.0.1", Some("203.0.113.7"), None, "203.0.113.7"),
            // A spoofed left-most entry: the client appended by the trusted proxy wins.
            ("10.0.0.1", Some("6.6.6.6, 203.0.113.7"), None, "203.0.113.7"),
            // Through two trusted proxies.
            ("10.0.0.1", Some("6.6.6.6, 203.0.113.7, 10.0.0.2"), None, "203.0.113.7"),
            ("10.0.0.1", Some("203.0.113.7:4711"), None, "203.0.113.7"),
            ("10.0.0.1", Some("[2001:db8::7]:4711"), None, "2001:db8::7"),
            ("10.0.0.1", Some("2001:db8::7"), None, "2001:db8::7"),
            ("10.0.0.1", Some("::ffff:203.0.113.7"), None, "203.0.113.7"),
            // Garbage stops the walk where it is.
            ("10.0.0.1", Some("203.0.113.7, garbage"), None, "10.0.0.1"),
            ("10.0.0.1", Some("203.0.113.7, unknown, 10.0.0.2"), None, "10.0.0.2"),
            ("10.0.0.1", Some(""), None, "10.0.0.1"),
            // Every entry trusted: the left-most.
            ("10.0.0.1", Some("10.0.0.3, 10.0.0.2"), None, "10.0.0.3"),
            // Forwarded, when there is no X-Forwarded-For.
            ("10.0.0.1", None, Some("for=6.6.6.6, for=203.0.113.7;proto=https"), "203.0.113.7"),
            ("10.0.0.1", None, Some(r#"for="[2001:db8::7]:4711""#), "2001:db8::7"),
            ("10.0.0.1", None, Some("For=203.0.113.7"), "203.0.113.7"),
            ("10.0.0.1", None, Some("for=_hidden"), "10.0.0.1"),
            ("10.0.0.1", None, Some("proto=https"), "10.0.0.1"),
            // X-Forwarded-For first.
            ("10.0.0.1", Some("203.0.113.7"), Some("for=198.51.100.1"), "203.0.113.7"),
            ("2001:db8:ffff::1", Some("203.0.113.7"), None, "203.0.113.7"),
            ("::ffff:10.0.0.1", Some("203.0.113.7"), None, "203.0.113.7"),
        ] {
            assert_eq!(real_client(ip(peer), xff, fwd, &trusted), ip(want), "{peer} {xff:?} {fwd:?}");
        }
        assert_eq!(real_client(ip("10.0.0.1"), Some("203.0.113.7"), None, &[]), ip("10.0.0.1"));
    }
}
