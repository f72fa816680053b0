//! Offline HEF reader and contract lint (no HailoRT needed): container header (contract §5.1),
//! a hand-written protobuf subset decoder (§5.3), the groups/caches/resources model, lint checks
//! (§5.7 and the prior-art findings), the device description and sim manifest it implies.

pub mod config;
pub mod describe;
pub mod error;
mod extract;
pub mod formats;
pub mod geometry;
pub mod header;
pub mod lint;
pub mod model;
pub mod pairing;
pub mod proto;
pub mod roles;
pub mod summary;
pub mod wire;

pub use error::{HefError, Result};
pub use lint::{lint, Lint, Severity};
pub use model::{CacheEdge, Group, Hef, Layer, Resource};
