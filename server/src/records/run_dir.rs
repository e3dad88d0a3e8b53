//! Which folder a run writes, and the rule that protects what an earlier run wrote there.
//!
//! A folder holds a run once any of its record files is there ([`RECORDS`]). A new run never
//! starts in such a folder: the operator resumes it (`--resume DIR`) or replaces it
//! (`--overwrite`), and a replaced run's privacy ledger is kept beside the new one under a
//! name of its own ([`clear_for_overwrite`]), never deleted. Without a folder named (no `--out`
//! and no `server.out`), each run gets a new one, `runs/NAME-YYYYMMDD-HHMMSS` in UTC ([`fresh`]),
//! and once the run has started (everything bound, its records opened) `runs/latest` points to
//! it ([`mark_latest`]). A run that fails to start leaves no folder and does not move the link
//! ([`discard_unstarted`]).

use crate::records::checkpoint;
use std::io::{Error, ErrorKind};
use std::path::{Path, PathBuf};

/// The files that make a folder hold a run: what a rerun would otherwise rewrite.
pub const RECORDS: [&str; 4] = [
    "ledger.jsonl",
    "metrics.jsonl",
    checkpoint::FILE,
    "summary.json",
];
/// Files of a run that `--overwrite` removes (the ledger is archived instead).
const REPLACED: [&str; 7] = [
    "metrics.jsonl",
    checkpoint::FILE,
    "summary.json",
    "model.safetensors",
    "local_privacy.json",
    "accuracy.svg",
    "privacy.svg",
];
/// Where runs without a named folder go.
pub const ROOT: &str = "runs";
/// The link in [`ROOT`] to the newest such run.
pub const LATEST: &str = "latest";

/// Whether `dir` holds a run.
pub fn holds_run(dir: &Path) -> bool {
    RECORDS.iter().any(|f| dir.join(f).exists())
}

/// Why the run in `dir` ended, when it ended for good (its `summary.json` says it stopped after
/// its rounds or with its budget spent): such a run has nothing to resume. `None` for a run
/// that was interrupted, failed, or has no summary yet.
pub fn finished(dir: &Path) -> std::io::Result<Option<String>> {
    let path = dir.join("summary.json");
    if !path.exists() {
        return Ok(None);
    }
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)
        .map_err(|e| Error::new(ErrorKind::InvalidData, format!("{}: {e}", path.display())))?;
    Ok(match summary["stopped_by"].as_str() {
        Some("rounds") => Some("all its rounds ran".into()),
        Some("budget") => Some("its privacy budget is spent".into()),
        _ => None,
    })
}

/// Refuses to start a new run in `dir` when it holds one, naming the folder and both ways on.
pub fn check_unused(dir: &Path) -> std::io::Result<()> {
    if !holds_run(dir) {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::AlreadyExists,
        format!(
            "{d} holds a run: continue it with --resume {d}, or start over with --overwrite \
             (its privacy ledger is then kept beside the new run)",
            d = dir.display()
        ),
    ))
}

/// [`clear_for_overwrite`], logging where the replaced run's ledger is kept.
pub fn replace(dir: &Path) -> std::io::Result<()> {
    if let Some(archive) = clear_for_overwrite(dir)? {
        tracing::warn!(ledger = %archive.display(), "the replaced run's privacy ledger is kept");
    }
    Ok(())
}

/// Makes `dir` ready for a new run that replaces the one it holds: its ledger is renamed to
/// `ledger-replaced-YYYYMMDD-HHMMSS.jsonl` (returned), the other records are removed.
pub fn clear_for_overwrite(dir: &Path) -> std::io::Result<Option<PathBuf>> {
    let ledger = dir.join(RECORDS[0]);
    let archive = match ledger.exists() {
        true => {
            let archive = unused(dir, "ledger-replaced", ".jsonl")?;
            std::fs::rename(&ledger, &archive)?;
            Some(archive)
        }
        false => None,
    };
    for name in REPLACED {
        remove_if_present(&dir.join(name))?;
    }
    Ok(archive)
}

/// Removes what a run that failed to start wrote in `dir`: the folder itself when it did not
/// exist before (`existed` false), else the records the run creates.
pub fn discard_unstarted(dir: &Path, existed: bool) -> std::io::Result<()> {
    if !existed {
        return match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    for name in RECORDS {
        remove_if_present(&dir.join(name))?;
    }
    // A folder left empty (one `fresh` made) goes too; one with anything else in it stays.
    let _ = std::fs::remove_dir(dir);
    Ok(())
}

/// Removes the file at `path`, if there is one.
fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// A new folder for a run named `name` (the configuration file's stem), in [`ROOT`].
/// The folder is created here (and is empty): two runs started in the same second get two.
/// [`mark_latest`] points `ROOT/latest` at it once the run has started.
pub fn fresh(name: &str) -> std::io::Result<PathBuf> {
    fresh_in(Path::new(ROOT), name)
}

/// [`fresh`] in `root`.
fn fresh_in(root: &Path, name: &str) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(root)?;
    for dir in candidates(root, name, "")? {
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::other("no free name"))
}

