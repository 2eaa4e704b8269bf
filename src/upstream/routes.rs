//! A client's routes in cluster mode: the slot map as of its epoch and the connections to
//! its masters looked up so far, kept while the epoch stays the same (checked at each
//! round's start). A pipeline's requests then take no lock per request (the map's, the
//! node pools'), nor hash a node's address: with both, plain GETs -P 16 spent about 7% of
//! corral's CPU finding connections (`perf`). A map that changes during a round only sends
//! the round's later requests where its earlier ones went; a MOVED is followed as ever.

use std::sync::Arc;

use super::cluster::ClusterUpstream;
use super::conn::UpstreamConn;
use crate::cluster::{Addr, SlotMap};
use crate::resp::Proto;

/// See the module.
pub struct Routes {
    /// The cluster's epoch when `map` was read.
    epoch: u64,
    map: Arc<SlotMap>,
    proto: Proto,
    client: u64,
    /// By shard index in `map`: the master's connection, once looked up.
    masters: Vec<Option<UpstreamConn>>,
}

impl Routes {
    /// Routes for client `client` speaking `proto`, on the cluster's current map.
    pub fn new(cluster: &ClusterUpstream, proto: Proto, client: u64) -> Routes {
        Routes {
            // Read before the map: a map installed in between is seen as a change.
            epoch: cluster.epoch(),
            map: cluster.map(),
            proto,
            client,
            masters: Vec::new(),
        }
    }

    /// Whether these routes still hold: made for `proto` and `client`, and the cluster's
    /// map unchanged since.
    pub fn hold(&self, cluster: &ClusterUpstream, proto: Proto, client: u64) -> bool {
        self.proto == proto && self.client == client && self.epoch == cluster.epoch()
    }

    /// The master serving `slot` in the round's map, with the shared connection to it,
    /// if the map knows one.
    pub fn master(
        &mut self,
        cluster: &ClusterUpstream,
        slot: u16,
    ) -> Option<(&Addr, &UpstreamConn)> {
        let i = self.map.shard_index(slot)?;
        let addr = &self.map.shards().get(i)?.master.addr;
        if self.masters.len() <= i {
            self.masters.resize(i + 1, None);
        }
        let conn =
            self.masters[i].get_or_insert_with(|| cluster.conn_for(addr, self.proto, self.client));
        Some((addr, conn))
    }
}
