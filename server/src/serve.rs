//! Start, run and stop: the port is bound first and `/healthz` answers at once; the engines load
//! on a blocking thread (`/readyz` is 503 until they are in). On shutdown the server turns
//! unready (503 to new renders) while in-flight renders finish, up to the drain deadline; the
//! rest are cancelled, then it stops accepting and closes.

use crate::config::{Config, ServeArgs};
use crate::engines::EngineSet;
use crate::routes::router;
use crate::state::{AppState, ServerState};
use crate::tempdirs;
use anyhow::{Context, Result};
use cadence::musetalk::Engines;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// Extra time after the drain deadline for cancelled renders to stop and answers to go out,
/// after which the server closes whatever is still open (a client that never reads).
const CLOSE_GRACE: Duration = Duration::from_secs(10);

/// `cadence serve`: logs to stderr (`RUST_LOG` filters, default info), runs until SIGTERM or
/// SIGINT, then drains.
pub fn serve(args: ServeArgs) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).try_init();
    let config = args.config()?;
    crate::admission::cap_malloc_arenas(config.slots);
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(async move {
        let listener =
            TcpListener::bind(config.listen).await.with_context(|| format!("cannot listen on {}", config.listen))?;
        run(config, None, listener, shutdown_signal()).await
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("SIGINT"),
        _ = term => tracing::info!("SIGTERM"),
    }
}

/// Serves on `listener` until `shutdown` resolves, then drains. `engines`: loaded before (tests
/// share one set between servers); None loads them from the configuration.
pub async fn run(
    config: Config,
    engines: Option<Arc<Engines>>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    tempdirs::create_root(&config.temp_root)?;
    let swept = tempdirs::sweep_stale(&config.temp_root)?;
    if swept > 0 {
        tracing::info!(swept, root = %config.temp_root.display(), "removed stale request directories");
    }
    let addr = listener.local_addr()?;
    let fleet = match &config.fleet {
        Some(f) => Some(Arc::new(crate::fleet::Fleet::connect(f.clone()).await?)),
        None => None,
    };
    let state: AppState = Arc::new(ServerState::new(config)?);
    if let Some(fleet) = fleet {
        tracing::info!(nats = %fleet.config.url, replica = %fleet.config.replica, "in a fleet: jobs go to its queue");
        let _ = state.fleet.set(fleet.clone());
        tokio::spawn(crate::fleet_jobs::worker(state.clone(), fleet.clone()));
        tokio::spawn(async move { fleet.fail_exhausted_jobs().await });
    }
    tracing::info!(%addr, slots = state.config.slots, queue = state.config.queue, jobs = %state.jobs.dir().display(), "listening on http://{addr}");

    // Finished jobs expire after the TTL (their records and files).
    let st = Arc::downgrade(&state);
    tokio::spawn(async move {
        while let Some(state) = st.upgrade() {
            let every = state.jobs.sweep_interval();
            let expired = state.jobs.expire();
            if expired > 0 {
                tracing::info!(expired, "expired finished jobs");
            }
            drop(state);
            tokio::time::sleep(every).await;
        }
    });

    // Sessions whose peer left, or that idled, end.
    crate::sessions::spawn_reaper(state.clone());

    let st = state.clone();
    tokio::task::spawn_blocking(move || {
        let t = Instant::now();
        let c = &st.config;
        let set = match engines {
            Some(e) => EngineSet::with_engines(e, &c.engines, c.backend),
            None => EngineSet::load(&c.engines, c.backend),
        };
        match set {
            Ok(set) => {
                let p = set.primary();
                tracing::info!(ms = t.elapsed().as_millis() as u64, engines = %p.describe(), weights = %p.weights_summary(), "engines ready");
                st.set_engines(set);
            }
            Err(e) => {
                tracing::error!("the engines failed to load: {e:#}");
                st.set_failed(format!("{e:#}"));
            }
        }
    });

    let (closing_tx, closing_rx) = tokio::sync::oneshot::channel::<()>();
    let st = state.clone();
    let graceful = async move {
        shutdown.await;
        drain(&st).await;
        let _ = closing_tx.send(());
    };
    let server = crate::listen::serve(listener, router(state.clone()), state.clone(), graceful);
    let hard_stop = async move {
        if closing_rx.await.is_ok() {
            tokio::time::sleep(CLOSE_GRACE).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = server => {}
        _ = hard_stop => tracing::warn!("connections still open {CLOSE_GRACE:?} after the drain: closing them"),
    }
    tracing::info!("stopped");
    Ok(())
}

/// Unready, then wait for the in-flight requests up to the deadline, then cancel the rest.
async fn drain(state: &AppState) {
    state.start_draining();
    // A live session has no end to wait for: it ends now.
    state.sessions.close_all();
    let deadline = Instant::now() + state.config.drain;
    tracing::info!(in_flight = state.inflight(), "draining");
    while state.inflight() > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let n = state.cancel_all();
            tracing::warn!(cancelled = n, "drain deadline reached: cancelling the renders still running");
            break;
        }
        let _ = tokio::time::timeout(left.min(Duration::from_millis(100)), state.inflight_done.notified()).await;
    }
}

/// A server on its own thread and runtime (tests, embedding). Shut down by [`Self::shutdown`],
/// as SIGTERM would, or when dropped.
pub struct RunningServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

pub fn spawn(config: Config, engines: Option<Arc<Engines>>) -> Result<RunningServer> {
    let listener = std::net::TcpListener::bind(config.listen).with_context(|| format!("binding {}", config.listen))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new().name(format!("cadence-serve-{addr}")).spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        rt.block_on(async move {
            let listener = TcpListener::from_std(listener)?;
            run(config, engines, listener, async {
                let _ = stopped.await;
            })
            .await
        })
    })?;
    Ok(RunningServer { addr, stop: Some(stop), thread: Some(thread) })
}

impl RunningServer {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Starts the shutdown (drain, then close) without waiting for it.
    pub fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    /// Shuts down and waits until the server has stopped.
    pub fn stop(mut self) -> Result<()> {
        self.shutdown();
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => anyhow::bail!("the server thread panicked"),
            None => Ok(()),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
