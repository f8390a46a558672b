//! The global allocator: mimalloc, asked for a plain block whenever one is aligned enough.
//!
//! The `mimalloc` crate's allocator passes every allocation to `mi_malloc_aligned`. In
//! mimalloc 3 that call is fast only while its size class has a free block at hand; when the
//! class's page is empty it does not refill the page but over-allocates by the alignment from
//! a larger class, and the next allocation of that size finds the page empty again
//! (microsoft/mimalloc#889). Callgrind counted a quarter of a durable append's allocations on
//! that path. mimalloc's plain blocks of 16 bytes or more are 16-aligned, and a smaller one is
//! aligned at least to the largest power of two not above the size asked (small size classes
//! are whole double words on 64-bit targets), so, as `std` does for `malloc`, a request whose
//! alignment is at most 16 and at most its size goes to `mi_malloc`, whose slow path refills
//! the right page. Others (tokio's cache-padded task cells) take the aligned calls.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment of every plain mimalloc block of at least this size (`MI_MAX_ALIGN_SIZE`).
const MAX_PLAIN_ALIGN: usize = 16;

/// Whether a plain block of `layout.size()` bytes is aligned enough for `layout`.
#[inline]
fn plain(layout: &Layout) -> bool {
    layout.align() <= MAX_PLAIN_ALIGN && layout.align() <= layout.size()
}

pub struct Mimalloc;

/// A new block for `layout`, zeroed when `zero` is set.
///
/// # Safety
/// As for [`GlobalAlloc::alloc`]: `layout` has a non-zero size.
#[inline]
#[allow(unsafe_code, reason = "C allocation calls")]
unsafe fn allocate(layout: Layout, zero: bool) -> *mut u8 {
    let (size, align) = (layout.size(), layout.align());
    // SAFETY: mimalloc's allocation calls take any size and power-of-two alignment.
    let p = unsafe {
        match (plain(&layout), zero) {
            (true, false) => mi::mi_malloc(size),
            (true, true) => mi::mi_zalloc(size),
            (false, false) => mi::mi_malloc_aligned(size, align),
            (false, true) => mi::mi_zalloc_aligned(size, align),
        }
    };
    p.cast()
}

// SAFETY: every method forwards to mimalloc, which returns blocks of at least the size asked
// for, aligned as `plain` relies on (or to the alignment passed to its aligned calls), or
// null on failure; `mi_free` and `mi_realloc*` accept any block mimalloc returned.
#[allow(
    unsafe_code,
    reason = "a global allocator is an unsafe trait over C calls"
)]
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain C allocation calls; see the impl's comment.
        unsafe { allocate(layout, false) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe { allocate(layout, true) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (GlobalAlloc's contract).
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout` (GlobalAlloc's contract), and
        // any mimalloc block may be passed to either realloc. The new block is a plain one
        // only when a plain block of the new size is aligned enough as well.
        unsafe {
            if plain(&layout) && layout.align() <= new_size {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of every small size and alignment, taken by the plain and the aligned calls,
    /// come back aligned and writable, and keep their bytes through a growing realloc.
    #[test]
    #[allow(
        unsafe_code,
        reason = "calls the allocator directly, as the global one is called"
    )]
    fn blocks_are_aligned_and_keep_their_bytes() {
        let a = Mimalloc;
        for align in [1usize, 2, 4, 8, 16, 64, 128, 4096] {
            for size in [1usize, 7, 8, 9, 24, 40, 100, 160, 1000, 5000, 70_000] {
                let Ok(layout) = Layout::from_size_align(size, align) else {
                    continue;
                };
                // Several hundred blocks per class, so that for the larger classes a page runs
                // empty and is refilled on the way.
                let mut blocks = Vec::new();
                for i in 0..300usize {
                    // SAFETY: a non-zero size; freed below with the same layout.
                    let p = unsafe { a.alloc(layout) };
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size} align {align}");
                    // SAFETY: `p` holds `size` bytes.
                    unsafe { p.write_bytes(i as u8, size) };
                    blocks.push((p, i as u8));
                }
                for (p, byte) in blocks {
                    // SAFETY: `p` was allocated above with `layout`.
                    let q = unsafe { a.realloc(p, layout, size * 3) };
                    assert!(!q.is_null());
                    assert_eq!(q as usize % align, 0);
                    // SAFETY: the first `size` bytes were kept by realloc.
                    let kept = unsafe { std::slice::from_raw_parts(q, size) };
                    assert!(kept.iter().all(|&b| b == byte));
                    let grown = Layout::from_size_align(size * 3, align).unwrap_or(layout);
                    // SAFETY: `q` was returned by realloc for `grown`.
                    unsafe { a.dealloc(q, grown) };
                }
                // SAFETY: as above; zeroed blocks read as zeros.
                let z = unsafe { a.alloc_zeroed(layout) };
                assert!(!z.is_null());
                assert_eq!(z as usize % align, 0);
                // SAFETY: `z` holds `size` zeroed bytes.
                assert!(
                    unsafe { std::slice::from_raw_parts(z, size) }
                        .iter()
                        .all(|&b| b == 0)
                );
                // SAFETY: allocated above with `layout`.
                unsafe { a.dealloc(z, layout) };
            }
        }
    }
}
