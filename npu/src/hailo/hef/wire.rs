//! A small protobuf wire-format reader: enough for the HEF subset (contract §5.3).
//! Unknown fields are skipped by the callers; groups (wire types 3/4) are rejected because the
//! HEF schema is proto3 and never uses them.

use super::error::{HefError, Result};

#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Absolute offset of `buf[0]` in the proto, for error messages.
    base: usize,
    message: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], base: usize, message: &'static str) -> Self {
        Reader {
            buf,
            pos: 0,
            base,
            message,
        }
    }

    fn err(&self, reason: &'static str) -> HefError {
        HefError::Proto {
            message: self.message,
            offset: self.base + self.pos,
            reason,
        }
    }

    fn varint(&mut self) -> Result<u64> {
        let mut value = 0u64;
        for i in 0..10 {
            let Some(&byte) = self.buf.get(self.pos) else {
                return Err(self.err("varint runs past the end"));
            };
            self.pos += 1;
            if i == 9 && byte > 1 {
                return Err(self.err("varint longer than 64 bits"));
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.err("varint longer than 10 bytes"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(self.err("field runs past the end of its message"));
        };
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// Next `(field number, value, absolute offset of the value)`, or `None` at the end.
    pub fn next_field(&mut self) -> Result<Option<(u32, Value<'a>, usize)>> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = key >> 3;
        if field == 0 || field > u64::from(u32::MAX >> 3) {
            return Err(self.err("invalid field number"));
        }
        let at = self.base + self.pos;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                let b = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                Value::Fixed64(u64::from_le_bytes(a))
            }
            2 => {
                let len = self.varint()?;
                let len = usize::try_from(len).map_err(|_| self.err("length too large"))?;
                Value::Bytes(self.take(len)?)
            }
            5 => {
                let b = self.take(4)?;
                Value::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            _ => return Err(self.err("unsupported wire type (group or invalid)")),
        };
        Ok(Some((field as u32, value, at)))
    }
}

/// Typed accessors; a wrong wire type for a known field is a malformed HEF.
pub fn err(message: &'static str, offset: usize, reason: &'static str) -> HefError {
    HefError::Proto {
        message,
        offset,
        reason,
    }
}

pub fn as_u64(v: Value, msg: &'static str, at: usize) -> Result<u64> {
    match v {
        Value::Varint(x) => Ok(x),
        _ => Err(err(msg, at, "expected a varint")),
    }
}

/// proto3 `uint32`: the varint truncated to 32 bits.
pub fn as_u32(v: Value, msg: &'static str, at: usize) -> Result<u32> {
    as_u64(v, msg, at).map(|x| x as u32)
}

/// proto3 `int32`: negative values arrive as 10-byte sign-extended varints; truncation to 32 bits
/// recovers them (contract §5.3).
pub fn as_i32(v: Value, msg: &'static str, at: usize) -> Result<i32> {
    as_u64(v, msg, at).map(|x| x as u32 as i32)
}

pub fn as_bool(v: Value, msg: &'static str, at: usize) -> Result<bool> {
    as_u64(v, msg, at).map(|x| x != 0)
}

pub fn as_f32(v: Value, msg: &'static str, at: usize) -> Result<f32> {
    match v {
        Value::Fixed32(x) => Ok(f32::from_bits(x)),
        _ => Err(err(msg, at, "expected a fixed32 float")),
    }
}

pub fn as_u64_fixed(v: Value, msg: &'static str, at: usize) -> Result<u64> {
    match v {
        Value::Fixed64(x) => Ok(x),
        _ => Err(err(msg, at, "expected a fixed64")),
    }
}

pub fn as_bytes<'a>(v: Value<'a>, msg: &'static str, at: usize) -> Result<&'a [u8]> {
    match v {
        Value::Bytes(b) => Ok(b),
        _ => Err(err(msg, at, "expected a length-delimited field")),
    }
}

pub fn as_string(v: Value, msg: &'static str, at: usize) -> Result<String> {
    let b = as_bytes(v, msg, at)?;
    std::str::from_utf8(b)
        .map(str::to_owned)
        .map_err(|_| err(msg, at, "string is not UTF-8"))
}

/// Repeated varint scalars, packed (one length-delimited run) or unpacked (one per key).
pub fn push_varints(v: Value, out: &mut Vec<u64>, msg: &'static str, at: usize) -> Result<()> {
    match v {
        Value::Varint(x) => out.push(x),
        Value::Bytes(b) => {
            let mut r = Reader::new(b, at, msg);
            while r.pos < b.len() {
                out.push(r.varint()?);
            }
        }
        _ => return Err(err(msg, at, "expected varints")),
    }
    Ok(())
}

/// Repeated doubles, packed or unpacked.
pub fn push_doubles(v: Value, out: &mut Vec<f64>, msg: &'static str, at: usize) -> Result<()> {
    match v {
        Value::Fixed64(x) => out.push(f64::from_bits(x)),
        Value::Bytes(b) => {
            if b.len() % 8 != 0 {
                return Err(err(msg, at, "packed doubles not a multiple of 8 bytes"));
            }
            for c in b.chunks_exact(8) {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                out.push(f64::from_le_bytes(a));
            }
        }
        _ => return Err(err(msg, at, "expected doubles")),
    }
    Ok(())
}
