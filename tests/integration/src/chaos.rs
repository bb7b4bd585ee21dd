//! Seeded randomness for chaos tests: the seed comes from `BANLIEUE_CHAOS_SEED` or the
//! clock, is printed when the test starts, and is quoted in every failure message so a
//! failing run can be replayed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A small, reproducible generator (splitmix64): no statistical ambitions, only
/// replayable kill points.
#[derive(Debug)]
pub struct Chaos {
    seed: u64,
    state: u64,
}

impl Chaos {
    /// Seeded from `BANLIEUE_CHAOS_SEED` when set, else from the clock; prints the seed.
    ///
    /// # Panics
    /// If `BANLIEUE_CHAOS_SEED` is set but not an unsigned integer.
    pub fn from_env(test: &str) -> Self {
        let seed = match std::env::var("BANLIEUE_CHAOS_SEED") {
            Ok(text) => text
                .parse()
                .unwrap_or_else(|_| panic!("BANLIEUE_CHAOS_SEED={text:?} is not a u64")),
            Err(_) => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        };
        eprintln!("{test}: chaos seed {seed} (replay with BANLIEUE_CHAOS_SEED={seed})");
        Self { seed, state: seed }
    }

    /// The seed, for failure messages.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The next raw value.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A duration drawn uniformly from `[low, high]`, to the millisecond.
    pub fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let low_ms = low.as_millis() as u64;
        let span = (high.as_millis() as u64).saturating_sub(low_ms) + 1;
        Duration::from_millis(low_ms + self.next_u64() % span)
    }
}
