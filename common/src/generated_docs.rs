//! Pages of the book generated from the code (the command-line, configuration and metrics
//! references, under `docs/src/reference/`): each is checked in, and a test of the crate that
//! owns the code compares the page with what the code generates now, so the two cannot drift.

use std::path::Path;

/// Set to `1`, [`check`] writes the page instead of comparing it.
pub const REGENERATE: &str = "FL_REGENERATE_DOCS";

/// Compares `generated` with the checked-in page `page` (a path from the workspace root `root`);
/// with `FL_REGENERATE_DOCS=1` it writes the page instead. A stale or missing page is an error
/// that names the command regenerating it: `FL_REGENERATE_DOCS=1` before `test`.
pub fn check(root: &Path, page: &str, generated: &str, test: &str) -> Result<(), String> {
    let path = root.join(page);
    if std::env::var(REGENERATE).is_ok_and(|v| v == "1") {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        return std::fs::write(&path, generated).map_err(|e| format!("writing {page}: {e}"));
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current == generated {
        return Ok(());
    }
    let line = first_difference(&current, generated);
    Err(format!(
        "{page} is not what the code generates (first difference at line {line}); \
         regenerate it with `{REGENERATE}=1 {test}` and commit it"
    ))
}

/// [`check`] for a test of the crate in `manifest_dir` (its `CARGO_MANIFEST_DIR`, one level below
/// the workspace root); panics with [`check`]'s error.
pub fn assert_fresh(manifest_dir: &str, page: &str, generated: &str, test: &str) {
    let root = Path::new(manifest_dir).join("..");
    if let Err(why) = check(&root, page, generated, test) {
        panic!("{why}");
    }
}

/// The 1-based number of the first line where `a` and `b` differ.
fn first_difference(a: &str, b: &str) -> usize {
    let mut lines = a.lines().zip(b.lines());
    let same = lines.by_ref().take_while(|(x, y)| x == y).count();
    same + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_page_names_its_line_and_the_command() {
        let dir = std::env::temp_dir().join(format!("fl-generated-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("page.md"), "# Title\nold\n").unwrap();
        assert!(check(&dir, "page.md", "# Title\nold\n", "cargo test x").is_ok());
        let err = check(&dir, "page.md", "# Title\nnew\n", "cargo test x").unwrap_err();
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains("FL_REGENERATE_DOCS=1 cargo test x"), "{err}");
        let missing = check(&dir, "absent.md", "text", "cargo test x").unwrap_err();
        assert!(missing.contains("absent.md"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
