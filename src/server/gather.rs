//! Cluster mode: a round's requests gathered into one batch per node. A pipeline of keys
//! over every slot alternates between masters; sent as one job per run of requests for one
//! node, it became about one job per request, each sent, waited for and answered on its own.
//! Here the batch for a node is set aside when a request for another node comes, and taken
//! up again by the next request for it, so a round sends one job per node connection. Each
//! run of requests in a batch leaves a [`PendingReply::Segment`] among the pending replies,
//! in request order, naming its job and how many of its replies it takes (`segments.rs`).
//! Redis sees each connection's requests in the client's order, as before: only requests
//! for different nodes, which never had an order between them, travel apart.

use super::batch::{Batch, Taken, lead_hook};
use super::client::Conn;
use super::clients::ReplyMode;
use super::pending::{AfterAck, PendingReply};
use super::segments::SentJob;
use super::writes::BatchPart;
use crate::upstream::UpstreamConn;

/// Most batches set aside at once (a round reaching more node connections sends them);
/// also the most emptied batches kept for their buffers.
const MAX_PARKED: usize = 32;
/// Largest buffers an emptied batch may hold to be kept: one that carried a large request
/// is let go, so a client's spare batches stay small.
const SPARE_MAX_BYTES: usize = 64 * 1024;

/// A round's batches for other nodes than the current one, and its gathered jobs.
#[derive(Default)]
pub(super) struct Gather {
    /// Batches set aside, each with the cache's part in it and its job.
    parked: Vec<Parked>,
    /// Bytes of requests in `parked`.
    parked_bytes: usize,
    /// The job of the current batch (`Conn::batch`), once a run of it ended (it was set
    /// aside, or a reply of corral's came after it): its replies then come as segments.
    current: Option<u32>,
    /// Requests of the current batch before its open run.
    run_start: u32,
    /// Sent jobs by number, until their last segment is written (`None` before sending).
    pub(super) jobs: Vec<Option<SentJob>>,
    /// Batches sent, kept for their buffers.
    spare: Vec<Batch>,
}

/// A batch set aside ([`Gather`]).
struct Parked {
    batch: Batch,
    part: BatchPart,
    job: u32,
}

impl Gather {
    /// Bytes of requests in batches set aside, which count towards the round's bound.
    pub(super) fn parked_bytes(&self) -> usize {
        self.parked_bytes
    }

    /// Whether batches are gathered in this round: sending one sends them all.
    pub(super) fn active(&self) -> bool {
        self.current.is_some() || !self.parked.is_empty()
    }

    /// Requests of the current batch before its open run (0 for a batch with no job).
    pub(super) fn run_start(&self) -> u32 {
        self.run_start
    }

    /// Whether the current batch has requests in an open run of a gathered job.
    #[inline]
    pub(super) fn run_open(&self, batch: &Batch) -> bool {
        self.current.is_some() && batch.count() > self.run_start
    }
}

impl Conn {
    /// Whether the current batch may be set aside, or its replies come as segments: cluster
    /// mode on shared connections, a batch whose replies need nothing but writing (no
    /// script waiting for the lane, no reply skipped or silenced, no output buffer limit,
    /// which counts a round whole).
    pub(super) fn may_gather(&self) -> bool {
        self.shared.upstream.cluster.is_some()
            && self.pin.is_none()
            && !self.batch.script
            && !self.batch.skip_first
            && !self.writes.barrier
            && self.exec_select.is_none()
            && !self.silent_now
            && self.reply_mode != ReplyMode::Off
            && self.shared.cfg.limits.client_output_buffer_limit == 0
            && self.batch.conn().is_none_or(|c| !c.is_dedicated())
    }

