//! Fixed-size tables on transparent huge pages.
//!
//! The cache's large tables that a round's GETs read at random places (the front's slots,
//! the read sketch) are prefetched a few requests ahead of their reads. On
//! 4 KiB pages, beside a large store whose entries take the TLB's room, nearly every such
//! prefetch also missed the TLB, and its page walk (two-dimensional under a hypervisor)
//! held up the prefetch itself: perf put 12% of corral's time on Zipf GETs -P 16 in the
//! round's prefetches (docs/BENCHMARKS.md, "The cache's tables on huge pages").
//!
//! A [`HugeSlice`] of at least [`MAPPED_FROM`] bytes is mapped on its own, rounded up to
//! 2 MiB, and the kernel is asked for transparent huge pages there (`MADV_HUGEPAGE`), so one
//! TLB entry covers 2 MiB of the table. The heap itself stays off huge pages (`heap.rs`, and
//! on a host that gives them to every mapping, [`keep_heap_off_huge_pages`]):
//! its growth under load is what faulting 2 MiB at a time stalled, where these tables are
//! made once (the front, each time it is resized), and faulting one of them in on huge
//! pages took less time than on small ones (8 MiB of memory the VM's host had backed:
//! 0.4-1.2 ms, against 2.7-3.6).
//!
//! Not the presence counts (256 KiB): on a huge page, a SET's read of its slot, a cache hit
//! on small pages, waited about 20 ns more (perf), and SETs cost corral 1.08x the CPU.
//!
//! This module is one of the crate's three homes of `unsafe` code (see `lib.rs`).

use std::ops::{Deref, DerefMut};

/// A huge page on x86_64 and aarch64 with 4 KiB base pages.
const HUGE: usize = 2 << 20;
/// Smallest table mapped on its own: an eighth of a huge page. A smaller one stays on the
/// heap, where its few pages keep their TLB entries, and a mapping of its own would take
/// 2 MiB for it.
pub(crate) const MAPPED_FROM: usize = HUGE / 8;

/// A boxed slice of `T`, on transparent huge pages of its own where it is large enough and
/// the kernel gives them.
pub(crate) struct HugeSlice<T>(Place<T>);

enum Place<T> {
    Heap(Box<[T]>),
    #[cfg(target_os = "linux")]
    Mapped(mapped::Mapped<T>),
}

impl<T> HugeSlice<T> {
    /// `len` elements, each made by `make`.
    pub(crate) fn new(len: usize, mut make: impl FnMut() -> T) -> Self {
        #[cfg(target_os = "linux")]
        if len.saturating_mul(size_of::<T>()) >= MAPPED_FROM
            && let Some(m) = mapped::Mapped::new(len, &mut make)
        {
            return HugeSlice(Place::Mapped(m));
        }
        HugeSlice(Place::Heap((0..len).map(|_| make()).collect()))
    }

    /// Whether it is in a mapping of its own (else on the heap).
    fn is_mapped(&self) -> bool {
        !matches!(self.0, Place::Heap(_))
    }
}

impl<T> Deref for HugeSlice<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        match &self.0 {
            Place::Heap(b) => b,
            #[cfg(target_os = "linux")]
            Place::Mapped(m) => m.slice(),
        }
    }
}

impl<T> DerefMut for HugeSlice<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.0 {
            Place::Heap(b) => b,
            #[cfg(target_os = "linux")]
            Place::Mapped(m) => m.slice_mut(),
        }
    }
}

impl<T> std::fmt::Debug for HugeSlice<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HugeSlice")
            .field("len", &self.len())
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

#[cfg(target_os = "linux")]
mod mapped {
    use std::ptr::NonNull;

    use super::HUGE;

    /// `PR_SET_THP_DISABLE`'s mode that leaves huge pages to mappings advised
    /// `MADV_HUGEPAGE` (Linux 6.18 on; older kernels refuse any argument but 0).
    const PR_THP_DISABLE_EXCEPT_ADVISED: libc::c_ulong = 1 << 1;

