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

/// What `hailo_identify` tells of one physical device, for the run's provenance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceIdentity {
    pub firmware: String,
    pub board: String,
    pub serial: String,
}

/// Identifies the device `id` (opened and released again before the VDevice takes it).
pub fn identify(id: &str) -> Result<DeviceIdentity> {
    let mut dev_id = sys::hailo_device_id_t {
        id: [0; sys::HAILO_MAX_DEVICE_ID_LENGTH],
    };
    for (d, b) in dev_id
        .id
        .iter_mut()
        .zip(id.bytes().take(sys::HAILO_MAX_DEVICE_ID_LENGTH - 1))
    {
        *d = b as std::ffi::c_char;
    }
    let mut device: sys::hailo_device = std::ptr::null_mut();
    // SAFETY: `dev_id` is a valid NUL-terminated id; `device` receives an owned handle on success.
    let status = unsafe { sys::hailo_create_device_by_id(&dev_id, &mut device) };
    if status != sys::HAILO_SUCCESS {
        return Err(HailoError::status("hailo_create_device_by_id", status, ""));
    }
    // SAFETY: all-zero is a valid hailo_device_identity_t (integers, bools and char arrays).
    let mut identity: sys::hailo_device_identity_t = unsafe { std::mem::zeroed() };
    // SAFETY: `device` is the live handle above; `identity` is writable for the call.
    let status = unsafe { sys::hailo_identify(device, &mut identity) };
    // SAFETY: `device` came from hailo_create_device_by_id and is released once.
    unsafe { sys::hailo_release_device(device) };
    if status != sys::HAILO_SUCCESS {
        return Err(HailoError::status("hailo_identify", status, ""));
    }
    let text = |chars: &[std::ffi::c_char], len: u8| {
        let bytes: Vec<u8> = chars
            .iter()
            .take(usize::from(len).min(chars.len()))
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let fw = identity.fw_version;
    Ok(DeviceIdentity {
        firmware: format!(
            "{}.{}.{}{}",
            fw.major,
            fw.minor,
            fw.revision,
            if identity.is_release {
                ""
            } else {
                " (debug build)"
            }
        ),
        board: text(&identity.board_name, identity.board_name_length),
        serial: text(&identity.serial_number, identity.serial_number_length),
    })
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
