//! The shim's C ABI (npu/shim/kvprobe_hailort_shim.h). Only compiled when the shim is built.

use std::os::raw::{c_char, c_int};

#[repr(C)]
pub struct KvpVdevice {
    _private: [u8; 0],
}

#[repr(C)]
pub struct KvpModel {
    _private: [u8; 0],
}

unsafe extern "C" {
    pub fn kvp_last_error() -> *const c_char;
    pub fn kvp_vdevice_create(out: *mut *mut KvpVdevice) -> c_int;
    pub fn kvp_vdevice_release(vdevice: *mut KvpVdevice);
    pub fn kvp_model_create(
        vdevice: *mut KvpVdevice,
        hef_path: *const c_char,
        group_name: *const c_char,
        float_inputs: *const *const c_char,
        n_float_inputs: usize,
        out: *mut *mut KvpModel,
    ) -> c_int;
    pub fn kvp_model_release(model: *mut KvpModel);
    pub fn kvp_model_io_count(model: *const KvpModel, is_output: c_int) -> usize;
    pub fn kvp_model_io_name(
        model: *const KvpModel,
        is_output: c_int,
        index: usize,
        buf: *mut c_char,
        buf_len: usize,
    ) -> c_int;
    pub fn kvp_model_frame_size(
        model: *const KvpModel,
        is_output: c_int,
        name: *const c_char,
        size: *mut usize,
    ) -> c_int;
    pub fn kvp_model_set_input(
        model: *mut KvpModel,
        name: *const c_char,
        data: *const u8,
        len: usize,
    ) -> c_int;
    pub fn kvp_model_run(model: *mut KvpModel, timeout_ms: u32) -> c_int;
    pub fn kvp_model_get_output(
        model: *const KvpModel,
        name: *const c_char,
        data: *mut u8,
        len: usize,
    ) -> c_int;
    pub fn kvp_model_init_cache(model: *mut KvpModel, read_offset: u32) -> c_int;
    pub fn kvp_model_update_cache_offset(model: *mut KvpModel, delta_entries: i32) -> c_int;
    pub fn kvp_model_fetch_cache_buffers(model: *mut KvpModel, count: *mut usize) -> c_int;
    pub fn kvp_model_cache_entry(
        model: *const KvpModel,
        index: usize,
        cache_id: *mut u32,
        data: *mut *const u8,
        len: *mut usize,
    ) -> c_int;
    pub fn kvp_model_update_cache_buffer(
        model: *mut KvpModel,
        cache_id: u32,
        data: *const u8,
        len: usize,
    ) -> c_int;
}
