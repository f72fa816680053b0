//! What the HailoRT C API (via hailort-sys) offers without the shim: library version and device
//! scan. Linking needs libhailort (a `cargo check` does not).

use super::error::{HailoError, Result};
use hailort_sys as sys;

/// HailoRT library version as (major, minor, revision).
pub fn library_version() -> Result<(u32, u32, u32)> {
    let mut v = sys::hailo_version_t {
        major: 0,
        minor: 0,
        revision: 0,
    };
    // SAFETY: `v` is a valid, writable hailo_version_t for the duration of the call.
    let status = unsafe { sys::hailo_get_library_version(&mut v) };
    if status != sys::HAILO_SUCCESS {
        return Err(HailoError::status("hailo_get_library_version", status, ""));
    }
    Ok((v.major, v.minor, v.revision))
}

/// Ids of the devices the driver sees (e.g. PCIe bus ids).
pub fn scan_devices() -> Result<Vec<String>> {
    const MAX: usize = 16;
    let mut ids = [sys::hailo_device_id_t {
        id: [0; sys::HAILO_MAX_DEVICE_ID_LENGTH],
    }; MAX];
    let mut n = MAX;
    // SAFETY: `ids` holds `n` writable entries; a null params pointer asks for the defaults.
    let status = unsafe { sys::hailo_scan_devices(std::ptr::null_mut(), ids.as_mut_ptr(), &mut n) };
    if status != sys::HAILO_SUCCESS {
        return Err(HailoError::status(
            "hailo_scan_devices",
            status,
            "is the Hailo driver loaded (lsmod | grep hailo)?",
        ));
    }
    Ok(ids[..n.min(MAX)]
        .iter()
        .map(|d| {
            let bytes: Vec<u8> =
                d.id.iter()
                    .take_while(|&&c| c != 0)
                    .map(|&c| c as u8)
                    .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        })
        .collect())
}
