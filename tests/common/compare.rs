//! The one runner for "these commands against Redis and against corral, replies compared byte
//! for byte": a script of a few clients (A, B, C...) taking turns runs on a [`Side`] reached
//! directly and on one behind corral, and every reply, message and push each client receives
//! must be the same bytes in the same order.
//!
//! Script lines (see [`Step::parse`]):
//! - `A: CMD args ; CMD args` sends the commands in one write and reads their replies: one
//!   each, and one per name for the (P|S)(UN)SUBSCRIBE family. `=> name` at the end saves the
//!   last reply's payload (bulk content or integer) for a later `@name` argument; `#tag` marks
//!   the step's last reply for the test's own assertions, and `#any` compares only its type
//!   (for ids).
//! - `A! CMD args` sends a command and reads nothing (CLIENT REPLY OFF/SKIP have no reply).
//! - `A> CMD args` sends a command that must block: the step waits until the side's Redis
//!   counts one more blocked client. `A<` reads its replies later; with nothing pending, `A<`
//!   reads one frame nobody asked for (a message, a redirected invalidation).
//! - `A~ CMD ; CMD` sends commands whose replies may be suppressed (CLIENT REPLY), then a
//!   marker `ECHO`, and records everything received up to the marker's reply.
//! - `A: !closed` records what arrives until the server closes A's connection, and whether it
//!   did.
//! - `@addr:X` is client X's address as the server sees it.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use super::client::{RawClient, connect};
use super::resp::{argv, encode, encode_line, mask_hello_id, payload, show};
use super::wait::Deadline;

/// Bounds every wait for a server-side state change.
const LIMIT: Duration = Duration::from_secs(10);

/// Where a script's clients connect, and the Redis server that finally runs their commands
/// (asked directly about blocked clients; `Options::direct` clients connect to it).
#[derive(Debug, Clone, Copy)]
pub struct Side {
    pub name: &'static str,
    pub entry: SocketAddr,
    pub server: SocketAddr,
}

/// How `X:` steps are written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// One write per step.
    OneByOne,
    /// Consecutive steps of one client in one write (up to one whose reply is saved).
    Pipelined,
}

/// How a script runs and what is compared.
#[derive(Clone, Copy)]
pub struct Options {
    /// Every client starts with `HELLO 3` (its reply is compared, the id masked).
    pub resp3: bool,
    pub mode: Mode,
    /// Each side is emptied first: all databases, scripts and functions (through its entry,
    /// so corral's cache sees the flush too).
    pub wipe: bool,
    /// Every client still open at the end sends a PING: a frame delivered once too often (or
    /// to a client that should not get it) shows up there as a difference.
    pub end_ping: bool,
    /// A `:` step also reads and records the pushes that come before each reply (CLIENT
    /// TRACKING invalidations), up to the reply.
    pub pushes_first: bool,
    /// Clients (by letter) connected straight to the side's Redis instead of its entry: writes
    /// made by another application.
    pub direct: &'static str,
    /// Applied to every reply before it is recorded, to blank out what necessarily differs
    /// between two servers (HELLO's id is always blanked out).
    pub mask: fn(&[u8]) -> Vec<u8>,
}

impl Options {
    /// One write per step, nothing else, in RESP3 or RESP2.
    pub fn resp(resp3: bool) -> Options {
        Options {
            resp3,
            mode: Mode::OneByOne,
            wipe: false,
            end_ping: false,
            pushes_first: false,
            direct: "",
            mask: <[u8]>::to_vec,
        }
    }

    fn proto(&self) -> &'static str {
        if self.resp3 { "RESP3" } else { "RESP2" }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    /// `X:` send and read.
    Call,
    /// `X!` send only.
    Send,
    /// `X>` send a command that blocks.
    Block,
    /// `X<` read a blocked client's replies, or one frame.
    Collect,
    /// `X~` send, then read up to a marker.
    Silent,
    /// `X: !closed`
    Closed,
}

/// One line of a script.
pub struct Step {
    who: char,
    op: Op,
    cmds: Vec<Vec<Vec<u8>>>,
    save: Option<String>,
    tag: Option<String>,
    /// Arguments are sent as they are (no `@` placeholders).
    literal: bool,
}

