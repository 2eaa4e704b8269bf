//! A key held inline when short: most keys are, so storing or registering one allocates
//! nothing, and comparing one reads memory already in hand instead of following a pointer.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

/// Keys up to this long are held inline.
pub(super) const INLINE: usize = 30;

/// A key's bytes, inline up to [`INLINE`] bytes, else on the heap.
#[derive(Debug, Clone)]
pub(super) enum ShortKey {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl ShortKey {
    pub(super) fn new(key: &[u8]) -> ShortKey {
        if key.len() <= INLINE {
            let mut bytes = [0; INLINE];
            bytes[..key.len()].copy_from_slice(key);
            // Fits: at most INLINE (30).
            ShortKey::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            ShortKey::Heap(key.into())
        }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            ShortKey::Inline { len, bytes } => &bytes[..usize::from(*len)],
            ShortKey::Heap(b) => b,
        }
    }
}

impl PartialEq for ShortKey {
    fn eq(&self, other: &ShortKey) -> bool {
        self.bytes() == other.bytes()
    }
}

impl Eq for ShortKey {}

/// Hashes as its bytes do, as `Borrow<[u8]>` requires: maps keyed by `ShortKey` are looked up
/// by `&[u8]`.
impl Hash for ShortKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.bytes().hash(state);
    }
}

impl Borrow<[u8]> for ShortKey {
    fn borrow(&self) -> &[u8] {
        self.bytes()
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    #[test]
    fn keys_compare_and_hash_as_their_bytes_inline_or_not() {
        let hasher = std::collections::hash_map::RandomState::new();
        let long = vec![b'k'; 100];
        for key in [&b""[..], b"k", &[b'x'; INLINE], &long] {
            let k = ShortKey::new(key);
            assert_eq!(k.bytes(), key);
            assert_eq!(hasher.hash_one(&k), hasher.hash_one(key));
            let mut other = key.to_vec();
            other.push(b'!');
            assert_ne!(k, ShortKey::new(&other));
        }
        assert_ne!(ShortKey::new(b"ab"), ShortKey::new(b"ac"));
    }
}
