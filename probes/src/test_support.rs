//! Builders the crate's unit tests share (compiled for tests only).

use kvprobe_reference::Model;
use kvprobe_schema::{DeviceStray, MatchedStep};

/// The tiny llama fixture of `seed` (`kvprobe_reference::fixtures::write_tiny_llama`), loaded.
pub fn tiny_llama(seed: u64) -> Model {
    let dir = tempfile::tempdir().expect("tempdir");
    kvprobe_reference::fixtures::write_tiny_llama(dir.path(), seed).expect("fixture");
    Model::load(dir.path()).expect("load")
}

/// A compared step whose device sits 0.98 from the matched reference, the matched reference 0.99
/// from f32, its top-1 7 by a margin of 0.3 under a declared band of 6, with the jitter
/// control's smallest cosine `jitter` and the device's stray from its control `stray`.
pub fn matched_step(jitter: Option<f64>, stray: Option<DeviceStray>) -> MatchedStep {
    MatchedStep {
        reference_vs_matched: 0.99,
        matched_vs_device: 0.98,
        matched_top1: 7,
        band: 6.0,
        matched_margin: 0.3,
        jitter,
        stray,
    }
}
