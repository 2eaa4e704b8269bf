//! The `default` user's password (`requirepass`). It starts as the config's; a
//! `CONFIG SET requirepass` that Redis accepted through corral, or a reload, replaces it while
//! clients are connected, as `CONFIG SET requirepass` does on Redis.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

/// The `default` user's password, shared by every client connection. Read when a client
/// connects, authenticates or resets: never on a command's path.
#[derive(Default)]
pub struct DefaultPassword(RwLock<Option<Arc<str>>>);

impl fmt::Debug for DefaultPassword {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_set() { "MASKED" } else { "none" })
    }
}

impl DefaultPassword {
    /// Starts with `password` (`None`: clients need not authenticate).
    pub fn new(password: Option<&str>) -> DefaultPassword {
        DefaultPassword(RwLock::new(password.map(Arc::from)))
    }

    /// The password now.
    pub fn get(&self) -> Option<Arc<str>> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether clients must authenticate (as `default`, or as anyone else).
    pub fn is_set(&self) -> bool {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// Replaces it for authentications from now on; clients already authenticated stay so,
    /// as in Redis. An empty password is none.
    pub fn set(&self, password: Option<&str>) {
        let password = password.filter(|p| !p.is_empty()).map(Arc::from);
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = password;
    }
}

#[cfg(test)]
mod tests {
    use super::DefaultPassword;

    #[test]
    fn set_replaces_and_empty_clears() {
        let p = DefaultPassword::new(None);
        assert!(!p.is_set());
        p.set(Some("s3cret"));
        assert_eq!(p.get().as_deref(), Some("s3cret"));
        assert_eq!(format!("{p:?}"), "MASKED");
        p.set(Some(""));
        assert!(p.get().is_none());
    }
}
