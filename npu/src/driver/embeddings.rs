//! The embedding table the host reads rows from (`embeddings.bin`, contract §2.11) and the host
//! window those rows sit in between runs (contract §2.4).

use candle_core::Tensor;
use kvprobe_schema::{DType, IoDescription};

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
        let data = match input.host_dtype {
            DType::U16 => TableData::U16(
                matrix
                    .iter()
                    .map(|&x| quantize_u16(x, &input.quant))
                    .collect(),
            ),
            DType::F32 => TableData::F32(matrix.to_vec()),
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

    /// From a candle `[vocab, hidden]` tensor (the reference model's embedding table).
    pub fn from_tensor(t: &Tensor, input: &IoDescription) -> Result<Self> {
        let (rows, features) = t.dims2()?;
        let v: Vec<f32> = t.flatten_all()?.to_vec1()?;
        Self::from_float(&v, rows, features, input)
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
        matches!(self.data, TableData::F32(_))
    }
}

/// The host window of the last `P` embedding rows (contract §2.4).
#[derive(Debug, Clone)]
pub(super) enum Window {
    U16(Vec<u16>),
    F32(Vec<f32>),
}
