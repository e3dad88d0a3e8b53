//! `noise_streams!`: the closed types of the list of streams, written once. From lines
//! `"name" => Variant(Type)` (the first is the default) it writes [`StreamSettings`] (what the
//! configuration's `privacy.noise` holds: a stream's name, for its table's defaults, or its
//! table, by `fl_common::named_tables!`), [`AnyStream`] (the planned stream of a run) and
//! `AnyStream`'s [`NoiseStream`] by dispatch to the listed types.
//!
//! [`StreamSettings`]: super::StreamSettings
//! [`AnyStream`]: super::AnyStream
//! [`NoiseStream`]: super::NoiseStream

/// See the module documentation.
macro_rules! noise_streams {
    (
        $(#[doc = $fdoc:literal])* $fname:literal => $first:ident($fty:ty),
        $($(#[doc = $doc:literal])* $name:literal => $variant:ident($ty:ty),)*
    ) => {
        fl_common::named_tables! {
            /// A noise stream's settings: its name (`privacy.noise = "banded"`, every setting at
            /// its default) or its table (`[privacy.noise.banded]`).
            pub enum StreamSettings, schema(feature = "schema") {
                $(#[doc = $fdoc])* $fname => $first(<$fty as NoiseStream>::Settings),
                $($(#[doc = $doc])* $name => $variant(<$ty as NoiseStream>::Settings),)*
            }
        }

        /// A run's planned noise stream, any of the listed ones.
        #[derive(Debug, Clone, PartialEq)]
        pub enum AnyStream {
            $(#[doc = $fdoc])* $first($fty),
            $($(#[doc = $doc])* $variant($ty),)*
        }

        impl AnyStream {
            /// Its name, as the configuration writes it.
            pub fn name(&self) -> &'static str {
                match self {
                    Self::$first(_) => $fname,
                    $(Self::$variant(_) => $name,)*
                }
            }
        }

        impl NoiseStream for AnyStream {
            type Settings = StreamSettings;
            type Event = PrivacyEvent;

            fn plan(settings: &StreamSettings, run: &StreamRun) -> Result<Self, StreamError> {
                Ok(match settings {
                    StreamSettings::$first(s) => Self::$first(<$fty>::plan(s, run)?),
                    $(StreamSettings::$variant(s) => Self::$variant(<$ty>::plan(s, run)?),)*
                })
            }

            fn noise_multiplier(&self) -> f64 {
                match self {
                    Self::$first(s) => s.noise_multiplier(),
                    $(Self::$variant(s) => s.noise_multiplier(),)*
                }
            }

            fn step(&self) -> u64 {
                match self {
                    Self::$first(s) => s.step(),
                    $(Self::$variant(s) => s.step(),)*
                }
            }

            fn advance(&mut self) {
                match self {
                    Self::$first(s) => s.advance(),
                    $(Self::$variant(s) => s.advance(),)*
                }
            }

            fn event(&self) -> PrivacyEvent {
                match self {
                    Self::$first(s) => s.event().into(),
                    $(Self::$variant(s) => s.event().into(),)*
                }
            }

            fn may_contribute(&self, identity: u64) -> bool {
                match self {
                    Self::$first(s) => s.may_contribute(identity),
                    $(Self::$variant(s) => s.may_contribute(identity),)*
                }
            }

            fn contributes(&mut self, identity: u64) -> bool {
                match self {
                    Self::$first(s) => s.contributes(identity),
                    $(Self::$variant(s) => s.contributes(identity),)*
                }
            }

            fn noise(&self, dim: usize) -> Box<dyn CorrelatedNoise> {
                match self {
                    Self::$first(s) => s.noise(dim),
                    $(Self::$variant(s) => s.noise(dim),)*
                }
            }

            fn charges(&self, steps: u64) -> Charges {
                match self {
                    Self::$first(s) => s.charges(steps),
                    $(Self::$variant(s) => s.charges(steps),)*
                }
            }

            fn steps_within(&self, count: u64, cap: u64) -> u64 {
                match self {
                    Self::$first(s) => s.steps_within(count, cap),
                    $(Self::$variant(s) => s.steps_within(count, cap),)*
                }
            }
        }
    };
}
