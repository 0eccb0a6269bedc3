//! The request pipeline: one order of phases for every protocol. A codec reads a
//! request into a typed [`Request`], and from there HTTP/1.1, HTTP/2 and HTTP/3 take
//! the same way:
//!
//! 1. [`Exchange::begin`]: the site, chosen once (Host or `:authority` against the
//!    handshake's server name: the only lookup), and what its location tree holds
//!    for the normalised path, matched once (`handler::location`);
//! 2. [`Exchange::decide`]: the guarding phases (canonical host, redirects, IP rules,
//!    rate limit, basic auth), then the request body's limit (413), then the route,
//!    matched on the normalised path: the static answer (a body to compress made
//!    first), or a [`Forward`] for a `[[proxy]]` rule;
//! 3. for a forward, [`Forward::run`] over the codec's [`Downstream`], the
//!    per-request handle through which the request body arrives and the response
//!    leaves (bytes, the upstream's socket by `splice`, the end, or a cut): the cache
//!    lookup, the exchange with the upstream, the body pump and the cache fill, in
//!    one place for every codec;
//! 4. the answer: a whole [`Response`] the codec sends as any other (finished with
//!    [`Exchange::finish`]: error page, HSTS), or the upstream's, streamed; then one
//!    access-log line, written by the codec with the site's host.
//!
//! Not here: framing, flow control and the sending of a [`Response`] (the codecs),
//! the phases themselves (their modules), the exchange with an upstream
//! (`handler::proxy`).

pub use super::downstream::{Answer, BodyError, Downstream, Outcome, StreamEnd};
// What a codec needs of the proxy besides a `Decision`, named here so that `http/`
// never reaches into `handler::proxy`: the forward and its failure, whether any site
// forwards (a codec sets up for it), HTTP/1.1's fields as they go upstream and its
// chunked decoder (request bodies), the pooled body pieces, and the count of cache-hit
// bytes a codec sent.
pub use super::failure::Failure;
use super::location::Route;
use super::proxy;
pub use super::proxy::buffers;
pub use super::proxy::forward::Added;
pub use super::proxy::headers::fields_of_head;
pub use super::proxy::metrics::hit_bytes;
pub use super::proxy::parse::Chunked;
pub use super::proxy::{any as forwards, Forward};
use super::{pattern, Header, Method, Pick, Request, Response, Site, Sites, Status};

/// How the connection a request came on was made, for the choice of site.
#[derive(Debug, Clone, Copy)]
pub enum Handshake<'n> {
    /// TLS over TCP, with the server name the client gave (SNI): a site that asks
    /// for client certificates answers only requests on its own handshakes.
    Tcp(Option<&'n str>),
    /// QUIC, whose handshakes ask for no certificate: a site that asks for them is
    /// never answered over it.
    Quic,
}

/// What a request announces of its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestBody {
    None,
    /// A Content-Length.
    Length(u64),
    /// A body whose end only its framing tells (chunked, or a stream's end).
    Unknown,
}

impl RequestBody {
    /// The body as the upstream request frames it (`Forwarding::body`).
    fn forwarded(self) -> Option<Option<u64>> {
        match self {
            RequestBody::None | RequestBody::Length(0) => None,
            RequestBody::Length(n) => Some(Some(n)),
            RequestBody::Unknown => Some(None),
        }
    }
}

/// What the upstream gets of a request besides its typed form: the method as sent,
/// the client's fields, the protocol `Via` names (`1.0`, `1.1`, `2`, `3`) and the body.
pub struct Upstreamed {
    pub method: String,
    pub fields: Vec<(String, String)>,
    pub version: &'static str,
    pub body: RequestBody,
}

/// One request, from its site's choice until its answer.
pub struct Exchange<'a> {
    pub req: Request,
    /// The site, with the values of the request's path.
    pub site: Site<'a>,
    /// The request path, percent-decoded and normalised: what every rule matched.
    /// `None`: it cannot be (the static answer refuses it), or the site has no rule
    /// that matches by path (none was needed).
    path: Option<String>,
    /// What the site's location tree holds for that path, matched once.
    route: Route<'a>,
}

