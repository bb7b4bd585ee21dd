//! Who may read diagnostics: the caller's bearer token, authenticated by a TokenReview
//! and authorised by a SubjectAccessReview for the request's verb and path, as
//! controller-runtime's `filters.WithAuthenticationAndAuthorization` does.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;

/// What the apiserver said about a caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Authenticated and allowed.
    Allowed {
        /// The user the token belongs to.
        user: String,
    },
    /// No bearer token, or one the apiserver does not authenticate: 401.
    Unauthenticated(String),
    /// Authenticated, not allowed: 403.
    Forbidden {
        /// The user the token belongs to.
        user: String,
        /// The authorizer's reason, when it gave one.
        reason: String,
    },
    /// A review could not be made (the apiserver is unreachable, or refused us): 500.
    Failed(String),
}

impl Decision {
    /// The HTTP status this decision answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            Decision::Allowed { .. } => StatusCode::OK,
            Decision::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Decision::Forbidden { .. } => StatusCode::FORBIDDEN,
            Decision::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// The bearer token of an `Authorization` header value, if it is one.
pub fn bearer(value: Option<&str>) -> Option<&str> {
    let value = value?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Reviews callers through the apiserver.
pub struct Access {
    client: kube::Client,
}

impl Access {
    /// Reviews through `client` (which needs `create` on `tokenreviews` and
    /// `subjectaccessreviews`).
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    /// May the bearer of `token` do `verb` on the non-resource `path`?
    pub async fn decide(&self, token: Option<&str>, verb: &str, path: &str) -> Decision {
        let Some(token) = token else {
            return Decision::Unauthenticated("no bearer token".into());
        };
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let reviewed = match Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
        {
            Ok(reviewed) => reviewed.status.unwrap_or_default(),
            Err(error) => return Decision::Failed(format!("TokenReview: {error}")),
        };
        if reviewed.authenticated != Some(true) {
            return Decision::Unauthenticated(
                reviewed
                    .error
                    .unwrap_or_else(|| "the token is not valid".into()),
            );
        }
        let user = reviewed.user.unwrap_or_default();
        let name = user.username.clone().unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some(verb.to_owned()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        match Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
        {
            Ok(answer) => {
                let status = answer.status.unwrap_or_default();
                if status.allowed {
                    Decision::Allowed { user: name }
                } else {
                    Decision::Forbidden {
                        user: name,
                        reason: status.reason.unwrap_or_default(),
                    }
                }
            }
            Err(error) => Decision::Failed(format!("SubjectAccessReview: {error}")),
        }
    }
}

/// The middleware: reviews every request, answers 401/403/500 itself, passes the
/// allowed ones on.
pub async fn guard(State(access): State<Arc<Access>>, request: Request, next: Next) -> Response {
    let token = bearer(
        request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    )
    .map(str::to_owned);
    let verb = request.method().as_str().to_ascii_lowercase();
    let path = request.uri().path().to_owned();
    let decision = access.decide(token.as_deref(), &verb, &path).await;
    match &decision {
        Decision::Allowed { .. } => return next.run(request).await,
        Decision::Unauthenticated(why) => {
            tracing::debug!(%path, reason = %why, "diagnostics: unauthenticated")
        }
        Decision::Forbidden { user, reason } => {
            tracing::debug!(%path, %user, %reason, "diagnostics: forbidden")
        }
        Decision::Failed(why) => {
            tracing::warn!(%path, error = %why, "diagnostics: cannot review the caller")
        }
    }
    let status = decision.status();
    let body = match decision {
        Decision::Unauthenticated(_) => "Unauthorized".to_owned(),
        Decision::Forbidden { user, .. } => format!("Forbidden: {user} may not {verb} {path}"),
        _ => "Internal Server Error: the caller could not be reviewed".to_owned(),
    };
    (status, body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bearer_header_with_a_token_is_a_token() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(Some("Bearer")), None);
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn decisions_answer_as_controller_runtime_does() {
        let cases = [
            (Decision::Allowed { user: "u".into() }, 200),
            (Decision::Unauthenticated("x".into()), 401),
            (
                Decision::Forbidden {
                    user: "u".into(),
                    reason: String::new(),
                },
                403,
            ),
            (Decision::Failed("x".into()), 500),
        ];
        for (decision, code) in cases {
            assert_eq!(decision.status().as_u16(), code, "{decision:?}");
        }
    }
}
