//! Conversions between wire messages and `fl-common`'s types.

use crate::v1;
use fl_common::model::{LocalConfig, ModelError, ModelSpec};

impl From<&ModelSpec> for v1::ModelSpec {
    fn from(spec: &ModelSpec) -> Self {
        v1::ModelSpec {
            layer_sizes: spec.layer_sizes().iter().map(|&w| w as u32).collect(),
        }
    }
}

impl TryFrom<&v1::ModelSpec> for ModelSpec {
    type Error = ModelError;

    /// Validates the widths as [`ModelSpec::new`] does (a peer's spec is untrusted).
    fn try_from(wire: &v1::ModelSpec) -> Result<Self, Self::Error> {
        ModelSpec::new(wire.layer_sizes.iter().map(|&w| w as usize).collect())
    }
}

impl From<LocalConfig> for v1::LocalConfig {
    fn from(c: LocalConfig) -> Self {
        v1::LocalConfig {
            epochs: c.epochs,
            batch_size: c.batch_size,
            learning_rate: c.learning_rate,
        }
    }
}

impl From<v1::LocalConfig> for LocalConfig {
    fn from(c: v1::LocalConfig) -> Self {
        LocalConfig {
            epochs: c.epochs,
            batch_size: c.batch_size,
            learning_rate: c.learning_rate,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_spec_roundtrips_and_untrusted_specs_are_validated() {
        let spec = ModelSpec::mlp(784, &[600, 100], 10).unwrap();
        let wire = v1::ModelSpec::from(&spec);
        assert_eq!(ModelSpec::try_from(&wire).unwrap(), spec);
        let bogus = v1::ModelSpec {
            layer_sizes: vec![u32::MAX, u32::MAX],
        };
        assert!(ModelSpec::try_from(&bogus).is_err());
    }
}
