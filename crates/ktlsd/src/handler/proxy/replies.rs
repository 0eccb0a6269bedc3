//! What a forward answers besides a streamed body, the same for the HTTP/1.1
//! exchange (`super::forward`) and the HTTP/2 one (`super::multiplex`): the site's
//! fields on every forwarded answer ([`Added`]), a whole answer, a failure's
//! answer (logged), a response cut after its head, and the cache commits around
//! a head.
//!
//! Not here: the exchanges themselves.

use super::{cached, Failure};
use crate::handler::downstream::{Answer, Downstream, Outcome, StreamEnd};
use crate::handler::rules::Fields;
use crate::handler::{Header, Request, Response};

/// What the site puts on every answer it forwards from the upstream or the cache
/// (not on the proxy's own 502 or 504, which are the site's error pages): the
/// `[[headers]]` fields for the request's path, then Strict-Transport-Security.
#[derive(Debug, Default)]
pub struct Added {
    pub rules: Fields,
    pub hsts: Option<String>,
    /// The rule's `response_headers`, when it has some.
    pub reply: Option<super::control::Reply>,
}

impl Added {
    pub(crate) fn apply(&self, headers: &mut Vec<Header>) {
        self.rules.apply(headers);
        if let Some(r) = &self.reply {
            r.apply(headers);
        }
        if let Some(v) = &self.hsts {
            headers.push(Header::StrictTransportSecurity(v.clone()));
        }
    }
}

/// Commits the entry being stored, once its body is whole and before its head
/// leaves: `cache_status` becomes the store's own (`stored`) when the commit took.
pub async fn commit_before_head(store: &mut Option<cached::Store>, cache_status: &mut String) {
    if let Some(s) = store.take() {
        let stored = s.stored_status().to_string();
        if s.commit().await {
            *cache_status = stored;
        }
    }
}

/// Commits the entry being stored, once its body is whole (its head is out: the
/// answer could not say `stored`).
pub async fn commit(store: &mut Option<cached::Store>) {
    if let Some(s) = store.take() {
        s.commit().await;
    }
}

/// A whole answer for the codec to send.
pub fn answer<E>(response: Response, from_cache: bool) -> Outcome<E> {
    Outcome::Answer { answer: Answer::Response(response), from_cache }
}

/// The failure's answer (502, 504, or what a request body's failure calls for), logged.
pub fn refused<E>(f: Failure, req: &Request, cache_status: String) -> Outcome<E> {
    let peer = req.client.map_or_else(String::new, |c| c.to_string());
    tracing::warn!("proxy {peer} \"{} {}\": {} {f}", req.method, req.path, f.status.0);
    Outcome::Answer { answer: Answer::Failed(f, cache_status), from_cache: false }
}

/// Cuts a response whose upstream failed after the head and `sent` body bytes:
/// logged, the codec told.
pub fn cut<D: Downstream>(d: &mut D, req: &Request, f: Failure, sent: u64) -> StreamEnd<D::Error> {
    let peer = req.client.map_or_else(String::new, |c| c.to_string());
    tracing::warn!("proxy {peer} \"{} {}\": {f}; response cut after {sent} body bytes", req.method, req.path);
    d.abort(&f);
    StreamEnd::Cut(f)
}
