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

/// A step at a position before its own step count: `position - step` underflowed while drawing
/// (a panic in a debug build, a walk over billions of positions in a release build).
#[test]
fn stale_step_before_its_position_is_refused() {
    let mut r = faulty_results();
    let step = StaleStep {
        step: 5,
        position: 2,
        cosine_to_clean: 1.0,
        max_abs_diff: 0.0,
        moved: false,
    };
    r.probes.stale = Some(stale(vec![1], vec![step], &[]));
    assert_malformed(&r, "stale step 5");
    let mut r = faulty_results();
    r.probes.stale = Some(stale((0..5000).collect(), vec![], &[]));
    assert_malformed(&r, "never_written_slots");
}

/// A split past the prompt: `split + j` overflowed (a panic in a debug build).
#[test]
fn split_past_the_prompt_is_refused() {
    let mut r = faulty_results();
    let row = SplitRow {
        split: usize::MAX,
        prefill_continue: None,
        decode_cosines: vec![0.9, 0.8],
        decode_final: comparison(0.9),
    };
    r.probes.splits = Some(splits(4, vec![row], 0.9, 0.9, 0.9));
    assert_malformed(&r, "splits row");
}

/// 150 000 colmap entries without positions: labels were matched row by row against every entry
/// (2 × 2.25e10 comparisons, about a minute); a lookup built once draws it in well under a second.
#[test]
fn colmap_labels_are_matched_in_linear_time() {
    let mut r = faulty_results();
    let c = r.probes.colmap.as_mut().unwrap();
    let n = 150_000;
    let row = c.rows[0].clone();
    c.positions.clear();
    c.position_tokens.clear();
    c.entries = (0..n).collect();
    c.matrix = vec![Vec::new(); n];
    c.rows = (0..n)
        .rev()
        .map(|entry| kvprobe_schema::ColmapRow {
            entry,
            ..row.clone()
        })
        .collect();
    let (got, dir) = load(&r);
    got.unwrap();
    let t = std::time::Instant::now();
    kvprobe_reports::render_report(dir.path()).unwrap();
    assert!(t.elapsed().as_secs_f64() < 10.0, "{:?}", t.elapsed());
}

/// A results.json that is a pipe or a folder is refused before reading.
#[test]
fn results_json_must_be_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("results.json")).unwrap();
    let e = load_results(dir.path()).unwrap_err().to_string();
    assert!(!e.contains('\n'), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("results.json");
    assert!(std::process::Command::new("mkfifo")
        .arg(&p)
        .status()
        .unwrap()
        .success());
    let e = load_results(dir.path()).unwrap_err().to_string();
    assert!(!e.contains('\n'), "{e}");
}
