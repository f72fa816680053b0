//! The replayer contract (issue 34): what the CLI, which knows how the device was opened, gives
//! `diagnose` to build the emulator a hypothesis is replayed on. Its own file so the outcome
//! (which carries one) and the replay (which uses one) do not import each other.

use kvprobe_npu::contract::faults::FaultTable;
use kvprobe_npu::Device;

/// What the CLI gives `diagnose` to replay a hypothesis: it knows how the device was opened.
pub trait Replayer: std::fmt::Debug {
    /// The fault table of the emulator the replays run on.
    fn table(&self) -> FaultTable;
    /// That emulator, built to the device's description, with `fault` (`--fault` text); an
    /// error when the emulator refuses the fault (e.g. it changes nothing on this geometry).
    /// `""` is the healthy hypothesis: the emulator without a fault.
    fn open(&self, fault: &str) -> kvprobe_npu::Result<Box<dyn Device>>;
    /// Research switch (leave-one-family-out, `scripts/leave-one-out.sh`): a fault this
    /// replayer's hypothesis set leaves out, as if the grammar had no such fault.
    fn leaves_out(&self, _fault: &str) -> bool {
        false
    }
    /// The argv that replays `fault` over `steps` greedy steps on the same prompt.
    fn command(&self, fault: &str, steps: usize) -> Vec<String>;
    /// The argv that runs the capacity probe with `fault` on the same device and prompt: the
    /// reproducer of a verdict the capacity check decided.
    fn capacity_command(&self, fault: &str) -> Vec<String>;
}
