//! Hand-built issue-10 findings for the unit tests of the code that reads them (the stage
//! rules in probes, the matrices and tables in reports): a test names what it varies, every
//! other field gets a neutral value.

use crate::{LogitComparison, SplitRow, SplitsFinding, StaleFinding, StaleLeak, StaleStep};

/// A comparison that carries only its cosine (KL 0, matching top-1 tokens).
pub fn comparison(cosine: f64) -> LogitComparison {
    LogitComparison {
        cosine,
        kl: 0.0,
        device_top1: 0,
        reference_top1: 0,
        top1_match: true,
    }
}

/// Poison in `never_written` slots that first moved step 0, through the `leaking` ones (each
/// one slot from a valid entry); the permutation test did not run.
pub fn stale(never_written: Vec<usize>, steps: Vec<StaleStep>, leaking: &[usize]) -> StaleFinding {
    StaleFinding {
        poison_magnitude: 1.0,
        never_written_slots: never_written,
        previously_written_slots: Vec::new(),
        steps,
        first_moved_step: Some(0),
        leaks: leaking
            .iter()
            .map(|&slot| StaleLeak {
                step: 0,
                slot,
                class: "never-written".into(),
                distance_to_valid: 1,
            })
            .collect(),
        leak_search_complete: true,
        leak_trials: leaking.len(),
        leak_permutation_cosine: None,
        leaks_whole_entries: None,
        back_to_back: None,
    }
}

/// Splits of a `prompt_len`-token prompt at P = 2: the minima of pure decode and of decode after
/// a prefill, and the whole prefill's cosine (also the prefill-continue minimum).
pub fn splits(
    prompt_len: usize,
    rows: Vec<SplitRow>,
    pure: f64,
    mixed: f64,
    whole: f64,
) -> SplitsFinding {
    SplitsFinding {
        prompt_len,
        prefill_len: 2,
        rows,
        whole_prefill: comparison(whole),
        pure_decode_min: pure,
        mixed_decode_min: mixed,
        prefill_continue_min: whole,
        failing_splits: Vec::new(),
    }
}
