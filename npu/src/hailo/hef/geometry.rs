//! Cache entry arithmetic of contract §1.2: entry size, page, padded entry size, and the
//! per-side descriptor page that can make the real slot stride differ from `Ep`.

/// `DEFAULT_SG_PAGE_SIZE`; the device's `desc_max_page_size` is not visible (§1.2), so the
/// default page is assumed to be the full 512.
pub const DEFAULT_PAGE: usize = 512;
/// `MAX_SG_DESCS_COUNT` minus one: the descriptor-count bound of §1.2.
const MAX_DESCS: usize = 65535;

/// `nextpow2(E, ≥ 64)`: starts at 64 and doubles while smaller than `E`.
pub fn nearest_pow2_from_64(e: usize) -> usize {
    let mut p = 64usize;
    while p < e {
        p = p.saturating_mul(2);
        if p == usize::MAX {
            break;
        }
    }
    p
}

pub fn align_up(x: usize, a: usize) -> usize {
    if a == 0 {
        return x;
    }
    x.div_ceil(a).saturating_mul(a)
}

/// The page used for `Ep`.
pub fn page_size(e: usize) -> usize {
    nearest_pow2_from_64(e).min(DEFAULT_PAGE)
}

/// `Ep = align_up(E, page)`.
pub fn padded_entry_size(e: usize) -> usize {
    align_up(e, page_size(e))
}

/// Outcome of sizing one side's descriptor list for `n` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DescStride {
    /// The descriptor page stays at `page`: stride = `Ep`.
    Ep(usize),
    /// The page was doubled: entries sit `stride` bytes apart, not `Ep` (§1.2 stride caveat).
    Doubled { page: usize, stride: usize },
    /// Doubling would pass `Ep` (the cap, as `desc_max_page_size` is unknown): configure fails.
    TooManyDescriptors,
}

/// Recomputes a side's descriptor page as §1.2 describes.
pub fn desc_stride(e: usize, n: usize) -> DescStride {
    let ep = padded_entry_size(e);
    let mut page = page_size(e);
    let needs_more = |page: usize| (e.div_ceil(page) + 1).saturating_mul(n) > MAX_DESCS;
    if !needs_more(page) {
        return DescStride::Ep(ep);
    }
    while needs_more(page) {
        page = page.saturating_mul(2);
        if page > ep {
            return DescStride::TooManyDescriptors;
        }
    }
    let stride = align_up(e, page);
    if stride == ep {
        DescStride::Ep(ep)
    } else {
        DescStride::Doubled { page, stride }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example table of contract §1.2, typed in from the document.
    #[test]
    fn contract_table() {
        for (e, page, ep) in [
            (48, 64, 64),
            (96, 128, 128),
            (256, 256, 256),
            (272, 512, 512),
            (640, 512, 1024),
            (1536, 512, 1536),
        ] {
            assert_eq!(page_size(e), page, "page for E={e}");
            assert_eq!(padded_entry_size(e), ep, "Ep for E={e}");
        }
    }

    /// §1.2: E = 1536 with 16384 entries doubles the page to 1024 and strides 2048 bytes.
    #[test]
    fn contract_stride_example() {
        assert_eq!(
            desc_stride(1536, 16384),
            DescStride::Doubled {
                page: 1024,
                stride: 2048
            }
        );
        // "with the 512-byte default page, L ≤ 8192 and E ≤ 3584, no doubling occurs": one side
        // holds at most L − 1 = 8191 entries, and (⌈3584/512⌉ + 1)·8191 = 65528 ≤ 65535
        assert_eq!(desc_stride(3584, 8191), DescStride::Ep(3584));
        // one entry more crosses the bound: (7 + 1)·8192 = 65536
        assert!(matches!(
            desc_stride(3584, 8192),
            DescStride::Doubled { page: 1024, .. }
        ));
        assert_eq!(desc_stride(64, 2047), DescStride::Ep(64));
    }
}
