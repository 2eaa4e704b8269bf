//! The slot map: which shard (a master and its replicas) serves each of the 16384 slots, read
//! from `CLUSTER SHARDS` (Redis 7+) or `CLUSTER SLOTS` (older servers).

use super::addr::Addr;
use super::slot::SLOTS;
use super::value::{DecodeError, Value, decode};

/// Marks a slot no shard serves.
const NO_SHARD: u16 = u16::MAX;

/// Why a topology reply could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// The server answered with an error, e.g. `ERR unknown subcommand 'SHARDS'` from a server
    /// older than 7.0 (then ask `CLUSTER SLOTS`), or `ERR This instance has cluster support
    /// disabled`.
    #[error("server replied with an error: {0}")]
    ErrorReply(String),
    /// The bytes are not one complete RESP frame.
    #[error("undecodable topology reply: {0}")]
    Decode(String),
    /// Valid RESP but not the shape of the reply asked for.
    #[error("unexpected topology reply: {0}")]
    Shape(&'static str),
}

/// A node's state as `CLUSTER SHARDS` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Serving.
    Online,
    /// Still loading its data set (a replica just after a full sync): it answers `-LOADING`.
    Loading,
}

/// One cluster node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Node id (40 hex digits); empty when the server did not say (`CLUSTER SLOTS` before 4.0,
    /// or a node learned from a MOVED redirection).
    pub id: String,
    /// Where to connect.
    pub addr: Addr,
    /// Whether it is serving yet. `CLUSTER SLOTS` does not tell; its nodes count as online.
    pub health: Health,
}

/// A master and its replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// The master: writes (and reads, unless replicas are used) go here.
    pub master: Node,
    /// Replicas that have not failed, in the server's order.
    pub replicas: Vec<Node>,
}

/// Slot → shard, for all 16384 slots.
#[derive(Clone, PartialEq, Eq)]
pub struct SlotMap {
    shards: Vec<Shard>,
    /// Index into `shards` per slot, or [`NO_SHARD`]. Always `SLOTS` long.
    slots: Box<[u16]>,
}

impl std::fmt::Debug for SlotMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // 16384 slot entries would drown the shards.
        f.debug_struct("SlotMap")
            .field("shards", &self.shards)
            .field("covered", &self.covered())
            .finish()
    }
}

impl Default for SlotMap {
    fn default() -> Self {
        SlotMap {
            shards: Vec::new(),
            slots: vec![NO_SHARD; SLOTS].into_boxed_slice(),
        }
    }
}

impl SlotMap {
    /// An empty map: no slot is served.
    pub fn new() -> SlotMap {
        SlotMap::default()
    }

    /// Parses a `CLUSTER SHARDS` reply (RESP2 or RESP3). Failed nodes are left out, so a
    /// shard whose master failed serves no slots until a replica is promoted. `origin_host` is
    /// the host the command was sent to: it stands in for nodes whose endpoint Redis does not
    /// know (reported as `?`).
    pub fn from_shards_reply(reply: &[u8], origin_host: &str) -> Result<SlotMap, TopologyError> {
        Self::from_shards_reply_for(reply, origin_host, false)
    }

    /// [`SlotMap::from_shards_reply`] for a client connecting with TLS (`tls`): a node's
    /// `tls-port` is then preferred to its `port` (a cluster with `tls-cluster yes` and both
    /// ports open reports both).
    pub fn from_shards_reply_for(
        reply: &[u8],
        origin_host: &str,
        tls: bool,
    ) -> Result<SlotMap, TopologyError> {
        let value = decode_reply(reply)?;
        let shards = value
            .as_list()
            .ok_or(TopologyError::Shape("not a list of shards"))?;
        let mut map = SlotMap::new();
        for shard in shards {
            let ranges = shard
                .field("slots")
                .and_then(Value::as_list)
                .ok_or(TopologyError::Shape("shard without slots"))?;
            let nodes = shard
                .field("nodes")
                .and_then(Value::as_list)
                .ok_or(TopologyError::Shape("shard without nodes"))?;
            let mut master = None;
            let mut replicas = Vec::new();
            for n in nodes {
                let Some((node, is_master)) = shards_node(n, origin_host, tls)? else {
                    continue;
                };
                if is_master && master.is_none() {
                    master = Some(node);
                } else {
                    replicas.push(node);
                }
            }
            // Without a live master the shard serves nothing; its replicas alone cannot take
            // writes, and Redis answers CLUSTERDOWN for its slots until a failover.
            let Some(master) = master else { continue };
            let idx = map.push_shard(Shard { master, replicas })?;
            for pair in ranges.chunks(2) {
                let [start, end] = pair else {
                    return Err(TopologyError::Shape("odd number of slot bounds"));
                };
                map.assign(start.as_int(), end.as_int(), idx)?;
            }
        }
        Ok(map)
    }

