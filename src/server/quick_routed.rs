//! Cluster mode: plain GETs and SETs taken to their node's batch without being parsed or
//! routed (`quick.rs` does the same standalone). The route would find nothing more to
//! decide for them than their slot's master, and the cache's step for them, as
//! `cluster_cache_step` takes it.

use std::cell::OnceCell;
use std::ops::Range;

use bytes::Bytes;

use super::cached::{Written, get_step_writing, unlooked, write_one};
use super::client::Conn;
use super::plan::{NodeReq, Plan};
use crate::cache::Entry;
use crate::cluster::key_slot;

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
        let Some(cluster) = &self.shared.upstream.cluster else {
            return false;
        };
        let Some(k) = frame.get(key) else {
            return false;
        };
        let slot = key_slot(k);
        let (proto, id) = (self.session.proto, self.session.id);
        let (conn, lead) = match &self.shared.cache {
            None => match cluster.slot_conn(slot, get, proto, id) {
                Some(conn) => (conn, None),
                None => return false,
            },
            Some(cache) => {
                if get && !cluster.reads_from_masters() {
                    return false;
                }
                // The map's own address of the master: nothing copied per request.
                let map = cluster.map();
                let Some(master) = map.master(slot).map(|n| &n.addr) else {
                    return false;
                };
                let hash = hash.unwrap_or_else(|| cache.hash(k));
                // Found once a read needs it: a hit needs no connection.
                let found = OnceCell::new();
                let conn = || found.get_or_init(|| cluster.conn_for(master, proto, id));
                let room = self.write_room();
                let wbuf = &mut self.wbuf;
                let step = self.writes.apart(|w| {
                    if !get {
                        write_one(cache, w, k, Some(hash));
                        return Written::Forward;
                    }
                    if let Some(step) = unlooked(cache, conn, w, k, hash) {
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
                    get_step_writing(cache, (conn, Some(master)), w, k, hash, write)
                });
                let lead = match step {
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
                };
                let conn = match found.into_inner() {
                    Some(c) => c,
                    None => cluster.conn_for(master, proto, id),
                };
                (conn, lead)
            }
        };
        let req = Bytes::copy_from_slice(frame);
        if self.batch.fits(&conn) || self.switch_batch(&conn) {
            self.writes.join_routed();
            if let Some(lead) = lead {
                self.batch.lead_next(lead);
            }
            self.batch.push_routed(conn, req, Some(slot));
        } else {
            *left = Some(Plan::Node(Box::new(NodeReq {
                conn,
                req,
                slot: Some(slot),
                lead,
            })));
        }
        true
    }
}
