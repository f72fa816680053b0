//! Fixture model folders for tests: written once under a folder the caller names (a target
//! directory's temporary area), through a `.partial` sibling renamed into place, so concurrent
//! test binaries never see a half-written model.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

static FIXTURE_LOCK: Mutex<()> = Mutex::new(());

/// Which random-weight fixture to write (`kvprobe_reference::fixtures`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixtureKind {
    Llama,
    Gpt2,
}

impl FixtureKind {
    /// `"llama"` → Llama; anything else → GPT-2 (the tests' historical spelling).
    pub fn named(kind: &str) -> Self {
        if kind == "llama" {
            FixtureKind::Llama
        } else {
            FixtureKind::Gpt2
        }
    }
    fn name(self) -> &'static str {
        match self {
            FixtureKind::Llama => "llama",
            FixtureKind::Gpt2 => "gpt2",
        }
    }
}

/// The fixture folder `ROOT/probe-fixtures/KIND-SEED`, written if it is not there yet.
pub fn fixture_folder(root: &Path, kind: FixtureKind, seed: u64) -> anyhow::Result<PathBuf> {
    let dir = root.join(format!("probe-fixtures/{}-{seed}", kind.name()));
    write_once(&dir, |tmp| match kind {
        FixtureKind::Llama => kvprobe_reference::fixtures::write_tiny_llama(tmp, seed),
        FixtureKind::Gpt2 => kvprobe_reference::fixtures::write_tiny_gpt2(tmp, seed),
    })
}

/// The Llama fixture of `seed` with its residual stream at `scale` times its usual size
/// (`write_tiny_llama_at_scale`), in `ROOT/probe-fixtures/llama-SEED-residualSCALE`.
pub fn llama_at_scale(root: &Path, seed: u64, scale: f64) -> anyhow::Result<PathBuf> {
    let dir = root.join(format!("probe-fixtures/llama-{seed}-residual{scale}"));
    write_once(&dir, |tmp| {
        kvprobe_reference::fixtures::write_tiny_llama_at_scale(tmp, seed, scale)
    })
}

fn write_once(
    dir: &Path,
    write: impl FnOnce(&Path) -> kvprobe_reference::Result<()>,
) -> anyhow::Result<PathBuf> {
    let _g = FIXTURE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if !dir.join("tokenizer.json").is_file() {
        let tmp = dir.with_extension("partial");
        let _ = std::fs::remove_dir_all(&tmp);
        write(&tmp)?;
        let _ = std::fs::remove_dir_all(dir);
        std::fs::rename(&tmp, dir)?;
    }
    Ok(dir.to_path_buf())
}
