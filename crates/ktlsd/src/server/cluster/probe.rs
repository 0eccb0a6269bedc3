//! What `ktlsd doctor --config FILE` says of a member's fleet: whether the
//! `secret_file` reads, whether the store answers within [`store::CALL_TIMEOUT`],
//! whether the fleet's session-ticket record opens with this member's secret (a
//! member with another secret cannot resume the others' tickets), and how many
//! ticket keys the state directory holds for a start without the store.
//!
//! One read of one key: it changes nothing in the store nor on disk. Not the
//! member's own follow-up of the store (`super::Member::run`).

use std::path::Path;

use serde::Serialize;

use super::store::{Etcd, Storage};
use super::tickets::{self, KeyRecord};
use super::Secret;
use crate::config::cluster::Cluster;

/// The fleet's ticket record as this member would find it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum TicketRecord {
    /// No member has written one yet.
    Absent,
    /// It opens with this member's secret.
    Opens { keys: usize },
    /// It does not open (another secret, or damage): this member would not use it.
    Unusable { error: String },
    /// Not read: the secret or the store failed.
    Unknown,
}

/// The fleet as `ktlsd doctor` reports it.
#[derive(Debug, Serialize)]
pub struct Facts {
    pub member: String,
    pub endpoints: Vec<String>,
    pub prefix: String,
    /// Why the secret file cannot be used, if it cannot.
    pub secret_error: Option<String>,
    pub store_up: bool,
    /// Why the store did not answer, if it did not.
    pub store_error: Option<String>,
    pub tickets: TicketRecord,
    /// Ticket keys saved in the state directory (`None`: no directory, or no usable copy).
    pub saved_keys: Option<usize>,
}

impl Facts {
    /// One line per problem, for the doctor's advice.
    pub fn advice(&self) -> Vec<String> {
        let mut advice = Vec::new();
        if let Some(e) = &self.secret_error {
            advice.push(format!("cluster: {e}"));
        }
        if let Some(e) = &self.store_error {
            advice.push(format!(
                "cluster: the store ({}) did not answer: {e}; members serve on with the keys they last saw, but ticket keys do not rotate and ACME waits until it answers",
                self.endpoints.join(", ")
            ));
        }
        if let TicketRecord::Unusable { error } = &self.tickets {
            advice.push(format!(
                "cluster: the fleet's ticket record under {} does not open with this secret_file ({error}): give every member the same secret_file",
                self.prefix
            ));
        }
        advice
    }
}

/// Looks at the fleet of `settings` once (at most [`store::CALL_TIMEOUT`] per call).
pub fn probe(settings: &Cluster, state_dir: Option<&Path>) -> Facts {
    let mut facts = Facts {
        member: settings.name.clone(),
        endpoints: settings.etcd.clone(),
        prefix: settings.prefix.clone(),
        secret_error: None,
        store_up: false,
        store_error: None,
        tickets: TicketRecord::Unknown,
        saved_keys: None,
    };
    let secret = match Secret::read(&settings.secret_file) {
        Ok(s) => Some(s),
        Err(e) => {
            facts.secret_error = Some(e.to_string());
            None
        }
    };
    if let (Some(secret), Some(dir)) = (&secret, state_dir) {
        facts.saved_keys = tickets::load_local(secret, dir).map(|r| r.keys.len());
    }
    let key = format!("{}/tickets", settings.prefix);
    let read = async {
        let mut etcd = Etcd::connect(&settings.etcd).await?;
        etcd.load(&key).await
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let loaded = match runtime {
        Ok(rt) => rt.block_on(read).map_err(|e| e.to_string()),
        Err(e) => Err(format!("no runtime to reach it: {e}")),
    };
    match loaded {
        Ok(sealed) => {
            facts.store_up = true;
            facts.tickets = match (sealed, &secret) {
                (None, _) => TicketRecord::Absent,
                (Some(_), None) => TicketRecord::Unknown,
                (Some(sealed), Some(secret)) => match KeyRecord::open(secret, &key, &sealed) {
                    Ok(r) => TicketRecord::Opens { keys: r.keys.len() },
                    Err(e) => TicketRecord::Unusable { error: e.to_string() },
                },
            };
        }
        Err(e) => facts.store_error = Some(e),
    }
    facts
}
