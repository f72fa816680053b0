//! Typed errors of the HailoRT backend. Device failures carry the HailoRT status name and point
//! at `hailortcli logs`, where the firmware says more (prior-art F8).

use crate::hailo::hef::HefError;

#[derive(Debug, thiserror::Error)]
pub enum HailoError {
    #[error("HailoRT {op} failed with {name} ({code}){detail}; run `hailortcli logs runtime` (and `system_control`, `nnc`) on the device for the firmware's side")]
    Status {
        op: String,
        code: i32,
        name: &'static str,
        detail: String,
    },
    #[error("this kvprobe was built without the HailoRT C++ shim (hailo/hailort.h was not found at build time); install the HailoRT development headers or set HAILORT_INCLUDE_DIR, then rebuild with --features hailo")]
    ShimNotBuilt,
    #[error("libhailort reports HailoRT {found}, but kvprobe's backend was written against HailoRT {supported}.x (contract notes: 5.2.0); install HailoRT {supported}.x or rebuild kvprobe for the new API")]
    UnsupportedVersion { found: String, supported: u32 },
    #[error("{0}")]
    Hef(#[from] HefError),
    #[error("{hef}: the HEF does not pair with the model: {errors}; run `kvprobe inspect {hef} --model ...` for details")]
    Pairing { hef: String, errors: String },
    #[error("{path}: {detail}")]
    Path { path: String, detail: String },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

pub type Result<T> = std::result::Result<T, HailoError>;

impl HailoError {
    pub fn status(op: impl Into<String>, code: i32, detail: &str) -> HailoError {
        let detail = detail.split_whitespace().collect::<Vec<_>>().join(" ");
        HailoError::Status {
            op: op.into(),
            code,
            name: super::status::status_name(code),
            detail: if detail.is_empty() {
                String::new()
            } else {
                format!(": {detail}")
            },
        }
    }

    /// Device failures are exit code 3; HEF/argument problems are input errors.
    pub fn is_device_error(&self) -> bool {
        matches!(
            self,
            HailoError::Status { .. }
                | HailoError::ShimNotBuilt
                | HailoError::UnsupportedVersion { .. }
        )
    }
}

impl From<HailoError> for crate::Error {
    fn from(e: HailoError) -> crate::Error {
        if e.is_device_error() {
            crate::Error::Device(e.to_string())
        } else {
            crate::Error::InvalidArgument(e.to_string())
        }
    }
}
