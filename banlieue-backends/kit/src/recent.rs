//! Answers that change rarely (which template a name means, which storage takes seed
//! ISOs), reused for a while instead of asked for again on every reconcile.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Values by key, each good for `ttl` after it was put.
#[derive(Debug)]
pub struct Recent<V> {
    ttl: Duration,
    values: Mutex<HashMap<String, (V, Instant)>>,
}

impl<V: Clone> Recent<V> {
    /// An empty map whose values are good for `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            values: Mutex::new(HashMap::new()),
        }
    }

    /// The value put for `key` less than `ttl` ago.
    pub fn get(&self, key: &str) -> Option<V> {
        self.lock()
            .get(key)
            .filter(|(_, at)| at.elapsed() < self.ttl)
            .map(|(v, _)| v.clone())
    }

    /// Remembers `value` for `key` from now (and drops the expired values: keys that are
    /// never asked for again must not stay forever).
    pub fn put(&self, key: &str, value: &V) {
        let mut values = self.lock();
        values.retain(|_, (_, at)| at.elapsed() < self.ttl);
        values.insert(key.to_string(), (value.clone(), Instant::now()));
    }

    /// How many values are held, expired or not.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.lock().len()
    }

    /// Forgets `key` (its value was found wrong).
    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (V, Instant)>> {
        self.values.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_reused_until_they_expire_or_are_forgotten() {
        let recent = Recent::new(Duration::from_millis(50));
        assert_eq!(recent.get("a"), None);
        recent.put("a", &1);
        assert_eq!(recent.get("a"), Some(1));
        recent.forget("a");
        assert_eq!(recent.get("a"), None);
        recent.put("a", &2);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(recent.get("a"), None, "expired");
        recent.put("b", &3);
        assert_eq!(
            recent.held(),
            1,
            "the expired value of a is dropped by the next put"
        );
        assert_eq!(recent.get("b"), Some(3));
    }
}
