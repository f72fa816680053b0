//! kvprobe-probes: one module per probe, the metrics they share, and the root-cause diagnosis.
//!
//! Probes see only the device contract ([`kvprobe_npu::Device`]) and the genai
//! [`kvprobe_npu::Driver`]: they must find a fault the way they would on hardware, never from
//! the emulator's fault list (issue 4).

pub mod affected;
pub mod cache_io;
pub mod capacity;
pub mod capacity_record;
pub mod causality;
pub mod chat;
pub mod chat_diagnose;
pub mod colmap;
pub mod determinism;
pub mod device_stray;
pub mod diagnose;
pub mod error;
pub mod footing;
pub mod greedy;
pub mod host_feed;
pub mod host_slots;
pub mod inject;
mod inject_layout;
pub mod kvdiff;
pub mod kvdiff_cache;
pub mod kvdiff_compare;
pub mod layout;
pub mod layout_infer;
pub mod maskconv;
pub mod matched;
mod matched_edges;
pub mod matched_fit;
mod matched_fp16;
pub mod matched_jitter;
mod matched_store;
mod matched_summary;
pub mod metrics;
pub mod positions;
pub mod precision;
pub mod prefill;
pub mod probe;
pub mod progress;
pub mod quant;
pub mod rerun;
pub mod rings;
pub mod scalefit;
pub mod selfmask;
pub mod selfonly_fit;
pub mod session;
pub mod splits;
pub mod stale;
pub mod state_binding;
pub mod statecheck;
pub mod teacher_steps;
#[cfg(test)]
mod test_support;
pub mod thresholds;
pub mod wiring_fit;
pub mod wiring_slots;
pub mod ztap;

/// The stateful rules under their former module name (the CLI reads `NOT_APPLICABLE`).
pub use diagnose::stateful as diagnose_stateful;
pub use diagnose::{diagnose, DiagnoseOptions, Diagnosis};
pub use error::{Error, Result};
pub use probe::{Probe, ProbeOptions, SecondProcess};
pub use progress::{NoProgress, Progress};
pub use session::{ComparedLogits, Geometry, Session};

/// Every probe, once, in the order the command line lists them (the CLI builds its subcommands
/// from this list). A new probe is one module with a [`Probe`] impl and one line here.
pub static PROBES: &[&dyn Probe] = &[
    &prefill::PrefillProbe,
    &greedy::GreedyProbe,
    &selfmask::SelfmaskProbe,
    &colmap::ColmapProbe,
    &ztap::ZtapProbe,
    &quant::QuantProbe,
    &maskconv::MaskconvProbe,
    &positions::PositionsProbe,
    &layout::LayoutProbe,
    &layout_infer::LayoutInferProbe,
    &inject::InjectProbe,
    &stale::StaleProbe,
    &causality::CausalityProbe,
    &splits::SplitsProbe,
    &rerun::RerunProbe,
    &capacity::CapacityProbe,
    &determinism::DeterminismProbe,
    &chat::ChatProbe,
    &kvdiff::KvdiffProbe,
];

#[cfg(test)]
mod tests {
    use super::PROBES;

    #[test]
    fn probe_names_are_unique_and_flags_name_a_subcommand() {
        let mut names: Vec<&str> = PROBES.iter().map(|p| p.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(
            names.len(),
            PROBES.len(),
            "a probe name is registered twice"
        );
        for p in PROBES {
            if let Some((sub, long)) = p.flag_of() {
                assert!(
                    PROBES
                        .iter()
                        .any(|q| q.name() == sub && q.flag_of().is_none()),
                    "`{}`: `--{long}` of `{sub}`, which is no subcommand",
                    p.name()
                );
            }
        }
    }
}