impl Step {
    /// Parses a script line (see the module's documentation).
    pub fn parse(line: &str) -> Step {
        let mut chars = line.chars();
        let (who, op) = (chars.next().expect("client"), chars.next().expect("op"));
        let mut rest = chars.as_str().trim();
        let mut tag = None;
        let split = match rest.strip_prefix('#') {
            Some(t) => Some(("", t)),
            None => rest.rsplit_once(" #"),
        };
        if let Some((before, t)) = split
            && !t.contains([' ', '"'])
        {
            tag = Some(t.to_string());
            rest = before.trim();
        }
        let mut save = None;
        if let Some((before, name)) = rest.rsplit_once(" => ") {
            save = Some(name.to_string());
            rest = before;
        }
        let op = match (op, rest) {
            (':', "!closed") => Op::Closed,
            (':', _) => Op::Call,
            ('!', _) => Op::Send,
            ('>', _) => Op::Block,
            ('<', _) => Op::Collect,
            ('~', _) => Op::Silent,
            _ => panic!("bad script line {line:?}"),
        };
        Step {
            who,
            op,
            cmds: super::resp::parse_commands(rest),
            save,
            tag,
            literal: false,
        }
    }

    /// `who: args`, the arguments sent exactly as given.
    pub fn call(who: char, args: Vec<Vec<u8>>) -> Step {
        Step {
            who,
            op: Op::Call,
            cmds: vec![args],
            save: None,
            tag: None,
            literal: true,
        }
    }
}

/// Parses every line of a script.
pub fn steps(script: &[&str]) -> Vec<Step> {
    script.iter().map(|l| Step::parse(l)).collect()
}

/// One reply (or message, push, or end of connection) a script received.
#[derive(Debug, Clone)]
pub struct Reply {
    pub label: String,
    pub tag: Option<String>,
    pub bytes: Vec<u8>,
}

impl Reply {
    /// A reply recorded by a test of its own, untagged.
    pub fn new(label: impl Into<String>, bytes: Vec<u8>) -> Reply {
        Reply {
            label: label.into(),
            tag: None,
            bytes,
        }
    }
}

/// The reply tagged `tag`.
pub fn tagged<'a>(replies: &'a [Reply], tag: &str) -> &'a [u8] {
    let r = replies.iter().find(|r| r.tag.as_deref() == Some(tag));
    &r.unwrap_or_else(|| panic!("no reply tagged {tag}")).bytes
}

/// Runs `steps` on both sides (Redis first) and asserts that they received the same bytes,
/// in order. Returns (Redis's replies, corral's replies).
pub async fn compare(
    sides: [Side; 2],
    name: &str,
    steps: &[Step],
    opts: Options,
) -> [Vec<Reply>; 2] {
    let mut results = Vec::new();
    for side in sides {
        if opts.wipe {
            wipe(side).await;
        }
        let mut r = Runner::new(side, opts);
        r.run(steps).await;
        r.end().await;
        results.push(r.replies);
    }
    let proxied = results.pop().expect("corral's replies");
    let direct = results.pop().expect("redis's replies");
    let what = format!("script {name} ({}, {:?})", opts.proto(), opts.mode);
    assert_same(&what, &direct, &proxied);
    [direct, proxied]
}

