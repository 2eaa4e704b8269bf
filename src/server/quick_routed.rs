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
        let room = self.write_room();
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
            None => None,
            Some(cache) => {
                let hash = hash.unwrap_or_else(|| cache.hash(k));
                let wbuf = &mut self.wbuf;
                let step = self.writes.apart(|w| {
                    if !get {
                        write_one(cache, w, k, Some(hash));
                        return Written::Forward;
                    }
                    if let Some(step) = unlooked(cache, || conn, w, k, hash) {
                        return step;
                    }
                    // A hit is written at once where nothing is pending before it; else
                    // it ends the batch's run (`handle_now`).
                    let write = |e: &Entry| {
                        room.is_some_and(|room| e.reply_len() <= room) && {
                            e.encode(proto, wbuf);
                            true
                        }
                    };
                    get_step_writing(cache, (|| conn, Some(master)), w, k, hash, write)
                });
                match step {
                    Written::Forward => None,
                    Written::Plan(Plan::Lead(lead)) => Some(lead),
                    Written::Hit | Written::Plan(_) => {
                        // Answered by the cache: nothing of it goes to Redis.
                        self.writes.drop_routed();
                        if let Written::Plan(plan) = step {
                            *left = Some(plan);
                        }
                        return true;
                    }
                }
            }
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
            *left = Some(Plan::Node(Box::new(NodeReq {
                conn,
                req: Bytes::copy_from_slice(frame),
                slot: Some(slot),
                lead,
            })));
        }
        true
    }
}
