//! The embedding table the host reads rows from (`embeddings.bin`, contract §2.11) and the host
//! window those rows sit in between runs (contract §2.4).

use candle_core::Tensor;
use kvprobe_schema::{DType, IoDescription, QuantInfo};

use crate::quant::quantize_u16;
use crate::{Error, Result};

/// Rows of `embeddings.bin` in the embeddings input's domain (contract §2.11): uint16 codes for a
/// quantised input, or float rows when the device declares a float embeddings input (the
/// emulator's `--sim-quant none`).
#[derive(Debug, Clone)]
pub struct EmbeddingTable {
    pub(super) rows: usize,
    pub(super) features: usize,
    pub(super) data: TableData,
}

#[derive(Debug, Clone)]
pub(super) enum TableData {
    U16(Vec<u16>),
    F32(Vec<f32>),
    /// The reference model's own rows, converted (and quantised through `quant` for a uint16
    /// input) when the host pushes them: no second copy of a 150k-row table beside the model's
    /// (issue 21, the emulators share the reference's weights).
    Model {
        rows: kvprobe_reference::EmbeddingRows,
        quant: Option<QuantInfo>,
    },
}

impl EmbeddingTable {
    /// Quantise a float `[rows, features]` matrix through the prefill embeddings input's quant
    /// info (what the compiler does when it writes `embeddings.bin`).
    pub fn from_float(
        matrix: &[f32],
        rows: usize,
        features: usize,
        input: &IoDescription,
    ) -> Result<Self> {
        if matrix.len() != rows * features {
            return Err(Error::InvalidArgument(format!(
                "embedding matrix has {} values, expected {rows} × {features}",
                matrix.len()
            )));
        }
        Self::from_row_blocks(rows, features, input, |r0, r1| {
            Ok(matrix[r0 * features..r1 * features].to_vec())
        })
    }

    /// From a candle `[vocab, hidden]` tensor.
    pub fn from_tensor(t: &Tensor, input: &IoDescription) -> Result<Self> {
        let (rows, features) = t.dims2()?;
        let v: Vec<f32> = t.flatten_all()?.to_vec1()?;
        Self::from_float(&v, rows, features, input)
    }

    /// From the reference model's embedding table, shared with the model: rows are read in the
    /// checkpoint's storage type when the host pushes them (quantised through the input's quant
    /// info for a uint16 input, as the compiler's `embeddings.bin` would hold them).
    pub fn from_model(model: &kvprobe_reference::Model, input: &IoDescription) -> Result<Self> {
        let rows = model.embedding_source();
        let (n, features) = rows.dims();
        let quant = match input.host_dtype {
            DType::U16 => Some(input.quant),
            DType::F32 => None,
            DType::U8 | DType::F16 => {
                return Err(Error::Device(format!(
                "embeddings input `{}` is not uint16 or float32; the driver cannot fill it (contract §2.1)",
                input.name
            )))
            }
        };
        Ok(EmbeddingTable {
            rows: n,
            features,
            data: TableData::Model { rows, quant },
        })
    }

    /// Row `id` as uint16 codes into `dst` (a uint16 table).
    pub(super) fn row_u16(&self, id: usize, dst: &mut [u16]) -> Result<()> {
        let f = self.features;
        match &self.data {
            TableData::U16(t) => dst.copy_from_slice(&t[id * f..(id + 1) * f]),
            TableData::Model {
                rows,
                quant: Some(q),
            } => {
                let mut v = vec![0f32; f];
                rows.row_into(id, &mut v)?;
                for (d, x) in dst.iter_mut().zip(v) {
                    *d = quantize_u16(x, q);
                }
            }
            _ => {
                return Err(Error::Device(
                    "a float embedding table read as uint16".into(),
                ))
            }
        }
        Ok(())
    }

    /// Row `id` as f32 into `dst` (a float table).
    pub(super) fn row_f32(&self, id: usize, dst: &mut [f32]) -> Result<()> {
        let f = self.features;
        match &self.data {
            TableData::F32(t) => dst.copy_from_slice(&t[id * f..(id + 1) * f]),
            TableData::Model { rows, quant: None } => rows.row_into(id, dst)?,
            _ => {
                return Err(Error::Device(
                    "a uint16 embedding table read as float".into(),
                ))
            }
        }
        Ok(())
    }

    /// The table in the input's domain, `rows_of(r0, r1)` giving rows `r0..r1` as f32.
    fn from_row_blocks(
        rows: usize,
        features: usize,
        input: &IoDescription,
        rows_of: impl Fn(usize, usize) -> Result<Vec<f32>>,
    ) -> Result<Self> {
        const BLOCK: usize = 1024;
        let data = match input.host_dtype {
            DType::U16 => {
                let mut codes = Vec::with_capacity(rows * features);
                for r0 in (0..rows).step_by(BLOCK) {
                    let block = rows_of(r0, (r0 + BLOCK).min(rows))?;
                    codes.extend(block.iter().map(|&x| quantize_u16(x, &input.quant)));
                }
                TableData::U16(codes)
            }
            DType::F32 => TableData::F32(rows_of(0, rows)?),
            DType::U8 | DType::F16 => {
                return Err(Error::Device(format!(
                "embeddings input `{}` is not uint16 or float32; the driver cannot fill it (contract §2.1)",
                input.name
            )))
            }
        };
        Ok(EmbeddingTable {
            rows,
            features,
            data,
        })
    }

    /// `embeddings.bin` as shipped: row-major native-endian uint16, `rows = bytes / 2F`.
    pub fn from_raw(bytes: &[u8], features: usize) -> Result<Self> {
        if features == 0 || !bytes.len().is_multiple_of(2 * features) {
            return Err(Error::InvalidArgument(format!(
                "embeddings.bin of {} bytes is not a whole number of {features}-feature uint16 rows",
                bytes.len()
            )));
        }
        let codes: Vec<u16> = bytes
            .chunks_exact(2)
            .map(|c| u16::from_ne_bytes([c[0], c[1]]))
            .collect();
        Ok(EmbeddingTable {
            rows: bytes.len() / (2 * features),
            features,
            data: TableData::U16(codes),
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn features(&self) -> usize {
        self.features
    }
    pub fn is_float(&self) -> bool {
        matches!(
            self.data,
            TableData::F32(_) | TableData::Model { quant: None, .. }
        )
    }
}

/// The host window of the last `P` embedding rows (contract §2.4).
#[derive(Debug, Clone)]
pub(super) enum Window {
    U16(Vec<u16>),
    F32(Vec<f32>),
}

impl Window {
    /// The same shape, all raw zeros.
    pub(super) fn zeroed(&self) -> Window {
        match self {
            Window::U16(v) => Window::U16(vec![0; v.len()]),
            Window::F32(v) => Window::F32(vec![0.0; v.len()]),
        }
    }
}
