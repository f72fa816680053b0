//! kvprobe-npu: the device contract (`contract`), the genai driver (`driver`), the host-side
//! encodings every family shares (`mask`, `quant`, `layout`, `rope`) and one folder per device
//! family: `hailo` (emulator, HEF reader, ring, HailoRT backend) and `coreml` (the ANE emulator).
//! Domain rules cite `hailort-kv-contract.md` (contract §N).

pub mod buffer;
pub mod cache_lookup;
pub mod contract;
pub mod coreml;
pub mod driver;
pub mod error;
pub mod families;
pub mod hailo;
pub mod layout;
pub mod mask;
pub mod onnx;
pub mod openvino;
pub mod quant;
mod race;
pub mod rope;
pub mod shared_runs;
pub mod token_rows;

pub use buffer::Buffer;
pub use contract::{device, Capabilities, Device, RunOutput, SavedState};
pub use driver::{argmax, Driver, EmbeddingTable, HostState, Trial};
pub use error::{Error, Origin, Result};
pub use families::{families, FAMILIES};
pub use hailo::ring::{self, CacheRing, RingSet};
pub use mask::MaskMode;
pub use rope::RopeTheta;
pub use shared_runs::SharedRuns;

/// Paths from before the family folders (issue 17): `kvprobe_npu::sim`, `::hef`, `::ane`.
pub use coreml as ane;
pub use hailo::{hef, sim};
