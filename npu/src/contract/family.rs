//! What a device family declares about itself for the device table (`crate::families`): how the
//! CLI selects it, what it can do and which faults its emulator takes.

use super::device::Capabilities;
use super::faults::FaultTable;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Family {
    /// `hailo-sim`, `hef`, `ane-sim`, … (an emulator's manifests record it).
    pub name: &'static str,
    /// The command-line words that select it: `--sim`, `--hef FILE`, `--device ane-sim`; error
    /// messages name the family so.
    pub flag: &'static str,
    /// One line for help texts.
    pub about: &'static str,
    /// What its devices can do (an emulator: with every option on).
    pub capabilities: Capabilities,
    /// The emulator's faults; [`FaultTable::NONE`] for hardware and skeletons.
    pub faults: FaultTable,
    /// `false`: a skeleton; selecting it is refused with a one-line error.
    pub implemented: bool,
}

impl Family {
    /// The NAME of `--device NAME`, for a family selected that way.
    pub fn device_name(&self) -> Option<&'static str> {
        self.flag.strip_prefix("--device ")
    }
}
