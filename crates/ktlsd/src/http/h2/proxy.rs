//! HTTP/2 streams that a `[[proxy]]` rule takes: the exchange with the upstream
//! (`handler::proxy`) is made before the stream is answered, and its response is
//! handed to the codec whole, so an upstream that fails at any point gets a 502 or
//! 504 and never a stream that ends as if complete.
//!
//! Bounds: a response body of at most [`MAX_BUFFERED`] bytes, and no request body
//! (a stream that has one is answered 501). The connection's other streams wait
//! while an exchange is under way.

use super::RequestHead;
use crate::handler::proxy::{self, headers, metrics, parse::Framing, Failure, Forwarding, Rule};
use crate::handler::{self, Body, Header, Method, Pick, Response, Site, Status};
use crate::http::Context;

/// The largest upstream response body an HTTP/2 stream holds before it is answered.
pub const MAX_BUFFERED: usize = 8 * 1024 * 1024;

/// The site and rule that take `head`, if a `[[proxy]]` rule does.
pub(super) fn route<'a, S>(ctx: &Context<'a, S>, head: &RequestHead) -> Option<(Site<'a>, &'a Rule)> {
    let path = head.path.as_deref()?.split(['?', '#']).next()?;
    let Pick::Site(site) = ctx.sites.pick(head.authority.as_deref().filter(|a| !a.is_empty())) else { return None };
    handler::proxy::route(&site, path).map(|rule| (site, rule))
}

/// The whole answer of `rule`'s upstream to `head`.
pub(super) async fn forward<S>(
    ctx: &Context<'_, S>,
    head: &RequestHead,
    end_stream: bool,
    site: &Site<'_>,
    rule: &Rule,
) -> Response {
    let is_head = head.method == "HEAD";
    let target = head.path.as_deref().unwrap_or("/");
    if !end_stream {
        let mut r = handler::refusal(Status::NOT_IMPLEMENTED, site, is_head);
        r.refused = Some("request bodies are not forwarded over HTTP/2; use HTTP/1.1".into());
        return r;
    }
    let fields: Vec<(String, String)> =
        head.headers.iter().map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned())).collect();
    let fwd = Forwarding {
        method: &head.method,
        target,
        authority: head.authority.as_deref(),
        peer: ctx.peer.ip(),
        version: "2",
        body: None,
    };
    match exchange(rule, fwd, fields).await {
        Ok(r) => handler::with_hsts(r, site),
        Err(f) => {
            tracing::warn!("proxy {} \"{} {target} HTTP/2.0\": {} {f}", ctx.peer, head.method, f.status.0);
            let status = format!("{}; detail={}", proxy::CACHE_STATUS_MISS, f.kind);
            handler::refusal(f.status, site, is_head).with(Header::Field("Cache-Status".into(), status))
        }
    }
}

async fn exchange(rule: &Rule, fwd: Forwarding<'_>, fields: Vec<(String, String)>) -> Result<Response, Failure> {
    let method = Method::from_token(fwd.method);
    let mut up = proxy::Exchange::begin(rule, fwd, fields).await?;
    let head = up.response().await?;
    let mut body = Vec::new();
    while up.read_body(&mut body).await? {
        if body.len() > MAX_BUFFERED {
            return Err(Failure {
                status: Status::BAD_GATEWAY,
                kind: "body",
                upstream: String::new(),
                detail: format!("response body larger than {MAX_BUFFERED} bytes, the HTTP/2 bound"),
            });
        }
    }
    drop(up);
    metrics::body_bytes("copy", body.len() as u64);
    tracing::debug!("proxied \"{method} HTTP/2.0\": {} with {} body bytes by copy", head.status, body.len());
    let mut fields: Vec<Header> = headers::response_fields(&head.fields, head.version, proxy::CACHE_STATUS_MISS)
        .into_iter()
        .map(|(n, v)| Header::Field(n.into(), v))
        .collect();
    let declared = head.fields.iter().find(|(n, _)| n.eq_ignore_ascii_case("content-length"));
    match (head.framing, declared) {
        (Framing::None, Some((_, v))) if head.status >= 200 && head.status != 204 => {
            fields.push(Header::Field("Content-Length".into(), v.clone()))
        }
        (Framing::None, _) => {}
        _ => fields.push(Header::ContentLength(body.len() as u64)),
    }
    let body = if body.is_empty() { Body::Empty } else { Body::Bytes(body) };
    Ok(Response { status: Status(head.status), headers: fields, body, refused: None })
}
