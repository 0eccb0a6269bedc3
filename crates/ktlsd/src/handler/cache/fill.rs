//! Storing an upstream response: the [`FillGuard`] a miss hands out (it holds the
//! key's place so that concurrent lookups wait for it), and the [`EntryWriter`]
//! it becomes once the response's head is found storable.
//!
//! Not the reading of the upstream: the proxy streams the body in and hands each
//! chunk to [`EntryWriter::write`].

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::SystemTime;

use http::HeaderMap;
use tokio::sync::watch;

use super::entry::{self, Draft, Head};
use super::policy::{self, Meta, NotStored};
use super::{Cache, CacheStatus, Fwd, Key};

/// The right to store a response for one key. While a guard that leads the fill
/// lives, other lookups of its key wait for it; dropping it (or the writer it
/// became) wakes them. Dropping abandons the fill.
pub struct FillGuard {
    cache: Arc<Cache>,
    key: Key,
    /// The request's fields, less Host.
    req: HeaderMap,
    /// Set when this guard leads the fill of its key.
    leader: Option<watch::Sender<bool>>,
    /// The purge generation when the fill began.
    generation: u64,
    upstream: Upstream,
}

/// Why a request goes upstream, for its Cache-Status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Upstream {
    pub fwd: Fwd,
    /// The lookup waited for another request's fill first.
    pub collapsed: bool,
}

impl FillGuard {
    pub(super) fn new(
        cache: Arc<Cache>,
        key: Key,
        req: HeaderMap,
        leader: Option<watch::Sender<bool>>,
        upstream: Upstream,
    ) -> FillGuard {
        let generation = cache.purge_generation();
        FillGuard { cache, key, req, leader, generation, upstream }
    }

    /// The Cache-Status of the answer that goes upstream: `fwd=miss`, `vary-miss`,
    /// `stale` or `request`, `collapsed` after a wait, and `stored` when `stored`.
    /// Only what was stored may say so: pass `true` only when
    /// [`EntryWriter::commit`] returned `Ok` before this status is sent. A head
    /// that goes out while the body is still being stored must pass `false` (the
    /// fill may yet be abandoned: disk full, a short body, a purge).
    pub fn cache_status(&self, stored: bool) -> CacheStatus {
        let u = self.upstream;
        CacheStatus { fwd: Some(u.fwd), stored, collapsed: u.collapsed, ..CacheStatus::default() }
    }

    /// Whether other lookups of this key wait for this fill.
    #[cfg(test)]
    pub fn leads(&self) -> bool {
        self.leader.is_some()
    }

    /// Starts storing `response` (the upstream's status and fields, received at
    /// `received`), or says why it is not stored: not storable under RFC 9111 for
    /// this request, a cookie, `Vary: *`, or a Content-Length above
    /// `max_object_size`. The body then goes to [`EntryWriter::write`].
    pub fn admit(self, response: &http::response::Parts, received: SystemTime) -> Result<EntryWriter, NotStored> {
        let length = response
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if length.is_some_and(|n| n > self.cache.config.max_object_size) {
            return Err(NotStored::TooLarge);
        }
        let head = policy::admit(&self.key.text, &self.req, response.status, &response.headers, received)?;
        if let Err(e) = self.cache.layout.create(None) {
            self.cache.disk_error("cannot create the directory of new entries", &e, 0);
            return Err(NotStored::Disk);
        }
        let path = self.cache.layout.entry(&self.key.primary, &policy::secondary(&head));
        Ok(EntryWriter {
            guard: self,
            state: State::Head(Box::new(head)),
            path,
            length,
            vary: policy::vary_names(&response.headers),
        })
    }
}

impl Drop for FillGuard {
    fn drop(&mut self) {
        if let Some(tx) = &self.leader {
            self.cache.fill_done(&self.key, tx);
        }
    }
}

/// An entry being written. [`EntryWriter::commit`] publishes it once the body is
/// complete; dropping it first removes the temporary file. The temporary file is
/// created by the first write (or by the commit of an empty body), so a response
/// admitted but never written touches no disk.
pub struct EntryWriter {
    guard: FillGuard,
    state: State,
    path: PathBuf,
    /// The response's Content-Length, which the body must match.
    length: Option<u64>,
    /// The Vary names of this response: other variants with other Vary names are dropped on commit.
    vary: Vec<String>,
}

