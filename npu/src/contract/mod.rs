//! The device contract every family implements: the [`Device`] trait with its [`Capabilities`],
//! what a family declares for the device table, the manifest a run records, and the fault
//! grammar every family's fault table is parsed with.
//! The contract imports no family.

pub mod describe;
pub mod device;
pub mod family;
pub mod faults;
pub mod limits;
pub mod manifest;

pub use device::{Capabilities, Device, RunOutput, SavedState};
pub use family::Family;
pub use faults::{
    Expected, FaultDecl, FaultTable, FaultText, Scope, ScopeKind, SweepValue, Values,
};
