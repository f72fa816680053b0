//! Wall time of the graph engine on a real model, the shapes the emulator uses: a T-row prefill
//! (no past) and single-row decode runs over a W-entry past (the tbt group), plus N-row batched
//! trial runs over the same past. Prints medians over repeats.
//! `cargo run --release -p kvprobe-reference --example graph_profile -- MODEL.gguf [T] [W] [REPS]`

use std::time::Instant;

use kvprobe_reference::{GraphInput, GraphOptions, LayerKv, Model, PositionInput};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("pass a model path")?;
    let t: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(128);
    let w: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(127);
    let reps: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(5);
    let t0 = Instant::now();
    let m = Model::load(std::path::Path::new(&path))?;
    println!("load {:.2}s", t0.elapsed().as_secs_f64());
    let cfg = m.config().clone();
    let nh = cfg.n_heads;
    let ids: Vec<u32> = (0..t as u32).map(|i| 100 + 7 * i).collect();

    // T-row prefill, no past
    let mut times = Vec::new();
    for _ in 0..reps {
        let s = Instant::now();
        let _ = m.forward(&ids, &Default::default())?;
        times.push(s.elapsed().as_secs_f64());
    }
    let pre = median(times);
    println!(
        "forward T={t}: median {:.3}s ({:.0} tok/s)",
        pre,
        t as f64 / pre
    );

    // past of W entries (from a prefix state), as the emulator passes it
    let state = m.prefix_state(&ids[..w.min(t)], &(0..w.min(t)).collect::<Vec<_>>())?;
    let past: Vec<LayerKv> = state.layers.clone();
    let wv = state.len();
    for rows in [1usize, 8, 32] {
        let mut times = Vec::new();
        for _ in 0..reps {
            let hidden = m.embed(&vec![42u32; rows])?;
            let mask: Vec<bool> = (0..rows * nh * (wv + rows))
                .map(|k| {
                    let j = k % (wv + rows);
                    let i = k / (nh * (wv + rows));
                    j < wv || j == wv + i
                })
                .collect();
            let s = Instant::now();
            let _ = m.run_graph(&GraphInput {
                hidden,
                positions: PositionInput::Ids(vec![wv as f32; rows]),
                past: past.clone(),
                mask,
                graph: GraphOptions::default(),
                last_only: rows == 1,
            })?;
            times.push(s.elapsed().as_secs_f64());
        }
        let d = median(times);
        println!(
            "run_graph T={rows} W={wv}: median {:.1} ms ({:.1} ms/row)",
            d * 1e3,
            d * 1e3 / rows as f64
        );
    }
    Ok(())
}
