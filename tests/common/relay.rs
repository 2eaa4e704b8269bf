//! A fault-injecting TCP relay (Redis cannot half-open a connection by itself).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::client::{addr_port, try_client_list};

/// What the relay does to one flow's bytes, in both directions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Bytes pass as they come.
    Pass,
    /// Bytes are read and dropped: both sockets stay open and nothing is delivered, as when a
    /// NAT or firewall forgets the flow or the peer is half-dead.
    Blackhole,
    /// Every chunk is delivered this long after it was read (in order).
    Delay(Duration),
    /// Bytes to Redis pass; Redis's bytes are held, in order, until the fault changes: a
    /// reply that is late, with nothing lost.
    HoldReplies,
}

/// One relayed connection: the port its upstream side uses (what Redis shows as the client's
/// `addr` in CLIENT LIST) and its fault, shared with the pump tasks.
struct Flow {
    upstream_port: u16,
    fault: Arc<std::sync::Mutex<Fault>>,
}

/// A loopback TCP relay in front of `upstream`: point corral at [`Relay::url`], find a flow
/// by the port Redis sees (CLIENT LIST `addr=`), and tell the relay to blackhole or delay it.
/// New flows pass (or start with the fault given to [`Relay::start_with`]). Everything stops
/// when the relay is dropped.
pub struct Relay {
    pub addr: SocketAddr,
    flows: Arc<std::sync::Mutex<Vec<Flow>>>,
    stop: CancellationToken,
}

impl Relay {
    /// Starts relaying connections to `upstream` (on the current tokio runtime).
    pub async fn start(upstream: SocketAddr) -> Relay {
        Self::start_with(upstream, Fault::Pass).await
    }

    /// [`Relay::start`] whose new flows start with `fault`.
    pub async fn start_with(upstream: SocketAddr, first: Fault) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("relay addr");
        let flows: Arc<std::sync::Mutex<Vec<Flow>>> = Arc::default();
        let stop = CancellationToken::new();
        let (list, token) = (flows.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    _ = token.cancelled() => return,
                };
                let Ok((down, _)) = accepted else { continue };
                let Ok(up) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let _ = (down.set_nodelay(true), up.set_nodelay(true));
                let upstream_port = up.local_addr().map(|a| a.port()).unwrap_or(0);
                let fault = Arc::new(std::sync::Mutex::new(first));
                list.lock().unwrap().push(Flow {
                    upstream_port,
                    fault: fault.clone(),
                });
                let (dr, dw) = down.into_split();
                let (ur, uw) = up.into_split();
                tokio::spawn(pump(dr, uw, fault.clone(), false, token.clone()));
                tokio::spawn(pump(ur, dw, fault, true, token.clone()));
            }
        });
        Relay { addr, flows, stop }
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Sets the fault of the flow whose upstream side uses `upstream_port`; panics if the
    /// relay has no such flow.
    pub fn set_fault(&self, upstream_port: u16, fault: Fault) {
        let flows = self.flows.lock().unwrap();
        let flow = flows
            .iter()
            .find(|f| f.upstream_port == upstream_port)
            .unwrap_or_else(|| panic!("the relay has no flow from port {upstream_port}"));
        *flow.fault.lock().unwrap() = fault;
    }

    /// The upstream-side ports of the relay's flows so far.
    pub fn flow_ports(&self) -> Vec<u16> {
        self.flows
            .lock()
            .unwrap()
            .iter()
            .map(|f| f.upstream_port)
            .collect()
    }

    /// The upstream-side port of a relayed client whose `CLIENT LIST` line on `redis`
    /// satisfies `pick` (e.g. `flags=t` for corral's tracking lane), polled for up to 10 s.
    pub async fn find_client(&self, redis: SocketAddr, pick: impl Fn(&str) -> bool) -> u16 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ours = self.flow_ports();
            let found = client_port(redis, |l| {
                pick(l) && addr_port(l).is_some_and(|p| ours.contains(&p))
            })
            .await;
            if let Some(p) = found {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "no such relayed client on {redis}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sets the fault of every flow so far.
    pub fn set_fault_all(&self, fault: Fault) {
        for f in self.flows.lock().unwrap().iter() {
            *f.fault.lock().unwrap() = fault;
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Moves bytes from `rd` to `wr` per the flow's fault (`from_redis`: the direction toward
/// corral). A reader task and a writer task joined by a queue of (due time, bytes), so a
/// delay holds bytes without holding up reading.
async fn pump(
    mut rd: tokio::net::tcp::OwnedReadHalf,
    mut wr: tokio::net::tcp::OwnedWriteHalf,
    fault: Arc<std::sync::Mutex<Fault>>,
    from_redis: bool,
    stop: CancellationToken,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let held = fault.clone();
    let writer = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            while from_redis && *held.lock().unwrap() == Fault::HoldReplies {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if wr.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = wr.shutdown().await;
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let f = *fault.lock().unwrap();
            let now = tokio::time::Instant::now();
            let due = match f {
                Fault::Pass | Fault::HoldReplies => now,
                Fault::Blackhole => continue,
                Fault::Delay(d) => now + d,
            };
            if tx.send((due, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = async { tokio::join!(reader, writer) } => {}
        _ = stop.cancelled() => {}
    }
}

/// The `addr=` port of the first client in `CLIENT LIST` (asked on `redis`) whose line
/// satisfies `pick`, e.g. `|l| l.contains("flags=t")` for corral's tracking lane.
pub async fn client_port(redis: SocketAddr, pick: impl Fn(&str) -> bool) -> Option<u16> {
    let list = try_client_list(redis).await?;
    list.iter().filter(|l| pick(l)).find_map(|l| addr_port(l))
}
