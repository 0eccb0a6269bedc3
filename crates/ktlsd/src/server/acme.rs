//! The ACME sites of a running server: for each, a certificate slot in the TLS
//! resolver (the stored certificate, else a self-signed placeholder) and a task
//! that obtains the first certificate, renews it, and swaps each new one into the
//! slot. The tasks run on one thread of their own, outside the workers.
//!
//! A reload hands the same settings back and gets the same slot and task: an
//! ACME site that did not change keeps its certificate and its schedule; a site
//! removed or changed has its task stopped. It does not speak ACME itself
//! (`crate::acme` does) and does not answer challenges (the resolver and the
//! port-80 listener do, from [`Challenges`]). In a fleet (`[cluster]`) each task
//! follows the fleet's certificate instead (`cluster::acme`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context;

use super::cluster::acme::Site;
use super::cluster::Member;
use crate::acme::{Acme, AcmeSettings, Backoff, Challenges, Issued};
use crate::config::SiteAcme;
use crate::names::Names;
use crate::stats::sites;
use crate::tls::config::Identity;
use crate::tls::sni::SiteKey;

/// What identifies one site's ACME work: equal settings keep the running task.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    names: Vec<String>,
    directory: String,
    email: Option<String>,
    challenge: String,
    directory_ca: Option<PathBuf>,
    dns_hook: Option<crate::acme::DnsHook>,
    eab: Option<crate::acme::Eab>,
}

struct Running {
    slot: Arc<SiteKey>,
    task: tokio::task::JoinHandle<()>,
}

/// The ACME tasks of the server, kept across reloads.
pub struct AcmeSites {
    pub challenges: Arc<Challenges>,
    /// The ACME thread's event loop, which runs until `stop` is dropped.
    rt: tokio::runtime::Handle,
    _stop: tokio::sync::watch::Sender<()>,
    /// Turns true once the listeners are up: no order is placed before a
    /// validation could reach the server.
    gate: tokio::sync::watch::Sender<bool>,
    running: Mutex<HashMap<Key, Running>>,
}

impl AcmeSites {
    pub fn new() -> anyhow::Result<AcmeSites> {
        let (stop, mut stopped) = tokio::sync::watch::channel(());
        // Returns when `stop` is dropped; dropping the runtime then ends the tasks.
        let (_, handle) =
            crate::sys::event_loop_thread(
                "ktlsd-acme",
                move || async move { while stopped.changed().await.is_ok() {} },
            )
            .context("cannot start the ACME thread")?;
        let gate = tokio::sync::watch::Sender::new(false);
        Ok(AcmeSites {
            challenges: Challenges::new(),
            rt: handle,
            _stop: stop,
            gate,
            running: Mutex::new(HashMap::new()),
        })
    }

    /// Lets the tasks start ordering (the listeners are up).
    pub fn go(&self) {
        self.gate.send_replace(true);
    }

    /// The certificate slot of an ACME site: the running one for the same settings,
    /// else a new one holding the stored certificate or a placeholder, with its task
    /// started. `state_dir` is the server's (ACME keeps its files in `STATE_DIR/acme`).
    /// With `fleet` (`[cluster]`), the certificate is the fleet's ([`Site`]).
    pub fn slot(
        &self,
        names: &Names,
        acme: &SiteAcme,
        state_dir: &std::path::Path,
        fleet: Option<Arc<Member>>,
    ) -> anyhow::Result<Arc<SiteKey>> {
        let key = key(names, acme);
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(r) = running.get(&key).filter(|r| !r.task.is_finished()) {
            return Ok(r.slot.clone());
        }
        let client = Acme::new(settings(names, acme, state_dir), self.challenges.clone())?;
        let which = names.dns_names().join(", ");
        let stored = client.stored();
        let first = match &stored {
            Some(issued) => issued.certified_key().with_context(|| format!("site {which}: stored ACME certificate"))?,
            None => placeholder(names)?,
        };
        let slot = Arc::new(SiteKey::new(names.clone(), first));
        sites::acme_state(&names.label(), if stored.is_some() { "valid" } else { "ordering" });
        let mut gate = self.gate.subscribe();
        let label = names.label().into_owned();
        let task = self.rt.spawn({
            let slot = slot.clone();
            async move {
                if gate.wait_for(|open| *open).await.is_ok() {
                    match fleet {
                        Some(member) => {
                            let put = |issued: &Issued| install(&slot, &label, &which, issued);
                            let failed = |e: &crate::acme::AcmeError| sites::acme_error(&label, e.to_string());
                            let directory = client.directory().to_string();
                            let site = Site::new(&member, &client, &directory, stored, &put, &failed);
                            let _: std::convert::Infallible = site.run().await;
                        }
                        None => run(client, stored, slot, which, label).await,
                    }
                }
            }
        });
        running.insert(key, Running { slot: slot.clone(), task });
        Ok(slot)
    }

