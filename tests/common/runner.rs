//! Runs a script against one side, recording every reply, message and push its clients get.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::client::{RawClient, connect};
use super::resp::{argv, encode, mask_hello_id, payload, show};
use super::script::{Mode, Op, Options, Reply, Side, Step, replies_expected, show_cmd};
use super::wait::Deadline;

/// Bounds every wait for a server-side state change.
const LIMIT: Duration = Duration::from_secs(10);

/// Reply of the `ECHO` that ends a `~` step.
const MARKER: &[u8] = b"$7\r\n~marker\r\n";

/// Request bytes, and per reply expected: its label and whether it answers a HELLO.
struct Encoded {
    bytes: Vec<u8>,
    labels: Vec<(String, bool)>,
}

/// Runs a script against one side.
pub(super) struct Runner {
    side: Side,
    opts: Options,
    clients: BTreeMap<char, RawClient>,
    saved: HashMap<String, Vec<u8>>,
    /// Labels of the replies each client still owes (`X>` steps).
    pending: HashMap<char, Vec<(String, bool)>>,
    admin: Option<RawClient>,
    pub(super) replies: Vec<Reply>,
}

impl Runner {
    pub(super) fn new(side: Side, opts: Options) -> Runner {
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

    pub(super) async fn run(&mut self, steps: &[Step]) {
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
    pub(super) async fn end(&mut self) {
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
