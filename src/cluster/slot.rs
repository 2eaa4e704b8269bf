//! Hash slots: which of Redis Cluster's 16384 slots a key belongs to.

use crc::{CRC_16_XMODEM, Crc, Table};

/// Number of hash slots in a Redis Cluster.
pub const SLOTS: usize = 16384;

/// The CRC Redis Cluster uses (the XMODEM variant of CRC16), from tables built at compile
/// time. Sixteen of them (8 KiB) take a key's bytes 16 at a time: a byte at a time, each
/// step waiting on the last, a cluster pipeline's slot hashing was about 5% of corral's CPU.
static CRC16: Crc<u16, Table<16>> = Crc::<u16, Table<16>>::new(&CRC_16_XMODEM);

/// The slot of `key`: CRC16-XMODEM of the key, or of its hash tag, mod 16384.
///
/// The hash tag is the text between the first `{` and the first `}` after it, when that text is
/// non-empty; otherwise the whole key is hashed. This is exactly Redis's `keyHashSlot`, so
/// `foo{}{bar}` hashes whole (the first braces are empty) and `foo{{bar}}zap` hashes `{bar`.
pub fn key_slot(key: &[u8]) -> u16 {
    // 16384 is a power of two, so the mask is the modulo Redis applies.
    CRC16.checksum(hash_tag(key)) & (SLOTS as u16 - 1)
}

/// The part of `key` that is hashed.
fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&c| c == b'{') else {
        return key;
    };
    let rest = &key[open + 1..];
    match rest.iter().position(|&c| c == b'}') {
        Some(close) if close > 0 => &rest[..close],
        _ => key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_slots_match_redis() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.0.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b""), 0);
        assert_eq!(key_slot(b"{}"), 15257);
        assert_eq!(key_slot(b"a{b}c"), 3300);
        assert_eq!(key_slot(b"{user1000}.following"), 3443);
    }

    #[test]
    fn hash_tags_follow_redis_rules() {
        assert_eq!(
            key_slot(b"{user1000}.following"),
            key_slot(b"{user1000}.followers")
        );
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        // Empty first tag: the whole key is hashed.
        assert_eq!(key_slot(b"foo{}{bar}"), 8363);
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        // The tag runs from the first `{` to the first `}` after it.
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), 4015);
        // An unclosed brace means no tag.
        assert_eq!(key_slot(b"foo{bar"), CRC16.checksum(b"foo{bar") & 16383);
        assert_eq!(key_slot(b"x}{y}"), key_slot(b"y"));
    }

    #[test]
    fn every_slot_is_in_range() {
        for i in 0u32..5000 {
            assert!(usize::from(key_slot(&i.to_le_bytes())) < SLOTS);
        }
    }
}
