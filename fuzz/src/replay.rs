//! The corpus replay: every file of `fuzz/corpus/<target>/` through the target's function, as an
//! ordinary test on stable. Included (`#[path]`) by the replay tests of the crates that own the decoders;
//! not part of the fuzz crate's library.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

/// Runs `run` on every file of `target`'s corpus; fails naming each file that panicked. `manifest_dir`
/// is the replaying crate's `CARGO_MANIFEST_DIR`, `to_root` the path from it to the repository.
pub fn replay(manifest_dir: &str, to_root: &str, target: &str, run: impl Fn(&[u8])) {
    let dir = Path::new(manifest_dir)
        .join(to_root)
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the corpus of {target} ({}): {e}", dir.display()))
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("listing the corpus of {target}: {e}"));
    files.retain(|p| p.is_file());
    files.sort();
    assert!(!files.is_empty(), "the corpus of {target} is empty");
    let mut failed = Vec::new();
    for file in &files {
        let data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        if catch_unwind(AssertUnwindSafe(|| run(&data))).is_err() {
            failed.push(file.display().to_string());
        }
    }
    assert!(
        failed.is_empty(),
        "{target}: {} of {} inputs panicked: {failed:?}",
        failed.len(),
        files.len()
    );
}
