//! Objects many tests start from.

use serde_json::{Value, json};

/// A `sim` Provider `name` on `endpoint` offering storage class `fast` and network class
/// `lan`, with `settings` (see the sim backend's module doc).
pub fn sim_provider(name: &str, endpoint: &str, settings: Value) -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": name},
        "spec": {
            "class": "sim",
            "connection": {"endpoint": endpoint},
            "capabilities": {
                "storageClasses": [{"name": "fast", "target": {"pool": "default"}}],
                "networkClasses": [{"name": "lan", "target": {"network": "default"}}]
            },
            "settings": settings
        }
    })
}
