//! Enumerations of contract §5.4 with the names an inspector prints.

use kvprobe_schema::Layout;

/// `EdgeLayerBase.format` compiler code → device order name; `None` = invalid code.
pub fn compiler_format_name(code: u32) -> Option<&'static str> {
    Some(match code {
        0 => "NHWC (tf_rgb)",
        1 => "NHCW (frames)",
        2 => "NC",
        3 => "FCR",
        4 => "BAYER_RGB",
        5 => "NHW",
        6 => "HAILO_NMS_ON_CHIP",
        7 => "F8CR",
        8 => "RGB888",
        11 => "YUY2",
        13 => "NHWC",
        14 => "HAILO_YYUV",
        15 => "HAILO_YYVU",
        16 => "HAILO_YYYYUV",
        _ => return None,
    })
}

/// The schema layout a cache edge's compiler code declares, for the emulator (contract §7.4):
/// NHWC codes are token-major; NHCW with tokens on the width axis is feature-major; F8CR as is.
/// Any order with padded width 1 keeps entries token-local, so it counts as token-major.
pub fn declared_layout(code: u32, padded_width: u32) -> Option<Layout> {
    match code {
        0 | 13 => Some(Layout::TokenMajor),
        _ if padded_width <= 1 => Some(Layout::TokenMajor),
        1 => Some(Layout::FeatureMajor),
        7 => Some(Layout::F8cr),
        _ => None,
    }
}

/// Ring-safety of contract §7.4 from the declared code and padded width.
pub fn ring_safe(code: u32, padded_width: u32) -> bool {
    matches!(
        declared_layout(code, padded_width),
        Some(Layout::TokenMajor)
    )
}

pub fn hw_arch_name(arch: u64) -> String {
    match arch {
        0 => "HAILO8".into(),
        1 => "HAILO8P".into(),
        2 => "HAILO8R".into(),
        3 => "HAILO8L".into(),
        4 => "HAILO15M".into(),
        5 => "HAILO10H (deprecated code)".into(),
        6 => "HAILO15L".into(),
        100 => "SAGE_A0".into(),
        101 => "SAGE_B0".into(),
        102 => "PAPRIKA_B0".into(),
        103 => "HAILO1XH (Hailo-15H / Hailo-10H)".into(),
        104 => "GINGER".into(),
        105 => "LAVENDER".into(),
        106 => "PLUTO".into(),
        108 => "MARS".into(),
        n => format!("unknown ({n})"),
    }
}

/// Arch code whose HEFs run on a Hailo-10H (contract §5.4).
pub const HW_ARCH_HAILO1XH: u64 = 103;
/// Multi-layout archs, for which the group name comes from the first partial (§5.2).
pub fn is_multi_layout_arch(arch: u64) -> bool {
    arch == 3 || arch == 4
}

pub const EXT_PERIPH_CALCULATION_IN_HAILORT: u32 = 26;
pub const EXT_MULTI_NETWORK_VARIABLE_BATCH_SIZE: u32 = 8;
pub const EXT_HAILO_NET_FLOW: u32 = 13;

/// Mandatory extension indices HailoRT v5.2 refuses (§5.4).
pub fn extension_supported(index: u32) -> bool {
    !(index == 7 || index == 8 || index >= 36)
}

pub const EDGE_TYPE_INFO: u64 = 0;
pub const CONNECTION_BOUNDARY: u64 = 0;
pub const CONNECTION_CACHE: u64 = 3;
pub const DIRECTION_H2D: u64 = 0;
pub const DIRECTION_D2H: u64 = 1;
