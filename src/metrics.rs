//! Prometheus metrics: every name in one place, rendered in the text exposition format by
//! `prometheus-client`.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::striped::StripedCounter;

/// Process-wide counters and gauges.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Client connections accepted.
    pub connections: Counter,
    /// Client connections refused because `max_clients` was reached.
    pub rejected_connections: Counter,
    /// Clients connected now.
    pub connected_clients: Gauge,
    /// Requests received from clients.
    pub commands: StripedCounter,
    /// Requests answered by corral itself (local commands and refusals).
    pub local_commands: Counter,
    /// Requests that got an error because the upstream failed or timed out.
    pub upstream_errors: Counter,
    /// Clients disconnected for malformed or oversized input.
    pub protocol_errors: Counter,
    /// Live upstream connections (set when scraped).
    pub upstream_connections: Gauge,
    /// Pools of Redis ACL users' connections open (set when scraped).
    pub user_pools: Gauge,
    /// Client connections to the TLS listener whose handshake failed or timed out.
    pub tls_handshake_failures: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("corral");
        let m = Metrics {
            connections: Counter::default(),
            rejected_connections: Counter::default(),
            connected_clients: Gauge::default(),
            commands: StripedCounter::default(),
            local_commands: Counter::default(),
            upstream_errors: Counter::default(),
            protocol_errors: Counter::default(),
            upstream_connections: Gauge::default(),
            user_pools: Gauge::default(),
            tls_handshake_failures: Counter::default(),
            registry: Registry::default(),
        };
        // Counter names get `_total` appended by the encoder.
        registry.register(
            "connections",
            "Client connections accepted",
            m.connections.clone(),
        );
        registry.register(
            "rejected_connections",
            "Client connections refused at max_clients",
            m.rejected_connections.clone(),
        );
        registry.register(
            "connected_clients",
            "Clients connected now",
            m.connected_clients.clone(),
        );
        registry.register(
            "commands",
            "Requests received from clients",
            m.commands.clone(),
        );
        registry.register(
            "local_commands",
            "Requests answered by corral without the upstream",
            m.local_commands.clone(),
        );
        registry.register(
            "upstream_errors",
            "Requests answered with an error because the upstream failed or timed out",
            m.upstream_errors.clone(),
        );
        registry.register(
            "protocol_errors",
            "Clients disconnected for malformed or oversized requests",
            m.protocol_errors.clone(),
        );
        registry.register(
            "upstream_connections",
            "Live upstream connections",
            m.upstream_connections.clone(),
        );
        registry.register(
            "user_pools",
            "Pools of connections authenticated as Redis ACL users (pass-through)",
            m.user_pools.clone(),
        );
        registry.register(
            "tls_handshake_failures",
            "Client connections whose TLS handshake failed or timed out",
            m.tls_handshake_failures.clone(),
        );
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// The registry, for other components to register their metrics at startup.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Exports `connects`, counted by the upstream connections themselves, as
    /// `corral_upstream_connects_total`.
    pub fn count_upstream_connects(&mut self, connects: Counter) {
        self.registry.register(
            "upstream_connects",
            "Upstream connections established since start",
            connects,
        );
    }

    /// The Prometheus text exposition of all metrics.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prefixed_counters() {
        let m = Metrics::default();
        m.commands.inc_by(3);
        let text = m.render();
        assert!(text.contains("corral_commands_total 3"), "{text}");
        assert!(
            text.contains("# TYPE corral_connected_clients gauge"),
            "{text}"
        );
    }

    #[test]
    fn upstream_connects_is_a_counter() {
        let mut m = Metrics::default();
        let connects = Counter::default();
        m.count_upstream_connects(connects.clone());
        connects.inc_by(2);
        let text = m.render();
        assert!(
            text.contains("# TYPE corral_upstream_connects counter"),
            "{text}"
        );
        assert!(text.contains("corral_upstream_connects_total 2"), "{text}");
    }
}
