//! What every upstream connection authenticates and encrypts with: the credentials of the
//! upstream URL and the TLS connector of `[upstream.tls]`. Held once, shared by every
//! connection's settings, and replaced as a whole on reload (SIGHUP): each connect reads the
//! current value, so connections made after a reload use the new credentials while live ones
//! are left alone.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use crate::config::{Config, UpstreamTarget};
use crate::error::ConfigError;
use crate::tls::UpstreamTlsConnector;

/// The credentials and TLS setup in force (see the module docs).
#[derive(Clone, Default)]
pub struct Access {
    /// ACL user for HELLO AUTH.
    pub user: Option<String>,
    /// Password for HELLO AUTH (or AUTH before Redis 6).
    pub password: Option<String>,
    /// Set for a `rediss://` upstream: every connection, to every node, runs a TLS handshake.
    pub tls: Option<UpstreamTlsConnector>,
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Access")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "MASKED"))
            .field("tls", &self.tls)
            .finish()
    }
}

impl Access {
    /// The access a valid config names: the primary URL's credentials, and a TLS connector
    /// (its files read now) when the upstream is `rediss://`.
    ///
    /// # Errors
    /// A file of `[upstream.tls]` cannot be read or used.
    pub fn from_config(cfg: &Config, target: &UpstreamTarget) -> Result<Access, ConfigError> {
        let tls = if target.tls {
            let connector = UpstreamTlsConnector::try_new(&cfg.upstream.tls).map_err(|e| {
                ConfigError::Invalid {
                    field: "upstream.tls",
                    why: e.to_string(),
                }
            })?;
            Some(connector)
        } else {
            None
        };
        Ok(Access {
            user: target.primary.user.clone(),
            password: target.primary.password.clone(),
            tls,
        })
    }
}

/// The shared, replaceable [`Access`].
#[derive(Debug, Default)]
pub struct UpstreamAccess {
    /// Read once per connect; written only on reload.
    now: RwLock<Arc<Access>>,
    /// Woken on replace: connections waiting out a backoff retry at once with the new access.
    changed: tokio::sync::Notify,
}

impl UpstreamAccess {
    /// Starts with `access`.
    pub fn new(access: Access) -> UpstreamAccess {
        UpstreamAccess {
            now: RwLock::new(Arc::new(access)),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// What the next connection uses.
    pub fn current(&self) -> Arc<Access> {
        self.now
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces it for connections made from now on.
    pub fn replace(&self, access: Access) {
        *self.now.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(access);
        self.changed.notify_waiters();
    }

    /// Replaces the TLS setup only (a reload that left the credentials as they were): the
    /// credentials in force, which a followed password change may have set, stay.
    pub fn replace_tls(&self, tls: Option<UpstreamTlsConnector>) {
        self.update(|now| {
            Some(Access {
                user: now.user.clone(),
                password: now.password.clone(),
                tls,
            })
        });
    }

    /// Follows a change of Redis's `default` password (a `CONFIG SET requirepass` Redis
    /// accepted through corral): connections made from now on authenticate with `password`
    /// (none if empty), when corral authenticates as `default`. Returns whether it applied.
    pub fn follow_default_password(&self, password: Option<&str>) -> bool {
        self.update(|now| {
            if now.user.as_deref().is_some_and(|u| u != "default") {
                return None;
            }
            Some(Access {
                user: now.user.clone(),
                password: password.filter(|p| !p.is_empty()).map(String::from),
                tls: now.tls.clone(),
            })
        })
    }

    /// Replaces the access with what `change` makes of the one in force, under one lock, so
    /// that a reload and a followed password change cannot undo each other. Returns whether
    /// it changed (`change` returned something).
    fn update(&self, change: impl FnOnce(&Access) -> Option<Access>) -> bool {
        let mut now = self.now.write().unwrap_or_else(PoisonError::into_inner);
        let Some(next) = change(&now) else {
            return false;
        };
        *now = Arc::new(next);
        drop(now);
        self.changed.notify_waiters();
        true
    }

    /// Completes at the next [`UpstreamAccess::replace`].
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::{Access, UpstreamAccess};

    fn as_user(user: Option<&str>) -> UpstreamAccess {
        UpstreamAccess::new(Access {
            user: user.map(String::from),
            password: Some("old".into()),
            tls: None,
        })
    }

    #[test]
    fn only_the_default_users_password_is_followed() {
        for user in [None, Some("default")] {
            let access = as_user(user);
            assert!(access.follow_default_password(Some("new")));
            assert_eq!(access.current().password.as_deref(), Some("new"));
            assert_eq!(access.current().user.as_deref(), user);
            assert!(access.follow_default_password(Some("")));
            assert_eq!(access.current().password, None);
        }
        // corral logs in as another Redis user: the default user's password is not its own.
        let access = as_user(Some("app"));
        assert!(!access.follow_default_password(Some("new")));
        assert_eq!(access.current().password.as_deref(), Some("old"));
    }
}
