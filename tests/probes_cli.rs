//! The probe subcommands through the binary: healthy is healthy, controls behave as controls,
//! bad input exits 2 with one line and no artefacts.

mod common;
use common::*;

#[test]
fn make_fixtures() {
    assert!(fixture("llama", 7).join("config.json").is_file());
    assert!(fixture("gpt2", 7).join("config.json").is_file());
}
