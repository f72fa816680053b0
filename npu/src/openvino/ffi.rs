//! The few calls of OpenVINO's C API kvprobe makes, over `openvino-sys` (runtime linking) with
//! owned handles that free themselves. `ov_core_compile_model` is variadic (its properties are
//! `key, value` C strings after the count); `openvino-sys`'s runtime-linking wrapper drops the
//! variadic part, so that one symbol is resolved here from the same library with `libloading`.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;

use openvino_sys as sys;

/// An error of the C API: the call, the status's text and the library's last message, on one
/// line.
pub type FfiResult<T> = std::result::Result<T, String>;

fn check(what: &str, status: sys::ov_status_e) -> FfiResult<()> {
    if status == sys::ov_status_e::OK {
        return Ok(());
    }
    // SAFETY: both return static or thread-local NUL-terminated strings (or null)
    let (info, last) = unsafe { (sys::ov_get_error_info(status), sys::ov_get_last_err_msg()) };
    let text = |p: *const c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: non-null, NUL-terminated (above)
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    Err(format!("{what}: {} {}", text(info), text(last)))
}

fn cstring(s: &str) -> FfiResult<CString> {
    CString::new(s).map_err(|_| format!("`{s}` holds a NUL byte"))
}

/// Takes a string the library allocated and frees it.
fn take_string(p: *mut c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the library returned a NUL-terminated string it allocated; ov_free releases it
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    unsafe { sys::ov_free(p) };
    s
}

/// Loads the library once per process.
pub fn load(lib: &Path) -> FfiResult<()> {
    sys::library::load_from(lib)
}

/// The library's build number (`2026.4.1-22982-…`).
pub fn version() -> FfiResult<String> {
    let mut v = sys::ov_version_t {
        buildNumber: std::ptr::null(),
        description: std::ptr::null(),
    };
    // SAFETY: v is a valid out-pointer; freed with ov_version_free below
    check("ov_get_openvino_version", unsafe {
        sys::ov_get_openvino_version(&mut v)
    })?;
    let s = if v.buildNumber.is_null() {
        String::new()
    } else {
        // SAFETY: non-null NUL-terminated string owned by v
        unsafe { CStr::from_ptr(v.buildNumber) }
            .to_string_lossy()
            .into_owned()
    };
    unsafe { sys::ov_version_free(&mut v) };
    Ok(s)
}

pub struct Core(*mut sys::ov_core_t);
pub struct Model(*mut sys::ov_model_t);
pub struct Compiled(*mut sys::ov_compiled_model_t);
pub struct Request(*mut sys::ov_infer_request_t);

impl Drop for Core {
    fn drop(&mut self) {
        // SAFETY: created by ov_core_create, freed once
        unsafe { sys::ov_core_free(self.0) }
    }
}
impl Drop for Model {
    fn drop(&mut self) {
        unsafe { sys::ov_model_free(self.0) }
    }
}
impl Drop for Compiled {
    fn drop(&mut self) {
        unsafe { sys::ov_compiled_model_free(self.0) }
    }
}
impl Drop for Request {
    fn drop(&mut self) {
        unsafe { sys::ov_infer_request_free(self.0) }
    }
}

type CompileFn = unsafe extern "C" fn(
    *const sys::ov_core_t,
    *const sys::ov_model_t,
    *const c_char,
    usize,
    *mut *mut sys::ov_compiled_model_t,
    ...
) -> sys::ov_status_e;

impl Core {
    pub fn new() -> FfiResult<Core> {
        let mut p = std::ptr::null_mut();
        check("ov_core_create", unsafe { sys::ov_core_create(&mut p) })?;
        Ok(Core(p))
    }

    pub fn read_model(&self, xml: &Path, bin: &Path) -> FfiResult<Model> {
        let (x, b) = (
            cstring(&xml.to_string_lossy())?,
            cstring(&bin.to_string_lossy())?,
        );
        let mut p = std::ptr::null_mut();
        check("read_model", unsafe {
            sys::ov_core_read_model(self.0, x.as_ptr(), b.as_ptr(), &mut p)
        })?;
        Ok(Model(p))
    }

