//! Host buffers as the genai server binds them (contract §2.1): raw uint16 embeddings, raw uint8
//! mask, float32 RoPE/position inputs and float32 outputs.

use kvprobe_schema::DType;

#[derive(Debug, Clone, PartialEq)]
pub enum Buffer {
    U8(Vec<u8>),
    U16(Vec<u16>),
    F32(Vec<f32>),
}

impl Buffer {
    pub fn dtype(&self) -> DType {
        match self {
            Buffer::U8(_) => DType::U8,
            Buffer::U16(_) => DType::U16,
            Buffer::F32(_) => DType::F32,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            Buffer::U8(v) => v.len(),
            Buffer::U16(v) => v.len(),
            Buffer::F32(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Frame size in bytes (what HailoRT checks, contract §2.5).
    pub fn byte_len(&self) -> usize {
        self.len() * self.dtype().bytes()
    }
}
