//! Micro-benchmark of the matrix shapes a SmolLM2 decode step multiplies: candle's matmul through a
//! transposed view of an `[out, in]` weight against a plain row-dot loop (1 and 2 threads), and a
//! streaming read of the same bytes (the memory-bandwidth floor).
//! `cargo run --release -p kvprobe-reference --example linear_bench`

use std::time::Instant;

use candle_core::{Device, Tensor};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time<F: FnMut()>(reps: usize, mut f: F) -> f64 {
    let mut v = Vec::new();
    for _ in 0..reps {
        let s = Instant::now();
        f();
        v.push(s.elapsed().as_secs_f64() * 1e3);
    }
    median(v)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, ar) = a.split_at(a.len() / 8 * 8);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(8).zip(bc.chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = &Device::Cpu;
    // (out, in, copies) of one SmolLM2 layer's MLP+attn, times 30 layers, and the lm_head.
    for (name, out, inp, copies) in [
        ("mlp up/gate", 1536usize, 576usize, 60usize),
        ("mlp down", 576, 1536, 30),
        ("q/o", 576, 576, 60),
        ("lm_head", 49152, 576, 1),
    ] {
        let ws: Vec<Tensor> = (0..copies)
            .map(|_| Tensor::randn(0f32, 1.0, (out, inp), dev))
            .collect::<Result<_, _>>()?;
        let wv: Vec<Vec<f32>> = ws
            .iter()
            .map(|w| w.flatten_all().and_then(|t| t.to_vec1()))
            .collect::<Result<_, _>>()?;
        for t in [1usize, 32] {
            let x = Tensor::randn(0f32, 1.0, (t, inp), dev)?;
            let candle = time(5, || {
                for w in &ws {
                    let _ = x.matmul(&w.t().unwrap()).unwrap();
                }
            });
            let xv: Vec<f32> = x.flatten_all()?.to_vec1()?;
            let plain1 = time(5, || {
                for w in &wv {
                    let mut y = vec![0f32; t * out];
                    for r in 0..t {
                        let xr = &xv[r * inp..(r + 1) * inp];
                        for (o, yy) in y[r * out..(r + 1) * out].iter_mut().enumerate() {
                            *yy = dot(xr, &w[o * inp..(o + 1) * inp]);
                        }
                    }
                    std::hint::black_box(&y);
                }
            });
            let plain2 = time(5, || {
                for w in &wv {
                    let mut y = vec![0f32; out];
                    let (y0, y1) = y.split_at_mut(out / 2);
                    let xr = &xv[..inp];
                    std::thread::scope(|s| {
                        s.spawn(|| {
                            for (o, yy) in y1.iter_mut().enumerate() {
                                let o = o + out / 2;
                                *yy = dot(xr, &w[o * inp..(o + 1) * inp]);
                            }
                        });
                        for (o, yy) in y0.iter_mut().enumerate() {
                            *yy = dot(xr, &w[o * inp..(o + 1) * inp]);
                        }
                    });
                    std::hint::black_box(&y);
                }
            });
            let stream = time(5, || {
                let mut s = 0f32;
                for w in &wv {
                    s += w.iter().sum::<f32>();
                }
                std::hint::black_box(s);
            });
            let mb = (copies * out * inp * 4) as f64 / 1e6;
            println!(
                "{name:12} T={t:2} {mb:6.0} MB: candle {candle:7.1} ms, dot-loop {plain1:7.1} ms, 2-thread rows(T=1 only) {plain2:7.1} ms, stream-sum {stream:6.1} ms"
            );
        }
    }
    Ok(())
}
