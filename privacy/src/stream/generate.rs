//! `noise_streams!`: the closed types of the list of streams, written once. From lines
//! `"name" => Variant(Type)` (the first is the default) it writes [`StreamSettings`] (what the
//! configuration's `privacy.noise` holds: a stream's name, for its table's defaults, or its
//! table; serde and JSON schema by hand, so that an unknown key of a table is named in the
//! error), [`AnyStream`] (the planned stream of a run) and `AnyStream`'s [`NoiseStream`] by
//! dispatch to the listed types.
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
        /// A noise stream's settings: its name (`privacy.noise = "banded"`, every setting at its
        /// default) or its table (`[privacy.noise.banded]`).
        #[derive(Debug, Clone, PartialEq)]
        pub enum StreamSettings {
            $(#[doc = $fdoc])* $first(<$fty as NoiseStream>::Settings),
            $($(#[doc = $doc])* $variant(<$ty as NoiseStream>::Settings),)*
        }

        impl Default for StreamSettings {
            fn default() -> Self {
                Self::$first(Default::default())
            }
        }

        impl StreamSettings {
            /// The streams' names, as the configuration writes them.
            pub const NAMES: &'static [&'static str] = &[$fname, $($name),*];

            /// This stream's name.
            pub fn name(&self) -> &'static str {
                match self {
                    Self::$first(_) => $fname,
                    $(Self::$variant(_) => $name,)*
                }
            }
        }

        impl serde::Serialize for StreamSettings {
            /// The name alone when every setting is at its default, else `{ name = table }`.
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                match self {
                    Self::$first(t) if *t == Default::default() => s.serialize_str($fname),
                    $(Self::$variant(t) if *t == Default::default() => s.serialize_str($name),)*
                    Self::$first(t) => {
                        let mut map = s.serialize_map(Some(1))?;
                        map.serialize_entry($fname, t)?;
                        map.end()
                    }
                    $(Self::$variant(t) => {
                        let mut map = s.serialize_map(Some(1))?;
                        map.serialize_entry($name, t)?;
                        map.end()
                    })*
                }
            }
        }

        impl<'de> serde::Deserialize<'de> for StreamSettings {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Names;
                impl<'de> serde::de::Visitor<'de> for Names {
                    type Value = StreamSettings;

                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        write!(
                            f,
                            "a noise stream's name ({}) or one stream's table",
                            StreamSettings::NAMES.join(", ")
                        )
                    }

                    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Self::Value, E> {
                        match name {
                            $fname => Ok(StreamSettings::$first(Default::default())),
                            $($name => Ok(StreamSettings::$variant(Default::default())),)*
                            other => Err(E::unknown_variant(other, StreamSettings::NAMES)),
                        }
                    }

                    fn visit_map<A: serde::de::MapAccess<'de>>(
                        self,
                        mut map: A,
                    ) -> Result<Self::Value, A::Error> {
                        use serde::de::Error;
                        let Some(name) = map.next_key::<String>()? else {
                            return Err(A::Error::custom("an empty table names no noise stream"));
                        };
                        let settings = match name.as_str() {
                            $fname => StreamSettings::$first(map.next_value()?),
                            $($name => StreamSettings::$variant(map.next_value()?),)*
                            other => {
                                return Err(A::Error::unknown_variant(other, StreamSettings::NAMES))
                            }
                        };
                        match map.next_key::<String>()? {
                            Some(more) => Err(A::Error::custom(format!(
                                "one noise stream's table, not two ({name} and {more})"
                            ))),
                            None => Ok(settings),
                        }
                    }
                }
                d.deserialize_any(Names)
            }
        }

        #[cfg(feature = "schema")]
        impl schemars::JsonSchema for StreamSettings {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                "StreamSettings".into()
            }

            fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
                let tables = vec![
                    schemars::json_schema!({
                        "type": "object",
                        "description": concat!($($fdoc, "\n",)*),
                        "properties": {
                            $fname: generator.subschema_for::<<$fty as NoiseStream>::Settings>()
                        },
                        "required": [$fname],
                        "additionalProperties": false
                    }),
                    $(schemars::json_schema!({
                        "type": "object",
                        "description": concat!($($doc, "\n",)*),
                        "properties": {
                            $name: generator.subschema_for::<<$ty as NoiseStream>::Settings>()
                        },
                        "required": [$name],
                        "additionalProperties": false
                    }),)*
                ];
                schemars::json_schema!({
                    "description": "A noise stream: its name, every setting at its default, \
                                    or its table.",
                    "anyOf": [
                        {
                            "type": "string",
                            "enum": StreamSettings::NAMES,
                            "description": "A stream's name, its table's settings at their \
                                            defaults."
                        },
                        {
                            "oneOf": tables,
                            "description": "One stream's table, `[privacy.noise.NAME]`."
                        }
                    ]
                })
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
