//! Where the vendor libraries the fetch scripts put under `.cache/` are found: the working
//! folder first, then up to four folders above the executable (target/<profile>/kvprobe sits
//! two levels under the checkout, a test binary three).

use std::path::{Path, PathBuf};

/// The first `<base>/rel` for which `found` holds, bases as above.
pub fn near_checkout(rel: &Path, found: fn(&Path) -> bool) -> Option<PathBuf> {
    let mut bases: Vec<PathBuf> = vec![PathBuf::from(".")];
    if let Ok(exe) = std::env::current_exe() {
        bases.extend(exe.ancestors().skip(1).take(4).map(Path::to_path_buf));
    }
    bases.iter().map(|b| b.join(rel)).find(|p| found(p))
}