    /// Parses a `CLUSTER SLOTS` reply (RESP2 or RESP3): `[start, end, master, replica...]`
    /// per range, a node being `[endpoint, port, id?, {metadata}?]`. Ranges with the same
    /// master make one shard. `origin_host` stands in for unknown endpoints (`?` or null).
    pub fn from_slots_reply(reply: &[u8], origin_host: &str) -> Result<SlotMap, TopologyError> {
        let value = decode_reply(reply)?;
        let ranges = value
            .as_list()
            .ok_or(TopologyError::Shape("not a list of ranges"))?;
        let mut map = SlotMap::new();
        for range in ranges {
            let items = range
                .as_list()
                .ok_or(TopologyError::Shape("range is not a list"))?;
            let [start, end, master, replicas @ ..] = items else {
                return Err(TopologyError::Shape("range without a master"));
            };
            let master = slots_node(master, origin_host)?;
            let idx = match map.shard_with_master(&master) {
                Some(i) => i,
                None => {
                    let replicas = replicas
                        .iter()
                        .map(|r| slots_node(r, origin_host))
                        .collect::<Result<_, _>>()?;
                    map.push_shard(Shard { master, replicas })?
                }
            };
            map.assign(start.as_int(), end.as_int(), idx)?;
        }
        Ok(map)
    }

    /// The master serving `slot`, if any.
    pub fn master(&self, slot: u16) -> Option<&Node> {
        self.shard(slot).map(|s| &s.master)
    }

    /// The replicas of the shard serving `slot` (empty if none, or if no shard serves it).
    pub fn replicas(&self, slot: u16) -> &[Node] {
        self.shard(slot).map_or(&[], |s| s.replicas.as_slice())
    }

    /// The shard serving `slot`, if any.
    pub fn shard(&self, slot: u16) -> Option<&Shard> {
        self.shard_index(slot).and_then(|i| self.shards.get(i))
    }

    /// Index into [`SlotMap::shards`] of the shard serving `slot`, if any.
    pub fn shard_index(&self, slot: u16) -> Option<usize> {
        match self.slots.get(usize::from(slot)) {
            Some(&i) if i != NO_SHARD => Some(usize::from(i)),
            _ => None,
        }
    }

    /// All shards, including masters that serve no slots (they still matter for commands sent
    /// to every master, such as FLUSHALL or SCAN).
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Every master, once each.
    pub fn masters(&self) -> impl Iterator<Item = &Node> {
        self.shards.iter().map(|s| &s.master)
    }

    /// How many slots have an owner; [`SLOTS`] when the cluster is fully covered.
    pub fn covered(&self) -> usize {
        self.slots.iter().filter(|&&i| i != NO_SHARD).count()
    }

    /// Records a `MOVED slot addr` redirection: `slot` is now served by the master at `addr`,
    /// which becomes a new shard (id unknown, no replicas) if no known master has that address.
    /// The next topology refresh replaces this guess with the full picture.
    pub fn apply_moved(&mut self, slot: u16, addr: &Addr) {
        let Some(entry) = self.slots.get_mut(usize::from(slot)) else {
            return;
        };
        let existing = self.shards.iter().position(|s| s.master.addr == *addr);
        let idx = match existing {
            Some(i) => i,
            None => {
                let node = Node {
                    id: String::new(),
                    addr: addr.clone(),
                    health: Health::Online,
                };
                // A map already holding u16::MAX shards cannot take one more; leave the slot
                // as it was and let the refresh sort it out.
                if self.shards.len() >= usize::from(NO_SHARD) {
                    return;
                }
                self.shards.push(Shard {
                    master: node,
                    replicas: Vec::new(),
                });
                self.shards.len() - 1
            }
        };
        // Checked above: idx < NO_SHARD.
        *entry = idx as u16;
    }

    fn shard_with_master(&self, master: &Node) -> Option<u16> {
        let i = self.shards.iter().position(|s| {
            if master.id.is_empty() {
                s.master.addr == master.addr
            } else {
                s.master.id == master.id
            }
        })?;
        // push_shard keeps every index below NO_SHARD.
        u16::try_from(i).ok()
    }

