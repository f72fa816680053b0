//! Caller-supplied `.npy` arrays too big for results.json (compared logits); the arrays derived
//! from the findings are the sections' (`crate::sections`).

use crate::error::{Error, Result};
use crate::npy::write_npy;
use crate::sections;
use ndarray::{ArrayD, IxDyn};
use std::path::Path;

/// Element data of a caller-supplied array.
#[derive(Debug, Clone, PartialEq)]
pub enum ArrayData {
    F32(Vec<f32>),
    U32(Vec<u32>),
}

impl ArrayData {
    fn len(&self) -> usize {
        match self {
            ArrayData::F32(v) => v.len(),
            ArrayData::U32(v) => v.len(),
        }
    }
}

/// A row-major array written as `<name>.npy`, e.g. `greedy_device_logits` `[steps, vocab]`.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedArray {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: ArrayData,
}

impl NamedArray {
    pub fn f32(name: impl Into<String>, shape: Vec<usize>, data: Vec<f32>) -> NamedArray {
        NamedArray {
            name: name.into(),
            shape,
            data: ArrayData::F32(data),
        }
    }

    pub fn u32(name: impl Into<String>, shape: Vec<usize>, data: Vec<u32>) -> NamedArray {
        NamedArray {
            name: name.into(),
            shape,
            data: ArrayData::U32(data),
        }
    }

    fn file_name(&self) -> String {
        format!("{}.npy", self.name)
    }
}

/// Check every caller array before anything is written, so a bad one fails the whole call early.
pub fn validate(arrays: &[NamedArray]) -> Result<()> {
    // Names the crate writes itself; a caller array may not shadow them.
    let reserved = sections::reserved_prefixes();
    let mut seen = std::collections::BTreeSet::new();
    for a in arrays {
        let bad = |reason: String| Error::BadArray {
            name: a.name.clone(),
            reason,
        };
        let name_ok = !a.name.is_empty()
            && a.name.len() <= 100
            && a.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(bad(
                "name must be 1-100 characters of [A-Za-z0-9_-] (it becomes a file name)".into(),
            ));
        }
        if reserved.iter().any(|p| a.name.starts_with(p)) {
            return Err(bad(format!(
                "name clashes with a report artefact; avoid the prefixes {reserved:?}"
            )));
        }
        let elements: usize = a.shape.iter().product();
        if elements != a.data.len() {
            return Err(bad(format!(
                "shape {:?} holds {elements} elements but {} were given",
                a.shape,
                a.data.len()
            )));
        }
        if !seen.insert(a.name.as_str()) {
            return Err(bad("given twice".into()));
        }
    }
    Ok(())
}

pub fn write_caller_arrays(arrays: &[NamedArray], dir: &Path) -> Result<()> {
    for a in arrays {
        let path = dir.join(a.file_name());
        let shape = IxDyn(&a.shape);
        let shape_err = |e: ndarray::ShapeError| Error::BadArray {
            name: a.name.clone(),
            reason: e.to_string(),
        };
        match &a.data {
            ArrayData::F32(v) => {
                let arr = ArrayD::from_shape_vec(shape, v.clone()).map_err(shape_err)?;
                write_npy(&path, &arr)?
            }
            ArrayData::U32(v) => {
                let arr = ArrayD::from_shape_vec(shape, v.clone()).map_err(shape_err)?;
                write_npy(&path, &arr)?
            }
        }
    }
    Ok(())
}
