//! What a round did with each key it wrote or read other than by a hit, by the key's hash:
//! what a later GET of the key in the round may be answered with.
//!
//! Redis runs a client's requests in order, so a client never reads a key's value older than
//! one it read before. A round's GETs are answered by different means (a hit now, a read in
//! the batch sent after the round, a read another client or the lane sent already), which
//! Redis runs in another order than the GETs': a later GET of a key answered by a read Redis
//! ran earlier could see the value from before a write another client made between the two.
//! So once a GET of a key was answered by a read, a later GET of it in the round is answered
//! by that read, or by one sent after it.

use std::collections::HashSet;

use crate::cache::FillRx;

/// A round's notes keep at most this much capacity into the next round.
const KEEP_CAPACITY: usize = 1024;
/// Up to this many notes, a GET scans them; past it, they are indexed.
const SCAN_AT_MOST: usize = 16;

/// What an earlier request of the round did with a key.
#[derive(Debug, Clone)]
pub(super) enum Note {
    /// Wrote it, or forwarded a GET of it in the batch: a later GET is forwarded too, and
    /// Redis runs it after.
    Forward,
    /// A GET of it waits on this read, sent outside the batch (a tracked fill over the lane,
    /// or another client's read joined): a later GET waits for it too.
    Joined(FillRx),
    /// A GET of it leads the read of this id (`Lead::id`) in the batch: a later GET joins
    /// it, or, if it is no longer the key's, is forwarded behind it.
    Led(u64),
}

/// The round's notes, by key hash. A key's [`Note::Forward`] counts over a read noted for it:
/// it is noted after the read (a lead no longer the key's), or is a write or a forward the
/// later GET must come behind.
#[derive(Debug, Default)]
pub(super) struct RoundNotes {
    /// Hashes of the keys noted [`Note::Forward`]: most notes, one per GET a cool
    /// connection skips, so kept apart, 8 bytes each and nothing to drop.
    forwarded: Vec<u64>,
    /// The keys noted with a read, joined or led: few.
    reads: Vec<(u64, Note)>,
    /// One bit per noted hash, picked by its top eight bits: most GETs of a round that noted
    /// a few dozen keys are told apart from them by this alone. (One word, picked by six
    /// bits, sent a fifth of a cool round's GETs to scan the notes, whose skipped GETs are
    /// noted.)
    bits: [u64; 4],
    /// `forwarded[..indexed]`, as a set: built only once a GET asks and there are many.
    index: HashSet<u64, foldhash::fast::RandomState>,
    indexed: usize,
    /// How many of `reads` are [`Note::Joined`].
    joined: usize,
}

impl RoundNotes {
    /// A new round: nothing noted.
    pub(super) fn clear(&mut self) {
        if self.forwarded.capacity() > KEEP_CAPACITY || self.reads.capacity() > KEEP_CAPACITY {
            // Do not carry (and clear, every round) the table of one huge write.
            *self = RoundNotes::default();
            return;
        }
        self.forwarded.clear();
        if !self.reads.is_empty() {
            self.reads.clear();
        }
        if self.indexed > 0 {
            self.index.clear();
            self.indexed = 0;
        }
        self.bits = [0; 4];
        self.joined = 0;
    }

    /// Notes what a request did with the key whose hash is `hash`.
    pub(super) fn add(&mut self, hash: u64, note: Note) {
        match note {
            Note::Forward => self.forwarded.push(hash),
            read => {
                self.joined += usize::from(matches!(read, Note::Joined(_)));
                self.reads.push((hash, read));
            }
        }
        let (word, bit) = bit(hash);
        self.bits[word] |= bit;
    }

    /// Whether anything was noted this round.
    #[inline]
    pub(super) fn any(&self) -> bool {
        !self.forwarded.is_empty() || !self.reads.is_empty()
    }

    /// Whether a GET of the round waits on a read outside the batch.
    #[inline]
    pub(super) fn joined_any(&self) -> bool {
        self.joined > 0
    }

    /// Whether a GET of the round of the key whose hash is `hash` waits on a read outside
    /// the batch.
    pub(super) fn joined(&self, hash: u64) -> bool {
        self.joined > 0
            && (self.reads.iter()).any(|(h, n)| *h == hash && matches!(n, Note::Joined(_)))
    }

    /// The note of the key whose hash is `hash` that counts, if any.
    #[inline]
    pub(super) fn find(&mut self, hash: u64) -> Option<Note> {
        // Inlined for this check: nearly every GET's key is none of the round's.
        let (word, bit) = bit(hash);
        if self.bits[word] & bit == 0 {
            return None;
        }
        self.find_noted(hash)
    }

    /// [`RoundNotes::find`] past the bits' check.
    fn find_noted(&mut self, hash: u64) -> Option<Note> {
        if self.forwarded(hash) {
            return Some(Note::Forward);
        }
        let (_, note) = self.reads.iter().rev().find(|(h, _)| *h == hash)?;
        Some(note.clone())
    }

    /// Whether the key whose hash is `hash` is noted [`Note::Forward`].
    fn forwarded(&mut self, hash: u64) -> bool {
        if self.forwarded.len() <= SCAN_AT_MOST {
            return self.forwarded.contains(&hash);
        }
        let new = self.forwarded.get(self.indexed..).unwrap_or_default();
        self.index.extend(new.iter().copied());
        self.indexed = self.forwarded.len();
        self.index.contains(&hash)
    }
}

/// The word and bit of `RoundNotes::bits` for a key's hash.
#[inline]
fn bit(hash: u64) -> (usize, u64) {
    ((hash >> 62) as usize, 1 << ((hash >> 56) & 63))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn led(n: Option<Note>) -> Option<u64> {
        match n {
            Some(Note::Led(id)) => Some(id),
            _ => None,
        }
    }

    #[test]
    fn a_forward_counts_over_a_read_scanned_or_indexed() {
        let mut notes = RoundNotes::default();
        assert!(!notes.any() && notes.find(7).is_none());
        notes.add(7, Note::Led(1));
        assert_eq!(led(notes.find(7)), Some(1));
        notes.add(7, Note::Forward);
        assert!(matches!(notes.find(7), Some(Note::Forward)));
        // Past the scan limit, forwarded keys are indexed, and keys forwarded after the index
        // was built are indexed at the next find.
        for h in 100..140u64 {
            notes.add(h << 40, Note::Forward);
        }
        notes.add(9, Note::Led(2));
        assert!(matches!(notes.find(120 << 40), Some(Note::Forward)));
        assert!(matches!(notes.find(7), Some(Note::Forward)));
        assert_eq!(led(notes.find(9)), Some(2));
        notes.add(1 << 63, Note::Forward);
        notes.add(9, Note::Led(3));
        assert!(matches!(notes.find(1 << 63), Some(Note::Forward)));
        assert_eq!(led(notes.find(9)), Some(3), "the latest read");
        assert!(notes.find(8).is_none() && notes.find(99 << 40).is_none());
        notes.clear();
        assert!(!notes.any() && notes.find(7).is_none() && notes.find(120 << 40).is_none());
        notes.add(5, Note::Forward);
        assert!(notes.find(5).is_some() && notes.find(7).is_none());
    }
}
