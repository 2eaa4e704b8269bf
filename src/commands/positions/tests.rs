use super::*;

fn owned(line: &str) -> Vec<Vec<u8>> {
    line.split(' ').map(|w| w.as_bytes().to_vec()).collect()
}

/// The keys of a request given as a space-separated line.
fn keys(line: &str) -> Vec<String> {
    let words = owned(line);
    let args = Args::Owned(&words);
    let name = words[0].to_ascii_uppercase();
    command_keys(&name, &args)
        .keys(&args)
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect()
}

fn known(line: &str) -> bool {
    let words = owned(line);
    command_keys(&words[0].to_ascii_uppercase(), &Args::Owned(&words)).is_known()
}

#[test]
fn tables_are_sorted_for_binary_search() {
    assert!(KEYED.windows(2).all(|w| w[0].0 < w[1].0));
    assert!(KEYLESS.windows(2).all(|w| w[0] < w[1]));
    assert!(MOVABLE.windows(2).all(|w| w[0] < w[1]));
    for (name, first, _, step) in KEYED {
        assert!(*first > 0 && *step > 0, "{name}");
        assert!(!KEYLESS.contains(name) && !MOVABLE.contains(name), "{name}");
    }
}

#[test]
fn fixed_positions_from_the_table() {
    assert_eq!(keys("GET k"), ["k"]);
    assert_eq!(keys("SET k v EX 10"), ["k"]);
    assert_eq!(keys("HGET h f"), ["h"]);
    assert_eq!(keys("MGET a b c"), ["a", "b", "c"]);
    assert_eq!(keys("MSET a 1 b 2"), ["a", "b"]);
    assert_eq!(keys("BLPOP a b 0"), ["a", "b"]);
    assert_eq!(keys("BITOP AND d a b"), ["d", "a", "b"]);
    assert_eq!(keys("RENAME a b"), ["a", "b"]);
    assert_eq!(keys("LMOVE a b LEFT RIGHT"), ["a", "b"]);
    assert_eq!(keys("LCS a b"), ["a", "b"]);
    assert_eq!(keys("SPUBLISH ch msg"), ["ch"]);
    assert_eq!(keys("WATCH a b"), ["a", "b"]);
    // Lower-case input is upper-cased by the caller, as for `keys()` here.
    assert_eq!(keys("get k"), ["k"]);
}

#[test]
fn subcommands_with_keys() {
    assert_eq!(keys("OBJECT ENCODING k"), ["k"]);
    assert_eq!(keys("object freq k"), ["k"]);
    assert_eq!(keys("XINFO STREAM s FULL"), ["s"]);
    assert_eq!(keys("XINFO CONSUMERS s g"), ["s"]);
    assert_eq!(keys("MEMORY USAGE k SAMPLES 5"), ["k"]);
    assert_eq!(keys("XGROUP CREATE s g $"), ["s"]);
    assert!(keys("OBJECT HELP").is_empty() && known("OBJECT HELP"));
    assert!(keys("MEMORY STATS").is_empty() && known("MEMORY STATS"));
    assert!(!known("OBJECT NOSUCH k"));
    assert!(!known("OBJECT"));
    assert!(!known(&format!("OBJECT {}", "X".repeat(100))));
}

#[test]
fn keyless_and_unknown_commands() {
    for line in [
        "PING",
        "INFO",
        "CLIENT LIST",
        "CLUSTER SLOTS",
        "CONFIG GET x",
        "MULTI",
        "EXEC",
        "SCAN 0",
        "KEYS *",
        "DBSIZE",
        "PUBLISH ch m",
        "FUNCTION LIST",
        "SCRIPT LOAD x",
    ] {
        assert!(keys(line).is_empty(), "{line}");
        assert!(known(line), "{line}");
    }
    assert!(keys("FOO.BAR k").is_empty());
    assert!(!known("FOO.BAR k"));
}

