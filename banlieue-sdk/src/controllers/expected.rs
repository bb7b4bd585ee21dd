//! Telling expected races from real failures in the controllers' `error_policy`.
//!
//! A controller reads a cache that lags the API server: a finalizer patch against a
//! stale copy fails its JSON-patch `test` (422) or conflicts (409), and an object
//! deleted meanwhile answers 404. Retrying from a fresh cache fixes these by itself:
//! they are logged at debug level and retried soon. Anything else (a rule the API
//! server enforces, a forbidden write, a backend failure) is a real failure, logged
//! as a warning and retried with backoff. An object banlieue wrote that the API server
//! refused as invalid ([`rejected`]) is neither: it becomes a condition on the user's
//! object, since the same write fails the same way.

use std::time::Duration;

use kube::runtime::finalizer;

/// How soon an expected race is retried (the cache has usually caught up by then).
pub(crate) const RETRY_RACE: Duration = Duration::from_millis(500);

/// Whether `error` is a race the next reconcile resolves by itself.
pub(crate) fn race<E: std::error::Error + 'static>(
    error: &finalizer::Error<E>,
    kube_of: impl Fn(&E) -> Option<&kube::Error>,
) -> bool {
    match error {
        // The finalizer patches test the finalizer list they read: a stale cache fails
        // the test (422, "the server rejected our request due to an error in our
        // request"), and the object may be gone or changed meanwhile.
        finalizer::Error::AddFinalizer(e) | finalizer::Error::RemoveFinalizer(e) => {
            status_code(e).is_some_and(|code| matches!(code, 404 | 409 | 422))
        }
        // Inside a reconcile only conflicts and vanished objects are races; a 422 there
        // is a rule the API server enforces, which retrying does not fix.
        finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => {
            kube_of(e).is_some_and(kube_race)
        }
        finalizer::Error::UnnamedObject | finalizer::Error::InvalidFinalizer => false,
    }
}

/// Whether a kube error met while reconciling is a race: a conflict on a stale
/// `resourceVersion` (409) or an object already gone (404).
pub(crate) fn kube_race(error: &kube::Error) -> bool {
    status_code(error).is_some_and(|code| matches!(code, 404 | 409))
}

fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// The API server's words when it refused an object banlieue wrote as invalid (400,
/// 422): a fault in what banlieue derived from the user's objects, which the user must
/// see on their VM; retrying the same write would fail the same way. `None` for other
/// errors (conflicts, outages), which are retried.
pub(crate) fn rejected(error: &kube::Error) -> Option<String> {
    match error {
        kube::Error::Api(status) if status.code == 400 || status.code == 422 => {
            Some(status.message.clone())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("the server rejected our request", "Invalid")
                .with_code(code)
                .boxed(),
        )
    }

    #[derive(Debug, thiserror::Error)]
    enum Mine {
        #[error("{0}")]
        Kube(kube::Error),
        #[error("other")]
        Other,
    }

    fn of(e: &Mine) -> Option<&kube::Error> {
        match e {
            Mine::Kube(k) => Some(k),
            Mine::Other => None,
        }
    }

    #[test]
    fn finalizer_patches_against_a_stale_cache_are_races() {
        for code in [404, 409, 422] {
            assert!(
                race(&finalizer::Error::<Mine>::AddFinalizer(api(code)), of),
                "{code}"
            );
            assert!(
                race(&finalizer::Error::<Mine>::RemoveFinalizer(api(code)), of),
                "{code}"
            );
        }
        for code in [403, 500] {
            assert!(
                !race(&finalizer::Error::<Mine>::AddFinalizer(api(code)), of),
                "{code}"
            );
        }
    }

    #[test]
    fn inside_a_reconcile_only_conflicts_and_gone_objects_are_races() {
        for (code, want) in [
            (404, true),
            (409, true),
            (422, false),
            (403, false),
            (500, false),
        ] {
            let apply = finalizer::Error::ApplyFailed(Mine::Kube(api(code)));
            let cleanup = finalizer::Error::CleanupFailed(Mine::Kube(api(code)));
            assert_eq!(race(&apply, of), want, "apply {code}");
            assert_eq!(race(&cleanup, of), want, "cleanup {code}");
        }
        assert!(!race(&finalizer::Error::ApplyFailed(Mine::Other), of));
        assert!(!race(&finalizer::Error::<Mine>::UnnamedObject, of));
    }
}
