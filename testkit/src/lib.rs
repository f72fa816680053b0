//! kvprobe-testkit: what the tests and the sweep share and the shipped binary never needs — the
//! seeded randomised diagnosis sweep ([`sweep`]) and fixture model folders written once per
//! target directory ([`fixtures`]).

pub mod fixtures;
pub mod sweep;
