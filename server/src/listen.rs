//! The accept loop: the router served on each connection by hyper's HTTP/1 with a timer, so a
//! request head must arrive within `--header-timeout-seconds` (`axum::serve` sets no timer: a
//! client sending its headers a line a second held a connection for as long as it liked).
//! Every connection is watched for the graceful shutdown, as `axum::serve`'s are: on the signal
//! the listener closes, idle connections close, and requests in flight finish.

use crate::state::AppState;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;

/// Serves `app` on `listener` until `shutdown` resolves, then waits for the open connections'
/// requests to finish.
pub async fn serve(listener: TcpListener, app: Router, state: AppState, shutdown: impl Future<Output = ()>) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(state.config.header_timeout);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors and the like: wait rather than spin (axum::serve does
                    // the same); an error of one connection's handshake is that connection's.
                    if !is_connection_error(&e) {
                        tracing::error!("accepting a connection: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        let state = state.clone();
        tokio::spawn(async move {
            match conn.await {
                Err(e) if e.is_timeout() => {
                    state.metrics.rejection("header_timeout");
                    tracing::info!(
                        "closed a connection that sent no whole request head in time (--header-timeout-seconds)"
                    );
                }
                Err(e) => tracing::debug!("connection: {e}"),
                Ok(()) => {}
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset)
}
