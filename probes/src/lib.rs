//! kvprobe-probes: one module per probe, the metrics they share, and the root-cause diagnosis.
//!
//! Probes see only the device contract ([`kvprobe_npu::Device`]) and the genai
//! [`kvprobe_npu::Driver`]: they must find a fault the way they would on hardware, never from
//! the emulator's fault list (issue 4).

pub mod affected;
pub mod causality;
pub mod colmap;
pub mod diagnose;
pub mod error;
pub mod greedy;
pub mod inject;
pub mod layout;
pub mod layout_infer;
pub mod maskconv;
pub mod metrics;
pub mod positions;
pub mod precision;
pub mod prefill;
pub mod progress;
pub mod quant;
pub mod rings;
pub mod scalefit;
pub mod selfmask;
pub mod session;
pub mod splits;
pub mod stale;
pub mod statecheck;
pub mod thresholds;
pub mod ztap;

/// The stateful rules under their former module name (the CLI reads `NOT_APPLICABLE`).
pub use diagnose::stateful as diagnose_stateful;
pub use diagnose::{diagnose, DiagnoseOptions, Diagnosis};
pub use error::{Error, Result};
pub use progress::{NoProgress, Progress};
pub use session::{ComparedLogits, Geometry, Session};

/// The probe names, in the order `diagnose` runs them (CLI subcommands share these names).
pub const PROBES: [&str; 13] = [
    "quant",
    "prefill",
    "selfmask",
    "greedy",
    "colmap",
    "ztap",
    "maskconv",
    "positions",
    "layout",
    "inject",
    "stale",
    "causality",
    "splits",
];