/// `dir/PREFIX-YYYYMMDD-HHMMSS[-N]SUFFIX` in UTC, with the first N that is not taken.
fn unused(dir: &Path, prefix: &str, suffix: &str) -> std::io::Result<PathBuf> {
    (candidates(dir, prefix, suffix)?.find(|p| !p.exists()))
        .ok_or_else(|| Error::other("no free name"))
}

/// `dir/PREFIX-YYYYMMDD-HHMMSS[-N]SUFFIX` in UTC for N = 1, 2, ... (1 written as nothing).
fn candidates(
    dir: &Path,
    prefix: &str,
    suffix: &str,
) -> std::io::Result<impl Iterator<Item = PathBuf>> {
    let format = time::macros::format_description!("[year][month][day]-[hour][minute][second]");
    let stamp = (time::OffsetDateTime::now_utc().format(format)).map_err(Error::other)?;
    let (base, dir, suffix) = (
        format!("{prefix}-{stamp}"),
        dir.to_owned(),
        suffix.to_owned(),
    );
    Ok((1..10_000).map(move |n| match n {
        1 => dir.join(format!("{base}{suffix}")),
        n => dir.join(format!("{base}-{n}{suffix}")),
    }))
}

/// Points `runs/latest` at `dir` when `dir` is a folder of [`ROOT`] (on Unix, as a relative
/// symbolic link, unless `latest` is something other than a link, which is left alone): called
/// once a run has started there.
pub fn mark_latest(dir: &Path) {
    if dir.parent() == Some(Path::new(ROOT)) {
        point_latest(Path::new(ROOT), dir);
    }
}

/// Points `root/latest` at `dir`: a new link made beside it and renamed over it, so that runs
/// started at once each leave a whole link. A failure is logged, not fatal: the link is a
/// convenience, the run folder is the record.
#[cfg(unix)]
fn point_latest(root: &Path, dir: &Path) {
    let link = root.join(LATEST);
    if std::fs::symlink_metadata(&link).is_ok_and(|m| !m.file_type().is_symlink()) {
        tracing::warn!(path = %link.display(), "not a link: left as it is");
        return;
    }
    let target = dir.file_name().map(PathBuf::from).unwrap_or(dir.to_owned());
    let name = target.to_string_lossy();
    let fresh = root.join(format!(".{LATEST}-{name}-{}", std::process::id()));
    let made =
        std::os::unix::fs::symlink(&target, &fresh).and_then(|()| std::fs::rename(&fresh, &link));
    if let Err(e) = made {
        let _ = std::fs::remove_file(&fresh);
        tracing::warn!(path = %link.display(), error = %e, "cannot point the link at the new run");
    }
}

#[cfg(not(unix))]
fn point_latest(_root: &Path, _dir: &Path) {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder with any record refuses a new run, naming itself and both options; an overwrite
    /// keeps the ledger under a new name and removes the rest.
    #[test]
    fn a_run_is_neither_reused_nor_lost() {
        let dir = std::env::temp_dir().join(format!("fl-run-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        check_unused(&dir).unwrap();
        std::fs::write(dir.join("ledger.jsonl"), "{\"round\":1}\n").unwrap();
        std::fs::write(dir.join("metrics.jsonl"), "{}\n").unwrap();
        let e = check_unused(&dir).unwrap_err().to_string();
        let named = dir.display().to_string();
        for part in [named.as_str(), "--resume", "--overwrite"] {
            assert!(e.contains(part), "{e}");
        }
        let archive = clear_for_overwrite(&dir).unwrap().unwrap();
        assert_eq!(
            std::fs::read_to_string(&archive).unwrap(),
            "{\"round\":1}\n"
        );
        assert!(!holds_run(&dir));
        check_unused(&dir).unwrap();
        // A second overwrite the same second keeps both archives.
        std::fs::write(dir.join("ledger.jsonl"), "{\"round\":2}\n").unwrap();
        let second = clear_for_overwrite(&dir).unwrap().unwrap();
        assert_ne!(second, archive);
        assert!(archive.exists() && second.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Runs started in the same second get folders of their own; `latest` moves only when a run
    /// is marked started, to the last one marked.
    #[test]
    fn new_runs_get_folders_of_their_own() {
        let root = std::env::temp_dir().join(format!("fl-run-fresh-{}", std::process::id()));
        let first = fresh_in(&root, "quickstart").unwrap();
        let second = fresh_in(&root, "quickstart").unwrap();
        assert_ne!(first, second);
        assert!(first.is_dir() && second.is_dir());
        assert!(std::fs::symlink_metadata(root.join(LATEST)).is_err());
        point_latest(&root, &first);
        point_latest(&root, &second);
        #[cfg(unix)]
        assert_eq!(
            std::fs::read_link(root.join(LATEST)).unwrap(),
            second.file_name().unwrap()
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
