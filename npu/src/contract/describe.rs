//! Pieces of a [`DeviceDescription`](kvprobe_schema::DeviceDescription) the stateful families
//! share.

use kvprobe_schema::{DType, InputRole, IoDescription, QuantInfo};

/// An unquantised input or output: `host` is what the host sends or reads, `dev` what the graph
/// holds.
pub fn io(
    name: &str,
    role: Option<InputRole>,
    shape: [usize; 3],
    host: DType,
    dev: DType,
) -> IoDescription {
    IoDescription {
        name: name.into(),
        role,
        shape,
        host_dtype: host,
        device_dtype: dev,
        quant: QuantInfo::IDENTITY,
    }
}
