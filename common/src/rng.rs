//! The one rule for seeds: a seed makes sampling, initialisation and local shuffling
//! reproducible, and nothing else. Noise, masks, keys and shares always come from a generator
//! seeded by the OS.

use rand::SeedableRng;
use rand::rngs::StdRng;

/// What a process that was given a seed must say: its draws are predictable.
pub const SEEDED_WARNING: &str = "seeded run: sampling, initialisation and shuffling are reproducible; NOT for production privacy";

/// A CSPRNG for reproducible draws: seeded from `seed` when given, from the OS otherwise.
pub fn reproducible(seed: Option<u64>) -> StdRng {
    match seed {
        Some(seed) => StdRng::seed_from_u64(seed),
        None => StdRng::from_os_rng(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn a_seed_repeats_its_draws_and_no_seed_does_not() {
        let draw = |seed| reproducible(seed).random::<u64>();
        assert_eq!(draw(Some(7)), draw(Some(7)));
        assert_ne!(draw(None), draw(None));
    }
}
