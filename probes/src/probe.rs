//! The probe seam: what the command line, results.json and the timings need to know of a probe.
//! Each probe module implements [`Probe`] next to its `run`; [`crate::PROBES`] lists
//! them once, and the CLI builds its subcommands from that list.

use kvprobe_schema::ProbeFindings;

use crate::session::Session;
use crate::Result;

/// The options every probe command shares.
#[derive(Clone, Copy)]
pub struct ProbeOptions {
    /// tbt steps (`--steps`, at least 1); probes that bound their work clip it further.
    pub steps: usize,
    /// Runs a request in a second OS process (the CLI re-running itself); `None` in library use.
    pub second_process: Option<&'static dyn SecondProcess>,
}

impl std::fmt::Debug for ProbeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeOptions")
            .field("steps", &self.steps)
            .field("second_process", &self.second_process.is_some())
            .finish()
    }
}

/// The hook a probe uses to repeat a request in a fresh OS process (`determinism`): the caller
/// (the CLI) starts that process on the same device flags and returns the bytes it recorded
/// (`determinism::Recording::encode`). A trait, so this crate never depends on the CLI.
pub trait SecondProcess: Sync {
    /// The prompt's prefill, then `steps − 1` tbt steps fed `tokens`, in a new process.
    fn record(&self, steps: usize, tokens: &[u32]) -> Result<Vec<u8>>;
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

/// Stores a finding that has no typed field of its own in `into.extra` under the probe's name
/// (the capacity, rerun and chat probes; reports read it back by that name).
pub fn store_extra<T: serde::Serialize>(
    into: &mut ProbeFindings,
    name: &str,
    finding: &T,
) -> Result<()> {
    let value = serde_json::to_value(finding)
        .map_err(|e| crate::Error::Input(format!("{name} finding: {e}")))?;
    into.extra.insert(name.to_string(), value);
    Ok(())
}
