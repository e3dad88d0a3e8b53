//! `named_tables!`: a configuration key that names one of several kinds, each with a table of
//! its own settings (a DP-FTRL noise stream, an aggregation rule): `key = "name"` (its settings
//! at their defaults) or `[section.key.name]` with its keys. It writes the closed enum of the
//! kinds' settings from their list (the first is the default), its names, and its serde and JSON
//! schema by hand: an unknown key of a table is named in the error, and a kind's table whose
//! settings are all at their defaults is written back as its name.
//!
//! ```text
//! fl_common::named_tables! {
//!     /// The enum's documentation.
//!     pub enum StreamSettings, schema(feature = "schema") {
//!         /// The kind's documentation.
//!         "tree" => Tree(TreeSettings),
//!         "banded" => Banded(BandedSettings),
//!     }
//! }
//! ```
//!
//! `schema(...)` is the `cfg` predicate under which the calling crate derives JSON schemas
//! (`all()` for always); each settings type needs `Default`, `PartialEq`, serde's traits and,
//! under it, `schemars::JsonSchema`. The caller depends on serde (and on schemars for schemas).

/// See the module documentation.
#[macro_export]
macro_rules! named_tables {
    (
        $(#[doc = $edoc:literal])*
        $vis:vis enum $enum:ident, schema($($cfg:tt)*) {
            $(#[doc = $fdoc:literal])* $fname:literal => $first:ident($fty:ty),
            $($(#[doc = $doc:literal])* $name:literal => $variant:ident($ty:ty),)*
        }
    ) => {
        $(#[doc = $edoc])*
        #[derive(Debug, Clone, PartialEq)]
        $vis enum $enum {
            $(#[doc = $fdoc])* $first($fty),
            $($(#[doc = $doc])* $variant($ty),)*
        }

        impl Default for $enum {
            fn default() -> Self {
                Self::$first(Default::default())
            }
        }

        impl $enum {
            /// The kinds' names, as the configuration writes them.
            pub const NAMES: &'static [&'static str] = &[$fname, $($name),*];

            /// This kind's name.
            pub fn name(&self) -> &'static str {
                match self {
                    Self::$first(_) => $fname,
                    $(Self::$variant(_) => $name,)*
                }
            }
        }

        impl serde::Serialize for $enum {
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

        impl<'de> serde::Deserialize<'de> for $enum {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Names;
                impl<'de> serde::de::Visitor<'de> for Names {
                    type Value = $enum;

                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        write!(f, "one of {} or one of their tables", $enum::NAMES.join(", "))
                    }

                    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<$enum, E> {
                        match name {
                            $fname => Ok($enum::$first(Default::default())),
                            $($name => Ok($enum::$variant(Default::default())),)*
                            other => Err(E::unknown_variant(other, $enum::NAMES)),
                        }
                    }

                    fn visit_map<A: serde::de::MapAccess<'de>>(
                        self,
                        mut map: A,
                    ) -> Result<$enum, A::Error> {
                        use serde::de::Error;
                        let Some(name) = map.next_key::<String>()? else {
                            return Err(A::Error::custom("an empty table names no kind"));
                        };
                        let settings = match name.as_str() {
                            $fname => $enum::$first(map.next_value()?),
                            $($name => $enum::$variant(map.next_value()?),)*
                            other => return Err(A::Error::unknown_variant(other, $enum::NAMES)),
                        };
                        match map.next_key::<String>()? {
                            Some(more) => Err(A::Error::custom(format!(
                                "one table, not two ({name} and {more})"
                            ))),
                            None => Ok(settings),
                        }
                    }
                }
                d.deserialize_any(Names)
            }
        }

        #[cfg($($cfg)*)]
        impl schemars::JsonSchema for $enum {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($enum).into()
            }

            fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
                let tables = vec![
                    schemars::json_schema!({
                        "type": "object",
                        "description": concat!($($fdoc, "\n",)*),
                        "properties": { $fname: generator.subschema_for::<$fty>() },
                        "required": [$fname],
                        "additionalProperties": false
                    }),
                    $(schemars::json_schema!({
                        "type": "object",
                        "description": concat!($($doc, "\n",)*),
                        "properties": { $name: generator.subschema_for::<$ty>() },
                        "required": [$name],
                        "additionalProperties": false
                    }),)*
                ];
                schemars::json_schema!({
                    "description": concat!($($edoc, "\n",)*),
                    "anyOf": [
                        {
                            "type": "string",
                            "enum": $enum::NAMES,
                            "description": "A name: its table's settings at their defaults."
                        },
                        {
                            "oneOf": tables,
                            "description": "One kind's table, with its settings."
                        }
                    ]
                })
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Plain {
        #[serde(skip_serializing_if = "Option::is_none")]
        size: Option<u64>,
    }

    #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Fancy {
        #[serde(skip_serializing_if = "Option::is_none")]
        depth: Option<u64>,
    }

    crate::named_tables! {
        /// A test's kinds.
        enum Kinds, schema(any()) {
            /// The first, the default.
            "plain" => Plain(Plain),
            /// Another.
            "fancy" => Fancy(Fancy),
        }
    }

    fn read(text: &str) -> Result<Kinds, String> {
        toml::from_str::<toml::Table>(&format!("k = {text}"))
            .map_err(|e| e.to_string())
            .and_then(|mut t| t.remove("k").unwrap().try_into().map_err(|e| e.to_string()))
    }

    /// A name reads as its table's defaults and writes back as the name; a table reads with its
    /// keys and writes back as a table; an unknown key, an unknown name and two tables are
    /// refused, naming what was wrong.
    #[test]
    fn a_kind_reads_from_its_name_or_its_table() {
        assert_eq!(read("\"fancy\"").unwrap(), Kinds::Fancy(Fancy::default()));
        assert_eq!(Kinds::default(), Kinds::Plain(Plain::default()));
        let table = read("{ fancy = { depth = 3 } }").unwrap();
        assert_eq!(table, Kinds::Fancy(Fancy { depth: Some(3) }));
        assert_eq!(table.name(), "fancy");
        let written = toml::Value::try_from(&table).unwrap().to_string();
        assert_eq!(written, "{ fancy = { depth = 3 } }");
        let name = toml::Value::try_from(Kinds::default()).unwrap().to_string();
        assert_eq!(name, "\"plain\"");
        let unknown = read("{ fancy = { dept = 3 } }").unwrap_err();
        assert!(unknown.contains("unknown field `dept`"), "{unknown}");
        assert!(read("\"fractal\"").unwrap_err().contains("plain"));
        let two = read("{ fancy = {}, plain = {} }").unwrap_err();
        assert!(two.contains("not two"), "{two}");
    }
}
