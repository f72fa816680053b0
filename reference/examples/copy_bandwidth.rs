//! A STREAM-like copy: the memory bandwidth a decode step is measured against (issue 21: a decode
//! step reads every weight once, so weights' bytes / this bandwidth is its floor).
//!
//! ```sh
//! cargo run --release -p kvprobe-reference --example copy_bandwidth -- 540 2
//! ```
//! Arguments: MiB copied (default 540, larger than any cache), threads (default: rayon's pool).
//! Prints the best of 7 copies as `copy_gb_per_s` (bytes copied / seconds, the convention of the
//! issue's "a 540 MB copy runs at 22 GB/s").

use std::time::Instant;

use rayon::prelude::*;

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let mib: usize = a.first().and_then(|s| s.parse().ok()).unwrap_or(540);
    let threads: usize = a
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rayon::current_num_threads);
    let pool = match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("copy_bandwidth: cannot start {threads} threads: {e}");
            std::process::exit(2);
        }
    };
    let n = mib * (1 << 20) / 4;
    let src: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut dst = vec![0f32; n];
    let chunk = n.div_ceil(threads.max(1));
    let mut best = f64::INFINITY;
    for _ in 0..7 {
        let t = Instant::now();
        pool.install(|| {
            dst.par_chunks_mut(chunk)
                .zip(src.par_chunks(chunk))
                .for_each(|(d, s)| d.copy_from_slice(s));
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    // keep the copy observable
    let check = dst[n / 2];
    println!("copy_mib {mib}");
    println!("threads {threads}");
    println!("copy_s {best:.5}");
    println!("copy_gb_per_s {:.2}", (n * 4) as f64 / best / 1e9);
    println!("check {check}");
}
