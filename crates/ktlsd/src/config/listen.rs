//! The listen section: the HTTPS addresses (`listen`), the plain-HTTP ones (`http_listen`),
//! the load balancers whose connections begin with a PROXY protocol header
//! (`proxy_protocol_from`) and the worker threads accepting on them (`workers`).
//!
//! Only parsed and checked against each other here; binding is the server's.

use std::net::SocketAddr;

use super::options::Options;
use super::{err, ConfigError};

const DEFAULT_LISTEN: &str = "127.0.0.1:8443";

/// The HTTPS addresses: at least one, each IP:PORT.
pub fn listen(o: &Options) -> Result<Vec<SocketAddr>, ConfigError> {
    let strs = o.listen.clone().unwrap_or_else(|| vec![DEFAULT_LISTEN.to_string()]);
    if strs.is_empty() {
        return err("listen: at least one address is required");
    }
    let mut listen = Vec::new();
    for s in &strs {
        match s.parse::<SocketAddr>() {
            Ok(a) => listen.push(a),
            Err(_) => return err(format!("listen address {s:?} is not IP:PORT (e.g. 127.0.0.1:8443 or [::1]:8443)")),
        }
    }
    Ok(listen)
}

/// The plain-HTTP addresses, none of them also an HTTPS one.
pub fn http_listen(o: &Options, listen: &[SocketAddr]) -> Result<Vec<SocketAddr>, ConfigError> {
    let mut http_listen = Vec::new();
    for s in o.http_listen.iter().flatten() {
        let Ok(a) = s.parse::<SocketAddr>() else {
            return err(format!("http_listen address {s:?} is not IP:PORT (e.g. 0.0.0.0:80 or [::]:80)"));
        };
        if a.port() != 0 && listen.contains(&a) {
            return err(format!("http_listen address {a} is also a listen (HTTPS) address; give each its own port"));
        }
        http_listen.push(a);
    }
    Ok(http_listen)
}

/// `proxy_protocol_from`: addresses or CIDR ranges.
pub fn proxy_protocol_from(o: &Options) -> Result<Vec<ipnet::IpNet>, ConfigError> {
    cidrs("proxy_protocol_from", o.proxy_protocol_from.as_deref())
}

/// `trusted_proxies`: addresses or CIDR ranges.
pub fn trusted_proxies(o: &Options) -> Result<Vec<ipnet::IpNet>, ConfigError> {
    cidrs("trusted_proxies", o.trusted_proxies.as_deref())
}

/// The option `name`'s addresses or CIDR ranges.
fn cidrs(name: &str, list: Option<&[String]>) -> Result<Vec<ipnet::IpNet>, ConfigError> {
    let mut nets = Vec::new();
    for s in list.unwrap_or_default() {
        let net = match (s.parse::<ipnet::IpNet>(), s.parse::<std::net::IpAddr>()) {
            (Ok(net), _) => net.trunc(),
            (_, Ok(ip)) => ipnet::IpNet::from(ip),
            _ => return err(format!("{name} {s:?} is not an address or a CIDR range (e.g. 10.0.0.0/8)")),
        };
        nets.push(net);
    }
    Ok(nets)
}

/// Worker threads: 1 to 1024, one per CPU by default.
pub fn workers(o: &Options) -> Result<usize, ConfigError> {
    match o.workers {
        Some(0) => err("workers must be at least 1"),
        Some(n) if n > 1024 => err(format!("workers {n} is more than 1024")),
        Some(n) => Ok(n),
        None => Ok(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_protocol_ranges() {
        let o = |s: &[&str]| Options {
            proxy_protocol_from: Some(s.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        };
        let nets = proxy_protocol_from(&o(&["10.0.0.0/8", "192.0.2.1", "2001:db8::/32", "10.1.2.3/8"])).unwrap();
        let want: Vec<ipnet::IpNet> =
            ["10.0.0.0/8", "192.0.2.1/32", "2001:db8::/32", "10.0.0.0/8"].iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(nets, want);
        assert!(proxy_protocol_from(&o(&["10.0.0.0/33"])).is_err());
        assert!(proxy_protocol_from(&o(&["lb.example"])).is_err());
        assert!(proxy_protocol_from(&Options::default()).unwrap().is_empty());
        let o = Options { trusted_proxies: Some(vec!["10.0.0.0/8".into(), "x".into()]), ..Default::default() };
        assert!(trusted_proxies(&o).unwrap_err().to_string().contains("trusted_proxies \"x\""));
    }

    #[test]
    fn listen_and_http_listen() {
        let v = |s: &[&str]| Some(s.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        // (listen, http_listen, Ok(number of addresses each) or Err(part of the message))
        type Addrs = Option<Vec<String>>;
        type Want = Result<(usize, usize), &'static str>;
        let table: [(Addrs, Addrs, Want); 7] = [
            (None, None, Ok((1, 0))),
            (v(&["[::1]:1", "127.0.0.1:2"]), v(&["0.0.0.0:80"]), Ok((2, 1))),
            (v(&[]), None, Err("at least one address")),
            (v(&["localhost:1"]), None, Err("listen address \"localhost:1\" is not IP:PORT")),
            (None, v(&["80"]), Err("http_listen address \"80\" is not IP:PORT")),
            (v(&["127.0.0.1:80"]), v(&["127.0.0.1:80"]), Err("also a listen (HTTPS) address")),
            (v(&["127.0.0.1:0"]), v(&["127.0.0.1:0"]), Ok((1, 1))),
        ];
        for (l, h, want) in table {
            let o = Options { listen: l.clone(), http_listen: h.clone(), ..Default::default() };
            let got = listen(&o).and_then(|a| Ok((a.len(), http_listen(&o, &a)?.len())));
            match (got, want) {
                (Ok(n), Ok(w)) => assert_eq!(n, w, "{l:?} {h:?}"),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{l:?} {h:?}: {e}"),
                (got, want) => panic!("{l:?} {h:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn workers_range() {
        for (n, ok) in [(Some(0), false), (Some(1), true), (Some(1024), true), (Some(1025), false), (None, true)] {
            let got = workers(&Options { workers: n, ..Default::default() });
            assert_eq!(got.is_ok(), ok, "{n:?}: {got:?}");
        }
    }
}
