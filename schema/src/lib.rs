//! The serialisable vocabulary every kvprobe crate speaks.
//!
//! Depends on serde (and serde_json, for the findings of probes without a typed field) only,
//! like a stable metadata crate: reports read these types from `results.json` without linking
//! models, devices or probes.

pub mod device;
pub mod findings;
pub mod layout_infer;
pub mod limits;
pub mod manifest;
pub mod outcome;
pub mod test_findings;

pub use device::*;
pub use findings::*;
pub use layout_infer::*;
pub use limits::*;
pub use manifest::*;
pub use outcome::{RunOutcome, EXIT_DEVICE, EXIT_FAULT_FOUND, EXIT_OK, EXIT_USAGE};

/// Version of the on-disk artefact format (`results.json`, sim manifests).
/// Readers refuse a newer version. 2: `Results.hypothesis` and `Results.reproducer` (issue 34;
/// both optional, so version-1 files still read).
pub const SCHEMA_VERSION: u32 = 2;
