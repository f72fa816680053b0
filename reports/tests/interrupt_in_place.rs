//! The flag an interrupt reads to tell "nothing written" from "the output is already whole": set
//! only once a run folder is in place. Its own test binary, so the flag starts unset.

use kvprobe_reports::fixtures::healthy_results;
use kvprobe_reports::interrupt::output_in_place;
use kvprobe_reports::{write_run_folder, Error};

#[test]
fn only_a_run_folder_in_place_sets_the_flag() {
    let parent = tempfile::tempdir().unwrap();
    let out = parent.path().join("run");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("mine.txt"), "not a run").unwrap();
    // refused (a folder that is not an earlier run, no --force): nothing put in place
    let refused = write_run_folder::<Error>(&out, false, &[], &healthy_results(), &[], |_| Ok(()));
    assert!(refused.is_err());
    assert!(!output_in_place());
    // an `extra` step that fails discards the temporary folder: still nothing in place
    let fresh = parent.path().join("fresh");
    let failed = write_run_folder::<Error>(&fresh, false, &[], &healthy_results(), &[], |_| {
        Err(Error::OutFolder("extra failed".into()))
    });
    assert!(failed.is_err() && !fresh.exists());
    assert!(!output_in_place());
    write_run_folder::<Error>(&fresh, false, &[], &healthy_results(), &[], |_| Ok(())).unwrap();
    assert!(fresh.join("results.json").is_file());
    assert!(output_in_place());
}
