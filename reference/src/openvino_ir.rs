//! The few parts of an OpenVINO IR (`openvino_model.xml` + `.bin`, IR version 11 as
//! `openvino.save_model` writes it) the precision-matched reference reads to compute a device's
//! declared weights: every layer's id, name, type and `<data …/>` attributes, and the edges
//! between layers. A line walk over the xml as OpenVINO writes it (one tag a line); the values of
//! a `Const` are read from the `.bin` at its `offset` / `size`.

use std::collections::HashMap;
use std::io::{BufRead, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// One layer: `<layer id name type>` and the attributes of its `<data …/>`.
#[derive(Debug, Clone, Default)]
pub struct Layer {
    pub id: u64,
    pub name: String,
    pub ty: String,
    pub data: HashMap<String, String>,
}

impl Layer {
    pub fn attr(&self, k: &str) -> Option<&str> {
        self.data.get(k).map(String::as_str)
    }

    /// A `Const`'s `shape` (empty for a scalar).
    pub fn shape(&self) -> Vec<usize> {
        self.attr("shape")
            .unwrap_or("")
            .split(',')
            .filter_map(|d| d.trim().parse().ok())
            .collect()
    }
}

/// One edge: (from layer, from port) → (to layer, to port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    pub from: u64,
    pub to: u64,
    pub to_port: u64,
}

#[derive(Debug, Default)]
pub struct Ir {
    pub xml: PathBuf,
    pub layers: Vec<Layer>,
    by_id: HashMap<u64, usize>,
    edges: Vec<Edge>,
}

impl Ir {
    pub fn read(xml: &Path) -> Result<Ir> {
        let file = std::fs::File::open(xml).map_err(|source| Error::Io {
            path: xml.to_path_buf(),
            source,
        })?;
        Ir::parse(std::io::BufReader::new(file), xml)
    }

    pub fn parse(text: impl BufRead, xml: &Path) -> Result<Ir> {
        let mut ir = Ir {
            xml: xml.to_path_buf(),
            ..Ir::default()
        };
        // a layer's `<data …/>` comes before its ports; a port's own tags are not data
        let mut open: Option<Layer> = None;
        for line in text.lines() {
            let line = line.map_err(|source| Error::Io {
                path: xml.to_path_buf(),
                source,
            })?;
            let t = line.trim_start();
            if t.starts_with("<layer ") {
                if let Some(l) = open.take() {
                    ir.push(l);
                }
                let num = |k| attr(t, k).and_then(|v| v.parse().ok());
                let Some(id) = num("id") else {
                    return Err(bad(xml, format!("a layer without an id: {}", t.trim())));
                };
                open = Some(Layer {
                    id,
                    name: attr(t, "name").unwrap_or("?").to_string(),
                    ty: attr(t, "type").unwrap_or("?").to_string(),
                    data: HashMap::new(),
                });
            } else if t.starts_with("<data ") {
                if let Some(l) = open.as_mut().filter(|l| l.data.is_empty()) {
                    l.data = attrs(t);
                }
            } else if t.starts_with("</layer>") {
                if let Some(l) = open.take() {
                    ir.push(l);
                }
            } else if t.starts_with("<edge ") {
                let num = |k| attr(t, k).and_then(|v| v.parse().ok());
                match (num("from-layer"), num("to-layer"), num("to-port")) {
                    (Some(from), Some(to), Some(to_port)) => {
                        ir.edges.push(Edge { from, to, to_port })
                    }
                    _ => return Err(bad(xml, format!("an edge it cannot read: {}", t.trim()))),
                }
            }
        }
        if let Some(l) = open.take() {
            ir.push(l);
        }
        Ok(ir)
    }

    fn push(&mut self, l: Layer) {
        self.by_id.insert(l.id, self.layers.len());
        self.layers.push(l);
    }

    pub fn layer(&self, id: u64) -> Option<&Layer> {
        self.by_id.get(&id).map(|&i| &self.layers[i])
    }

    /// The layers reading an output of `id`, with the port they read it on.
    pub fn consumers(&self, id: u64) -> Vec<(&Layer, u64)> {
        self.edges
            .iter()
            .filter(|e| e.from == id)
            .filter_map(|e| Some((self.layer(e.to)?, e.to_port)))
            .collect()
    }