    /// Stops the tasks of sites not in `keep` (removed or changed by a reload).
    pub fn retain(&self, keep: &[(&Names, &SiteAcme)]) {
        sites::acme_retain(&keep.iter().map(|(n, _)| n.label().into_owned()).collect::<Vec<_>>());
        let keep: Vec<Key> = keep.iter().map(|(n, a)| key(n, a)).collect();
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.retain(|k, r| {
            let kept = keep.contains(k);
            if !kept {
                r.task.abort();
                tracing::info!("ACME for {} stopped: the site was removed or changed", k.names.join(", "));
            }
            kept
        });
    }
}

fn key(names: &Names, acme: &SiteAcme) -> Key {
    Key {
        names: names.dns_names(),
        directory: acme.directory.clone(),
        email: acme.email.clone(),
        challenge: acme.challenge.to_string(),
        directory_ca: acme.directory_ca.clone(),
        dns_hook: acme.dns_hook.clone(),
        eab: acme.eab.clone(),
    }
}

fn settings(names: &Names, acme: &SiteAcme, state_dir: &std::path::Path) -> AcmeSettings {
    AcmeSettings {
        directory: acme.directory.clone(),
        email: acme.email.clone(),
        challenge: acme.challenge,
        names: names.dns_names(),
        state_dir: state_dir.join("acme"),
        directory_ca: acme.directory_ca.clone(),
        dns_hook: acme.dns_hook.clone(),
        eab: acme.eab.clone(),
    }
}

/// A self-signed certificate for the site's names, served until the CA issues one.
pub fn placeholder(names: &Names) -> anyhow::Result<Arc<rustls::sign::CertifiedKey>> {
    let id = Identity::placeholder(&names.dns_names())?;
    let key = rustls::sign::CertifiedKey::from_der(id.chain, id.key, &rustls::crypto::aws_lc_rs::default_provider())?;
    Ok(Arc::new(key))
}

/// Swaps `issued` into the site's `slot`.
fn install(slot: &SiteKey, label: &str, which: &str, issued: &Issued) {
    match issued.certified_key() {
        Ok(k) => {
            slot.replace(k);
            sites::acme_state(label, "valid");
            tracing::info!(
                "ACME: site {which} now serves its new certificate (valid until {})",
                httpdate::fmt_http_date(issued.not_after)
            );
        }
        Err(e) => {
            tracing::error!("ACME: site {which}: the issued certificate is unusable: {e}; keeping the current one")
        }
    }
}

/// Obtains the first certificate unless one is stored (retrying with [`Backoff`],
/// one log line per failure, the placeholder served meanwhile), then renews forever.
async fn run(client: Acme, stored: Option<Issued>, slot: Arc<SiteKey>, which: String, label: String) {
    let swap = |issued: &Issued| install(&slot, &label, &which, issued);
    let current = match stored {
        Some(issued) => issued,
        None => {
            let mut backoff = Backoff::new();
            loop {
                match client.obtain().await {
                    Ok(issued) => {
                        swap(&issued);
                        break issued;
                    }
                    Err(e) => {
                        sites::acme_error(&label, e.to_string());
                        let delay = backoff.next_delay();
                        tracing::warn!(
                            "ACME certificate for {which} not obtained: {e}; serving the self-signed placeholder; retrying in {} s",
                            delay.as_secs()
                        );
                        tokio::time::sleep(delay).await;
                    }
                }
            }
        }
    };
    let _: std::convert::Infallible = client.renew_forever(current, swap).await;
}
