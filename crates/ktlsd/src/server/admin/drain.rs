//! Draining the member for a load balancer: `GET /healthz` answers 200, or 503
//! once `POST /drain` was sent (`ktlsd drain`), until `POST /undrain` (`ktlsd drain
//! --undo`) or a restart. A drained member keeps serving every connection and
//! request it is given: the balancer's health check is what takes it out of
//! rotation before a stop or an upgrade.
//!
//! Like `/cache/purge`, these take no credentials: the admin address (loopback or
//! a Unix socket) is the boundary. A browser's request from another origin is
//! refused, so a web page cannot drain the member. Not the balancer's side, nor
//! the upstream drain of `POST /upstreams/drain` ([`super::actions`]).

use std::sync::atomic::{AtomicBool, Ordering};

use super::{Reply, Request};

/// Whether the member is drained; the admin thread's, for the process's life.
#[derive(Debug, Default)]
pub struct Drain(AtomicBool);

impl Drain {
    pub fn drained(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The drain endpoints' paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Health,
    Drain,
    Undrain,
}

impl Endpoint {
    pub fn of(path: &str) -> Option<Endpoint> {
        match path {
            "/healthz" => Some(Endpoint::Health),
            "/drain" => Some(Endpoint::Drain),
            "/undrain" => Some(Endpoint::Undrain),
            _ => None,
        }
    }
}

/// Answers a request to `endpoint`.
pub fn answer(req: &Request<'_>, drain: &Drain, endpoint: Endpoint) -> Reply {
    let set = match endpoint {
        Endpoint::Health => {
            if req.method != "GET" && req.method != "HEAD" {
                return Reply::text("405 Method Not Allowed", "only GET and HEAD\n")
                    .header("Allow", "GET, HEAD".into());
            }
            return match drain.drained() {
                false => Reply::text("200 OK", "ok\n"),
                true => Reply::text("503 Service Unavailable", "draining\n"),
            };
        }
        Endpoint::Drain => true,
        Endpoint::Undrain => false,
    };
    if req.method != "POST" {
        return Reply::text("405 Method Not Allowed", "drain and undrain take POST\n").header("Allow", "POST".into());
    }
    if req.header("origin").is_some_and(|o| !super::actions::same_origin(o, req.header("host"))) {
        return Reply::text("403 Forbidden", "a drain from another origin is refused\n");
    }
    let was = drain.0.swap(set, Ordering::Relaxed);
    let (now, what) = match set {
        true => ("draining", "drained: /healthz answers 503; connections and requests are still served"),
        false => ("serving", "back in rotation: /healthz answers 200"),
    };
    if was != set {
        tracing::info!("admin: member {what}");
    }
    Reply::text("200 OK", format!("{now}\n"))
}
