//! `redis-server` processes on free loopback ports, each with its own directory.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` child process, killed on drop.
pub struct RedisServer {
    pub port: u16,
    child: Child,
    dir: PathBuf,
    extra: Vec<String>,
}

pub(super) fn free_port() -> u16 {
    // Redis treats --port 0 as "no TCP", so pick a free port ourselves.
    let l = StdListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// A port that was free a moment ago, for processes that must be told a port (the corral binary).
pub fn unused_port() -> u16 {
    free_port()
}

impl RedisServer {
    /// Starts a server with default test settings.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a server with extra command-line arguments (e.g. `["--requirepass", "pw"]`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for _ in 0..10 {
            let port = free_port();
            if let Some(s) = Self::spawn_on(port, &extra) {
                return s;
            }
        }
        panic!("could not start redis-server on a free port after 10 tries");
    }

    pub(super) fn spawn_on(port: u16, extra: &[String]) -> Option<RedisServer> {
        let dir = std::env::temp_dir().join(format!("corral-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run redis-server ({e}); install it: apt-get install -y redis-server")
            });
        let mut server = RedisServer {
            port,
            child,
            dir,
            extra: extra.to_vec(),
        };
        if server.wait_ready(Duration::from_secs(10)) {
            Some(server)
        } else {
            None
        }
    }

    fn wait_ready(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(mut s) = StdStream::connect(("127.0.0.1", self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
                let mut buf = [0u8; 64];
                // A loading or password-protected server still proves it is listening.
                if s.write_all(b"PING\r\n").is_ok() && matches!(s.read(&mut buf), Ok(n) if n > 0) {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Whether the process is still running (not killed, not exited).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port (after `kill`), with empty data.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(mut fresh) = Self::spawn_on(self.port, &self.extra) {
                std::mem::swap(&mut self.child, &mut fresh.child);
                // `fresh` now holds the dead process; keep its drop away from the shared dir.
                fresh.dir = PathBuf::new();
                return;
            }
            assert!(Instant::now() < deadline, "redis-server did not restart");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends a signal (e.g. "STOP", "CONT") to the server process.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -{sig} failed");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
