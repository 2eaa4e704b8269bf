//! Reloading settings without a restart (SIGHUP): the TLS listener's certificate, key and
//! client CA files are re-read (connected clients keep their sessions), `[upstream.tls]` is
//! replaced for the upstream connections made from then on (live ones are kept), and so are
//! the upstream's credentials (user and password in `upstream.url`, or the first of
//! `cluster.seeds`) and `requirepass` when the file changed them. Unchanged in the file, they
//! keep what a `CONFIG SET requirepass` through corral set since. Everything else is read at
//! startup only: a reload that changes it says so in the log and leaves it as it was.
//!
//! A reload is all or nothing: if the new config is invalid or a file cannot be read, nothing
//! changes and the error says why.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::acl::DefaultPassword;
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
    /// The `default` user's password clients authenticate with.
    pub(crate) requirepass: Arc<DefaultPassword>,
    /// The config last applied (at start or by a reload): a credential the file leaves as it
    /// was keeps its running value.
    pub(crate) applied: Mutex<Arc<Config>>,
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
        let mut applied = live.applied.lock().unwrap_or_else(PoisonError::into_inner);
        let before = applied
            .validate()
            .ok()
            .map(|t| (t.primary.user, t.primary.password));
        if before != Some((target.primary.user.clone(), target.primary.password.clone())) {
            live.access.replace(access);
            done.applied.push("upstream credentials");
        } else {
            if live.access.current().password != target.primary.password {
                tracing::info!(
                    "the upstream password a CONFIG SET requirepass set is kept: the file did not change it"
                );
            }
            live.access.replace_tls(access.tls);
        }
        if target.tls {
            done.applied.push("upstream.tls");
        }
        if applied.requirepass != new.requirepass {
            live.requirepass.set(new.requirepass.get());
            done.applied.push("requirepass");
        } else if live.requirepass.get().as_deref() != new.requirepass.get() {
            tracing::info!(
                "the requirepass a CONFIG SET requirepass set is kept: the file did not change it"
            );
        }
        *applied = Arc::new(new.clone());
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
    fn a_password_followed_at_runtime_stays_until_the_file_changes_it() {
        let mut cfg = Config::default();
        cfg.upstream.url = "redis://:a@127.0.0.1:6379".into();
        cfg.requirepass = crate::config::Secret("a".into());
        let target = cfg.validate().unwrap();
        let access = Arc::new(UpstreamAccess::new(
            Access::from_config(&cfg, &target).unwrap(),
        ));
        let requirepass = Arc::new(DefaultPassword::new(Some("a")));
        let reloader = Reloader::default();
        reloader.attach(Live {
            started: Arc::new(cfg.clone()),
            access: access.clone(),
            acceptor: None,
            requirepass: requirepass.clone(),
            applied: Mutex::new(Arc::new(cfg.clone())),
        });
        // CONFIG SET requirepass b through corral.
        assert!(access.follow_default_password(Some("b")));
        requirepass.set(Some("b"));
        let password = || access.current().password.clone();

        let done = reloader.reload(&cfg).unwrap();
        assert!(done.applied.is_empty(), "{done:?}");
        assert_eq!(password().as_deref(), Some("b"));
        assert_eq!(requirepass.get().as_deref(), Some("b"));

        cfg.upstream.url = "redis://:c@127.0.0.1:6379".into();
        cfg.requirepass = crate::config::Secret("c".into());
        let done = reloader.reload(&cfg).unwrap();
        assert_eq!(done.applied, ["upstream credentials", "requirepass"]);
        assert_eq!(password().as_deref(), Some("c"));
        assert_eq!(requirepass.get().as_deref(), Some("c"));
    }

    #[test]
    fn reload_before_start_is_an_error() {
        assert!(Reloader::default().reload(&Config::default()).is_err());
    }
}
