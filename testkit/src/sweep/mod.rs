//! Randomised diagnosis matrix (issue 12): a seeded generator of emulator cases (every fault of
//! the README table × the scopes it accepts × values × geometries × prompts, plus healthy runs),
//! a runner that drives the `kvprobe` binary on each case, and the confusion-matrix summary.
//! Shared by `tests/diagnose_sweep.rs` (fast CI subset) and `examples/sweep.rs` (the full sweep,
//! `scripts/sweep-diagnose.sh`).

mod case;
mod draw;
mod healthy;
mod rng;
mod run;
mod summary;

pub use case::{Case, ModelSpec, OnnxFolder, TEXTS};
pub use draw::{expected, families, generate, generate_families};
pub use healthy::{healthy_cases, onnx_healthy_cases, GeometryClass, PROMPTS};
pub use rng::Rng;
pub use run::{known_limit, run_all, run_case, Outcome};
pub use summary::{report, Summary};

#[cfg(test)]
mod tests {
    use super::draw::draw_scale;
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn expected_follows_the_readme_table() {
        assert_eq!(expected("softmax=shared-across-heads@tbt"), "tbt-graph");
        assert_eq!(expected("softmax=shared-across-heads"), "prefill-graph");
        assert_eq!(expected("gqa-repeat=block"), "tbt-graph");
        assert_eq!(expected("gqa-repeat=block@prefill,tbt"), "prefill-graph");
        assert_eq!(
            expected("tbt-read-layout=f8cr@v,layer=2"),
            "cache-layout-mismatch"
        );
        assert_eq!(expected("truncate-entry=16@tbt,k"), "cache-truncation");
        assert_eq!(expected("mask=repeat@prefill"), "mask-convention");
        assert_eq!(expected("rope-theta=sign-folded"), "position-mismatch");
        assert_eq!(expected("rope-theta=plain"), "position-mismatch");
    }

    fn spec(label: &str, rope: bool) -> ModelSpec {
        ModelSpec {
            label: label.into(),
            path: PathBuf::from(label),
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            entry_bytes: 32,
            max_position: 256,
            rope,
            prompts: vec![(3..100).collect()],
            max_cache_len: 64,
            max_steps: 16,
        }
    }

    #[test]
    fn rope_theta_cases_ship_the_other_table_on_rope_models_only() {
        // the emulator's default graph is plain (README: `--sim-rope-theta sign-folded` is the
        // other one), so the shipped table must be sign-folded
        let models = [spec("learned", false), spec("rope", true)];
        let cases = generate_families(5, &models, &["rope-theta"], 4, 0);
        assert_eq!(cases.len(), 4);
        for c in &cases {
            assert_eq!(c.model, "rope");
            assert_eq!(c.fault.as_deref(), Some("rope-theta=sign-folded"));
            assert_eq!(
                (c.expect, c.family.as_str()),
                ("position-mismatch", "rope-theta")
            );
        }
        // no model takes it: no case, and the generator stops
        assert!(generate_families(5, &models[..1], &["rope-theta"], 4, 0).is_empty());
    }

    #[test]
    fn rng_is_stable_for_a_seed() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = Rng::new(42);
                move |_| r.next_u64()
            })
            .collect();
        let mut r = Rng::new(42);
        assert_eq!(a, (0..4).map(|_| r.next_u64()).collect::<Vec<_>>());
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }

    #[test]
    fn scales_stay_in_range_and_away_from_one() {
        let mut r = Rng::new(3);
        for _ in 0..200 {
            let f: f64 = draw_scale(&mut r).parse().unwrap();
            assert!((0.5..=2.0).contains(&f) && (f - 1.0).abs() >= 0.099, "{f}");
        }
    }
}
