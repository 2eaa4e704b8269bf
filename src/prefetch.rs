//! A hint to the CPU to start loading memory that will be read soon.

/// Starts loading the cache line holding `*p` into the CPU's caches, without waiting for it.
/// Several in a row overlap their cache misses, where plain loads used one after another
/// would each wait in turn. Only a hint: where the CPU lacks the instruction, nothing.
///
/// The crate's one `unsafe` block. Measured reason: prefetching the sketch blocks of a
/// round's GETs took the time a cold GET spends counting itself in the sketch, at pipeline
/// depth 16, from 47-75 ns to 10-13 ns (perf profiles of corral-load, uniform GETs over a
/// million keys).
#[inline]
#[allow(unsafe_code)]
pub(crate) fn read<T>(p: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 only hints the cache hierarchy: it loads nothing into a register,
    // cannot fault, and has no effect the program can observe but timing. `p` is a valid
    // reference besides. SSE, which provides it, is part of the x86_64 baseline.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>((p as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
