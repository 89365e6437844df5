//! The one mapping from failures to answers (HOUSE-STYLE §4): `{"error": {"code",
//! "message"}}` with the status that fits, from the composition root's errors (a usage
//! error is the client's 400) and the kernel's.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use keel_kernel::KernelError;
use serde_json::json;

/// A failure, as the client sees it.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    pub(crate) message: String,
    retry_after: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError { status, code, message: message.into(), retry_after: None }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub(crate) fn conflict(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, code, message)
    }

    pub(crate) fn locked(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::LOCKED, "locked", message)
    }

    pub(crate) fn overloaded(message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after: Some(5),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", message)
        }
    }

    pub(crate) fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub(crate) fn internal(error: impl std::fmt::Display) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", error.to_string())
    }

    /// A composition-root error: a usage error is the client's (400), the rest ours.
    pub(crate) fn from_root(error: anyhow::Error) -> ApiError {
        if keel_host::error::is_usage(&error) {
            ApiError::bad_request(format!("{error:#}"))
        } else {
            ApiError::internal(format!("{error:#}"))
        }
    }

    /// The one mapping of kernel errors.
    pub(crate) fn from_kernel(error: KernelError) -> ApiError {
        match &error {
            KernelError::Sealed(_) => ApiError::locked(error.to_string()),
            KernelError::SessionNotFound(_) => ApiError::not_found(error.to_string()),
            KernelError::Leased { .. } => ApiError::conflict("run_active", error.to_string()),
            KernelError::NothingToResume(_) => {
                ApiError::conflict("nothing_to_resume", error.to_string())
            }
            KernelError::Append(keel_contracts::AppendError::SeqConflict { .. }) => {
                ApiError::conflict("run_active", error.to_string())
            }
            _ => ApiError::internal(error.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
