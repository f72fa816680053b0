//! Dumps the reference's float32 Llama-family weights as a Hugging Face folder for
//! `scripts/export-onnx.py` and the GenAI model builder (issues 22, 35;
//! `kvprobe_npu::onnx::export` says why), or writes the tests' tiny random Llama fixture.
//!
//! `cargo run --release -p kvprobe-npu --example onnx_weights -- MODEL OUT_DIR`
//! `cargo run --release -p kvprobe-npu --example onnx_weights -- --tiny-llama SEED OUT_DIR`

use std::path::PathBuf;
use std::process::ExitCode;

use kvprobe_reference::Model;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.as_slice() {
        [flag, seed, out] if flag == "--tiny-llama" => match seed.parse::<u64>() {
            Ok(seed) => kvprobe_reference::fixtures::write_tiny_llama(&PathBuf::from(out), seed)
                .map_err(kvprobe_npu::Error::from),
            Err(_) => Err(kvprobe_npu::Error::InvalidArgument(format!(
                "--tiny-llama {seed}: the seed is a whole number"
            ))),
        },
        [model, out] => Model::load(&PathBuf::from(model))
            .map_err(kvprobe_npu::Error::from)
            .and_then(|m| kvprobe_npu::onnx::export::write_hf_folder(&m, &PathBuf::from(out))),
        _ => {
            eprintln!(
                "usage: onnx_weights MODEL OUT_DIR (MODEL: a Hugging Face folder or a llama .gguf) | onnx_weights --tiny-llama SEED OUT_DIR"
            );
            return ExitCode::from(2);
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("onnx_weights: {e}");
            ExitCode::from(2)
        }
    }
}
