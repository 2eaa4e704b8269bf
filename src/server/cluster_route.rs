//! Cluster mode: what a single Redis would answer that a cluster cannot (CLUSTER, READONLY,
//! SELECT), transactions pinned to the node of their keys, routing by slot (`routed.rs`),
//! and the cache's step before it (lookups of one key, writes kept apart until routed).

use bytes::{Bytes, BytesMut};

use super::cached::{cache_step, write_step};
use super::client::Conn;
use super::cluster_view;
use super::info;
use super::pending::Fan;
use super::plan::{NodeReq, Plan, StartMulti};
use super::route::Request;
use super::routed;
use crate::commands::{Access, Command, Local, Route, Tx};
use crate::error::replies;
use crate::resp::digits::parse_int;
use crate::resp::reply::{self, Encoder};

impl Conn {
    /// Cluster mode, the first command queued in a MULTI corral answered: pins the client to
    /// the node of its keys, where MULTI goes ahead of it. One Redis Cluster would refuse
    /// (CROSSSLOT) is refused and fails the transaction, as a node fails it.
    pub(super) fn cluster_start_multi(
        &mut self,
        cmd: &Command<'_>,
        req: &Request<'_>,
    ) -> Option<Plan> {
        let cluster = self.shared.upstream.cluster.as_ref()?;
        if !self.deferred_multi
            || matches!(
                cmd.route(),
                Route::Tx(_) | Route::Local(Local::Quit | Local::Reset) | Route::Corral
            )
        {
            return None;
        }
        match self.node_of(cluster, cmd) {
            Ok(node) => Some(Plan::StartMulti(Box::new(StartMulti {
                node,
                req: req.bytes(cmd),
                queued: self.queued_cmd(cmd),
            }))),
            Err(e) => {
                self.tx_failed = true;
                Some(Plan::ready(e))
            }
        }
    }

    /// Cluster mode: reads of one key may be served or coalesced by the cache, through the
    /// tracking lane of the key's master; writes invalidate, keyless ones (FLUSHALL) too.
    pub(super) fn cluster_cache_step(
        &mut self,
        cmd: &Command<'_>,
        req: &Request<'_>,
    ) -> Option<Plan> {
        let (args, route) = (cmd.args, cmd.route());
        if let (Some(cluster), Some(cache), Route::Forward(access)) =
            (&self.shared.upstream.cluster, &self.shared.cache, route)
            && self.cluster_cache_serves()
            && !self.deferred_multi
        {
            if matches!(access, Access::Write | Access::All) {
                self.writes.apart(|w| write_step(cache, w, access, cmd));
                return None;
            }
            let slot = args.get(1).map(crate::cluster::key_slot);
            // The map's own address of the master: nothing copied per GET.
            let map = cluster.map();
            if let Some((slot, master)) = slot.and_then(|s| Some((s, &map.master(s)?.addr))) {
                let conn = cluster.conn_for(master, self.session.proto, self.session.id);
                let step = self
                    .writes
                    .apart(|w| cache_step(cache, &conn, Some(master), w, access, cmd, true));
                let to_node = |conn, lead| {
                    Some(Plan::Node(Box::new(NodeReq {
                        conn,
                        req: req.bytes(cmd),
                        slot: Some(slot),
                        lead,
                    })))
                };
                return match step {
                    // The GET leads a read others may join: it goes in the batch for its
                    // node, routed as any request (a redirection is followed for it, and its
                    // joiners, given the redirection, read the key themselves).
                    Some(Plan::Lead(lead)) => to_node(conn, Some(lead)),
                    // A GET forwarded: to the master found here (the cache serves clients
                    // whose reads go to masters), not routed a second time.
                    None if matches!(access, Access::Get) && args.len() == 2 => to_node(conn, None),
                    step => step,
                };
            }
        }
        None
    }

    /// Cluster mode: whether [`Conn::cluster_cache_step`] looks this client's requests up:
    /// not a pinned client's or a Redis user's, whose reads must reach Redis (a WATCH, a
    /// user's key permissions), nor with reads sent to replicas.
    pub(super) fn cluster_cache_serves(&self) -> bool {
        self.pin.is_none()
            && !self.redis_user()
            && self
                .shared
                .upstream
                .cluster
                .as_ref()
                .is_some_and(|c| c.reads_from_masters())
    }

