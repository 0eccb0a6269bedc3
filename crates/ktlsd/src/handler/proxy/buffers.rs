//! Spare body buffers of this worker: an exchange's read buffer and the codec's
//! piece of a body are taken here and given back when the response is done, so
//! that each proxied request does not allocate (and the allocator then return to
//! the kernel, and the next request fault in again) two fresh 64 KiB buffers.
//!
//! Bounded: at most [`KEEP`] buffers per worker, none larger than [`LARGEST`].
//! Not here: what the bytes are.

use std::cell::RefCell;

use super::PIECE;

/// Spare buffers kept per worker (about 4 MiB at most).
const KEEP: usize = 32;

/// The largest capacity kept: a read buffer may grow past a piece by what was
/// left over from the read before.
const LARGEST: usize = 2 * PIECE;

thread_local! {
    static SPARE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer, with the capacity of one given back earlier if any.
pub fn take() -> Vec<u8> {
    SPARE.with(|s| s.borrow_mut().pop()).unwrap_or_default()
}

/// Gives `buf` back for a later [`take`] (dropped when too large or too many are kept).
pub fn give(mut buf: Vec<u8>) {
    if buf.capacity() == 0 || buf.capacity() > LARGEST {
        return;
    }
    buf.clear();
    SPARE.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < KEEP {
            s.push(buf);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_empty_and_bounded() {
        let mut b = take();
        b.extend_from_slice(b"abc");
        let cap = b.capacity();
        give(b);
        let b = take();
        assert!(b.is_empty());
        assert_eq!(b.capacity(), cap);
        give(Vec::with_capacity(LARGEST + 1));
        assert_eq!(take().capacity(), 0, "a buffer over the bound is not kept");
        for _ in 0..KEEP + 4 {
            give(Vec::with_capacity(16));
        }
        assert_eq!(SPARE.with(|s| s.borrow().len()), KEEP);
    }
}
