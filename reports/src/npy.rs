//! `.npy` files: one array written whole, and the matrix check findings' nested rows pass first.

use std::path::Path;

use ndarray::Array2;
use ndarray_npy::{WritableElement, WriteNpyExt};

use crate::error::{Error, Result};
use crate::fsio::write_atomic;

pub(crate) fn write_npy<A: WritableElement, D: ndarray::Dimension>(
    path: &Path,
    arr: &ndarray::Array<A, D>,
) -> Result<()> {
    let mut bytes = Vec::new();
    arr.write_npy(&mut bytes).map_err(|e| Error::Npy {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    write_atomic(path, &bytes)
}

/// `m` as a `[rows, cols]` array; ragged or missing rows are an error (the finding is malformed).
pub(crate) fn rectangular(
    name: &str,
    m: &[Vec<f32>],
    rows: usize,
    cols: usize,
) -> Result<Array2<f32>> {
    if m.len() != rows || m.iter().any(|r| r.len() != cols) {
        return Err(Error::BadArray {
            name: name.into(),
            reason: format!("matrix is not [{rows}][{cols}]; the finding is malformed"),
        });
    }
    Array2::from_shape_vec((rows, cols), m.iter().flatten().copied().collect()).map_err(|e| {
        Error::BadArray {
            name: name.into(),
            reason: e.to_string(),
        }
    })
}
