//! ONNX Runtime GenAI (the next issue's family): a skeleton. The host owns the KV cache as
//! `past_key_values.*` inputs and `present.*` outputs of one ONNX graph, so there is no ring
//! offset and no in-graph state. The device describes itself and declares its capabilities; it
//! refuses to run until the family is implemented.

use kvprobe_schema::{DeviceDescription, GroupKind, ModelShape, RuntimeKind};

use crate::contract::{Capabilities, Family, FaultTable};
use crate::{Buffer, Device, Error, Result, RunOutput};

/// The ONNX Runtime GenAI family in the device table.
pub const FAMILY: Family = Family {
    name: "onnx-genai",
    flag: "--device onnx-genai",
    about: "the ONNX Runtime GenAI family (host-owned past/present KV tensors)",
    capabilities: Capabilities {
        ring_offset: false,
        stateful: false,
        taps: false,
        read_cache: true,
        write_cache: true,
    },
    faults: FaultTable::NONE,
    implemented: false,
};

/// A device of the family: it knows its model's shape and nothing else yet.
pub struct OnnxDevice {
    desc: DeviceDescription,
}

impl OnnxDevice {
    /// A skeleton device for a model of `shape` with a context of `max_ctx` positions.
    pub fn new(model_name: &str, shape: ModelShape, max_ctx: usize) -> OnnxDevice {
        OnnxDevice {
            desc: DeviceDescription {
                backend: FAMILY.name.into(),
                runtime: RuntimeKind::HostCache,
                model_name: model_name.into(),
                cache_len: max_ctx,
                prefill_len: max_ctx.saturating_sub(1),
                shape,
                groups: Vec::new(),
            },
        }
    }
}

fn not_yet(what: &str) -> Error {
    Error::NotImplemented {
        family: FAMILY.flag,
        what: format!("the ONNX Runtime GenAI family ({what})"),
    }
}

impl Device for OnnxDevice {
    fn describe(&self) -> &DeviceDescription {
        &self.desc
    }
    fn capabilities(&self) -> Capabilities {
        FAMILY.capabilities
    }
    fn run(&mut self, _group: GroupKind, _inputs: &[(String, Buffer)]) -> Result<RunOutput> {
        Err(not_yet("run"))
    }
    fn init_cache(&mut self, _read_offset: u32) -> Result<()> {
        Err(not_yet("init_cache"))
    }
    fn update_cache_offset(&mut self, _delta: i32) -> Result<()> {
        Err(not_yet("update_cache_offset"))
    }
    fn cache_buffers(&mut self) -> Result<std::collections::BTreeMap<u32, Vec<u8>>> {
        Err(not_yet("cache_buffers"))
    }
    fn write_cache_buffer(&mut self, _cache_id: u32, _bytes: &[u8]) -> Result<()> {
        Err(not_yet("write_cache_buffer"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_itself_and_refuses_to_run() {
        let shape = ModelShape {
            vocab_size: 8,
            hidden_size: 4,
            n_layers: 1,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 4,
            rope_theta: None,
        };
        let mut dev = OnnxDevice::new("m", shape, 16);
        assert_eq!(dev.describe().backend, "onnx-genai");
        assert_eq!(dev.describe().cache_len, 16);
        let caps = dev.capabilities();
        assert!(!caps.ring_offset && !caps.stateful && caps.read_cache);
        assert!(FAMILY.faults.faults.is_empty() && !FAMILY.implemented);
        let e = dev.run(GroupKind::Prefill, &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--device onnx-genai: the ONNX Runtime GenAI family (run) is not implemented yet"
        );
        assert_eq!(e.exit_code(), 2);
        assert!(crate::families::by_device("onnx-genai").is_some());
        assert_eq!(crate::families::device_choices(), "--device ane-sim");
    }
}
