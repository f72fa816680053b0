//! The probe seam: what the command line, results.json and the timings need to know of a probe.
//! Each probe module implements [`Probe`] next to its `run`; [`crate::PROBES`] lists
//! them once, and the CLI builds its subcommands from that list.

use kvprobe_schema::ProbeFindings;

use crate::session::Session;
use crate::Result;

/// The options every probe command shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeOptions {
    /// tbt steps (`--steps`, at least 1); probes that bound their work clip it further.
    pub steps: usize,
}

pub trait Probe: Sync {
    /// The run's `command` in results.json and its timing label; also its subcommand unless
    /// [`flag_of`](Self::flag_of) says otherwise.
    fn name(&self) -> &'static str;
    /// One line of help: the subcommand's, or the flag's.
    fn about(&self) -> &'static str;
    /// `Some((subcommand, long))`: this probe is another probe's subcommand run with `--long`
    /// (it answers the same question another way, so the user finds it there).
    fn flag_of(&self) -> Option<(&'static str, &'static str)> {
        None
    }
    /// Runs the probe and stores its finding in its field(s) of `into`.
    fn run(&self, s: &mut Session, opts: &ProbeOptions, into: &mut ProbeFindings) -> Result<()>;
}
