//! What a round queues for its client: forwarded requests in the batch, handed to the
//! upstream as one job (`flush_batch`), and pending replies in request order; and whether a
//! local reply may be encoded into the write buffer at once.

use bytes::Bytes;

use super::batch::Taken;
use super::client::Conn;
use super::clients::ReplyMode;
use super::pending::{AfterAck, Forwarded, PendingReply, Queued, Streamed};

impl Conn {
    /// Appends encoded request bytes to the batch.
    pub(super) fn append(&mut self, bytes: &[u8]) {
        let conn = self.batch.is_empty().then(|| self.target());
        self.batch.push(bytes, conn);
    }

    /// Queues a local reply after everything routed before it.
    pub(super) async fn push_ready(&mut self, bytes: Bytes) {
        self.flush_batch().await;
        self.push_reply(PendingReply::Ready(bytes));
    }

    /// Whether a local reply of about `size` bytes may be encoded into the write buffer now
    /// rather than queued (see [`Conn::write_room`]). A cache hit then costs no pending-reply
    /// slot.
    pub(super) fn may_write_now(&self, size: usize) -> bool {
        self.write_room().is_some_and(|room| size <= room)
    }

    /// How many bytes of local replies may be encoded into the write buffer now rather than
    /// queued, if any may: nothing is pending before them (no batch, no queued reply),
    /// replies are on, and the buffer stays far below the output limit that `collect`
    /// enforces.
    pub(super) fn write_room(&self) -> Option<usize> {
        const MOST: usize = 64 * 1024;
        let limit = match self.shared.cfg.limits.client_output_buffer_limit {
            0 => MOST,
            l => l.min(MOST),
        };
        (self.batch.is_empty()
            && self.replies.is_empty()
            && !self.silent_now
            && self.reply_mode != ReplyMode::Off)
            .then(|| limit.saturating_sub(self.wbuf.len() + 32))
    }

    /// Whether a cache reply can ride in the batch, between its forwarded requests' replies
    /// (see [`Interleaved`](super::pending::Interleaved)): on corral's shared connections,
    /// where the batch's replies are one frame per request (a redirected one replaced by
    /// the retried request's). In cluster mode, after a request of the batch's open run
    /// (`gather.rs`): written with that run's segment.
    pub(super) fn may_interleave(&self) -> bool {
        self.batch.takes_interleaved()
            && self.pin.is_none()
            && (self.shared.upstream.cluster.is_none()
                || (self.batch.count() > self.gather.run_start() && self.may_gather()))
    }

    /// Queues a pending reply, silenced if CLIENT REPLY says so. (Un)subscribe confirmations never
    /// are: Redis sends them as pushes, which CLIENT REPLY OFF/SKIP does not silence, in
    /// either protocol (a client waiting for them would hang).
    pub(super) fn push_reply(&mut self, reply: PendingReply) {
        // A gathered batch's open run comes before it (`gather.rs`).
        if self.gather.run_open(&self.batch) {
            self.end_run();
        }
        self.queue(reply);
    }

    /// Queues a pending reply as [`Conn::push_reply`] does, after everything queued so far.
    pub(super) fn queue(&mut self, reply: PendingReply) {
        let silent = !matches!(reply, PendingReply::Subscribed(_))
            && (self.silent_now || self.reply_mode == ReplyMode::Off);
        self.replies.push(Queued {
            reply,
            silent,
            proto: self.session.proto,
        });
    }

    /// Hands the pending forwarded requests to the upstream as one job.
    pub(super) async fn flush_batch(&mut self) {
        if self.gather.active() {
            self.flush_gathered().await;
        }
        let Some(Taken {
            bytes,
            count,
            conn,
            cmds,
            leads,
            interleaved,
            script,
            script_keys,
            skip_first,
        }) = self.batch.take()
        else {
            return;
        };
        let conn = match conn {
            Some(c) => c,
            None => self.target(),
        };
        // Replies that need nothing but writing (with the cache replies between them) once
        // the batch's written keys are invalidated again, and in cluster mode redirections
        // followed, on a shared connection whose client reads them: written as they arrive.
        // Not under an output buffer limit, which counts a round's replies whole, as Redis
        // counts what a pipeline read at once adds to a client's output.
        if !script
            && !skip_first
            && !conn.is_dedicated()
            && self.exec_select.is_none()
            && !self.writes.barrier
            && !self.silent_now
            && self.reply_mode != ReplyMode::Off
            && self.shared.cfg.limits.client_output_buffer_limit == 0
        {
            let hook = (!leads.is_empty()).then(|| super::batch::lead_hook(leads));
            let rx = conn.send_streamed(bytes, count, hook).await;
            let after = self.take_writes();
            let redirects =
                (self.shared.upstream.cluster.is_some() && self.pin.is_none()).then_some(cmds);
            self.push_reply(PendingReply::Streamed(Box::new(Streamed {
                rx,
                count,
                conn,
                interleaved,
                after,
                redirects,
            })));
            return;
        }
        let rx = if leads.is_empty() {
            conn.send(bytes, count).await
        } else {
            // The replies go through the upstream connection's task, which shares the leading
            // GETs' replies with their waiters whatever becomes of this client.
            let (tx, rx) = tokio::sync::oneshot::channel();
            let share = move |r: crate::upstream::JobResult| {
                super::batch::share_leads(leads, &r, 0);
                let _ = tx.send(r);
            };
            conn.send_to(
                bytes,
                count,
                crate::upstream::ReplyTo::Call(Box::new(share)),
            )
            .await;
            rx
        };
        let writes = self.writes.take_keys();
        let write_mark = self.writes.mark.take().unwrap_or(0);
        let writes_all = std::mem::take(&mut self.writes.all);
        let lane_barrier = std::mem::take(&mut self.writes.barrier);
        let exec_select = self.exec_select.take();
        // Redirections are followed on shared connections only: inside a transaction a
        // MOVED is part of what the client must see (the transaction is then aborted).
        let cluster_cmds =
            (self.shared.upstream.cluster.is_some() && self.pin.is_none()).then_some(cmds);
        let script = script.then(|| {
            self.shared
                .upstream
                .status
                .script_started(script_keys, conn.is_dedicated())
        });
        self.push_reply(PendingReply::Upstream(Box::new(Forwarded {
            rx,
            count,
            conn,
            after: AfterAck {
                writes,
                write_mark,
                writes_all,
                lane_barrier,
                exec_select,
                cluster_cmds,
                skip_first,
                script,
            },
            blocking: None,
            interleaved,
        })));
    }

    /// The cache work pending for writes routed so far, to run once they are acknowledged.
    pub(super) fn take_writes(&mut self) -> AfterAck {
        AfterAck {
            writes: self.writes.take_keys(),
            write_mark: self.writes.mark.take().unwrap_or(0),
            writes_all: std::mem::take(&mut self.writes.all),
            ..AfterAck::default()
        }
    }
}
