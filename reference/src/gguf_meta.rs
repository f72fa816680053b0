//! GGUF metadata as the loader and the embedded tokenizer read it.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;

use crate::{Error, Result};

/// Lenient metadata access: GGUF writers differ in which integer/float width they store, and
/// candle's typed getters reject any but the exact one (dependency notes).
pub(crate) struct Meta<'a> {
    pub map: &'a HashMap<String, Value>,
    pub path: &'a Path,
}

impl Meta<'_> {
    pub fn missing(&self, key: &str) -> Error {
        Error::Format {
            path: self.path.to_path_buf(),
            detail: format!("GGUF metadata `{key}` is missing or has the wrong type; the file is not a complete llama GGUF, convert it again"),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key)
    }

    pub fn opt_i64(&self, key: &str) -> Option<i64> {
        self.get(key).and_then(value_i64)
    }

    pub fn usize(&self, key: &str) -> Result<usize> {
        self.opt_i64(key)
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| self.missing(key))
    }

    pub fn opt_f64(&self, key: &str) -> Option<f64> {
        match self.get(key)? {
            Value::F32(v) => Some(*v as f64),
            Value::F64(v) => Some(*v),
            other => value_i64(other).map(|v| v as f64),
        }
    }

    pub fn opt_bool(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            Value::Bool(b) => Some(*b),
            other => value_i64(other).map(|v| v != 0),
        }
    }

    pub fn string(&self, key: &str) -> Result<String> {
        self.opt_string(key).ok_or_else(|| self.missing(key))
    }

    pub fn opt_string(&self, key: &str) -> Option<String> {
        match self.get(key)? {
            Value::String(s) => Some(s.clone()),
            _ => None,
        }
    }
}

pub(crate) fn value_i64(v: &Value) -> Option<i64> {
    Some(match v {
        Value::U8(x) => *x as i64,
        Value::I8(x) => *x as i64,
        Value::U16(x) => *x as i64,
        Value::I16(x) => *x as i64,
        Value::U32(x) => *x as i64,
        Value::I32(x) => *x as i64,
        Value::U64(x) => i64::try_from(*x).ok()?,
        Value::I64(x) => *x,
        Value::Bool(b) => *b as i64,
        _ => return None,
    })
}
