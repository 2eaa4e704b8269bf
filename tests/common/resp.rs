//! RESP on the test side: the one reply scanner every client of the harness reads with,
//! request and reply encoders, a redis-cli-like command-line parser, and readable output for
//! assertion messages. Independent of corral's own codec on purpose.

/// Encodes a request as a RESP array of bulk strings.
pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    bulk_array(args)
}

/// Encodes the first command of a redis-cli-like line (see [`parse_commands`]).
pub fn encode_line(line: &str) -> Vec<u8> {
    let cmds = parse_commands(line);
    let first = cmds
        .first()
        .unwrap_or_else(|| panic!("no command in {line:?}"));
    encode(&argv(first))
}

/// Borrows owned arguments as the slices [`encode`] and `RawClient::request` take.
pub fn argv(args: &[Vec<u8>]) -> Vec<&[u8]> {
    args.iter().map(Vec::as_slice).collect()
}

/// Splits a command line on spaces into arguments.
pub fn words(line: &str) -> Vec<Vec<u8>> {
    line.split(' ').map(|w| w.as_bytes().to_vec()).collect()
}

/// RESP2 bulk string.
pub fn bulk(b: impl AsRef<[u8]>) -> Vec<u8> {
    let b = b.as_ref();
    let mut out = format!("${}\r\n", b.len()).into_bytes();
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
    out
}

/// RESP integer.
pub fn int(n: i64) -> Vec<u8> {
    format!(":{n}\r\n").into_bytes()
}

/// RESP2 array of bulk strings.
pub fn bulk_array<S: AsRef<[u8]>>(items: &[S]) -> Vec<u8> {
    aggregate(b'*', items)
}

/// An aggregate of kind `kind` (`*` array, `>` push, `~` set) holding bulk strings.
pub fn aggregate<S: AsRef<[u8]>>(kind: u8, items: &[S]) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend_from_slice(format!("{}\r\n", items.len()).as_bytes());
    for i in items {
        out.extend_from_slice(&bulk(i));
    }
    out
}

/// Shows reply bytes readably in assertion messages.
pub fn show(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    if s.len() > 300 {
        let head: String = s.chars().take(300).collect();
        format!("{head:?}... ({} bytes)", b.len())
    } else {
        format!("{s:?}")
    }
}

/// Whether `needle` occurs in `hay`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

/// Length of the first complete reply in `buf` (RESP2 or RESP3), `None` if incomplete. An
/// attribute (`|`) belongs to the reply that follows it; a push (`>`) counts as a reply.
/// Iterative, with an explicit count of elements still owed per open aggregate, so a reply
/// nested as deeply as Redis allows cannot overflow the test thread's stack.
pub fn resp_len(buf: &[u8]) -> Option<usize> {
    let mut pos = 0;
    let mut open: Vec<i64> = Vec::new();
    loop {
        let kind = *buf.get(pos)?;
        let eol = pos + buf[pos..].windows(2).position(|w| w == b"\r\n")?;
        let line = &buf[pos + 1..eol];
        let number = || -> i64 {
            std::str::from_utf8(line)
                .ok()
                .and_then(|l| l.parse().ok())
                .unwrap_or_else(|| panic!("bad length in reply {}", show(&buf[pos..])))
        };
        let next = eol + 2;
        // Where this element's own bytes end, and how many elements it opens.
        let (end, children) = match kind {
            b'+' | b'-' | b':' | b',' | b'(' | b'#' | b'_' => (next, 0),
            b'$' | b'!' | b'=' => match usize::try_from(number()) {
                Ok(n) if buf.len() < next + n + 2 => return None,
                Ok(n) if &buf[next + n..next + n + 2] != b"\r\n" => {
                    panic!("bulk reply without its CRLF: {}", show(&buf[pos..]))
                }
                Ok(n) => (next + n + 2, 0),
                Err(_) => (next, 0), // $-1
            },
            b'*' | b'~' | b'>' => (next, number().max(0)),
            b'%' => (next, 2 * number().max(0)),
            b'|' => (next, 2 * number().max(0) + 1),
            _ => panic!("not a RESP reply: {}", show(&buf[pos..])),
        };
        pos = end;
        if children > 0 {
            open.push(children);
            continue;
        }
        // One element done: close every aggregate it completes.
        loop {
            match open.last_mut() {
                None => return Some(pos),
                Some(left) => {
                    *left -= 1;
                    if *left > 0 {
                        break;
                    }
                    open.pop();
                }
            }
        }
    }
}