    /// Cluster mode: the writes of a client [`Conn::cluster_cache_serves`] does not serve,
    /// routed by slot (a pinned client's request for another node than its pin's). Its
    /// reads go to Redis, but its writes invalidate and hold their keys as any client's do,
    /// kept apart until the request is routed ([`Writes::apart`]).
    ///
    /// [`Writes::apart`]: super::writes::Writes::apart
    pub(super) fn cluster_unserved_writes(&mut self, cmd: &Command<'_>) {
        if let (Some(cache), Route::Forward(access)) = (&self.shared.cache, cmd.route()) {
            self.writes.apart(|w| write_step(cache, w, access, cmd));
        }
    }

    /// Cluster mode, pinned by WATCH: whether `cmd` goes on the pinned connection while the
    /// batch so far goes to another node. It must not join that batch: it starts a round.
    pub(super) fn pinned_after_routed(&self, cmd: &Command<'_>) -> bool {
        let (Some(pin), Some(cluster)) = (&self.pin, &self.shared.upstream.cluster) else {
            return false;
        };
        !self.batch.fits(&pin.ded.conn)
            && (!matches!(cmd.route(), Route::Forward(_))
                || (!routed::spreads(cmd)
                    && self
                        .node_of(cluster, cmd)
                        .is_ok_and(|node| node == pin.ded.addr())))
    }

    /// Cluster mode: routes by slot, answers CLUSTER/READONLY/READWRITE/SELECT as a single
    /// node would, sends INFO's keyspace question to every master, and refuses what is not
    /// supported there yet. `None` in standalone mode or for requests handled as usual (local
    /// commands, other INFO, pub/sub, and a pinned client's requests to its pinned node).
    pub(super) fn cluster_step(&self, cmd: &Command<'_>, req: &Request<'_>) -> Option<Plan> {
        let (args, route) = (&cmd.args, cmd.route());
        let cluster = self.shared.upstream.cluster.as_ref()?;
        let proto = self.session.proto;
        let error = |text: &str| {
            let mut out = BytesMut::new();
            Encoder {
                proto,
                out: &mut out,
            }
            .error(text);
            Some(Plan::ready(out.freeze()))
        };
        let name = cmd.name();
        if let (Some(pin), Route::Forward(_)) = (&self.pin, route)
            && !routed::spreads(cmd)
            && self
                .node_of(cluster, cmd)
                .is_ok_and(|node| node == pin.ded.addr())
        {
            // Pinned by WATCH: what goes to the pinned node goes on the pinned connection,
            // behind the WATCH (a write of a watched key must fail the EXEC, a MULTI after it
            // finds the watch); keys of other nodes are routed as usual.
            return None;
        }
        match route {
            Route::Forward(_) => match name {
                b"CLUSTER" => {
                    let healthy = cluster.map().covered() == crate::cluster::SLOTS;
                    match cluster_view::execute(args, self.session.laddr, healthy, proto) {
                        cluster_view::ClusterReply::Local(b) => Some(Plan::ready(b)),
                        cluster_view::ClusterReply::Slot(slot) => {
                            let addr = cluster
                                .master_of(slot)
                                .unwrap_or_else(|| cluster.any_node());
                            Some(Plan::Node(Box::new(NodeReq {
                                conn: cluster.conn_for(&addr, proto, self.session.id),
                                req: req.bytes(cmd),
                                slot: Some(slot),
                                lead: None,
                            })))
                        }
                    }
                }
                b"READONLY" | b"READWRITE" if args.len() == 1 => {
                    Some(Plan::ready(Bytes::from_static(reply::OK)))
                }
                _ => Some(routed::route(
                    cluster,
                    cmd,
                    req.bytes(cmd),
                    proto,
                    self.session.id,
                )),
            },
            Route::Select => match args.get(1).and_then(parse_int) {
                Some(0) => Some(Plan::ready(Bytes::from_static(reply::OK))),
                _ => error(replies::SELECT_IN_CLUSTER.text()),
            },
            // Each master has its own keys: the keyspace section counts them all (with no
            // master known yet, one node answers, as for other sections).
            Route::Info
                if info::wants_keyspace(args)
                    && let masters = cluster.masters()
                    && !masters.is_empty() =>
            {
                let how = Fan::Info {
                    with_proxy: info::wants_proxy_section(args),
                };
                let (proto, id) = (self.session.proto, self.session.id);
                Some(routed::fan_out(
                    cluster,
                    &masters,
                    how,
                    req.bytes(cmd),
                    proto,
                    id,
                ))
            }
            Route::Tx(tx) => self.cluster_tx(cluster, tx, cmd, req),
            Route::Blocking if self.pin.is_none() => match self.node_of(cluster, cmd) {
                Ok(node) => Some(self.blocking_plan(cmd, Access::Write, req, Some(node))),
                Err(e) => Some(Plan::ready(e)),
            },
            Route::Monitor => error(&replies::unsupported_in_cluster(name)),
            _ => None,
        }
    }

