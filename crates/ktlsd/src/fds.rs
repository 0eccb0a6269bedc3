//! A worker's descriptor ledger: one budget for the descriptors the worker holds,
//! counted by kind. Client connections and upstream connections in use are what
//! the worker serves with; open-file cache entries, held cache entry files and idle
//! pooled upstream connections are only held for the next request, and are given
//! back when the budget runs short, before anything is refused.
//!
//! Each worker thread has its own ledger (a thread-local of plain counters: no
//! lock, no atomics), set up by `server` at the worker's start with its share of
//! the process's `RLIMIT_NOFILE` and with the functions that give held descriptors
//! back. A thread that never sets a budget (a test, the plain-HTTP listener) has
//! none: every room check succeeds, and counting still works.
//!
//! It opens and closes nothing itself: what is counted is a [`Counted`] token kept
//! beside the descriptor and dropped with it. Not here: how the budget is computed
//! (`server::fd_budget`), which connection is refused (`server::worker`).

use std::cell::Cell;
use std::io;
use std::marker::PhantomData;

/// What a counted descriptor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A client's TCP connection.
    Client,
    /// An upstream connection in use by a request.
    Upstream,
    /// An idle upstream connection kept for reuse (held).
    IdleUpstream,
    /// A response-cache entry file kept open for the next hits (held).
    EntryFile,
    /// An open-file cache entry (held).
    OpenFile,
}

const KINDS: usize = 5;

/// The held kinds, in the order they are given back under pressure: an open file
/// costs an `openat` to get again, an entry file the same, an idle upstream
/// connection a TCP (and maybe TLS) handshake.
const RELEASE_ORDER: [Kind; 3] = [Kind::OpenFile, Kind::EntryFile, Kind::IdleUpstream];

impl Kind {
    fn index(self) -> usize {
        self as usize
    }
}

/// Gives back up to `n` held descriptors of one kind (`usize::MAX`: all) and says
/// how many it gave back. It must not panic when its owner is busy (borrowed): it
/// gives back none then.
pub type Release = fn(usize) -> usize;

struct Ledger {
    /// Descriptors the worker may hold; 0: no budget.
    budget: Cell<usize>,
    counts: [Cell<usize>; KINDS],
    release: [Cell<Option<Release>>; KINDS],
}

thread_local! {
    static LEDGER: Ledger = const {
        Ledger {
            budget: Cell::new(0),
            counts: [const { Cell::new(0) }; KINDS],
            release: [const { Cell::new(None) }; KINDS],
        }
    };
}

/// Sets this thread's budget (0: none).
pub fn set_budget(n: usize) {
    LEDGER.with(|l| l.budget.set(n));
}

/// This thread's budget (0: none).
pub fn budget() -> usize {
    LEDGER.with(|l| l.budget.get())
}

/// Sets the function that gives back held descriptors of `kind`.
pub fn set_release(kind: Kind, f: Release) {
    LEDGER.with(|l| l.release[kind.index()].set(Some(f)));
}

/// One counted descriptor of a kind; dropping it uncounts it. Not `Send`: it
/// belongs to the thread whose ledger counts it.
#[derive(Debug)]
pub struct Counted {
    kind: Kind,
    _thread: PhantomData<*const ()>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        // At thread exit the ledger may be gone already; nothing is left to count then.
        let _ = LEDGER.try_with(|l| {
            let c = &l.counts[self.kind.index()];
            c.set(c.get().saturating_sub(1));
        });
    }
}

/// Counts one descriptor of `kind`, budget or not (it is open already).
pub fn count(kind: Kind) -> Counted {
    LEDGER.with(|l| {
        let c = &l.counts[kind.index()];
        c.set(c.get() + 1);
    });
    Counted { kind, _thread: PhantomData }
}

/// Descriptors of `kind` counted now.
#[cfg(test)]
pub fn counted(kind: Kind) -> usize {
    LEDGER.with(|l| l.counts[kind.index()].get())
}

/// Every descriptor counted now.
pub fn total() -> usize {
    LEDGER.with(|l| l.counts.iter().map(Cell::get).sum())
}

/// Whether the budget has room for `n` more descriptors; when it has not, held
/// descriptors are given back first (open files, then entry files, then idle
/// upstream connections), until there is room for `n` and a margin of a
/// thirty-second of the budget, so that a worker at its budget does not give back
/// one descriptor per request. Call it without holding any owner of held
/// descriptors borrowed (its release then gives back nothing).
pub fn make_room(n: usize) -> bool {
    let budget = budget();
    if budget == 0 {
        return true;
    }
    let room = |total: usize| budget.saturating_sub(total) >= n;
    if room(total()) {
        return true;
    }
    let want = (n + budget / 32).min(budget);
    for kind in RELEASE_ORDER {
        let free = budget.saturating_sub(total());
        if free >= want {
            break;
        }
        if let Some(f) = LEDGER.with(|l| l.release[kind.index()].get()) {
            f(want - free);
        }
    }
    room(total())
}