    fn push_shard(&mut self, shard: Shard) -> Result<u16, TopologyError> {
        let idx = u16::try_from(self.shards.len())
            .ok()
            .filter(|&i| i != NO_SHARD)
            .ok_or(TopologyError::Shape("too many shards"))?;
        self.shards.push(shard);
        Ok(idx)
    }

    /// Gives slots `start..=end` to shard `idx`.
    fn assign(
        &mut self,
        start: Option<i64>,
        end: Option<i64>,
        idx: u16,
    ) -> Result<(), TopologyError> {
        let bound = |b: Option<i64>| {
            b.and_then(|b| usize::try_from(b).ok())
                .filter(|&b| b < SLOTS)
                .ok_or(TopologyError::Shape("slot out of range"))
        };
        let (start, end) = (bound(start)?, bound(end)?);
        if start > end {
            return Err(TopologyError::Shape("slot range ends before it starts"));
        }
        let range = self
            .slots
            .get_mut(start..=end)
            .ok_or(TopologyError::Shape("slot out of range"))?;
        range.fill(idx);
        Ok(())
    }
}

fn decode_reply(reply: &[u8]) -> Result<Value, TopologyError> {
    match decode(reply) {
        Ok(Value::Error(e)) => Err(TopologyError::ErrorReply(e)),
        Ok(v) => Ok(v),
        Err(DecodeError::Incomplete) => Err(TopologyError::Decode("incomplete frame".into())),
        Err(DecodeError::Invalid(e)) => Err(TopologyError::Decode(e)),
    }
}

/// A node of a `CLUSTER SHARDS` reply and whether it is the master; `None` for failed nodes.
fn shards_node(
    n: &Value,
    origin_host: &str,
    tls: bool,
) -> Result<Option<(Node, bool)>, TopologyError> {
    let health = match n.field("health").and_then(Value::as_str) {
        Some("online") | None => Health::Online,
        Some("loading") => Health::Loading,
        // "fail" is what 7.0 sends, "failed" what the documentation says; anything else
        // unknown is treated as not serving too.
        Some(_) => return Ok(None),
    };
    // A TLS-only node has no `port`, only `tls-port`; a plain-only one no `tls-port`.
    let (first, then) = if tls {
        ("tls-port", "port")
    } else {
        ("port", "tls-port")
    };
    let port = n
        .field(first)
        .or_else(|| n.field(then))
        .and_then(Value::as_int)
        .and_then(|p| u16::try_from(p).ok())
        .ok_or(TopologyError::Shape("node without a port"))?;
    // `endpoint` is the address the operator prefers clients to use
    // (cluster-preferred-endpoint-type); `?` means unknown.
    let host = [n.field("endpoint"), n.field("ip"), n.field("hostname")]
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find(|h| known_host(h))
        .unwrap_or(origin_host);
    let id = n.field("id").and_then(Value::as_str).unwrap_or_default();
    let is_master = n.field("role").and_then(Value::as_str) == Some("master");
    let node = Node {
        id: id.to_string(),
        addr: Addr::new(host, port),
        health,
    };
    Ok(Some((node, is_master)))
}

/// A node of a `CLUSTER SLOTS` reply.
fn slots_node(n: &Value, origin_host: &str) -> Result<Node, TopologyError> {
    let items = n
        .as_list()
        .ok_or(TopologyError::Shape("node is not a list"))?;
    let [endpoint, port, rest @ ..] = items else {
        return Err(TopologyError::Shape("node without endpoint and port"));
    };
    let port = port
        .as_int()
        .and_then(|p| u16::try_from(p).ok())
        .ok_or(TopologyError::Shape("node without a port"))?;
    // Redis 7 adds a metadata map (`ip` when the endpoint is a hostname, and vice versa).
    let meta = |key| rest.get(1).and_then(|m| m.field(key));
    let host = [Some(endpoint), meta("ip"), meta("hostname")]
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find(|h| known_host(h))
        .unwrap_or(origin_host);
    let id = rest.first().and_then(Value::as_str).unwrap_or_default();
    Ok(Node {
        id: id.to_string(),
        addr: Addr::new(host, port),
        health: Health::Online,
    })
}

fn known_host(h: &str) -> bool {
    !h.is_empty() && h != "?"
}

#[cfg(test)]
mod tests;
