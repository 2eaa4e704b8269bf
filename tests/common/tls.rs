//! TLS test fixtures: a throwaway certificate authority writing PEM files with rcgen, and a
//! TLS-only `redis-server`. Self-contained (std and rcgen only) so the library's unit tests
//! can include this file too.
#![allow(dead_code)]

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

/// A PEM certificate chain and its key, as files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A certificate authority with its own temporary directory (removed on drop) where the CA
/// certificate and every certificate it issues are written.
pub struct Pki {
    pub dir: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
}

fn unique_dir(what: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("corral-{what}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a temp dir");
    dir
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn leaf_params(common_name: &str, sans: &[&str]) -> CertificateParams {
    let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
    // `new` turns SANs that parse as IP addresses into IP SANs.
    let mut params = CertificateParams::new(sans).expect("valid SANs");
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    // Both uses, so one certificate can serve as a server's or a client's.
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params
}

impl Pki {
    /// A fresh CA; `ca.pem` in its directory.
    pub fn new() -> Pki {
        let dir = unique_dir("pki");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // A name of its own: two CAs with one name would make a foreign certificate look
        // like a forged one (BadSignature) rather than an unknown one.
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
        params.distinguished_name.push(
            DnType::CommonName,
            format!("corral test CA {}", name.unwrap_or_default()),
        );
        let key = KeyPair::generate().expect("generate a key");
        let ca = CertifiedIssuer::self_signed(params, key).expect("self-sign the CA");
        write(&dir.join("ca.pem"), &ca.pem());
        Pki { dir, ca }
    }

    /// The CA certificate's file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A certificate for `sans` (DNS names or IP addresses) signed by this CA, written as
    /// `NAME.pem` and `NAME.key`.
    pub fn issue(&self, name: &str, sans: &[&str]) -> CertFiles {
        let key = KeyPair::generate().expect("generate a key");
        let cert = leaf_params(name, sans)
            .signed_by(&key, &self.ca)
            .expect("sign a certificate");
        self.save(name, &cert.pem(), &key.serialize_pem())
    }

    /// A self-signed certificate for `sans`, trusted by nobody.
    pub fn self_signed(&self, name: &str, sans: &[&str]) -> CertFiles {
        let key = KeyPair::generate().expect("generate a key");
        let cert = leaf_params(name, sans)
            .self_signed(&key)
            .expect("self-sign a certificate");
        self.save(name, &cert.pem(), &key.serialize_pem())
    }

    fn save(&self, name: &str, cert: &str, key: &str) -> CertFiles {
        let files = CertFiles {
            cert: self.dir.join(format!("{name}.pem")),
            key: self.dir.join(format!("{name}.key")),
        };
        write(&files.cert, cert);
        write(&files.key, key);
        files
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `redis-server` that listens with TLS only (`--port 0 --tls-port P`), killed on drop.
pub struct TlsRedis {
    pub port: u16,
    child: Child,
    dir: PathBuf,
}

impl TlsRedis {
    /// Starts one with `server` as its certificate, trusting `pki`'s CA for client
    /// certificates, which it requires when `auth_clients` is true.
    pub fn start(pki: &Pki, server: &CertFiles, auth_clients: bool) -> TlsRedis {
        let ca = pki.ca_file();
        let args: Vec<String> = [
            "--tls-cert-file".as_ref(),
            server.cert.as_os_str(),
            "--tls-key-file".as_ref(),
            server.key.as_os_str(),
            "--tls-ca-cert-file".as_ref(),
            ca.as_os_str(),
            "--tls-auth-clients".as_ref(),
            if auth_clients { "yes" } else { "no" }.as_ref(),
        ]
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
        Self::start_with(&args)
    }

    /// Starts one with the given TLS arguments, retrying on another port if the chosen one
    /// turns out to be taken.
    pub fn start_with(tls_args: &[String]) -> TlsRedis {
        for _ in 0..10 {
            // Redis treats --port 0 as "no TCP", so pick a free port ourselves.
            let port = StdListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("bind an ephemeral port")
                .port();
            if let Some(s) = Self::spawn_on(port, tls_args) {
                return s;
            }
        }
        panic!("could not start a TLS redis-server on a free port after 10 tries");
    }

    fn spawn_on(port: u16, tls_args: &[String]) -> Option<TlsRedis> {
        let dir = unique_dir(&format!("tls-redis-{port}"));
        let log = dir.join("redis.log");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", "0"])
            .args(["--tls-port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(&log)
            .args(tls_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run redis-server ({e}); install it: apt-get install -y redis-server")
            });
        let mut server = TlsRedis { port, child, dir };
        server
            .wait_ready(&log, Duration::from_secs(10))
            .then_some(server)
    }

    /// A plain PING cannot probe a TLS port, so readiness is read from the server's log; a
    /// server that could not bind exits instead.
    fn wait_ready(&mut self, log: &Path, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if std::fs::read_to_string(log).is_ok_and(|t| t.contains("Ready to accept connections"))
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The server's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// True when this box's redis-cli was built with TLS.
pub fn redis_cli_has_tls() -> bool {
    Command::new("redis-cli")
        .arg("--help")
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout).contains("--tls")
                || String::from_utf8_lossy(&o.stderr).contains("--tls")
        })
}

/// Runs `redis-cli --tls` against `port` on 127.0.0.1, trusting `ca`, presenting `client`
/// if given.
pub fn redis_cli_tls(port: u16, ca: &Path, client: Option<&CertFiles>, args: &[&str]) -> Output {
    let mut cmd = Command::new("redis-cli");
    cmd.args([
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "--tls",
        "--cacert",
    ])
    .arg(ca);
    if let Some(c) = client {
        cmd.arg("--cert").arg(&c.cert).arg("--key").arg(&c.key);
    }
    cmd.args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli")
}
