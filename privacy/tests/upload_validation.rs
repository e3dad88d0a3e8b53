//! Property tests of upload validation: a SignDS upload is accepted exactly when its sign is
//! +-1 and its indices are at most h distinct dimensions of the model, and a refused upload leaves
//! the aggregate unchanged; a dense update is accepted exactly when it has the model's length and
//! only finite values.

use fl_model::CheckedUpdate;
use fl_privacy::signds::SignAggregate;
use proptest::prelude::*;
use std::collections::HashSet;

proptest! {
    #[test]
    fn signds_uploads_are_accepted_iff_valid(
        sign in -2i64..3,
        indices in proptest::collection::vec(0u64..40, 0..12),
        dim in 1usize..40,
        h in 1usize..10,
    ) {
        let valid = (sign == 1 || sign == -1)
            && indices.len() <= h
            && indices.iter().all(|&i| i < dim as u64)
            && indices.iter().collect::<HashSet<_>>().len() == indices.len();
        let mut aggregate = SignAggregate::new(dim, h);
        let before = aggregate.clone();
        let result = aggregate.add(sign, &indices);
        prop_assert_eq!(result.is_ok(), valid);
        if !valid {
            prop_assert_eq!(aggregate, before);
        }
    }

    #[test]
    fn dense_updates_are_accepted_iff_finite_and_of_the_models_length(
        values in proptest::collection::vec(
            prop_oneof![any::<f32>(), Just(f32::NAN), Just(f32::INFINITY)],
            0..50,
        ),
        expected in 0usize..50,
    ) {
        let valid = values.len() == expected && values.iter().all(|v| v.is_finite());
        let checked = CheckedUpdate::new(values.clone());
        let accepted = checked.and_then(|u| u.check_len(expected).map(|()| u));
        prop_assert_eq!(accepted.is_ok(), valid);
        if let Ok(u) = accepted {
            // Measured as it was checked.
            let norm = values.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
            prop_assert!((u.norm() - norm).abs() <= 1e-12 * norm.max(1.0));
        }
    }
}
