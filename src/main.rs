//! The `corral` binary: flags and config file, logging, signals; the work is in the library.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use corral::{Config, Listeners, Reloader};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// mimalloc, not the system allocator: a cached GET allocates and frees small objects (a
/// fill's shared state, its key, reply buffers) where a forwarded one does not, and glibc's
/// malloc spent about 60 ns per request on them on a 90/10 GET/SET mix, much of it merging
/// freed chunks (`malloc_consolidate`) before each new 16 KiB read buffer. Built with
/// `no_thp`: see Cargo.toml. [`corral::Heap`] asks it for plain blocks where it can.
#[global_allocator]
static ALLOCATOR: corral::Heap = corral::Heap;

/// A drop-in caching proxy for Redis.
#[derive(Debug, Clone, Parser)]
#[command(version, about)]
struct Args {
    /// TOML config file; flags override its values.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address clients connect to [default: 127.0.0.1:6380].
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// TLS listener for clients, beside the plain one (certificates in the config's [tls]).
    #[arg(long, value_name = "ADDR")]
    tls_listen: Option<String>,
    /// Upstream Redis, redis[s]://[user[:pass]@]HOST:PORT (rediss: TLS, see [upstream.tls])
    /// [default: redis://127.0.0.1:6379].
    #[arg(long, value_name = "URL")]
    upstream: Option<String>,
    /// Front a Redis Cluster: comma-separated seed nodes, redis[s]://HOST:PORT[,...].
    #[arg(long, value_name = "URLS", value_delimiter = ',')]
    cluster: Vec<String>,
    /// Address of the HTTP admin endpoint (/healthz, /metrics).
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,
    /// Turn off the local cache and read coalescing.
    #[arg(long)]
    no_cache: bool,
    /// Password clients must give with AUTH or HELLO.
    #[arg(
        long,
        value_name = "PASS",
        env = "CORRAL_REQUIREPASS",
        hide_env_values = true
    )]
    requirepass: Option<String>,
    /// Log level or tracing filter (RUST_LOG overrides it).
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let cfg = match load(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("corral: {e}");
            return ExitCode::from(2);
        }
    };
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&cfg.log_level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
    match corral::keep_heap_off_huge_pages() {
        corral::HeapPages::AsIs => {}
        corral::HeapPages::OffButAdvised => tracing::info!(
            "transparent huge pages are `always` on this host: off for corral's heap, on for the cache's tables"
        ),
        corral::HeapPages::Off => tracing::info!(
            "transparent huge pages are `always` on this host: off for corral (this kernel cannot keep them for the cache's tables alone)"
        ),
    }
    // One thread: a current-thread runtime, with no cross-thread wake-ups at all.
    let mut builder = if cfg.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    if cfg.threads > 1 {
        builder.worker_threads(cfg.threads);
    }
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("corral: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(cfg, args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn load(args: &Args) -> Result<Config, corral::error::ConfigError> {
    let mut cfg = match &args.config {
        // Validated once the flags are applied: `--tls-listen` may complete a `[tls]` section.
        Some(path) => Config::read(path)?,
        None => Config::default(),
    };
    if let Some(v) = &args.listen {
        cfg.listen.clone_from(v);
    }
    if let Some(v) = &args.tls_listen {
        cfg.tls.listen.clone_from(v);
    }
    if let Some(v) = &args.upstream {
        cfg.upstream.url.clone_from(v);
    }
    if !args.cluster.is_empty() {
        cfg.cluster.seeds.clone_from(&args.cluster);
    }
    if let Some(v) = &args.admin {
        cfg.admin.clone_from(v);
    }
    if args.no_cache {
        cfg.cache.enabled = false;
    }
    if let Some(v) = &args.requirepass {
        cfg.requirepass = corral::config::Secret(v.clone());
    }
    if let Some(v) = &args.log_level {
        cfg.log_level.clone_from(v);
    }
    cfg.validate()?;
    Ok(cfg)
}

async fn serve(cfg: Config, args: Args) -> Result<(), corral::Error> {
    let bind = |addr: String| async move {
        TcpListener::bind(&addr)
            .await
            .map_err(|cause| corral::Error::Io {
                what: format!("cannot listen on {addr}"),
                cause,
            })
    };
    let client = bind(cfg.listen.clone()).await?;
    let admin = match cfg.admin.as_str() {
        "" => None,
        a => Some(bind(a.to_string()).await?),
    };
    let tls = match cfg.tls.enabled() {
        true => Some(bind(cfg.tls.listen.clone()).await?),
        false => None,
    };
    let shutdown = CancellationToken::new();
    let reloader = Reloader::default();
    tokio::spawn(signals(shutdown.clone(), reloader.clone(), args));
    let listeners = Listeners { client, admin, tls };
    corral::run_with(Arc::new(cfg), listeners, shutdown, reloader).await
}

/// SIGTERM or SIGINT starts a graceful shutdown; SIGHUP reloads the config file.
async fn signals(shutdown: CancellationToken, reloader: Reloader, args: Args) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => reload(&reloader, &args),
        }
    }
    tracing::info!("shutdown requested");
    shutdown.cancel();
}

/// Re-reads the config file (flags still override it) and applies what can change while
/// running (see `corral::reload`); on any error the running settings stay as they were.
fn reload(reloader: &Reloader, args: &Args) {
    let result = load(args)
        .map_err(|e| e.to_string())
        .and_then(|cfg| reloader.reload(&cfg));
    match result {
        Ok(done) => {
            tracing::info!(applied = ?done.applied, "configuration reloaded");
            if !done.need_restart.is_empty() {
                tracing::warn!(
                    settings = ?done.need_restart,
                    "changed settings that only take effect after a restart were not applied"
                );
            }
        }
        Err(e) => {
            tracing::error!(cause = %e, "configuration reload failed; keeping the running settings")
        }
    }
}
