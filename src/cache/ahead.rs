//! The GETs of a round found ahead of handling them, and what their lookups will read
//! loaded meanwhile ([`Cache::prefetch`]).

use super::{Cache, Clock};
use crate::resp::lookahead::{Found, Plain};

/// Most keys `Cache::prefetch` takes at once: a full pipeline of a usual depth.
pub const PREFETCH_MAX: usize = 32;

/// How many GETs ahead of the lookups their entries (or, for keys the front does not hold,
/// their buckets in the table) are loaded: enough for the loads to arrive in time, at the few
/// hundred nanoseconds a request takes to handle. With the heap on 4 KiB pages a load of a
/// large store's entry also walks the page tables: at 2, perf put the store's lookup at
/// 134-150 ns per request on Zipf GET -P 16, at 4 or 7 at 103-125. At 8, a bucket has
/// `ENTRY_LEAD - TABLE_ENTRY_LEAD` requests to arrive before its entry is asked for (6 and 3
/// read the same: `Slots::find` at 5.5% of corral's user time, against 5.3-5.7%).
const ENTRY_LEAD: usize = 8;
/// How many GETs ahead of the lookups the entries in the table's buckets are loaded: a bucket
/// asked for `ENTRY_LEAD - TABLE_ENTRY_LEAD` requests before has arrived, and only then is the
/// entry it holds for the key known. A lookup in the table compares the entry's key, past the
/// lines a front hit reads: without this the first read of that key took 10% of corral's
/// user time on Zipf GETs -P 16 over 1M keys (perf), `Slots::find` waiting for it.
const TABLE_ENTRY_LEAD: usize = 4;
// Which GETs had their buckets asked for is one bit each.
const _: () = assert!(PREFETCH_MAX <= u32::BITS as usize && TABLE_ENTRY_LEAD < ENTRY_LEAD);

/// The GETs of a round found ahead: their keys' hashes, where they are in the read buffer
/// (for [`Ahead::plain_at`]), and how many of their entries `Cache::prefetch_next` asked
/// for; and its plain SETs, where they start and their keys' hashes (for
/// [`Ahead::set_at`]). Kept by the connection from round to round, so a round copies none
/// of it.
#[derive(Debug)]
pub struct Ahead {
    pub(super) hashes: [u64; PREFETCH_MAX],
    places: [Place; PREFETCH_MAX],
    pub(super) len: usize,
    /// The next GET whose front entry (or bucket in the table) `Cache::prefetch_next` loads,
    /// if `entries`.
    pub(super) next: usize,
    pub(super) entries: bool,
    /// The GETs whose buckets in the table `Cache::prefetch_next` asked for (bit `i`: the
    /// `i`th), and the next of them whose entry it loads.
    in_table: u32,
    table_next: usize,
    /// The next GET [`Ahead::plain_at`] may be asked for.
    taken: usize,
    /// The round's SETs found ahead: where each starts in the read buffer, and its key's
    /// hash, which the write's invalidation then takes rather than hashing the key again;
    /// how many, and the next [`Ahead::set_at`] may be asked for.
    set_places: [usize; PREFETCH_MAX],
    set_hashes: [u64; PREFETCH_MAX],
    sets: usize,
    sets_taken: usize,
}

/// Where a GET is in the read buffer: its start, and where its key starts and ends.
#[derive(Debug, Clone, Copy, Default)]
struct Place {
    at: usize,
    key: usize,
    end: usize,
}

impl Default for Ahead {
    fn default() -> Self {
        Ahead {
            hashes: [0; PREFETCH_MAX],
            places: [Place::default(); PREFETCH_MAX],
            len: 0,
            next: 0,
            entries: false,
            in_table: 0,
            table_next: TABLE_ENTRY_LEAD,
            taken: 0,
            set_places: [0; PREFETCH_MAX],
            set_hashes: [0; PREFETCH_MAX],
            sets: 0,
            sets_taken: 0,
        }
    }
}

impl Ahead {
    /// Whether the round's look ahead found no GET (or did not look).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets the last round's GETs.
    pub(super) fn clear(&mut self) {
        self.len = 0;
        self.next = 0;
        self.taken = 0;
        self.entries = false;
        self.in_table = 0;
        self.table_next = TABLE_ENTRY_LEAD;
        self.sets = 0;
        self.sets_taken = 0;
    }

