//! Every error the server answers: a status, a stable machine-readable code and a one-line
//! message, sent as `{"error": {"code", "message"}}` and logged inside the request's span (which
//! carries the request id).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds for `Retry-After` (429 and 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), retry_after: None }
    }

    /// 422: the request is well formed but its content cannot be rendered.
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
    }

    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    pub fn unavailable(code: &'static str, message: impl Into<String>) -> Self {
        Self { retry_after: Some(5), ..Self::new(StatusCode::SERVICE_UNAVAILABLE, code, message) }
    }

    /// A 500: the client reads that `what` failed; the `detail` (an error chain, a library's native
    /// codes and debugging text) goes to the log only, here, inside the request's span where
    /// there is one: it says nothing a client can act on, and may say what a client should not
    /// know (paths, versions).
    pub fn internal(what: &str, detail: impl std::fmt::Display) -> Self {
        tracing::error!(detail = %detail, "{what}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("{what}: an error inside the server (its log has the details)"),
        )
    }

    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status.as_u16(), self.code, self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(status = self.status.as_u16(), code = self.code, "{}", self.message);
        } else {
            tracing::warn!(status = self.status.as_u16(), code = self.code, "{}", self.message);
        }
        let body = serde_json::json!({"error": {"code": self.code, "message": self.message}});
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 500 tells the client what failed, never the error's detail: a library's native codes
    /// and debugging text, paths on the server.
    #[test]
    fn an_internal_error_keeps_its_detail_out_of_the_answer() {
        let detail = "MP4: /srv/tmp/req-1/out.mp4: OpenH264 encountered an error. Native:16384. Backtraces enabled.";
        let e = ApiError::internal("the render failed", detail);
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(e.message.starts_with("the render failed"), "{}", e.message);
        for leak in ["Native", "Backtraces", "/srv/tmp", "OpenH264"] {
            assert!(!e.message.contains(leak), "{leak} in {}", e.message);
        }
    }
}
