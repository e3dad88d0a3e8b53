//! A page's commands, read from its fenced blocks: every command of an `sh` block (one per
//! line, `\` continuing it) and every `$ ` command of a `console` block with the lines printed
//! under it. A `console` block with no `$ ` line is what the command just above it printed. The
//! fence's `varies=a,b` names the words whose figures differ from run to run.

/// One command of a page, as a reader would type it.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The line of the page where it is.
    pub line: usize,
    /// The command (continuations joined).
    pub script: String,
    /// The lines the page shows it printing (`...` for lines left out), if any.
    pub expected: Vec<String>,
    /// The words whose figures vary (the fence's `varies=`).
    pub varies: Vec<String>,
    /// Ends with `&`: the reader goes on while it runs.
    pub background: bool,
}

/// The commands of `text`, in order.
pub fn steps(text: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((at, line)) = lines.next() {
        let Some(info) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let mut words = info.split_whitespace();
        let lang = words.next().unwrap_or_default();
        let varies: Vec<String> = (words.filter_map(|w| w.strip_prefix("varies=")))
            .flat_map(|v| v.split(',').map(str::to_owned))
            .collect();
        let mut body = Vec::new();
        for (n, l) in lines.by_ref() {
            if l.trim_start().starts_with("```") {
                break;
            }
            body.push((n + 1, l));
        }
        match lang {
            "sh" => steps.extend(sh(&body)),
            "console" => console(&body, &varies, at + 1, &mut steps),
            _ => {}
        }
    }
    steps
}

/// The commands of an `sh` block.
fn sh(body: &[(usize, &str)]) -> Vec<Step> {
    let mut out = Vec::new();
    let mut command: Option<(usize, String)> = None;
    for &(n, line) in body {
        let (first, mut text) = command.take().unwrap_or((n, String::new()));
        text += line.trim_end().trim_end_matches('\\');
        if line.trim_end().ends_with('\\') {
            command = Some((first, text + " "));
            continue;
        }
        let code = without_comment(&text);
        // A loop is one command, up to its `done`.
        if code.starts_with("for ") && !code.contains("done") {
            command = Some((first, text + "\n"));
            continue;
        }
        if !code.is_empty() {
            out.push(Step {
                line: first,
                background: code.ends_with('&') && !code.ends_with("&&"),
                script: text,
                expected: Vec::new(),
                varies: Vec::new(),
            });
        }
    }
    out
}

/// The commands of a `console` block, each with the lines under it; with none, its lines are
/// the output of the last command of `steps`.
fn console(body: &[(usize, &str)], varies: &[String], fence: usize, steps: &mut Vec<Step>) {
    let mut own = Vec::new();
    for &(n, line) in body {
        let continues = own
            .last()
            .is_some_and(|s: &Step| s.expected.is_empty() && s.script.ends_with('\\'));
        match (line.strip_prefix("$ "), line.strip_prefix("> ")) {
            (Some(command), _) => own.push(Step {
                line: n,
                script: command.to_owned(),
                expected: Vec::new(),
                varies: varies.to_vec(),
                background: false,
            }),
            (None, Some(more)) if own.last().is_some_and(|s| s.expected.is_empty()) => {
                let step = own.last_mut().unwrap();
                step.script = format!("{}\n{more}", step.script);
            }
            _ if continues => {
                let step = own.last_mut().unwrap();
                step.script = format!("{} {}", step.script.trim_end_matches('\\'), line.trim());
            }
            _ => match own.last_mut() {
                Some(step) => step.expected.push(line.to_owned()),
                None => {
                    let last = (steps.last_mut())
                        .unwrap_or_else(|| panic!("line {fence}: output with no command above"));
                    last.expected.push(line.to_owned());
                    last.varies = varies.to_vec();
                }
            },
        }
    }
    steps.extend(own);
}

/// `line` without a trailing `# comment` (one after whitespace), trimmed.
pub fn without_comment(line: &str) -> &str {
    let cut = (line.match_indices(" #").next()).map_or(line.len(), |(at, _)| at);
    let code = line[..cut].trim();
    if code.starts_with('#') { "" } else { code }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_their_outputs_are_read_from_both_kinds_of_block() {
        let text = "text\n```sh\nfl sim \\\n  --config x   # a run\n# only a comment\n\
                    fl-server --listen a &\n```\n\
                    ```console varies=accuracy,s\nround 1: accuracy 0.5, 0.2 s\n```\n\
                    ```console\n$ for i in 1 2; do\n>   echo $i\n> done\n1\n...\n\
                    $ fl-client --server b \\\n    --connect-timeout 4\nerror: no\n```\n";
        let steps = steps(text);
        let scripts: Vec<&str> = steps.iter().map(|s| s.script.as_str()).collect();
        assert_eq!(
            scripts,
            [
                "fl sim    --config x   # a run",
                "fl-server --listen a &",
                "for i in 1 2; do\n  echo $i\ndone",
                "fl-client --server b  --connect-timeout 4",
            ]
        );
        assert_eq!(steps[0].line, 3);
        assert!(!steps[0].background && steps[1].background);
        assert_eq!(steps[1].expected, ["round 1: accuracy 0.5, 0.2 s"]);
        assert_eq!(steps[1].varies, ["accuracy", "s"]);
        assert_eq!(steps[2].expected, ["1", "..."]);
        assert_eq!(steps[3].expected, ["error: no"]);
    }

    #[test]
    fn comments_are_not_commands() {
        assert_eq!(without_comment("a b  # c"), "a b");
        assert_eq!(without_comment("# c"), "");
        assert_eq!(without_comment("a &"), "a &");
    }
}
