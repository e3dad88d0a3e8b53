//! Configuration errors in a person's words: the types serde names said as the values they
//! stand for, and the known key nearest to an unknown one suggested.

/// serde's names of the expected types, and how a person says them.
const TYPES: [(&str, &str); 11] = [
    (
        "data did not match any variant of untagged enum Schedule",
        "expected a number, or a schedule: { steps = [[1, 10], [50, 20]] } or \
         { linear = [10, 20] }",
    ),
    (
        "expected a sequence",
        "expected a list in brackets, e.g. [600, 100] (with --set, quote it: \
         --set 'model.hidden=[600,100]')",
    ),
    ("expected u64", "expected a whole number of 0 or more"),
    ("expected u32", "expected a whole number of 0 or more"),
    ("expected u16", "expected a whole number of 0 or more"),
    ("expected u8", "expected a whole number of 0 or more"),
    ("expected usize", "expected a whole number of 0 or more"),
    ("expected i64", "expected a whole number"),
    ("expected f64", "expected a number"),
    ("expected f32", "expected a number"),
    ("expected a boolean", "expected true or false"),
];

/// `message`, a deserializer's complaint about a configuration, in words; when it names an
/// unknown key, the nearest known one instead of the list of all of them.
pub(crate) fn in_words(message: &str) -> String {
    let mut said = message.trim_end().to_string();
    for (serde, words) in TYPES {
        said = said.replace(serde, words);
    }
    match nearest_key(&said) {
        Some(key) => {
            let unknown = said.split(", expected").next().unwrap_or(&said);
            format!("{unknown}; did you mean `{key}`?")
        }
        None => said,
    }
}

/// For "unknown field `x`, expected one of `a`, `b`, ...": the expected key closest to x in
/// edit distance, if it is close enough to be a typo (at most 1 + a third of its length).
fn nearest_key(message: &str) -> Option<&str> {
    let (_, rest) = message.split_once("unknown field `")?;
    let (unknown, rest) = rest.split_once('`')?;
    let (_, expected) = rest.split_once("expected")?;
    (expected.split('`').skip(1).step_by(2))
        .map(|key| (strsim::levenshtein(unknown, key), key))
        .filter(|&(distance, key)| distance <= 1 + key.len() / 3)
        .min()
        .map(|(_, key)| key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_gets_the_nearest_key_and_types_are_said_in_words() {
        let said = in_words(
            "unknown field `clients_per_rnd`, expected one of `listen`, `clients`, \
             `clients_per_round`, `rounds`",
        );
        assert_eq!(
            said,
            "unknown field `clients_per_rnd`; did you mean `clients_per_round`?"
        );
        let far = in_words("unknown field `colour`, expected one of `listen`, `clients`");
        assert!(!far.contains("did you mean"), "{far}");
        assert_eq!(
            in_words("invalid type: integer `-3`, expected u64"),
            "invalid type: integer `-3`, expected a whole number of 0 or more"
        );
        let schedule = in_words("data did not match any variant of untagged enum Schedule");
        assert!(
            schedule.starts_with("expected a number, or a schedule"),
            "{schedule}"
        );
        let list = in_words("invalid type: string \"600,100\", expected a sequence");
        assert!(
            list.contains("expected a list in brackets, e.g. [600, 100]"),
            "{list}"
        );
    }
}
