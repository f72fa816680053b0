//! The emulator side of the test-only HailoRT stand-in (`scripts/build-standin.sh`). The C++
//! front in `npu/standin/cpp` implements the HailoRT declarations the shim uses
//! (`npu/standin/include/hailo`) and calls the C ABI below; this crate answers those calls with
//! the KV-cache emulator ([`SimDevice`]) built from an emulator manifest.
//!
//! Environment (read when the VDevice is created):
//! * `KVPROBE_STANDIN_MANIFEST`: the emulator manifest (`kvprobe inspect --emit-sim` output or a
//!   sim run's manifest). Unset or missing: no device (HAILO_OUT_OF_PHYSICAL_DEVICES).
//! * `KVPROBE_STANDIN_MODEL`: the model the manifest was made for (default: the manifest's path).
//! * `KVPROBE_STANDIN_VERSION`: the library version reported (default 5.2.0, the contract's).
//! * `KVPROBE_STANDIN_LATENCY_MS`: simulated device time per run; a run whose latency exceeds its
//!   timeout returns HAILO_TIMEOUT at once (the stand-in does not sleep).
//!
//! Faults are injected through the manifest's `faults` list, exactly as `--sim-manifest` does.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvprobe_npu::hef::{self, Hef};
use kvprobe_npu::sim::options::SimOptions;
use kvprobe_npu::sim::SimDevice;
use kvprobe_npu::{Buffer, Device};
use kvprobe_schema::{CacheDirection, DType, GroupDescription, GroupKind, IoDescription};

pub mod status;
use status::*;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn fail(status: i32, detail: impl AsRef<str>) -> i32 {
    let text = detail.as_ref().replace('\0', " ");
    LAST_ERROR.with(|e| *e.borrow_mut() = CString::new(text).unwrap_or_default());
    status
}

fn ok() -> i32 {
    LAST_ERROR.with(|e| *e.borrow_mut() = CString::default());
    HAILO_SUCCESS
}

/// HailoRT's answer to an emulator error: argument problems stay arguments, the rest is the
/// device failing an operation.
fn from_npu(op: &str, e: kvprobe_npu::Error) -> i32 {
    let status = match e {
        kvprobe_npu::Error::InvalidArgument(_) => HAILO_INVALID_ARGUMENT,
        _ => HAILO_INVALID_OPERATION,
    };
    fail(status, format!("{op}: {e}"))
}

/// Detail of the last failure on this thread ("" if none).
#[no_mangle]
pub extern "C" fn ksi_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The library version: `KVPROBE_STANDIN_VERSION` (MAJOR.MINOR.REVISION) or 5.2.0.
///
/// # Safety
/// The three pointers must be writable.
#[no_mangle]
pub unsafe extern "C" fn ksi_library_version(
    major: *mut u32,
    minor: *mut u32,
    rev: *mut u32,
) -> i32 {
    let text = std::env::var("KVPROBE_STANDIN_VERSION").unwrap_or_else(|_| "5.2.0".into());
    let parts: Vec<u32> = text.split('.').filter_map(|p| p.parse().ok()).collect();
    let [a, b, c] = parts.as_slice() else {
        return fail(
            HAILO_INVALID_ARGUMENT,
            format!("KVPROBE_STANDIN_VERSION={text}: use MAJOR.MINOR.REVISION"),
        );
    };
    *major = *a;
    *minor = *b;
    *rev = *c;
    ok()
}

fn manifest_path() -> Option<PathBuf> {
    std::env::var_os("KVPROBE_STANDIN_MANIFEST")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
}

/// 1 when a device can be opened (the manifest exists), else 0.
#[no_mangle]
pub extern "C" fn ksi_device_count() -> usize {
    usize::from(manifest_path().is_some())
}

/// One emulated Hailo-10H: the emulator and the cache state both groups share.
pub struct KsiDevice {
    sim: SimDevice,
    latency_ms: u64,
}

