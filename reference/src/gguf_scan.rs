//! A minimal walk over the GGUF header, for what candle's reader cannot tell us: the tensor behind
//! its "unknown dtype" error (it stops before naming it), and what llama.cpp refuses but candle
//! reads (duplicate keys or tensor names, an alignment that is not a power of two, misaligned,
//! overlapping or gapped tensor offsets; an alignment of 0 made candle divide by it and panic).
//!
//! Every length is checked against the bytes left in the file before it is read or skipped, so a
//! header claiming huge strings or arrays ends the walk instead of allocating or looping for them.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

/// The GGUF metadata value types candle takes `general.alignment` from (u8, i8, u16, i16, u32,
/// i32); a 0 of any other type falls back to its default and is harmless.
const ALIGNMENT_TYPES: std::ops::RangeInclusive<u32> = 0..=5;
const ALIGNMENT_KEY: &[u8] = b"general.alignment";

pub fn type_name(id: u32) -> String {
    let name = match id {
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        _ => return format!("id {id}"),
    };
    format!("{name} (id {id})")
}

/// Name of the first tensor whose ggml type is `type_id`.
pub fn tensor_with_type(path: &Path, type_id: u32) -> Option<String> {
    let mut s = Scan::open(path)?;
    let (n_tensors, n_kv) = s.counts()?;
    for _ in 0..n_kv {
        s.skip_string()?;
        let t = s.u32()?;
        s.skip_value(t, 0)?;
    }
    for _ in 0..n_tensors {
        let name = s.string()?;
        let nd = s.u32()?;
        s.skip(u64::from(nd).checked_mul(8)?)?;
        let t = s.u32()?;
        s.u64()?;
        if t == type_id {
            return Some(name);
        }
    }
    None
}

/// What llama.cpp's reader (ggml/src/gguf.cpp) refuses in a header that candle's accepts: a
/// metadata key twice (candle keeps the last), `general.alignment` that is not a uint32 power of
/// two (candle divides by a 0 and panics), a tensor name twice (candle keeps the last, and the
/// output changes), a tensor offset that is not a multiple of the alignment. The defect as one
/// line, or None (also when the walk cannot finish: candle then reports the damage).
pub fn layout_defect(path: &Path) -> Option<String> {
    let mut s = Scan::open(path)?;
    let (n_tensors, n_kv) = s.counts()?;
    let mut keys = std::collections::HashSet::new();
    let mut alignment = 32u64;
    for _ in 0..n_kv {
        let key = s.string()?;
        let t = s.u32()?;
        if key.as_bytes() == ALIGNMENT_KEY {
            if !ALIGNMENT_TYPES.contains(&t) {
                s.skip_value(t, 0)?;
            }
            let v = if ALIGNMENT_TYPES.contains(&t) {
                s.int(t)?
            } else {
                -1
            };
            if t != 4 || v <= 0 || (v & (v - 1)) != 0 {
                return Some(format!("GGUF metadata `general.alignment` is {} of type {}; it must be a uint32 power of two (32 when absent), as llama.cpp requires: remove the key or convert the model again", if v < 0 { "not an integer".to_string() } else { v.to_string() }, t));
            }
            alignment = v as u64;
        } else {
            s.skip_value(t, 0)?;
        }
        if !keys.insert(key.clone()) {
            return Some(format!("GGUF metadata key `{key}` appears twice (llama.cpp refuses the file; a reader that keeps one silently drops the other): convert the model again"));
        }
    }
    let mut names = std::collections::HashSet::new();
    // where the next tensor must start: llama.cpp lays the tensors back to back in header
    // order, each padded to the alignment, and refuses any other offset (overlapping or
    // gapped tensors); None once a type it cannot size is met (candle refuses that type)
    let mut next = Some(0u64);
    for _ in 0..n_tensors {
        let name = s.string()?;
        let nd = s.u32()?;
        let mut dims = Vec::with_capacity(nd.min(8) as usize);
        for _ in 0..nd {
            dims.push(s.u64()?);
        }
        let t = s.u32()?;
        let offset = s.u64()?;
        if !names.insert(name.clone()) {
            return Some(format!("GGUF tensor `{name}` appears twice (llama.cpp refuses the file; a reader that keeps the later one computes with other weights): convert the model again"));
        }
        if offset % alignment != 0 {
            return Some(format!("GGUF tensor `{name}` starts at data offset {offset}, not a multiple of the alignment {alignment} (llama.cpp refuses the file): convert the model again"));
        }
        let Some(at) = next else { continue };
        if offset != at {
            return Some(format!("GGUF tensor `{name}` starts at data offset {offset}, but the tensors before it end at {at} (each padded to the alignment {alignment}); llama.cpp refuses tensors that overlap or leave gaps: convert the model again"));
        }
        next = match stored_bytes(&dims, t) {
            Sized::Unknown => None,
            Sized::Defect(d) => return Some(format!("GGUF tensor `{name}` {d} (llama.cpp refuses the file): convert the model again")),
            Sized::Bytes(n) => match n.checked_next_multiple_of(alignment).and_then(|n| at.checked_add(n)) {
                Some(end) => Some(end),
                None => return Some(format!("GGUF tensor `{name}` ends past 2^64 bytes (llama.cpp refuses the file): convert the model again")),
            },
        };
    }
    None
}

/// A tensor's stored size as llama.cpp computes it.
enum Sized {
    Bytes(u64),
    /// A ggml type candle does not read: it names the tensor itself.
    Unknown,
    /// A shape llama.cpp refuses, as the words after the tensor's name.
    Defect(String),
}

