//! Tensor values between the host's f32 / i64 buffers and the graph's element types (f32, f16,
//! bf16, uint8 KV; int32 / int64 ids), and the element types the runtime reads off the graph.

use std::path::Path;

use ort::value::{DynValue, Tensor, TensorElementType, ValueType};

use crate::{Error, Result};

/// Element types of the graph's inputs GenAI fills.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum IdType {
    I32,
    I64,
}

/// Element type of the KV inputs: float32, float16 or bfloat16 (convention (a): the builder's
/// `-p fp32|fp16|int4` exports and io dtypes; G:kv takes the type of the first past input),
/// uint8 (the QDQ variant of (b)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum KvType {
    F32,
    F16,
    Bf16,
    U8,
}

impl KvType {
    pub(super) fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Bf16 => "bf16",
            KvType::U8 => "uint8",
        }
    }
}

pub(super) fn id_type(v: &ValueType, name: &str, path: &Path) -> Result<IdType> {
    match v.tensor_type() {
        Some(TensorElementType::Int64) => Ok(IdType::I64),
        Some(TensorElementType::Int32) => Ok(IdType::I32),
        other => Err(Error::Io {
            path: path.to_path_buf(),
            detail: format!("input `{name}` is {other:?}; GenAI feeds it int32 or int64"),
        }),
    }
}

/// One windowed run's past input of one cache.
pub(super) fn kv_value(shape: [usize; 4], e: &super::window::Elems) -> Result<DynValue> {
    Ok(match e {
        super::window::Elems::F32(v) => Tensor::from_array((shape, v.clone()))
            .map_err(ort_err)?
            .into_dyn(),
        super::window::Elems::U8(v) => Tensor::from_array((shape, v.clone()))
            .map_err(ort_err)?
            .into_dyn(),
    })
}

/// A past input in the graph's KV type from the host's f32 copy (exact for f16 / bf16 values).
pub(super) fn float_value(t: KvType, shape: [usize; 4], v: &[f32]) -> Result<DynValue> {
    Ok(match t {
        KvType::F16 => Tensor::from_array((
            shape,
            v.iter()
                .map(|&x| half::f16::from_f32(x))
                .collect::<Vec<_>>(),
        ))
        .map_err(ort_err)?
        .into_dyn(),
        KvType::Bf16 => Tensor::from_array((
            shape,
            v.iter()
                .map(|&x| half::bf16::from_f32(x))
                .collect::<Vec<_>>(),
        ))
        .map_err(ort_err)?
        .into_dyn(),
        _ => Tensor::from_array((shape, v.to_vec()))
            .map_err(ort_err)?
            .into_dyn(),
    })
}

/// A float output (f32, f16 or bf16: the builder's io dtype) as its shape and f32 values.
pub(super) fn floats(v: &DynValue, name: &str) -> Result<(Vec<i64>, Vec<f32>)> {
    Ok(match v.dtype().tensor_type() {
        Some(TensorElementType::Float32) => {
            let (s, x) = v.try_extract_tensor::<f32>().map_err(ort_err)?;
            (s.to_vec(), x.to_vec())
        }
        Some(TensorElementType::Float16) => {
            let (s, x) = v.try_extract_tensor::<half::f16>().map_err(ort_err)?;
            (s.to_vec(), x.iter().map(|h| h.to_f32()).collect())
        }
        Some(TensorElementType::Bfloat16) => {
            let (s, x) = v.try_extract_tensor::<half::bf16>().map_err(ort_err)?;
            (s.to_vec(), x.iter().map(|h| h.to_f32()).collect())
        }
        t => {
            return Err(Error::Device(crate::error::one_line(&format!(
                "output `{name}` is {t:?}, not a float tensor"
            ))))
        }
    })
}

pub(super) fn int_value(t: IdType, shape: &[usize], v: &[i64]) -> Result<DynValue> {
    let shape = shape.to_vec();
    Ok(match t {
        IdType::I64 => Tensor::from_array((shape, v.to_vec()))
            .map_err(ort_err)?
            .into_dyn(),
        IdType::I32 => Tensor::from_array((shape, v.iter().map(|&x| x as i32).collect::<Vec<_>>()))
            .map_err(ort_err)?
            .into_dyn(),
    })
}

fn ort_err(e: ort::Error) -> Error {
    Error::Device(crate::error::one_line(&format!("ONNX Runtime: {e}")))
}
