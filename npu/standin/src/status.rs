//! The `hailo_status` and `hailo_format_type_t` values the stand-in answers with; they equal the
//! enumerators of `npu/standin/include/hailo/hailort.h` (checked by the C++ front at compile time).

pub const HAILO_SUCCESS: i32 = 0;
pub const HAILO_INVALID_ARGUMENT: i32 = 2;
pub const HAILO_TIMEOUT: i32 = 4;
pub const HAILO_INSUFFICIENT_BUFFER: i32 = 5;
pub const HAILO_INVALID_OPERATION: i32 = 6;
pub const HAILO_INTERNAL_FAILURE: i32 = 8;
pub const HAILO_OPEN_FILE_FAILURE: i32 = 13;
pub const HAILO_INVALID_HEF: i32 = 26;
pub const HAILO_NOT_FOUND: i32 = 61;
pub const HAILO_OUT_OF_PHYSICAL_DEVICES: i32 = 74;
pub const HAILO_HEF_NOT_COMPATIBLE_WITH_DEVICE: i32 = 93;

pub const HAILO_FORMAT_TYPE_UINT8: i32 = 1;
pub const HAILO_FORMAT_TYPE_UINT16: i32 = 2;
pub const HAILO_FORMAT_TYPE_FLOAT32: i32 = 3;