/// Asserts that Redis's and corral's replies have the same labels and bytes, in order.
pub fn assert_same(what: &str, direct: &[Reply], proxied: &[Reply]) {
    let mismatches: Vec<String> = direct
        .iter()
        .zip(proxied)
        .enumerate()
        .filter(|(_, (d, p))| d.bytes != p.bytes || d.label != p.label)
        .map(|(i, (d, p))| {
            format!(
                "#{i} `{}`\n   redis: {}\n  corral: {}",
                d.label,
                show(&d.bytes),
                show(&p.bytes)
            )
        })
        .collect();
    assert!(
        mismatches.is_empty(),
        "{what}: {} replies differ:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    assert_eq!(direct.len(), proxied.len(), "{what}: reply count");
}

/// [`compare`] on script lines.
pub async fn check(
    sides: [Side; 2],
    name: &str,
    script: &[&str],
    opts: Options,
) -> [Vec<Reply>; 2] {
    compare(sides, name, &steps(script), opts).await
}

/// Runs each named script in RESP2 and RESP3, with `opts` otherwise.
pub async fn check_all(sides: [Side; 2], scripts: &[(&str, &[&str])], opts: Options) {
    for (name, script) in scripts {
        for resp3 in [false, true] {
            check(sides, name, script, Options { resp3, ..opts }).await;
        }
    }
}

/// Empties a side: all databases, scripts and functions.
async fn wipe(side: Side) {
    let mut c = connect(side.entry).await;
    for line in ["FLUSHALL", "FUNCTION FLUSH", "SCRIPT FLUSH"] {
        c.send(&encode_line(line)).await;
        let r = c.read_reply().await;
        assert_eq!(show(&r), show(b"+OK\r\n"), "{} {line}", side.name);
    }
}

/// Replies a command gets: one per name for the (P|S)(UN)SUBSCRIBE family, and one (an arity
/// error, or a nil name when there is nothing to unsubscribe from) without names. An
/// argument-less UNSUBSCRIBE with several subscriptions would get one per subscription, in
/// hash order: scripts only use it with at most one, or read the rest with `<`.
fn replies_expected(cmd: &[Vec<u8>]) -> usize {
    let name = String::from_utf8_lossy(&cmd[0]).to_ascii_uppercase();
    let family = ["SUBSCRIBE", "UNSUBSCRIBE"].iter().any(|verb| {
        name.strip_suffix(verb)
            .is_some_and(|p| ["", "P", "S"].contains(&p))
    });
    if family { (cmd.len() - 1).max(1) } else { 1 }
}

fn show_cmd(cmd: &[Vec<u8>]) -> String {
    let words: Vec<String> = cmd
        .iter()
        .map(|a| String::from_utf8_lossy(&a[..a.len().min(50)]).into_owned())
        .collect();
    let s = words.join(" ");
    if s.chars().count() > 200 {
        let head: String = s.chars().take(200).collect();
        format!("{head}... ({} args)", cmd.len())
    } else {
        s
    }
}

/// Reply of the `ECHO` that ends a `~` step.
const MARKER: &[u8] = b"$7\r\n~marker\r\n";

/// Request bytes, and per reply expected: its label and whether it answers a HELLO.
struct Encoded {
    bytes: Vec<u8>,
    labels: Vec<(String, bool)>,
}

/// Runs a script against one side.
struct Runner {
    side: Side,
    opts: Options,
    clients: BTreeMap<char, RawClient>,
    saved: HashMap<String, Vec<u8>>,
    /// Labels of the replies each client still owes (`X>` steps).
    pending: HashMap<char, Vec<(String, bool)>>,
    admin: Option<RawClient>,
    replies: Vec<Reply>,
}

impl Runner {
    fn new(side: Side, opts: Options) -> Runner {
        Runner {
            side,
            opts,
            clients: BTreeMap::new(),
            saved: HashMap::new(),
            pending: HashMap::new(),
            admin: None,
            replies: Vec::new(),
        }
    }

    /// Client `who`, connected (and switched to RESP3, the reply recorded) on first use.
    async fn client(&mut self, who: char) -> &mut RawClient {
        if !self.clients.contains_key(&who) {
            let direct = self.opts.direct.contains(who);
            let mut c = connect(if direct {
                self.side.server
            } else {
                self.side.entry
            })
            .await;
            if self.opts.resp3 {
                c.send(&encode(&[b"HELLO", b"3"])).await;
                let r = c.read_reply().await;
                self.record(format!("{who}: HELLO 3"), None, mask_hello_id(&r));
            }
            self.clients.insert(who, c);
        }
        self.clients.get_mut(&who).expect("just connected")
    }

    fn record(&mut self, label: String, tag: Option<String>, bytes: Vec<u8>) {
        let mut bytes = (self.opts.mask)(&bytes);
        if tag.as_deref() == Some("any") {
            // Differs between two servers by nature (an id): only its type is compared.
            bytes.truncate(1);
            bytes.extend_from_slice(b"<any>");
        }
        self.replies.push(Reply { label, tag, bytes });
    }

    /// Records one reply to a request, HELLO's id blanked out.
    fn record_reply(&mut self, (label, hello): (String, bool), tag: Option<String>, r: Vec<u8>) {
        let r = if hello { mask_hello_id(&r) } else { r };
        self.record(label, tag, r);
    }

    /// Replaces `@name` and `@addr:X` arguments.
    async fn resolve(&mut self, cmd: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let mut out = Vec::with_capacity(cmd.len());
        for arg in cmd {
            let Some(name) = arg.strip_prefix(b"@") else {
                out.push(arg.clone());
                continue;
            };
            let name = String::from_utf8_lossy(name).into_owned();
            if let Some(who) = name.strip_prefix("addr:") {
                let who = who.chars().next().expect("client letter");
                let addr = self.client(who).await.stream.local_addr().expect("addr");
                out.push(addr.to_string().into_bytes());
            } else {
                let v = self.saved.get(&name);
                out.push(
                    v.unwrap_or_else(|| panic!("nothing saved as {name}"))
                        .clone(),
                );
            }
        }
        out
    }

    /// Encodes a step's commands (placeholders resolved) into one write, labelled `{who}{op}`.
    async fn encode_step(&mut self, step: &Step, op: char, cmds: &[Vec<Vec<u8>>]) -> Encoded {
        let mut out = Encoded {
            bytes: Vec::new(),
            labels: Vec::new(),
        };
        for cmd in cmds {
            let args = if step.literal {
                cmd.clone()
            } else {
                self.resolve(cmd).await
            };
            out.bytes.extend_from_slice(&encode(&argv(&args)));
            let label = format!("{}{op} {}", step.who, show_cmd(cmd));
            let hello = cmd[0].eq_ignore_ascii_case(b"HELLO");
            for _ in 0..replies_expected(cmd) {
                out.labels.push((label.clone(), hello));
            }
        }
        out
    }

    /// Reads one reply of client `who`; a failure names the side and the request.
    async fn read(&mut self, who: char, label: &str) -> Vec<u8> {
        let side = self.side.name;
        let c = self.client(who).await;
        c.try_read_reply()
            .await
            .unwrap_or_else(|e| panic!("{side}: reply to `{label}`: {e}"))
    }

    async fn run(&mut self, steps: &[Step]) {
        let mut i = 0;
        while i < steps.len() {
            let step = &steps[i];
            if step.op != Op::Call {
                self.step(step).await;
                i += 1;
                continue;
            }
            // Pipelined: this step and the following ones of the same client, up to one whose
            // reply is saved for later steps.
            let mut n = 1;
            while self.opts.mode == Mode::Pipelined
                && steps[i + n - 1].save.is_none()
                && steps
                    .get(i + n)
                    .is_some_and(|s| s.who == step.who && s.op == Op::Call)
            {
                n += 1;
            }
            self.call(&steps[i..i + n]).await;
            i += n;
        }
        for (who, labels) in &self.pending {
            assert!(labels.is_empty(), "{who} still owes replies to {labels:?}");
        }
    }

    /// `X:` steps of one client, sent in one write.
    async fn call(&mut self, group: &[Step]) {
        let who = group[0].who;
        let mut bytes = Vec::new();
        let mut labels = Vec::new();
        for s in group {
            let e = self.encode_step(s, ':', &s.cmds).await;
            bytes.extend_from_slice(&e.bytes);
            // A tag belongs to the step's last reply.
            let last = e.labels.len() - 1;
            let tags = (0..e.labels.len()).map(|i| s.tag.clone().filter(|_| i == last));
            labels.extend(e.labels.into_iter().zip(tags));
        }
        let mut got = Vec::with_capacity(labels.len());
        if self.opts.pushes_first {
            self.client(who).await.send(&bytes).await;
            for (label, tag) in labels {
                loop {
                    let r = self.read(who, &label.0).await;
                    let push = r.first() == Some(&b'>');
                    got.push((label.clone(), tag.clone().filter(|_| !push), r));
                    if !push {
                        break;
                    }
                }
            }
        } else {
            let side = self.side.name;
            let c = self.client(who).await;
            let replies = c.try_pipeline(&bytes, bytes.len(), labels.len()).await;
            let replies = replies
                .unwrap_or_else(|(i, e)| panic!("{side}: reply to `{}`: {e}", labels[i].0.0));
            for ((label, tag), r) in labels.into_iter().zip(replies) {
                got.push((label, tag, r));
            }
        }
        if let Some(name) = &group[group.len() - 1].save {
            let last = &got.last().expect("a reply").2;
            let p = payload(last).unwrap_or_else(|| panic!("cannot save {}", show(last)));
            self.saved.insert(name.clone(), p);
        }
        for (label, tag, r) in got {
            self.record_reply(label, tag, r);
        }
    }

    /// A step other than `X:`.
    async fn step(&mut self, step: &Step) {
        let who = step.who;
        match step.op {
            Op::Call => unreachable!("calls run in groups"),
            Op::Send => {
                let e = self.encode_step(step, '!', &step.cmds).await;
                self.client(who).await.send(&e.bytes).await;
            }
            Op::Block => {
                let before = self.blocked_clients().await;
                let e = self.encode_step(step, '>', &step.cmds).await;
                self.client(who).await.send(&e.bytes).await;
                self.pending.entry(who).or_default().extend(e.labels);
                let deadline = Deadline::new(LIMIT, "a command to block");
                while self.blocked_clients().await != before + 1 {
                    deadline.pause().await;
                }
            }
            Op::Collect => {
                let labels = self.pending.remove(&who).unwrap_or_default();
                if labels.is_empty() {
                    let label = format!("{who}<");
                    let r = self.read(who, &label).await;
                    self.record(label, step.tag.clone(), r);
                    return;
                }
                let last = labels.len() - 1;
                for (i, label) in labels.into_iter().enumerate() {
                    let r = self.read(who, &label.0).await;
                    self.record_reply(label, step.tag.clone().filter(|_| i == last), r);
                }
            }
            Op::Silent => self.silent(step).await,
            Op::Closed => {
                let (rest, closed) = self.client(who).await.rest_until_closed().await;
                let what: &[u8] = if closed { b"<closed>" } else { b"<open>" };
                self.record(format!("{who}: !closed"), None, [&rest, what].concat());
                self.clients.remove(&who);
            }
        }
    }

    /// `X~`: commands whose replies may be suppressed, then a marker.
    async fn silent(&mut self, step: &Step) {
        let mut writes = Vec::new();
        let mut labels = Vec::new();
        for cmd in &step.cmds {
            let e = self.encode_step(step, '~', std::slice::from_ref(cmd)).await;
            writes.push(e.bytes);
            labels.push(e.labels[0].0.clone());
        }
        if self.opts.mode == Mode::Pipelined {
            writes = vec![writes.concat()];
        }
        let c = self.client(step.who).await;
        for w in writes {
            c.send(&w).await;
        }
        c.send(&encode(&[b"ECHO", b"~marker"])).await;
        let mut got = Vec::new();
        let label = labels.join(" ; ");
        loop {
            let r = self.read(step.who, &label).await;
            if r == MARKER {
                break;
            }
            got.extend_from_slice(&r);
        }
        self.record(label, step.tag.clone(), got);
    }

    /// `blocked_clients` of the side's Redis.
    async fn blocked_clients(&mut self) -> usize {
        if self.admin.is_none() {
            self.admin = Some(connect(self.side.server).await);
        }
        blocked_clients(self.admin.as_mut().expect("just connected")).await
    }

    /// The end of a script: a PING from every client still open, if asked for.
    async fn end(&mut self) {
        if !self.opts.end_ping {
            return;
        }
        let who: Vec<char> = self.clients.keys().copied().collect();
        for w in who {
            let label = format!("{w}: PING (end of script)");
            let c = self.client(w).await;
            c.send(&encode(&[b"PING"])).await;
            let r = self.read(w, &label).await;
            self.record(label, None, r);
        }
    }
}

/// `blocked_clients` from the INFO of the server `admin` is connected to.
pub async fn blocked_clients(admin: &mut RawClient) -> usize {
    let info = admin.request(&[b"INFO", b"clients"]).await;
    let text = String::from_utf8_lossy(&payload(&info).unwrap_or_default()).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no blocked_clients in {}", show(&info)))
}