#[test]
fn numkeys_commands() {
    assert_eq!(keys("EVAL s 2 a b x"), ["a", "b"]);
    assert_eq!(keys("EVALSHA sha 0 x"), Vec::<String>::new());
    assert_eq!(keys("FCALL_RO f 1 a x"), ["a"]);
    assert_eq!(keys("ZUNIONSTORE d 2 a b WEIGHTS 1 2"), ["d", "a", "b"]);
    assert_eq!(keys("ZDIFFSTORE d 1 a"), ["d", "a"]);
    assert_eq!(keys("ZUNION 2 a b WITHSCORES"), ["a", "b"]);
    assert_eq!(keys("ZINTERCARD 2 a b LIMIT 1"), ["a", "b"]);
    assert_eq!(keys("SINTERCARD 1 a"), ["a"]);
    assert_eq!(keys("LMPOP 2 a b LEFT"), ["a", "b"]);
    assert_eq!(keys("BLMPOP 0 2 a b LEFT"), ["a", "b"]);
    assert_eq!(keys("BZMPOP 1.5 1 z MIN COUNT 2"), ["z"]);
    // Counts Redis would reject name no keys rather than arguments that are not keys.
    assert!(keys("EVAL s 5 a").is_empty());
    assert!(keys("EVAL s -1 a").is_empty());
    assert!(keys("EVAL s x a").is_empty());
    assert!(keys("EVAL").is_empty());
    assert!(keys("ZUNIONSTORE d 9 a").is_empty());
    assert!(keys("ZUNIONSTORE d 0").is_empty());
}

#[test]
fn xread_streams() {
    assert_eq!(keys("XREAD STREAMS a b 0 0"), ["a", "b"]);
    assert_eq!(keys("XREAD COUNT 2 BLOCK 0 STREAMS a $"), ["a"]);
    // A group and consumer named like the option do not fool the parser.
    assert_eq!(
        keys("XREADGROUP GROUP streams streams NOACK STREAMS s >"),
        ["s"]
    );
    assert_eq!(keys("XREAD STREAMS a b 0"), ["a"]);
    assert!(keys("XREAD STREAMS").is_empty());
    assert!(keys("XREAD BOGUS STREAMS a 0").is_empty());
}

#[test]
fn sort_georadius_migrate() {
    assert_eq!(keys("SORT l BY w_* GET o_* LIMIT 0 5 STORE d"), ["l", "d"]);
    assert_eq!(keys("SORT l GET store"), ["l"]);
    assert_eq!(keys("SORT l STORE a STORE b"), ["l", "b"]);
    assert_eq!(keys("SORT_RO l BY w_*"), ["l"]);
    assert_eq!(keys("GEORADIUS g 0 0 1 km STORE d"), ["g", "d"]);
    assert_eq!(
        keys("GEORADIUS g 0 0 1 km STORE a STOREDIST b"),
        ["g", "a", "b"]
    );
    assert_eq!(
        keys("GEORADIUS g 0 0 1 km STOREDIST b STORE a"),
        ["g", "a", "b"]
    );
    assert_eq!(keys("GEORADIUS g 0 0 1 km STORE"), ["g"]);
    assert_eq!(keys("GEORADIUSBYMEMBER g m 1 km STOREDIST d"), ["g", "d"]);
    assert_eq!(keys("GEORADIUS g 0 0 1 km"), ["g"]);
    assert_eq!(keys("MIGRATE h 6379 k 0 1000"), ["k"]);
    assert_eq!(
        keys("MIGRATE h 6379  0 1000 COPY AUTH keys KEYS a b"),
        ["a", "b"]
    );
    assert_eq!(keys("MIGRATE h 6379  0 1000 AUTH2 keys keys KEYS a"), ["a"]);
    assert!(keys("MIGRATE h 6379 k 0 1000 KEYS a").is_empty());
}

#[test]
fn the_common_writes_answer_as_the_table_does() {
    let mut answered = 0;
    for &(name, first, last, step) in KEYED {
        if let Some(p) = common(name.as_bytes()) {
            assert_eq!(p, (first, last, step), "{name}");
            answered += 1;
        }
    }
    for name in KEYLESS {
        assert_eq!(common(name.as_bytes()), None, "{name}");
    }
    // Every name `common` knows is in the table (a misspelt one would never answer).
    assert_eq!(answered, 35);
}
