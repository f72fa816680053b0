//! [`HailoDevice`]: the `Device` trait over HailoRT, following the genai server's recipe
//! (contract §6.3): one VDevice, one infer model per group with the KV-cache enabled, FLOAT32 pe
//! inputs and outputs, both groups configured before the first run, 15 s run timeout.

use super::error::{HailoError, Result};
use crate::hailo::hef::{self, Hef};
use crate::{Buffer, Device, RunOutput};
use kvprobe_schema::{DeviceDescription, GroupKind, InputRole};
use std::collections::BTreeMap;
use std::path::Path;

#[cfg_attr(not(kvprobe_hailort_shim), allow(dead_code))]
/// Input names the host feeds as float32 (contract §2.1: the four RoPE inputs; position ids for
/// learned-position models).
fn float_inputs(desc: &DeviceDescription, kind: GroupKind) -> Vec<String> {
    desc.group(kind)
        .map(|g| {
            g.inputs
                .iter()
                .filter(|i| {
                    matches!(
                        i.role,
                        Some(
                            InputRole::PeQCos
                                | InputRole::PeQSin
                                | InputRole::PeKCos
                                | InputRole::PeKSin
                                | InputRole::PositionIds
                        )
                    )
                })
                .map(|i| i.name.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// Reads the HEF and derives the description the backend will serve (no device needed).
pub fn describe_hef(path: &Path) -> Result<(Hef, DeviceDescription)> {
    let hef = Hef::open(path)?;
    let desc = hef::describe::to_device_description(&hef)?;
    Ok((hef, desc))
}

#[cfg(not(kvprobe_hailort_shim))]
pub struct HailoDevice {
    desc: DeviceDescription,
}

#[cfg(not(kvprobe_hailort_shim))]
impl HailoDevice {
    /// Without the shim this always fails with [`HailoError::ShimNotBuilt`] (after reading the
    /// HEF, so HEF problems are still reported first).
    pub fn open(hef_path: &Path) -> Result<HailoDevice> {
        describe_hef(hef_path)?;
        Err(HailoError::ShimNotBuilt)
    }
}

#[cfg(not(kvprobe_hailort_shim))]
impl Device for HailoDevice {
    fn describe(&self) -> &DeviceDescription {
        &self.desc
    }
    fn run(&mut self, _: GroupKind, _: &[(String, Buffer)]) -> crate::Result<RunOutput> {
        Err(HailoError::ShimNotBuilt.into())
    }
    fn init_cache(&mut self, _: u32) -> crate::Result<()> {
        Err(HailoError::ShimNotBuilt.into())
    }
    fn update_cache_offset(&mut self, _: i32) -> crate::Result<()> {
        Err(HailoError::ShimNotBuilt.into())
    }
    fn cache_buffers(&mut self) -> crate::Result<BTreeMap<u32, Vec<u8>>> {
        Err(HailoError::ShimNotBuilt.into())
    }
    fn write_cache_buffer(&mut self, _: u32, _: &[u8]) -> crate::Result<()> {
        Err(HailoError::ShimNotBuilt.into())
    }
}

#[cfg(kvprobe_hailort_shim)]
pub use with_shim::HailoDevice;

#[cfg(kvprobe_hailort_shim)]
mod with_shim {
    use super::*;
    use crate::hailo::hw::ffi;
    use std::ffi::{CStr, CString};

    fn check(op: &str, status: i32) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        // SAFETY: the shim returns a pointer to a thread-local NUL-terminated string.
        let detail = unsafe { CStr::from_ptr(ffi::kvp_last_error()) }
            .to_string_lossy()
            .into_owned();
        Err(HailoError::status(op, status, &detail))
    }

    fn cstr(s: &str) -> Result<CString> {
        CString::new(s)
            .map_err(|_| HailoError::InvalidArgument(format!("name {s:?} contains a NUL byte")))
    }

    /// Owns a `kvp_vdevice`; released on drop.
    struct VDevice(*mut ffi::KvpVdevice);
    impl Drop for VDevice {
        fn drop(&mut self) {
            // SAFETY: created by kvp_vdevice_create, released exactly once here.
            unsafe { ffi::kvp_vdevice_release(self.0) }
        }
    }

    /// Owns a configured infer model of one group; released on drop.
    struct Model {
        ptr: *mut ffi::KvpModel,
        outputs: Vec<(CString, usize)>,
    }
    impl Drop for Model {
        fn drop(&mut self) {
            // SAFETY: created by kvp_model_create, released exactly once here.
            unsafe { ffi::kvp_model_release(self.ptr) }
        }
    }

    impl Model {
        fn create(vdevice: &VDevice, hef: &CStr, group: &str, floats: &[String]) -> Result<Model> {
            let g = cstr(group)?;
            let names: Vec<CString> = floats.iter().map(|s| cstr(s)).collect::<Result<_>>()?;
            let ptrs: Vec<*const std::os::raw::c_char> = names.iter().map(|c| c.as_ptr()).collect();
            let mut ptr = std::ptr::null_mut();
            // SAFETY: all strings outlive the call; `ptr` receives an owned handle on success.
            check(&format!("configure of group {group}"), unsafe {
                ffi::kvp_model_create(
                    vdevice.0,
                    hef.as_ptr(),
                    g.as_ptr(),
                    ptrs.as_ptr(),
                    ptrs.len(),
                    &mut ptr,
                )
            })?;
            let mut model = Model {
                ptr,
                outputs: Vec::new(),
            };
            // Output names and frame sizes, in InferModel order (inputs are named by the HEF
            // description and checked by HailoRT when set).
            {
                let is_output = 1;
                // SAFETY: `ptr` is a live model handle.
                let n = unsafe { ffi::kvp_model_io_count(model.ptr, is_output) };
                for i in 0..n {
                    let mut buf = vec![0 as std::os::raw::c_char; 1024];
                    // SAFETY: `buf` has the length passed.
                    check("stream name", unsafe {
                        ffi::kvp_model_io_name(model.ptr, is_output, i, buf.as_mut_ptr(), buf.len())
                    })?;
                    // SAFETY: the shim wrote a NUL-terminated string into `buf`.
                    let name = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_owned();
                    let mut size = 0usize;
                    // SAFETY: live handle, valid C string, writable size.
                    check("frame size", unsafe {
                        ffi::kvp_model_frame_size(model.ptr, is_output, name.as_ptr(), &mut size)
                    })?;
                    model.outputs.push((name, size));
                }
            }
            Ok(model)
        }
    }

    pub struct HailoDevice {
        // Field order = drop order: models before the VDevice they run on.
        prefill: Model,
        tbt: Option<Model>,
        _vdevice: VDevice,
        desc: DeviceDescription,
        versions: Vec<(String, String)>,
    }

    impl HailoDevice {
        /// Opens the first device, configures prefill then tbt (both before any run, so neither
        /// sits at offset 0 after the other is wired, contract §1.4).
        pub fn open(hef_path: &Path) -> Result<HailoDevice> {
            let (hef, desc) = describe_hef(hef_path)?;
            let (major, minor, rev) = crate::hailo::hw::sys::library_version()?;
            if major != crate::hailo::hw::SUPPORTED_MAJOR {
                return Err(HailoError::UnsupportedVersion {
                    found: format!("{major}.{minor}.{rev}"),
                    supported: crate::hailo::hw::SUPPORTED_MAJOR,
                });
            }
            // Before the VDevice takes the device: identify opens it on its own.
            let versions = provenance_versions(&hef, format!("{major}.{minor}.{rev}"));
            let hef_c = cstr(&hef_path.to_string_lossy())?;
            let mut vptr = std::ptr::null_mut();
            // SAFETY: `vptr` receives an owned handle on success.
            check("VDevice::create", unsafe {
                ffi::kvp_vdevice_create(&mut vptr)
            })?;
            let vdevice = VDevice(vptr);
            let pname = desc
                .group(GroupKind::Prefill)
                .map(|g| g.name.clone())
                .unwrap_or_default();
            let prefill = Model::create(
                &vdevice,
                &hef_c,
                &pname,
                &float_inputs(&desc, GroupKind::Prefill),
            )?;
            let tbt = match desc.group(GroupKind::Tbt) {
                Some(g) => Some(Model::create(
                    &vdevice,
                    &hef_c,
                    &g.name,
                    &float_inputs(&desc, GroupKind::Tbt),
                )?),
                None => None,
            };
            Ok(HailoDevice {
                prefill,
                tbt,
                _vdevice: vdevice,
                desc,
                versions,
            })
        }

        fn model(&mut self, kind: GroupKind) -> Result<&mut Model> {
            match kind {
                GroupKind::Prefill => Ok(&mut self.prefill),
                GroupKind::Tbt => self
                    .tbt
                    .as_mut()
                    .ok_or_else(|| HailoError::InvalidArgument("this HEF has no tbt group".into())),
            }
        }
    }

    fn buffer_bytes(b: &Buffer) -> Vec<u8> {
        match b {
            Buffer::U8(v) => v.clone(),
            Buffer::U16(v) => v.iter().flat_map(|x| x.to_ne_bytes()).collect(),
            Buffer::F32(v) => v.iter().flat_map(|x| x.to_ne_bytes()).collect(),
        }
    }

    /// HailoRT's version, the first device's firmware and board (or why they could not be
    /// read: a version is evidence, never a reason to stop the run), and the HEF's compiler.
    fn provenance_versions(hef: &Hef, hailort: String) -> Vec<(String, String)> {
        use crate::hailo::hw::sys;
        let mut v = vec![("hailort".to_string(), hailort)];
        let identity = sys::scan_devices().and_then(|ids| match ids.first() {
            Some(id) => sys::identify(id),
            None => Err(HailoError::InvalidArgument("no device found".into())),
        });
        match identity {
            Ok(i) => {
                v.push(("firmware".into(), i.firmware));
                v.push(("board".into(), i.board));
                v.push(("serial number".into(), i.serial));
            }
            Err(e) => v.push(("firmware".into(), format!("not read: {e}"))),
        }
        v.push(("hef sdk".into(), hef.sdk_version.clone()));
        v.push(("hef architecture".into(), hef.hw_arch_name.clone()));
        v
    }

    impl Device for HailoDevice {
        fn describe(&self) -> &DeviceDescription {
            &self.desc
        }

        fn versions(&self) -> Vec<(String, String)> {
            self.versions.clone()
        }

        fn run(
            &mut self,
            group: GroupKind,
            inputs: &[(String, Buffer)],
        ) -> crate::Result<RunOutput> {
            let m = self.model(group)?;
            // Names and sizes are HailoRT's to check (through the shim's bindings): an unknown
            // stream is HAILO_NOT_FOUND, a wrong size HAILO_INVALID_ARGUMENT, both exit 3.
            for (name, buf) in inputs {
                let cname = cstr(name)?;
                let bytes = buffer_bytes(buf);
                // SAFETY: live handle, valid name, `bytes` holds `len` bytes.
                check(&format!("set input {name}"), unsafe {
                    ffi::kvp_model_set_input(m.ptr, cname.as_ptr(), bytes.as_ptr(), bytes.len())
                })?;
            }
            // SAFETY: live handle.
            check("run", unsafe {
                ffi::kvp_model_run(m.ptr, super::super::RUN_TIMEOUT_MS)
            })?;
            // All outputs are FLOAT32, concatenated in the HEF's sorted order (contract §2.1, §2.8).
            let mut logits = Vec::new();
            for (name, size) in &m.outputs {
                let mut bytes = vec![0u8; *size];
                // SAFETY: `bytes` has the frame size the shim reported.
                check("read output", unsafe {
                    ffi::kvp_model_get_output(m.ptr, name.as_ptr(), bytes.as_mut_ptr(), bytes.len())
                })?;
                logits.extend(
                    bytes
                        .chunks_exact(4)
                        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])),
                );
            }
            Ok(RunOutput {
                logits,
                taps: BTreeMap::new(),
            })
        }

        fn init_cache(&mut self, read_offset: u32) -> crate::Result<()> {
            // R is device-wide: issuing through prefill moves tbt too (contract §1.4).
            // SAFETY: live handle.
            Ok(check("init_cache", unsafe {
                ffi::kvp_model_init_cache(self.prefill.ptr, read_offset)
            })?)
        }

        fn update_cache_offset(&mut self, delta: i32) -> crate::Result<()> {
            // SAFETY: live handle.
            Ok(check("update_cache_offset", unsafe {
                ffi::kvp_model_update_cache_offset(self.prefill.ptr, delta)
            })?)
        }

        fn cache_buffers(&mut self) -> crate::Result<BTreeMap<u32, Vec<u8>>> {
            let mut n = 0usize;
            // SAFETY: live handle, writable count.
            check("get_cache_buffers", unsafe {
                ffi::kvp_model_fetch_cache_buffers(self.prefill.ptr, &mut n)
            })?;
            let mut out = BTreeMap::new();
            for i in 0..n {
                let (mut id, mut data, mut len) = (0u32, std::ptr::null(), 0usize);
                // SAFETY: index < count; the snapshot stays alive until the next fetch.
                check("get_cache_buffers", unsafe {
                    ffi::kvp_model_cache_entry(self.prefill.ptr, i, &mut id, &mut data, &mut len)
                })?;
                // SAFETY: the shim returned `len` readable bytes at `data`.
                out.insert(
                    id,
                    unsafe { std::slice::from_raw_parts(data, len) }.to_vec(),
                );
            }
            Ok(out)
        }

        fn write_cache_buffer(&mut self, cache_id: u32, bytes: &[u8]) -> crate::Result<()> {
            // SAFETY: live handle, `bytes` readable for its length.
            Ok(check("update_cache_buffer", unsafe {
                ffi::kvp_model_update_cache_buffer(
                    self.prefill.ptr,
                    cache_id,
                    bytes.as_ptr(),
                    bytes.len(),
                )
            })?)
        }
    }
}

/// The `--hef` entry point (issue 6): the pairing check against the user's model runs first and
/// an error-level pairing finding refuses the device (a wrong model makes every probe
/// meaningless). Structural lint errors do not: a HEF with, say, a ring-unsafe cache layout is
/// exactly what the probes are for.
pub fn open_paired(hef_path: &Path, model: &kvprobe_reference::Model) -> Result<HailoDevice> {
    let hef = Hef::open(hef_path)?;
    let errors: Vec<String> = hef::pairing::pair(&hef, model)
        .into_iter()
        .filter(|l| l.severity == hef::Severity::Error)
        .map(|l| format!("[{}] {}", l.id, l.message))
        .collect();
    if !errors.is_empty() {
        return Err(HailoError::Pairing {
            hef: hef_path.display().to_string(),
            errors: errors.join("; "),
        });
    }
    HailoDevice::open(hef_path)
}
