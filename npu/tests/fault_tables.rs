//! The families' fault tables are the one declaration of every fault: the README's fault tables
//! are generated from them (this test fails when one is stale), and every declared verdict is a
//! verdict the diagnosis can give.
//!
//! Regenerate the README sections: `cargo test -p kvprobe-npu --test fault_tables -- --ignored
//! --nocapture print_readme_tables` and paste each between its markers.

use kvprobe_npu::contract::{FaultTable, Scope};
use kvprobe_npu::families;
use kvprobe_schema::Verdict;

const BEGIN: &str = "<!-- fault-table:";
const END: &str = "<!-- /fault-table -->";

fn readme() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The text between `<!-- fault-table:NAME -->` and the next end marker.
fn section<'a>(readme: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("{BEGIN}{name} -->\n");
    let start = readme.find(&open)? + open.len();
    let len = readme[start..].find(END)?;
    Some(&readme[start..start + len])
}

fn tables() -> impl Iterator<Item = (&'static str, FaultTable)> {
    families()
        .iter()
        .filter(|f| !f.faults.faults.is_empty())
        .map(|f| (f.name, f.faults))
}

#[test]
fn readme_fault_tables_are_generated_from_the_families() {
    let readme = readme();
    for (name, table) in tables() {
        let got = section(&readme, name)
            .unwrap_or_else(|| panic!("README.md has no `{BEGIN}{name} -->` section"));
        assert_eq!(
            got,
            table.markdown(),
            "README.md's fault table of {name} is stale; regenerate it (see this file's doc)"
        );
    }
}

#[test]
fn declared_verdicts_are_fault_verdicts() {
    for (name, table) in tables() {
        for d in table.faults {
            for v in [
                d.expected(&Scope::default()),
                d.expected(&Scope {
                    groups: Some(vec![kvprobe_schema::GroupKind::Tbt]),
                    ..Scope::default()
                }),
            ] {
                assert!(
                    !matches!(v, Verdict::Healthy | Verdict::Unknown),
                    "{name}: {} declares {}",
                    d.name,
                    v.name()
                );
            }
        }
    }
}

#[test]
fn expected_verdicts_follow_scope_defaults() {
    let sim = families::family("hailo-sim").expect("the Hailo emulator is registered");
    let v = |t: &str| sim.faults.expected(t).map(|v| v.name()).unwrap();
    assert_eq!(v("softmax=shared-across-heads@tbt"), "tbt-graph");
    assert_eq!(v("softmax=shared-across-heads"), "prefill-graph");
    assert_eq!(v("gqa-repeat=block"), "tbt-graph");
    assert_eq!(v("gqa-repeat=block@prefill,tbt"), "prefill-graph");
    assert_eq!(v("tbt-read-layout=f8cr@v,layer=2"), "cache-layout-mismatch");
    assert_eq!(v("truncate-entry=16@tbt,k"), "cache-truncation");
    assert_eq!(v("mask=repeat@prefill"), "mask-convention");
    assert_eq!(v("rope-theta=plain"), "position-mismatch");
    let ane = families::by_device("ane-sim").expect("ane-sim is registered");
    assert_eq!(
        ane.faults.expected("ane-scale-after-qk=64").unwrap(),
        Verdict::NumericOverflow
    );
}

#[test]
#[ignore]
fn print_readme_tables() {
    for (name, table) in tables() {
        println!("{BEGIN}{name} -->\n{}{END}\n", table.markdown());
    }
}