/// The way a request goes on after the phases before the content.
#[allow(clippy::large_enum_variant)] // one per request, moved once
pub enum Decision {
    /// A phase refused the request (guards, the body's limit): this response
    /// (finished: error page, CORS, HSTS) ends it, its body unread.
    Respond(Response),
    /// The static answer (finished), once the request body is read and dropped.
    Static(Response),
    /// Forward by a `[[proxy]]` rule: run it over the codec's [`Downstream`].
    Forward(Forward),
}

impl<'a> Exchange<'a> {
    /// The site of `req`, chosen once: 421 (`Err`, with the default site's HSTS) when
    /// no site has the requested host, or when the one it names asks for client
    /// certificates on a handshake that was not its own.
    #[allow(clippy::result_large_err)] // one per request, moved once
    pub fn begin(
        mut req: Request,
        sites: &Sites<'a>,
        handshake: Handshake<'_>,
    ) -> Result<Exchange<'a>, (Request, Response)> {
        #[cfg(test)]
        count::site_lookup();
        note(&req, sites.trusted_proxies);
        if let (false, Some(peer)) = (sites.trusted_proxies.is_empty(), req.client) {
            let h = &req.headers;
            let client = super::client::real_client(
                peer,
                h.forwarded_for.as_deref(),
                h.forwarded.as_deref(),
                sites.trusted_proxies,
            );
            if client != peer {
                (req.client, req.via) = (Some(client), Some(peer));
            }
        }
        let pick = match handshake {
            Handshake::Tcp(server_name) => sites.pick_for(req.authority.as_deref(), server_name),
            Handshake::Quic if sites.asks_certificate(req.authority.as_deref()) => Pick::Misdirected,
            Handshake::Quic => sites.pick(req.authority.as_deref()),
        };
        match pick {
            Pick::Site(site) => {
                // Normalised only for a site with rules to match it against.
                let path = site.content.locations.matches_paths().then(|| pattern::route_path(&req.path)).flatten();
                let route = site.content.locations.find(path.as_deref());
                Ok(Exchange { site: site.at(&route), req, path, route })
            }
            Pick::Misdirected => {
                let mut response = super::refusal(Status::MISDIRECTED_REQUEST, &sites.default, is_head(&req));
                response.refused = Some("no site has the requested host".into());
                Err((req, response))
            }
        }
    }

    /// The phases before the content, in their order, then the route: the guards,
    /// the body's limit (the path's `max_body_bytes`, else the server's `max_body`),
    /// then a `[[proxy]]` rule (matched on the normalised path; what goes upstream is
    /// that path, never one that resolves outside the rule) or the static answer.
    /// `upstreamed` is asked only for a forward.
    ///
    /// # Cancel safety
    /// Cancel-safe: a body being compressed for the static answer is finished off
    /// the loop for the next request.
    pub async fn decide(&self, body: RequestBody, max_body: u64, upstreamed: impl FnOnce() -> Upstreamed) -> Decision {
        let (req, site) = (&self.req, &self.site);
        if let Some(response) = super::guard(req, site, &self.route, self.path.as_deref()) {
            return Decision::Respond(response);
        }
        let max_body = site.at.max_body_bytes.unwrap_or(max_body);
        if matches!(body, RequestBody::Length(n) if n > max_body) {
            let mut response = super::refusal(Status::PAYLOAD_TOO_LARGE, site, is_head(req));
            response.refused = Some("request body exceeds max_body_bytes".into());
            return Decision::Respond(response);
        }
        if let (Some(rule), Some(path)) = (self.route.proxy, self.path.as_deref()) {
            let Some(target) = upstream_target(&req.path, req.query.as_deref()) else {
                let mut response = super::refusal(Status::BAD_REQUEST, site, is_head(req));
                response.refused = Some("the path leaves the proxied location".into());
                return Decision::Respond(response);
            };
            let u = upstreamed();
            let request_id = req.notes.request_id();
            let control = &rule.control;
            let needs_scope =
                !control.request.is_empty() || !control.response.is_empty() || control.cache_key.is_some();
            let scope = needs_scope.then(|| scope(req, &u));
            // A tunnel goes upstream as an HTTP/1.1 upgrade (RFC 6455's GET): an
            // extended CONNECT is translated, with a key of this hop's (RFC 8441
            // section 5); its DATA are the tunnel's bytes, not a request body.
            let upgrade = req.upgrade.as_ref().map(|protocol| proxy::tunnel_upgrade(protocol, &req.method));
            let (method, body) = match &upgrade {
                Some(_) if req.method == Method::Connect => ("GET".to_string(), None),
                _ => (u.method, u.body.forwarded()),
            };
            let fwd = proxy::Forwarding {
                method,
                target,
                authority: req.authority.clone(),
                // The address X-Forwarded-For gets: the hop the request came from.
                peer: req.via.or(req.client).unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into()),
                version: u.version,
                body,
                upgrade,
                request_id: request_id.clone(),
                strip: control.strip_prefix.clone(),
                control: scope.as_ref().map(|s| control.request.expand(&s.entry())).unwrap_or_default(),
                notes: req.notes.clone(),
                cache_key: control.cache_key.as_ref().zip(scope.as_ref()).map(|(k, s)| k.value(&s.entry())),
            };
            let mut rules = super::rule_fields(site, path);
            rules.set.push(("X-Request-Id".into(), request_id));
            let reply = scope.filter(|_| !control.response.is_empty());
            let reply = reply.map(|scope| proxy::control::Reply { rule: rule.clone(), scope });
            let added = Added { rules, hsts: site.hsts.map(str::to_string), reply };
            return Decision::Forward(Forward::new(rule.clone(), fwd, u.fields, max_body, added));
        }
        super::prepare(req, site).await;
        Decision::Static(super::answer_unguarded(req, site))
    }

    /// [`finish`] for this request.
    pub fn finish(&self, answer: Answer) -> Response {
        finish(&self.site, is_head(&self.req), answer)
    }
}

