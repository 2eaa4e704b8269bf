//! Reloading settings without a restart (SIGHUP): the TLS listener's certificate, key and
//! client CA files are re-read (connected clients keep their sessions), and the upstream's
//! credentials (user and password in `upstream.url`, or the first of `cluster.seeds`) and
//! `[upstream.tls]` are replaced for the upstream connections made from then on (live ones
//! are kept). Everything else is read at startup only: a reload that changes it says so in the
//! log and leaves it as it was.
//!
//! A reload is all or nothing: if the new config is invalid or a file cannot be read, nothing
//! changes and the error says why.

use std::sync::{Arc, OnceLock};

use crate::config::Config;
use crate::tls::TlsAcceptorHandle;
use crate::upstream::{Access, UpstreamAccess};

/// A handle to reload a running server: made by the caller, handed to [`crate::run_with`],
/// cloned to whoever triggers reloads (the SIGHUP handler). Reloading before the server has
/// started is an error.
#[derive(Debug, Clone, Default)]
pub struct Reloader(Arc<OnceLock<Live>>);

/// What a running server lets a reload change.
#[derive(Debug)]
pub(crate) struct Live {
    /// The config the server started with: what a reload compares against.
    pub(crate) started: Arc<Config>,
    pub(crate) access: Arc<UpstreamAccess>,
    pub(crate) acceptor: Option<Arc<TlsAcceptorHandle>>,
}

/// What a successful reload did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// What was re-read or replaced.
    pub applied: Vec<&'static str>,
    /// Settings that differ from the running ones but are read at startup only: left as
    /// they were until a restart.
    pub need_restart: Vec<&'static str>,
}

impl Reloader {
    /// Called once by the server when it starts.
    pub(crate) fn attach(&self, live: Live) {
        if self.0.set(live).is_err() {
            tracing::warn!("one Reloader handed to two servers: only the first reloads");
        }
    }

    /// Applies `new` (already loaded from the config file and flags) to the running server.
    ///
    /// # Errors
    /// The server has not started, `new` is invalid, or a file it names cannot be used; then
    /// nothing was changed.
    pub fn reload(&self, new: &Config) -> Result<Reloaded, String> {
        let live = self.0.get().ok_or("the server is not running yet")?;
        let target = new.validate().map_err(|e| e.to_string())?;
        // Everything that can fail first, with no effect; the listener's files last, as its
        // reload is the one step that changes something.
        let access = Access::from_config(new, &target).map_err(|e| e.to_string())?;
        let mut done = Reloaded {
            need_restart: restart_needed(&live.started, new),
            ..Reloaded::default()
        };
        if let Some(acceptor) = &live.acceptor {
            acceptor.reload().map_err(|e| e.to_string())?;
            done.applied.push("tls listener certificates");
        }
        live.access.replace(access);
        done.applied.push("upstream credentials");
        if target.tls {
            done.applied.push("upstream.tls");
        }
        Ok(done)
    }
}

/// The settings that differ between `old` and `new` but only take effect at startup.
fn restart_needed(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut check = |name, differs: bool| {
        if differs {
            out.push(name);
        }
    };
    let addr = |c: &Config| {
        c.validate()
            .map(|t| {
                (
                    t.primary.addr,
                    t.tls,
                    t.seeds.into_iter().map(|s| s.addr).collect::<Vec<_>>(),
                )
            })
            .ok()
    };
    check("upstream address", addr(old) != addr(new));
    // `{:?}` of each section: passwords print as MASKED, so only the comparisons above see
    // the URLs, and the upstream section is compared without its URL and TLS settings
    // (both reloadable).
    let upstream = |c: &Config| {
        let mut u = c.upstream.clone();
        u.url.clear();
        u.tls = Default::default();
        format!("{u:?}")
    };
    check("upstream", upstream(old) != upstream(new));
    let cluster = |c: &Config| {
        let mut k = c.cluster.clone();
        k.seeds.clear();
        format!("{k:?}")
    };
    check("cluster", cluster(old) != cluster(new));
    check("listen", old.listen != new.listen);
    check("admin", old.admin != new.admin);
    check("tls", old.tls != new.tls);
    check("requirepass", old.requirepass != new.requirepass);
    check("log_level", old.log_level != new.log_level);
    check("threads", old.threads != new.threads);
    check("max_clients", old.max_clients != new.max_clients);
    check(
        "shutdown_grace_ms",
        old.shutdown_grace_ms != new.shutdown_grace_ms,
    );
    check(
        "limits",
        format!("{:?}", old.limits) != format!("{:?}", new.limits),
    );
    check(
        "cache",
        format!("{:?}", old.cache) != format!("{:?}", new.cache),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_reload_and_other_settings_wait_for_a_restart() {
        let old = Config::default();
        let mut new = old.clone();
        new.upstream.url = "redis://app:secret@127.0.0.1:6379".into();
        assert!(restart_needed(&old, &new).is_empty());
        new.upstream.url = "redis://app:secret@127.0.0.1:7000".into();
        new.cache.max_age_ms = 5;
        new.listen = "127.0.0.1:1".into();
        assert_eq!(
            restart_needed(&old, &new),
            ["upstream address", "listen", "cache"]
        );
    }

    #[test]
    fn reload_before_start_is_an_error() {
        assert!(Reloader::default().reload(&Config::default()).is_err());
    }
}