/// The bytes a tensor of ggml dims `dims` (contiguous axis first) and type `t` occupies.
fn stored_bytes(dims: &[u64], t: u32) -> Sized {
    use candle_core::quantized::GgmlDType as D;
    // ggml's type ids (ggml.h) for the types candle reads; their sizes are candle's
    let d = match t {
        0 => D::F32,
        1 => D::F16,
        2 => D::Q4_0,
        3 => D::Q4_1,
        6 => D::Q5_0,
        7 => D::Q5_1,
        8 => D::Q8_0,
        9 => D::Q8_1,
        10 => D::Q2K,
        11 => D::Q3K,
        12 => D::Q4K,
        13 => D::Q5K,
        14 => D::Q6K,
        15 => D::Q8K,
        30 => D::BF16,
        _ => return Sized::Unknown,
    };
    let block = d.block_size() as u64;
    let row = dims.first().copied().unwrap_or(1);
    if row % block != 0 {
        return Sized::Defect(format!(
            "of type {d:?} has {row} elements per row, not a multiple of its block of {block}"
        ));
    }
    // every product checked: the dims are the file's, up to 2^64 each
    let rest = (row / block)
        .checked_mul(d.type_size() as u64)
        .and_then(|first| {
            dims.iter()
                .skip(1)
                .try_fold(first, |n, &x| n.checked_mul(x))
        });
    match rest {
        Some(n) => Sized::Bytes(n),
        None => Sized::Defect("has a size past 2^64 bytes".into()),
    }
}

struct Scan {
    r: BufReader<File>,
    pos: u64,
    len: u64,
}

impl Scan {
    fn open(path: &Path) -> Option<Scan> {
        let f = File::open(path).ok()?;
        let len = f.metadata().ok()?.len();
        Some(Scan {
            r: BufReader::new(f),
            pos: 0,
            len,
        })
    }

    /// (tensor count, metadata count) after the magic and a version candle reads (v2 or v3).
    fn counts(&mut self) -> Option<(u64, u64)> {
        if self.u32()? != u32::from_le_bytes(*b"GGUF") || self.u32()? < 2 {
            return None;
        }
        Some((self.u64()?, self.u64()?))
    }

    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let mut b = [0u8; N];
        self.r.read_exact(&mut b).ok()?;
        self.pos += N as u64;
        Some(b)
    }
    fn u32(&mut self) -> Option<u32> {
        self.bytes::<4>().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.bytes::<8>().map(u64::from_le_bytes)
    }

    /// A length that the rest of the file can hold, else None.
    fn length(&mut self) -> Option<u64> {
        let n = self.u64()?;
        (n <= self.len.saturating_sub(self.pos)).then_some(n)
    }

    fn skip(&mut self, n: u64) -> Option<()> {
        if n > self.len.saturating_sub(self.pos) {
            return None;
        }
        self.r.seek_relative(i64::try_from(n).ok()?).ok()?;
        self.pos += n;
        Some(())
    }

    fn string(&mut self) -> Option<String> {
        let n = self.length()?;
        let mut v = vec![0u8; usize::try_from(n).ok()?];
        self.r.read_exact(&mut v).ok()?;
        self.pos += n;
        Some(String::from_utf8_lossy(&v).into_owned())
    }

    fn skip_string(&mut self) -> Option<()> {
        let n = self.length()?;
        self.skip(n)
    }

    /// An integer of GGUF type `t` (one of `ALIGNMENT_TYPES`).
    fn int(&mut self, t: u32) -> Option<i64> {
        Some(match t {
            0 => i64::from(self.bytes::<1>()?[0]),
            1 => i64::from(self.bytes::<1>()?[0] as i8),
            2 => i64::from(u16::from_le_bytes(self.bytes::<2>()?)),
            3 => i64::from(i16::from_le_bytes(self.bytes::<2>()?)),
            4 => i64::from(self.u32()?),
            5 => i64::from(self.u32()? as i32),
            _ => return None,
        })
    }

    fn skip_value(&mut self, t: u32, depth: u32) -> Option<()> {
        let size: u64 = match t {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            8 => return self.skip_string(),
            9 if depth < 4 => {
                let it = self.u32()?;
                let n = self.u64()?;
                if matches!(it, 8 | 9) {
                    // every element consumes bytes or fails, so a false count ends at the file's end
                    for _ in 0..n {
                        self.skip_value(it, depth + 1)?;
                    }
                    return Some(());
                }
                let elem = match it {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    10..=12 => 8,
                    _ => return None,
                };
                n.checked_mul(elem)?
            }
            _ => return None,
        };
        self.skip(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fuzz smoke found a row whose blocks times the block's bytes passed 2^64 panicking in
    /// the first product; every product is a size past 2^64, never an overflow.
    #[test]
    fn a_size_past_2_to_the_64_is_a_defect_not_a_panic() {
        let row = u64::MAX - u64::MAX % 32;
        // (type 0 = F32, 4 bytes a value; type 2 = Q4_0, 18 bytes a block of 32)
        for (dims, t) in [
            (vec![u64::MAX], 0),
            (vec![row, 2], 2),
            (vec![32, u64::MAX], 2),
        ] {
            assert!(
                matches!(stored_bytes(&dims, t), Sized::Defect(ref d) if d.contains("2^64")),
                "{dims:?}"
            );
        }
        assert!(matches!(stored_bytes(&[64, 3], 0), Sized::Bytes(768)));
    }
}