enum State {
    /// Admitted; no file yet.
    Head(Box<Head>),
    /// Boxed: the hasher's state is most of a kilobyte.
    Writing(Box<Draft>),
    /// Given up after an error (the temporary file removed).
    Abandoned,
}

/// Why an entry was not stored after all.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("the body is larger than max_object_size")]
    TooLarge,
    #[error("the body has {got} bytes, its Content-Length says {want}")]
    Length { got: u64, want: u64 },
    #[error("the entry was abandoned after an earlier error")]
    Abandoned,
    #[error("the key was purged while the response was being stored")]
    Purged,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl EntryWriter {
    /// Appends a chunk of the body. After an error the entry is abandoned (the
    /// proxy goes on sending the response to its client): later calls fail too,
    /// and the temporary file is gone. A disk error is logged here (rate-limited;
    /// a full disk also wakes the eviction), so the caller need not log it again.
    /// Blocks on the disk (a write into the page cache).
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), WriteError> {
        let (cache, length) = (&self.guard.cache, self.length.unwrap_or(0));
        let result = draft(&mut self.state, cache, length).and_then(|draft| {
            let size = draft.written() + bytes.len() as u64;
            if size > cache.config.max_object_size {
                return Err(WriteError::TooLarge);
            }
            draft.write(bytes).map_err(|e| cache.write_failed(e, size.max(length)))
        });
        if result.is_err() {
            self.state = State::Abandoned;
        }
        result
    }

    /// Publishes the entry: checks the body against the Content-Length, flushes the
    /// file's data, renames it into place and adds it to the index (dropping other
    /// variants of the key stored under another Vary). Waiting lookups then find it.
    /// `Ok` means stored, and only then may the response's `Cache-Status` say
    /// `stored`; on `Err` nothing was stored and no temporary file is left.
    /// Blocks on the disk (`fdatasync`).
    pub fn commit(mut self) -> Result<(), WriteError> {
        draft(&mut self.state, &self.guard.cache, 0)?;
        let State::Writing(mut draft) = std::mem::replace(&mut self.state, State::Abandoned) else {
            return Err(WriteError::Abandoned);
        };
        let got = draft.written();
        if let Some(want) = self.length.filter(|&want| want != got) {
            return Err(WriteError::Length { got, want });
        }
        let cache = &self.guard.cache;
        let p = self.guard.key.primary;
        if cache.purged_since(&self.guard.key, self.guard.generation) {
            return Err(WriteError::Purged);
        }
        let published = draft
            .seal()
            .and_then(|len| cache.layout.create(Some(&p)).map(|()| len))
            .and_then(|len| draft.publish(&self.path).map(|()| len));
        let len = published.map_err(|e| cache.write_failed(e, got))?;
        let meta = match entry::open(&self.path) {
            Ok((_, file_len, parsed)) if file_len == len => Meta::new(parsed, file_len, self.path.clone()),
            _ => None,
        };
        let Some(meta) = meta else {
            let _ = std::fs::remove_file(&self.path);
            return Err(std::io::Error::other("the entry just written does not read back").into());
        };
        // Hashed as it was written: the first hit need not read it again.
        meta.verified.store(true, Relaxed);
        let stale: Vec<PathBuf> = {
            let mut index = cache.lock_index();
            let others = index.variants(&p).unwrap_or_default();
            let mut gone = Vec::new();
            for other in others.iter().filter(|o| o.path != self.path) {
                let names = policy::stored_vary(&other.head.fields);
                if names != self.vary && index.remove_path(&p, &other.path) {
                    gone.push(other.path.clone());
                }
            }
            index.insert(p, Arc::new(meta));
            gone
        };
        for path in stale {
            let _ = std::fs::remove_file(path);
        }
        cache.wake_evictor();
        Ok(())
    }
}

/// The draft of `state`, created now when nothing was written yet; an error
/// abandons the entry. `length`: the body's expected size, for the eviction to
/// make room for when the disk is full.
fn draft<'a>(state: &'a mut State, cache: &Cache, length: u64) -> Result<&'a mut Draft, WriteError> {
    if let State::Head(head) = state {
        *state = match Draft::create(cache.layout.tmp(), head) {
            Ok(d) => State::Writing(Box::new(d)),
            Err(e) => {
                *state = State::Abandoned;
                return Err(cache.write_failed(e, length));
            }
        };
    }
    match state {
        State::Writing(d) => Ok(d),
        _ => Err(WriteError::Abandoned),
    }
}
