//! A round's mechanism on the wire: its parameters by name, as numbers (`map<string, double>`
//! in the protocol), so a new mechanism needs no new message. Encoding goes through the
//! mechanism's serde form; decoding is strict: every parameter present, no other (the types
//! refuse unknown fields), and an integer parameter (a count or a size) only from a whole
//! number.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Number, Value};
use std::collections::BTreeMap;

/// Largest integer an f64 holds exactly (2^53).
const EXACT_INTEGER: f64 = 9_007_199_254_740_992.0;

/// `mechanism`'s parameters by name (a mechanism is a struct of numbers; a non-finite one,
/// which serde writes as null, is sent as NaN and refused by the client).
pub(super) fn encode<T: Serialize>(mechanism: &T) -> BTreeMap<String, f64> {
    let Ok(Value::Object(fields)) = serde_json::to_value(mechanism) else {
        return BTreeMap::new();
    };
    let number = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    fields.iter().map(|(k, v)| (k.clone(), number(v))).collect()
}

/// The mechanism the `parameters` give, or why they do not.
pub(super) fn decode<T: DeserializeOwned>(parameters: &BTreeMap<String, f64>) -> Result<T, String> {
    let mut fields = Map::new();
    for (name, &value) in parameters {
        fields.insert(
            name.clone(),
            number(value).ok_or_else(|| {
                format!("local mechanism parameter {name} = {value} is not a finite number")
            })?,
        );
    }
    serde_json::from_value(Value::Object(fields))
        .map_err(|e| format!("local mechanism parameters: {e}"))
}

/// `value` as JSON: a whole number as an integer (so an integer field accepts it), any other
/// finite number as a float.
fn number(value: f64) -> Option<Value> {
    let whole = value.fract() == 0.0 && value.abs() < EXACT_INTEGER;
    let n = if whole && value >= 0.0 {
        Number::from(value as u64)
    } else if whole {
        Number::from(value as i64)
    } else {
        Number::from_f64(value)?
    };
    Some(Value::Number(n))
}

#[cfg(test)]
mod tests {
    use crate::{LaplaceLdp, LocalMechanism};

    #[test]
    fn missing_unknown_and_fractional_parameters_are_refused() {
        let laplace = LocalMechanism::Laplace(LaplaceLdp {
            epsilon: 1.5,
            clip_bound: 3.0,
            steps: 7,
        });
        let mut p = laplace.parameters();
        p.insert("noise".into(), 0.0);
        let err = LocalMechanism::from_parameters("ldp-laplace", &p).unwrap_err();
        assert!(err.contains("unknown field `noise`"), "{err}");
        let mut p = laplace.parameters();
        p.remove("steps");
        let err = LocalMechanism::from_parameters("ldp-laplace", &p).unwrap_err();
        assert!(err.contains("missing field `steps`"), "{err}");
        let mut p = laplace.parameters();
        p.insert("steps".into(), 2.5);
        assert!(LocalMechanism::from_parameters("ldp-laplace", &p).is_err());
        p.insert("steps".into(), f64::NAN);
        assert!(LocalMechanism::from_parameters("ldp-laplace", &p).is_err());
        let err = LocalMechanism::from_parameters("ldp-gauss", &p).unwrap_err();
        assert!(err.contains("unknown local mechanism `ldp-gauss`"), "{err}");
    }
}
