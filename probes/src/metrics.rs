//! The numbers every probe reports (prior art §3.2: cosine in f64 as dot / (|a||b| + 1e-12)).
//!
//! Every function returns a finite number: a NaN in device output must not reach results.json
//! (JSON cannot hold it), so non-finite inputs count as no agreement.

use kvprobe_schema::LogitComparison;

/// Cosine similarity in f64, `dot / (|a|·|b| + 1e-12)`; 0 when anything is not finite.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    finite_or(dot / (na.sqrt() * nb.sqrt() + 1e-12), 0.0)
}

/// Cosine of two differences `(a − a0)` and `(b − b0)` without allocating (colmap cells).
pub fn cosine_of_diffs(a: &[f32], a0: &[f32], b: &[f32], b0: &[f32]) -> f64 {
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for i in 0..a.len().min(b.len()) {
        let x = a[i] as f64 - a0[i] as f64;
        let y = b[i] as f64 - b0[i] as f64;
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    finite_or(dot / (na.sqrt() * nb.sqrt() + 1e-12), 0.0)
}

/// Pearson correlation in f64 (cosine of the centred vectors); 0 for constant or non-finite input.
pub fn pearson(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len().min(b.len());
    if n == 0 {
        return 0.0;
    }
    let ma = a[..n].iter().map(|&x| x as f64).sum::<f64>() / n as f64;
    let mb = b[..n].iter().map(|&x| x as f64).sum::<f64>() / n as f64;
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for i in 0..n {
        let x = a[i] as f64 - ma;
        let y = b[i] as f64 - mb;
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    finite_or(dot / (na.sqrt() * nb.sqrt() + 1e-12), 0.0)
}

fn finite_or(x: f64, fallback: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        fallback
    }
}

/// Natural-log softmax in f64.
fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x
        .iter()
        .filter(|v| v.is_finite())
        .fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    let lse = x.iter().map(|&v| ((v as f64) - m).exp()).sum::<f64>().ln() + m;
    x.iter().map(|&v| v as f64 - lse).collect()
}

/// KL(reference ‖ device) of the softmax distributions, in nats; non-negative and finite
/// (capped at 1e6 when the device assigns no mass where the reference does).
pub fn kl(reference: &[f32], device: &[f32]) -> f64 {
    let lp = log_softmax(reference);
    let lq = log_softmax(device);
    let mut s = 0f64;
    for (a, b) in lp.iter().zip(&lq) {
        let p = a.exp();
        if p > 0.0 {
            s += p * (a - b);
        }
    }
    if s.is_finite() {
        s.clamp(0.0, 1e6)
    } else {
        1e6
    }
}

/// First index of the largest finite value (NaN never wins), as the server's argmax.
pub fn top1(x: &[f32]) -> u32 {
    kvprobe_npu::argmax(x)
}

/// Device logits against reference logits.
pub fn compare(device: &[f32], reference: &[f32]) -> LogitComparison {
    let d = top1(device);
    let r = top1(reference);
    LogitComparison {
        cosine: cosine(device, reference),
        kl: kl(reference, device),
        device_top1: d,
        reference_top1: r,
        top1_match: d == r,
    }
}

/// Mean, min and top-1 agreement of a set of comparisons (all 0 for an empty set).
pub fn summarise<'a>(it: impl IntoIterator<Item = &'a LogitComparison>) -> (f64, f64, f64) {
    let (mut sum, mut min, mut agree, mut n) = (0f64, f64::INFINITY, 0usize, 0usize);
    for c in it {
        sum += c.cosine;
        min = min.min(c.cosine);
        agree += c.top1_match as usize;
        n += 1;
    }
    if n == 0 {
        return (0.0, 0.0, 0.0);
    }
    (sum / n as f64, min, agree as f64 / n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_hand_values() {
        assert!((cosine(&[1.0, 0.0], &[0.0, 1.0])).abs() < 1e-12);
        assert!((cosine(&[1.0, 2.0], &[2.0, 4.0]) - 1.0).abs() < 1e-9);
        assert!((cosine(&[1.0, 0.0], &[-1.0, 0.0]) + 1.0).abs() < 1e-9);
        // 45 degrees
        assert!((cosine(&[1.0, 0.0], &[1.0, 1.0]) - 0.5f64.sqrt()).abs() < 1e-9);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 1.0]), 0.0);
        assert_eq!(cosine(&[f32::NAN, 1.0], &[1.0, 1.0]), 0.0);
    }

    #[test]
    fn diffs_and_pearson() {
        assert!(
            (cosine_of_diffs(&[2.0, 1.0], &[1.0, 1.0], &[5.0, 3.0], &[3.0, 3.0]) - 1.0).abs()
                < 1e-9
        );
        // pearson ignores offset and scale
        assert!((pearson(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]) - 1.0).abs() < 1e-9);
        assert!((pearson(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]) + 1.0).abs() < 1e-9);
        assert_eq!(pearson(&[1.0, 1.0], &[1.0, 2.0]), 0.0);
    }

    #[test]
    fn kl_hand_value() {
        // p = softmax(0, 0) = (.5, .5); q = softmax(ln 3, 0) = (.75, .25)
        // KL = .5 ln(.5/.75) + .5 ln(.5/.25) = .5 ln(4/3)
        let k = kl(&[0.0, 0.0], &[3f32.ln(), 0.0]);
        assert!((k - 0.5 * (4.0f64 / 3.0).ln()).abs() < 1e-6, "{k}");
        assert_eq!(kl(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
    }

    #[test]
    fn compare_top1() {
        let c = compare(&[0.0, 3.0, 1.0], &[0.0, 1.0, 3.0]);
        assert_eq!(
            (c.device_top1, c.reference_top1, c.top1_match),
            (1, 2, false)
        );
        let (mean, min, agree) = summarise([&c, &compare(&[1.0, 0.0], &[1.0, 0.0])]);
        assert!(min < mean && agree == 0.5);
    }
}
