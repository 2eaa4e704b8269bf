//! The process's allocator: mimalloc, asked for a plain block whenever a word's alignment
//! is all the layout needs.
//!
//! `mimalloc::MiMalloc` asks mimalloc for every block with `mi_malloc_aligned`, even at
//! alignment 8. mimalloc v3 serves that quickly only while the free list of the size's page
//! has a block; once it is empty (as it is on a size's first allocation, and after every
//! page is used up), it falls back to over-allocating `size + align - 1` bytes from the
//! next size class, unless the size is a power of two. That fallback never refills the
//! size's own page, so a size such as 112 bytes (one of a forwarded batch's per-job
//! objects) took the slow path on every allocation: in callgrind, corral-load uniform GETs
//! -P 16 over 1M keys, `mi_malloc_aligned` went through the over-allocation 98,069 times in
//! 190,458 calls, at about 150 instructions each, and every such block took 128 bytes
//! instead of 112. mimalloc's blocks are all a multiple of a word and start word-aligned,
//! so `mi_malloc` meets any alignment up to a word; the aligned call is kept for larger
//! alignments.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;
use std::time::Duration;

use libmimalloc_sys::{mi_collect, mi_free, mi_malloc, mi_realloc, mi_zalloc};

/// How often corral calls [`give_back`] while no client sends it a request: a second,
/// mimalloc's own purge delay, the least time a freed span stays in the process before it
/// can be handed back.
pub const GIVE_BACK_EVERY: Duration = Duration::from_secs(1);

/// Has mimalloc hand back to the system what the calling thread's heap freed a purge delay
/// ago or more. mimalloc does so on its own only when the thread allocates or frees again:
/// a corral left idle after a burst kept it all (770 MB resident after a pipeline of 600
/// SETs and 600 GETs of 1 MiB, until the next request; 12 MB after it). Costs a walk of the
/// thread's heap, 3-8 µs with 140 MB of cache entries in it, and the hand-back of every span
/// freed since: 17 ms in the second after a load switched from Zipf GETs to the 90/10 mix
/// and the cache dropped most of its entries, which is why corral calls it only while idle.
#[allow(unsafe_code)]
pub fn give_back() {
    // SAFETY: `mi_collect` takes no pointer; it frees and purges only what mimalloc holds
    // as free.
    unsafe { mi_collect(false) }
}

/// The alignment every mimalloc block has: its size classes are whole words.
const WORD: usize = std::mem::size_of::<usize>();

/// mimalloc as the global allocator (see the module docs): `#[global_allocator]` in the
/// binary.
#[derive(Debug, Clone, Copy, Default)]
pub struct Heap;

// SAFETY: every block comes from mimalloc and goes back to it (`mi_free` takes blocks from
// both its plain and its aligned calls). A plain call is made only for layouts whose
// alignment is at most a word, which every mimalloc block meets (its size classes are
// whole words, `_mi_wsize_from_size`, and pages start at least 16-byte aligned); any larger
// alignment goes to `mimalloc::MiMalloc`, which asks for it explicitly. A null return
// (out of memory) is passed on as the trait requires.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Heap {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= WORD {
            // SAFETY: see the impl: a word's alignment suffices for this layout.
            unsafe { mi_malloc(layout.size()).cast() }
        } else {
            // SAFETY: the caller's contract for `layout`, passed on unchanged.
            unsafe { mimalloc::MiMalloc.alloc(layout) }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= WORD {
            // SAFETY: as in `alloc`; `mi_zalloc` zeroes the block.
            unsafe { mi_zalloc(layout.size()).cast() }
        } else {
            // SAFETY: the caller's contract for `layout`, passed on unchanged.
            unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator, so from mimalloc, plain or aligned.
        unsafe { mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= WORD {
            // SAFETY: `ptr` came from mimalloc; the new block is word-aligned, as `layout`
            // needs, and holds the old contents up to the smaller size.
            unsafe { mi_realloc(ptr.cast::<c_void>(), new_size).cast() }
        } else {
            // SAFETY: the caller's contract, passed on unchanged.
            unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size up to a few pages, at every alignment up to 4 KiB: each block is aligned
    /// as asked, holds what was written, keeps it through a realloc, and frees.
    #[test]
    #[allow(unsafe_code)]
    fn blocks_are_aligned_and_hold_their_bytes() {
        let heap = Heap;
        for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
            for size in (1..=512).chain([1000, 4095, 4096, 70_000]) {
                let Ok(layout) = Layout::from_size_align(size, align) else {
                    panic!("a valid layout: {size} {align}")
                };
                // SAFETY: a non-zero size; every block is freed with the layout it was
                // allocated (or reallocated) with, and read only within its size.
                unsafe {
                    let p = heap.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size} align {align}");
                    p.write_bytes(0xA5, size);
                    let bigger = size * 2 + 3;
                    let q = heap.realloc(p, layout, bigger);
                    assert!(!q.is_null());
                    assert_eq!(q as usize % align, 0, "realloc, size {size} align {align}");
                    assert!((0..size).all(|i| *q.add(i) == 0xA5));
                    let grown = Layout::from_size_align_unchecked(bigger, align);
                    heap.dealloc(q, grown);
                    let z = heap.alloc_zeroed(layout);
                    assert!(!z.is_null());
                    assert_eq!(z as usize % align, 0, "zeroed, size {size} align {align}");
                    assert!((0..size).all(|i| *z.add(i) == 0));
                    heap.dealloc(z, layout);
                }
            }
        }
    }
}
