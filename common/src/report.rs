//! An error as one line for a person: its message, then each cause that adds something.

/// `e`'s message followed by the messages of its causes, separated by ": ", leaving out a cause
/// whose text the line already holds (a wrapper that prints its source, as many do, would
/// otherwise say everything twice).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapper(std::io::Error, bool);

    impl std::fmt::Display for Wrapper {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self.1 {
                true => write!(f, "writing the run folder: {}", self.0),
                false => f.write_str("writing the run folder"),
            }
        }
    }

    impl std::error::Error for Wrapper {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// A cause already in the message is said once; one that is not is appended.
    #[test]
    fn each_cause_is_said_once() {
        let io = || std::io::Error::other("disk full");
        assert_eq!(
            error_chain(&Wrapper(io(), true)),
            "writing the run folder: disk full"
        );
        assert_eq!(
            error_chain(&Wrapper(io(), false)),
            "writing the run folder: disk full"
        );
    }
}