    /// Cluster mode: the master serving a request's keys, any node for a keyless one, or the
    /// CROSSSLOT error reply.
    pub(super) fn node_of(
        &self,
        cluster: &crate::upstream::cluster::ClusterUpstream,
        cmd: &Command<'_>,
    ) -> Result<String, Bytes> {
        match crate::cluster::keys::keys_slot(&cmd.keys(), &cmd.args) {
            crate::cluster::KeySlot::One(slot) => Ok(cluster
                .master_of(slot)
                .unwrap_or_else(|| cluster.any_node())
                .to_string()),
            crate::cluster::KeySlot::NoKeys => Ok(cluster.any_node().to_string()),
            crate::cluster::KeySlot::Cross => Err(replies::CROSSSLOT.to_bytes()),
        }
    }

    /// Cluster mode transactions: WATCH pins to its keys' node; MULTI is answered here and
    /// the transaction pinned to the node of its first queued command.
    fn cluster_tx(
        &self,
        cluster: &crate::upstream::cluster::ClusterUpstream,
        tx: Tx,
        cmd: &Command<'_>,
        req: &Request<'_>,
    ) -> Option<Plan> {
        if let Some(pin) = &self.pin {
            // A WATCH of another master's key cannot join the watch on the pinned node, which
            // would answer it -MOVED: refused as keys of two slots in one WATCH are.
            return match tx {
                Tx::Watch if pin.in_multi => {
                    Some(Plan::ready(replies::WATCH_INSIDE_MULTI.to_bytes()))
                }
                Tx::Watch => match self.node_of(cluster, cmd) {
                    Ok(node) if node == pin.ded.addr() => None,
                    Ok(_) => Some(Plan::ready(replies::CROSSSLOT.to_bytes())),
                    Err(e) => Some(Plan::ready(e)),
                },
                _ => None,
            };
        }
        match tx {
            Tx::Watch if self.deferred_multi => {
                Some(Plan::ready(replies::WATCH_INSIDE_MULTI.to_bytes()))
            }
            Tx::Watch => Some(match self.node_of(cluster, cmd) {
                Ok(node) => Plan::Tx {
                    tx,
                    req: req.bytes(cmd),
                    node: Some(node),
                },
                Err(e) => Plan::ready(e),
            }),
            Tx::Multi if self.deferred_multi => Some(Plan::ready(replies::NESTED_MULTI.to_bytes())),
            Tx::Multi => Some(Plan::Deferred {
                open: true,
                reply: Bytes::from_static(reply::OK),
            }),
            // A transaction with nothing queued: what Redis answers for it.
            Tx::Exec if self.deferred_multi => Some(Plan::Deferred {
                open: false,
                reply: Bytes::from_static(b"*0\r\n"),
            }),
            Tx::Discard if self.deferred_multi => Some(Plan::Deferred {
                open: false,
                reply: Bytes::from_static(reply::OK),
            }),
            Tx::Unwatch => Some(Plan::ready(Bytes::from_static(reply::OK))),
            Tx::Exec => Some(Plan::ready(replies::EXEC_WITHOUT_MULTI.to_bytes())),
            Tx::Discard => Some(Plan::ready(replies::DISCARD_WITHOUT_MULTI.to_bytes())),
        }
    }
}
