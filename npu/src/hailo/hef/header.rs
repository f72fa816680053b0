//! The binary container in front of the protobuf (contract §5.1): big-endian header, versions
//! 0-3, size equations and the hash each version carries.

use super::error::{HefError, Result};
use md5::{Digest, Md5};
use serde::Serialize;

pub const MAGIC: u32 = 0x0148_4546;
/// The in-memory loader requires this many bytes whatever the version (contract §5.1).
pub const MIN_FILE_LEN: usize = 56;

/// Size of the whole header for a container version.
pub fn header_len(version: u32) -> Option<usize> {
    match version {
        0 => Some(32),
        1 => Some(28),
        2 => Some(44),
        3 => Some(56),
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Checksum {
    Md5 { digest: [u8; 16] },
    Crc32 { value: u32 },
    Xxh3 { value: u64 },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContainerHeader {
    pub version: u32,
    pub header_len: usize,
    pub proto_size: u64,
    pub checksum: Checksum,
    /// v1/v2 `ccws_size`, v3 `ccws_size_with_padding`.
    pub ccws_size: u64,
    /// v3 only.
    pub padding_size: u32,
    /// v3 only.
    pub additional_info_size: u64,
    /// v3 only; non-zero means only the proto is hashed (contract §5.1).
    pub proto_xxh3: u64,
}

/// What the header parse established beyond the fields: facts the linter reports on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeaderChecks {
    /// The size equation of the version holds.
    pub size_ok: bool,
    /// Human description of the equation that failed.
    pub size_detail: Option<String>,
    /// v3: `ccws_size_with_padding >= hef_padding_size`.
    pub padding_ok: bool,
    /// v3 with `proto_xxh3 != 0`: the whole-file xxh3 HailoRT takes as the hash without checking.
    pub file_hash_ok: Option<bool>,
    /// `Hef::hash()` string: hex of the hash bytes in little-endian host memory order (§5.1).
    pub hash_string: String,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses and verifies the header. Returns the header, the checks for lint, and the proto slice.
/// Fatal: short file, bad magic, unknown version, proto past the end, and the hash HailoRT itself
/// verifies. Size equations HailoRT may skip are reported in `HeaderChecks` instead.
pub fn parse(file: &[u8]) -> Result<(ContainerHeader, HeaderChecks, &[u8])> {
    if file.len() < 12 {
        return Err(HefError::Truncated {
            len: file.len(),
            need: 12,
        });
    }
    let magic = be32(file, 0);
    if magic != MAGIC {
        return Err(HefError::BadMagic { found: magic });
    }
    let version = be32(file, 4);
    let hlen = header_len(version).ok_or(HefError::UnknownVersion(version))?;
    let need = hlen.max(MIN_FILE_LEN);
    if file.len() < need {
        return Err(HefError::Truncated {
            len: file.len(),
            need,
        });
    }
    let proto_size = u64::from(be32(file, 8));
    let residue = &file[hlen..];
    let residue_len = residue.len() as u64;
    if proto_size > residue_len {
        return Err(HefError::ProtoOutOfRange {
            proto_size,
            available: residue_len,
        });
    }
    let proto = &residue[..proto_size as usize];

    let mut header = ContainerHeader {
        version,
        header_len: hlen,
        proto_size,
        checksum: Checksum::Crc32 { value: 0 },
        ccws_size: 0,
        padding_size: 0,
        additional_info_size: 0,
        proto_xxh3: 0,
    };
    let mut checks = HeaderChecks {
        size_ok: true,
        size_detail: None,
        padding_ok: true,
        file_hash_ok: None,
        hash_string: String::new(),
    };
    let body = Body {
        file,
        residue,
        proto,
        hlen,
    };
    match version {
        0 => verify_v0(&body, &mut header, &mut checks)?,
        1 => verify_v1(&body, &mut header, &mut checks)?,
        2 => verify_v2(&body, &mut header, &mut checks)?,
        _ => verify_v3(&body, &mut header, &mut checks)?,
    }
    Ok((header, checks, proto))
}

/// The bytes after the fixed header fields, for the per-version size and hash rules.
struct Body<'a> {
    file: &'a [u8],
    residue: &'a [u8],
    proto: &'a [u8],
    hlen: usize,
}

impl Body<'_> {
    /// A file shorter than its header declares is truncated (unreadable); a longer one is a lint.
    fn size_rule(&self, checks: &mut HeaderChecks, expected: u64, text: &str) -> Result<()> {
        let residue_len = self.residue.len() as u64;
        if expected > residue_len {
            return Err(HefError::Truncated {
                len: self.file.len(),
                need: usize::try_from(expected.saturating_add(self.hlen as u64))
                    .unwrap_or(usize::MAX),
            });
        }
        if expected != residue_len {
            checks.size_ok = false;
            checks.size_detail = Some(format!(
                "{text} = {expected}, but {residue_len} bytes follow the header"
            ));
        }
        Ok(())
    }
}

fn verify_v0(b: &Body, header: &mut ContainerHeader, checks: &mut HeaderChecks) -> Result<()> {
    let proto_size = header.proto_size;
    let mut digest = [0u8; 16];
    digest.copy_from_slice(&b.file[16..32]);
    header.checksum = Checksum::Md5 { digest };
    b.size_rule(checks, proto_size, "proto_size")?;
    let computed: [u8; 16] = Md5::digest(b.residue).into();
    if computed != digest {
        return Err(HefError::HashMismatch {
            what: "MD5 (v0)",
            expected: hex(&digest),
            computed: hex(&computed),
        });
    }
    checks.hash_string = hex(&digest);
    Ok(())
}

fn verify_v1(b: &Body, header: &mut ContainerHeader, checks: &mut HeaderChecks) -> Result<()> {
    let proto_size = header.proto_size;
    let crc = be32(b.file, 12);
    header.checksum = Checksum::Crc32 { value: crc };
    header.ccws_size = be64(b.file, 16);
    b.size_rule(
        checks,
        proto_size.saturating_add(header.ccws_size),
        "proto_size + ccws_size",
    )?;
    let computed = crc32fast::hash(b.residue);
    if computed != crc {
        return Err(HefError::HashMismatch {
            what: "CRC-32 (v1)",
            expected: format!("{crc:08x}"),
            computed: format!("{computed:08x}"),
        });
    }
    checks.hash_string = hex(&crc.to_le_bytes());
    Ok(())
}

fn verify_v2(b: &Body, header: &mut ContainerHeader, checks: &mut HeaderChecks) -> Result<()> {
    let proto_size = header.proto_size;
    let x = be64(b.file, 12);
    header.checksum = Checksum::Xxh3 { value: x };
    header.ccws_size = be64(b.file, 20);
    b.size_rule(
        checks,
        proto_size.saturating_add(header.ccws_size),
        "proto_size + ccws_size",
    )?;
    let computed = xxhash_rust::xxh3::xxh3_64(b.residue);
    if computed != x {
        return Err(HefError::HashMismatch {
            what: "XXH3-64 (v2)",
            expected: format!("{x:016x}"),
            computed: format!("{computed:016x}"),
        });
    }
    checks.hash_string = hex(&x.to_le_bytes());
    Ok(())
}

fn verify_v3(b: &Body, header: &mut ContainerHeader, checks: &mut HeaderChecks) -> Result<()> {
    let proto_size = header.proto_size;
    let x = be64(b.file, 12);
    header.checksum = Checksum::Xxh3 { value: x };
    header.ccws_size = be64(b.file, 20);
    header.padding_size = be32(b.file, 28);
    header.additional_info_size = be64(b.file, 32);
    header.proto_xxh3 = be64(b.file, 40);
    b.size_rule(
        checks,
        proto_size
            .saturating_add(header.ccws_size)
            .saturating_add(header.additional_info_size),
        "proto_size + ccws_size_with_padding + additional_info_size",
    )?;
    checks.padding_ok = header.ccws_size >= u64::from(header.padding_size);
    let whole = xxhash_rust::xxh3::xxh3_64(b.residue);
    if header.proto_xxh3 != 0 {
        // HailoRT verifies only the proto here and trusts the whole-file value (§5.1).
        let computed = xxhash_rust::xxh3::xxh3_64(b.proto);
        if computed != header.proto_xxh3 {
            return Err(HefError::HashMismatch {
                what: "proto XXH3-64 (v3)",
                expected: format!("{:016x}", header.proto_xxh3),
                computed: format!("{computed:016x}"),
            });
        }
        checks.file_hash_ok = Some(whole == x);
    } else if whole != x {
        return Err(HefError::HashMismatch {
            what: "XXH3-64 (v3)",
            expected: format!("{x:016x}"),
            computed: format!("{whole:016x}"),
        });
    }
    checks.hash_string = hex(&x.to_le_bytes());
    Ok(())
}

impl ContainerHeader {
    /// Origin of CCW and external-resource offsets (contract §5.1). v0 has no resources; its
    /// zero point is taken as the end of the proto.
    pub fn zero_point(&self) -> u64 {
        let base = self.header_len as u64 + self.proto_size;
        if self.version == 3 {
            base + u64::from(self.padding_size)
        } else {
            base
        }
    }
}
