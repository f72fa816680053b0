//! Dumps the reference's float32 Llama-family weights as a Hugging Face folder for
//! `scripts/export-onnx.py` (issue 22; `kvprobe_npu::onnx::export` says why).
//!
//! `cargo run --release -p kvprobe-npu --example onnx_weights -- MODEL OUT_DIR`

use std::path::PathBuf;
use std::process::ExitCode;

use kvprobe_reference::Model;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, out] = args.as_slice() else {
        eprintln!(
            "usage: onnx_weights MODEL OUT_DIR (MODEL: a Hugging Face folder or a llama .gguf)"
        );
        return ExitCode::from(2);
    };
    let r = Model::load(&PathBuf::from(model))
        .map_err(kvprobe_npu::Error::from)
        .and_then(|m| kvprobe_npu::onnx::export::write_hf_folder(&m, &PathBuf::from(out)));
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("onnx_weights: {e}");
            ExitCode::from(2)
        }
    }
}
