//! Per-test namespaces.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::NamespaceResourceScope;
use kube::{Api, Client, Resource};
use tokio::sync::mpsc;

/// A namespace of its own for one test, with an admin client whose default namespace it is.
///
/// Dropping it requests the namespace's deletion (best effort, asynchronously). Without
/// kube-controller-manager the namespace stays `Terminating` forever, which is harmless:
/// names are unique and the control plane is thrown away at exit.
pub struct TestNamespace {
    /// An admin client bound to the runtime of the test that created the namespace; its
    /// default namespace is [`name`](Self::name).
    pub client: Client,
    /// The namespace's name, `<prefix>-<n>-<random>`.
    pub name: String,
    janitor: mpsc::UnboundedSender<String>,
}

impl TestNamespace {
    pub(crate) fn new(
        client: Client,
        name: String,
        janitor: mpsc::UnboundedSender<String>,
    ) -> Self {
        Self {
            client,
            name,
            janitor,
        }
    }

    /// A namespace on the [shared](crate::shared) control plane; see [`crate::namespace`].
    ///
    /// # Panics
    /// If the control plane cannot start or the namespace cannot be created.
    pub async fn create(prefix: &str) -> Self {
        crate::namespace(prefix).await
    }

    /// An [`Api`] for namespaced resources of kind `K` in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

impl std::fmt::Debug for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNamespace")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // The control-plane thread deletes it: this may run outside of (or while shutting
        // down) the test's runtime, where a spawned request would never complete.
        let _ = self.janitor.send(std::mem::take(&mut self.name));
    }
}

/// `<prefix>-<n>-<4 hex digits>`, a valid DNS label whatever `prefix` is.
pub(crate) fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let random = RandomState::new().hash_one(n) & 0xffff;
    let mut prefix: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    prefix.truncate(40);
    let prefix = prefix.trim_matches('-');
    let prefix = if prefix.is_empty() { "test" } else { prefix };
    format!("{prefix}-{n}-{random:04x}")
}

#[cfg(test)]
mod tests {
    use super::unique_name;

    fn is_dns_label(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 63
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    }

    #[test]
    fn names_are_unique_dns_labels() {
        let long = "x".repeat(100);
        for prefix in ["smoke", "My_Test::case", "", "---", long.as_str()] {
            let (a, b) = (unique_name(prefix), unique_name(prefix));
            assert_ne!(a, b);
            assert!(is_dns_label(&a), "{a}");
        }
        assert!(unique_name("Smoke Test").starts_with("smoke-test-"));
    }
}