    pub fn available_devices(&self) -> FfiResult<Vec<String>> {
        let mut d = sys::ov_available_devices_t {
            devices: std::ptr::null_mut(),
            size: 0,
        };
        check("available devices", unsafe {
            sys::ov_core_get_available_devices(self.0, &mut d)
        })?;
        let out = (0..d.size)
            .map(|i| {
                // SAFETY: `size` NUL-terminated names owned by d
                let p = unsafe { *d.devices.add(i) };
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            })
            .collect();
        unsafe { sys::ov_available_devices_free(&mut d) };
        Ok(out)
    }

    pub fn property(&self, device: &str, key: &str) -> FfiResult<String> {
        let (d, k) = (cstring(device)?, cstring(key)?);
        let mut p = std::ptr::null_mut();
        check("get_property", unsafe {
            sys::ov_core_get_property(self.0, d.as_ptr(), k.as_ptr(), &mut p)
        })?;
        Ok(take_string(p))
    }

    /// `ov_core_compile_model(core, model, device, 2·n, &out, k1, v1, …)`. The C API takes the
    /// pairs as variadic arguments; up to 16 keys are passed (more is refused).
    pub fn compile(
        &self,
        lib: &Path,
        model: &Model,
        device: &str,
        config: &[(String, String)],
    ) -> FfiResult<Compiled> {
        const MAX: usize = 16;
        if config.len() > MAX {
            return Err(format!(
                "{} configuration keys; kvprobe passes at most {MAX}",
                config.len()
            ));
        }
        let dev = cstring(device)?;
        let owned: Vec<CString> = config
            .iter()
            .flat_map(|(k, v)| [cstring(k), cstring(v)])
            .collect::<FfiResult<_>>()?;
        let mut a: [*const c_char; 2 * MAX] = [std::ptr::null(); 2 * MAX];
        for (slot, s) in a.iter_mut().zip(&owned) {
            *slot = s.as_ptr();
        }
        // SAFETY: the same library openvino-sys loaded (dlopen returns the loaded handle); the
        // symbol has CompileFn's signature (ov_core.h)
        let libh = unsafe { libloading::Library::new(lib) }
            .map_err(|e| format!("{}: {e}", lib.display()))?;
        let f: libloading::Symbol<CompileFn> = unsafe { libh.get(b"ov_core_compile_model\0") }
            .map_err(|e| format!("ov_core_compile_model: {e}"))?;
        let mut p = std::ptr::null_mut();
        // SAFETY: the callee reads exactly `2·n` pointers after `p` and ignores the rest
        let status = unsafe {
            f(
                self.0,
                model.0,
                dev.as_ptr(),
                2 * config.len(),
                &mut p,
                a[0],
                a[1],
                a[2],
                a[3],
                a[4],
                a[5],
                a[6],
                a[7],
                a[8],
                a[9],
                a[10],
                a[11],
                a[12],
                a[13],
                a[14],
                a[15],
                a[16],
                a[17],
                a[18],
                a[19],
                a[20],
                a[21],
                a[22],
                a[23],
                a[24],
                a[25],
                a[26],
                a[27],
                a[28],
                a[29],
                a[30],
                a[31],
            )
        };
        check(&format!("compile_model on {device}"), status)?;
        Ok(Compiled(p))
    }
}

impl Model {
    fn port_names(
        &self,
        size: unsafe fn(*const sys::ov_model_t, *mut usize) -> sys::ov_status_e,
        by_index: unsafe fn(
            *const sys::ov_model_t,
            usize,
            *mut *mut sys::ov_output_const_port_t,
        ) -> sys::ov_status_e,
    ) -> FfiResult<Vec<String>> {
        let mut n = 0usize;
        check("ports", unsafe { size(self.0, &mut n) })?;
        (0..n)
            .map(|i| {
                let mut port = std::ptr::null_mut();
                check("port", unsafe { by_index(self.0, i, &mut port) })?;
                let mut name = std::ptr::null_mut();
                let r = check("port name", unsafe {
                    sys::ov_port_get_any_name(port, &mut name)
                });
                unsafe { sys::ov_output_const_port_free(port) };
                r.map(|()| take_string(name))
            })
            .collect()
    }

    pub fn input_names(&self) -> FfiResult<Vec<String>> {
        self.port_names(
            sys::ov_model_inputs_size,
            sys::ov_model_const_input_by_index,
        )
    }

