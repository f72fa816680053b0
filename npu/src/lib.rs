//! kvprobe-npu: the device contract, HailoRT's KV-cache ring and quantisation, the genai driver
//! and the HailoRT KV-cache emulator (`sim`). Domain rules cite `hailort-kv-contract.md` (contract §N).

pub mod ane;
pub mod buffer;
pub mod device;
pub mod driver;
pub mod error;
pub mod layout;
pub mod mask;
pub mod quant;
pub mod ring;
pub mod rope;
pub mod sim;

pub use buffer::Buffer;
pub use device::{Device, RunOutput};
pub use driver::{argmax, Driver, EmbeddingTable, HostState, Trial};
pub use error::{Error, Result};
pub use mask::MaskMode;
pub use ring::{CacheRing, RingSet};
pub use rope::RopeTheta;

#[cfg(feature = "hailo")]
pub mod hailo;
pub mod hef;