/// The response for a forward's answer that is not streamed: an answer from the
/// cache or a bodiless upstream answer, as the forward made it (with the site's
/// fields, [`Added`]); the file of an `X-Accel-Redirect` as the static answer
/// gives it (`handler::accel`); a failure's 502 or 504 (or what a request body's failure calls
/// for) with the path's error page, HSTS and the failure in `Cache-Status`.
/// `head_request`: no body goes with it.
pub fn finish(site: &Site<'_>, head_request: bool, answer: Answer) -> Response {
    match answer {
        Answer::Response(response) => response,
        Answer::Accel(a) => super::accel::answer(*a, site),
        Answer::Failed(f, cache_status) => {
            let detail = format!("{cache_status}; detail={}", f.kind.label());
            super::error_answer(f.status, site, head_request).with(Header::Field("Cache-Status".into(), detail))
        }
    }
}

/// Notes what the log says of `req` from its fields: the request id a trusted proxy
/// sent (`trusted`: `trusted_proxies`; any other is replaced by one of this server's
/// when one is needed), the Basic user name.
fn note(req: &Request, trusted: &[ipnet::IpNet]) {
    let h = &req.headers;
    let id = h.request_id.as_deref().filter(|id| crate::log::vars::valid_request_id(id));
    let id = id.filter(|_| req.client.is_some_and(|peer| super::client::trusts(peer, trusted)));
    let user = h.authorization.as_deref().and_then(crate::log::vars::basic_user);
    if id.is_some() || user.is_some() {
        req.notes.with(|n| (n.request_id, n.remote_user) = (id.map(str::to_string), user));
    }
}

