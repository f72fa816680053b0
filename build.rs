//! Build-time git hash for run provenance (`KVPROBE_GIT_HASH`); absent outside a git checkout.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output();
    if let Ok(o) = out {
        if o.status.success() {
            let hash = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if !hash.is_empty() {
                println!("cargo:rustc-env=KVPROBE_GIT_HASH={hash}");
            }
        }
    }
}
