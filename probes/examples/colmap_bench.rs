//! Colmap reference side: KV reuse (`prefix_state` once + `step_many`) against one full forward
//! with a 4-D mask per prompt position. Prints both timings and the largest difference.

use std::time::Instant;

use kvprobe_reference::{ForwardOptions, KeySet, Model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or(".cache/models/smollm2-135m-instruct-q4_1.gguf".into());
    let model = Model::load(std::path::Path::new(&path))?;
    let ids = model.encode(
        "The quick brown fox jumps over the lazy dog. It was a sunny day and the children were playing in the park near the old river, laughing and running.",
        None,
    )?;
    let n = ids.len();
    let q = ids[n / 2];
    let t = Instant::now();
    let state = model.prefix_state(&ids, &(0..n).collect::<Vec<_>>())?;
    let mut sets = vec![KeySet::None];
    sets.extend((0..n).map(|p| KeySet::Subset(vec![p])));
    let reuse = model.step_many(&state, q, n, &sets)?;
    let t_reuse = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let mut seq = ids.clone();
    seq.push(q);
    let tt = n + 1;
    let mut max_diff = 0f32;
    let mut max_abs = 0f32;
    for (k, set) in sets.iter().enumerate() {
        // causal for the prompt rows; the query row sees only key p (or none) and itself
        let mut mask: Vec<bool> = (0..tt * tt).map(|i| i % tt <= i / tt).collect();
        for j in 0..n {
            mask[n * tt + j] = matches!(set, KeySet::Subset(s) if s[0] == j);
        }
        let out = model.forward(
            &seq,
            &ForwardOptions {
                mask: Some(mask),
                ..Default::default()
            },
        )?;
        for (a, b) in out.row(n).iter().zip(&reuse[k]) {
            max_diff = max_diff.max((a - b).abs());
            max_abs = max_abs.max(a.abs());
        }
    }
    let t_full = t.elapsed().as_secs_f64();
    println!(
        "colmap reference, {n} prompt positions: KV reuse {t_reuse:.3} s, full 4-D-mask forwards {t_full:.3} s, speed-up {:.1}x, max |diff| {max_diff:.2e} (largest logit {max_abs:.1}, relative {:.2e})",
        t_full / t_reuse,
        max_diff / max_abs.max(1e-12)
    );
    Ok(())
}
