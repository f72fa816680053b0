//! A results.json that contradicts itself is refused on load with one line naming it: matrices
//! that do not match their axes (panicked while drawing) and sizes the data cannot back (asked
//! for gigabytes). issue 19.

use kvprobe_reports::fixtures::faulty_results;
use kvprobe_reports::{load_results, Error};
use kvprobe_schema::test_findings::{comparison, splits, stale};
use kvprobe_schema::{Results, SplitRow, StaleStep};

/// `r` saved as the results.json of a fresh folder, then loaded.
fn load(r: &Results) -> (Result<Results, Error>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let json = serde_json::to_string(r).unwrap();
    std::fs::write(dir.path().join("results.json"), json).unwrap();
    (load_results(dir.path()), dir)
}

fn assert_malformed(r: &Results, needle: &str) {
    let (got, _dir) = load(r);
    let Err(e) = got else {
        panic!("loaded a malformed results.json");
    };
    assert!(matches!(e, Error::Malformed { .. }), "{e}");
    let msg = e.to_string();
    assert!(!msg.contains('\n'), "multi-line: {msg}");
    assert!(msg.contains("results.json"), "{msg}");
    assert!(msg.contains(needle), "`{msg}` does not name `{needle}`");
}

#[test]
fn colmap_rows_must_match_its_entries() {
    for extra in [1usize, 5, 300] {
        let mut r = faulty_results();
        let c = r.probes.colmap.as_mut().unwrap();
        let row = c.matrix[0].clone();
        c.matrix.extend(std::iter::repeat_n(row, extra));
        assert_malformed(&r, "colmap matrix");
    }
    let mut r = faulty_results();
    r.probes.colmap.as_mut().unwrap().matrix.pop();
    assert_malformed(&r, "colmap matrix");
    let mut r = faulty_results();
    r.probes.colmap.as_mut().unwrap().matrix[3].push(0.5);
    assert_malformed(&r, "row 3");
}

/// Splits of a prompt declared a billion tokens long, three rows of data.
fn huge_splits() -> kvprobe_schema::SplitsFinding {
    let row = |split| SplitRow {
        split,
        prefill_continue: None,
        decode_cosines: vec![0.9],
        decode_final: comparison(0.9),
    };
    splits(1_000_000_000, vec![row(0), row(1), row(2)], 0.9, 0.9, 0.9)
}

#[test]
fn declared_sizes_beyond_the_data_are_refused_before_allocating() {
    let mut r = faulty_results();
    r.probes.splits = Some(huge_splits());
    assert_malformed(&r, "splits matrix");

    let mut r = faulty_results();
    let step = StaleStep {
        step: 0,
        position: 10,
        cosine_to_clean: 1.0,
        max_abs_diff: 0.0,
        moved: false,
    };
    r.probes.stale = Some(stale(vec![1], vec![step], &[]));
    r.provenance.cache_len = 1_000_000_000;
    assert_malformed(&r, "stale map");

    let mut r = faulty_results();
    let l = r.probes.layout.as_mut().unwrap();
    l.shifts = (0..200_000).collect();
    let mut cache = l.caches[0].clone();
    cache.scores.clear();
    l.caches = vec![cache; 1000];
    assert_malformed(&r, "layout correlation matrix");
}

#[test]
fn valid_results_still_load() {
    let r = faulty_results();
    let (got, _dir) = load(&r);
    assert!(got.unwrap() == r);
}
