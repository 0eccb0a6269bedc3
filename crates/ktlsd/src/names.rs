//! The names a `[[site]]` answers to (exact names and `*.example.com`
//! wildcards), and the matching of a TLS server name or an HTTP Host/:authority
//! against them: exact first, then wildcard, one label only, as certificates do.
//!
//! A leaf shared by config (which parses them), tls (which picks a certificate
//! by SNI) and handler (which picks a site by Host). It does no I/O and knows
//! nothing of certificates or sites: callers match over their own lists with [`find`].

/// The names one site answers to, lower-case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    exact: Vec<String>,
    /// `*.example.com` kept as `.example.com`: it matches one more label in front.
    wildcard: Vec<String>,
}

impl Names {
    /// Parses `example.com` and `*.example.com` forms; an error names the bad one.
    pub fn parse(names: &[String]) -> Result<Names, String> {
        let (mut exact, mut wildcard) = (Vec::new(), Vec::new());
        for name in names {
            let lower = name.trim_end_matches('.').to_ascii_lowercase();
            let (rest, is_wildcard) = match lower.strip_prefix("*.") {
                Some(rest) => (rest, true),
                None => (lower.as_str(), false),
            };
            if !is_dns_name(rest) {
                return Err(format!(
                    "{name:?} is not a DNS name or a *.DNS-name wildcard (letters, digits, '-' and '.')"
                ));
            }
            match is_wildcard {
                true => wildcard.push(format!(".{rest}")),
                false => exact.push(rest.to_string()),
            }
        }
        if exact.is_empty() && wildcard.is_empty() {
            return Err("names is empty: give at least one name".into());
        }
        Ok(Names { exact, wildcard })
    }

    /// The names as written in a certificate (`*.example.com` for wildcards).
    pub fn dns_names(&self) -> Vec<String> {
        self.exact.iter().cloned().chain(self.wildcard.iter().map(|w| format!("*{w}"))).collect()
    }

    /// The site's first exact name, else its first wildcard (`*.example.com`),
    /// which names the site in logs and metrics.
    pub fn label(&self) -> std::borrow::Cow<'_, str> {
        match (self.exact.first(), self.wildcard.first()) {
            (Some(e), _) => e.as_str().into(),
            (None, Some(w)) => format!("*{w}").into(),
            (None, None) => "default".into(),
        }
    }

    /// The exact names only (those an ACME order can validate).
    pub fn exact(&self) -> &[String] {
        &self.exact
    }

    fn matches_exact(&self, host: &str) -> bool {
        self.exact.iter().any(|n| n == host)
    }

    /// A wildcard covers exactly one label, as in certificates (RFC 6125 section 6.4.3).
    fn matches_wildcard(&self, host: &str) -> bool {
        self.wildcard
            .iter()
            .any(|w| host.strip_suffix(w.as_str()).is_some_and(|label| !label.is_empty() && !label.contains('.')))
    }
}

/// A DNS name: letters, digits and hyphens in non-empty labels of at most 63
/// bytes, none starting with a hyphen, 253 bytes in all; no wildcard.
pub fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// The host of a Host header or :authority, or a TLS server name: port and a
/// final dot stripped, lower-case. IPv6 literals keep their brackets.
pub fn host_of(authority: &str) -> String {
    // One allocation: this runs for every request of a server with named sites.
    let mut host = match authority.strip_prefix('[') {
        // Ends with `]`: no trailing dot to trim.
        Some(v6) => ["[", v6.split(']').next().unwrap_or(v6), "]"].concat(),
        None => authority.split(':').next().unwrap_or(authority).trim_end_matches('.').to_string(),
    };
    host.make_ascii_lowercase();
    host
}

/// The item whose names match `host` (already [`host_of`]-normalised): an exact
/// name in any item first, then a wildcard.
pub fn find<'s, T>(items: &'s [T], names: impl Fn(&T) -> &Names, host: &str) -> Option<&'s T> {
    items
        .iter()
        .find(|i| names(i).matches_exact(host))
        .or_else(|| items.iter().find(|i| names(i).matches_wildcard(host)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Names {
        Names::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("names")
    }

    #[test]
    fn host_normalisation() {
        for (input, want) in [
            ("Example.COM", "example.com"),
            ("example.com:8443", "example.com"),
            ("example.com.", "example.com"),
            ("example.com.:443", "example.com"),
            ("[::1]:8443", "[::1]"),
            ("[::1]", "[::1]"),
            ("127.0.0.1:80", "127.0.0.1"),
            ("[ABCD::1]:443", "[abcd::1]"),
            ("[::1", "[::1]"),
        ] {
            assert_eq!(host_of(input), want, "{input:?}");
        }
    }

    #[test]
    fn exact_before_wildcard_and_one_label_only() {
        let items =
            [(1, names(&["*.example.com"])), (2, names(&["www.example.com", "example.com"])), (3, names(&["b.org"]))];
        let got = |h: &str| find(&items, |i| &i.1, &host_of(h)).map(|i| i.0);
        for (host, want) in [
            ("www.example.com", Some(2)),
            ("WWW.Example.com:443", Some(2)),
            ("example.com", Some(2)),
            ("a.example.com", Some(1)),
            ("a.b.example.com", None),
            ("xexample.com", None),
            ("b.org", Some(3)),
            ("c.org", None),
        ] {
            assert_eq!(got(host), want, "{host}");
        }
    }

    #[test]
    fn bad_names_are_refused() {
        for bad in ["", "*", "*.", "a..b", "a b", "-a.com", "a.*.com", "**.a.com", "a_b.com"] {
            assert!(Names::parse(&[bad.to_string()]).is_err(), "{bad:?}");
        }
        assert!(Names::parse(&[]).is_err());
        assert_eq!(names(&["A.com", "*.B.com"]).dns_names(), ["a.com", "*.b.com"]);
    }
}
