//! The probes' reads and writes of the device's cache bytes (`get_cache_buffers`,
//! `update_cache_buffer`). A failure there is the device's answer to the step that asked, named
//! with the device and the step (issue 38: exit 3, `incomplete`), never a bare device error or an
//! exit-2 message about the user's flags: the probe builds every write from the device's own
//! description (its cache edges, `L × Ep` bytes).

use std::collections::BTreeMap;

use kvprobe_npu::Device;

use crate::Result;

/// Every cache's bytes by cache_id, as `get_cache_buffers()` returns them.
pub type Rings = BTreeMap<u32, Vec<u8>>;

/// The device's cache bytes, read at `step` (e.g. "after the prompt's prefill (layout probe)").
pub fn read(dev: &mut dyn Device, step: &str) -> Result<Rings> {
    dev.cache_buffers().map_err(|e| {
        e.by_device(&dev.describe().backend, format!("cache read {step}"))
            .into()
    })
}

/// Replace cache `cache_id`'s bytes at `step`.
pub fn write(dev: &mut dyn Device, cache_id: u32, bytes: &[u8], step: &str) -> Result<()> {
    dev.write_cache_buffer(cache_id, bytes).map_err(|e| {
        e.by_device(
            &dev.describe().backend,
            format!("cache write of cache {cache_id} {step}"),
        )
        .into()
    })
}

/// Write every cache of `rings` at `step`.
pub fn write_all(dev: &mut dyn Device, rings: &Rings, step: &str) -> Result<()> {
    for (id, bytes) in rings {
        write(dev, *id, bytes, step)?;
    }
    Ok(())
}
