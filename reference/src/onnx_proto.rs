//! The few fields of an ONNX model file (`onnx/onnx.proto`) the precision-matched reference reads
//! to compute a device's declared weights and arithmetic: the graph's nodes (op type, name,
//! inputs, outputs, integer attributes), its initializers (name, data type, inline or external
//! data) and the element types its inputs, outputs and value_info declare. A plain protobuf
//! wire-format walk: no generated code, unknown fields skipped.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// One graph node.
#[derive(Debug, Clone, Default)]
pub struct Node {
    pub op_type: String,
    pub name: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    /// Integer attributes by name.
    pub ints: HashMap<String, i64>,
    /// Attributes of other types, by name (so a caller can refuse what it does not read).
    pub other_attrs: Vec<String>,
}

/// Where an initializer's bytes are.
#[derive(Debug, Clone)]
enum Data {
    Inline(Vec<u8>),
    External {
        location: String,
        offset: u64,
        length: Option<u64>,
    },
}

/// One initializer (without its bytes read, for external data).
#[derive(Debug, Clone)]
pub struct Initializer {
    /// ONNX `TensorProto.DataType`: 1 float, 2 uint8, 10 float16.
    pub data_type: i32,
    data: Data,
}

pub const FLOAT: i32 = 1;
pub const UINT8: i32 = 2;
pub const INT8: i32 = 3;
pub const UINT16: i32 = 4;
pub const INT16: i32 = 5;
pub const FLOAT16: i32 = 10;

/// The nodes and initializers of the model file `path`.
pub struct OnnxGraph {
    pub path: PathBuf,
    pub nodes: Vec<Node>,
    pub inits: HashMap<String, Initializer>,
    /// The graph's output names.
    pub outputs: Vec<String>,
    /// Element types (`TensorProto.DataType`) the graph declares for its inputs, outputs and
    /// value_info entries, by name.
    pub declared_types: HashMap<String, i32>,
}

struct Wire<'a> {
    b: &'a [u8],
    at: usize,
}

enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
    Fixed64,
}

