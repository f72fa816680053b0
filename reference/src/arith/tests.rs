//! arith.rs's unit tests (a file of their own: arith.rs stays under the size limit).
use super::*;

#[test]
fn fp16_rounding_and_the_two_overflows_by_hand() {
    // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even = 1
    assert_eq!(
        round_fp16(1.0 + 2f32.powi(-11), Overflow::Infinite),
        (1.0, false)
    );
    assert_eq!(round_fp16(65504.0, Overflow::Infinite), (65504.0, false));
    assert_eq!(round_fp16(7.0e4, Overflow::Infinite), (f32::INFINITY, true));
    // under saturation at 131008, 7e4 keeps 11 bits (a step of 64 there) and 5.9e5 clamps
    assert_eq!(
        round_fp16(70_000.0, Overflow::Saturate(131_008.0)),
        (70_016.0, false)
    );
    assert_eq!(
        round_fp16(-5.9e5, Overflow::Saturate(131_008.0)),
        (-131_008.0, true)
    );
}

#[test]
fn the_first_overflow_is_the_one_recorded() {
    let r = Rounder::new(Arithmetic::Fp16(Fp16::every_op(
        Overflow::Saturate(131_008.0),
        NormStatistic::Squares,
    )));
    r.at_layer(Some(3));
    // a row whose squares reach 769² = 5.9e5: the norm's x·x is the first op that loses it
    let x = [769.0f32, 1.0, -2.0, 0.5];
    let y = r
        .rms_norm("input_layernorm", &x, 4, &[1.0; 4], 1e-5)
        .unwrap();
    let at = r.first_overflow().unwrap();
    assert_eq!(
        (at.layer, at.within, at.op, at.value),
        (Some(3), Some("input_layernorm"), "x·x", 769.0 * 769.0)
    );
    // the mean is a quarter of 131008 instead of 5.9e5 / 4: the output is ~2.1× too large
    assert!((y[0] / (769.0 / (769.0f32 * 769.0 / 4.0).sqrt()) - 2.125).abs() < 0.01);
    r.at_layer(Some(4));
    r.round(&mut [1e6], "later");
    assert_eq!(r.first_overflow().unwrap().layer, Some(3));
}

#[test]
fn the_max_scaled_statistic_stays_in_range_where_the_squares_do_not() {
    let r = Rounder::new(Arithmetic::Fp16(Fp16::every_op(
        Overflow::Infinite,
        NormStatistic::MaxScaled,
    )));
    let x = [2.5e4f32, 1.0, -3.0, 700.0];
    let y = r.rms_norm("norm", &x, 4, &[1.0; 4], 1e-5).unwrap();
    assert_eq!(r.first_overflow(), None);
    let ms = x.iter().map(|v| v * v).sum::<f32>() / 4.0;
    for (a, b) in y.iter().zip(&x) {
        assert!((a - b / ms.sqrt()).abs() <= 2e-3 * (b / ms.sqrt()).abs().max(1e-3));
    }
    assert_eq!(
        Rounder::new(Arithmetic::F32).rms_norm("norm", &x, 4, &[1.0; 4], 1e-5),
        None
    );
}

#[test]
fn fp16_sums_lose_the_small_terms_after_a_large_one() {
    // 2^-12 is a quarter of fp16's step at 1: added to 1 it is lost, every time; added
    // first, 1000 of them make 0.244140625 (a multiple of fp16's step there), then 1 more
    let small = 2f32.powi(-12);
    let big_first = std::iter::once(1.0).chain(std::iter::repeat_n(small, 1000));
    assert_eq!(fp16_sum(big_first), 1.0);
    let big_last = std::iter::repeat_n(small, 1000).chain(std::iter::once(1.0));
    // 1.244140625 = 1 + 250/1024, exact in fp16 and f32
    assert_eq!(fp16_sum(big_last), 1.0 + 250.0 / 1024.0);
}

#[test]
fn the_max_divided_norm_with_fp16_sums_by_hand() {
    let mut f = Fp16::every_op(Overflow::Infinite, NormStatistic::MaxDivided);
    // a row of four powers of two: every op is exact in fp16, whichever way it sums
    let x = [4.0f32, -2.0, 1.0, 1.0];
    let exact = (22.0f32 / 4.0).sqrt(); // rms = sqrt(mean(x²)), eps 0
    for sums in [false, true] {
        f.fp16_sums = sums;
        let y = Rounder::new(Arithmetic::Fp16(f))
            .rms_norm("norm", &x, 4, &[1.0; 4], 0.0)
            .unwrap();
        for (a, b) in y.iter().zip(&x) {
            assert!((a - b / exact).abs() <= 1e-3 * (b / exact).abs(), "{y:?}");
        }
    }
    // a massive activation first (300, like SmolLM2's late layers), then 575 entries of 3:
    // y = 1 then 0.01 (fp16 0.010002136), y² ≈ 1.0004e-4 each, below half of fp16's step
    // at 1 — summed in fp16 after the 1 they are lost, so the mean is 1/576 (fp16
    // 0.0017356873) instead of (1 + 575·1.0004e-4)/576 and the output is sqrt(1.0575)
    // ≈ 1.028 times too large (24 at the 300)
    let mut x = vec![3.0f32; 576];
    x[0] = 300.0;
    let mut out = |sums: bool| {
        f.fp16_sums = sums;
        Rounder::new(Arithmetic::Fp16(f))
            .rms_norm("norm", &x, 576, &[1.0; 576], 1e-5)
            .unwrap()
    };
    let (wide, narrow) = (out(false), out(true));
    let ratio = narrow[0] / wide[0];
    assert!((ratio - 1.0575f32.sqrt()).abs() < 3e-3, "{ratio}");
    assert_eq!(narrow[0], f16::from_f32(576f32.sqrt()).to_f32());
}

#[test]
fn declared_sites_round_only_there() {
    let mut f = Fp16::every_op(Overflow::Infinite, NormStatistic::Fused);
    f.sites = Some(Sites::of(&["norm output", "logits"]).unwrap());
    let r = Rounder::new(Arithmetic::Fp16(f));
    let v = 1.0 + 2f32.powi(-12); // not an fp16 value
    let mut q = [v];
    r.round(&mut q, "q_proj");
    assert_eq!(q, [v], "q_proj is not a declared site");
    let mut l = [v];
    r.round(&mut l, "logits");
    assert_eq!(l, [1.0]);
    // a norm's output is the `norm output` site
    let y = r.rms_norm("norm", &[v, -v], 2, &[1.0, 1.0], 0.0).unwrap();
    assert_eq!(y, [1.0, -1.0]);
    assert_eq!(Sites::of(&["logits", "cosine"]), Err("cosine".to_string()));
    // fp16 RoPE tables and the float32 skip sum are declared separately
    assert!(!r.skip_sum_f32());
    let mut t = [v];
    r.rope_tables(&mut t, "cos");
    assert_eq!(t, [v]);
    f.rope_tables_fp16 = true;
    f.skip_sum_f32 = true;
    let r = Rounder::new(Arithmetic::Fp16(f));
    r.rope_tables(&mut t, "cos");
    assert!(t == [1.0] && r.skip_sum_f32());
}
