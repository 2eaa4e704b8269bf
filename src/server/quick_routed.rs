//! Cluster mode: plain GETs and SETs taken to their node's batch without being parsed or
//! routed (`quick.rs` does the same standalone). The route would find nothing more to
//! decide for them than their slot's master, and the cache's step for them, as
//! `cluster_cache_step` takes it.

use std::ops::Range;

use bytes::Bytes;

use super::cached::{Written, get_step_writing, unlooked, write_one};
use super::client::Conn;
use super::plan::{NodeReq, Plan};
use crate::cache::{Entry, Lead};
use crate::cluster::key_slot;
use crate::upstream::UpstreamConn;
use crate::upstream::routes::Routes;

impl Conn {
    /// Takes the plain GET (`get`) or SET `frame`, its key at `key` (whose cache hash is
    /// `hash`, if known), to its slot's node as the route would. False, with nothing
    /// changed, when the route must take it: no node known for the slot, or a GET with the
    /// cache on while reads go to replicas. What is left to carry out, if anything (a cache
    /// reply; a request whose node's batch is not the current one and cannot be set aside),
    /// goes in `left`.
    pub(super) fn quick_routed(
        &mut self,
        frame: &[u8],
        key: Range<usize>,
        get: bool,
        hash: Option<u64>,
        left: &mut Option<Plan>,
    ) -> bool {
        let Some(k) = frame.get(key) else {
            return false;
        };
        let slot = key_slot(k);
        let (proto, id) = (self.session.proto, self.session.id);
        let (room, interleave) = if get && self.shared.cache.is_some() {
            (self.write_room(), self.may_interleave())
        } else {
            (None, false)
        };
        let Some(cluster) = &self.shared.upstream.cluster else {
            return false;
        };
        if get && !cluster.reads_from_masters() {
            // Reads go to replicas: never looked up in the cache (`cluster_cache_serves`).
            if self.shared.cache.is_some() {
                return false;
            }
            return match cluster.slot_conn(slot, true, proto, id) {
                Some(conn) => self.quick_node(frame, slot, conn, None, left),
                None => false,
            };
        }
        if !self
            .routes
            .as_ref()
            .is_some_and(|r| r.hold(cluster, proto, id))
        {
            self.routes = Some(Routes::new(cluster, proto, id));
        }
        let Some((master, conn)) = self.routes.as_mut().and_then(|r| r.master(cluster, slot))
        else {
            return false;
        };
        let lead = match &self.shared.cache {
            Some(cache) if get => {
                let hash = hash.unwrap_or_else(|| cache.hash(k));
                let (wbuf, batch, w) = (&mut self.wbuf, &mut self.batch, &mut self.writes);
                // A GET's step adds nothing to a batch's part (no key, hold or mark): it
                // needs no `Writes::apart`.
                let step = match unlooked(cache, || conn, w, k, hash) {
                    Some(step) => step,
                    None => {
                        // A hit is written at once where nothing is pending before it, or
                        // rides in the batch's open run; else it ends the run (`handle_now`).
                        let write = |e: &Entry| {
                            if room.is_some_and(|room| e.reply_len() <= room) {
                                e.encode(proto, wbuf);
                                return true;
                            }
                            interleave
                                && batch
                                    .interleave_encoded(e.reply_len(), |out| e.encode(proto, out))
                        };
                        get_step_writing(cache, (|| conn, Some(master)), w, k, hash, write)
                    }
                };
                match step {
                    Written::Forward => None,
                    Written::Plan(Plan::Lead(lead)) => Some(lead),
                    Written::Hit => return true,
                    Written::Plan(plan) => {
                        *left = Some(plan);
                        return true;
                    }
                }
            }
            Some(cache) => {
                // A SET's invalidation and hold go with the batch it joins: found first.
                let conn = conn.clone();
                let hash = hash.unwrap_or_else(|| cache.hash(k));
                if self.batch.fits(&conn) || self.switch_batch(&conn) {
                    if let Some(cache) = &self.shared.cache {
                        write_one(cache, &mut self.writes, k, Some(hash));
                    }
                    self.batch.push_routed(conn, frame, Some(slot));
                } else {
                    if let Some(cache) = &self.shared.cache {
                        self.writes.apart(|w| write_one(cache, w, k, Some(hash)));
                    }
                    *left = Some(node_plan(frame, slot, conn, None));
                }
                return true;
            }
            None => None,
        };
        let conn = conn.clone();
        self.quick_node(frame, slot, conn, lead, left)
    }

    /// The request `frame` for `slot` joins the batch for `conn` (the current one, or one
    /// set aside), with what the cache's step kept apart for it; or, if the current batch
    /// cannot be set aside, is left in `left` for `send_routed`, which sends that first.
    fn quick_node(
        &mut self,
        frame: &[u8],
        slot: u16,
        conn: UpstreamConn,
        lead: Option<Lead>,
        left: &mut Option<Plan>,
    ) -> bool {
        if self.batch.fits(&conn) || self.switch_batch(&conn) {
            self.writes.join_routed();
            if let Some(lead) = lead {
                self.batch.lead_next(lead);
            }
            self.batch.push_routed(conn, frame, Some(slot));
        } else {
            *left = Some(node_plan(frame, slot, conn, lead));
        }
        true
    }
}

/// The request `frame` for `slot`, left for `send_routed`, which sends the batches so far
/// first (with what `Writes::apart` kept for it).
fn node_plan(frame: &[u8], slot: u16, conn: UpstreamConn, lead: Option<Lead>) -> Plan {
    Plan::Node(Box::new(NodeReq {
        conn,
        req: Bytes::copy_from_slice(frame),
        slot: Some(slot),
        lead,
    }))
}