    /// The layer feeding input `port` of `id`.
    pub fn producer(&self, id: u64, port: u64) -> Option<&Layer> {
        let e = self
            .edges
            .iter()
            .find(|e| e.to == id && e.to_port == port)?;
        self.layer(e.from)
    }

    /// The one user of `id`, with the port it reads on, if it has exactly one.
    pub fn only_user(&self, id: u64) -> Option<(&Layer, u64)> {
        let users = self.consumers(id);
        (users.len() == 1).then(|| users[0])
    }

    /// The refusal of something in this IR the precision-matched reference does not compute.
    pub fn refuse(&self, what: String) -> Error {
        Error::Unsupported {
            path: self.xml.clone(),
            what,
        }
    }

    /// An i64 `Const`'s values (a Reshape's target shape).
    pub fn const_i64(&self, l: &Layer) -> Result<Vec<i64>> {
        if l.attr("element_type") != Some("i64") {
            return Err(bad(&self.xml, format!("Const `{}` is not i64", l.name)));
        }
        let b = self.const_bytes(l)?;
        Ok(b.chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect())
    }

    /// The bytes of a `Const` from the `.bin` beside the xml.
    pub fn const_bytes(&self, l: &Layer) -> Result<Vec<u8>> {
        let bin = self.xml.with_extension("bin");
        let num = |k| l.attr(k).and_then(|v| v.parse::<u64>().ok());
        let (Some(offset), Some(size)) = (num("offset"), num("size")) else {
            return Err(bad(
                &self.xml,
                format!("Const `{}` without offset and size", l.name),
            ));
        };
        let io = |source: std::io::Error| Error::Io {
            path: bin.clone(),
            source,
        };
        let mut f = std::fs::File::open(&bin).map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        if offset.checked_add(size).is_none_or(|end| end > len) {
            return Err(Error::Format {
                path: bin.clone(),
                detail: format!(
                    "Const `{}` ends at {} past the file's {len} bytes; the .bin is not the xml's (export the IR again)",
                    l.name,
                    offset.saturating_add(size)
                ),
            });
        }
        f.seek(SeekFrom::Start(offset)).map_err(io)?;
        let mut out = vec![0u8; size as usize];
        f.read_exact(&mut out).map_err(io)?;
        Ok(out)
    }
}

fn bad(xml: &Path, detail: String) -> Error {
    Error::Format {
        path: xml.to_path_buf(),
        detail,
    }
}

/// The value of `name="…"` in one tag line.
fn attr<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let at = line.find(&key)? + key.len();
    let len = line[at..].find('"')?;
    Some(&line[at..at + len])
}

/// Every `key="value"` of one tag line.
fn attrs(line: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut rest = line;
    while let Some(eq) = rest.find("=\"") {
        let key = rest[..eq].rsplit(' ').next().unwrap_or("").to_string();
        let after = &rest[eq + 2..];
        let Some(end) = after.find('"') else { break };
        out.insert(key, after[..end].to_string());
        rest = &after[end + 1..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const XML: &str = r#"<?xml version="1.0"?>
<net name="Model0" version="11">
	<layers>
		<layer id="7" name="w_compressed" type="Const" version="opset1">
			<data element_type="f16" shape="2, 3" offset="8" size="12" />
			<output>
				<port id="0" precision="FP16" names="w">
		</layer>
		<layer id="8" name="w" type="Convert" version="opset1">
			<data destination_type="f32" />
		</layer>
	</layers>
	<edges>
		<edge from-layer="7" from-port="0" to-layer="8" to-port="0" />
	</edges>
</net>
"#;

    #[test]
    fn layers_data_and_edges_are_read() {
        let ir = Ir::parse(XML.as_bytes(), Path::new("m.xml")).unwrap();
        let c = ir.layer(7).unwrap();
        assert_eq!(
            (c.ty.as_str(), c.attr("element_type")),
            ("Const", Some("f16"))
        );
        assert_eq!(c.shape(), vec![2, 3]);
        let users = ir.consumers(7);
        assert_eq!(users.len(), 1);
        assert_eq!((users[0].0.name.as_str(), users[0].1), ("w", 0));
        assert_eq!(users[0].0.attr("destination_type"), Some("f32"));
    }
}
