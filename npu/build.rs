//! Builds the HailoRT C++ shim (npu/shim) for the `hailo` feature, but only when the HailoRT
//! headers are present: build scripts also run under `cargo check`, and a machine without HailoRT
//! must still check the feature (dependency notes). The Rust side is gated on the
//! `kvprobe_hailort_shim` cfg emitted here.

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kvprobe_hailort_shim)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=shim/kvprobe_hailort_shim.cpp");
    println!("cargo::rerun-if-changed=shim/kvprobe_hailort_shim.h");
    println!("cargo::rerun-if-env-changed=HAILORT_INCLUDE_DIR");
    if std::env::var_os("CARGO_FEATURE_HAILO").is_none() {
        return;
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(dir) = std::env::var_os("HAILORT_INCLUDE_DIR") {
        candidates.push(PathBuf::from(dir));
    }
    candidates.push(PathBuf::from("/usr/include"));
    let Some(include) = candidates
        .into_iter()
        .find(|d| d.join("hailo/hailort.h").is_file())
    else {
        println!(
            "cargo::warning=kvprobe-npu: hailo/hailort.h not found (set HAILORT_INCLUDE_DIR or install the HailoRT dev package); the HailoRT shim is not built and the hailo backend will report that it is unavailable"
        );
        return;
    };
    println!(
        "cargo::rerun-if-changed={}",
        include.join("hailo/hailort.hpp").display()
    );
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .include(&include)
        .include("shim")
        .file("shim/kvprobe_hailort_shim.cpp")
        .warnings(true)
        .compile("kvprobe_hailort_shim");
    // libhailort itself is linked by hailort-sys.
    println!("cargo::rustc-cfg=kvprobe_hailort_shim");
}