/// Splits concatenated replies into frames; panics on a trailing partial reply.
pub fn frames(mut bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while let Some(n) = resp_len(bytes) {
        out.push(&bytes[..n]);
        bytes = &bytes[n..];
    }
    assert!(bytes.is_empty(), "trailing partial reply: {}", show(bytes));
    out
}

/// What a reply stands for as an argument: a bulk string's content, a verbatim string's text
/// (its `txt:` prefix left out), an integer's digits; `None` for other replies.
pub fn payload(reply: &[u8]) -> Option<Vec<u8>> {
    let body_at = reply.windows(2).position(|w| w == b"\r\n")? + 2;
    match *reply.first()? {
        b'$' if body_at < reply.len() => Some(reply[body_at..reply.len() - 2].to_vec()),
        b'=' => Some(reply.get(body_at + 4..reply.len() - 2)?.to_vec()),
        b':' => Some(reply[1..body_at - 2].to_vec()),
        _ => None,
    }
}

/// The integer of an integer reply.
pub fn int_of(reply: &[u8]) -> Option<i64> {
    let digits = reply.strip_prefix(b":")?.strip_suffix(b"\r\n")?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// Blanks out the `id` field of a HELLO reply (a per-connection id that necessarily differs
/// between two servers).
pub fn mask_hello_id(reply: &[u8]) -> Vec<u8> {
    let key = b"$2\r\nid\r\n:";
    let Some(at) = reply.windows(key.len()).position(|w| w == key) else {
        return reply.to_vec();
    };
    let start = at + key.len();
    let end = start
        + reply[start..]
            .iter()
            .position(|&b| b == b'\r')
            .expect("id line end");
    [&reply[..start], b"<id>", &reply[end..]].concat()
}

/// Splits a redis-cli-like line into commands and arguments: arguments are separated by
/// spaces, commands by a `;` word, and "double quotes" group an argument, understanding the
/// escapes \n \r \t \xHH, and any other character escaped as itself (\" \\).
pub fn parse_commands(line: &str) -> Vec<Vec<Vec<u8>>> {
    let mut cmds = vec![Vec::new()];
    let mut chars = line.chars().peekable();
    let mut utf8 = [0u8; 4];
    loop {
        while chars.next_if_eq(&' ').is_some() {}
        let Some(&first) = chars.peek() else { break };
        let mut arg = Vec::new();
        if first == '"' {
            chars.next();
            loop {
                let c = match chars.next() {
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some('n') => '\n',
                        Some('r') => '\r',
                        Some('t') => '\t',
                        Some('x') => {
                            let hex: String = chars.by_ref().take(2).collect();
                            let byte = u8::from_str_radix(&hex, 16);
                            arg.push(byte.unwrap_or_else(|_| panic!("bad \\x in {line:?}")));
                            continue;
                        }
                        Some(c) => c,
                        None => panic!("dangling escape in {line:?}"),
                    },
                    Some(c) => c,
                    None => panic!("unbalanced quotes in {line:?}"),
                };
                arg.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
            }
        } else {
            while let Some(c) = chars.next_if(|&c| c != ' ') {
                arg.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
            }
            if arg == b";" {
                cmds.push(Vec::new());
                continue;
            }
        }
        cmds.last_mut().expect("a command").push(arg);
    }
    cmds.retain(|c| !c.is_empty());
    cmds
}

/// The text of a bulk-string or simple-string reply (INFO, CLUSTER INFO, CLUSTER NODES).
pub fn reply_text(reply: &[u8]) -> String {
    match redis_protocol::resp2::decode::decode(reply) {
        Ok(Some((redis_protocol::resp2::types::OwnedFrame::BulkString(b), _)))
        | Ok(Some((redis_protocol::resp2::types::OwnedFrame::SimpleString(b), _))) => {
            String::from_utf8_lossy(&b).into_owned()
        }
        _ => panic!("not a string reply: {}", show(reply)),
    }
}
