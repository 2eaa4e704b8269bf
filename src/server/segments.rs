//! Writing the segments of a gathered job (`gather.rs`): each takes the job's next replies,
//! as many as its run had requests, from the parts the connection hands over as they
//! arrive. The job's written keys are invalidated again as each part arrives (the part
//! holding a write's acknowledgement came after Redis ran it) and after each redirection
//! followed (a redirected write runs where it is retried); their holds are released once
//! the job's last segment is written.

use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::oneshot;

use super::cache_reply::Merge;
use super::client::Conn;
use super::pending::{AfterAck, Between, Effect};
use crate::cluster::Redirect;
use crate::error::UpstreamError;
use crate::tls::Stream;
use crate::upstream::{JobResult, Reply, STREAM_PART, UpstreamConn};

/// A gathered job sent, and how far its segments have taken its replies.
pub(super) struct SentJob {
    /// Where its first part (or all of its replies) arrives, until it has.
    first: Option<oneshot::Receiver<Reply>>,
    /// Where its later parts arrive, if they come in parts.
    rest: Option<UnboundedReceiver<JobResult>>,
    /// The part being taken from, and how far.
    part: Bytes,
    at: usize,
    conn: UpstreamConn,
    after: AfterAck,
    /// Each request and its slot, to follow redirections.
    cmds: Vec<(Bytes, Option<u16>)>,
    /// Replies written so far.
    done: u32,
    count: u32,
    /// The error that ended its replies: it answers those that did not come.
    failed: Option<UpstreamError>,
    /// Cache replies that rode in the job, written between its replies.
    merge: Merge,
}

impl SentJob {
    /// A job of `count` requests (`cmds`) sent on `conn`, its replies arriving at `rx`.
    pub(super) fn new(
        rx: oneshot::Receiver<Reply>,
        count: u32,
        conn: UpstreamConn,
        after: AfterAck,
        cmds: Vec<(Bytes, Option<u16>)>,
        interleaved: Between,
    ) -> SentJob {
        // A request added without its slot (one corral answers through Redis in cluster
        // mode, CLIENT CACHING without tracking) leaves the list short of the job: a
        // redirection is then passed on as it came rather than retried as another request.
        let cmds = if cmds.len() == count as usize {
            cmds
        } else {
            Vec::new()
        };
        SentJob {
            first: Some(rx),
            rest: None,
            part: Bytes::new(),
            at: 0,
            conn,
            after,
            cmds,
            done: 0,
            count,
            failed: None,
            merge: Merge::new(interleaved),
        }
    }
}

/// A redirection among a job's replies, where its frame ends in the part.
struct Redirected {
    redirect: Redirect,
    end: usize,
}

impl Conn {
    /// Writes the next `count` replies of gathered job `job`; the buffer goes out to
    /// `client` each time it holds [`STREAM_PART`] bytes.
    pub(super) async fn resolve_segment(
        &mut self,
        job: u32,
        count: u32,
        client: &mut Stream,
    ) -> Option<Effect> {
        // The table is taken out while the job is written, so that the job is not moved
        // out of it and back for every segment.
        let mut jobs = std::mem::take(&mut self.gather.jobs);
        let slot = jobs.get_mut(job as usize);
        let effect = if let Some(slot) = slot
            && let Some(j) = slot.as_mut()
        {
            let effect = self.write_segment(j, count, client).await;
            if j.done >= j.count || effect.is_some() {
                self.writes.recycle(std::mem::take(&mut j.after.writes));
                *slot = None;
            }
            effect
        } else {
            // Every job is sent before its round's replies are collected.
            let lost = UpstreamError::BadReply {
                cause: "reply of a gathered batch lost".into(),
            };
            self.upstream_error(&lost, count);
            None
        };
        self.gather.jobs = jobs;
        effect
    }

    /// Writes the next `count` replies of job `j` (see [`Conn::resolve_segment`]).
    async fn write_segment(
        &mut self,
        j: &mut SentJob,
        count: u32,
        client: &mut Stream,
    ) -> Option<Effect> {
        let mut left = count;
        loop {
            // The cache replies that came before the next reply, or after the run's last.
            self.merge_due(&mut j.merge, j.done).await;
            if left == 0 {
                break;
            }
            // Replies up to the next cache reply (one at least: those due are written).
            let upto = j
                .merge
                .next_before()
                .map_or(left, |b| b.saturating_sub(j.done).clamp(1, left));
            if let Some(e) = &j.failed {
                let e = e.clone();
                self.upstream_error(&e, upto);
                j.done += upto;
                left -= upto;
                continue;
            }
            let (written, redirected) = self.copy_replies(j, upto);
            left -= written;
            if let Some(Redirected { redirect, end }) = redirected {
                let reply = match j.cmds.get(j.done as usize) {
                    Some((cmd, slot)) => self.retry(cmd, *slot, redirect, &j.conn).await,
                    None => j.part.slice(j.at..end),
                };
                self.wbuf.extend_from_slice(&reply);
                self.invalidate_after(&j.after);
                j.at = end;
                j.done += 1;
                left -= 1;
                continue;
            }
            if written == upto {
                continue;
            }
            if self.wbuf.len() >= STREAM_PART {
                if !matches!(self.send_replies(client).await, Ok(true)) {
                    return Some(Effect::Gone);
                }
                self.wbuf.clear();
            }
            self.next_part(j).await;
        }
        None
    }

