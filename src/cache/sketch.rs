//! Frequency sketch for hot-key admission: a count-min sketch of 4-bit counters with periodic
//! halving (TinyLFU), so estimates follow recent traffic. Lock-free; counters are approximate
//! under concurrency, which only blurs estimates.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use crate::huge::HugeSlice;
use crate::striped::{self, Stripes};

/// 16 four-bit counters per word, 8 words per 64-byte block; a key's 4 counters (one per
/// row, each row with 2 words of its own) all lie in one block, so counting a key touches
/// one cache line, not four: over a sketch larger than the CPU cache that was most of its cost.
///
/// The sketch has two windows over one table: a short one (its first `capacity` words,
/// halved every `10 * capacity` increments) and a long one, [`LONG`] times both (see
/// [`FrequencySketch::set_long`]).
#[derive(Debug)]
pub struct FrequencySketch {
    table: HugeSlice<Block>,
    /// Blocks in use, less one: the short window's, or the long one's.
    mask: AtomicU64,
    /// Increments counted so far towards the sample, in batches of `batch` from each thread.
    additions: AtomicUsize,
    /// Each thread's increments not yet added to `additions`: a shared counter bumped by
    /// every GET on every core cost more than the counters themselves.
    pending: Stripes,
    /// How many increments a thread adds to `additions` at once: at most a thousandth of a
    /// sample, so a halving comes at most that late per thread.
    batch: usize,
    /// What the halvings left of earlier increments, in increments: with `additions`, the
    /// total the counters hold now (for [`FrequencySketch::noise_floor`]).
    carried: AtomicUsize,
    /// [`FrequencySketch::noise_floor`], worked out again whenever the total changes: every
    /// GET reads it, and a division on each cost more than the rest of its admission check.
    floor: AtomicU8,
    /// Counters per row: how thinly one row spreads the increments.
    row_counters: AtomicUsize,
    /// After this many increments every counter is halved.
    sample_size: AtomicUsize,
    /// Words of the short window.
    short_words: usize,
    /// Whether the long window is in use.
    long: AtomicBool,
    /// Bumped by each switch of window: a halving under way when one comes does not carry
    /// the old window's total into the new one.
    generation: AtomicUsize,
}

/// How many times longer (in increments) and larger (in counters) the long window is than
/// the short one.
pub const LONG: usize = 8;

#[derive(Debug, Default)]
#[repr(align(64))]
struct Block([AtomicU64; 8]);

const SEEDS: [u64; 4] = [
    0x97cb_3127_eaf1_aa1b,
    0xc2b2_ae3d_27d4_eb4f,
    0x1656_67b1_9e37_79f9,
    0xa076_1d64_78bd_642f,
];

impl FrequencySketch {
    /// A sketch sized for about `capacity` distinct hot candidates, with the short window
    /// only.
    pub fn new(capacity: usize) -> Self {
        Self::with_table(capacity, 1)
    }

    /// [`FrequencySketch::new`], with room for the long window too ([`LONG`] times the
    /// table, allocated now).
    pub fn growing(capacity: usize) -> Self {
        Self::with_table(capacity, LONG)
    }

    fn with_table(capacity: usize, times: usize) -> Self {
        let words = capacity.clamp(64, 1 << 24).next_power_of_two();
        FrequencySketch {
            table: HugeSlice::new(words * times / 8, Block::default),
            mask: AtomicU64::new((words / 8 - 1) as u64),
            additions: AtomicUsize::new(0),
            pending: Stripes::default(),
            batch: (words * 10 / 1024).clamp(1, 32),
            carried: AtomicUsize::new(0),
            floor: AtomicU8::new(0),
            // Each row has 2 words of 16 counters in every block of 8 words.
            row_counters: AtomicUsize::new(words * 4),
            sample_size: AtomicUsize::new(words * 10),
            short_words: words,
            long: AtomicBool::new(false),
            generation: AtomicUsize::new(0),
        }
    }

    /// Words of the short window (the `capacity` it was made for, rounded).
    pub fn short_words(&self) -> usize {
        self.short_words
    }

    /// Whether the long window is in use.
    pub fn is_long(&self) -> bool {
        self.long.load(Ordering::Relaxed)
    }

