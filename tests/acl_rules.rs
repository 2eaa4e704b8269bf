//! corral's ACL rules decide as Redis does: every command and subcommand Redis knows is put
//! to `ACL DRYRUN` on a real redis-server with the same rules, and to corral's check.

mod common;

use common::{RedisServer, connect};
use corral::acl::table::COMMANDS;
use corral::acl::{User, UserSpec};

/// A request for `name` (`container|sub`) with as many arguments as its arity asks.
fn request(name: &str, arity: i32) -> Vec<Vec<u8>> {
    let mut argv: Vec<Vec<u8>> = name.split('|').map(|p| p.as_bytes().to_vec()).collect();
    while (argv.len() as i32) < arity.abs() {
        // Numbers keep commands like EVAL (numkeys) or OBJECT FREQ parseable.
        argv.push(b"1".to_vec());
    }
    argv
}

#[tokio::test]
async fn command_rules_match_acl_dryrun() {
    let redis = RedisServer::start();
    let mut c = connect(redis.addr()).await;
    let rule_sets = [
        "+@read",
        "+@all -@dangerous",
        "+@read +@write -@keyspace +del",
        "+@all -config +config|get -@scripting",
        "-@all +@hash +@string -@slow",
        "+@admin -acl|setuser",
        "+@pubsub +@connection +@transaction -@blocking",
    ];
    let mut compared = 0;
    for rules in rule_sets {
        let mut setuser: Vec<&[u8]> = vec![
            b"ACL",
            b"SETUSER",
            b"u",
            b"reset",
            b"on",
            b"nopass",
            b"allkeys",
            b"allchannels",
        ];
        setuser.extend(rules.split_whitespace().map(str::as_bytes));
        assert_eq!(c.request(&setuser).await, b"+OK\r\n", "{rules}");
        let spec = UserSpec {
            name: "u".into(),
            rules: format!("nopass allkeys allchannels {rules}"),
            ..UserSpec::default()
        };
        let user = User::from_spec(&spec).unwrap_or_else(|e| panic!("{rules}: {e}"));
        for (name, arity, _) in COMMANDS {
            if corral::acl::is_container(name) {
                continue;
            }
            let argv = request(name, *arity);
            let mut dry: Vec<&[u8]> = vec![b"ACL", b"DRYRUN", b"u"];
            dry.extend(argv.iter().map(Vec::as_slice));
            let reply = c.request(&dry).await;
            let args: Vec<&[u8]> = argv.iter().map(Vec::as_slice).collect();
            let ours = user.check_command(&args);
            if reply.starts_with(b"-") {
                // Redis could not even look at it (arity, syntax): not a permission matter.
                continue;
            }
            let redis_allows = reply == b"+OK\r\n";
            assert_eq!(
                ours.is_ok(),
                redis_allows,
                "rules '{rules}', {name}: redis {}",
                String::from_utf8_lossy(&reply)
            );
            if let Err(denied) = ours {
                // DRYRUN's text is the reply's without "-NOPERM " and with a capital T.
                let text = String::from_utf8_lossy(&denied.reply()).into_owned();
                let body = text.trim_start_matches("-NOPERM t").trim_end();
                assert!(
                    String::from_utf8_lossy(&reply).contains(body),
                    "{name}: {body} vs {}",
                    String::from_utf8_lossy(&reply)
                );
            }
            compared += 1;
        }
    }
    assert!(compared > 1000, "only {compared} commands compared");
}

#[tokio::test]
async fn key_and_channel_rules_match_acl_dryrun() {
    let redis = RedisServer::start();
    let mut c = connect(redis.addr()).await;
    let rules = "+@all ~cache:* ~s?ss[io]on &news.*";
    let mut setuser: Vec<&[u8]> = vec![b"ACL", b"SETUSER", b"u", b"reset", b"on", b"nopass"];
    setuser.extend(rules.split_whitespace().map(str::as_bytes));
    assert_eq!(c.request(&setuser).await, b"+OK\r\n");
    let spec = UserSpec {
        name: "u".into(),
        rules: format!("nopass {rules}"),
        ..UserSpec::default()
    };
    let user = User::from_spec(&spec).unwrap_or_else(|e| panic!("{e}"));
    for key in [
        "cache:1", "cache:", "other", "session", "sesson", "sess", "CACHE:1",
    ] {
        let reply = c
            .request(&[b"ACL", b"DRYRUN", b"u", b"GET", key.as_bytes()])
            .await;
        let ours = user.check_keys([key.as_bytes()].into_iter());
        assert_eq!(
            ours.is_ok(),
            reply == b"+OK\r\n",
            "key {key}: {}",
            String::from_utf8_lossy(&reply)
        );
    }
    for (cmd, channel, pattern) in [
        ("PUBLISH", "news.tech", false),
        ("PUBLISH", "sport", false),
        ("SUBSCRIBE", "news.x", false),
        ("PSUBSCRIBE", "news.*", true),
        ("PSUBSCRIBE", "news.t*", true),
    ] {
        let mut dry: Vec<&[u8]> = vec![b"ACL", b"DRYRUN", b"u", cmd.as_bytes(), channel.as_bytes()];
        if cmd == "PUBLISH" {
            dry.push(b"m");
        }
        let reply = c.request(&dry).await;
        let ours = user.check_channels([channel.as_bytes()].into_iter(), pattern);
        assert_eq!(
            ours.is_ok(),
            reply == b"+OK\r\n",
            "{cmd} {channel}: {}",
            String::from_utf8_lossy(&reply)
        );
    }
}