    /// Notes a GET of a key of `key_len` bytes at `plain`, with its key's hash, unless
    /// [`PREFETCH_MAX`] are noted already.
    pub(super) fn push(&mut self, hash: u64, plain: Plain, key_len: usize) {
        let (Some(h), Some(p)) = (self.hashes.get_mut(self.len), self.places.get_mut(self.len))
        else {
            return;
        };
        *h = hash;
        *p = Place {
            at: plain.at,
            key: plain.key,
            end: plain.key + key_len,
        };
        self.len += 1;
    }

    /// Notes a SET starting at `at`, with its key's hash (room permitting, as for GETs).
    fn push_set(&mut self, at: usize, hash: u64) {
        let (Some(p), Some(h)) = (
            self.set_places.get_mut(self.sets),
            self.set_hashes.get_mut(self.sets),
        ) else {
            return;
        };
        (*p, *h) = (at, hash);
        self.sets += 1;
    }

    /// The hash of the key of the SET found ahead that starts at `at` in the read buffer, if
    /// one does. Asked with `at` rising through a round, as [`Ahead::plain_at`] is.
    #[inline]
    pub fn set_at(&mut self, at: usize) -> Option<u64> {
        while let Some(&p) = self.set_places[..self.sets].get(self.sets_taken) {
            if p > at {
                return None;
            }
            let i = self.sets_taken;
            self.sets_taken += 1;
            if p == at {
                return Some(self.set_hashes[i]);
            }
        }
        None
    }

    /// The next GET whose front slot's entry (or bucket in the table) is to be loaded: its
    /// place among the round's GETs, and its key's hash.
    fn next_slot(&mut self) -> Option<(usize, u64)> {
        let i = self.next;
        let &hash = self.hashes[..self.len].get(i)?;
        self.next += 1;
        Some((i, hash))
    }

    /// The bucket in the table of the `i`th GET was asked for.
    fn bucket_asked(&mut self, i: usize) {
        self.in_table |= 1 << i;
    }

    /// The hash of the next GET whose entry in the table is to be loaded, if its bucket was
    /// asked for (else `None`, and the next call looks at the GET after it).
    fn next_table_entry(&mut self) -> Option<u64> {
        let i = self.table_next;
        let &hash = self.hashes[..self.len].get(i)?;
        self.table_next += 1;
        (self.in_table & 1 << i != 0).then_some(hash)
    }

    /// The GET found ahead that starts at `at` in the read buffer, if one does: where its
    /// key is, and the key's hash. Asked with `at` rising through a round: a GET passed
    /// over is not looked at again.
    #[inline]
    pub fn plain_at(&mut self, at: usize) -> Option<(std::ops::Range<usize>, u64)> {
        while let Some(p) = self.places[..self.len].get(self.taken) {
            if p.at > at {
                return None;
            }
            let i = self.taken;
            self.taken += 1;
            if p.at == at {
                return Some((p.key..p.end, self.hashes[i]));
            }
        }
        None
    }
}

