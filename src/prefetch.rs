//! A hint to the CPU to start loading memory that will be read soon.
//!
//! One of the crate's three homes of `unsafe` code ([`line()`]; the others are the
//! allocator, `heap.rs`, and the tables on huge pages, `huge.rs`). Measured reason, at
//! pipeline depth 16 (perf profiles of corral-load over a million keys): prefetching the
//! sketch blocks of a round's GETs took the time a cold GET spends counting itself in the
//! sketch from 47-75 ns to 10-13 ns; with the store's front (`cache/front.rs`), whose slots
//! and then entries are prefetched, a Zipfian GET's time in the store fell from 81-123 ns to
//! 27-45.

/// Starts loading the cache line holding `*p` into the CPU's caches, without waiting for it.
/// Several in a row overlap their cache misses, where plain loads used one after another
/// would each wait in turn. Only a hint: where the CPU lacks the instruction, nothing.
#[inline]
pub(crate) fn read<T>(p: &T) {
    line((p as *const T).cast::<u8>());
}

/// [`read`] for every cache line the first `len` bytes of `*p` span (all of it when `len` is
/// its size: a value larger than a line, or one that straddles two), without reading any
/// of it: a prefetch that waited for a load of the value would wait for the very miss it
/// is meant to hide.
#[inline]
pub(crate) fn read_prefix<T>(p: &T, len: usize) {
    let start = (p as *const T).cast::<u8>();
    let len = len.clamp(1, std::mem::size_of::<T>().max(1));
    let mut off = 0;
    while off < len {
        line(start.wrapping_add(off));
        off += LINE;
    }
    line(start.wrapping_add(len - 1));
}

/// [`read`] for an address that may no longer hold a `T`: one computed from a table's base
/// pointer read without its lock, which a resize may just have freed. The hint loads nothing
/// the program reads, so a stale address costs at most one useless cache fill.
#[inline]
pub(crate) fn read_addr<T>(p: *const T) {
    line(p.cast::<u8>());
}

/// Cache line size of x86_64 CPUs.
const LINE: usize = 64;

#[inline]
#[allow(unsafe_code)]
fn line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 only hints the cache hierarchy: it loads nothing into a register,
    // cannot fault (on any address, mapped or not), and has no effect the program can
    // observe but timing. SSE, which provides it, is part of the x86_64 baseline.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
