//! Does what a command printed match what its page shows? Line for line, where the page's `...`
//! lines stand for any number of lines, a log line's leading timestamp (or `...` in its place)
//! for any timestamp, and a figure next to a word the block marks as varying for any figure.

/// Whether `printed` is what `expected` shows. With `cut`, the command was stopped once it
/// printed that much: `printed` need only begin as `expected` does, up to `expected`'s line that
/// contains `cut`.
pub fn check(
    expected: &[String],
    printed: &[String],
    varies: &[String],
    cut: Option<&str>,
) -> Result<(), String> {
    let expected = match cut {
        Some(marker) => {
            let upto = (expected.iter().position(|l| l.contains(marker)))
                .map_or(expected.len(), |at| at + 1);
            let mut head = expected[..upto].to_vec();
            head.push("...".into());
            head
        }
        None => expected.to_vec(),
    };
    if fits(&expected, printed, varies) {
        Ok(())
    } else {
        Err(format!(
            "the page shows:\n{}\nbut it printed:\n{}",
            expected.join("\n"),
            printed.join("\n")
        ))
    }
}

/// `expected` matches all of `printed`, `...` matching any run of lines (trying each).
fn fits(expected: &[String], printed: &[String], varies: &[String]) -> bool {
    match expected.split_first() {
        None => printed.is_empty(),
        Some((dots, rest)) if dots == "..." => {
            (0..=printed.len()).any(|skip| fits(rest, &printed[skip..], varies))
        }
        Some((line, rest)) => printed.split_first().is_some_and(|(first, after)| {
            same_line(line, first, varies) && fits(rest, after, varies)
        }),
    }
}

/// One line: the same words, but for a leading timestamp and the marked figures.
pub fn same_line(expected: &str, printed: &str, varies: &[String]) -> bool {
    let mut page: Vec<&str> = expected.split_whitespace().collect();
    let mut got: Vec<&str> = printed.split_whitespace().collect();
    if page.first().is_some_and(|w| *w == "..." || timestamp(w)) {
        if !got.first().is_some_and(|w| timestamp(w)) {
            return false;
        }
        page.remove(0);
        got.remove(0);
    }
    page.len() == got.len()
        && (0..page.len()).all(|i| page[i] == got[i] || varying(&page, i, got[i], varies))
}

/// A log's timestamp, e.g. `2026-12-02T14:10:11.675835Z`.
fn timestamp(word: &str) -> bool {
    word.len() >= 20 && word.as_bytes()[4] == b'-' && word.contains('T') && word.ends_with('Z')
}

/// Word `i` of `page` is a figure that varies, and `got` is in its place: it is `name=...` with
/// `name` marked, or next to a marked word (`accuracy 0.95`, `0.2 s`).
fn varying(page: &[&str], i: usize, got: &str, varies: &[String]) -> bool {
    let bare = |w: &str| {
        w.trim_matches(|c: char| !c.is_alphanumeric() && c != '_')
            .to_owned()
    };
    let marked = |w: &str| varies.iter().any(|v| *v == bare(w));
    // `name=value`, or `span{name=value}:`: the name is the word just before `=`.
    if let Some((before, _)) = page[i].split_once('=') {
        let name = before
            .rsplit(|c: char| !c.is_alphanumeric() && c != '_')
            .next();
        return name.is_some_and(marked) && got.starts_with(&format!("{before}="));
    }
    let figure = bare(page[i]).parse::<f64>().is_ok();
    (i > 0 && marked(page[i - 1])) || (figure && page.get(i + 1).is_some_and(|w| marked(w)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn marked_figures_and_timestamps_vary_and_nothing_else() {
        let varies = lines("accuracy\ns\nseconds");
        let page = "... INFO x: round done round=1 accuracy=\"0.9\" seconds=\"0.1\"";
        let got =
            "2026-12-07T10:00:00.1Z  INFO x: round done round=1 accuracy=\"0.8\" seconds=\"2\"";
        assert!(same_line(page, got, &varies));
        let other_round = got.replace("round=1", "round=2");
        assert!(!same_line(page, &other_round, &varies));
        assert!(same_line(
            "round 1/3: accuracy 0.4, 0.2 s",
            "round 1/3: accuracy 0.5, 0.6 s",
            &varies
        ));
        assert!(!same_line(
            "round 1/3: accuracy 0.4, 0.2 s",
            "round 2/3: accuracy 0.5, 0.6 s",
            &varies
        ));
        assert!(!same_line("a 1", "a 2", &[]));
        let span = "... INFO c{name=site-0}: connecting";
        assert!(!same_line(
            span,
            "2026-12-07T10:00:00.1Z INFO c{name=site-2}: connecting",
            &varies
        ));
        assert!(same_line(
            span,
            "2026-12-07T10:00:00.1Z INFO c{name=site-2}: connecting",
            &lines("name")
        ));
    }

    #[test]
    fn dots_stand_for_any_lines_and_a_cut_ends_the_comparison() {
        let page = lines("first\n...\nlast");
        assert!(check(&page, &lines("first\nx\ny\nlast"), &[], None).is_ok());
        assert!(check(&page, &lines("first\nlast"), &[], None).is_ok());
        assert!(check(&page, &lines("first\nlast\nmore"), &[], None).is_err());
        assert!(check(&page, &lines("first\nx"), &[], Some("first")).is_ok());
        assert!(check(&page, &lines("second"), &[], Some("first")).is_err());
    }
}