impl Cache {
    /// Starts loading what the GETs of these keys will read first: their sketch counters,
    /// their slots among the recent cold reads, their presence counts (a cool connection's:
    /// their bits of the presence summary) and (see below) their slots in the store's front;
    /// and for SETs, their keys' presence counts, read counters and `unacked.rs` slots,
    /// their hashes kept in `ahead` for the SETs' invalidations.
    /// Called for the requests of a round before any is handled, so that the loads' cache
    /// misses overlap, where each lookup would otherwise wait for its own in turn: on a
    /// large key space, about half of what the cache added to a cold GET, most of what a
    /// hit spent in the store, and most of what it added to a SET. At most [`PREFETCH_MAX`]
    /// requests. The entries the front slots hold are loaded later, as the round goes on
    /// ([`Cache::prefetch_next`]): only once a slot has arrived is its entry known. Unless
    /// the connection's last round served a hit ([`Clock::warm`]), neither is: the slots of
    /// keys that are not cached hold other keys' entries, and loading them would only cost.
    /// A cool connection's GETs ([`Clock::cool`]) need their bits of the presence summary
    /// only. Nothing is looked at on a connection whose rounds lately had no GET (see
    /// `clock::LOOK_AGAIN`). `ahead` is filled with what was found (emptied first).
    pub fn prefetch<'a>(
        &self,
        found: impl Iterator<Item = Found<'a>>,
        clock: &mut Clock,
        ahead: &mut Ahead,
    ) {
        ahead.clear();
        let core = &self.core;
        core.store.fit_front();
        // A round of writes alone is looked through only while the store is crowded: its
        // SETs' invalidations then read the table, whose buckets are loaded here. On an
        // empty store that walk cost SETs -P 16 5% more of corral's CPU; beside 270,000
        // entries it took a tenth off (docs/BENCHMARKS.md, "SETs beside a large store").
        let crowded = core.presence.crowded();
        if !clock.looks_ahead() && !crowded {
            return;
        }
        let (front, cool) = (clock.warm(), clock.cool());
        // A cool connection's GET the countdown will sample, if every GET before it is
        // skipped, as nearly all are: its lookup counts it in the sketch and looks for it in
        // the recent reads, both lines nothing else loads. Uniform GETs over 1M keys, -P 16:
        // the count took 11.8 ns per request (170 ns per sampled GET) without this.
        let sampled = clock.to_sample();
        let mut gets = 0;
        for found in found.take(PREFETCH_MAX) {
            let (key, plain) = match found {
                Found::Get(key, plain) => (key, plain),
                Found::Set(key, at) => {
                    let hash = core.admission.hash(key);
                    ahead.push_set(at, hash);
                    core.presence.prefetch(hash);
                    core.admission.prefetch_write(hash);
                    core.unacked.prefetch(hash);
                    if crowded {
                        core.store.prefetch_table(hash);
                    }
                    continue;
                }
            };
            let hash = core.admission.hash(key);
            if cool {
                core.presence.prefetch_summary(hash);
            } else {
                core.presence.prefetch(hash);
            }
            gets += 1;
            ahead.push(hash, plain, key.len());
            if cool {
                if gets == sampled + 1 {
                    core.presence.prefetch(hash);
                    core.admission.prefetch(hash);
                    core.recent.prefetch(hash);
                }
                continue;
            }
            core.admission.prefetch(hash);
            core.recent.prefetch(hash);
            if front {
                core.store.prefetch(hash);
            }
        }
        ahead.entries = front && !cool;
        if ahead.entries {
            for _ in 0..ENTRY_LEAD {
                self.prefetch_slot(ahead);
            }
        }
        clock.found_gets(gets > 0);
    }

    /// Starts loading the entry of the next GET in `ahead` if its front slot holds one, else
    /// its bucket in the table; and the entry of a GET `TABLE_ENTRY_LEAD` ahead whose bucket
    /// was asked for, from that bucket. Called once per request handled, so the loads run
    /// ahead of the lookups by as many requests.
    #[inline]
    pub fn prefetch_next(&self, ahead: &mut Ahead) {
        if !ahead.entries {
            return;
        }
        self.prefetch_slot(ahead);
        if let Some(hash) = ahead.next_table_entry() {
            self.core.store.prefetch_table_entry(hash);
        }
    }

    /// The first part of [`Cache::prefetch_next`], for the next GET.
    #[inline]
    fn prefetch_slot(&self, ahead: &mut Ahead) {
        if let Some((i, hash)) = ahead.next_slot() {
            // Not in the front: its bucket in the table, if the key may have an entry (its
            // presence count was loaded with the front's slot).
            if !self.core.store.prefetch_entry(hash) && self.core.presence.counts(hash).entry() {
                self.core.store.prefetch_table(hash);
                ahead.bucket_asked(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round of `n` GETs as `Cache::prefetch` and `Cache::prefetch_next` walk it, every
    /// bucket asked for but those of `in_front`: for each GET, the step its bucket was asked
    /// for and the step its entry was (0 before any request is handled, `k` after the `k`th).
    fn walk(n: usize, in_front: &[usize]) -> Vec<(Option<usize>, Option<usize>)> {
        let mut ahead = Ahead::default();
        for i in 0..n {
            ahead.push(
                i as u64,
                Plain {
                    at: i * 30,
                    key: i * 30 + 17,
                },
                3,
            );
        }
        let mut steps = vec![(None, None); n];
        let slot = |ahead: &mut Ahead, steps: &mut Vec<(Option<usize>, Option<usize>)>, k| {
            if let Some((i, hash)) = ahead.next_slot() {
                assert_eq!(hash, i as u64);
                if !in_front.contains(&i) {
                    ahead.bucket_asked(i);
                    steps[i].0 = Some(k);
                }
            }
        };
        for _ in 0..ENTRY_LEAD {
            slot(&mut ahead, &mut steps, 0);
        }
        for k in 1..=n {
            slot(&mut ahead, &mut steps, k);
            if let Some(hash) = ahead.next_table_entry() {
                steps[hash as usize].1 = Some(k);
            }
        }
        steps
    }

    #[test]
    fn a_table_entry_is_loaded_after_its_bucket_and_before_its_lookup() {
        let n = PREFETCH_MAX;
        for (i, step) in walk(n, &[]).into_iter().enumerate() {
            let (Some(bucket), entry) = step else {
                panic!("GET {i}: no bucket asked for");
            };
            if i < TABLE_ENTRY_LEAD {
                // Looked up before its bucket can have arrived: not worth loading from it.
                assert_eq!(entry, None, "GET {i}");
                continue;
            }
            let entry = entry.unwrap_or_else(|| panic!("GET {i}: no entry loaded"));
            // The `i`th GET is looked up after the `i`th step.
            assert!(bucket < entry && entry <= i, "GET {i}: {bucket} {entry}");
        }
        // A GET the front holds has no bucket asked for, nor an entry loaded from one.
        let steps = walk(n, &[9, 10]);
        assert_eq!(steps[9], (None, None));
        assert_eq!(steps[10], (None, None));
        assert!(steps[11].1.is_some());
    }

    #[test]
    fn gets_are_found_at_their_place_once_in_order() {
        let mut ahead = Ahead::default();
        for (i, at) in [0, 30, 60].into_iter().enumerate() {
            ahead.push(i as u64, Plain { at, key: at + 17 }, 3);
        }
        // A place no GET starts at, before one that does: nothing, and nothing passed.
        assert_eq!(ahead.plain_at(10), None);
        assert_eq!(ahead.plain_at(30), Some((47..50, 1)));
        // The first one was passed over, and the second taken.
        assert_eq!(ahead.plain_at(0), None);
        assert_eq!(ahead.plain_at(30), None);
        assert_eq!(ahead.plain_at(60), Some((77..80, 2)));
        assert_eq!(ahead.plain_at(90), None);
        ahead.clear();
        assert_eq!(ahead.plain_at(0), None);
        for i in 0..=PREFETCH_MAX {
            ahead.push(0, Plain { at: i, key: i }, 0);
        }
        assert_eq!(ahead.plain_at(PREFETCH_MAX - 1), Some((31..31, 0)));
        assert_eq!(ahead.plain_at(PREFETCH_MAX), None, "full");
    }

    #[test]
    fn sets_are_found_at_their_place_once_in_order_apart_from_gets() {
        let mut ahead = Ahead::default();
        ahead.push(7, Plain { at: 0, key: 17 }, 1);
        ahead.push_set(20, 1);
        ahead.push_set(50, 2);
        // A GET's place holds no SET, and a SET's no GET.
        assert_eq!(ahead.set_at(0), None);
        assert_eq!(ahead.plain_at(20), None);
        assert_eq!(ahead.set_at(20), Some(1));
        assert_eq!(ahead.set_at(20), None, "taken");
        assert_eq!(ahead.set_at(50), Some(2));
        ahead.clear();
        assert_eq!(ahead.set_at(50), None);
        for i in 0..=PREFETCH_MAX {
            ahead.push_set(i, i as u64);
        }
        assert_eq!(
            ahead.set_at(PREFETCH_MAX - 1),
            Some(PREFETCH_MAX as u64 - 1)
        );
        assert_eq!(ahead.set_at(PREFETCH_MAX), None, "full");
    }
}
