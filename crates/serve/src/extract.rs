//! Extractors whose rejections answer in the API's format ([`ApiError`]): a JSON body
//! ([`Body`]), path parameters ([`Params`]), and a session id in a path ([`session_id`]).

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Path, Request};
use axum::http::StatusCode;
use keel_contracts::SessionId;

use crate::error::ApiError;

/// A JSON body whose rejections answer in our format: malformed JSON and a body of the
/// wrong shape (a missing or unknown field, a wrong type) 400 `bad_request`, too large 413
/// `payload_too_large`, not JSON 415 `unsupported_media_type`.
pub(crate) struct Body<T>(pub(crate) T);

impl<S, T> FromRequest<S> for Body<T>
where
    axum::Json<T>: FromRequest<S, Rejection = JsonRejection>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(request, state).await {
            Ok(axum::Json(value)) => Ok(Body(value)),
            // axum answers a body of the wrong shape 422 and malformed JSON 400; both are
            // a bad request here (400 `bad_request`), so the status and the code agree.
            Err(rejection) => Err(match rejection.status() {
                StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    rejection.body_text(),
                ),
                StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "unsupported_media_type",
                    rejection.body_text(),
                ),
                _ => ApiError::bad_request(rejection.body_text()),
            }),
        }
    }
}

/// Path parameters whose rejections (say, bytes that are not UTF-8) answer in our format.
pub(crate) struct Params<T>(pub(crate) T);

impl<S, T> axum::extract::FromRequestParts<S> for Params<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(Params(value)),
            Err(rejection) => Err(ApiError::bad_request(rejection.body_text())),
        }
    }
}

/// A session id in a path: a full UUID, nothing else (no prefixes, no paths).
pub(crate) fn session_id(text: &str) -> Result<SessionId, ApiError> {
    uuid::Uuid::try_parse(text)
        .map(SessionId)
        .map_err(|_| ApiError::bad_request("a session id is a UUID (36 characters)"))
}