    /// Whether transparent huge pages are already off for the process, in any mode.
    #[allow(unsafe_code)]
    pub(super) fn thp_disabled() -> bool {
        // SAFETY: PR_GET_THP_DISABLE takes no pointer and changes nothing; it returns the
        // process's setting (0 when not set) or -1.
        unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) > 0 }
    }

    /// Turns transparent huge pages off for the process: but for mappings advised
    /// `MADV_HUGEPAGE` if `except_advised`. Whether the kernel took it.
    #[allow(unsafe_code)]
    pub(super) fn disable_thp(except_advised: bool) -> bool {
        let mode = if except_advised {
            PR_THP_DISABLE_EXCEPT_ADVISED
        } else {
            0
        };
        // SAFETY: PR_SET_THP_DISABLE takes integers only and changes nothing but which
        // mappings the kernel backs with huge pages from now on, a matter of speed alone.
        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1 as libc::c_ulong, mode, 0, 0) == 0 }
    }

    /// `len` initialised elements at the start of an anonymous mapping of `bytes` bytes
    /// that nothing else refers to.
    pub(super) struct Mapped<T> {
        ptr: NonNull<T>,
        len: usize,
        bytes: usize,
    }

    // SAFETY: a `Mapped` owns its elements, as a `Box<[T]>` does, and hands them out only
    // through `&self` (as `&T`) and `&mut self` (as `&mut T`).
    #[allow(unsafe_code)]
    unsafe impl<T: Send> Send for Mapped<T> {}
    // SAFETY: as above.
    #[allow(unsafe_code)]
    unsafe impl<T: Sync> Sync for Mapped<T> {}

    impl<T> Mapped<T> {
        /// `len` elements made by `make` in a mapping of their own; `None` if it cannot be
        /// made (then nothing was made).
        #[allow(unsafe_code)]
        pub(super) fn new(len: usize, make: &mut impl FnMut() -> T) -> Option<Self> {
            // A page-aligned mapping is aligned for any T of no greater alignment.
            if align_of::<T>() > 4096 {
                return None;
            }
            let bytes = len
                .checked_mul(size_of::<T>())?
                .checked_next_multiple_of(HUGE)?;
            // SAFETY: a new anonymous private mapping at an address the kernel picks; it
            // overlaps nothing the program holds.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return None;
            }
            let Some(ptr) = NonNull::new(p.cast::<T>()) else {
                // SAFETY: the mapping just made, of `bytes` bytes, unused.
                unsafe { libc::munmap(p, bytes) };
                return None;
            };
            // SAFETY: advice on the mapping just made, which only says how to back it: a
            // kernel without transparent huge pages, or with them off, backs it with small
            // ones (the call then fails, which changes nothing).
            unsafe { libc::madvise(p, bytes, libc::MADV_HUGEPAGE) };
            let mut made = Mapped { ptr, len: 0, bytes };
            for i in 0..len {
                // SAFETY: element `i` lies within the mapping (`len * size_of::<T>()` bytes
                // fit in it) at an aligned address, and is written once, before `made.len`
                // counts it; if `make` panics, drop sees only those written.
                unsafe { made.ptr.add(i).write(make()) };
                made.len = i + 1;
            }
            Some(made)
        }

        #[allow(unsafe_code)]
        pub(super) fn slice(&self) -> &[T] {
            // SAFETY: `len` initialised elements at `ptr`, owned by self.
            unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
        }

        #[allow(unsafe_code)]
        pub(super) fn slice_mut(&mut self) -> &mut [T] {
            // SAFETY: as in `slice`, borrowed uniquely through `&mut self`.
            unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
        }
    }

    impl<T> Drop for Mapped<T> {
        #[allow(unsafe_code)]
        fn drop(&mut self) {
            let elements = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
            // SAFETY: the `len` elements are initialised and owned here, and dropped once;
            // the mapping is then ours alone, and nothing refers to it after this.
            unsafe {
                std::ptr::drop_in_place(elements);
                libc::munmap(self.ptr.as_ptr().cast(), self.bytes);
            }
        }
    }
}