    /// Moves to the long window (if made [`FrequencySketch::growing`]) or back to the short
    /// one, forgetting every count: a key's counters lie elsewhere in a table of the other
    /// size, and a count of one window means something else in the other. Returns whether
    /// the window changed.
    ///
    /// Why two: the short window (a sample of about a second of GETs at a million a second)
    /// admits only keys read a few times a second, and on a Zipf-like load that leaves most
    /// of the tail to Redis (82% of GETs served at best, 1M keys, s = 0.99); the long one
    /// admits keys read a few times in ten seconds (98%), but over keys spread evenly it
    /// admits keys read a few times by chance, whose fills few hits repay, and where writes
    /// end entries soon it only refills them more often. `Admission` uses it only while the
    /// cache serves most GETs and few are written.
    pub fn set_long(&self, long: bool) -> bool {
        if long && self.table.len() < self.short_words * LONG / 8 {
            return false;
        }
        if self.long.swap(long, Ordering::Relaxed) == long {
            return false;
        }
        let words = if long {
            self.short_words * LONG
        } else {
            self.short_words
        };
        self.generation.fetch_add(1, Ordering::Relaxed);
        self.mask.store((words / 8 - 1) as u64, Ordering::Relaxed);
        self.row_counters.store(words * 4, Ordering::Relaxed);
        self.sample_size.store(words * 10, Ordering::Relaxed);
        // A count made meanwhile on another thread may survive the clear, and one that read
        // its word before it and stores after it brings back that word's 16 counters as they
        // were, laid out for the other window: a few keys over- or underestimated until the
        // next halving, which only blurs admission, as any race on the counters does.
        for cell in self.table.iter().flat_map(|b| b.0.iter()) {
            cell.store(0, Ordering::Relaxed);
        }
        self.additions.store(0, Ordering::Relaxed);
        self.carried.store(0, Ordering::Relaxed);
        self.floor.store(0, Ordering::Relaxed);
        true
    }

    /// The blocks in use.
    fn in_use(&self) -> &[Block] {
        let blocks = self.mask.load(Ordering::Relaxed) as usize + 1;
        &self.table[..blocks.min(self.table.len())]
    }

