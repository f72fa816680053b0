//! `.npy` artefacts: arrays derived from `Results` (colmap matrix, expected map, zero maps, layout
//! correlations) plus caller-supplied arrays too big for results.json (compared logits).

use crate::error::{Error, Result};
use crate::fsio::write_atomic;
use crate::issue10;
use kvprobe_schema::{ColmapFinding, Layout, LayoutFinding, Results, ZtapCache};
use ndarray::{Array1, Array2, Array3, ArrayD, IxDyn};
use ndarray_npy::{WritableElement, WriteNpyExt};
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

/// Names the crate writes itself; a caller array may not shadow them.
const RESERVED_PREFIXES: [&str; 7] = [
    "colmap",
    "layout_correlations",
    "layout_infer",
    "ztap_zero_map",
    "stale",
    "causality",
    "splits",
];

/// Check every caller array before anything is written, so a bad one fails the whole call early.
pub fn validate(arrays: &[NamedArray]) -> Result<()> {
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
        if RESERVED_PREFIXES.iter().any(|p| a.name.starts_with(p)) {
            return Err(bad(format!(
                "name clashes with a report artefact; avoid the prefixes {RESERVED_PREFIXES:?}"
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

fn write_npy<A: WritableElement, D: ndarray::Dimension>(
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

/// File names of the arrays derived from `results` (for the report's artefact list).
pub fn derived_array_files(results: &Results) -> Vec<String> {
    let mut out = Vec::new();
    if results.probes.colmap.is_some() {
        out.push("colmap.npy".to_string());
        out.push("colmap_expected.npy".to_string());
    }
    if let Some(z) = &results.probes.ztap {
        out.extend(z.caches.iter().map(zero_map_file));
    }
    if results.probes.layout.is_some() {
        out.push("layout_correlations.npy".to_string());
    }
    if results.probes.stale.is_some() {
        out.push(issue10::STALE_NPY.to_string());
    }
    if results.probes.causality.is_some() {
        out.push(issue10::CAUSALITY_NPY.to_string());
        out.push(issue10::CAUSALITY_FIRST_NPY.to_string());
    }
    if results.probes.splits.is_some() {
        out.push(issue10::SPLITS_NPY.to_string());
    }
    if results.probes.layout_infer.is_some() {
        out.push(crate::layout_infer::SLOTS_NPY.to_string());
        out.push(crate::layout_infer::COLUMNS_NPY.to_string());
    }
    out
}

pub fn zero_map_file(c: &ZtapCache) -> String {
    format!("ztap_zero_map_c{}.npy", c.cache_id)
}

pub fn write_derived_arrays(results: &Results, dir: &Path) -> Result<()> {
    if let Some(c) = &results.probes.colmap {
        write_npy(&dir.join("colmap.npy"), &colmap_matrix(c)?)?;
        write_npy(&dir.join("colmap_expected.npy"), &colmap_expected(c))?;
    }
    if let Some(z) = &results.probes.ztap {
        for cache in &z.caches {
            let arr = Array1::from_vec(cache.zero_map.clone());
            write_npy(&dir.join(zero_map_file(cache)), &arr)?;
        }
    }
    if let Some(l) = &results.probes.layout {
        write_npy(
            &dir.join("layout_correlations.npy"),
            &layout_correlations(l),
        )?;
    }
    if let Some(f) = &results.probes.stale {
        let m = issue10::stale_matrix(f, results.provenance.cache_len);
        write_npy(&dir.join(issue10::STALE_NPY), &m)?;
    }
    if let Some(f) = &results.probes.causality {
        write_npy(
            &dir.join(issue10::CAUSALITY_NPY),
            &issue10::causality_matrix(f)?,
        )?;
        write_npy(
            &dir.join(issue10::CAUSALITY_FIRST_NPY),
            &issue10::causality_first_layer(f)?,
        )?;
    }
    if let Some(f) = &results.probes.splits {
        write_npy(&dir.join(issue10::SPLITS_NPY), &issue10::splits_matrix(f))?;
    }
    if let Some(f) = &results.probes.layout_infer {
        use crate::layout_infer as li;
        write_npy(&dir.join(li::SLOTS_NPY), &li::slots_matrix(f))?;
        write_npy(&dir.join(li::COLUMNS_NPY), &li::columns_matrix(f))?;
    }
    Ok(())
}

/// `[entries, positions]`; ragged rows are an error (the finding is malformed).
pub fn colmap_matrix(c: &ColmapFinding) -> Result<Array2<f32>> {
    let (r, n) = (c.entries.len(), c.positions.len());
    if c.matrix.len() != r || c.matrix.iter().any(|row| row.len() != n) {
        return Err(Error::BadArray {
            name: "colmap".into(),
            reason: format!(
                "matrix is not [entries={r}][positions={n}]; the colmap finding is malformed"
            ),
        });
    }
    let flat: Vec<f32> = c.matrix.iter().flatten().copied().collect();
    Array2::from_shape_vec((r, n), flat).map_err(|e| Error::BadArray {
        name: "colmap".into(),
        reason: e.to_string(),
    })
}

/// `[entries, positions]`: true where the ring arithmetic puts prompt position p at entry j.
pub fn colmap_expected(c: &ColmapFinding) -> Array2<bool> {
    let mut m = Array2::from_elem((c.entries.len(), c.positions.len()), false);
    for (i, entry) in c.entries.iter().enumerate() {
        let expected = c
            .rows
            .iter()
            .find(|row| row.entry == *entry)
            .and_then(|row| row.expected_position);
        if let Some(p) = expected {
            if let Some(k) = c.positions.iter().position(|q| *q == p) {
                m[[i, k]] = true;
            }
        }
    }
    m
}

/// `[caches, layouts (Layout::ALL order), shifts (finding.shifts order)]`; NaN = not tried.
pub fn layout_correlations(l: &LayoutFinding) -> Array3<f64> {
    let mut m = Array3::from_elem(
        (l.caches.len(), Layout::ALL.len(), l.shifts.len()),
        f64::NAN,
    );
    for (i, cache) in l.caches.iter().enumerate() {
        for s in &cache.scores {
            let li = Layout::ALL.iter().position(|x| *x == s.layout);
            let si = l.shifts.iter().position(|x| *x == s.shift);
            if let (Some(li), Some(si)) = (li, si) {
                m[[i, li, si]] = s.score;
            }
        }
    }
    m
}
