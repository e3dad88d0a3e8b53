//! Files that survive a crash or a power loss as either their old or their new contents: a
//! temporary file written and synced, renamed over the file, and the folder synced so that the
//! rename itself is on disk (POSIX leaves a rename in the page cache until the folder's fsync).
//! What a process records before something leaves it (a checkpoint, a ledger, a client's spend)
//! is written here, so that after any crash the record never says less than was sent.

use std::io::Write;
use std::path::Path;

/// One step of [`write_atomic`], in order; a fault injected at a step stops the write there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteStep {
    /// The temporary file created and its bytes written.
    Write,
    /// The temporary file's contents synced.
    SyncFile,
    /// The temporary file renamed over the file.
    Rename,
    /// The folder synced.
    SyncFolder,
}

impl WriteStep {
    /// Every step, in order.
    pub const ALL: [WriteStep; 4] = [Self::Write, Self::SyncFile, Self::Rename, Self::SyncFolder];
}

/// Writes `path` via a temporary file, fsync, rename and an fsync of the folder, so that after a
/// crash the file is either the old one or the new one, and the rename itself is durable.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_with(path, bytes, |_| Ok(()))
}

/// Creates `path` (never replacing a file) with `bytes`, readable and writable by its owner
/// only, and syncs it: a private key's file.
pub fn write_secret(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// [`write_atomic`], asking `before` first at each step: an error it returns ends the write
/// there (tests inject faults with it).
pub fn write_atomic_with(
    path: &Path,
    bytes: &[u8],
    mut before: impl FnMut(WriteStep) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    before(WriteStep::Write)?;
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    before(WriteStep::SyncFile)?;
    f.sync_all()?;
    drop(f);
    before(WriteStep::Rename)?;
    std::fs::rename(&tmp, path)?;
    before(WriteStep::SyncFolder)?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    std::fs::File::open(dir.unwrap_or(Path::new(".")))?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fault at any step leaves the old contents or the new ones, never a mix or nothing.
    #[test]
    fn a_fault_at_any_step_leaves_the_old_or_the_new_file() {
        let dir = std::env::temp_dir().join(format!("fl-durable-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        for step in WriteStep::ALL {
            write_atomic(&path, b"old").unwrap();
            let fault = |s| match s == step {
                true => Err(std::io::Error::other("injected")),
                false => Ok(()),
            };
            assert!(write_atomic_with(&path, b"new", fault).is_err());
            let after = std::fs::read(&path).unwrap();
            let expected: &[u8] = if step == WriteStep::SyncFolder {
                b"new"
            } else {
                b"old"
            };
            assert_eq!(after, expected, "fault before {step:?}");
        }
        write_atomic(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