/// Opens the emulator from the manifest.
///
/// # Safety
/// `out` must be writable; the handle is released with [`ksi_device_close`].
#[no_mangle]
pub unsafe extern "C" fn ksi_device_open(out: *mut *mut KsiDevice) -> i32 {
    let Some(manifest) = manifest_path() else {
        return fail(
            HAILO_OUT_OF_PHYSICAL_DEVICES,
            "no Hailo device found (stand-in: KVPROBE_STANDIN_MANIFEST is unset or names no file)",
        );
    };
    match open_device(&manifest) {
        Ok(d) => {
            *out = Box::into_raw(Box::new(d));
            ok()
        }
        Err(status) => status,
    }
}

fn open_device(manifest: &Path) -> Result<KsiDevice, i32> {
    let text = std::fs::read_to_string(manifest).map_err(|e| {
        fail(
            HAILO_OPEN_FILE_FAILURE,
            format!("{}: {e}", manifest.display()),
        )
    })?;
    let m: kvprobe_schema::SimManifest = serde_json::from_str(&text).map_err(|e| {
        fail(
            HAILO_INVALID_ARGUMENT,
            format!("{}: {e}", manifest.display()),
        )
    })?;
    let model_path = std::env::var_os("KVPROBE_STANDIN_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(&m.model.path));
    let model = kvprobe_reference::Model::load(&model_path).map_err(|e| {
        fail(
            HAILO_OPEN_FILE_FAILURE,
            format!("stand-in model {}: {e}", model_path.display()),
        )
    })?;
    let opts = SimOptions {
        manifest: Some(manifest.to_path_buf()),
        ..SimOptions::default()
    };
    let sim = SimDevice::new(Arc::new(model), opts).map_err(|e| from_npu("VDevice", e))?;
    let latency_ms = std::env::var("KVPROBE_STANDIN_LATENCY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Ok(KsiDevice { sim, latency_ms })
}

/// # Safety
/// `dev` comes from [`ksi_device_open`] and is released once.
#[no_mangle]
pub unsafe extern "C" fn ksi_device_close(dev: *mut KsiDevice) {
    if !dev.is_null() {
        drop(Box::from_raw(dev));
    }
}

/// One stream as the HEF names it, and where the emulator finds it.
struct Stream {
    name: CString,
    elements: usize,
    /// Bytes per element on the device edge (what HailoRT's default host format keeps).
    device_bytes: usize,
    /// Input: the emulator's input name and host type.
    sim_name: String,
    sim_dtype: DType,
}

/// A network group of the HEF, checked against the device.
pub struct KsiModel {
    kind: GroupKind,
    inputs: Vec<Stream>,
    outputs: Vec<Stream>,
}

fn incompatible(hef: &Path, detail: String) -> i32 {
    fail(
        HAILO_HEF_NOT_COMPATIBLE_WITH_DEVICE,
        format!("{}: {detail}", hef.display()),
    )
}

/// What HailoRT checks when it configures a group on a device, in the emulator's terms: the
/// group exists, its inputs exist on the device by role with the same element counts, the
/// outputs cover the vocabulary, and every cache edge has the device's id, direction, length
/// and entry sizes.
fn open_model(dev: &KsiDevice, hef_path: &Path, group: &str) -> Result<KsiModel, i32> {
    let hef = Hef::open(hef_path).map_err(|e| fail(HAILO_INVALID_HEF, e.to_string()))?;
    let desc = hef::describe::to_device_description(&hef)
        .map_err(|e| fail(HAILO_INVALID_HEF, e.to_string()))?;
    let Some(g) = desc.groups.iter().find(|g| g.name == group) else {
        return Err(fail(
            HAILO_NOT_FOUND,
            format!("{}: no network group named {group}", hef_path.display()),
        ));
    };
    let sim_desc = dev.sim.describe();
    let Some(sg) = sim_desc.group(g.kind) else {
        return Err(incompatible(
            hef_path,
            format!("the device has no {:?} group", g.kind),
        ));
    };
    check_cache_edges(hef_path, g, sg)?;
    let mut inputs = Vec::new();
    for io in &g.inputs {
        let Some(si) = sg
            .inputs
            .iter()
            .find(|s| io.role.is_some() && s.role == io.role)
        else {
            return Err(incompatible(
                hef_path,
                format!("input {} has no counterpart on the device", io.name),
            ));
        };
        if si.elements() != io.elements() {
            return Err(incompatible(
                hef_path,
                format!(
                    "input {} has {} elements, the device's {}",
                    io.name,
                    io.elements(),
                    si.elements()
                ),
            ));
        }
        inputs.push(stream(io, si.name.clone(), si.host_dtype));
    }
    let vocab: usize = g.outputs.iter().map(IoDescription::elements).sum();
    let device_vocab: usize = sg.outputs.iter().map(IoDescription::elements).sum();
    if vocab != device_vocab {
        return Err(incompatible(
            hef_path,
            format!("outputs hold {vocab} values, the device's {device_vocab}"),
        ));
    }
    let outputs = g
        .outputs
        .iter()
        .map(|o| stream(o, String::new(), DType::F32))
        .collect();
    Ok(KsiModel {
        kind: g.kind,
        inputs,
        outputs,
    })
}

fn stream(io: &IoDescription, sim_name: String, sim_dtype: DType) -> Stream {
    Stream {
        name: CString::new(io.name.replace('\0', " ")).unwrap_or_default(),
        elements: io.elements(),
        device_bytes: io.device_dtype.bytes(),
        sim_name,
        sim_dtype,
    }
}

fn check_cache_edges(hef: &Path, g: &GroupDescription, sg: &GroupDescription) -> Result<(), i32> {
    let key = |e: &kvprobe_schema::CacheEdgeDescription| {
        (
            e.cache_id,
            e.direction == CacheDirection::Output,
            e.length,
            e.entry_size,
            e.padded_entry_size,
            e.data_bytes,
        )
    };
    let mut ours: Vec<_> = g.cache_edges.iter().map(key).collect();
    let mut device: Vec<_> = sg.cache_edges.iter().map(key).collect();
    ours.sort_unstable();
    device.sort_unstable();
    if ours == device {
        return Ok(());
    }
    let first = ours
        .iter()
        .zip(&device)
        .find(|(a, b)| a != b)
        .map(|(a, b)| {
            format!(
                "cache {} {}: HEF (length {}, entry {}, padded {}, {} B) vs device (length {}, entry {}, padded {}, {} B)",
                a.0,
                if a.1 { "out" } else { "in" },
                a.2, a.3, a.4, a.5, b.2, b.3, b.4, b.5
            )
        })
        .unwrap_or_else(|| format!("{} cache edges vs the device's {}", ours.len(), device.len()));
    Err(incompatible(
        hef,
        format!("{} cache edges disagree with the device: {first}", g.name),
    ))
}

/// # Safety
/// `dev` is live, the strings are NUL-terminated, `out` is writable; release with
/// [`ksi_model_close`].
#[no_mangle]
pub unsafe extern "C" fn ksi_model_open(
    dev: *const KsiDevice,
    hef_path: *const c_char,
    group: *const c_char,
    out: *mut *mut KsiModel,
) -> i32 {
    let path = PathBuf::from(CStr::from_ptr(hef_path).to_string_lossy().into_owned());
    let group = CStr::from_ptr(group).to_string_lossy().into_owned();
    match open_model(&*dev, &path, &group) {
        Ok(m) => {
            *out = Box::into_raw(Box::new(m));
            ok()
        }
        Err(status) => status,
    }
}

/// # Safety
/// `model` comes from [`ksi_model_open`] and is released once.
#[no_mangle]
pub unsafe extern "C" fn ksi_model_close(model: *mut KsiModel) {
    if !model.is_null() {
        drop(Box::from_raw(model));
    }
}

unsafe fn streams<'a>(model: *const KsiModel, is_output: i32) -> &'a [Stream] {
    let m = &*model;
    if is_output != 0 {
        &m.outputs
    } else {
        &m.inputs
    }
}

/// # Safety
/// `model` is live.
#[no_mangle]
pub unsafe extern "C" fn ksi_model_io_count(model: *const KsiModel, is_output: i32) -> usize {
    streams(model, is_output).len()
}

/// Name (valid while the model lives), element count and device bytes per element of stream
/// `index`.
///
/// # Safety
/// `model` is live, `index` below the count, the out pointers writable.
#[no_mangle]
pub unsafe extern "C" fn ksi_model_io(
    model: *const KsiModel,
    is_output: i32,
    index: usize,
    name: *mut *const c_char,
    elements: *mut usize,
    device_bytes: *mut usize,
) {
    let s = &streams(model, is_output)[index];
    *name = s.name.as_ptr();
    *elements = s.elements;
    *device_bytes = s.device_bytes;
}

fn bytes_per(format_type: i32) -> Option<DType> {
    match format_type {
        HAILO_FORMAT_TYPE_UINT8 => Some(DType::U8),
        HAILO_FORMAT_TYPE_UINT16 => Some(DType::U16),
        HAILO_FORMAT_TYPE_FLOAT32 => Some(DType::F32),
        _ => None,
    }
}

fn to_buffer(bytes: &[u8], dtype: DType) -> Buffer {
    match dtype {
        DType::U8 => Buffer::U8(bytes.to_vec()),
        DType::U16 | DType::F16 => Buffer::U16(
            bytes
                .chunks_exact(2)
                .map(|c| u16::from_ne_bytes([c[0], c[1]]))
                .collect(),
        ),
        DType::F32 => Buffer::F32(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
    }
}

/// One inference of `model`'s group. Buffers come in the model's stream order with the host
/// format type each stream was configured with (HAILO_FORMAT_TYPE_*).
///
/// # Safety
/// `dev` and `model` are live; each of the pointer arrays holds as many entries as the model has
/// streams of that direction, each buffer readable/writable for its length.
#[no_mangle]
pub unsafe extern "C" fn ksi_model_run(
    dev: *mut KsiDevice,
    model: *const KsiModel,
    in_data: *const *const u8,
    in_lens: *const usize,
    in_types: *const i32,
    out_data: *const *mut u8,
    out_lens: *const usize,
    out_types: *const i32,
    timeout_ms: u32,
) -> i32 {
    let dev = &mut *dev;
    let m = &*model;
    if dev.latency_ms > u64::from(timeout_ms) {
        return fail(
            HAILO_TIMEOUT,
            format!(
                "run of the {:?} group: no answer within {timeout_ms} ms (stand-in latency {} ms)",
                m.kind, dev.latency_ms
            ),
        );
    }
    let mut inputs = Vec::with_capacity(m.inputs.len());
    for (i, s) in m.inputs.iter().enumerate() {
        let ty = bytes_per(*in_types.add(i));
        if ty != Some(s.sim_dtype) {
            return fail(
                HAILO_INVALID_OPERATION,
                format!(
                    "input {}: the stand-in serves the genai server's host formats only ({:?} here)",
                    s.name.to_string_lossy(),
                    s.sim_dtype
                ),
            );
        }
        let len = *in_lens.add(i);
        let bytes = std::slice::from_raw_parts(*in_data.add(i), len);
        inputs.push((s.sim_name.clone(), to_buffer(bytes, s.sim_dtype)));
    }
    let out = match dev.sim.run(m.kind, &inputs) {
        Ok(o) => o,
        Err(e) => return from_npu("run", e),
    };
    let mut at = 0usize;
    for (i, s) in m.outputs.iter().enumerate() {
        if *out_types.add(i) != HAILO_FORMAT_TYPE_FLOAT32 {
            return fail(
                HAILO_INVALID_OPERATION,
                format!(
                    "output {}: the stand-in serves FLOAT32 outputs only",
                    s.name.to_string_lossy()
                ),
            );
        }
        let Some(values) = out.logits.get(at..at + s.elements) else {
            return fail(
                HAILO_INTERNAL_FAILURE,
                "the emulator returned too few logits",
            );
        };
        at += s.elements;
        let dst = std::slice::from_raw_parts_mut(*out_data.add(i), *out_lens.add(i));
        for (d, v) in dst.chunks_exact_mut(4).zip(values) {
            d.copy_from_slice(&v.to_ne_bytes());
        }
    }
    ok()
}

/// # Safety
/// `dev` is live.
#[no_mangle]
pub unsafe extern "C" fn ksi_init_cache(dev: *mut KsiDevice, read_offset: u32) -> i32 {
    match (*dev).sim.init_cache(read_offset) {
        Ok(()) => ok(),
        Err(e) => from_npu("init_cache", e),
    }
}

/// # Safety
/// `dev` is live.
#[no_mangle]
pub unsafe extern "C" fn ksi_update_cache_offset(dev: *mut KsiDevice, delta: i32) -> i32 {
    match (*dev).sim.update_cache_offset(delta) {
        Ok(()) => ok(),
        Err(e) => from_npu("update_cache_offset", e),
    }
}

/// Cache ids and their backing-buffer sizes: call with `ids == NULL` for the count.
///
/// # Safety
/// `dev` is live; `ids` and `sizes` hold `*count` entries when not null.
#[no_mangle]
pub unsafe extern "C" fn ksi_cache_list(
    dev: *mut KsiDevice,
    ids: *mut u32,
    sizes: *mut usize,
    count: *mut usize,
) -> i32 {
    let buffers = match (*dev).sim.cache_buffers() {
        Ok(b) => b,
        Err(e) => return from_npu("get_cache_buffers", e),
    };
    if !ids.is_null() {
        for (i, (id, bytes)) in buffers.iter().take(*count).enumerate() {
            *ids.add(i) = *id;
            *sizes.add(i) = bytes.len();
        }
    }
    *count = buffers.len();
    ok()
}

/// Copies cache `id`'s whole backing buffer (`len` must be its size).
///
/// # Safety
/// `dev` is live, `data` writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ksi_cache_read(
    dev: *mut KsiDevice,
    id: u32,
    data: *mut u8,
    len: usize,
) -> i32 {
    let buffers = match (*dev).sim.cache_buffers() {
        Ok(b) => b,
        Err(e) => return from_npu("get_cache_buffers", e),
    };
    match buffers.get(&id) {
        Some(b) if b.len() == len => {
            std::ptr::copy_nonoverlapping(b.as_ptr(), data, len);
            ok()
        }
        Some(b) => fail(
            HAILO_INSUFFICIENT_BUFFER,
            format!("cache {id} holds {} bytes, buffer {len}", b.len()),
        ),
        None => fail(HAILO_NOT_FOUND, format!("no cache with id {id}")),
    }
}

/// `update_cache_buffer`: the size must equal the backing buffer's, L × Ep (contract §1.8).
///
/// # Safety
/// `dev` is live, `data` readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ksi_cache_write(
    dev: *mut KsiDevice,
    id: u32,
    data: *const u8,
    len: usize,
) -> i32 {
    let sim = &mut (*dev).sim;
    let size = match sim.cache_buffers() {
        Ok(b) => b.get(&id).map(Vec::len),
        Err(e) => return from_npu("update_cache_buffer", e),
    };
    match size {
        None => fail(HAILO_NOT_FOUND, format!("no cache with id {id}")),
        Some(n) if n != len => fail(
            HAILO_INVALID_ARGUMENT,
            format!("cache {id}: buffer of {len} bytes, the cache holds L x Ep = {n}"),
        ),
        Some(_) => match sim.write_cache_buffer(id, std::slice::from_raw_parts(data, len)) {
            Ok(()) => ok(),
            Err(e) => from_npu("update_cache_buffer", e),
        },
    }
}
