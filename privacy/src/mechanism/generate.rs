//! `local_mechanisms!`: the closed types of the list of client-side mechanisms, written once.
//! From lines `"name" => Variant(Type)` it writes [`LocalKind`] (the names, as configurations,
//! the wire and federation policies write them), [`Listed`] (each type's kind), [`LocalMechanism`]
//! (a round's mechanism, any of the listed ones, by dispatch) and [`LocalSettings`] (the `[local]`
//! table of the mechanism a run names).
//!
//! [`LocalKind`]: super::LocalKind
//! [`Listed`]: super::Listed
//! [`LocalMechanism`]: super::LocalMechanism
//! [`LocalSettings`]: super::LocalSettings

/// See the module documentation.
macro_rules! local_mechanisms {
    ($($(#[doc = $doc:literal])* $name:literal => $variant:ident($ty:ty),)*) => {
        /// The kind of a client-side mechanism and of its releases.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum LocalKind {
            $($(#[doc = $doc])* $variant,)*
        }

        /// A listed mechanism's kind.
        pub trait Listed {
            /// Its kind.
            const KIND: LocalKind;
        }

        $(impl Listed for $ty {
            const KIND: LocalKind = LocalKind::$variant;
        })*

        impl LocalKind {
            /// Every kind, once, in the list's order.
            pub const ALL: &'static [LocalKind] = &[$(Self::$variant),*];

            /// Its name in configurations, on the wire and in federation policies.
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                }
            }

            /// What it is, from its line in the list.
            pub fn description(self) -> &'static str {
                match self {
                    $(Self::$variant => concat!($($doc),*).trim_start(),)*
                }
            }

            /// Whether training under it needs the built-in trainer.
            pub fn needs_built_in_trainer(self) -> bool {
                match self {
                    $(Self::$variant => <$ty as ClientMechanism>::NEEDS_BUILT_IN_TRAINER,)*
                }
            }

            /// Whether it protects inexact ADMM's primal step.
            pub fn protects_admm(self) -> bool {
                match self {
                    $(Self::$variant => <$ty as ClientMechanism>::PROTECTS_ADMM,)*
                }
            }

            /// What `release`, of this kind, costs.
            pub(crate) fn cost(self, release: &Release) -> ReleaseCost {
                match self {
                    $(Self::$variant => <$ty as ClientMechanism>::cost(release),)*
                }
            }

            /// The JSON schema of its settings, for the configuration reference.
            #[cfg(feature = "schema")]
            pub fn settings_schema(
                self,
                generator: &mut schemars::SchemaGenerator,
            ) -> schemars::Schema {
                match self {
                    $(Self::$variant => generator
                        .subschema_for::<<$ty as ClientMechanism>::Settings>(),)*
                }
            }
        }

        /// A round's client-side mechanism, any of the listed ones.
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub enum LocalMechanism {
            $($(#[doc = $doc])* $variant($ty),)*
        }

        impl LocalMechanism {
            /// Its kind.
            pub fn kind(&self) -> LocalKind {
                match self {
                    $(Self::$variant(_) => LocalKind::$variant,)*
                }
            }

            /// Its name, as configurations write it.
            pub fn name(&self) -> &'static str {
                self.kind().name()
            }

            /// How many values one release of a model of `dim` parameters holds.
            pub fn release_size(&self, dim: usize) -> usize {
                match self {
                    $(Self::$variant(m) => m.release_size(dim),)*
                }
            }

            /// Per-release epsilon.
            pub fn epsilon(&self) -> f64 {
                match self {
                    $(Self::$variant(m) => m.epsilon(),)*
                }
            }

            /// The delta at which its releases compose (0 for a pure mechanism).
            pub fn composed_delta(&self) -> f64 {
                match self {
                    $(Self::$variant(m) => m.composed_delta(),)*
                }
            }

            /// Checks the parameters for a model of `dim` parameters.
            pub fn check(&self, dim: usize) -> Result<(), LocalPrivacyError> {
                match self {
                    $(Self::$variant(m) => m.check(dim),)*
                }
            }

            /// This mechanism with the client's own limits applied (never loosening it).
            pub fn tightened(&self, own: &ClientLimits) -> Self {
                match self {
                    $(Self::$variant(m) => Self::$variant(m.tightened(own)),)*
                }
            }

            /// The gradient rule local training must use.
            pub fn gradient_rule(&self) -> GradientRule {
                match self {
                    $(Self::$variant(m) => m.gradient_rule(),)*
                }
            }

            /// The release one upload records, as far as accounting goes.
            pub fn accounted_release(&self) -> Result<Release, AccountingError> {
                match self {
                    $(Self::$variant(m) => m.accounted_release(),)*
                }
            }

            /// Checks that `release` is of this kind, claims no more than this round allows,
            /// and that its noise gives what it claims.
            pub fn admits(&self, release: &Release) -> Result<(), LocalPrivacyError> {
                release.within(self.kind(), self.epsilon())?;
                match self {
                    $(Self::$variant(m) => m.admits(release),)*
                }
            }

            /// Protects the FedAvg update `u`, trained under the round's `config`, with noise
            /// from `rng`.
            pub fn protect_update<R: Rng + CryptoRng>(
                &self,
                u: Vec<f32>,
                config: &LocalConfig,
                rng: &mut R,
            ) -> Result<Protected, ProtectError> {
                let (output, release) = match self {
                    $(Self::$variant(m) => m.protect_update(u, config, rng)?,)*
                };
                Ok(Protected::seal(output, release))
            }

            /// Protects an inexact-ADMM primal iterate z_p (penalty `rho`, `total_examples`
            /// examples in all).
            pub fn protect_admm_step<R: Rng + CryptoRng>(
                &self,
                z: Vec<f32>,
                rho: f64,
                total_examples: u64,
                rng: &mut R,
            ) -> Result<Protected, ProtectError> {
                let (values, release) = match self {
                    $(Self::$variant(m) => m.protect_admm_step(z, rho, total_examples, rng)?,)*
                };
                Ok(Protected::seal(Output::Dense(values), release))
            }

            /// Its parameters as the wire carries them, by name.
            pub fn parameters(&self) -> std::collections::BTreeMap<String, f64> {
                match self {
                    $(Self::$variant(m) => parameters::encode(m),)*
                }
            }

            /// The mechanism `name` with the wire's `parameters`: every one of its parameters
            /// present, no other, integers where it counts.
            pub fn from_parameters(
                name: &str,
                parameters: &std::collections::BTreeMap<String, f64>,
            ) -> Result<Self, String> {
                let kind: LocalKind = name.parse()?;
                Ok(match kind {
                    $(LocalKind::$variant => Self::$variant(parameters::decode(parameters)?),)*
                })
            }
        }

        /// The `[local]` table of the mechanism a run names.
        #[derive(Debug, Clone, PartialEq, serde::Serialize)]
        #[serde(untagged)]
        pub enum LocalSettings {
            $($(#[doc = $doc])* $variant(<$ty as ClientMechanism>::Settings),)*
        }

        impl LocalSettings {
            /// `kind`'s settings read from `table` (unknown keys refused).
            pub fn read<'de, D: serde::Deserializer<'de>>(
                kind: LocalKind,
                table: D,
            ) -> Result<Self, D::Error> {
                use serde::Deserialize;
                Ok(match kind {
                    $(LocalKind::$variant => Self::$variant(
                        <$ty as ClientMechanism>::Settings::deserialize(table)?,
                    ),)*
                })
            }

            /// `kind`'s settings, every key at its default.
            pub fn default_of(kind: LocalKind) -> Self {
                match kind {
                    $(LocalKind::$variant => Self::$variant(Default::default()),)*
                }
            }

            /// The mechanism they set.
            pub fn kind(&self) -> LocalKind {
                match self {
                    $(Self::$variant(_) => LocalKind::$variant,)*
                }
            }

            /// Checks them, as far as they go without the model.
            pub fn validate(&self) -> Result<(), LocalPrivacyError> {
                match self {
                    $(Self::$variant(s) => <$ty>::validate(s),)*
                }
            }

            /// The round's mechanism for a model of `dim` parameters, checked.
            pub fn resolve(&self, dim: usize) -> Result<LocalMechanism, LocalPrivacyError> {
                Ok(match self {
                    $(Self::$variant(s) => LocalMechanism::$variant(<$ty>::resolve(s, dim)?),)*
                })
            }

            /// How the server combines the releases.
            pub fn aggregation(&self) -> ReleaseAggregation {
                match self {
                    $(Self::$variant(s) => <$ty>::aggregation(s),)*
                }
            }
        }
    };
}
