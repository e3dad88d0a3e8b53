//! Reading a Rust file's imports from its code: the paths it names from `crate`, `super` or
//! `self` (use trees expanded, comments aside), and the cycles of an import graph.

use std::collections::{BTreeMap, BTreeSet};

/// The code of `text` without comments (line comments and doc comments).
pub fn without_comments(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path of its own crate that `code` names, as its segments: each `crate::a::b::f`, and
/// each leaf of a `use crate::{a::B, b::{c, d}}` tree.
pub fn crate_paths(code: &str) -> BTreeSet<Vec<String>> {
    (rooted_paths(code).into_iter())
        .filter_map(|p| (p[0] == "crate").then(|| p[1..].to_vec()))
        .collect()
}

/// Every path `code` names from `crate`, `super` or `self`, with that root as its first segment
/// (`super::super::x` is `["super", "super", "x"]`); use trees are expanded to their leaves.
pub fn rooted_paths(code: &str) -> BTreeSet<Vec<String>> {
    let code = without_comments(code);
    let mut paths = BTreeSet::new();
    for root in ["crate", "super", "self"] {
        let needle = format!("{root}::");
        for (i, _) in code.match_indices(&needle) {
            let before = code[..i].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$' || c == ':') {
                continue; // `$crate::`, a longer identifier, or the middle of a path
            }
            expand(
                vec![root.to_string()],
                &code[i + needle.len()..],
                &mut paths,
            );
        }
    }
    paths.retain(|p| p.len() > 1);
    paths
}

/// Adds to `out` the paths of the use tree at the start of `text`, under `prefix`.
fn expand(prefix: Vec<String>, text: &str, out: &mut BTreeSet<Vec<String>>) {
    let text = text.trim_start();
    if let Some(group) = text.strip_prefix('{') {
        let mut depth = 0;
        let mut start = 0;
        for (j, c) in group.char_indices() {
            depth += i32::from(c == '{') - i32::from(c == '}');
            if depth < 0 || (c == ',' && depth == 0) {
                expand(prefix.clone(), &group[start..j], out);
                start = j + 1;
            }
            if depth < 0 {
                return;
            }
        }
        return;
    }
    let mut segments = prefix;
    let mut rest = text;
    loop {
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() {
            break;
        }
        rest = &rest[ident.len()..];
        if ident != "self" {
            segments.push(ident);
        }
        match rest.strip_prefix("::") {
            Some(after) if after.starts_with('{') => return expand(segments, after, out),
            Some(after) => rest = after,
            None => break,
        }
    }
    if !segments.is_empty() {
        out.insert(segments);
    }
}

/// The import cycles of `graph`: its strongly connected components of more than one module
/// (Tarjan's algorithm).
pub fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.graph.contains_key(w) {
                    continue;
                }
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let at = self.stack.iter().rposition(|&x| x == v).unwrap();
                let component: Vec<String> = self.stack.drain(at..).map(str::to_string).collect();
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.found
}
