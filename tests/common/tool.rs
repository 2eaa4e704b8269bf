//! External programs (redis-cli, python3) run by tests.

use std::time::Duration;

// ---- external programs (redis-cli, python3) ----

/// Runs `program args`, feeding `stdin`; returns stdout, panicking with stderr if it fails.
pub async fn run_tool(program: &str, args: &[&str], stdin: &[u8]) -> String {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program} ({e}); run scripts/deps.sh"));
    let mut input = child.stdin.take().expect("stdin");
    let stdin = stdin.to_vec();
    // Written from a task so a large input cannot block against unread output.
    let writer = tokio::spawn(async move {
        let _ = input.write_all(&stdin).await;
    });
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{program} {args:?} did not finish"))
        .expect("wait");
    writer.await.expect("stdin writer");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Fails the test unless python3 can import redis-py, a required test dependency
/// (scripts/deps.sh installs it): missing, it fails rather than skips.
pub fn require_redis_py() {
    let probe = std::process::Command::new("python3")
        .args(["-c", "import redis"])
        .output()
        .expect("python3 is needed for this test");
    assert!(
        probe.status.success(),
        "the redis-py package is missing ({}); install it with scripts/deps.sh \
         (python3 -m pip install redis)",
        String::from_utf8_lossy(&probe.stderr).trim()
    );
}
