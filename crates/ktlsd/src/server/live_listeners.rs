//! The HTTPS listeners in force, as a reload hands them to the workers: for each
//! configured address, its bound address and one socket per worker, each taken
//! once by the worker it is for. A reload keeps the entries of addresses still
//! configured (same `Arc`, sockets already taken), binds new ones, and leaves out
//! removed ones, whose sockets the workers then close. Not the binding itself
//! (see `listener`) or the accepting (see `worker`).

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex, PoisonError};

/// One configured address.
pub struct Entry {
    /// As configured (port 0 stays 0, so a reload does not rebind it).
    pub configured: SocketAddr,
    /// As bound.
    pub bound: SocketAddr,
    /// By worker index: taken once by that worker.
    sockets: Vec<Mutex<Option<TcpListener>>>,
}

impl Entry {
    /// The socket of worker `id`, once.
    pub fn take(&self, id: usize) -> Option<TcpListener> {
        self.sockets.get(id)?.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// Every HTTPS listener in force; empty when the service manager passed them
/// (those are fixed for the process's life).
#[derive(Default, Clone)]
pub struct ListenerSet {
    pub entries: Vec<Arc<Entry>>,
}

impl ListenerSet {
    /// The set start-up bound: the workers already hold their sockets.
    pub fn started(configured: &[SocketAddr], bound: &[SocketAddr]) -> ListenerSet {
        let entries = configured
            .iter()
            .zip(bound)
            .map(|(&configured, &bound)| Arc::new(Entry { configured, bound, sockets: Vec::new() }))
            .collect();
        ListenerSet { entries }
    }

    /// The set for `wanted` addresses: running entries kept, new ones bound
    /// (`workers` sockets each), removed ones left out. Errors name the address.
    pub fn reopen(&self, wanted: &[SocketAddr], workers: usize) -> Result<ListenerSet, String> {
        let mut entries = Vec::new();
        for &addr in wanted {
            match self.entries.iter().find(|e| e.configured == addr) {
                Some(e) => entries.push(e.clone()),
                None => {
                    let (per_worker, bound) = super::listener::bind_all(&[addr], workers)?;
                    let sockets = per_worker.into_iter().map(|mut w| Mutex::new(w.pop())).collect();
                    entries.push(Arc::new(Entry { configured: addr, bound: bound[0], sockets }));
                }
            }
        }
        Ok(ListenerSet { entries })
    }

    /// The addresses as bound.
    pub fn bound(&self) -> Vec<SocketAddr> {
        self.entries.iter().map(|e| e.bound).collect()
    }
}
