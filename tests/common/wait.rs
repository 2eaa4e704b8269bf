//! Bounded waits for something to happen, instead of sleeps.

use std::time::{Duration, Instant};

/// Calls `f` every 20 ms until it returns `Some`, and returns that; panics naming `what` after
/// `limit`. Used instead of sleeps wherever a test waits for something to happen.
pub async fn poll_until<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// cannot): call [`Deadline::pause`] between attempts.
pub struct Deadline {
    end: Instant,
    what: String,
    every: Duration,
}

impl Deadline {
    /// A deadline `limit` from now for `what`, with 20 ms between attempts.
    pub fn new(limit: Duration, what: impl Into<String>) -> Deadline {
        Deadline {
            end: Instant::now() + limit,
            what: what.into(),
            every: Duration::from_millis(20),
        }
    }

    /// The same deadline with `every` between attempts (for attempts that cost the server).
    pub fn every(self, every: Duration) -> Deadline {
        Deadline { every, ..self }
    }

    /// Panics if the deadline has passed, else waits before the next attempt.
    pub async fn pause(&self) {
        assert!(
            Instant::now() < self.end,
            "timed out waiting for {}",
            self.what
        );
        tokio::time::sleep(self.every).await;
    }

    /// [`Deadline::pause`], naming what the last attempt saw if the deadline has passed.
    pub async fn pause_seeing(&self, last: impl std::fmt::Debug) {
        assert!(
            Instant::now() < self.end,
            "timed out waiting for {}; last saw {last:?}",
            self.what
        );
        tokio::time::sleep(self.every).await;
    }
}

/// Checks `done` every 50 ms, blocking the thread (for the cluster harness's synchronous
/// steps), until it holds; panics naming `what` after `limit`.
pub fn block_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
