//! Issue 18's invariant as a property of the rule tables: no verdict without a failing control.
//! Hand-made facts in which every control passes, whatever the fits, variants, decodes and
//! repairs say, end healthy through every phase; the same discriminators beside a failing
//! control name a fault.

use kvprobe_schema::{Layout, Verdict};

use super::engine::{Control, Controls, Engine, Rule};
use super::ring::testing::*;
use super::ring::{RingFacts, TABLE as RING};
use super::stateful::TABLE as STATEFUL;

/// A small deterministic generator (xorshift), so a failing case names its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f64 {
        (self.next() % 1_000_000) as f64 / 1_000_000.0
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[(self.next() % xs.len() as u64) as usize]
    }
}

/// Every control passes; each discriminator is drawn to look like some fault.
fn passing_controls_with_fits(r: &mut Rng) -> RingFacts {
    let mut f = cache_path();
    let delta = *r.pick(&[-3i64, -1, 0, 1, 2, 4]);
    f.positions = Some(positions(
        0.95 + 0.04 * r.unit(),
        delta,
        0.97 + 0.03 * r.unit(),
    ));
    if let Some(ps) = f.positions.as_mut() {
        if r.unit() < 0.5 {
            ps.scale = Some(scale(0.996, 0.9995, *r.pick(&[0.8, 0.91, 1.2])));
        }
    }
    let variant = *r.pick(&["left-valid", "shift-1", "shift+1", "repeat"]);
    f.maskconv = Some(maskconv(0.95, &[(variant, 0.97 + 0.03 * r.unit())]));
    let other: &[usize] = r.pick::<&[usize]>(&[&[], &[0], &[1, 3], &[0, 1, 2, 3]]);
    let best = *r.pick(&[Layout::TokenMajor, Layout::FeatureMajor]);
    f.layout = Some(layout(best, *r.pick(&[0i64, 1, -2]), 0.9, other));
    let blame = *r.pick(&["writer", "reader", "none", "swap"]);
    f.inject = Some(inject(0.95, 0.999, 0.4 + 0.6 * r.unit(), blame));
    let cut: &[usize] = r.pick::<&[usize]>(&[&[], &[2], &[0, 1]]);
    let interpretation: &str = r.pick::<&str>(&["none", "truncated"]);
    f.ztap = Some(ztap(cut, interpretation));
    f.colmap = Some(colmap(0.3 + 0.7 * r.unit(), Some(r.unit() < 0.5)));
    f.prefill_scale = Some(scale(0.9990, 0.9999, *r.pick(&[0.9, 1.15, 1.3])));
    f.theta = Some(theta(0.999, 0.9999));
    f.layout_infer = Some(layout_infer(Some(Layout::FeatureMajor), 1));
    f.quant = quant(r.pick::<&[usize]>(&[&[], &[1]]));
    f
}

/// The ring phases in order, as the orchestration applies them.
fn conclude<F: Controls>(tables: &[&[Rule<F>]], f: &F) -> Verdict {
    let mut e = Engine::new();
    for phase in tables {
        e.apply(phase, f);
    }
    e.conclude().verdict
}

#[test]
fn every_fault_verdict_names_the_control_it_stands_on() {
    for rule in RING.iter().flat_map(|p| p.iter()) {
        if rule.verdict.is_some_and(|v| v != Verdict::Healthy) {
            assert_ne!(rule.needs, Control::Exempt, "ring rule {}", rule.id);
        }
    }
    for rule in STATEFUL.iter().flat_map(|p| p.iter()) {
        if rule.verdict.is_some_and(|v| v != Verdict::Healthy) {
            assert_ne!(rule.needs, Control::Exempt, "stateful rule {}", rule.id);
        }
    }
    for rule in super::capacity::TABLE.iter().flat_map(|p| p.iter()) {
        assert_ne!(rule.needs, Control::Exempt, "capacity rule {}", rule.id);
    }
}

#[test]
fn passing_controls_end_healthy_whatever_the_fits_say() {
    let mut r = Rng(0x5eed_0018);
    for case in 0..500 {
        let f = passing_controls_with_fits(&mut r);
        assert!(!f.fails(Control::Any), "case {case}: controls must pass");
        assert_eq!(conclude(RING, &f), Verdict::Healthy, "case {case}: {f:#?}");
    }
}

#[test]
fn the_same_fits_beside_a_failing_control_name_a_fault() {
    let mut r = Rng(0x5eed_0018);
    let mut faults = 0;
    for _ in 0..200 {
        let mut f = passing_controls_with_fits(&mut r);
        f.greedy.tbt_mean = Some(0.80);
        f.greedy.tbt_min = 0.6;
        f.greedy.tbt_top1 = 0.3;
        assert!(f.fails(Control::Greedy));
        let v = conclude(RING, &f);
        assert_ne!(v, Verdict::Healthy);
        faults += usize::from(v != Verdict::Unknown);
    }
    // most drawn discriminators explain the failure; the rest end `unknown`, never healthy
    assert!(faults > 100, "{faults} of 200 named a fault");
}
