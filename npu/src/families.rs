//! The device table: every family by name, the one list the CLI, the sweep and the README read.
//! Adding a family = its folder + one line in [`FAMILIES`].

use crate::contract::Family;
use crate::Error;

pub const FAMILIES: &[Family] = &[
    crate::hailo::sim::FAMILY,
    crate::hailo::HEF_FAMILY,
    crate::coreml::FAMILY,
    crate::onnx::FAMILY,
    crate::openvino::FAMILY,
];

pub fn families() -> &'static [Family] {
    FAMILIES
}

pub fn family(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.name == name)
}

/// The family `--device NAME` selects.
pub fn by_device(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.device_name() == Some(name))
}

/// The `--device` choices that run, comma separated (`--device ane-sim`).
pub fn device_choices() -> String {
    FAMILIES
        .iter()
        .filter(|f| f.implemented && f.device_name().is_some())
        .map(|f| f.flag)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A fault `here` does not know but another family does: say which flag it belongs to. Any other
/// error passes unchanged.
pub fn place_fault(here: &Family, e: Error) -> Error {
    let Error::UnknownFault { name, known } = e else {
        return e;
    };
    match FAMILIES
        .iter()
        .find(|f| f.name != here.name && f.faults.has(&name))
    {
        Some(other) => Error::WrongDeviceFault {
            fault: name,
            device: other.flag,
            here: here.flag,
            known,
        },
        None => Error::UnknownFault { name, known },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_faults_belong_to_one_family() {
        for (i, f) in FAMILIES.iter().enumerate() {
            assert!(FAMILIES[..i].iter().all(|g| g.name != f.name), "{}", f.name);
            for d in f.faults.faults {
                let owners = FAMILIES.iter().filter(|g| g.faults.has(d.name)).count();
                assert_eq!(owners, 1, "{} is declared by {owners} families", d.name);
            }
        }
        assert_eq!(device_choices(), "--device ane-sim");
    }

    #[test]
    fn a_fault_of_another_family_names_its_flag() {
        let sim = family("hailo-sim").unwrap();
        let ane = family("ane-sim").unwrap();
        let e = place_fault(sim, crate::sim::faults::parse("ane-mask-01").unwrap_err());
        assert!(matches!(e, Error::WrongDeviceFault { .. }), "{e}");
        assert!(e.to_string().contains("--device ane-sim"), "{e}");
        let e = place_fault(ane, crate::ane::faults::parse("kv-swap").unwrap_err());
        assert!(e.to_string().contains("belongs to --sim"), "{e}");
        let e = place_fault(ane, crate::ane::faults::parse("nope").unwrap_err());
        assert!(matches!(e, Error::UnknownFault { .. }), "{e}");
    }
}