/// Counts one descriptor of `kind` if the budget has room for it (after giving
/// back held ones); `None`: it has not, refuse what needs it.
pub fn admit(kind: Kind) -> Option<Counted> {
    make_room(1).then(|| count(kind))
}

/// Gives back every held descriptor (when the process ran out of them); returns
/// how many were given back.
pub fn release_all() -> usize {
    RELEASE_ORDER.iter().filter_map(|k| LEDGER.with(|l| l.release[k.index()].get())).map(|f| f(usize::MAX)).sum()
}

/// Whether `e` says the process (`EMFILE`) or the system (`ENFILE`) is out of
/// descriptors: a local shortage, never the peer's fault.
pub fn is_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        /// A held kind's descriptors in a test: its tokens, oldest first.
        static HELD: RefCell<Vec<Counted>> = const { RefCell::new(Vec::new()) };
    }

    fn give_back(n: usize) -> usize {
        HELD.with(|h| match h.try_borrow_mut() {
            Ok(mut h) => {
                let n = n.min(h.len());
                h.drain(..n).count()
            }
            Err(_) => 0,
        })
    }

    fn hold(kind: Kind, n: usize) {
        for _ in 0..n {
            let c = count(kind);
            HELD.with(|h| h.borrow_mut().push(c));
        }
    }

    /// Each test runs on its own thread, so the ledger is this test's alone.
    #[test]
    fn counts_follow_the_tokens() {
        assert!(make_room(1_000_000), "no budget: always room");
        let a = count(Kind::Client);
        let b = count(Kind::Upstream);
        let c = count(Kind::Client);
        assert_eq!((counted(Kind::Client), counted(Kind::Upstream), total()), (2, 1, 3));
        drop((a, b));
        assert_eq!((counted(Kind::Client), counted(Kind::Upstream), total()), (1, 0, 1));
        drop(c);
        assert_eq!(total(), 0);
    }

    #[test]
    fn held_descriptors_are_given_back_before_anything_is_refused() {
        set_budget(64);
        set_release(Kind::OpenFile, give_back);
        hold(Kind::OpenFile, 40);
        let clients: Vec<Counted> = (0..20).map(|_| admit(Kind::Client).expect("room")).collect();
        assert_eq!(total(), 60);
        // Four free: room without giving anything back.
        let more: Vec<Counted> = (0..4).map(|_| admit(Kind::Client).expect("room")).collect();
        assert_eq!(counted(Kind::OpenFile), 40);
        // Full: held files go, a margin of budget/32 (2) more than asked.
        let one = admit(Kind::Upstream).expect("room made");
        assert_eq!((counted(Kind::OpenFile), total()), (37, 62));
        // In use descriptors are never given back: once nothing is held, refuse.
        let rest: Vec<Counted> = (0..39).filter_map(|_| admit(Kind::Client)).collect();
        assert_eq!((rest.len(), counted(Kind::OpenFile), total()), (39, 0, 64));
        assert!(admit(Kind::Client).is_none(), "over the budget");
        assert!(!make_room(1));
        drop(rest);
        assert!(admit(Kind::Client).is_some(), "room again once connections end");
        drop((clients, more, one));
        assert_eq!(total(), 0);
    }

    #[test]
    fn release_all_gives_back_every_held_kind_in_order() {
        set_budget(10);
        set_release(Kind::OpenFile, |_| 0);
        set_release(Kind::EntryFile, give_back);
        hold(Kind::EntryFile, 8);
        let client = count(Kind::Client);
        assert_eq!(total(), 9);
        // A release that gives back nothing is passed over for the next kind.
        assert!(make_room(1));
        assert_eq!(counted(Kind::EntryFile), 8, "room for one was there");
        assert!(make_room(2));
        assert_eq!(counted(Kind::EntryFile), 7, "one given back: room for two, the margin rounds to none");
        assert_eq!(release_all(), 7);
        assert_eq!(total(), 1);
        drop(client);
        // A release called while its owner is borrowed gives back nothing, and does not panic.
        hold(Kind::EntryFile, 10);
        HELD.with(|h| {
            let _busy = h.borrow();
            assert!(!make_room(1));
        });
        assert!(make_room(1));
    }

    #[test]
    fn exhaustion_is_emfile_or_enfile() {
        for (errno, want) in [(libc::EMFILE, true), (libc::ENFILE, true), (libc::ECONNREFUSED, false)] {
            assert_eq!(is_exhaustion(&io::Error::from_raw_os_error(errno)), want, "{errno}");
        }
        assert!(!is_exhaustion(&io::Error::other("no errno")));
    }
}
