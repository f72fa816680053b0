//! Shared helpers of the reference crate's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

use kvprobe_reference::fixtures::{write_tiny_gpt2, write_tiny_llama};
use kvprobe_reference::Model;

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub model: Model,
}

impl Fixture {
    pub fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

pub fn llama(seed: u64) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    write_tiny_llama(dir.path(), seed).expect("write tiny llama");
    let model = Model::load(dir.path()).expect("load tiny llama");
    Fixture { dir, model }
}

pub fn gpt2(seed: u64) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    write_tiny_gpt2(dir.path(), seed).expect("write tiny gpt2");
    let model = Model::load(dir.path()).expect("load tiny gpt2");
    Fixture { dir, model }
}

/// Both fixture families.
pub fn both() -> Vec<(&'static str, Fixture)> {
    vec![("llama", llama(7)), ("gpt2", gpt2(7))]
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        ab += (*x as f64) * (*y as f64);
        aa += (*x as f64).powi(2);
        bb += (*y as f64).powi(2);
    }
    ab / (aa.sqrt() * bb.sqrt())
}

/// Deterministic pseudo-random ids below `vocab`.
pub fn ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// Paths agree to float rounding of different matmul blockings; logits are O(1..10).
pub const TOL: f32 = 2e-4;

pub fn assert_close(what: &str, a: &[f32], b: &[f32]) {
    let d = max_abs_diff(a, b);
    assert!(d < TOL, "{what}: max |diff| = {d}");
}