/// What corral asked of the kernel so that its heap stays off transparent huge pages: see
/// [`keep_heap_off_huge_pages`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeapPages {
    /// Nothing asked: the host gives huge pages only to mappings that ask for them
    /// (`madvise`) or to none (`never`), or its mode could not be read, or they were already
    /// off for the process (`MIMALLOC_ALLOW_THP=0` in the environment, say).
    AsIs,
    /// The host gives them to every mapping (`always`): off for the process but where a
    /// mapping asks for them (Linux 6.18 on), so the heap is off them and the cache's
    /// tables on them.
    OffButAdvised,
    /// `always`, on a kernel without that mode: off for the whole process, the cache's
    /// tables too.
    Off,
}

/// The host's mode, the bracketed word of `/sys/kernel/mm/transparent_hugepage/enabled`
/// (`always [madvise] never`).
fn thp_mode(text: &str) -> Option<&str> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
}

/// Keeps the heap off transparent huge pages where the host gives them to every mapping
/// (`always`), as corral's allocator does not ask for them itself (`heap.rs`): faulting the
/// heap in 2 MiB at a time stalled requests while the cache grew (README, "No transparent
/// huge pages for the heap"). The process is told to take huge pages only where a mapping
/// asks for them (`PR_SET_THP_DISABLE` with `PR_THP_DISABLE_EXCEPT_ADVISED`), which keeps
/// them for the tables of this module; a kernel before 6.18 refuses that mode, and there
/// they are turned off for the whole process, as `MIMALLOC_ALLOW_THP=0` does. Called once,
/// at start.
pub fn keep_heap_off_huge_pages() -> HeapPages {
    #[cfg(target_os = "linux")]
    {
        let Ok(text) = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        else {
            return HeapPages::AsIs;
        };
        if thp_mode(&text) != Some("always") || mapped::thp_disabled() {
            return HeapPages::AsIs;
        }
        if mapped::disable_thp(true) {
            HeapPages::OffButAdvised
        } else if mapped::disable_thp(false) {
            HeapPages::Off
        } else {
            HeapPages::AsIs
        }
    }
    #[cfg(not(target_os = "linux"))]
    HeapPages::AsIs
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[test]
    fn the_hosts_mode_is_the_bracketed_word() {
        assert_eq!(thp_mode("always [madvise] never\n"), Some("madvise"));
        assert_eq!(thp_mode("[always] madvise never"), Some("always"));
        assert_eq!(thp_mode("always madvise [never]"), Some("never"));
        assert_eq!(thp_mode(""), None);
    }

    #[test]
    fn elements_are_made_in_order_read_written_and_dropped_once() {
        let dropped = Arc::new(AtomicU64::new(0));
        struct Counted(u64, Arc<AtomicU64>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.1.fetch_add(1, Ordering::Relaxed);
            }
        }
        for len in [0, 3, MAPPED_FROM / size_of::<Counted>() + 5] {
            let mut n = 0;
            let mut s = HugeSlice::new(len, || {
                n += 1;
                Counted(n, dropped.clone())
            });
            assert_eq!(s.len(), len);
            assert!(s.iter().map(|c| c.0).eq(1..=len as u64));
            if let Some(last) = s.last_mut() {
                last.0 = 0;
            }
            assert!(s.last().is_none_or(|c| c.0 == 0));
            assert_eq!(s.is_mapped(), cfg!(target_os = "linux") && len > 3);
            drop(s);
            assert_eq!(dropped.swap(0, Ordering::Relaxed), len as u64);
        }
    }

    #[test]
    fn a_small_table_stays_on_the_heap() {
        let s = HugeSlice::new(MAPPED_FROM / 8 - 1, || 0u64);
        assert!(!s.is_mapped());
        assert!(s.iter().all(|&x| x == 0));
    }
}