    /// The block of the key with this hash.
    fn block(&self, hash: u64) -> &Block {
        let mixed = (hash ^ (hash >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let i = ((mixed >> 32) & self.mask.load(Ordering::Relaxed)) as usize;
        // `set_long` never sets a mask past the table; should one ever be, a count in the
        // wrong block blurs an estimate where an index out of bounds would panic.
        self.table.get(i).unwrap_or(&self.table[0])
    }

    /// The row's counter in the block: its word, and the counter's shift in it.
    fn slot(hash: u64, row: usize) -> (usize, u32) {
        let h = hash.wrapping_mul(SEEDS[row]);
        let word = row * 2 + (h >> 63) as usize;
        let nibble = ((h >> 59) & 0xf) as u32 * 4;
        (word, nibble)
    }

    /// Asks the CPU to load the key's block (see `Cache::prefetch`).
    pub fn prefetch(&self, hash: u64) {
        crate::prefetch::read(self.block(hash));
    }

    /// Counts one occurrence of the key with this hash, and returns its estimate after it:
    /// the counters are in hand, so this costs no second look.
    pub fn increment(&self, hash: u64) -> u8 {
        let mut added = false;
        let mut estimate = 15;
        let block = self.block(hash);
        for row in 0..4 {
            let (w, shift) = Self::slot(hash, row);
            let cell = &block.0[w];
            let cur = cell.load(Ordering::Relaxed);
            let count = (cur >> shift) & 0xf;
            // A saturated counter needs no write: hot keys cost reads only. A plain store,
            // not a locked add: two threads counting in one word at once may lose one count,
            // which only blurs an estimate, and an unlocked store lets the CPU overlap this
            // key's sketch miss with its store lookup.
            if count < 15 {
                cell.store(cur + (1 << shift), Ordering::Relaxed);
                added = true;
            }
            estimate = estimate.min((count + u64::from(count < 15)) as u8);
        }
        if added {
            self.count_addition();
        }
        estimate
    }

    /// Counts an increment towards the sample, halving the counters when it is complete.
    fn count_addition(&self) {
        // A thread without a stripe of its own counts each increment directly.
        let n = match striped::own_stripe() {
            Some(i) => {
                let pending = &self.pending[i].0;
                let n = pending.load(Ordering::Relaxed) as usize + 1;
                if n < self.batch {
                    pending.store(n as u64, Ordering::Relaxed);
                    return;
                }
                pending.store(0, Ordering::Relaxed);
                n
            }
            None => 1,
        };
        if self.additions.fetch_add(n, Ordering::Relaxed) + n
            >= self.sample_size.load(Ordering::Relaxed)
        {
            self.halve();
        } else {
            self.update_floor();
        }
    }

    /// Takes `by` off the key's counters (not below 0): a write weighs against the key's
    /// reads (see `Admission::record_write`). Other keys sharing a counter lose a little too,
    /// which only makes admission more cautious.
    pub fn decrement(&self, hash: u64, by: u64) {
        let block = self.block(hash);
        for row in 0..4 {
            let (w, shift) = Self::slot(hash, row);
            let cell = &block.0[w];
            let cur = cell.load(Ordering::Relaxed);
            let take = ((cur >> shift) & 0xf).min(by);
            if take > 0 {
                // A plain store, as in `increment`: a lost update only blurs an estimate.
                cell.store(cur - (take << shift), Ordering::Relaxed);
            }
        }
    }

    /// The estimated count (0..=15): the minimum over the rows.
    pub fn estimate(&self, hash: u64) -> u8 {
        let block = self.block(hash);
        (0..4)
            .map(|row| {
                let (w, shift) = Self::slot(hash, row);
                ((block.0[w].load(Ordering::Relaxed) >> shift) & 0xf) as u8
            })
            .min()
            .unwrap_or(0)
    }

    /// The mean counter value, rounded to the nearest: what a key never read before is
    /// overestimated by on average, since its counters are shared with others. Over a key
    /// space much larger than the sketch (uniform reads of a million keys) it reaches 4-5, so
    /// a fixed threshold alone would call a quarter of keys read once "hot"; with few keys
    /// read it stays 0.
    pub fn noise_floor(&self) -> u8 {
        self.floor.load(Ordering::Relaxed)
    }

    /// Works the noise floor out again from what the counters hold now.
    fn update_floor(&self) {
        let total = self.carried.load(Ordering::Relaxed) + self.additions.load(Ordering::Relaxed);
        let row_counters = self.row_counters.load(Ordering::Relaxed);
        let floor = ((total + row_counters / 2) / row_counters).min(15) as u8;
        self.floor.store(floor, Ordering::Relaxed);
    }

    /// Halves every counter (also done automatically after each sample).
    pub fn halve(&self) {
        let generation = self.generation.load(Ordering::Relaxed);
        let added = self.additions.swap(0, Ordering::Relaxed);
        let before = self.carried.load(Ordering::Relaxed) + added;
        // Plain loads and stores, as in `increment`: a count made between the two is lost,
        // which only blurs an estimate. A locked exchange per word took 2.7 ms of the serving
        // thread for the long window's 4 MiB (and a GET waited on it); words already zero,
        // most of a large window, are not written at all.
        for cell in self.in_use().iter().flat_map(|b| b.0.iter()) {
            let v = cell.load(Ordering::Relaxed);
            if v != 0 {
                cell.store((v >> 1) & 0x7777_7777_7777_7777, Ordering::Relaxed);
            }
        }
        // A switch of window meanwhile started its counts afresh: the old total is not theirs
        // (carried into the short window it would set the floor at 15, and no GET would be
        // looked up until halvings brought it down).
        if self.generation.load(Ordering::Relaxed) == generation {
            self.carried.store(before / 2, Ordering::Relaxed);
            self.update_floor();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_saturates() {
        let s = FrequencySketch::new(1024);
        for _ in 0..5 {
            s.increment(42);
        }
        assert_eq!(s.estimate(42), 5);
        for _ in 0..100 {
            s.increment(42);
        }
        assert_eq!(s.estimate(42), 15);
        assert_eq!(s.estimate(7), 0);
    }

    #[test]
    fn halving_forgets_old_traffic() {
        let s = FrequencySketch::new(1 << 16);
        for _ in 0..8 {
            s.increment(1);
        }
        s.halve();
        assert_eq!(s.estimate(1), 4);
    }

    #[test]
    fn halving_happens_after_a_sample() {
        let s = FrequencySketch::new(64);
        for k in 0..(64 * 10 - 1) as u64 {
            s.increment(k);
        }
        assert_eq!(s.additions.load(Ordering::Relaxed), 64 * 10 - 1);
        s.increment(u64::MAX);
        assert_eq!(s.additions.load(Ordering::Relaxed), 0);
    }

    /// Counted in batches, a sample still ends in a halving at its last increment, and what
    /// is not yet counted waits in the thread's stripe.
    #[test]
    fn batched_increments_complete_a_sample() {
        let s = FrequencySketch::new(1 << 13);
        assert!(s.batch > 1);
        let pending = |s: &FrequencySketch| match striped::own_stripe() {
            Some(i) => s.pending[i].0.load(Ordering::Relaxed),
            None => 0,
        };
        // Distinct keys, a few per counter: every increment adds.
        for k in 1..s.sample_size.load(Ordering::Relaxed) as u64 {
            s.increment(k);
        }
        let waiting = pending(&s) as usize;
        assert!(waiting < s.batch);
        assert_eq!(
            s.additions.load(Ordering::Relaxed) + waiting,
            s.sample_size.load(Ordering::Relaxed) - 1
        );
        assert_eq!(s.carried.load(Ordering::Relaxed), 0);
        s.increment(u64::MAX);
        assert_eq!(
            s.carried.load(Ordering::Relaxed),
            s.sample_size.load(Ordering::Relaxed) / 2
        );
        assert_eq!(
            s.additions.load(Ordering::Relaxed) + pending(&s) as usize,
            0
        );
    }

    #[test]
    fn the_noise_floor_follows_what_the_counters_hold() {
        let s = FrequencySketch::new(64);
        assert_eq!(s.noise_floor(), 0);
        // 64 words: 256 counters per row.
        for k in 0..100u64 {
            s.increment(k);
        }
        assert_eq!(s.noise_floor(), 0);
        for k in 100..256u64 {
            s.increment(k);
        }
        assert_eq!(s.noise_floor(), 1);
        for k in 0..300u64 {
            s.increment(k);
        }
        assert_eq!(s.noise_floor(), 2);
        s.halve();
        assert_eq!(s.noise_floor(), 1);
    }

    #[test]
    fn the_long_window_is_eight_times_larger_and_longer_and_starts_afresh() {
        let fixed = FrequencySketch::new(64);
        assert!(!fixed.set_long(true), "no room for the long window");
        assert!(!fixed.is_long());
        let s = FrequencySketch::growing(64);
        let short = s.sample_size.load(Ordering::Relaxed);
        for _ in 0..5 {
            s.increment(42);
        }
        assert!(!s.set_long(false), "already short");
        assert!(s.set_long(true));
        assert!(s.is_long());
        assert_eq!(s.estimate(42), 0, "counts of the short window forgotten");
        assert_eq!(s.sample_size.load(Ordering::Relaxed), short * LONG);
        assert_eq!(s.in_use().len(), s.table.len());
        // Distinct keys spread over eight times the counters: the floor rises eight times
        // slower than in the short window (see `the_noise_floor_follows_what_the_counters_hold`).
        for k in 0..256u64 * LONG as u64 {
            s.increment(k);
        }
        assert_eq!(s.noise_floor(), 1);
        // A sample eight times as long before the counters halve.
        let before = s.additions.load(Ordering::Relaxed);
        assert!(before > short, "{before} increments, no halving yet");
        for _ in 0..5 {
            s.increment(u64::MAX);
        }
        assert_eq!(s.estimate(u64::MAX), 5);
        assert!(s.set_long(false));
        assert_eq!(
            s.estimate(u64::MAX),
            0,
            "counts of the long window forgotten"
        );
        assert_eq!(s.noise_floor(), 0);
        assert_eq!(s.in_use().len(), s.table.len() / LONG);
        assert_eq!(s.sample_size.load(Ordering::Relaxed), short);
    }

    #[test]
    fn keys_never_seen_are_rarely_estimated_hot() {
        use std::hash::BuildHasher;
        let h = foldhash::fast::RandomState::default();
        let s = FrequencySketch::new(1 << 16);
        for k in 0..20_000u64 {
            for _ in 0..4 {
                s.increment(h.hash_one(k));
            }
        }
        let hot = (20_000..30_000u64)
            .filter(|k| s.estimate(h.hash_one(k)) >= 4)
            .count();
        assert!(hot < 100, "{hot} of 10000 unseen keys estimated hot");
    }
}
