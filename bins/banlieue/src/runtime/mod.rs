//! What `banlieue run` adds to [`banlieue_runtime`]: the backends compiled in.

pub mod backends;
