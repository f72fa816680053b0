//! Write a seeded random-weight model of issue 21's architectures, at a tiny or a real geometry,
//! as a Hugging Face folder or a GGUF file (no package ships these weights; see docs/reference.md).
//!
//! ```sh
//! cargo run --release -p kvprobe-reference --example write_fixture -- qwen2-1.5b hf bf16 out/qwen2-1.5b
//! cargo run --release -p kvprobe-reference --example write_fixture -- tiny-qwen3 gguf f32 out/q3.gguf
//! ```
//! Names: tiny-qwen2, tiny-qwen3, tiny-llama3, qwen2.5-0.5b, qwen2-1.5b, qwen3-0.6b, llama3.2-1b.
//! Formats: hf | gguf. Storage: f32 | bf16 | f16. Optional 5th argument: the seed (default 1).

use std::path::PathBuf;
use std::process::ExitCode;

use candle_core::quantized::GgmlDType;
use candle_core::DType;
use kvprobe_reference::arch_fixtures::{write_hf, Geometry};
use kvprobe_reference::fixtures::FixtureOptions;
use kvprobe_reference::fixtures_gguf::write_gguf;

fn main() -> ExitCode {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let usage = || {
        eprintln!(
            "usage: write_fixture NAME hf|gguf f32|bf16|f16 OUT [SEED]; names: {}",
            Geometry::NAMES.join(", ")
        );
        ExitCode::from(2)
    };
    if a.len() < 4 {
        return usage();
    }
    let Some((arch, g)) = Geometry::named(&a[0]) else {
        return usage();
    };
    let seed: u64 = match a.get(4).map(|s| s.parse()) {
        None => 1,
        Some(Ok(s)) => s,
        Some(Err(_)) => return usage(),
    };
    let out = PathBuf::from(&a[3]);
    let r = match (a[1].as_str(), a[2].as_str()) {
        ("hf", dt) => {
            let dtype = match dt {
                "f32" => DType::F32,
                "bf16" => DType::BF16,
                "f16" => DType::F16,
                _ => return usage(),
            };
            // shards of about 2 GB at the real geometries, as the hub's folders are split
            // (embedding + an untied head at most, then per layer q/k/v/o and the MLP)
            let params = g.vocab * g.hidden * 2
                + g.layers * (4 * g.hidden * g.heads * g.head_dim + 3 * g.hidden * g.intermediate);
            let shards = (params * dtype.size_in_bytes()).div_ceil(2 << 30).max(1);
            write_hf(&out, arch, &g, seed, &FixtureOptions { shards, dtype })
        }
        ("gguf", dt) => {
            let dtype = match dt {
                "f32" => GgmlDType::F32,
                "bf16" => GgmlDType::BF16,
                "f16" => GgmlDType::F16,
                _ => return usage(),
            };
            write_gguf(&out, arch, &g, seed, dtype)
        }
        _ => return usage(),
    };
    match r {
        Ok(()) => {
            println!("wrote {} ({} {} {})", out.display(), a[0], a[1], a[2]);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
