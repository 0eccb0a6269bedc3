//! The one check of a request's host, used by every codec: HTTP/1.1's `Host` and the
//! authority of an absolute-form target, HTTP/2's `:authority` and `host`
//! (RFC 9110 sections 4.2.2 and 7.2, RFC 9113 section 8.3.1). The site is chosen
//! from the value this accepts, so both protocols choose from the same checked text.
//!
//! Not here: which site a host names (the handler's site table).

/// `uri-host [ ":" port ]` (RFC 9110 section 7.2): a bracketed IP literal or a
/// reg-name/IPv4 address of unreserved, sub-delims and percent-escapes, and digits after
/// the colon. Empty values, spaces, slashes, `@` and controls are refused.
pub fn valid(host: &[u8]) -> bool {
    if host.is_empty() {
        return false;
    }
    let (name, port) = if host.first() == Some(&b'[') {
        let Some(close) = host.iter().position(|&b| b == b']') else { return false };
        let literal = &host[1..close];
        if literal.is_empty() || !literal.iter().all(|&b| b.is_ascii_alphanumeric() || b == b':' || b == b'.') {
            return false;
        }
        match &host[close + 1..] {
            [] => (&host[..0], None),
            [b':', port @ ..] => (&host[..0], Some(port)),
            _ => return false,
        }
    } else {
        match host.iter().position(|&b| b == b':') {
            Some(colon) => (&host[..colon], Some(&host[colon + 1..])),
            None => (host, None),
        }
    };
    let name_ok = name.iter().all(|&b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=%".contains(&b));
    let port_ok = port.is_none_or(|p| p.iter().all(u8::is_ascii_digit));
    name_ok && port_ok
}

/// Whether two host values name the same host and port (hosts are case-insensitive,
/// RFC 3986 section 3.2.2), as a second `Host`/`host` or `:authority` must.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.eq_ignore_ascii_case(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        for (host, ok) in [
            ("localhost", true),
            ("localhost:8443", true),
            ("[::1]:8443", true),
            ("[::1]", true),
            ("127.0.0.1", true),
            ("xn--bcher-kva.example.", true),
            ("", false),
            ("a b", false),
            ("a/b", false),
            ("../..", false),
            ("a\\b", false),
            ("u@h", false),
            ("h:8x", false),
            ("[::1", false),
            ("[::1]x", false),
            ("[]", false),
        ] {
            assert_eq!(valid(host.as_bytes()), ok, "{host:?}");
        }
        assert!(same(b"A.example:443", b"a.EXAMPLE:443"));
        assert!(!same(b"a.example", b"a.example:443"));
    }
}