/// What the variables of a forwarded request's fields are filled in from.
fn scope(req: &Request, u: &Upstreamed) -> proxy::control::Scope {
    let field = |name: &str| u.fields.iter().rev().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone());
    let target = match &req.query {
        Some(q) => format!("{}?{q}", req.path),
        None => req.path.clone(),
    };
    proxy::control::Scope {
        peer: std::net::SocketAddr::new(req.client.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into()), 0),
        method: req.method.clone(),
        target,
        version: proxy::control::protocol_of(u.version),
        host: req.authority.clone(),
        referer: field("referer"),
        user_agent: field("user-agent"),
        notes: req.notes.clone(),
    }
}

fn is_head(req: &Request) -> bool {
    req.method == Method::Head
}

/// The target that goes upstream for `path` (as sent) and `query`: the path with
/// its dot segments (`.`, `..`, and their percent-encoded forms) resolved, each
/// other segment as sent, so that the upstream resolves it to the path the rule
/// matched; `None` when it climbs above the root.
pub fn upstream_target(path: &str, query: Option<&str>) -> Option<String> {
    // Whether `seg` is `dots` dots once decoded (`.` or `%2e` each), without decoding it.
    let is_dot = |seg: &str, dots: usize| {
        let (mut b, mut n) = (seg.as_bytes(), 0);
        while let Some((&c, rest)) = b.split_first() {
            match (c, rest) {
                (b'.', _) => b = rest,
                (b'%', [b'2', e, tail @ ..]) if e.eq_ignore_ascii_case(&b'e') => b = tail,
                _ => return false,
            }
            n += 1;
        }
        n == dots
    };
    let mut out = String::with_capacity(path.len() + query.map_or(0, |q| q.len() + 1));
    if path.split('/').any(|s| is_dot(s, 1) || is_dot(s, 2)) {
        let mut segments: Vec<&str> = Vec::new();
        let mut trailing = false;
        for seg in path.split('/').skip(1) {
            trailing = false;
            if is_dot(seg, 1) {
                trailing = true;
            } else if is_dot(seg, 2) {
                segments.pop()?;
                trailing = true;
            } else {
                segments.push(seg);
            }
        }
        for s in &segments {
            out.push('/');
            out.push_str(s);
        }
        if trailing || out.is_empty() {
            out.push('/');
        }
    } else {
        out.push_str(path);
    }
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    Some(out)
}

/// Counts of the pipeline's per-request work, for tests that hold it to one site
/// lookup per request.
#[cfg(test)]
pub mod count {
    use std::cell::Cell;

    thread_local! {
        static LOOKUPS: Cell<u64> = const { Cell::new(0) };
    }

    /// One choice of site made.
    pub fn site_lookup() {
        LOOKUPS.with(|c| c.set(c.get() + 1));
    }

    /// Site choices made on this thread so far.
    pub fn site_lookups() -> u64 {
        LOOKUPS.with(Cell::get)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_targets_resolve_dot_segments_as_the_rule_matched() {
        for (path, query, want) in [
            ("/p/x", None, Some("/p/x")),
            ("/p/x", Some("a=1"), Some("/p/x?a=1")),
            ("/p/../internal/metrics", None, Some("/internal/metrics")),
            ("/p/%2e%2e/internal", None, Some("/internal")),
            ("/p/%2E%2e/internal", None, Some("/internal")),
            ("/p/.%2e/internal", None, Some("/internal")),
            ("/p/./x", None, Some("/p/x")),
            ("/p/x/..", None, Some("/p/")),
            ("/p/%2e", None, Some("/p/")),
            ("/..", None, None),
            ("/p/../../x", None, None),
            ("/p/a%2Fb", None, Some("/p/a%2Fb")),
            ("/p/...", None, Some("/p/...")),
            ("/", None, Some("/")),
        ] {
            assert_eq!(upstream_target(path, query).as_deref(), want, "{path}");
            // Whatever goes upstream resolves to the path the rules matched.
            if let Some(t) = upstream_target(path, None) {
                let resolved = |p: &str| pattern::route_path(p).map(|r| r.trim_end_matches('/').to_string());
                assert_eq!(resolved(&t), resolved(path), "{path}");
            }
        }
    }
}
