//! Around every request: a request id (the client's `X-Request-Id` when it is a plain token,
//! else a fresh one) on the response and on every log line of the request, the request counted
//! by route and status, the body read on a task of its own that cuts off a body too slow (408)
//! and reads a refused one to its end ([`crate::linger`]), and the bearer token checked.

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Routes open without the token: a load balancer's probes carry none, and the page holds no
/// data (it asks for the token to send with its renders).
pub const OPEN_ROUTES: [&str; 3] = ["/", "/healthz", "/readyz"];

fn client_id(req: &Request) -> Option<String> {
    let v = req.headers().get(&REQUEST_ID)?.to_str().ok()?;
    let ok = !v.is_empty() && v.len() <= 64 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    ok.then(|| v.to_string())
}

/// The status a request is counted under when its client closed the connection before the
/// answer (nginx's convention; the future is dropped, no status is ever sent).
pub const CLIENT_CLOSED: u16 = 499;

/// Counts and logs a request whose future is dropped before it answered.
struct Unanswered {
    state: AppState,
    route: String,
    span: tracing::Span,
    started: Instant,
    answered: bool,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if !self.answered {
            self.state.metrics.request(&self.route, CLIENT_CLOSED);
            let ms = format!("{:.1}", self.started.elapsed().as_secs_f64() * 1e3);
            self.span.in_scope(|| tracing::warn!(ms, "the client closed the connection: its work is cancelled"));
        }
    }
}

pub async fn context(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let id = client_id(&req).unwrap_or_else(|| state.request_id());
    let route = req.extensions().get::<MatchedPath>().map_or("unmatched", |m| m.as_str()).to_string();
    let span = tracing::info_span!("request", id = %id, method = %req.method(), path = %req.uri().path());
    let t = Instant::now();
    let mut pending = Unanswered { state: state.clone(), route, span: span.clone(), started: t, answered: false };
    let mut resp = next.run(req).instrument(span.clone()).await;
    pending.answered = true;
    let status = resp.status().as_u16();
    state.metrics.request(&pending.route, status);
    span.in_scope(|| tracing::info!(status, ms = format!("{:.1}", t.elapsed().as_secs_f64() * 1e3), "answered"));
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(REQUEST_ID, v);
    }
    resp
}

/// The body read on a task of its own ([`crate::linger`]); a body cut off as too slow is
/// answered 408 (whatever the handler made of the error it read), and its connection closed.
pub async fn linger(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let timed_out = Arc::new(AtomicBool::new(false));
    let timeout = state.config.body_timeout;
    let req = crate::linger::wrap(req, state.config.max_body_bytes.saturating_mul(2), timeout, timed_out.clone());
    let resp = next.run(req).await;
    if !timed_out.load(Ordering::SeqCst) {
        return resp;
    }
    state.metrics.rejection("body_timeout");
    let message = format!(
        "the request body arrived too slowly: it had {:.0} s, and a second more for every {} bytes, up to {:.0} s \
         (--body-timeout-seconds, --body-min-rate, --body-max-seconds)",
        timeout.initial.as_secs_f64(),
        timeout.min_rate,
        timeout.max.as_secs_f64()
    );
    let mut resp = ApiError::new(StatusCode::REQUEST_TIMEOUT, "request_timeout", message).into_response();
    resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

pub async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(token) = state.config.token.as_deref() else { return next.run(req).await };
    if OPEN_ROUTES.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer_token);
    match given {
        Some(g) if constant_time_eq(g.trim().as_bytes(), token.as_bytes()) => next.run(req).await,
        _ => {
            state.metrics.rejection("unauthorized");
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "a valid bearer token is required (Authorization: Bearer ...)",
            )
            .into_response()
        }
    }
}

/// The token of an `Authorization: Bearer <token>` value. The scheme's name is case-insensitive
/// (RFC 9110 11.1): `bearer` and `BEARER` are `Bearer`.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

/// Compares without stopping at the first difference, so timing does not reveal the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for v in ["Bearer s3cret", "bearer s3cret", "BEARER s3cret", "bEaReR s3cret"] {
            assert_eq!(super::bearer_token(v), Some("s3cret"), "{v}");
        }
        for v in ["Basic s3cret", "Bearers3cret", "Bearer", "s3cret"] {
            assert_eq!(super::bearer_token(v), None, "{v}");
        }
    }

    #[test]
    fn token_comparison() {
        assert!(super::constant_time_eq(b"secret", b"secret"));
        assert!(!super::constant_time_eq(b"secret", b"secreT"));
        assert!(!super::constant_time_eq(b"secret", b"secrets"));
    }
}