    /// Copies up to `want` of the job's replies from its part (with the pushes before
    /// them), stopping at a redirection; returns how many it copied, and the redirection.
    fn copy_replies(&mut self, j: &mut SentJob, want: u32) -> (u32, Option<Redirected>) {
        let rest = &j.part[j.at..];
        let (end, n, redirected) = replies_upto(rest, want);
        self.wbuf.extend_from_slice(&rest[..end]);
        let redirected = redirected.map(|(redirect, end)| Redirected {
            redirect,
            end: j.at + end,
        });
        j.at += end;
        j.done += n;
        (n, redirected)
    }

    /// Waits for the job's next part (its replies, whole, if they came so); an incomplete
    /// frame left at the end of the last one is kept before it.
    async fn next_part(&self, j: &mut SentJob) {
        let next = if let Some(rx) = j.first.take() {
            match self.wait_for(rx, &j.conn).await {
                Ok(Ok(Reply::Whole(r))) => r,
                Ok(Ok(Reply::Parts(first, rest))) => {
                    j.rest = Some(rest);
                    Ok(first)
                }
                Ok(Err(_)) => Err(UpstreamError::ShuttingDown),
                Err(e) => Err(e),
            }
        } else if let Some(rest) = &mut j.rest {
            match self.wait_for(rest.recv(), &j.conn).await {
                Ok(Some(r)) => r,
                Ok(None) => Err(missing()),
                Err(e) => Err(e),
            }
        } else {
            Err(missing())
        };
        // Whatever the outcome, the writes may have run.
        self.invalidate_after(&j.after);
        match next {
            Ok(b) if j.at < j.part.len() => {
                let mut joined = BytesMut::from(&j.part[j.at..]);
                joined.extend_from_slice(&b);
                j.part = joined.freeze();
                j.at = 0;
            }
            Ok(b) => {
                j.part = b;
                j.at = 0;
            }
            Err(e) => j.failed = Some(e),
        }
    }
}

/// Where the first `want` replies at the start of `part` end (pushes before them count
/// with them, not as replies), how many complete ones it holds up to there, and the
/// first redirection among them with where its frame ends: the replies before it are
/// taken, it is not.
fn replies_upto(part: &[u8], want: u32) -> (usize, u32, Option<(Redirect, usize)>) {
    let mut frames = crate::resp::frames(part);
    let (mut end, mut n) = (0, 0);
    while n < want {
        let Some(f) = frames.next() else { break };
        if !f.push
            && f.bytes.first() == Some(&b'-')
            && let Some(redirect) = Redirect::parse(f.bytes)
        {
            return (end, n, Some((redirect, f.end())));
        }
        end = f.end();
        n += u32::from(!f.push);
    }
    (end, n, None)
}

/// The error for replies a job's connection never handed over.
fn missing() -> UpstreamError {
    UpstreamError::BadReply {
        cause: "missing reply in batch".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::replies_upto;

    #[test]
    fn replies_are_counted_past_pushes_up_to_the_first_redirection() {
        let part = b">2\r\n$7\r\nmessage\r\n$1\r\nx\r\n+OK\r\n$1\r\na\r\n-ERR no\r\n";
        // The push goes with the reply after it; three replies asked, three taken.
        let (end, n, redirect) = replies_upto(part, 3);
        assert_eq!((end, n, redirect.is_none()), (part.len(), 3, true));
        // Fewer asked: the later ones are left for the next segment.
        let (end, n, _) = replies_upto(part, 1);
        assert_eq!(&part[..end], b">2\r\n$7\r\nmessage\r\n$1\r\nx\r\n+OK\r\n");
        assert_eq!(n, 1);

        let moved = b"+OK\r\n-MOVED 12182 127.0.0.1:7001\r\n:1\r\n";
        let (end, n, redirect) = replies_upto(moved, 3);
        assert_eq!((end, n), (5, 1));
        assert_eq!(redirect.map(|(_, at)| at), Some(moved.len() - 4));

        // An incomplete frame ends what is taken: the next part completes it.
        let cut = b":1\r\n$5\r\nab";
        assert_eq!(replies_upto(cut, 2).0, 4);
        assert_eq!(replies_upto(cut, 2).1, 1);
        assert_eq!(replies_upto(b"", 2).1, 0);
    }
}