    pub fn output_names(&self) -> FfiResult<Vec<String>> {
        self.port_names(
            sys::ov_model_outputs_size,
            sys::ov_model_const_output_by_index,
        )
    }
}

impl Compiled {
    /// A property of the compiled model as the plugin resolved it (its defaults included).
    pub fn property(&self, key: &str) -> FfiResult<String> {
        let k = cstring(key)?;
        let mut p = std::ptr::null_mut();
        check("compiled_model get_property", unsafe {
            sys::ov_compiled_model_get_property(self.0, k.as_ptr(), &mut p)
        })?;
        Ok(take_string(p))
    }

    pub fn request(&self) -> FfiResult<Request> {
        let mut p = std::ptr::null_mut();
        check("create_infer_request", unsafe {
            sys::ov_compiled_model_create_infer_request(self.0, &mut p)
        })?;
        Ok(Request(p))
    }
}

/// Element types kvprobe feeds.
pub trait Element: Copy {
    const TYPE: sys::ov_element_type_e;
}
impl Element for i64 {
    const TYPE: sys::ov_element_type_e = sys::ov_element_type_e::I64;
}
impl Element for i32 {
    const TYPE: sys::ov_element_type_e = sys::ov_element_type_e::I32;
}

impl Request {
    /// Sets input `name` to `data` shaped `[1, data.len()]` (`batch_row`) or `[data.len()]`. The
    /// tensor wraps `data` without a copy: the caller keeps it alive until the run returns.
    pub fn set<T: Element>(
        &mut self,
        name: &str,
        data: &mut [T],
        batch_row: bool,
    ) -> FfiResult<()> {
        let n = cstring(name)?;
        let dims = [1i64, data.len() as i64];
        let dims = if batch_row { &dims[..] } else { &dims[1..] };
        let mut shape = sys::ov_shape_t {
            rank: 0,
            dims: std::ptr::null_mut(),
        };
        check("shape", unsafe {
            sys::ov_shape_create(dims.len() as i64, dims.as_ptr(), &mut shape)
        })?;
        let mut t = std::ptr::null_mut();
        let r = check(&format!("tensor {name}"), unsafe {
            sys::ov_tensor_create_from_host_ptr(
                T::TYPE,
                shape,
                data.as_mut_ptr().cast::<c_void>(),
                &mut t,
            )
        });
        unsafe { sys::ov_shape_free(&mut shape) };
        r?;
        let r = check(&format!("input {name}"), unsafe {
            sys::ov_infer_request_set_tensor(self.0, n.as_ptr(), t)
        });
        unsafe { sys::ov_tensor_free(t) };
        r
    }

    pub fn infer(&mut self) -> FfiResult<()> {
        check("infer", unsafe { sys::ov_infer_request_infer(self.0) })
    }

    /// Output `name` as f32 values (copied).
    pub fn output_f32(&self, name: &str) -> FfiResult<Vec<f32>> {
        let n = cstring(name)?;
        let mut t = std::ptr::null_mut();
        check(&format!("output {name}"), unsafe {
            sys::ov_infer_request_get_tensor(self.0, n.as_ptr(), &mut t)
        })?;
        let mut size = 0usize;
        let mut data = std::ptr::null_mut();
        let mut ty = sys::ov_element_type_e::DYNAMIC;
        let r = check("tensor type", unsafe {
            sys::ov_tensor_get_element_type(t, &mut ty)
        })
        .and_then(|()| match ty {
            sys::ov_element_type_e::F32 => Ok(()),
            other => Err(format!("output {name} is {other:?}, not f32")),
        })
        .and_then(|()| {
            check("tensor size", unsafe {
                sys::ov_tensor_get_size(t, &mut size)
            })
        })
        .and_then(|()| check("tensor data", unsafe { sys::ov_tensor_data(t, &mut data) }));
        let out = r.map(|()| {
            // SAFETY: an f32 output tensor of `size` elements (the IR's logits are f32)
            unsafe { std::slice::from_raw_parts(data.cast::<f32>(), size) }.to_vec()
        });
        unsafe { sys::ov_tensor_free(t) };
        out
    }
}
