//! Per-worker pools of record-layer buffers: a connection borrows a buffer while
//! it reads, encrypts or sends, and gives it back when that is done, so an idle
//! keep-alive connection holds none (as nginx frees its buffers on keep-alive).
//!
//! Each worker is one thread with a single-threaded event loop, so a pool is a
//! thread-local free list with no locking. A pool keeps at most a few buffers:
//! after a burst the rest go back to the allocator. Not a general allocator.

use std::cell::RefCell;
use std::thread::LocalKey;

/// A free list of at most `keep` values of one kind.
pub struct Pool<T> {
    free: RefCell<Vec<T>>,
    keep: usize,
}

impl<T> Pool<T> {
    pub const fn new(keep: usize) -> Pool<T> {
        Pool { free: RefCell::new(Vec::new()), keep }
    }

    /// A value from the free list, or a new one from `make`.
    pub fn take(&self, make: impl FnOnce() -> T) -> T {
        let pooled = self.free.borrow_mut().pop();
        pooled.unwrap_or_else(make)
    }

    /// Returns `value` to the free list, or drops it when the list is full.
    pub fn give(&self, value: T) {
        let mut free = self.free.borrow_mut();
        if free.len() < self.keep {
            free.push(value);
        }
    }

    /// How many values wait in the free list.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.free.borrow().len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Buffers kept per pool: enough for the connections of one worker that are
/// in the middle of a read or a send at the same time on a busy server; more
/// are allocated when needed and freed when given back.
pub const KEEP: usize = 32;

/// Borrows a value from this thread's `pool`, or a new one from `make`.
pub fn borrow<T: 'static>(pool: &'static LocalKey<Pool<T>>, make: fn() -> T) -> T {
    // The pool is gone only while the thread exits.
    pool.try_with(|p| p.take(make)).unwrap_or_else(|_| make())
}

/// Gives `value` back to this thread's `pool` (dropped if the pool is full or gone).
pub fn give_back<T: 'static>(pool: &'static LocalKey<Pool<T>>, value: T) {
    let _ = pool.try_with(move |p| p.give(value));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_at_most_keep_and_reuses() {
        let pool: Pool<Vec<u8>> = Pool::new(2);
        let made = std::cell::Cell::new(0);
        let make = || {
            made.set(made.get() + 1);
            vec![0u8; 16]
        };
        let (a, b, c) = (pool.take(make), pool.take(make), pool.take(make));
        assert_eq!(made.get(), 3);
        pool.give(a);
        pool.give(b);
        pool.give(c);
        assert_eq!(pool.len(), 2, "the third is dropped");
        let _ = (pool.take(make), pool.take(make));
        assert_eq!(made.get(), 3, "both came from the free list");
        assert!(pool.is_empty());
    }
}
