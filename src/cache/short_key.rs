//! A key held inline when short: most keys are, so storing or registering one allocates
//! nothing, and comparing one reads memory already in hand instead of following a pointer.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_as_their_bytes_inline_or_not() {
        let long = vec![b'k'; 100];
        for key in [&b""[..], b"k", &[b'x'; INLINE], &long] {
            let k = ShortKey::new(key);
            assert_eq!(k.bytes(), key);
            let mut other = key.to_vec();
            other.push(b'!');
            assert_ne!(k, ShortKey::new(&other));
        }
        assert_ne!(ShortKey::new(b"ab"), ShortKey::new(b"ac"));
    }
}