impl<'a> Wire<'a> {
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.b.get(self.at)?;
            self.at += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    /// The next (field number, value); None at the end; Err on malformed bytes.
    fn next(&mut self) -> std::result::Result<Option<(u64, Field<'a>)>, ()> {
        if self.at >= self.b.len() {
            return Ok(None);
        }
        let tag = self.varint().ok_or(())?;
        let field = match tag & 7 {
            0 => Field::Varint(self.varint().ok_or(())?),
            1 => {
                self.at += 8;
                Field::Fixed64
            }
            2 => {
                let n = usize::try_from(self.varint().ok_or(())?).map_err(|_| ())?;
                let end = self.at.checked_add(n).ok_or(())?;
                let s = self.b.get(self.at..end).ok_or(())?;
                self.at = end;
                Field::Bytes(s)
            }
            5 => {
                let s = self.b.get(self.at..self.at + 4).ok_or(())?;
                self.at += 4;
                Field::Fixed32(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
            }
            _ => return Err(()),
        };
        if self.at > self.b.len() {
            return Err(());
        }
        Ok(Some((tag >> 3, field)))
    }
}

type Walk<'a> = std::result::Result<(), ()>;

fn each<'a>(b: &'a [u8], mut f: impl FnMut(u64, Field<'a>) -> Walk<'a>) -> Walk<'a> {
    let mut w = Wire { b, at: 0 };
    while let Some((n, v)) = w.next()? {
        f(n, v)?;
    }
    Ok(())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn node(b: &[u8]) -> std::result::Result<Node, ()> {
    let mut n = Node::default();
    each(b, |f, v| {
        match (f, v) {
            (1, Field::Bytes(s)) => n.inputs.push(text(s)),
            (2, Field::Bytes(s)) => n.outputs.push(text(s)),
            (3, Field::Bytes(s)) => n.name = text(s),
            (4, Field::Bytes(s)) => n.op_type = text(s),
            (5, Field::Bytes(s)) => {
                let (mut name, mut int) = (String::new(), None);
                each(s, |f, v| {
                    match (f, v) {
                        (1, Field::Bytes(s)) => name = text(s),
                        (3, Field::Varint(i)) => int = Some(i as i64),
                        _ => {}
                    }
                    Ok(())
                })?;
                match int {
                    Some(i) => {
                        n.ints.insert(name, i);
                    }
                    None => n.other_attrs.push(name),
                }
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok(n)
}

/// A `ValueInfoProto`'s name and, for a tensor, its element type
/// (ValueInfoProto.type = 2 → TypeProto.tensor_type = 1 → elem_type = 1).
fn value_info(b: &[u8]) -> std::result::Result<(String, Option<i32>), ()> {
    let (mut name, mut elem) = (String::new(), None);
    each(b, |f, v| {
        match (f, v) {
            (1, Field::Bytes(s)) => name = text(s),
            (2, Field::Bytes(t)) => each(t, |f, v| {
                if let (1, Field::Bytes(tt)) = (f, v) {
                    each(tt, |f, v| {
                        if let (1, Field::Varint(e)) = (f, v) {
                            elem = Some(e as i32);
                        }
                        Ok(())
                    })?;
                }
                Ok(())
            })?,
            _ => {}
        }
        Ok(())
    })?;
    Ok((name, elem))
}

fn initializer(b: &[u8]) -> std::result::Result<(String, Initializer), ()> {
    let (mut name, mut dt) = (String::new(), 0);
    let (mut raw, mut floats, mut int32s) = (None, Vec::new(), Vec::new());
    let (mut ext, mut external) = (HashMap::new(), false);
    each(b, |f, v| {
        match (f, v) {
            (2, Field::Varint(t)) => dt = t as i32,
            (4, Field::Fixed32(x)) => floats.extend_from_slice(&x.to_le_bytes()),
            (4, Field::Bytes(s)) => floats.extend_from_slice(s),
            (5, Field::Varint(x)) => int32s.push(x),
            // packed int32_data: consecutive varints, not fields (a uint16 zero point of a
            // QDQ graph is one)
            (5, Field::Bytes(s)) => {
                let mut w = Wire { b: s, at: 0 };
                while w.at < s.len() {
                    int32s.push(w.varint().ok_or(())?);
                }
            }
            (8, Field::Bytes(s)) => name = text(s),
            (9, Field::Bytes(s)) => raw = Some(s.to_vec()),
            (13, Field::Bytes(s)) => {
                let (mut k, mut val) = (String::new(), String::new());
                each(s, |f, v| {
                    match (f, v) {
                        (1, Field::Bytes(s)) => k = text(s),
                        (2, Field::Bytes(s)) => val = text(s),
                        _ => {}
                    }
                    Ok(())
                })?;
                ext.insert(k, val);
            }
            (14, Field::Varint(1)) => external = true,
            _ => {}
        }
        Ok(())
    })?;
    let data = if external {
        let num = |k: &str| ext.get(k).and_then(|v| v.parse::<u64>().ok());
        Data::External {
            location: ext.get("location").cloned().ok_or(())?,
            offset: num("offset").unwrap_or(0),
            length: num("length"),
        }
    } else if let Some(r) = raw {
        Data::Inline(r)
    } else if !floats.is_empty() {
        Data::Inline(floats)
    } else {
        // int32_data holds each value of the narrower integer types widened; kept here at the
        // type's own width, little-endian (a uint16 zero point is two bytes)
        let width = match dt {
            UINT16 | INT16 | FLOAT16 => 2,
            6 => 4,
            _ => 1,
        };
        Data::Inline(
            int32s
                .iter()
                .flat_map(|v| v.to_le_bytes().into_iter().take(width))
                .collect(),
        )
    };
    Ok((
        name,
        Initializer {
            data_type: dt,
            data,
        },
    ))
}

impl OnnxGraph {
    /// Reads the model file's graph (external data is read later, per initializer).
    pub fn read(path: &Path) -> Result<OnnxGraph> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let bad = || Error::Format {
            path: path.to_path_buf(),
            detail: "not an ONNX model (malformed protobuf); export the model again".into(),
        };
        let mut graph = None;
        each(&bytes, |f, v| {
            if let (7, Field::Bytes(s)) = (f, v) {
                graph = Some(s);
            }
            Ok(())
        })
        .map_err(|_| bad())?;
        let graph = graph.ok_or_else(bad)?;
        let (mut nodes, mut inits) = (Vec::new(), HashMap::new());
        let (mut outputs, mut declared_types) = (Vec::new(), HashMap::new());
        each(graph, |f, v| {
            match (f, v) {
                (1, Field::Bytes(s)) => nodes.push(node(s)?),
                (5, Field::Bytes(s)) => {
                    let (name, init) = initializer(s)?;
                    inits.insert(name, init);
                }
                // GraphProto.input = 11, output = 12, value_info = 13
                (11..=13, Field::Bytes(s)) => {
                    let (name, elem) = value_info(s)?;
                    if f == 12 {
                        outputs.push(name.clone());
                    }
                    if let Some(e) = elem {
                        declared_types.insert(name, e);
                    }
                }
                _ => {}
            }
            Ok(())
        })
        .map_err(|_| bad())?;
        Ok(OnnxGraph {
            path: path.to_path_buf(),
            nodes,
            inits,
            outputs,
            declared_types,
        })
    }

    /// Every external data file an initializer names exists beside the model and reaches the
    /// initializer's last byte (a folder copied without its `.data` file, or a truncated one):
    /// checked before a runtime is handed the graph, so its refusal is the graph's alone.
    pub fn check_external_data(&self) -> Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let mut sizes: HashMap<&str, u64> = HashMap::new();
        let mut names: Vec<&String> = self.inits.keys().collect();
        names.sort();
        for name in names {
            let Data::External {
                location,
                offset,
                length,
            } = &self.inits[name].data
            else {
                continue;
            };
            let file = dir.join(location);
            let size = match sizes.get(location.as_str()) {
                Some(s) => *s,
                None => {
                    let s = std::fs::metadata(&file)
                        .map_err(|e| Error::Format {
                            path: file.clone(),
                            detail: format!(
                                "cannot be read ({e}); {} stores initializer `{name}` in it: copy the model folder whole, with its external data",
                                self.path.display()
                            ),
                        })?
                        .len();
                    sizes.insert(location, s);
                    s
                }
            };
            let end = offset.saturating_add(length.unwrap_or(0));
            if end > size {
                return Err(Error::Format {
                    path: file,
                    detail: format!(
                        "{size} bytes, but initializer `{name}` ends at byte {end}: the external data file is truncated; copy or export the model folder again"
                    ),
                });
            }
        }
        Ok(())
    }

    /// The byte length of initializer `name`'s data, when the file says it.
    pub fn byte_len(&self, name: &str) -> Option<u64> {
        match &self.inits.get(name)?.data {
            Data::Inline(b) => Some(b.len() as u64),
            Data::External { length, .. } => *length,
        }
    }

    /// The bytes of initializer `name` (inline, or read from its external data file beside the
    /// model); checked to hold `count` values of `elem` bytes.
    pub fn bytes(&self, name: &str, count: usize, elem: usize) -> Result<Vec<u8>> {
        let fmt = |detail: String| Error::Format {
            path: self.path.clone(),
            detail: format!("initializer `{name}`: {detail}"),
        };
        let init = self
            .inits
            .get(name)
            .ok_or_else(|| fmt("missing; export the model again".into()))?;
        let want = count * elem;
        let b = match &init.data {
            Data::Inline(b) => b.clone(),
            Data::External {
                location,
                offset,
                length,
            } => {
                let dir = self.path.parent().unwrap_or(Path::new("."));
                let file = dir.join(location);
                let io = |source| Error::Io {
                    path: file.clone(),
                    source,
                };
                let mut f = std::fs::File::open(&file).map_err(io)?;
                let n = length.unwrap_or(want as u64);
                if n != want as u64 {
                    return Err(fmt(format!("{n} bytes of external data, {want} expected")));
                }
                f.seek(SeekFrom::Start(*offset)).map_err(io)?;
                let mut b = vec![0u8; want];
                f.read_exact(&mut b).map_err(|_| {
                    fmt(format!(
                        "{} ends before byte {}; the external data file is truncated, export the model again",
                        file.display(),
                        offset + n
                    ))
                })?;
                b
            }
        };
        if b.len() != want {
            return Err(fmt(format!("{} bytes, {want} expected", b.len())));
        }
        Ok(b)
    }
}