    /// Ends the current batch's open run, if it has one: its replies are the next segment of
    /// its job, which it gets now if it had none.
    pub(super) fn end_run(&mut self) {
        let count = self.batch.count();
        let g = &mut self.gather;
        if count == 0 && g.current.is_none() {
            // An empty batch (made current for a request the cache then answered).
            return;
        }
        let job = *g.current.get_or_insert_with(|| {
            g.jobs.push(None);
            (g.jobs.len() - 1) as u32
        });
        if count > g.run_start {
            let run = count - g.run_start;
            g.run_start = count;
            self.queue(PendingReply::Segment { job, count: run });
        }
    }

    /// Sets the current batch aside and makes the batch for `conn` current (the one set
    /// aside earlier in the round, or a new one); false, and nothing changed, if the current
    /// batch may not be set aside.
    pub(super) fn switch_batch(&mut self, conn: &UpstreamConn) -> bool {
        if self.gather.parked.len() >= MAX_PARKED || !self.may_gather() {
            return false;
        }
        self.end_run();
        let Some(job) = self.gather.current.take() else {
            return false;
        };
        let g = &mut self.gather;
        let found = g
            .parked
            .iter()
            .position(|p| p.batch.conn().is_some_and(|c| c.same(conn)));
        // Swapped in place: a batch and its part are some 300 bytes, and moving them in and
        // out of the list on every switch showed in `perf`.
        let part = self.writes.take_part();
        match found {
            Some(i) => {
                let p = &mut g.parked[i];
                std::mem::swap(&mut self.batch, &mut p.batch);
                let theirs = std::mem::replace(&mut p.part, part);
                self.writes.add_part(theirs);
                g.current = Some(std::mem::replace(&mut p.job, job));
                g.parked_bytes += p.batch.len_bytes();
                g.parked_bytes -= self.batch.len_bytes();
                g.run_start = self.batch.count();
            }
            None => {
                // A new batch reuses the buffers of one sent earlier.
                let fresh = g.spare.pop().unwrap_or_default();
                let batch = std::mem::replace(&mut self.batch, fresh);
                g.parked_bytes += batch.len_bytes();
                g.parked.push(Parked { batch, part, job });
                g.run_start = 0;
            }
        }
        true
    }

    /// Sends the round's gathered jobs: the current batch's, if it has one (its open run
    /// ended first), and those set aside. A current batch with no job is left for
    /// `flush_batch`, which sends it as any batch.
    pub(super) async fn flush_gathered(&mut self) {
        if self.gather.current.is_some() {
            self.end_run();
            let job = self.gather.current.take();
            self.gather.run_start = 0;
            debug_assert!(!self.writes.barrier, "a gathered batch waits for no lane");
            let after = self.take_writes();
            if let (Some(job), Some(taken)) = (job, self.batch.take()) {
                self.send_gathered(job, taken, after).await;
            }
        }
        let parked = std::mem::take(&mut self.gather.parked);
        self.gather.parked_bytes = 0;
        for Parked {
            mut batch,
            part,
            job,
        } in parked
        {
            // Looked at before the requests are taken: the buffers sent share one
            // allocation with what the batch keeps.
            let small = batch.capacity() <= SPARE_MAX_BYTES;
            if let Some(taken) = batch.take() {
                self.send_gathered(job, taken, part.into_after()).await;
            }
            if small && self.gather.spare.len() < MAX_PARKED {
                self.gather.spare.push(batch);
            }
        }
    }

    /// Sends one gathered job, its replies streamed: its segments take them as they come.
    async fn send_gathered(&mut self, job: u32, taken: Taken, after: AfterAck) {
        let Taken {
            bytes,
            count,
            conn,
            cmds,
            leads,
            interleaved,
            ..
        } = taken;
        let conn = match conn {
            Some(c) => c,
            None => self.target(),
        };
        let hook = (!leads.is_empty()).then(|| lead_hook(leads));
        let rx = conn.send_streamed(bytes, count, hook).await;
        if let Some(slot) = self.gather.jobs.get_mut(job as usize) {
            *slot = Some(SentJob::new(rx, count, conn, after, cmds, interleaved));
        }
    }
}
