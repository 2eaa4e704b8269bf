use super::*;
use crate::cluster::key_slot;
use crate::commands::positions::command_keys;

fn owned(line: &str) -> Vec<Vec<u8>> {
    line.split(' ').map(|w| w.as_bytes().to_vec()).collect()
}

#[test]
fn slot_checks() {
    let check = |line: &str| {
        let words = owned(line);
        let args = Args::Owned(&words);
        keys_slot(&command_keys(&words[0].to_ascii_uppercase(), &args), &args)
    };
    assert_eq!(check("PING"), KeySlot::NoKeys);
    assert_eq!(check("GET foo"), KeySlot::One(12182));
    assert_eq!(check("MSET {u}a 1 {u}b 2"), KeySlot::One(key_slot(b"u")));
    assert_eq!(check("MGET foo bar"), KeySlot::Cross);
    assert_eq!(
        check("EVAL s 2 {t}1 {t}2 foo"),
        KeySlot::One(key_slot(b"t"))
    );
}

#[test]
fn multi_key_classification() {
    assert_eq!(classify_multi(b"MGET"), MultiKey::Split(SplitKind::Mget));
    assert_eq!(classify_multi(b"MSET"), MultiKey::Split(SplitKind::Mset));
    for n in [&b"DEL"[..], b"UNLINK", b"EXISTS", b"TOUCH"] {
        assert_eq!(classify_multi(n), MultiKey::Split(SplitKind::SumInt));
    }
    for n in [
        &b"MSETNX"[..],
        b"RENAME",
        b"RENAMENX",
        b"SMOVE",
        b"SUNIONSTORE",
        b"SINTER",
        b"ZUNIONSTORE",
        b"EVAL",
        b"FCALL",
        b"BLPOP",
        b"WATCH",
        b"LMOVE",
        b"PFCOUNT",
        b"BITOP",
        b"SORT",
        b"XREAD",
        b"GEOSEARCHSTORE",
        b"COPY",
        b"LCS",
    ] {
        assert_eq!(
            classify_multi(n),
            MultiKey::SameSlot,
            "{}",
            String::from_utf8_lossy(n)
        );
    }
    for n in [
        &b"GET"[..],
        b"SET",
        b"HSET",
        b"PING",
        b"SORT_RO",
        b"MULTI",
        b"FOO.BAR",
        b"OBJECT",
    ] {
        assert_eq!(
            classify_multi(n),
            MultiKey::Single,
            "{}",
            String::from_utf8_lossy(n)
        );
    }
}

#[test]
fn split_groups_by_slot_in_key_order() {
    let words = owned("MSET foo 1 {u}a 2 bar 3 {u}b 4 foo 5");
    let args = Args::Owned(&words);
    let groups = split_by_slot(&command_keys(b"MSET", &args), &args);
    let u = key_slot(b"u");
    assert_eq!(
        groups,
        [
            SlotGroup {
                slot: 12182,
                keys: vec![1, 9]
            },
            SlotGroup {
                slot: u,
                keys: vec![3, 7]
            },
            SlotGroup {
                slot: 5061,
                keys: vec![5]
            },
        ]
    );
}
